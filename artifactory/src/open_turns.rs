//! Open-turn markers: where a sweep finds conversations whose record may end in an open turn,
//! without listing every conversation.
//!
//! # Contract
//! - An owner marks a conversation ([`OpenTurns::mark`]) **before** the first batch one it
//!   appends in a drain, and clears the mark ([`OpenTurns::clear`]) when the drain ends with
//!   every turn closed and its attempt's objects promoted (one put and one delete per drain, not
//!   per turn).
//!   So a record that ends in an open turn always has a mark; a mark without an open turn is
//!   stale (the owner died between the mark and batch one, or before clearing) and harmless.
//! - Marks are hints. The record decides: a sweeper takes the conversation's lease, reads the
//!   head, recovers the turn if one is open, and otherwise clears the stale mark — only while
//!   holding the lease, so it never clears the mark of a turn another owner is opening. A mark
//!   on a closed turn may also mean its promotion was left unfinished: finish it, then clear.
//!
//! Layout: `open-turns/{tenant}/{conversation}` (empty objects).

use std::sync::Arc;

use futures::TryStreamExt as _;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};
use turnpike_schemas::{ConversationId, TenantId};

use crate::error::{Error, Result};
use crate::layout::ConversationPrefix;

const ROOT: &str = "open-turns";

/// The open-turn marks in one object store.
#[derive(Debug, Clone)]
pub struct OpenTurns {
    store: Arc<dyn ObjectStore>,
}

impl OpenTurns {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self { store }
    }

    fn path(prefix: &ConversationPrefix) -> Path {
        Path::from(format!(
            "{ROOT}/{}/{}",
            prefix.tenant(),
            prefix.conversation()
        ))
    }

    /// Marks the conversation as possibly holding an open turn (idempotent). On stable storage
    /// no later than the next write that is ([`crate::SyncedWithNext`]): the batch one it
    /// precedes, which is what makes it count.
    pub async fn mark(&self, prefix: &ConversationPrefix) -> Result<()> {
        let opts = crate::store::synced_with_next(object_store::PutMode::Overwrite);
        self.store
            .put_opts(&Self::path(prefix), PutPayload::new(), opts)
            .await
            .map_err(|e| {
                Error::store(
                    &format!("marking an open turn of {}", prefix.partition()),
                    e,
                )
            })?;
        Ok(())
    }

    /// Whether the conversation is marked.
    pub async fn is_marked(&self, prefix: &ConversationPrefix) -> Result<bool> {
        crate::store::exists(
            self.store.as_ref(),
            &Self::path(prefix),
            &format!("reading the open-turn mark of {}", prefix.partition()),
        )
        .await
    }

    /// Clears the mark (a missing mark is not an error).
    pub async fn clear(&self, prefix: &ConversationPrefix) -> Result<()> {
        match self.store.delete(&Self::path(prefix)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Error::store(
                &format!("clearing the open-turn mark of {}", prefix.partition()),
                e,
            )),
        }
    }

    /// Every marked conversation. Entries that do not parse (not written by this code) are
    /// skipped.
    pub async fn list(&self) -> Result<Vec<ConversationPrefix>> {
        let metas: Vec<_> = self
            .store
            .list(Some(&Path::from(ROOT)))
            .try_collect()
            .await
            .map_err(|e| Error::store("listing open-turn marks", e))?;
        let mut out = Vec::new();
        for meta in metas {
            let parts: Vec<_> = meta.location.parts().collect();
            let [_, tenant, conversation] = parts.as_slice() else {
                continue;
            };
            let (Ok(tenant), Ok(conversation)) = (
                tenant.as_ref().parse::<TenantId>(),
                conversation.as_ref().parse::<ConversationId>(),
            ) else {
                continue;
            };
            out.push(ConversationPrefix::new(tenant, conversation));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn marks_are_listed_until_cleared() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let marks = OpenTurns::new(store);
        let a = ConversationPrefix::new("acme".parse().unwrap(), ConversationId::new());
        let b = ConversationPrefix::new("beta".parse().unwrap(), ConversationId::new());
        marks.mark(&a).await.unwrap();
        marks.mark(&a).await.unwrap();
        marks.mark(&b).await.unwrap();
        let mut listed = marks.list().await.unwrap();
        listed.sort_by_key(|p| p.tenant().to_string());
        assert_eq!(listed, vec![a.clone(), b.clone()]);
        marks.clear(&a).await.unwrap();
        marks.clear(&a).await.unwrap();
        assert_eq!(marks.list().await.unwrap(), vec![b]);
    }
}
