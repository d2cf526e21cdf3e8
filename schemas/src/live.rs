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
}

impl LiveFrame {
    /// The frame as JSON bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("live frames serialise")
    }
}
