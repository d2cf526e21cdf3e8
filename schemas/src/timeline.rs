//! Timeline rows: what an agent is fed, in order, each with a stable reference.
//!
//! A row is one block of a turn log, located by `conv:tl:<conv>/turn_<n>/blocks/<i>`. File
//! rows say that a file exists and where; its bytes stay in the store.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeStruct, Serializer};
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
#[derive(Debug, Clone, PartialEq)]
pub struct ContextSnapshot {
    pub version: u16,
    pub conversation: ConversationId,
    pub through: TurnId,
    pub rows: Vec<Row>,
}

/// The snapshot's fields on the wire, in the order they are written.
const SNAPSHOT_FIELDS: &[&str] = &["version", "conversation", "through", "rows"];

impl Serialize for ContextSnapshot {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        /// A row as `[turn, index, block]`, borrowed.
        struct WireRow<'a>(&'a Row);
        impl Serialize for WireRow<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let row = self.0;
                let index: usize = row
                    .reference
                    .path()
                    .segments()
                    .get(1)
                    .and_then(|i| i.parse().ok())
                    .unwrap_or_default();
                (row.turn().number(), index, &row.block).serialize(serializer)
            }
        }
        struct WireRows<'a>(&'a [Row]);
        impl Serialize for WireRows<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_seq(self.0.iter().map(WireRow))
            }
        }
        let mut out = serializer.serialize_struct("ContextSnapshot", SNAPSHOT_FIELDS.len())?;
        out.serialize_field("version", &self.version)?;
        out.serialize_field("conversation", &self.conversation)?;
        out.serialize_field("through", &self.through)?;
        out.serialize_field("rows", &WireRows(&self.rows))?;
        out.end()
    }
}

/// Reads a snapshot, building each row as it is read when the conversation came first (as this
/// crate writes it): one vector of rows, no intermediate one. Unknown fields are refused.
impl<'de> Deserialize<'de> for ContextSnapshot {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_struct("ContextSnapshot", SNAPSHOT_FIELDS, SnapshotVisitor)
    }
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum SnapshotField {
    Version,
    Conversation,
    Through,
    Rows,
}

/// Rows read before their conversation was known (a writer that put `rows` first).
type LooseRows = Vec<(u64, usize, Block)>;

struct SnapshotVisitor;

impl<'de> Visitor<'de> for SnapshotVisitor {
    type Value = ContextSnapshot;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a context snapshot")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ContextSnapshot, A::Error> {
        let mut version = None;
        let mut conversation = None;
        let mut through = None;
        let mut rows: Option<Vec<Row>> = None;
        let mut loose: Option<LooseRows> = None;
        while let Some(field) = map.next_key::<SnapshotField>()? {
            let seen = match field {
                SnapshotField::Version => version.replace(map.next_value()?).is_some(),
                SnapshotField::Conversation => conversation.replace(map.next_value()?).is_some(),
                SnapshotField::Through => through.replace(map.next_value()?).is_some(),
                SnapshotField::Rows => {
                    let again = rows.is_some() || loose.is_some();
                    match conversation {
                        Some(conversation) => {
                            rows = Some(map.next_value_seed(RowsSeed(conversation))?)
                        }
                        None => loose = Some(map.next_value()?),
                    }
                    again
                }
            };
            if seen {
                return Err(de::Error::custom("a field of the snapshot appears twice"));
            }
        }
        let conversation = conversation.ok_or_else(|| de::Error::missing_field("conversation"))?;
        let rows = match (rows, loose) {
            (Some(rows), _) => rows,
            (None, Some(loose)) => loose
                .into_iter()
                .map(|(turn, index, block)| row_of(conversation, turn, index, block))
                .collect::<Result<_, _>>()?,
            (None, None) => return Err(de::Error::missing_field("rows")),
        };
        Ok(ContextSnapshot {
            version: version.ok_or_else(|| de::Error::missing_field("version"))?,
            conversation,
            through: through.ok_or_else(|| de::Error::missing_field("through"))?,
            rows,
        })
    }
}

fn row_of<E: de::Error>(
    conversation: ConversationId,
    turn: u64,
    index: usize,
    block: Block,
) -> Result<Row, E> {
    let turn = TurnId::new(turn).ok_or_else(|| E::custom("a row of turn 0"))?;
    Ok(Row::new(conversation, turn, index, block))
}

/// The rows of a conversation, each built as it is read.
struct RowsSeed(ConversationId);

impl<'de> DeserializeSeed<'de> for RowsSeed {
    type Value = Vec<Row>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Vec<Row>, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for RowsSeed {
    type Value = Vec<Row>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("rows as [turn, index, block]")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Row>, A::Error> {
        let mut rows = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some((turn, index, block)) = seq.next_element::<(u64, usize, Block)>()? {
            rows.push(row_of(self.0, turn, index, block)?);
        }
        Ok(rows)
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

    #[test]
    fn a_snapshot_reads_the_same_whatever_its_field_order_and_refuses_what_is_off() {
        let conversation = ConversationId::new();
        let rows = r#"[[2,0,{"kind":"user_message","text":"a"}],[3,11,{"text":"b","kind":"assistant_message"}]]"#;
        let ordered = format!(
            r#"{{"version":1,"conversation":"{conversation}","through":"turn_3","rows":{rows}}}"#
        );
        let rows_first = format!(
            r#"{{"rows":{rows},"through":"turn_3","conversation":"{conversation}","version":1}}"#
        );
        let a: ContextSnapshot = serde_json::from_str(&ordered).unwrap();
        let b: ContextSnapshot = serde_json::from_str(&rows_first).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.rows.len(), 2);
        assert_eq!(
            a.rows[1].reference.to_string(),
            format!("conv:tl:{conversation}/turn_3/blocks/11")
        );
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            ordered.replace(
                r#"{"text":"b","kind":"assistant_message"}"#,
                r#"{"kind":"assistant_message","text":"b"}"#,
            )
        );
        for (text, why) in [
            (
                ordered.replace("\"rows\"", "\"rowz\""),
                "unknown field `rowz`",
            ),
            (ordered.replace("[2,0,", "[0,0,"), "a row of turn 0"),
            (rows_first.replace("[2,0,", "[0,0,"), "a row of turn 0"),
            (
                ordered.replace(r#""version":1,"#, ""),
                "missing field `version`",
            ),
            (
                ordered.replace(r#","rows":"#, r#","version":2,"rows":"#),
                "appears twice",
            ),
            (
                format!(r#"{{"version":1,"through":"turn_3","rows":{rows}}}"#),
                "missing field `conversation`",
            ),
            (
                format!(r#"{{"version":1,"conversation":"{conversation}","through":"turn_3"}}"#),
                "missing field `rows`",
            ),
        ] {
            let error = serde_json::from_str::<ContextSnapshot>(&text)
                .unwrap_err()
                .to_string();
            assert!(error.contains(why), "{text}: {error}");
        }
    }
}
