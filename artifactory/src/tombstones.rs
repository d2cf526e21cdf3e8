//! Tombstones: what proves a conversation was deleted, kept outside the deleted data. Written
//! before anything is deleted (with who, when, why, and the record's final root), marked
//! finished once every store is clean; an unfinished one is a deletion that a crash cut short,
//! which the next sweep finishes.
//!
//! Layout (see [`crate::layout`]): `tombstones/{tenant}/{conversation}.json`, and while the
//! deletion runs `tombstones-pending/{tenant}/{conversation}` (empty): a sweep lists only
//! those, so its cost does not grow with the conversations ever deleted.

use std::sync::Arc;

use futures::TryStreamExt as _;
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};
use serde::{Deserialize, Serialize};
use turnpike_schemas::{AgentId, AppId, ConversationId, Identity, TenantId};

use crate::error::{Error, ErrorKind, Result};
use crate::layout::{self, ConversationPrefix};

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

/// The tombstones in one object store.
#[derive(Debug, Clone)]
pub struct Tombstones {
    store: Arc<dyn ObjectStore>,
}

impl Tombstones {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self { store }
    }

    /// Writes (or rewrites) a tombstone: an unfinished one is listed as pending first, a
    /// finished one is no longer listed as pending once written.
    pub async fn put(&self, tombstone: &Tombstone) -> Result<()> {
        let pending = layout::tombstone_pending(&tombstone.tenant, tombstone.conversation);
        if tombstone.finished_ms.is_none() {
            self.store
                .put(&pending, PutPayload::from_static(b""))
                .await
                .map_err(|e| Error::store("listing a deletion as pending", e))?;
        }
        let bytes = serde_json::to_vec_pretty(tombstone).expect("tombstones serialise");
        self.store
            .put(
                &layout::tombstone(&tombstone.tenant, tombstone.conversation),
                PutPayload::from(bytes),
            )
            .await
            .map_err(|e| Error::store("writing a tombstone", e))?;
        if tombstone.finished_ms.is_some() {
            match self.store.delete(&pending).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::store("clearing a pending deletion", e)),
            }
        }
        Ok(())
    }

    /// The deletions that have not finished (one listing; a tombstone read for each).
    pub async fn pending(&self) -> Result<Vec<Tombstone>> {
        let metas: Vec<_> = self
            .store
            .list(Some(&layout::tombstones_pending_dir()))
            .try_collect()
            .await
            .map_err(|e| Error::store("listing pending deletions", e))?;
        let mut out = Vec::new();
        for meta in metas {
            let parts = layout::segments(&meta.location);
            let [_, tenant, conversation] = parts.as_slice() else {
                continue;
            };
            let (Ok(tenant), Ok(conversation)) = (tenant.parse(), conversation.parse()) else {
                continue;
            };
            if let Some(t) = self.get(&tenant, conversation).await? {
                if t.finished_ms.is_none() {
                    out.push(t);
                }
            }
        }
        Ok(out)
    }

    /// The tombstone of a conversation, if it was deleted (or is being deleted).
    pub async fn get(
        &self,
        tenant: &TenantId,
        conversation: ConversationId,
    ) -> Result<Option<Tombstone>> {
        match self
            .store
            .get(&layout::tombstone(tenant, conversation))
            .await
        {
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

    /// Deletes every object under the conversation's prefix (its record, turn logs, snapshots,
    /// files, attachments, project versions, dead letters, forget markers); returns how many.
    /// Idempotent.
    pub async fn purge(&self, prefix: &ConversationPrefix) -> Result<usize> {
        crate::store::delete_under(
            self.store.as_ref(),
            &prefix.dir(),
            "a conversation's objects",
        )
        .await
    }
}
