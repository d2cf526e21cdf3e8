//! What a turn may reach beyond its own conversation.
//!
//! A turn acts as the identity that sent its input, and what its tools fetch lands in the
//! conversation's record, which every participant reads. In a conversation only its owner can
//! read, the turn may reach whatever that identity may see. In a shared one, it may reach only
//! what **every** participant (the owner and everyone it is shared with) may see: otherwise one
//! participant could read, through the turn, what only another may see (a confused deputy).
//! The participants are read when the turn starts.

use turnpike_artifactory::{Directory, ErrorKind};
use turnpike_schemas::{ConversationId, Identity, TenantId};

use crate::error::Result;

/// The participants of a turn's conversation, and the check against them.
#[derive(Debug, Clone)]
pub struct Reach {
    directory: Directory,
    tenant: TenantId,
    conversation: ConversationId,
    participants: Vec<Identity>,
}

impl Reach {
    /// The participants of `conversation` now: its owner and its grantees.
    pub async fn load(
        directory: &Directory,
        tenant: &TenantId,
        conversation: ConversationId,
    ) -> Result<Self> {
        let entry = directory.lookup_unchecked(conversation).await?;
        let mut participants = vec![entry.owner];
        participants.extend(directory.grantees(conversation).await?);
        participants.dedup();
        Ok(Self {
            directory: directory.clone(),
            tenant: tenant.clone(),
            conversation,
            participants,
        })
    }

    /// A reach for a conversation of one participant (tests, replay).
    pub fn private(
        directory: &Directory,
        tenant: &TenantId,
        conversation: ConversationId,
        owner: Identity,
    ) -> Self {
        Self {
            directory: directory.clone(),
            tenant: tenant.clone(),
            conversation,
            participants: vec![owner],
        }
    }

    /// Whether more than one identity reads the conversation.
    pub fn shared(&self) -> bool {
        self.participants.len() > 1
    }

    /// Whether the turn may bring what is in `other` into this conversation: its own always;
    /// another only if every participant may see it (a store error counts as no).
    pub async fn allows(&self, other: ConversationId) -> bool {
        if other == self.conversation || !self.shared() {
            return true;
        }
        for participant in &self.participants {
            match self
                .directory
                .lookup(other, &self.tenant, participant)
                .await
            {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => return false,
                Err(_) => return false,
            }
        }
        true
    }
}
