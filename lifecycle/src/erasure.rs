//! Deleting a conversation from every store: on a user's request (erasure), or when it has been
//! closed longer than the retention window.
//!
//! Contract:
//! - the deleter holds the conversation's lease, so no turn writes while it deletes; a
//!   conversation whose lease is held (a turn runs) is [`ErasureError::Busy`] — retry, or stop
//!   the turn first. The deleter is fenced like any owner: it renews the lease at a third of
//!   its time (a failed renewal is retried) and stops — its work dropped, the tombstone left
//!   pending — before the lease can lapse, so no sweeper takes the conversation over while it
//!   still deletes;
//! - a [`Tombstone`] (who, when, why, the record's final root) is written **before** anything
//!   is deleted, outside the deleted data, and stays as the evidence;
//! - then, in this order: the directory (from here on the conversation is not found by anyone),
//!   its open-turn mark (so no sweep recovers a turn of what is being deleted), every object
//!   under its prefix (record, turn logs, snapshots, files, attachments, project versions, dead
//!   letters, forget markers), its index rows and mark, the rest of its lane; last, the
//!   tombstone is marked finished;
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
use crate::fence::Fence;

/// Why a deletion did not happen (now).
#[derive(Debug)]
pub enum ErasureError {
    /// A turn runs (its owner holds the lease): retry later.
    Busy,
    /// Someone else deleted it meanwhile.
    Gone,
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
            ErasureError::Gone => f.write_str("the conversation was deleted meanwhile"),
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
    /// How long a held lease is waited for before the deletion is [`ErasureError::Busy`].
    busy_wait: Duration,
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
            busy_wait: Duration::ZERO,
        }
    }

    /// Crashes at `erase-after-directory` (between the directory and the objects) in tests.
    pub fn with_failpoints(mut self, failpoints: Failpoints) -> Self {
        self.failpoints = failpoints;
        self
    }

    /// How long the deleter's lease lasts (15 s by default); it is renewed at a third of that.
    pub fn with_lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// How long a lease held by an owner is waited for before the deletion is
    /// [`ErasureError::Busy`] (none by default). A user who saw a turn's reply and asks for a
    /// deletion right away meets the owner still finishing that turn (its ref, its index rows,
    /// letting go of the lane): the API waits that out instead of answering `409`.
    pub fn with_busy_wait(mut self, wait: Duration) -> Self {
        self.busy_wait = wait;
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
        let deadline = tokio::time::Instant::now() + self.busy_wait;
        let lease = loop {
            match self
                .bus
                .claim(entry.conversation, deleter, self.lease_ttl)
                .await
                .map_err(failed)?
            {
                Some(lease) => break lease,
                None if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                None => return Err(ErasureError::Busy),
            }
        };
        // The lease is renewed while the deletion runs: no owner takes the conversation and
        // writes into what is being deleted.
        self.holding(lease, self.erase_held(entry, by, reason))
            .await
    }

    async fn erase_held(
        &self,
        entry: &DirectoryEntry,
        by: &str,
        reason: &str,
    ) -> Result<Tombstone, ErasureError> {
        let tombstones = self.conversations.tombstones();
        // Under the lease, look again: another deletion may have finished meanwhile (its
        // tombstone is the evidence and is not overwritten).
        match self
            .conversations
            .directory()
            .lookup_unchecked(entry.conversation)
            .await
        {
            Ok(_) => {}
            Err(e) if e.kind() == turnpike_artifactory::ErrorKind::NotFound => {
                return Err(ErasureError::Gone)
            }
            Err(e) => return Err(failed(e)),
        }
        if let Some(earlier) = tombstones
            .get(&entry.tenant, entry.conversation)
            .await
            .map_err(failed)?
        {
            return self.finish(earlier).await;
        }
        // The head as stored, verified or not: a record nobody trusts can still be deleted.
        let record =
            turnpike_artifactory::Record::new(self.conversations.store().clone(), entry.prefix());
        let head = record.head().await.ok();
        let (final_root, final_leaves) = match &head {
            Some(head) if !head.is_empty() => (Some(head.root_hex()), head.leaves()),
            _ => (None, 0),
        };
        let tombstone = Tombstone {
            conversation: entry.conversation,
            tenant: entry.tenant.clone(),
            owner: entry.owner.clone(),
            app: entry.app.clone(),
            agent: entry.agent.clone(),
            deleted_by: by.to_owned(),
            reason: reason.to_owned(),
            requested_ms: now_ms(),
            final_root,
            final_leaves,
            finished_ms: None,
        };
        tombstones.put(&tombstone).await.map_err(failed)?;
        self.finish(tombstone).await
    }

    /// Does (again) every step after the tombstone; marks it finished.
    async fn finish(&self, mut tombstone: Tombstone) -> Result<Tombstone, ErasureError> {
        let prefix = tombstone.prefix();
        let conversation = tombstone.conversation;
        self.conversations
            .directory()
            .remove(conversation, &tombstone.owner)
            .await
            .map_err(failed)?;
        // What waits on the lane goes at once (and again at the end, for what raced in).
        self.bus.purge_lane(conversation).await.map_err(failed)?;
        self.failpoints
            .hit("erase-after-directory", conversation)
            .await;
        // Before the objects: a sweep must find no open turn here to recover into them.
        self.conversations
            .open_turns()
            .clear(&prefix)
            .await
            .map_err(failed)?;
        // Until a listing finds nothing: what a racing writer added meanwhile goes too.
        let mut objects = 0;
        for _ in 0..3 {
            let n = self
                .conversations
                .tombstones()
                .purge(&prefix)
                .await
                .map_err(failed)?;
            objects += n;
            if n == 0 {
                break;
            }
        }
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

    /// Runs `work` while renewing `lease` at a third of its time, then releases the lease. A
    /// renewal that fails is retried at the next tick; once the lease could lapse before the
    /// tick after, `work` is dropped (it is only polled between renewals, so nothing of it
    /// runs after) and the deletion fails, its tombstone pending for the sweep to finish.
    async fn holding<T>(
        &self,
        mut lease: turnpike_router::Lease,
        work: impl std::future::Future<Output = Result<T, ErasureError>>,
    ) -> Result<T, ErasureError> {
        let conversation = lease.conversation;
        let every = self.lease_ttl / 3;
        let fence = Fence::new(lease.expires_ms, every);
        tokio::pin!(work);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let result = loop {
            tokio::select! {
                biased;
                result = &mut work => break result,
                _ = tick.tick() => {
                    match self.bus.renew(&lease, self.lease_ttl).await {
                        Ok(renewed) => {
                            lease = renewed;
                            fence.renewed(lease.expires_ms);
                        }
                        Err(e) if e.kind() == turnpike_router::ErrorKind::LeaseLost => {
                            warn!(%conversation, error = %e, "the deleter lost its lease");
                            break Err(failed(format!("the deleter lost its lease: {e}")));
                        }
                        Err(e) => {
                            warn!(%conversation, error = %e, "the deleter's lease renewal failed; retrying")
                        }
                    }
                    if !fence.holds_at(now_ms()) {
                        break Err(failed(
                            "the deleter's lease could not be renewed before it expires; the sweep finishes the deletion",
                        ));
                    }
                }
            }
        };
        if let Err(e) = self.bus.release(&lease).await {
            warn!(%conversation, error = %e, "could not release the deleter's lease");
        }
        result
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
            let result = self.holding(lease, self.finish(tombstone)).await;
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
