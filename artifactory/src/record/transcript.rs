//! The committed-turn filter: what a transcript shows.
//!
//! A turn is shown only when both its `turn_dispatched` and its `turn_complete` are in the
//! record. A turn marked `turn_ambiguous` is quarantined; one dispatched without completion is
//! incomplete (its owner died between the two batches, and recovery will retry it). Inputs
//! committed before a turn's dispatch belong to that turn; inputs committed while a turn is open
//! (follow-ups, steers, stops) belong to the open turn.

use std::collections::BTreeMap;

use turnpike_schemas::entry::{ConversationOpened, TurnAmbiguous, TurnComplete};
use turnpike_schemas::{EntryBody, TurnId};

use super::RecordEntry;

/// One turn and the entries that belong to it, in record order.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnView {
    pub turn: TurnId,
    pub dispatched: bool,
    pub complete: Option<TurnComplete>,
    pub ambiguous: Option<TurnAmbiguous>,
    /// Every entry of the turn, inputs included, markers included.
    pub entries: Vec<RecordEntry>,
}

impl TurnView {
    fn new(turn: TurnId) -> Self {
        TurnView {
            turn,
            dispatched: false,
            complete: None,
            ambiguous: None,
            entries: Vec::new(),
        }
    }

    /// Whether both markers are present and the turn is not quarantined.
    pub fn is_committed(&self) -> bool {
        self.dispatched && self.complete.is_some() && self.ambiguous.is_none()
    }
}

/// A record read as turns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Transcript {
    pub opened: Option<ConversationOpened>,
    /// Turns with both markers, in turn order.
    pub committed: Vec<TurnView>,
    /// Turns dispatched but not completed (or completed without a dispatch marker).
    pub incomplete: Vec<TurnView>,
    /// Turns marked ambiguous: never retried automatically.
    pub quarantined: Vec<TurnView>,
    /// Inputs committed after the last turn, waiting for the next one.
    pub pending: Vec<RecordEntry>,
}

impl Transcript {
    /// Sorts a record's entries into turns.
    pub fn from_entries(entries: &[RecordEntry]) -> Self {
        let mut turns: BTreeMap<TurnId, TurnView> = BTreeMap::new();
        let mut opened = None;
        let mut pending: Vec<RecordEntry> = Vec::new();
        let mut open: Option<TurnId> = None;
        for entry in entries {
            match &entry.body {
                EntryBody::SignedRoot(_) => continue,
                EntryBody::ConversationOpened(o) => {
                    opened = Some(o.clone());
                    continue;
                }
                _ => {}
            }
            let Some(turn) = entry.body.turn().or(open) else {
                pending.push(entry.clone());
                continue;
            };
            let view = turns.entry(turn).or_insert_with(|| TurnView::new(turn));
            match &entry.body {
                EntryBody::TurnDispatched(_) => {
                    view.dispatched = true;
                    view.entries.append(&mut pending);
                    open = Some(turn);
                }
                EntryBody::TurnComplete(c) => {
                    view.complete = Some(c.clone());
                    if open == Some(turn) {
                        open = None;
                    }
                }
                EntryBody::TurnAmbiguous(a) => {
                    view.ambiguous = Some(a.clone());
                    if open == Some(turn) {
                        open = None;
                    }
                }
                _ => {}
            }
            view.entries.push(entry.clone());
        }
        let mut transcript = Transcript {
            opened,
            pending,
            ..Default::default()
        };
        for (_, view) in turns {
            if view.ambiguous.is_some() {
                transcript.quarantined.push(view);
            } else if view.is_committed() {
                transcript.committed.push(view);
            } else {
                transcript.incomplete.push(view);
            }
        }
        transcript
    }

    /// The number the next new turn gets.
    pub fn next_turn(&self) -> TurnId {
        self.committed
            .iter()
            .chain(&self.incomplete)
            .chain(&self.quarantined)
            .map(|v| v.turn)
            .max()
            .map(|t| t.next())
            .unwrap_or(TurnId::FIRST)
    }
}
