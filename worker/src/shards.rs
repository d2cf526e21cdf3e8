//! Shards of background work held under the bus's leases: the scheduler's schedules and the
//! webhook dispatcher's deliveries are each spread over a fixed number of shards, and every
//! worker holds its part of them (about `shards / peers`, rounded up), so no single process
//! does all of it and a dead holder's shards pass on when their leases run out.
//!
//! # Contract
//! - A shard has one holder at a time (the bus's lease on a key no conversation has).
//! - [`ShardLeases::maintain`] claims free shards up to the part, lets extras go (for workers
//!   that started later) and renews what it holds; a lease it cannot renew is dropped at once.
//! - [`ShardLeases::fresh`] yields only shards whose lease cannot have run out before the
//!   instant it gives with each: work done by then cannot overlap another holder's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};
use turnpike_router::bus::{Bus, Lease};
use turnpike_schemas::{ConversationId, WorkerId};

/// The lease key of shard `shard` of the work tagged `tag`: a conversation id no conversation
/// has (timestamp 0, the tag above the shard number).
pub fn shard_key(tag: u64, shard: u32) -> ConversationId {
    ConversationId::from_ulid(ulid::Ulid::from_parts(
        0,
        (u128::from(tag) << 16) | u128::from(shard),
    ))
}

/// A held shard and what its holder keeps of it.
pub struct Held<T> {
    lease: Lease,
    renewed: Instant,
    pub state: T,
}

/// The shards of one kind of work a worker holds.
pub struct ShardLeases<T> {
    bus: Arc<dyn Bus>,
    worker: WorkerId,
    /// What the work is, for logs.
    what: &'static str,
    tag: u64,
    count: u32,
    ttl: Duration,
    peers: Arc<AtomicUsize>,
    held: HashMap<u32, Held<T>>,
    claimed_at: Option<Instant>,
}

impl<T: Default> ShardLeases<T> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        bus: Arc<dyn Bus>,
        worker: WorkerId,
        what: &'static str,
        tag: u64,
        count: u32,
        ttl: Duration,
        peers: Arc<AtomicUsize>,
    ) -> Self {
        Self {
            bus,
            worker,
            what,
            tag,
            count,
            ttl,
            peers,
            held: HashMap::new(),
            claimed_at: None,
        }
    }

    /// The most shards this worker holds.
    fn part(&self) -> usize {
        let peers = self.peers.load(Ordering::Relaxed).max(1) as u32;
        self.count.div_ceil(peers) as usize
    }

    /// Claims free shards (every third of a lease), lets extras go, renews what it holds.
    pub async fn maintain(&mut self) {
        if self.claimed_at.is_none_or(|t| t.elapsed() >= self.ttl / 3) {
            self.claimed_at = Some(Instant::now());
            self.claim_free().await;
        }
        let shards: Vec<u32> = self.held.keys().copied().collect();
        for shard in shards {
            let Some(h) = self.held.get_mut(&shard) else {
                continue;
            };
            if h.renewed.elapsed() < self.ttl / 3 {
                continue;
            }
            match self.bus.renew(&h.lease, self.ttl).await {
                Ok(lease) => {
                    h.lease = lease;
                    h.renewed = Instant::now();
                }
                Err(e) => {
                    warn!(worker = %self.worker, shard, what = self.what, error = %e, "lost a shard's lease");
                    self.held.remove(&shard);
                }
            }
        }
    }

    /// The held shards whose lease is fresh, each with the instant its work must stop by.
    pub fn fresh(&mut self) -> impl Iterator<Item = (u32, Instant, &mut T)> {
        let ttl = self.ttl;
        self.held.iter_mut().filter_map(move |(shard, h)| {
            // Never work on a lease that may have run out (another holder may work).
            (h.renewed.elapsed() < ttl * 2 / 3)
                .then(|| (*shard, h.renewed + ttl * 2 / 3, &mut h.state))
        })
    }

    /// Lets every held shard go (another worker takes them at once).
    pub async fn release_all(&mut self) {
        for (_, h) in self.held.drain() {
            let _ = self.bus.release(&h.lease).await;
        }
    }

    async fn claim_free(&mut self) {
        let part = self.part();
        if self.held.len() > part {
            let mut shards: Vec<u32> = self.held.keys().copied().collect();
            shards.sort_unstable();
            for shard in shards.split_off(part) {
                if let Some(h) = self.held.remove(&shard) {
                    debug!(worker = %self.worker, shard, part, what = self.what, "letting a shard go");
                    let _ = self.bus.release(&h.lease).await;
                }
            }
            return;
        }
        // Not always from shard 0: workers starting together spread over the shards.
        let start = (self.worker.ulid().random() % u128::from(self.count)) as u32;
        for shard in (0..self.count).map(|i| (start + i) % self.count) {
            if self.held.len() >= part {
                break;
            }
            if self.held.contains_key(&shard) {
                continue;
            }
            match self
                .bus
                .claim(shard_key(self.tag, shard), self.worker, self.ttl)
                .await
            {
                Ok(Some(lease)) => {
                    info!(worker = %self.worker, shard, what = self.what, "holding a shard");
                    self.held.insert(
                        shard,
                        Held {
                            lease,
                            renewed: Instant::now(),
                            state: T::default(),
                        },
                    );
                }
                Ok(None) => {}
                Err(e) => debug!(shard, what = self.what, error = %e, "cannot claim a shard"),
            }
        }
    }
}
