//! Deleting a conversation from every store: on a user's request (erasure), or when it has been
//! closed longer than the retention window.
//!
//! Contract:
//! - the deleter holds the conversation's lease, so no turn writes while it deletes; a
//!   conversation whose lease is held (a turn runs) is [`ErasureError::Busy`] — retry, or stop
//!   the turn first;
//! - a [`Tombstone`] (who, when, why, the record's final root) is written **before** anything
//!   is deleted, outside the deleted data, and stays as the evidence;
//! - then, in this order: the directory (from here on the conversation is not found by anyone),
//!   every object under its prefix (record, turn logs, snapshots, files, attachments, project
//!   versions, dead letters, forget markers), its open-turn mark, its index rows and mark, the
//!   rest of its lane; last, the tombstone is marked finished;
//! - every step is idempotent: a deletion cut short (a crash) is finished by
//!   [`Eraser::finish_pending`], which the workers' sweep runs.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};
use turnpike_artifactory::{Conversations, DirectoryEntry, Tombstone};
use turnpike_router::bus::Bus;
use turnpike_router::clock::now_ms;
use turnpike_schemas::WorkerId;

use crate::failpoints::Failpoints;

/// Why a deletion did not happen (now).
#[derive(Debug)]
pub enum ErasureError {
    /// A turn runs (its owner holds the lease): retry later.
    Busy,
    /// A store, the index or the bus failed; what was done stays done, and the tombstone says
    /// the rest is pending.
    Failed(String),
}

impl std::fmt::Display for ErasureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ErasureError::Busy => f.write_str(
                "a turn is running in the conversation; retry once it ends (or stop it)",
            ),
            ErasureError::Failed(why) => write!(f, "the deletion did not finish: {why}"),
        }
    }
}

impl std::error::Error for ErasureError {}

fn failed(e: impl std::fmt::Display) -> ErasureError {
    ErasureError::Failed(e.to_string())
}

/// Deletes conversations from every store.
#[derive(Clone)]
pub struct Eraser {
    conversations: Conversations,
    bus: Arc<dyn Bus>,
    index: Option<turnpike_index::Index>,
    failpoints: Failpoints,
    /// How long the deleter's lease lasts (it is released when done).
    lease_ttl: Duration,
}

impl Eraser {
    pub fn new(
        conversations: Conversations,
        bus: Arc<dyn Bus>,
        index: Option<turnpike_index::Index>,
    ) -> Self {
        Self {
            conversations,
            bus,
            index,
            failpoints: Failpoints::default(),
            lease_ttl: Duration::from_secs(15),
        }
    }

    /// Crashes at `erase-after-directory` (between the directory and the objects) in tests.
    pub fn with_failpoints(mut self, failpoints: Failpoints) -> Self {
        self.failpoints = failpoints;
        self
    }

    /// Deletes the conversation of `entry`, recorded as asked by `by` for `reason`.
    pub async fn erase(
        &self,
        entry: &DirectoryEntry,
        by: &str,
        reason: &str,
    ) -> Result<Tombstone, ErasureError> {
        let deleter = WorkerId::new();
        let lease = self
            .bus
            .claim(entry.conversation, deleter, self.lease_ttl)
            .await
            .map_err(failed)?
            .ok_or(ErasureError::Busy)?;
        let result = self.erase_held(entry, by, reason).await;
        if let Err(e) = self.bus.release(&lease).await {
            warn!(conversation = %entry.conversation, error = %e, "could not release the deleter's lease");
        }
        result
    }

    async fn erase_held(
        &self,
        entry: &DirectoryEntry,
        by: &str,
        reason: &str,
    ) -> Result<Tombstone, ErasureError> {
        let tombstones = self.conversations.tombstones();
        let record = self.conversations.record(entry.prefix());
        let head = record.head().await.map_err(failed)?;
        let tombstone = Tombstone {
            conversation: entry.conversation,
            tenant: entry.tenant.clone(),
            owner: entry.owner.clone(),
            app: entry.app.clone(),
            agent: entry.agent.clone(),
            deleted_by: by.to_owned(),
            reason: reason.to_owned(),
            requested_ms: now_ms(),
            final_root: (!head.is_empty()).then(|| head.root_hex()),
            final_leaves: head.leaves(),
            finished_ms: None,
        };
        tombstones.put(&tombstone).await.map_err(failed)?;
        self.finish(tombstone).await
    }

    /// Does (again) every step after the tombstone; marks it finished.
    async fn finish(&self, mut tombstone: Tombstone) -> Result<Tombstone, ErasureError> {
        let prefix = tombstone.prefix();
        let conversation = tombstone.conversation;
        let entry = DirectoryEntry {
            conversation,
            tenant: tombstone.tenant.clone(),
            owner: tombstone.owner.clone(),
            app: tombstone.app.clone(),
            agent: tombstone.agent.clone(),
            created_ms: 0,
            instructions: None,
        };
        let directory = self.conversations.directory();
        directory.remove(&entry).await.map_err(failed)?;
        self.failpoints
            .hit("erase-after-directory", conversation)
            .await;
        let objects = self
            .conversations
            .tombstones()
            .purge(&prefix)
            .await
            .map_err(failed)?;
        self.conversations
            .open_turns()
            .clear(&prefix)
            .await
            .map_err(failed)?;
        let mut rows = 0;
        if let Some(index) = &self.index {
            let scope =
                turnpike_index::Scope::new(tombstone.tenant.clone(), tombstone.owner.clone());
            let filters = turnpike_index::Filters {
                conversation: Some(conversation),
                ..Default::default()
            };
            rows = index
                .backend()
                .delete(&scope, &filters, None)
                .await
                .map_err(failed)?;
            index
                .backend()
                .drop_mark(&scope, conversation)
                .await
                .map_err(failed)?;
        }
        self.bus.purge_lane(conversation).await.map_err(failed)?;
        tombstone.finished_ms = Some(now_ms());
        self.conversations
            .tombstones()
            .put(&tombstone)
            .await
            .map_err(failed)?;
        info!(%conversation, objects, rows, by = %tombstone.deleted_by, reason = %tombstone.reason, "conversation deleted");
        Ok(tombstone)
    }

    /// Finishes every deletion a crash cut short (under each conversation's lease); returns
    /// how many it finished.
    pub async fn finish_pending(&self) -> Result<usize, ErasureError> {
        let pending = self
            .conversations
            .tombstones()
            .pending()
            .await
            .map_err(failed)?;
        let mut finished = 0;
        for tombstone in pending {
            let conversation = tombstone.conversation;
            let Some(lease) = self
                .bus
                .claim(conversation, WorkerId::new(), self.lease_ttl)
                .await
                .map_err(failed)?
            else {
                continue;
            };
            let result = self.finish(tombstone).await;
            let _ = self.bus.release(&lease).await;
            match result {
                Ok(_) => finished += 1,
                Err(e) => {
                    warn!(%conversation, error = %e, "a pending deletion did not finish; the next sweep retries")
                }
            }
        }
        Ok(finished)
    }
}
