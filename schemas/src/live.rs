//! Advisory live frames on `tp.live.{conv}`: token deltas and "new rows" ticks. They never
//! carry anything the record lacks; a client that misses some re-reads the record.

use serde::{Deserialize, Serialize};

use crate::ids::TurnId;

/// One advisory frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LiveFrame {
    /// Streamed text of a running turn's model call.
    Delta { turn: TurnId, text: String },
    /// The record now holds rows up to `through` (its leaf count).
    Rows { through: u64 },
    /// `identity` may no longer see the conversation (its grant was revoked): its streams end
    /// now, before anything more reaches them. (Streams also re-check access on every tick, so
    /// a lost frame only delays this.)
    Revoked { identity: crate::Identity },
}

impl LiveFrame {
    /// The frame as JSON bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("live frames serialise")
    }
}
