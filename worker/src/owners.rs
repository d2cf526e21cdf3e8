//! The owners a worker runs now, shared by its claim loop, its owners and its sweeps: the owner
//! map (one [`OwnerSlot`] per conversation, holding the wakes handed to it), the turn slots, and
//! how far recent drains took each lane.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tracing::warn;
use turnpike_artifactory::Conversations;
use turnpike_router::bus::{Wake, WakeKeeper};
use turnpike_router::recent::Recent;
use turnpike_router::settle::{outcome, Outcome, Settlement};
use turnpike_schemas::entry::RecordState;
use turnpike_schemas::ConversationId;

use crate::turn::Shared;

/// State shared by the claim loop and the owners it spawns.
pub(crate) struct Inner {
    /// What every turn shares (the worker's id, bus, config, …; reached through `Deref`).
    pub(crate) shared: Arc<Shared>,
    pub(crate) conversations: Conversations,
    /// The owners' tasks, so a simulated crash can drop them.
    pub(crate) owner_tasks: std::sync::Mutex<Vec<tokio::task::AbortHandle>>,
    pub(crate) resolver: turnpike_resolver::Resolver,
    pub(crate) slots: Arc<Semaphore>,
    /// How many tasks hold a conversation's lease, or are claiming one: an owner from its spawn
    /// until its task ends (its lease released), a sweep from before its claim until it
    /// releases the lease or hands it to an owner. An owner can give its slot up before it
    /// releases (see [`crate::dispatch::TurnSlot`]), so a stopping worker waits for this count,
    /// not its slots.
    pub(crate) lease_holders: tokio::sync::watch::Sender<usize>,
    /// The fair intake: wakes waiting for a slot, running owners per tenant.
    pub(crate) dispatch: Arc<crate::dispatch::Dispatch>,
    /// Bounds how many wakes are being handled (claim and head reads) at once.
    pub(crate) intake: Arc<Semaphore>,
    /// A plain mutex: held only to look up or change the map, never across an await.
    pub(crate) owners: Mutex<HashMap<ConversationId, Arc<OwnerSlot>>>,
    pub(crate) owner_gone: Notify,
    /// How far this worker's latest drains took the lanes of the `RECENT` conversations it
    /// drained most recently, none idle for `RECENT_IDLE` (see [`Inner::drained`]).
    pub(crate) drained: Mutex<Recent<ConversationId, u64>>,
    /// The record heads this worker's latest drains left, of the `RECENT` conversations it
    /// drained most recently (none idle for `RECENT_IDLE`): the next claim of one checks the
    /// head is still that one (two metadata probes, see `Record::head_from_known`) instead of
    /// reading it again. Only a hint: anything appended or rewritten since is read afresh.
    pub(crate) heads: Mutex<Recent<ConversationId, turnpike_artifactory::Head>>,
    /// Leases kept after clean drains while this worker is alone on the bus (see
    /// [`crate::kept`]).
    pub(crate) kept: crate::kept::KeptLeases,
    /// Held by whoever releases kept leases now (one at a time; a stop waits for the other).
    pub(crate) releasing_kept: Arc<tokio::sync::Mutex<()>>,
    pub(crate) stopping: AtomicBool,
}

impl std::ops::Deref for Inner {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.shared
    }
}

/// One task counted in [`Inner::lease_holders`], until it is dropped.
pub(crate) struct LeaseHolder(tokio::sync::watch::Sender<usize>);

impl LeaseHolder {
    pub(crate) fn new(inner: &Inner) -> Self {
        inner.lease_holders.send_modify(|n| *n += 1);
        Self(inner.lease_holders.clone())
    }
}

impl Drop for LeaseHolder {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Inner {
    pub(crate) fn forget_owner(&self, conversation: ConversationId, slot: &Arc<OwnerSlot>) {
        let mut owners = self.owners.lock().expect("owner map lock");
        if owners
            .get(&conversation)
            .is_some_and(|s| Arc::ptr_eq(s, slot))
        {
            owners.remove(&conversation);
        }
        drop(owners);
        self.owner_gone.notify_waiters();
    }

    /// Registers an owner; false if one is registered already.
    pub(crate) fn register_owner(
        &self,
        conversation: ConversationId,
        slot: Arc<OwnerSlot>,
    ) -> bool {
        let mut owners = self.owners.lock().expect("owner map lock");
        if owners.contains_key(&conversation) {
            return false;
        }
        owners.insert(conversation, slot);
        true
    }

    /// The lease of `conversation` for a sweep, when nobody holds it (its owner is gone, or
    /// there is none), counted among the lease holders (keep the holder until the lease is
    /// released or handed to an owner); `None` when someone holds it, the claim failed
    /// (logged), or the worker is stopping.
    pub(crate) async fn claim_free(
        &self,
        conversation: ConversationId,
    ) -> Option<(turnpike_router::bus::Lease, LeaseHolder)> {
        // Counted before the stopping check: a stopping worker either waits for this claim,
        // or this claim sees it stopping (the count's lock orders the two).
        let holder = LeaseHolder::new(self);
        if self.is_stopping() {
            return None;
        }
        match self
            .bus
            .claim(conversation, self.worker, self.config.lease_ttl)
            .await
        {
            Ok(lease) => lease.map(|lease| (lease, holder)),
            Err(e) => {
                warn!(%conversation, error = %e, "sweep: cannot claim");
                None
            }
        }
    }

    /// Notes that a drain of `conversation` here left its record complete through lane
    /// sequence `lane_through`.
    pub(crate) fn drained(&self, conversation: ConversationId, lane_through: u64) {
        self.drained
            .lock()
            .expect("drained lock")
            .put(conversation, lane_through);
    }

    /// Whether a drain here went past lane sequence `seq` of `conversation` (a hint: only the
    /// record, read again, says the wake is done).
    pub(crate) fn drained_past(&self, conversation: ConversationId, seq: u64) -> bool {
        self.drained
            .lock()
            .expect("drained lock")
            .get(&conversation)
            .is_some_and(|&through| seq <= through)
    }

    /// Whether this worker owns `conversation` now.
    pub(crate) fn owns(&self, conversation: ConversationId) -> bool {
        self.owners
            .lock()
            .expect("owner map lock")
            .contains_key(&conversation)
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }
}

/// The wakes an owner holds, shared with the claim loop that hands them over.
#[derive(Default)]
pub(crate) struct OwnerSlot {
    held: tokio::sync::Mutex<Held>,
}

#[derive(Default)]
struct Held {
    wakes: Vec<Wake>,
    closed: bool,
}

impl OwnerSlot {
    /// Hands a wake to the owner; gives it back when the owner is closing.
    pub(crate) async fn offer(&self, wake: Wake) -> Option<Wake> {
        let mut held = self.held.lock().await;
        if held.closed {
            return Some(wake);
        }
        held.wakes.push(wake);
        None
    }

    /// Acks every held wake whose event the record holds in a **complete** turn: the lane is
    /// committed past it and no turn is open (DESIGN step 2). While a turn is open nothing is
    /// acked: its owner may still die before batch two, and then the wakes must come back.
    pub(crate) async fn settle(&self, state: &RecordState) {
        if state.turn_open {
            return;
        }
        self.settle_through(state.lane_through).await
    }

    /// Settles the held wakes up to lane sequence `through`, all taken by turns the record holds
    /// complete (though a later turn may be open: one opened with the last one's batch two).
    pub(crate) async fn settle_through(&self, through: u64) {
        let record = Settlement::Record {
            lane_through: through,
            turn_open: false,
        };
        let mut held = self.held.lock().await;
        let (done, waiting): (Vec<Wake>, Vec<Wake>) = std::mem::take(&mut held.wakes)
            .into_iter()
            .partition(|w| outcome(w.seq, w.deliveries, record, Duration::ZERO) == Outcome::Ack);
        held.wakes = waiting;
        drop(held);
        for wake in done {
            wake.settle(record, Duration::ZERO).await;
        }
    }

    /// The highest lane sequence among the held wakes (0: none).
    pub(crate) async fn max_seq(&self) -> u64 {
        self.held
            .lock()
            .await
            .wakes
            .iter()
            .map(|w| w.seq)
            .max()
            .unwrap_or(0)
    }

    /// Keeps every held wake from being redelivered. The lock is held only to copy the
    /// handles, never across the network calls.
    pub(crate) async fn progress(&self) {
        let keepers: Vec<WakeKeeper> = self
            .held
            .lock()
            .await
            .wakes
            .iter()
            .map(Wake::keeper)
            .collect();
        for keeper in keepers {
            let _ = keeper.progress().await;
        }
    }

    /// Stops taking wakes; acks what is done (`state`: the record's state at the end, if the
    /// owner knows it) and returns the rest.
    pub(crate) async fn close(&self, state: Option<&RecordState>) -> Vec<Wake> {
        if let Some(state) = state {
            self.settle(state).await;
        }
        let mut held = self.held.lock().await;
        held.closed = true;
        std::mem::take(&mut held.wakes)
    }
}
