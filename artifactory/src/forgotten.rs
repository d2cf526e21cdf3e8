//! What the owner of a conversation asked the index to forget: single rows, or every row up to
//! a turn. The record is untouched (it is the evidence); these markers are durable, so a
//! rebuild of the index from the records never brings a forgotten row back.
//!
//! # Contract
//! - a marker is written **before** the rows leave the index: a crash between the two leaves
//!   rows that the next delete, or the next rebuild's filter, removes;
//! - markers live under the conversation's prefix, so deleting the conversation deletes them;
//! - [`Forgotten::list`] is one listing per conversation; it reads no object bodies.

use std::collections::HashSet;
use std::sync::Arc;

use futures::TryStreamExt as _;
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};
use sha2::Digest as _;
use turnpike_schemas::TurnId;

use crate::error::{Error, Result};
use crate::layout::ConversationPrefix;

/// The forget markers of one conversation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForgetList {
    rows: HashSet<String>,
    through: Option<TurnId>,
}

impl ForgetList {
    /// Whether the row `id` of `turn` is forgotten.
    pub fn forgets(&self, id: &str, turn: TurnId) -> bool {
        self.through.is_some_and(|t| turn <= t) || self.rows.contains(&row_hash(id))
    }

    /// Whether nothing is forgotten.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.through.is_none()
    }
}

fn row_hash(id: &str) -> String {
    hex::encode(&sha2::Sha256::digest(id.as_bytes())[..16])
}

/// The forget markers in one object store.
#[derive(Debug, Clone)]
pub struct Forgotten {
    store: Arc<dyn ObjectStore>,
}

impl Forgotten {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self { store }
    }

    /// Forgets the row `id` of the conversation (idempotent).
    pub async fn forget_row(&self, prefix: &ConversationPrefix, id: &str) -> Result<()> {
        self.store
            .put(
                &prefix.forgotten_row(&row_hash(id)),
                PutPayload::from(id.to_owned()),
            )
            .await
            .map_err(|e| Error::store("keeping a forgotten row", e))?;
        Ok(())
    }

    /// Forgets every row of the conversation up to `turn` (idempotent; a later mark wins).
    pub async fn forget_through(&self, prefix: &ConversationPrefix, turn: TurnId) -> Result<()> {
        self.store
            .put(
                &prefix.forgotten_through(turn),
                PutPayload::from_static(b""),
            )
            .await
            .map_err(|e| Error::store("keeping a forgotten conversation", e))?;
        Ok(())
    }

    /// What the conversation's owner forgot.
    pub async fn list(&self, prefix: &ConversationPrefix) -> Result<ForgetList> {
        let metas: Vec<_> = self
            .store
            .list(Some(&prefix.forgotten_dir()))
            .try_collect()
            .await
            .map_err(|e| Error::store("listing forgotten rows", e))?;
        let mut list = ForgetList::default();
        for meta in metas {
            let parts = crate::layout::segments(&meta.location);
            let Some(name) = parts.last().cloned() else {
                continue;
            };
            match parts.get(parts.len().wrapping_sub(2)).map(String::as_str) {
                Some("rows") => {
                    list.rows.insert(name);
                }
                Some("through") => {
                    if let Some(turn) = name.parse().ok().and_then(TurnId::new) {
                        list.through = list.through.max(Some(turn));
                    }
                }
                _ => {}
            }
        }
        Ok(list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rows_and_turns_are_forgotten_durably() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let forgotten = Forgotten::new(store.clone());
        let prefix = ConversationPrefix::new(
            "acme".parse().unwrap(),
            turnpike_schemas::ConversationId::new(),
        );
        let t = |n| TurnId::new(n).unwrap();
        assert!(forgotten.list(&prefix).await.unwrap().is_empty());
        forgotten
            .forget_row(&prefix, "conv:tl:x/turn_5/b3")
            .await
            .unwrap();
        forgotten.forget_through(&prefix, t(2)).await.unwrap();
        forgotten.forget_through(&prefix, t(3)).await.unwrap();
        // Read again from the store, as a rebuild would.
        let list = Forgotten::new(store).list(&prefix).await.unwrap();
        assert!(list.forgets("conv:tl:x/turn_5/b3", t(5)));
        assert!(!list.forgets("conv:tl:x/turn_5/b4", t(5)));
        assert!(list.forgets("anything", t(3)));
        assert!(!list.forgets("anything", t(4)));
        // Another conversation forgets nothing of this.
        let other = ConversationPrefix::new(
            "acme".parse().unwrap(),
            turnpike_schemas::ConversationId::new(),
        );
        assert!(forgotten_of(&other).await.is_empty());
    }

    async fn forgotten_of(prefix: &ConversationPrefix) -> ForgetList {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        Forgotten::new(store).list(prefix).await.unwrap()
    }
}
