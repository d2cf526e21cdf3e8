//! A bus that counts lane reads and wakes, for tests of how often a worker asks the bus. It forwards
//! everything to a real bus — but lease renewals a test asks to fail (a bus that is briefly
//! unreachable), which fail with [`ErrorKind::Unavailable`](turnpike_router::ErrorKind), and
//! claims of a conversation a test holds back until it lets them go.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use turnpike_router::bus::{Bus, LaneMessage, Lease, Published, Wake};
use turnpike_router::usage::{Day, UsageScope, UsageTotals};
use turnpike_router::{Heartbeat, Result};
use turnpike_schemas::{ConversationId, Event, WorkerId};

/// Counts lane reads ([`Bus::read_lane`]: the calls, and the messages they returned) and lane
/// head reads ([`Bus::lane_last`]).
pub struct CountingBus {
    inner: Arc<dyn Bus>,
    reads: AtomicUsize,
    messages: AtomicUsize,
    heads: AtomicUsize,
    wakes: AtomicUsize,
    failing_renewals: AtomicUsize,
    held_claims: std::sync::Mutex<Option<(ConversationId, Arc<tokio::sync::Semaphore>)>>,
    claims_held: AtomicUsize,
    held_claims_done: AtomicUsize,
    lease_calls: std::sync::Mutex<std::collections::HashMap<ConversationId, LeaseCalls>>,
}

/// The lease calls a [`CountingBus`] counted for one conversation (each call, whatever it
/// returned).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseCalls {
    pub claims: usize,
    pub renewals: usize,
    pub releases: usize,
}

/// What a [`CountingBus`] counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneReads {
    /// `read_lane` calls.
    pub reads: usize,
    /// Messages those calls returned.
    pub messages: usize,
    /// `lane_last` calls.
    pub heads: usize,
}

impl CountingBus {
    pub fn new(inner: Arc<dyn Bus>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            reads: AtomicUsize::new(0),
            messages: AtomicUsize::new(0),
            heads: AtomicUsize::new(0),
            wakes: AtomicUsize::new(0),
            failing_renewals: AtomicUsize::new(0),
            held_claims: std::sync::Mutex::new(None),
            claims_held: AtomicUsize::new(0),
            held_claims_done: AtomicUsize::new(0),
            lease_calls: Default::default(),
        })
    }

    /// The next `n` lease renewals fail as if the bus were unreachable (`usize::MAX`: all of
    /// them, until this is called again).
    pub fn fail_renewals(&self, n: usize) {
        self.failing_renewals.store(n, Ordering::SeqCst);
    }

    /// Claims of `conversation`'s lease through this bus wait until [`Self::let_claims_go`].
    pub fn hold_claims(&self, conversation: ConversationId) {
        *self.held_claims.lock().expect("held claims lock") =
            Some((conversation, Arc::new(tokio::sync::Semaphore::new(0))));
    }

    /// Lets every held claim go on (and claims from now on).
    pub fn let_claims_go(&self) {
        if let Some((_, gate)) = self.held_claims.lock().expect("held claims lock").take() {
            gate.add_permits(tokio::sync::Semaphore::MAX_PERMITS / 2);
        }
    }

    /// How many claims were held back so far.
    pub fn claims_held(&self) -> usize {
        self.claims_held.load(Ordering::SeqCst)
    }

    /// How many held-back claims went on and returned so far.
    pub fn held_claims_done(&self) -> usize {
        self.held_claims_done.load(Ordering::SeqCst)
    }

    /// Wakes delivered through this bus ([`Bus::next_wake`]) so far.
    pub fn wakes(&self) -> usize {
        self.wakes.load(Ordering::SeqCst)
    }

    /// The lease calls made through this bus for `conversation` so far.
    pub fn lease_calls(&self, conversation: ConversationId) -> LeaseCalls {
        self.lease_calls
            .lock()
            .expect("lease calls lock")
            .get(&conversation)
            .copied()
            .unwrap_or_default()
    }

    fn count_lease_call(&self, conversation: ConversationId, count: impl FnOnce(&mut LeaseCalls)) {
        count(
            self.lease_calls
                .lock()
                .expect("lease calls lock")
                .entry(conversation)
                .or_default(),
        );
    }

    /// What was counted so far.
    pub fn counted(&self) -> LaneReads {
        LaneReads {
            reads: self.reads.load(Ordering::SeqCst),
            messages: self.messages.load(Ordering::SeqCst),
            heads: self.heads.load(Ordering::SeqCst),
        }
    }
}

#[async_trait]
impl Bus for CountingBus {
    async fn publish(&self, event: &Event) -> Result<Published> {
        self.inner.publish(event).await
    }

    async fn read_lane(
        &self,
        conversation: ConversationId,
        after: u64,
        until: Option<u64>,
        limit: usize,
    ) -> Result<Vec<LaneMessage>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let read = self
            .inner
            .read_lane(conversation, after, until, limit)
            .await?;
        self.messages.fetch_add(read.len(), Ordering::SeqCst);
        Ok(read)
    }

    async fn republish(
        &self,
        conversation: ConversationId,
        bytes: &[u8],
        dedupe: &str,
    ) -> Result<Published> {
        self.inner.republish(conversation, bytes, dedupe).await
    }

    async fn lane_last(&self, conversation: ConversationId) -> Result<u64> {
        self.heads.fetch_add(1, Ordering::SeqCst);
        self.inner.lane_last(conversation).await
    }

    async fn pending_per_shard(&self) -> Result<Vec<(u32, u64)>> {
        self.inner.pending_per_shard().await
    }

    async fn ping(&self) -> Result<()> {
        self.inner.ping().await
    }

    async fn purge_lane(&self, conversation: ConversationId) -> Result<()> {
        self.inner.purge_lane(conversation).await
    }

    async fn next_wake(&self) -> Result<Wake> {
        let wake = self.inner.next_wake().await?;
        self.wakes.fetch_add(1, Ordering::SeqCst);
        Ok(wake)
    }

    async fn unsettled(&self) -> Result<Option<u64>> {
        self.inner.unsettled().await
    }

    async fn claim(
        &self,
        conversation: ConversationId,
        worker: WorkerId,
        ttl: Duration,
    ) -> Result<Option<Lease>> {
        self.count_lease_call(conversation, |c| c.claims += 1);
        let gate = match &*self.held_claims.lock().expect("held claims lock") {
            Some((held, gate)) if *held == conversation => Some(gate.clone()),
            _ => None,
        };
        let Some(gate) = gate else {
            return self.inner.claim(conversation, worker, ttl).await;
        };
        self.claims_held.fetch_add(1, Ordering::SeqCst);
        let _ = gate.acquire().await;
        let claimed = self.inner.claim(conversation, worker, ttl).await;
        self.held_claims_done.fetch_add(1, Ordering::SeqCst);
        claimed
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.count_lease_call(lease.conversation, |c| c.renewals += 1);
        let failing = self
            .failing_renewals
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| match n {
                0 => None,
                usize::MAX => Some(usize::MAX),
                n => Some(n - 1),
            })
            .is_ok();
        if failing {
            return Err(turnpike_router::Error::new(
                turnpike_router::ErrorKind::Unavailable,
                "the bus cannot be reached (a test's injected failure)",
            ));
        }
        self.inner.renew(lease, ttl).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.count_lease_call(lease.conversation, |c| c.releases += 1);
        self.inner.release(lease).await
    }

    async fn heartbeat(&self, beat: &Heartbeat) {
        self.inner.heartbeat(beat).await
    }

    async fn watch_heartbeats(&self) -> Result<BoxStream<'static, Heartbeat>> {
        self.inner.watch_heartbeats().await
    }

    async fn lane_signals(&self, conversation: ConversationId) -> Result<BoxStream<'static, ()>> {
        self.inner.lane_signals(conversation).await
    }

    async fn live(&self, conversation: ConversationId, payload: Bytes) {
        self.inner.live(conversation, payload).await
    }

    async fn subscribe_live(
        &self,
        conversation: ConversationId,
    ) -> Result<BoxStream<'static, Bytes>> {
        self.inner.subscribe_live(conversation).await
    }

    async fn add_usage(&self, scope: &UsageScope, day: Day, delta: &UsageTotals) -> Result<()> {
        self.inner.add_usage(scope, day, delta).await
    }

    async fn usage(&self, scope: &UsageScope, day: Day) -> Result<UsageTotals> {
        self.inner.usage(scope, day).await
    }
}
