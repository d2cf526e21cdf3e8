//! Timeline rows: what an agent is fed, in order, each with a stable reference.
//!
//! A row is one block of a turn log, located by `conv:tl:<conv>/turn_<n>/blocks/<i>`. File
//! rows say that a file exists and where; its bytes stay in the store.

use serde::{Deserialize, Serialize};

use crate::ids::{ConversationId, TurnId};
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
        let path = RefPath::from_segments(["blocks".to_owned(), index.to_string()])
            .expect("block paths are valid");
        Row {
            reference: Reference::new(Family::turn_log(), conversation, turn, path),
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
