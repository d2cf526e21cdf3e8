//! Tombstones: what proves a conversation was deleted, kept outside the deleted data. Written
//! before anything is deleted (with who, when, why, and the record's final root), marked
//! finished once every store is clean; an unfinished one is a deletion that a crash cut short,
//! which the next sweep finishes.
//!
//! Layout: `tombstones/{tenant}/{conversation}.json`.

use std::sync::Arc;

use futures::TryStreamExt as _;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};
use serde::{Deserialize, Serialize};
use turnpike_schemas::{AgentId, AppId, ConversationId, Identity, TenantId};

use crate::error::{Error, ErrorKind, Result};
use crate::layout::ConversationPrefix;

/// The evidence of one deletion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    pub conversation: ConversationId,
    pub tenant: TenantId,
    pub owner: Identity,
    pub app: AppId,
    pub agent: AgentId,
    /// Who asked (an identity, or `retention` for the sweep).
    pub deleted_by: String,
    /// Why: `erasure requested by the owner`, `retention: closed for more than …`.
    pub reason: String,
    pub requested_ms: u64,
    /// The record's last signed root and its size when the deletion started (hex; none for a
    /// conversation whose record was never opened).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_root: Option<String>,
    pub final_leaves: u64,
    /// When every store was clean; `None` while the deletion runs (or was cut short).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_ms: Option<u64>,
}

impl Tombstone {
    pub fn prefix(&self) -> ConversationPrefix {
        ConversationPrefix::new(self.tenant.clone(), self.conversation)
    }
}

fn path(tenant: &TenantId, conversation: ConversationId) -> Path {
    Path::from(format!("tombstones/{tenant}/{conversation}.json"))
}

/// The tombstones in one object store.
#[derive(Debug, Clone)]
pub struct Tombstones {
    store: Arc<dyn ObjectStore>,
}

impl Tombstones {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self { store }
    }

    /// Writes (or rewrites) a tombstone.
    pub async fn put(&self, tombstone: &Tombstone) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(tombstone).expect("tombstones serialise");
        self.store
            .put(
                &path(&tombstone.tenant, tombstone.conversation),
                PutPayload::from(bytes),
            )
            .await
            .map_err(|e| Error::store("writing a tombstone", e))?;
        Ok(())
    }

    /// The tombstone of a conversation, if it was deleted (or is being deleted).
    pub async fn get(
        &self,
        tenant: &TenantId,
        conversation: ConversationId,
    ) -> Result<Option<Tombstone>> {
        match self.store.get(&path(tenant, conversation)).await {
            Ok(found) => {
                let bytes = found
                    .bytes()
                    .await
                    .map_err(|e| Error::store("reading a tombstone", e))?;
                serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                    Error::with_source(ErrorKind::Corrupt, "a tombstone is unreadable", e)
                })
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Error::store("reading a tombstone", e)),
        }
    }

    /// Every tombstone (of every tenant).
    pub async fn list(&self) -> Result<Vec<Tombstone>> {
        let metas: Vec<_> = self
            .store
            .list(Some(&Path::from("tombstones")))
            .try_collect()
            .await
            .map_err(|e| Error::store("listing tombstones", e))?;
        let mut out = Vec::new();
        for meta in metas {
            let bytes = match self.store.get(&meta.location).await {
                Ok(r) => r
                    .bytes()
                    .await
                    .map_err(|e| Error::store("reading a tombstone", e))?,
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(Error::store("reading a tombstone", e)),
            };
            if let Ok(t) = serde_json::from_slice::<Tombstone>(&bytes) {
                out.push(t);
            }
        }
        Ok(out)
    }

    /// Deletes every object under the conversation's prefix (its record, turn logs, snapshots,
    /// files, attachments, project versions, dead letters, forget markers); returns how many.
    /// Idempotent.
    pub async fn purge(&self, prefix: &ConversationPrefix) -> Result<usize> {
        let base = Path::from(format!(
            "tenants/{}/conversations/{}",
            prefix.tenant(),
            prefix.conversation()
        ));
        let paths: Vec<Path> = self
            .store
            .list(Some(&base))
            .map_ok(|m| m.location)
            .try_collect()
            .await
            .map_err(|e| Error::store("listing a conversation's objects", e))?;
        let n = paths.len();
        for path in paths {
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::store(&format!("deleting {path}"), e)),
            }
        }
        Ok(n)
    }
}
