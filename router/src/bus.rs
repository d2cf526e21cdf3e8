//! The bus: lanes, wakes and leases, behind one trait with two backends (JetStream and
//! embedded) that pass the same test suite.
//!
//! # Contract
//! - [`Bus::publish`] appends an event to its conversation's lane. Accepted means durable. An
//!   event with the same idempotency key (or, without one, the same event id) published again
//!   within the duplicate window is stored once and reported as a duplicate with the first
//!   sequence.
//! - Lane sequences increase along a lane (gaps allowed: a sequence is the stream's).
//! - Every accepted event is also a wake, delivered to one caller of [`Bus::next_wake`] at a time.
//!   A wake that is neither acked nor kept in progress is delivered again after the ack wait; a
//!   nak'd wake comes back after its delay. Wakes are hints: the record decides what is done.
//! - A lease is held by at most one worker at a time. Its revision increases with every claim
//!   and renewal and serves as the fencing epoch. A lease not renewed within its TTL may be
//!   claimed by anyone.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use turnpike_schemas::{ConversationId, Event, TenantId, WorkerId};

use crate::error::Result;
use crate::heartbeat::Heartbeat;

pub use crate::lane::{
    decode_lane_message, dedupe_id, republished_envelope, Envelope, LaneMessage, Unreadable,
};
pub use crate::lease::{may_claim, Lease, LeaseValue};

/// The outcome of a publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    pub seq: u64,
    /// The event had been accepted before (same idempotency key): nothing new was stored.
    pub duplicate: bool,
}

/// Acknowledges a wake to the bus.
#[async_trait]
pub trait WakeAck: Send + Sync {
    /// Done: the record has committed the lane past this wake.
    async fn ack(&self) -> Result<()>;
    /// Not now: deliver again after `delay`, maybe to someone else.
    async fn nak(&self, delay: Duration) -> Result<()>;
    /// Still working on it: extend the ack wait.
    async fn progress(&self) -> Result<()>;
    /// Never deliver it again, and it is not done (a backend without the distinction acks).
    async fn term(&self) -> Result<()> {
        self.ack().await
    }
}

/// "See that lane `conversation` is processed through `seq`."
pub struct Wake {
    pub conversation: ConversationId,
    pub tenant: TenantId,
    pub seq: u64,
    /// How many times it was delivered (1 the first time).
    pub deliveries: u64,
    /// When its event was put on the lane (ms since the epoch; 0: unknown): its place in the
    /// order of arrival, however often it was put off since.
    pub published_ms: u64,
    acker: std::sync::Arc<dyn WakeAck>,
}

impl fmt::Debug for Wake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wake")
            .field("conversation", &self.conversation)
            .field("seq", &self.seq)
            .field("deliveries", &self.deliveries)
            .finish()
    }
}

impl Wake {
    /// A wake with its acknowledgement handle.
    pub fn new(
        conversation: ConversationId,
        tenant: TenantId,
        seq: u64,
        deliveries: u64,
        acker: Box<dyn WakeAck>,
    ) -> Self {
        Self {
            conversation,
            tenant,
            seq,
            deliveries,
            published_ms: 0,
            acker: acker.into(),
        }
    }

    /// The same wake, knowing when its event was put on the lane.
    pub fn published_at(mut self, ms: u64) -> Self {
        self.published_ms = ms;
        self
    }

    /// A handle that keeps this wake in progress without holding the wake itself (so a caller
    /// need not hold a lock on its wakes across the network call).
    pub fn keeper(&self) -> WakeKeeper {
        WakeKeeper(self.acker.clone())
    }

    /// Done (the bus primitive; handlers let go of wakes through [`Wake::settle`]).
    pub async fn ack(self) -> Result<()> {
        self.acker.ack().await
    }

    /// Deliver again after `delay` (the bus primitive; see [`Wake::settle`]).
    pub async fn nak(self, delay: Duration) -> Result<()> {
        self.acker.nak(delay).await
    }

    /// Lets go of the wake as [`crate::settle::outcome`] says for `settlement`; returns the
    /// outcome (a failure to tell the bus only means the wake comes back, and is settled then).
    pub async fn settle(
        self,
        settlement: crate::settle::Settlement,
        busy: Duration,
    ) -> crate::settle::Outcome {
        use crate::settle::Outcome;
        let outcome = crate::settle::outcome(self.seq, self.deliveries, settlement, busy);
        let _ = match outcome {
            Outcome::Ack => self.acker.ack().await,
            Outcome::Nak(delay) => self.acker.nak(delay).await,
            Outcome::Term => self.acker.term().await,
        };
        outcome
    }

    pub async fn progress(&self) -> Result<()> {
        self.acker.progress().await
    }
}

/// Keeps one wake in progress; see [`Wake::keeper`].
#[derive(Clone)]
pub struct WakeKeeper(std::sync::Arc<dyn WakeAck>);

impl WakeKeeper {
    /// Extends the wake's ack wait.
    pub async fn progress(&self) -> Result<()> {
        self.0.progress().await
    }
}

/// The bus. See the module docs for the contract.
#[async_trait]
pub trait Bus: Send + Sync + 'static {
    /// Appends an event to its conversation's lane; accepted means durable.
    async fn publish(&self, event: &Event) -> Result<Published>;

    /// Up to `limit` messages of one lane with sequences above `after`, in order. With `until`
    /// (a sequence known to be on the lane, e.g. from a wake), reading may stop there instead of
    /// asking for one more message to learn that there is none. Reading stops before a message
    /// this binary cannot read; when that is the first one, the error is
    /// [`ErrorKind::Unreadable`](crate::ErrorKind::Unreadable) and carries its bytes.
    async fn read_lane(
        &self,
        conversation: ConversationId,
        after: u64,
        until: Option<u64>,
        limit: usize,
    ) -> Result<Vec<LaneMessage>>;

    /// Appends `bytes` as they are to the lane of `conversation`: an operator requeueing a dead
    /// letter. The bytes must carry a readable address of that conversation. Deduplicated by
    /// `dedupe` like a publish (within the duplicate window), so a requeue retried after a
    /// crash is one message.
    async fn republish(
        &self,
        conversation: ConversationId,
        bytes: &[u8],
        dedupe: &str,
    ) -> Result<Published>;

    /// The last sequence on a lane (0 when empty).
    async fn lane_last(&self, conversation: ConversationId) -> Result<u64>;

    /// Wakes waiting to be delivered, per shard (`(shard, pending)`): the backlog an
    /// autoscaler and an alert watch. Empty where the bus has no shards to report.
    async fn pending_per_shard(&self) -> Result<Vec<(u32, u64)>> {
        Ok(Vec::new())
    }

    /// Wakes not yet settled: waiting to be delivered, put off, or delivered and not yet acked
    /// (`None` where the bus cannot count them). Zero once every event has been taken and every
    /// wake for it acked: what a measurement waits for before it stops its clock.
    async fn unsettled(&self) -> Result<Option<u64>> {
        Ok(None)
    }

    /// Whether the bus answers now: one cheap round trip (the last sequence of a lane nobody
    /// uses), for readiness probes.
    async fn ping(&self) -> Result<()> {
        self.lane_last(ConversationId::new()).await.map(|_| ())
    }

    /// Deletes every message of a conversation's lane (a deleted conversation's remainder).
    /// Sequences are not reused: a lane's next message, if any came, would follow the last.
    async fn purge_lane(&self, conversation: ConversationId) -> Result<()>;

    /// The next wake for this process; waits until there is one.
    async fn next_wake(&self) -> Result<Wake>;

    /// Takes the lease of a conversation for `ttl` when [`may_claim`] allows it: free, released
    /// or expired. A live lease is never claimed again, not even by its own holder.
    async fn claim(
        &self,
        conversation: ConversationId,
        worker: WorkerId,
        ttl: Duration,
    ) -> Result<Option<Lease>>;

    /// Extends a held lease; fails with `LeaseLost` if someone else took it.
    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease>;

    /// Gives a lease up (a lease already lost is not an error).
    async fn release(&self, lease: &Lease) -> Result<()>;

    /// Announces that a worker is alive and how much it owns (advisory, best effort).
    async fn heartbeat(&self, beat: &Heartbeat);

    /// Every heartbeat sent from now on, as it comes (a slow reader may miss some: they are
    /// advisory). The watch is in place for every heartbeat sent after the call returns, by
    /// this process or another on the same server (a worker counting its peers sends its own
    /// first beat after it, so that every answer to that beat is heard).
    async fn watch_heartbeats(&self) -> Result<BoxStream<'static, Heartbeat>>;

    /// The heartbeats sent during the next `window` (the newest of each worker): who is alive.
    async fn heartbeats(&self, window: Duration) -> Result<Vec<Heartbeat>> {
        use futures::StreamExt as _;
        let mut watch = self.watch_heartbeats().await?;
        let mut beats = Vec::new();
        let _ = tokio::time::timeout(window, async {
            while let Some(beat) = watch.next().await {
                beats.push(beat);
            }
        })
        .await;
        Ok(crate::heartbeat::latest(beats))
    }

    /// A signal each time something is put on `conversation`'s lane from now on (advisory: a
    /// signal may be missed or spurious; the lane is the truth). A turn watching its lane reads
    /// it on a signal instead of polling. On one server, the watch is in place for every
    /// request this bus sends after the call returns, so a lane read made after it sees, or is
    /// followed by a signal for, everything put on the lane (short of a missed signal; in a
    /// cluster, interest reaches the other servers a moment later). A bus that cannot signal
    /// says so with an error (the default), and readers poll.
    async fn lane_signals(&self, conversation: ConversationId) -> Result<BoxStream<'static, ()>> {
        let _ = conversation;
        Err(crate::Error::new(
            crate::ErrorKind::Unavailable,
            "this bus does not signal lane activity",
        ))
    }

    /// Publishes an advisory message (a token delta, a "new rows" tick) on `tp.live.{conv}`.
    /// Best effort and never durable: it carries nothing the record lacks.
    async fn live(&self, conversation: ConversationId, payload: Bytes);

    /// The advisory messages of a conversation from now on. Slow subscribers may miss some.
    async fn subscribe_live(
        &self,
        conversation: ConversationId,
    ) -> Result<BoxStream<'static, Bytes>>;

    /// Adds `delta` to the usage ledger's counter of `scope` on `day`, atomically with respect
    /// to every other process adding to it (compare-and-set, retried on a conflict).
    async fn add_usage(&self, scope: &UsageScope, day: Day, delta: &UsageTotals) -> Result<()>;

    /// The usage ledger's counter of `scope` on `day` (zeros when nothing was counted).
    async fn usage(&self, scope: &UsageScope, day: Day) -> Result<UsageTotals>;
}

pub use crate::clock::now_ms;
use crate::usage::{Day, UsageScope, UsageTotals};
