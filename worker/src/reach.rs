//! What a turn may reach beyond its own conversation.
//!
//! A turn acts as the identity that sent its input, and what its tools fetch lands in the
//! conversation's record, which every participant reads. In a conversation only its owner can
//! read, the turn may reach whatever that identity may see. In a shared one, it may reach only
//! what **every** participant (the owner and everyone it is shared with) may see: otherwise one
//! participant could read, through the turn, what only another may see (a confused deputy).
//! The participants are read the first time a tool asks (most turns never do), and a store
//! that cannot say who they are counts as "shared with someone who may see nothing".

use tokio::sync::OnceCell;
use turnpike_artifactory::Directory;
use turnpike_schemas::{ConversationId, Identity, TenantId};

/// The participants of a turn's conversation, and the check against them.
#[derive(Debug)]
pub struct Reach {
    directory: Directory,
    tenant: TenantId,
    conversation: ConversationId,
    /// `None`: they could not be read (fail closed).
    participants: OnceCell<Option<Vec<Identity>>>,
}

impl Reach {
    /// The reach of a turn of `conversation`; nothing is read until a tool asks.
    pub fn new(directory: &Directory, tenant: &TenantId, conversation: ConversationId) -> Self {
        Self {
            directory: directory.clone(),
            tenant: tenant.clone(),
            conversation,
            participants: OnceCell::new(),
        }
    }

    async fn participants(&self) -> Option<&[Identity]> {
        self.participants
            .get_or_init(|| async {
                let entry = self
                    .directory
                    .lookup_unchecked(self.conversation)
                    .await
                    .ok()?;
                let mut all = vec![entry.owner];
                all.extend(self.directory.grantees(self.conversation).await.ok()?);
                all.dedup();
                Some(all)
            })
            .await
            .as_deref()
    }

    /// Whether `identity` is the conversation's only reader. Not so when it was shared, and not
    /// so when `identity` is not a reader at all (a grant revoked while its message waited):
    /// then what the turn brings in must pass [`Reach::allows`].
    pub async fn private_to(&self, identity: &Identity) -> bool {
        self.participants()
            .await
            .is_some_and(|p| p.len() == 1 && p[0] == *identity)
    }

    /// Whether the turn may bring what is in `other` into this conversation: its own always;
    /// another only if every participant may see it (a store error counts as no).
    pub async fn allows(&self, other: ConversationId) -> bool {
        if other == self.conversation {
            return true;
        }
        let Some(participants) = self.participants().await else {
            return false;
        };
        for participant in participants {
            if self
                .directory
                .lookup(other, &self.tenant, participant)
                .await
                .is_err()
            {
                return false;
            }
        }
        true
    }
}
