//! The conversation directory: which tenant owns a conversation and who may see it.
//!
//! One create-only object per conversation. Lookups for an identity that may not see a
//! conversation fail exactly like lookups of a conversation that does not exist.

use std::sync::Arc;

use object_store::{ObjectStore, ObjectStoreExt as _, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use turnpike_schemas::{AgentId, AppId, ConversationId, Identity, TenantId};

use crate::error::{Error, ErrorKind, Result};
use crate::layout::{directory_entry, ConversationPrefix};

/// What the directory knows of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectoryEntry {
    pub conversation: ConversationId,
    pub tenant: TenantId,
    pub owner: Identity,
    pub app: AppId,
    pub agent: AgentId,
    pub created_ms: u64,
}

impl DirectoryEntry {
    /// The conversation's store prefix.
    pub fn prefix(&self) -> ConversationPrefix {
        ConversationPrefix::new(self.tenant.clone(), self.conversation)
    }
}

/// The directory in an object store.
#[derive(Debug, Clone)]
pub struct Directory {
    store: Arc<dyn ObjectStore>,
}

fn not_found(conversation: ConversationId) -> Error {
    Error::new(
        ErrorKind::NotFound,
        format!("conversation {conversation} not found"),
    )
}

impl Directory {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self { store }
    }

    /// Registers a conversation; fails with `AlreadyExists` if its id is taken.
    pub async fn create(&self, entry: &DirectoryEntry) -> Result<()> {
        let bytes = serde_json::to_vec(entry).expect("directory entries serialise");
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        self.store
            .put_opts(
                &directory_entry(entry.conversation),
                PutPayload::from(bytes),
                opts,
            )
            .await
            .map_err(|e| Error::store(&format!("registering {}", entry.conversation), e))?;
        Ok(())
    }

    /// Looks a conversation up for `actor`: only its owner sees it; anyone else gets the same
    /// `NotFound` as for a conversation that does not exist.
    pub async fn lookup(
        &self,
        conversation: ConversationId,
        actor: &Identity,
    ) -> Result<DirectoryEntry> {
        let entry = self.lookup_unchecked(conversation).await?;
        if &entry.owner != actor {
            return Err(not_found(conversation));
        }
        Ok(entry)
    }

    /// Every conversation, in id order (creation order): for the runtime's own sweeps (index
    /// rebuilds), never for callers.
    pub async fn list(&self) -> Result<Vec<DirectoryEntry>> {
        use futures::TryStreamExt as _;
        let dir = object_store::path::Path::from("directory/conversations");
        let metas: Vec<_> = self
            .store
            .list(Some(&dir))
            .try_collect()
            .await
            .map_err(|e| Error::store("listing conversations", e))?;
        let mut ids: Vec<ConversationId> = metas
            .iter()
            .filter_map(|m| m.location.filename()?.strip_suffix(".json")?.parse().ok())
            .collect();
        ids.sort();
        let mut entries = Vec::with_capacity(ids.len());
        for id in ids {
            entries.push(self.lookup_unchecked(id).await?);
        }
        Ok(entries)
    }

    /// Looks a conversation up with no access check: for the runtime itself, never for callers.
    pub async fn lookup_unchecked(&self, conversation: ConversationId) -> Result<DirectoryEntry> {
        let result = match self.store.get(&directory_entry(conversation)).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Err(not_found(conversation)),
            Err(e) => return Err(Error::store(&format!("looking up {conversation}"), e)),
        };
        let bytes = result
            .bytes()
            .await
            .map_err(|e| Error::store(&format!("looking up {conversation}"), e))?;
        serde_json::from_slice(&bytes).map_err(|e| {
            Error::with_source(
                ErrorKind::Corrupt,
                format!("the directory entry of {conversation} is unreadable: {e}"),
                e,
            )
        })
    }
}
