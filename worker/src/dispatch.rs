//! The worker's fair intake: the wakes it took off the bus and waits to start, per tenant
//! ([`FairQueue`]), and the turns it runs per tenant, so that a free slot goes to the tenant
//! the deployment's [`FairShare`] says is owed it (DESIGN step 2, invariant 13).
//!
//! # Contract
//! - Every wake offered is either queued here, rides with a queued wake of its lane (and
//!   leaves with it: [`Dispatch::next`] returns both), or is handed back with the delay after
//!   which the bus should deliver it again; a stopping worker hands every queued wake back at
//!   once, riders included.
//! - A worker in a fleet keeps up to its slot count of a tenant's wakes waiting here, and
//!   gives back those that waited long ([`Dispatch::waited`]): another worker may have a slot
//!   for them. A lone worker (its heartbeats hear no other) keeps [`LONE_PER_TENANT`] times as
//!   many, and keeps those that wait long in progress instead: a wake it put off or gave back
//!   could only come back to it, at the cost of a nak, its advisory, a redelivery and a read
//!   of the record — for every wake of a burst wider than its slots. It still puts off what is
//!   past that bound, so it keeps taking wakes and sees past any burst to other tenants'.
//! - A [`Running`] counts one of its tenant's owners from the moment its wake is taken for a
//!   slot until it is dropped (the owner ended, or the wake needed no owner): a tenant's cap is
//!   checked against that count, so two wakes taken at once cannot both pass a cap of one.
//! - `ready` is notified whenever something may have become startable (a wake queued, an
//!   owner ended); `room` whenever a queued wake left.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use turnpike_router::bus::{Wake, WakeKeeper};
use turnpike_schemas::TenantId;

use crate::fair::{Admit, FairQueue, FairShare};

/// The tracing target of a wake's main steps through a worker (`RUST_LOG=turnpike_wakes=debug`):
/// taken off the bus, queued (or riding with its lane's queued wake) or put off (and which wake
/// was), started in a slot, its claim won or found held, handed back; an owner's slot given up
/// after a turn, its lease released, claimed again for what came meanwhile.
/// `scripts/fleet-waits` reads it to say where a `bench fleet` turn's wait went.
pub const WAKES: &str = "turnpike_wakes";

/// How long an owner keeps its slot, at least, while another tenant's wakes wait for one:
/// what a tenant's waiting wake may wait beyond a turn for a busy pool (a few model tokens),
/// and long enough for cheap turns to run back to back.
pub(crate) const YIELD_AFTER: Duration = Duration::from_millis(50);

/// How long an owner keeps its slot, at least, while only wakes of its own tenant wait: about
/// what a wake refused for a busy owner waits before it is offered again (`busy_delay`), so a
/// conversation whose sender keeps writing cannot hold a slot from its tenant's others for
/// long, while cheap turns still run many to a claim (each claim re-reads the record).
pub(crate) const YIELD_WITHIN_TENANT: Duration = Duration::from_millis(250);

/// How many times its slot count of a tenant's wakes a lone worker keeps waiting.
pub(crate) const LONE_PER_TENANT: usize = 16;

/// See the module docs.
pub(crate) struct Dispatch {
    queue: Mutex<FairQueue<Wake>>,
    slots: usize,
    running: Mutex<HashMap<TenantId, usize>>,
    share: FairShare,
    /// Something may have become startable.
    pub(crate) ready: Notify,
    /// A queued wake left.
    pub(crate) room: Notify,
    /// How many workers share the bus's wakes (from their heartbeats; 1 until known), shared
    /// with the scheduler and the webhook dispatcher, which split their shards by it.
    workers: Arc<AtomicUsize>,
    /// It counted itself alone (not before the first count).
    lone: AtomicBool,
}

impl Dispatch {
    /// For a worker with `slots` slots; `hold` is the first guess of how long an owner holds
    /// its slot.
    pub(crate) fn new(slots: usize, share: FairShare, hold: Duration) -> Self {
        Self {
            queue: Mutex::new(FairQueue::new(slots, slots, hold)),
            slots,
            running: Mutex::new(HashMap::new()),
            share,
            ready: Notify::new(),
            room: Notify::new(),
            workers: Arc::new(AtomicUsize::new(1)),
            lone: AtomicBool::new(false),
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, FairQueue<Wake>> {
        self.queue.lock().expect("fair queue lock")
    }

    /// Queues `wake` in its place among its tenant's, or hands back it (or a later one of its
    /// tenant's it displaced) with how long the bus should keep it.
    pub(crate) fn admit(&self, wake: Wake) -> Option<(Wake, Duration)> {
        let tenant = wake.tenant.clone();
        let workers = self.workers.load(Ordering::Relaxed);
        let now = Instant::now();
        // A wake of unknown arrival counts as arriving now.
        let arrived = match wake.published_ms {
            0 => turnpike_router::bus::now_ms(),
            ms => ms,
        };
        let lane = {
            use std::hash::{Hash as _, Hasher as _};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            wake.conversation.hash(&mut h);
            h.finish()
        };
        let admitted = self.queue().admit_in(
            &tenant,
            Some(lane),
            wake,
            arrived,
            now,
            workers,
            self.share.cap(&tenant),
        );
        match admitted {
            Admit::Queued => {
                self.ready.notify_one();
                None
            }
            Admit::Follows => None,
            Admit::Defer(wake, delay) => {
                // The one handed back may be another: the offered one took its place.
                self.ready.notify_one();
                Some((wake, delay))
            }
        }
    }

    /// Whether another wake could be queued.
    pub(crate) fn has_room(&self) -> bool {
        self.queue().has_room()
    }

    /// Whether a queued wake may start now.
    pub(crate) fn has_startable(&self) -> bool {
        self.startable_besides(None)
    }

    /// Whether a queued wake of a tenant other than `besides` (any: `None`) may start now.
    fn startable_besides(&self, besides: Option<&TenantId>) -> bool {
        // The locks in the order `next` takes them: the running counts, then the queue.
        let running = self.running.lock().expect("running lock");
        self.queue().has_eligible_besides(
            besides,
            |t| running.get(t).copied().unwrap_or(0),
            &self.share,
        )
    }

    /// Whether an owner of a conversation of `tenant` that has held its slot for `held` should
    /// give it up after its turn: a queued wake of another tenant may start and the owner had
    /// its quantum ([`YIELD_AFTER`]), or one of its own tenant may and it had the longer one
    /// ([`YIELD_WITHIN_TENANT`]). Turns cheaper than the quantum run back to back in one
    /// ownership (a claim and a re-read of the record saved per turn); a long one yields after
    /// each turn.
    pub(crate) fn owes_slot(&self, tenant: &TenantId, held: Duration) -> bool {
        held >= YIELD_AFTER
            && self.startable_besides((held < YIELD_WITHIN_TENANT).then_some(tenant))
    }

    /// The wake to start in a free slot, counted as running for its tenant, and the later
    /// wakes of its lane that rode with it (for its owner, once it has one).
    pub(crate) fn next(self: &Arc<Self>) -> Option<(Wake, Vec<Wake>, Running)> {
        let mut running = self.running.lock().expect("running lock");
        let next = {
            let counts = &*running;
            let mut queue = self.queue();
            let next = queue.next(|t| counts.get(t).copied().unwrap_or(0), &self.share);
            if next.is_some() {
                queue.started(Instant::now());
            }
            next
        };
        let (tenant, wake, followers) = next?;
        *running.entry(tenant.clone()).or_default() += 1;
        drop(running);
        self.room.notify_one();
        Some((
            wake,
            followers,
            Running {
                dispatch: self.clone(),
                tenant,
                since: Instant::now(),
                owning: false,
            },
        ))
    }

    /// Counts an owner started without the queue (a sweep's takeover, a recovery): it is
    /// counted, never refused (a turn left open must be finished).
    pub(crate) fn running(self: &Arc<Self>, tenant: TenantId) -> Running {
        *self
            .running
            .lock()
            .expect("running lock")
            .entry(tenant.clone())
            .or_default() += 1;
        Running {
            dispatch: self.clone(),
            tenant,
            since: Instant::now(),
            owning: false,
        }
    }

    /// The wakes that waited here long, at `now`. In a fleet: those that waited longer than
    /// twice the time a start holds a slot, but at least `least` and at most `most`, taken out
    /// (the worker gives them back to the bus, for a worker with room); a wake that waits about
    /// a turn for a slot here stays. A lone worker keeps every wake: those that waited longer
    /// than `most` since they came or were last kept are to be kept in progress (see the
    /// module docs).
    pub(crate) fn waited(&self, now: Instant, least: Duration, most: Duration) -> Waited {
        let lone = self.is_lone();
        let mut queue = self.queue();
        let mut waited = Waited::default();
        if lone {
            queue.keep_older(now, most.max(least), |w| waited.keep.push(w.keeper()));
        } else {
            let older = (queue.hold() * 2).clamp(least, most.max(least));
            waited.back = queue.take_older(now, older);
        }
        queue.forget_idle(now);
        drop(queue);
        if !waited.back.is_empty() {
            self.room.notify_one();
        }
        waited
    }

    /// Every queued wake (a stopping worker gives them back).
    pub(crate) fn drain(&self) -> Vec<Wake> {
        let wakes = self.queue().drain();
        self.room.notify_one();
        wakes
    }

    /// Wakes waiting here (those riding with another included).
    pub(crate) fn len(&self) -> usize {
        let queue = self.queue();
        queue.len() + queue.followers()
    }

    /// How many workers share the wakes; one alone keeps more of a tenant's (see the module
    /// docs).
    pub(crate) fn set_workers(&self, n: usize) {
        let n = n.max(1);
        self.workers.store(n, Ordering::Relaxed);
        self.lone.store(n == 1, Ordering::Relaxed);
        let per_tenant = if n == 1 {
            self.slots.saturating_mul(LONE_PER_TENANT)
        } else {
            self.slots
        };
        self.queue().set_per_tenant(per_tenant);
    }

    /// Whether the worker counted itself alone (false until it first counted).
    pub(crate) fn is_lone(&self) -> bool {
        self.lone.load(Ordering::Relaxed)
    }

    /// The count [`Dispatch::set_workers`] keeps, for the parts that share it.
    pub(crate) fn workers(&self) -> Arc<AtomicUsize> {
        self.workers.clone()
    }
}

/// What [`Dispatch::waited`] found.
#[derive(Default)]
pub(crate) struct Waited {
    /// To give back to the bus.
    pub(crate) back: Vec<Wake>,
    /// To keep in progress: they stay here.
    pub(crate) keep: Vec<WakeKeeper>,
}

/// A turn slot taken for a wake, counted as one of its tenant's running owners.
pub(crate) type Slot = (tokio::sync::OwnedSemaphorePermit, Running);

/// An owner's turn slot, from its claim until the owner ends or gives it up: after a turn's
/// batch two commits, an owner that owes its slot ([`Dispatch::owes_slot`]) gives it up at
/// once, so the next wake starts while this owner counts usage, promotes the turn and releases
/// its lease. An owner that gave its slot up starts no more turns (the turn it ran is over:
/// its tenant's running turns, counted from the record, never exceed the slot count).
pub(crate) struct TurnSlot(Mutex<Held>);

/// What a [`TurnSlot`] holds.
enum Held {
    /// A turn slot and its tenant's running count.
    Slot(Slot),
    /// Nothing: work that runs no turn.
    Nothing,
    /// Nothing any more: the owner gave its slot up and starts no more turns.
    GivenUp,
}

impl TurnSlot {
    /// Holds `slot` (counted in the worker's slots-used gauge while held).
    pub(crate) fn new(slot: Slot) -> Self {
        metrics::gauge!("turnpike_worker_slots_used").increment(1.0);
        Self(Mutex::new(Held::Slot(slot)))
    }

    /// No slot (work that runs no turn, such as an idle close).
    pub(crate) fn none() -> Self {
        Self(Mutex::new(Held::Nothing))
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.0.lock().expect("turn slot lock")
    }

    /// Whether its owner owes the slot (other wakes may start and it had its share), or gave
    /// it up already: by the rule [`TurnSlot::give_up_if_owed`] applies.
    pub(crate) fn owes(&self) -> bool {
        Self::owed(&self.held())
    }

    fn owed(held: &Held) -> bool {
        match held {
            Held::Slot((_, running)) => running
                .dispatch
                .owes_slot(&running.tenant, running.since.elapsed()),
            Held::Nothing => false,
            Held::GivenUp => true,
        }
    }

    /// Gives the slot up when its owner owes it (other wakes may start and it had its
    /// share); whether the slot is given up, now or before.
    pub(crate) fn give_up_if_owed(&self) -> bool {
        let mut held = self.held();
        if matches!(*held, Held::GivenUp) {
            return true;
        }
        let owed = Self::owed(&held);
        if owed {
            let slot = std::mem::replace(&mut *held, Held::GivenUp);
            // Outside the lock: dropping the count takes the dispatch's locks.
            drop(held);
            Self::release(slot);
        }
        owed
    }

    /// Whether the owner gave its slot up (it starts no more turns).
    pub(crate) fn given_up(&self) -> bool {
        matches!(*self.held(), Held::GivenUp)
    }

    fn release(held: Held) {
        if let Held::Slot(slot) = held {
            metrics::gauge!("turnpike_worker_slots_used").decrement(1.0);
            drop(slot);
        }
    }
}

impl Drop for TurnSlot {
    fn drop(&mut self) {
        let held = self
            .0
            .get_mut()
            .map(|h| std::mem::replace(h, Held::Nothing))
            .unwrap_or(Held::Nothing);
        Self::release(held);
    }
}

/// One of a tenant's running owners; see the module docs.
pub(crate) struct Running {
    dispatch: Arc<Dispatch>,
    tenant: TenantId,
    since: Instant,
    /// It became an owner (its hold time says how long slots are held).
    owning: bool,
}

impl Running {
    /// Marks it as an owner's.
    pub(crate) fn owning(mut self) -> Self {
        self.owning = true;
        self.since = Instant::now();
        self
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = self.dispatch.running.lock().expect("running lock");
        if let Some(n) = running.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                running.remove(&self.tenant);
            }
        }
        drop(running);
        if self.owning {
            self.dispatch.queue().finished(self.since.elapsed());
        }
        self.dispatch.ready.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnpike_schemas::ConversationId;

    /// Says what became of a wake.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<&'static str>>>);

    #[async_trait::async_trait]
    impl turnpike_router::bus::WakeAck for Seen {
        async fn ack(&self) -> turnpike_router::Result<()> {
            self.0.lock().unwrap().push("ack");
            Ok(())
        }
        async fn nak(&self, _delay: Duration) -> turnpike_router::Result<()> {
            self.0.lock().unwrap().push("nak");
            Ok(())
        }
        async fn progress(&self) -> turnpike_router::Result<()> {
            self.0.lock().unwrap().push("progress");
            Ok(())
        }
    }

    fn wake(seen: &Seen) -> Wake {
        Wake::new(
            ConversationId::new(),
            "acme".parse().unwrap(),
            1,
            1,
            Box::new(seen.clone()),
        )
    }

    #[tokio::test]
    async fn a_lone_worker_keeps_a_wide_burst_and_keeps_it_in_progress_a_fleet_gives_back() {
        let slots = 2;
        let dispatch = Dispatch::new(slots, FairShare::default(), Duration::from_millis(10));
        let (least, most) = (Duration::from_millis(250), Duration::from_secs(1));
        let seen = Seen::default();
        // Until it knows, a worker keeps what one in a fleet keeps: its slot count.
        assert!(!dispatch.is_lone());
        for _ in 0..slots {
            assert!(dispatch.admit(wake(&seen)).is_none());
        }
        assert!(
            dispatch.admit(wake(&seen)).is_some(),
            "put off past its slots"
        );
        // Alone: sixteen times as many wait, and the one after is put off.
        dispatch.set_workers(1);
        for _ in slots..slots * LONE_PER_TENANT {
            assert!(dispatch.admit(wake(&seen)).is_none());
        }
        assert_eq!(dispatch.len(), slots * LONE_PER_TENANT);
        assert!(
            dispatch.admit(wake(&seen)).is_some(),
            "put off past its bound"
        );
        // Long waits: kept in progress, every one, and still here.
        let later = Instant::now() + 2 * most;
        let waited = dispatch.waited(later, least, most);
        assert!(waited.back.is_empty());
        assert_eq!(waited.keep.len(), slots * LONE_PER_TENANT);
        for keeper in waited.keep {
            keeper.progress().await.unwrap();
        }
        assert_eq!(seen.0.lock().unwrap().len(), slots * LONE_PER_TENANT);
        assert_eq!(dispatch.len(), slots * LONE_PER_TENANT);
        // Kept just now: nothing waited long since.
        assert_eq!(dispatch.waited(later, least, most).keep.len(), 0);
        // In a fleet: no more are taken past its slots, and the long waits go back.
        dispatch.set_workers(2);
        assert!(dispatch.admit(wake(&seen)).is_some());
        let waited = dispatch.waited(later + 2 * most, least, most);
        assert!(waited.keep.is_empty());
        assert_eq!(waited.back.len(), slots * LONE_PER_TENANT);
        assert_eq!(dispatch.len(), 0);
    }
}
