//! One turn, in the words of DESIGN's life of a turn: batch one (its inputs, any
//! `ingress_directive`, and `turn_dispatched`) commits before anything runs; the app's callback
//! works, folding in what arrives on the lane (committed before it is seen); the turn log is
//! written; batch two (replies, tool calls and results, and `turn_complete` with the log's
//! digest) closes the turn, and the committed attempt's objects are promoted.
//!
//! # Layout
//! - [`TurnEnv`] (here): what a turn needs from its owner
//! - `batch_one`: a new turn's batch one, and recovering a turn left open
//! - `context`: [`TurnContext`], the turn as an app's callback sees it
//! - `lane_watch`: what arrives on the lane while a turn runs (follow-ups, stops)
//! - `opening`: a batch one before its commit, and the next turn's, committed with a batch two
//! - `batch_two`: the end of a turn: its entries, its version, the commit, the promotion

mod batch_one;
mod batch_two;
mod context;
mod lane_watch;
mod opening;

pub use batch_one::{recover_turn, run_new_turn, run_opened};
pub use batch_two::{finish_committed, finish_promotion};
pub use context::TurnContext;
pub use lane_watch::{folds_into, StopCause};
pub use opening::{NoUpcoming, Opening, Upcoming};

use std::sync::Arc;

use tracing::warn;
use turnpike_artifactory::{Files, Head, Record, RecordSigner, TurnLogs};
use turnpike_resolver::Resolver;
use turnpike_router::bus::Bus;
use turnpike_schemas::live::LiveFrame;
use turnpike_schemas::{EntryBody, WorkerId};

use crate::config::WorkerConfig;
use crate::error::{Error, Result};
use crate::tools::SearchIndex;
use turnpike_agent::Apps;

/// What every turn of a worker needs, built once per worker and shared by its owners.
pub struct Shared {
    pub worker: WorkerId,
    pub bus: Arc<dyn Bus>,
    pub turn_logs: TurnLogs,
    pub files: Files,
    pub search: Option<Arc<dyn SearchIndex>>,
    /// Where the turn goes to be indexed once complete.
    pub indexing: Option<turnpike_index::indexer::IndexQueue>,
    pub cell: Result<Arc<crate::cell::Cell>, String>,
    pub signer: RecordSigner,
    pub apps: Arc<Apps>,
    /// The tools this worker runs (an agent's allowlist names which it may call).
    pub tools: crate::tools::Registry,
    pub directory: turnpike_artifactory::Directory,
    /// Where a sweep finds turns left open: marked before the first batch one of a drain,
    /// cleared when the drain ends with every turn closed and promoted.
    pub open_turns: turnpike_artifactory::OpenTurns,
    /// Where lane messages that cannot be taken are set aside.
    pub dead_letters: turnpike_artifactory::DeadLetters,
    /// Users' connections to MCP servers (none without a deployment connection key).
    pub connections: Option<turnpike_artifactory::Connections>,
    /// The outbox of outbound webhooks: a turn's end, told to its subscribers.
    pub notifier: Arc<crate::webhooks::Notifier>,
    pub config: WorkerConfig,
}

/// What a turn needs from its owner: the worker's [`Shared`] parts (reached through `Deref`)
/// and what is the owner's own.
pub struct TurnEnv {
    pub shared: Arc<Shared>,
    pub record: Record,
    /// Resolves references in the conversation's own tenant.
    pub resolver: Resolver,
    /// Whether this owner has marked the conversation (and not cleared the mark since).
    pub marked: std::sync::atomic::AtomicBool,
    /// The owner's lease deadline: fenced writes check it first.
    pub fence: turnpike_lifecycle::Fence,
    /// When this owner dispatched the turn it runs (ms; 0: none), for the turn's duration.
    pub dispatched_ms: std::sync::atomic::AtomicU64,
    /// What the owner knows of the lane past the record, handed between its drain and the
    /// running turn's lane watch so neither reads a message the other already read.
    pub lane: std::sync::Mutex<LaneAhead>,
    /// The owner's turn slot, given up after a turn's commit when the owner owes it.
    pub(crate) turn_slot: crate::dispatch::TurnSlot,
}

/// The most lane messages one read asks for, and an owner holds read ahead of its record.
pub const LANE_READ: usize = 64;

/// The lane past the record, as far as the owner has read it (see [`TurnEnv::lane`]).
#[derive(Debug, Default)]
pub struct LaneAhead {
    /// Set by the drain before a turn starts: the lane's messages that directly follow the
    /// turn's inputs, in lane order (the lane watch takes them instead of reading them again).
    pub after_inputs: Vec<turnpike_router::LaneMessage>,
    /// Set when a turn's lane watch stops: the lane sequence through which its last read saw the
    /// whole lane, when nothing was signalled after that read was sent. `None`: not known.
    /// Advisory (a signal may be missed): the owner re-reads the lane after its release anyway.
    pub quiet_through: Option<u64>,
}

impl std::ops::Deref for TurnEnv {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.shared
    }
}

impl TurnEnv {
    /// Appends a batch at `head`; a moved head means another owner wrote: this one is fenced.
    /// Entries the record refuses are refused ([`crate::error::ErrorKind::Refused`]). Once committed, clients are told (a "new rows" tick).
    pub async fn append(&self, head: &Head, bodies: &[EntryBody]) -> Result<Head> {
        self.fence.check()?;
        let started = std::time::Instant::now();
        let head = self
            .record
            .append(&self.signer, head, bodies)
            .await
            .map_err(Error::from_append)?;
        crate::metrics::committed(bodies, started.elapsed(), &self.dispatched_ms);
        let tick = LiveFrame::Rows {
            through: head.leaves(),
        };
        self.bus
            .live(self.record.prefix().conversation(), tick.to_bytes().into())
            .await;
        Ok(head)
    }

    /// Marks the conversation for the sweep, once per drain (before its first batch one; the
    /// drain writes it while it reads the lane for a wake past the record).
    pub async fn ensure_marked(&self) -> Result<()> {
        use std::sync::atomic::Ordering;
        if !self.marked.load(Ordering::Acquire) {
            self.open_turns.mark(self.record.prefix()).await?;
            self.marked.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Clears the mark at the end of a drain that left every turn closed and promoted.
    pub async fn end_drain(&self) {
        let conversation = self.record.prefix().conversation();
        self.config.failpoints.hit("drain-end", conversation).await;
        if self.marked.load(std::sync::atomic::Ordering::Acquire) {
            self.clear_open_mark().await;
        }
    }

    async fn clear_open_mark(&self) {
        // Forgotten even when it cannot be cleared: with the lease lapsed, whoever takes it
        // may clear the mark (a sweep finding the turns closed), so this owner, should it
        // claim the lease again, marks afresh before its next batch one.
        self.marked
            .store(false, std::sync::atomic::Ordering::Release);
        // A superseded owner must not clear the mark the new owner set for its own turn.
        if self.fence.check().is_err() {
            return;
        }
        if let Err(e) = self.open_turns.clear(self.record.prefix()).await {
            warn!(conversation = %self.record.prefix().conversation(), error = %e, "could not clear the open-turn mark");
        }
    }
}
