//! Timeline rows: what an agent is fed, in order, each with a stable reference.
//!
//! A row is one block of a turn log, located by `conv:tl:<conv>/turn_<n>/blocks/<i>`. File
//! rows say that a file exists and where; its bytes stay in the store.

use serde::{Deserialize, Serialize};

use crate::ids::{ConversationId, TurnId};

/// The context snapshot format this build writes.
pub const CONTEXT_VERSION: u16 = 1;
use crate::reference::{Family, RefPath, Reference};
use crate::turnlog::Block;

/// One row of a timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Where the row's block is: `conv:tl:<conv>/turn_<n>/blocks/<i>`.
    pub reference: Reference,
    pub block: Block,
}

impl Row {
    /// The row of block `index` of `turn`'s log.
    pub fn new(conversation: ConversationId, turn: TurnId, index: usize, block: Block) -> Self {
        Row {
            reference: Reference::new(
                Family::turn_log(),
                conversation,
                turn,
                RefPath::block(index),
            ),
            block,
        }
    }

    /// The turn the row belongs to.
    pub fn turn(&self) -> TurnId {
        self.reference.turn()
    }

    /// The row's kind, as shown to people and models.
    pub fn kind(&self) -> &'static str {
        self.block.kind_name()
    }
}

/// The timeline as it stands after a turn: the rows from the latest summary through `through`,
/// newest last, trimmed from the oldest end to what the agent's context could ever use. A
/// derived, per-turn object (`turns/turn_<n>/context.json`) so the next turn's rebuild is one
/// fetch; the turn logs stay the source it is checked against.
///
/// On the wire a row is `[turn, index, block]`: its reference is rebuilt from the three, which
/// keeps the object small and quick to read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "SnapshotWire", try_from = "SnapshotWire")]
pub struct ContextSnapshot {
    pub version: u16,
    pub conversation: ConversationId,
    pub through: TurnId,
    pub rows: Vec<Row>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotWire {
    version: u16,
    conversation: ConversationId,
    through: TurnId,
    rows: Vec<(u64, usize, Block)>,
}

impl From<ContextSnapshot> for SnapshotWire {
    fn from(s: ContextSnapshot) -> Self {
        SnapshotWire {
            version: s.version,
            conversation: s.conversation,
            through: s.through,
            rows: s
                .rows
                .into_iter()
                .map(|r| {
                    let index = r
                        .reference
                        .path()
                        .segments()
                        .get(1)
                        .and_then(|i| i.parse().ok())
                        .unwrap_or_default();
                    (r.reference.turn().number(), index, r.block)
                })
                .collect(),
        }
    }
}

impl TryFrom<SnapshotWire> for ContextSnapshot {
    type Error = String;

    fn try_from(w: SnapshotWire) -> Result<Self, String> {
        let mut rows = Vec::with_capacity(w.rows.len());
        for (turn, index, block) in w.rows {
            let turn = TurnId::new(turn).ok_or("a row of turn 0")?;
            rows.push(Row::new(w.conversation, turn, index, block));
        }
        Ok(ContextSnapshot {
            version: w.version,
            conversation: w.conversation,
            through: w.through,
            rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_round_trips_with_its_references() {
        let conversation = ConversationId::new();
        let snapshot = ContextSnapshot {
            version: CONTEXT_VERSION,
            conversation,
            through: TurnId::new(3).unwrap(),
            rows: vec![
                Row::new(
                    conversation,
                    TurnId::new(2).unwrap(),
                    0,
                    Block::UserMessage { text: "a".into() },
                ),
                Row::new(
                    conversation,
                    TurnId::new(3).unwrap(),
                    11,
                    Block::AssistantMessage { text: "b".into() },
                ),
            ],
        };
        let json = serde_json::to_string(&snapshot).unwrap();
        assert!(
            json.contains(r#"[3,11,{"kind":"assistant_message","text":"b"}]"#),
            "{json}"
        );
        let back: ContextSnapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(back, snapshot);
        assert_eq!(
            back.rows[1].reference.to_string(),
            format!("conv:tl:{conversation}/turn_3/blocks/11")
        );
    }
}
