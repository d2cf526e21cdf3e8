//! The claim loop: wakes in, conversation owners out, bounded by turn slots.
//!
//! A wake for a conversation this worker owns goes to its owner, which keeps it in progress
//! until the record holds it in a complete turn. Otherwise the wake waits in the worker's fair
//! intake (see [`crate::fair`]) for a free slot: wakes are taken off the bus as they come, one
//! short queue per tenant, and a slot that frees goes to the tenant with the fewest running
//! turns for its weight (never past its cap); a tenant's wakes beyond its queue are put off at
//! once, each for about the time until its turn would come, so a burst of one tenant is not
//! queued in front of another tenant's next message (DESIGN step 2, invariant 13). A wake
//! taken for a slot tries the lease: if it gets it, the worker becomes the owner; if another
//! worker holds it, the wake is acked only when the record is already past it **and no turn
//! is open** (the owner may still die before batch two), and nak'd otherwise: after one
//! `busy_delay` while the owner is between turns, after a delay that grows with its deliveries
//! while a turn runs ([`turnpike_router::settle`]).
//!
//! A wake for an event this worker's last drain of the conversation already took is acked
//! once the record, read again, holds it in a complete turn — without a claim.
//!
//! Wakes are handled on their own tasks, so one slow store or lease read does not stall the
//! intake of every other conversation's wakes.
//!
//! A sweep — at start and every `sweep_every` — lists the open-turn marks and takes over each
//! marked conversation whose lease has lapsed: a turn left open by a dead owner is recovered
//! even when no wake for it will ever come again.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tracing::{debug, info, warn};
use turnpike_artifactory::{ConversationPrefix, Conversations, RecordSigner};
use turnpike_router::bus::{now_ms, Bus, Lease, Wake};
use turnpike_router::recent::Recent;
use turnpike_router::settle::Settlement;
use turnpike_router::Heartbeat;
use turnpike_schemas::WorkerId;

use crate::config::WorkerConfig;
use crate::dispatch::{Slot, WAKES};
use crate::owner::own;
use crate::owners::{Inner, LeaseHolder, OwnerSlot};
use crate::turn::Shared;
use turnpike_agent::apps::Apps;

/// A worker: claims lanes and runs their turns.
#[derive(Clone)]
pub struct Worker {
    inner: Arc<Inner>,
}

impl Worker {
    pub fn new(
        bus: Arc<dyn Bus>,
        conversations: Conversations,
        signer: RecordSigner,
        apps: Arc<Apps>,
        config: WorkerConfig,
    ) -> Self {
        let resolver = turnpike_resolver::Resolver::standard(
            conversations.directory().clone(),
            conversations.store().clone(),
        );
        let files = turnpike_artifactory::Files::new(conversations.store().clone());
        // A worker acts on the state of the heads it reads (what the lane is committed
        // through): it trusts only heads signed by a key it trusts, its own at least.
        let conversations = if conversations.is_trusting() {
            conversations
        } else {
            conversations.trusting(turnpike_artifactory::TrustedKeys::new([
                signer.verifying_key()
            ]))
        };
        let apps_for_webhooks = apps.clone();
        let shared = Shared {
            worker: WorkerId::new(),
            bus,
            turn_logs: conversations.turn_logs(),
            files,
            search: None,
            indexing: None,
            cell: Err("no sandbox (cell) is set up on this worker".into()),
            signer,
            apps,
            tools: crate::tools::Registry::builtin(),
            directory: conversations.directory().clone(),
            open_turns: conversations.open_turns(),
            dead_letters: conversations.dead_letters(),
            connections: conversations.connections().cloned(),
            notifier: Arc::new(crate::webhooks::Notifier::new(
                conversations.webhooks(),
                conversations.directory().clone(),
                apps_for_webhooks,
            )),
            config,
        };
        Worker {
            inner: Arc::new(Inner {
                slots: Arc::new(Semaphore::new(slot_permits(&shared.config) as usize)),
                lease_holders: tokio::sync::watch::Sender::new(0),
                intake: Arc::new(Semaphore::new(intake_permits(&shared.config) as usize)),
                dispatch: Arc::new(crate::dispatch::Dispatch::new(
                    shared.config.slots.max(1),
                    shared.config.fair.clone(),
                    shared.config.busy_delay,
                )),
                shared: Arc::new(shared),
                conversations,
                owner_tasks: std::sync::Mutex::new(Vec::new()),
                resolver,
                owners: Mutex::new(HashMap::new()),
                owner_gone: Notify::new(),
                drained: Mutex::new(Recent::new(RECENT, RECENT_IDLE)),
                heads: Mutex::new(Recent::new(RECENT, RECENT_IDLE)),
                kept: Default::default(),
                releasing_kept: Default::default(),
                stopping: AtomicBool::new(false),
            }),
        }
    }

    pub fn id(&self) -> WorkerId {
        self.inner.worker
    }

    /// The parts every turn shares, to change before the worker starts.
    fn shared_mut(&mut self, what: &str) -> &mut Shared {
        Arc::get_mut(
            &mut Arc::get_mut(&mut self.inner)
                .unwrap_or_else(|| panic!("{what} is called before the worker is shared"))
                .shared,
        )
        .unwrap_or_else(|| panic!("{what} is called before the worker is shared"))
    }

    /// Gives the worker a sandbox for `exec` (or the reason it has none). Call before the
    /// worker starts.
    pub fn with_cell(mut self, cell: Result<Arc<crate::cell::Cell>, String>) -> Self {
        self.shared_mut("with_cell").cell = cell;
        self
    }

    /// Runs tools from `tools` (default: [`crate::tools::Registry::builtin`]): the registry the
    /// apps' manifests were checked against, with any native tools. Call before the worker
    /// starts.
    pub fn with_tools(mut self, tools: crate::tools::Registry) -> Self {
        self.shared_mut("with_tools").tools = tools;
        self
    }

    /// Indexes finished turns through `queue` and answers the `search` tool from its index.
    pub fn with_index(mut self, queue: turnpike_index::indexer::IndexQueue) -> Self {
        let search =
            crate::search::IndexSearch::new(queue.index().clone(), self.inner.resolver.clone());
        let shared = self.shared_mut("with_index");
        shared.search = Some(Arc::new(search));
        shared.indexing = Some(queue);
        self
    }

    /// Drops every running owner at once, as a crash would (for tests): turns stop wherever
    /// they are, leases are not released, nothing is cleaned up but memory.
    pub fn crash(&self) {
        for task in self
            .inner
            .owner_tasks
            .lock()
            .expect("owner tasks lock")
            .drain(..)
        {
            task.abort();
        }
        self.inner.kept.forget();
    }

    /// Claims and runs until `shutdown` resolves; then stops claiming, lets running turns
    /// finish within the grace period, and leaves the rest to recovery.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        info!(worker = %self.inner.worker, "worker started");
        tokio::pin!(shutdown);
        let mut backoff = Duration::from_millis(50);
        let every = self.inner.config.heartbeat_every;
        // The first heartbeat is sent by `count_workers` as soon as its watch is in place (so
        // that it hears every answer to it); then one every `every`, and one more at once for
        // each worker first heard (`beat_now`).
        let mut heartbeat = tokio::time::interval(every);
        heartbeat.reset();
        let beat_now = Arc::new(Notify::new());
        // The first tick is at once: a worker starting up recovers what was left open.
        let mut sweep = tokio::time::interval(self.inner.config.sweep_every);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A wake waits here for a slot at least this long (and at most MAX_WAITING: never near
        // its ack wait) before it goes back to the bus, for a worker with room.
        let hand_back = self.inner.config.busy_delay.min(MAX_WAITING);
        let mut keep = tokio::time::interval(hand_back / 2);
        keep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let sweeping = Arc::new(AtomicBool::new(false));
        // How many workers share the bus (their heartbeats): the scheduler's fair part.
        let peers = self.inner.dispatch.workers();
        // Aborted when this function returns or is dropped (a crash aborts the worker's task:
        // nothing it started may go on).
        let companions = AbortOnDrop(vec![
            tokio::spawn(self.clone().dispatch_loop()),
            tokio::spawn(self.clone().count_workers(beat_now.clone())),
        ]);
        let (stop_scheduler, scheduler_stop) = tokio::sync::watch::channel(false);
        let mut scheduler_task = AbortOnDrop(Vec::new());
        if let Some(config) = self.inner.config.schedules.clone() {
            let ingress = turnpike_router::Ingress::new(
                self.inner.bus.clone(),
                self.inner.conversations.clone(),
            )
            .with_budgets(self.inner.config.budgets.clone());
            let scheduler = crate::schedules::Scheduler::new(
                self.inner.bus.clone(),
                self.inner.conversations.clone(),
                self.inner.signer.clone(),
                self.inner.worker,
                config,
            )
            .with_ingress(ingress)
            .with_peers(peers.clone())
            .with_apps(self.inner.shared.apps.clone())
            .with_notifier(self.inner.shared.notifier.clone())
            .with_failpoints(self.inner.config.failpoints.clone());
            scheduler_task
                .0
                .push(tokio::spawn(scheduler.run(scheduler_stop.clone())));
        }
        if let Some(config) = self.inner.config.webhooks.clone() {
            let dispatcher = crate::webhooks::Dispatcher::new(
                self.inner.bus.clone(),
                self.inner.conversations.webhooks(),
                self.inner.config.outbound.clone(),
                self.inner.worker,
                config,
                peers,
                self.inner.shared.notifier.kick.clone(),
            );
            scheduler_task
                .0
                .push(tokio::spawn(dispatcher.run(scheduler_stop)));
        }
        let dispatch = &self.inner.dispatch;
        loop {
            let room = dispatch.has_room();
            tokio::select! {
                _ = &mut shutdown => break,
                _ = heartbeat.tick() => self.beat().await,
                _ = beat_now.notified() => self.beat().await,
                _ = sweep.tick() => {
                    // One sweep at a time; a slow one is not stacked upon.
                    if !sweeping.swap(true, Ordering::AcqRel) {
                        let worker = self.clone();
                        let sweeping = sweeping.clone();
                        tokio::spawn(async move {
                            worker.sweep().await;
                            sweeping.store(false, Ordering::Release);
                        });
                    }
                }
                _ = keep.tick() => {
                    self.release_kept_in_background();
                    let waited = dispatch.waited(std::time::Instant::now(), hand_back, MAX_WAITING);
                    for w in &waited.back {
                        debug!(target: WAKES, conversation = %w.conversation, seq = w.seq, "handed back");
                    }
                    if !waited.back.is_empty() || !waited.keep.is_empty() {
                        metrics::counter!("turnpike_wakes_handed_back_total").increment(waited.back.len() as u64);
                        tokio::spawn(async move {
                            for wake in waited.back {
                                wake.settle(Settlement::Handover, Duration::ZERO).await;
                            }
                            for keeper in waited.keep {
                                let _ = keeper.progress().await;
                            }
                        });
                    }
                }
                _ = dispatch.room.notified(), if !room => {}
                wake = self.inner.bus.next_wake(), if room => match wake {
                    Ok(wake) => {
                        backoff = Duration::from_millis(50);
                        self.take(wake);
                    }
                    Err(e) => {
                        warn!(worker = %self.inner.worker, error = %e, "no wakes; retrying");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                },
            }
        }
        self.inner.stopping.store(true, Ordering::Relaxed);
        drop(companions);
        // Kept leases go first (no owner keeps one once this worker is stopping), so that a
        // worker replacing this one finds their conversations free at once.
        self.release_kept_now().await;
        // The scheduler and the webhook dispatcher let their shards go (another worker takes
        // them at once), briefly.
        let _ = stop_scheduler.send(true);
        for task in scheduler_task.0.drain(..) {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(2), task)
                .await
                .is_err()
            {
                // Not done letting go: it stops here (its shards pass on with their leases).
                abort.abort();
            }
        }
        // What waited here for a slot goes back to the bus for another worker, at once.
        for wake in dispatch.drain() {
            wake.settle(Settlement::Handover, Duration::ZERO).await;
        }
        let drained = tokio::time::timeout(self.inner.config.grace, async {
            // Not the owner map: an owner leaves it before it settles its wakes and releases
            // its lease, and a wake being handled may have a claim in flight whose owner is not
            // in it yet. Exiting at either point would leave a lease held until its TTL. So:
            // first every wake being handled (a won claim becomes an owner, counted as a lease
            // holder, before its handling ends), then every lease holder: owners until their
            // lease is released, sweeps until theirs is (not the slots: an owner may give its
            // slot up before it releases).
            let config = &self.inner.config;
            let _handling = self.inner.intake.acquire_many(intake_permits(config)).await;
            // What a wake being handled queued meanwhile (one whose owner here was closing)
            // goes back too.
            for wake in dispatch.drain() {
                wake.settle(Settlement::Handover, Duration::ZERO).await;
            }
            let mut holders = self.inner.lease_holders.subscribe();
            let _ = holders.wait_for(|n| *n == 0).await;
        })
        .await
        .is_ok();
        // And any an owner kept just before this worker began stopping.
        self.release_kept_now().await;
        // And what was queued after that, or while the grace ran out.
        for wake in dispatch.drain() {
            wake.settle(Settlement::Handover, Duration::ZERO).await;
        }
        info!(worker = %self.inner.worker, drained, "worker stopped");
    }

    /// A wake off the bus: to its owner when the conversation is owned here (or to the record
    /// when a drain here went past it), else into the fair intake, or back to the bus until
    /// about when a slot should be free for it (see [`crate::fair`]).
    fn take(&self, wake: Wake) {
        let inner = &self.inner;
        let owned = inner.owns(wake.conversation);
        debug!(target: WAKES, conversation = %wake.conversation, seq = wake.seq, deliveries = wake.deliveries, owned, "taken");
        if owned || inner.drained_past(wake.conversation, wake.seq) {
            let worker = self.clone();
            tokio::spawn(async move {
                let Ok(_permit) = worker.inner.intake.clone().acquire_owned().await else {
                    return;
                };
                worker.handle_with(wake, None).await;
            });
            return;
        }
        self.put_off_unless_queued(wake);
    }

    /// A later wake of a lane that rode with its first one, once that one was handled: to the
    /// owner here, if the first one made or found one; otherwise the lane is another worker's
    /// (the claim was lost) or its turn is over, and the wake is settled by the record, as the
    /// first one was — acked if its event is in a complete turn, else back to the bus after a
    /// `busy_delay`. Never queued here again: a wake rides once, so it is held here at most one
    /// wait for a slot.
    async fn follow(&self, wake: Wake) {
        let inner = &self.inner;
        let Some(wake) = self.offer_to_owner(wake).await else {
            return;
        };
        let settlement = self.settlement_by_record(&wake).await;
        wake.settle(settlement, inner.config.busy_delay).await;
    }

    /// Gives `wake` to the conversation's owner here, if there is one that takes it; otherwise
    /// returns it (no owner, or one that is closing).
    async fn offer_to_owner(&self, wake: Wake) -> Option<Wake> {
        let existing = self
            .inner
            .owners
            .lock()
            .expect("owner map lock")
            .get(&wake.conversation)
            .cloned();
        match existing {
            Some(owner) => owner.offer(wake).await,
            None => Some(wake),
        }
    }

    /// Queues `wake` in the fair intake, or gives it back to the bus for the time its tenant's
    /// queue here needs.
    fn put_off_unless_queued(&self, wake: Wake) {
        let (conversation, seq) = (wake.conversation, wake.seq);
        let put_off = self.inner.dispatch.admit(wake);
        match &put_off {
            // Queued, or riding with a queued wake of its lane.
            None => debug!(target: WAKES, %conversation, seq, "queued"),
            // The one put off may be another of its tenant's, which this one displaced.
            Some((w, delay)) => {
                debug!(target: WAKES, %conversation, seq, put_off = w.seq, put_off_conversation = %w.conversation, delay_ms = delay.as_millis() as u64, "put off")
            }
        }
        if let Some((wake, delay)) = put_off {
            metrics::counter!("turnpike_wakes_deferred_total").increment(1);
            tokio::spawn(async move {
                wake.settle(Settlement::Deferred(delay), Duration::ZERO)
                    .await;
            });
        }
    }

    /// Starts queued wakes as slots free, in the order the fair share says.
    async fn dispatch_loop(self) {
        let inner = &self.inner;
        loop {
            loop {
                let ready = inner.dispatch.ready.notified();
                if inner.dispatch.has_startable() {
                    break;
                }
                ready.await;
            }
            let Ok(slot) = inner.slots.clone().acquire_owned().await else {
                return;
            };
            let Ok(handling) = inner.intake.clone().acquire_owned().await else {
                return;
            };
            // Taken by the time a slot freed (by another tenant's wake, or a sweep).
            let Some((wake, followers, running)) = inner.dispatch.next() else {
                continue;
            };
            debug!(target: WAKES, conversation = %wake.conversation, seq = wake.seq, riders = followers.len(), "started");
            let worker = self.clone();
            tokio::spawn(async move {
                worker.handle_with(wake, Some((slot, running))).await;
                // The later wakes of its lane: to the owner it now has, or settled by the record
                // like the first one, still counted as handled (a stopping worker waits).
                futures::future::join_all(followers.into_iter().map(|w| worker.follow(w))).await;
                drop(handling);
            });
        }
    }

    /// Releases, in a task of their own, the kept leases unused for `keep_lease_for`, or all
    /// of them once this worker is not alone on the bus (one such task at a time).
    fn release_kept_in_background(&self) {
        let inner = &self.inner;
        if inner.kept.len() == 0 {
            return;
        }
        let Ok(releasing) = inner.releasing_kept.clone().try_lock_owned() else {
            return;
        };
        let unused = if inner.dispatch.is_lone() {
            inner.config.keep_lease_for
        } else {
            Duration::ZERO
        };
        let worker = self.clone();
        tokio::spawn(async move {
            worker.release_kept(unused).await;
            drop(releasing);
        });
    }

    /// Sends this worker's heartbeat: alive, and how much it owns.
    async fn beat(&self) {
        let owned = self.inner.owners.lock().expect("owner map lock").len();
        debug!(worker = %self.inner.worker, owned, waiting = self.inner.dispatch.len(), "heartbeat");
        let beat = Heartbeat {
            worker: self.inner.worker,
            owned,
            slots: self.inner.config.slots,
            at_ms: now_ms(),
            every_ms: u64::try_from(self.inner.config.heartbeat_every.as_millis())
                .unwrap_or(u64::MAX),
        };
        self.inner.bus.heartbeat(&beat).await;
    }

    /// Keeps the count of workers that share the wakes current, for the intake (put-off wakes
    /// come back to any of them) and the scheduler's shards: watches heartbeats for this
    /// worker's life (see [`crate::roster`]), asks for a beat through `beat_now` once the
    /// watch is in place and for each worker first heard, and counts again at each beat and
    /// every second (a silent worker is counted out within a second of its time). A watch
    /// that cannot be had within a second, or ends, is asked for again after a pause; this
    /// worker beats meanwhile, so that a listing sees it.
    async fn count_workers(self, beat_now: Arc<Notify>) {
        let every = self.inner.config.heartbeat_every;
        let pause = every.min(Duration::from_secs(1));
        let mut roster = crate::roster::Roster::new(self.inner.worker, every);
        let mut recount = tokio::time::interval(pause);
        recount.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let watched = tokio::time::timeout(pause, self.inner.bus.watch_heartbeats()).await;
            // Beats: once the watch is in place, so that every answer is heard; else (no
            // watch yet) at least as often as the pauses between tries.
            beat_now.notify_one();
            let mut beats = match watched {
                Ok(Ok(beats)) => beats,
                Ok(Err(e)) => {
                    warn!(worker = %self.inner.worker, error = %e, "cannot watch heartbeats; retrying");
                    tokio::time::sleep(pause).await;
                    continue;
                }
                Err(_) => continue,
            };
            loop {
                tokio::select! {
                    beat = futures::StreamExt::next(&mut beats) => match beat {
                        Some(beat) => {
                            let beats_every = Duration::from_millis(beat.every_ms);
                            if roster.heard(beat.worker, beats_every, std::time::Instant::now()) {
                                beat_now.notify_one();
                            }
                        }
                        // The bus let the watch go: watch again, after a pause.
                        None => break,
                    },
                    _ = recount.tick() => {}
                }
                let n = roster.count(std::time::Instant::now());
                self.inner.dispatch.set_workers(n);
                metrics::gauge!("turnpike_worker_fleet_size").set(n as f64);
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// Whether this worker counted itself alone on the bus (by the heartbeats it hears; false
    /// until it first counted). A lone worker keeps more of a tenant's wakes waiting for its
    /// slots (see `crate::dispatch`).
    pub fn alone(&self) -> bool {
        self.inner.dispatch.is_lone()
    }

    /// Waits until no conversation is owned.
    pub async fn idle(&self) {
        loop {
            let gone = self.inner.owner_gone.notified();
            if self.inner.owners.lock().expect("owner map lock").is_empty() {
                return;
            }
            gone.await;
        }
    }

    fn spawn_owner(
        &self,
        tenant: turnpike_schemas::TenantId,
        Claimed { lease, resumed }: Claimed,
        slot: Arc<OwnerSlot>,
        permit: tokio::sync::OwnedSemaphorePermit,
        running: crate::dispatch::Running,
        // The lease's holder count, when the lease was claimed with one (a sweep's).
        holder: Option<LeaseHolder>,
    ) {
        let inner = &self.inner;
        let holder = holder.unwrap_or_else(|| LeaseHolder::new(inner));
        let task = tokio::spawn(own(
            inner.clone(),
            tenant,
            lease,
            resumed,
            slot,
            (permit, running.owning()),
            holder,
        ));
        let mut tasks = inner.owner_tasks.lock().expect("owner tasks lock");
        tasks.retain(|t| !t.is_finished());
        tasks.push(task.abort_handle());
    }

    /// One sweep: every conversation marked as possibly holding an open turn, not owned here,
    /// whose lease is free or lapsed, is taken over — recovered if its record ends in an open
    /// turn, its stale mark cleared otherwise (only while holding the lease). Public so tests
    /// can sweep by hand.
    pub async fn sweep(&self) {
        let inner = &self.inner;
        let Some(orphans) = self.sweep_marks().await else {
            return;
        };
        metrics::gauge!("turnpike_open_turn_marks").set(f64::from(orphans));
        // Deletions a crash cut short are finished here too.
        let eraser = turnpike_lifecycle::erasure::Eraser::new(
            inner.conversations.clone(),
            inner.bus.clone(),
            inner.indexing.as_ref().map(|q| q.index().clone()),
        );
        match eraser.finish_pending().await {
            Ok(0) => {}
            Ok(n) => {
                info!(worker = %inner.worker, finished = n, "sweep: finished deletions a crash cut short")
            }
            Err(e) => {
                warn!(worker = %inner.worker, error = %e, "sweep: cannot finish pending deletions")
            }
        }
        crate::idle::sweep(inner).await;
        if let Some(retention) = inner.config.retention {
            self.retain(&eraser, retention).await;
        }
        debug!(worker = %inner.worker, "sweep done");
    }

    /// Goes through the open-turn marks: a turn left open by an owner that is gone (its lease
    /// free) is taken over, a closed one's promotion finished and its stale mark cleared. The
    /// turns found left open; none when the worker is stopping or the marks cannot be listed
    /// (the sweep ends there and retries later).
    async fn sweep_marks(&self) -> Option<u32> {
        let inner = &self.inner;
        let marks = inner.conversations.open_turns();
        let marked = match marks.list().await {
            Ok(marked) => marked,
            Err(e) => {
                warn!(worker = %inner.worker, error = %e, "cannot list open turns; the sweep retries later");
                return None;
            }
        };
        // Turns found left open by owners that are gone (their lease free): an alert when
        // every sweep keeps finding some.
        let mut orphans = 0;
        for prefix in marked {
            if inner.is_stopping() {
                return None;
            }
            let conversation = prefix.conversation();
            if inner.owns(conversation) {
                continue;
            }
            // No slot free for a takeover: the marks wait for the next sweep, and the rest of
            // this one (deletions, idle conversations, retention) still runs.
            let Ok(permit) = inner.slots.clone().try_acquire_owned() else {
                break;
            };
            let Some((lease, holder)) = inner.claim_free(conversation).await else {
                continue;
            };
            match self.sweep_marked(&prefix).await {
                Some(head) if head.state().turn_open => {
                    orphans += 1;
                    let slot = Arc::new(OwnerSlot::default());
                    if !inner.register_owner(conversation, slot.clone()) {
                        let _ = inner.bus.release(&lease).await;
                        continue;
                    }
                    warn!(%conversation, worker = %inner.worker, "sweep: taking over a turn left open");
                    let running = inner.dispatch.running(prefix.tenant().clone());
                    self.spawn_owner(
                        prefix.tenant().clone(),
                        Claimed {
                            lease,
                            resumed: None,
                        },
                        slot,
                        permit,
                        running,
                        Some(holder),
                    );
                }
                Some(head) => {
                    // Closed: finish a promotion its owner may have left undone, then the mark
                    // is stale.
                    let record = inner.conversations.record(prefix.clone());
                    match crate::turn::finish_committed(&inner.shared, &record, &head).await {
                        Ok(()) => {
                            if let Err(e) = marks.clear(&prefix).await {
                                debug!(%conversation, error = %e, "sweep: cannot clear a stale mark");
                            }
                        }
                        Err(e) => {
                            warn!(%conversation, error = %e, "sweep: cannot finish a promotion")
                        }
                    }
                    let _ = inner.bus.release(&lease).await;
                }
                None => {
                    let _ = inner.bus.release(&lease).await;
                }
            }
        }
        Some(orphans)
    }

    /// The head of a marked conversation, read under its lease once a repair cut short is
    /// finished.
    /// None: it is not the sweep's (being deleted: the eraser's, in `finish_pending`), or
    /// something could not be read (logged; the next sweep tries again).
    async fn sweep_marked(
        &self,
        prefix: &ConversationPrefix,
    ) -> Option<turnpike_artifactory::Head> {
        let inner = &self.inner;
        let conversation = prefix.conversation();
        match inner
            .conversations
            .tombstones()
            .get(prefix.tenant(), conversation)
            .await
        {
            Ok(None) => {}
            Ok(Some(_)) => return None,
            Err(e) => {
                warn!(%conversation, error = %e, "sweep: cannot read the tombstones");
                return None;
            }
        }
        let record = inner.conversations.record(prefix.clone());
        if let Err(e) = record.finish_repair().await {
            warn!(%conversation, error = %e, "sweep: cannot finish a repair");
            return None;
        }
        record
            .head()
            .await
            .map_err(|e| warn!(%conversation, error = %e, "sweep: cannot read the head"))
            .ok()
    }

    /// Deletes the conversations closed longer than `retention` ago. Any worker may run it:
    /// each deletion holds the conversation's lease, and one that another finished first is
    /// not found. Costs one listing of the closed markers when nothing is due.
    async fn retain(&self, eraser: &turnpike_lifecycle::erasure::Eraser, retention: Duration) {
        let inner = &self.inner;
        let closed = match inner.conversations.directory().closed_list().await {
            Ok(closed) => closed,
            Err(e) => {
                warn!(worker = %inner.worker, error = %e, "sweep: cannot list closed conversations");
                return;
            }
        };
        let now = turnpike_router::clock::now_ms();
        let window = retention.as_millis() as u64;
        let mut deleted = 0;
        for (conversation, closed_ms) in closed {
            if inner.is_stopping() || now.saturating_sub(closed_ms) <= window {
                continue;
            }
            // A backlog is worked off a bounded slice per sweep, so that turns left open are
            // not kept waiting behind it.
            if deleted >= RETENTION_PER_SWEEP {
                break;
            }
            let entry = match inner
                .conversations
                .directory()
                .lookup_unchecked(conversation)
                .await
            {
                Ok(entry) => entry,
                Err(_) => continue,
            };
            let reason = format!(
                "retention: closed for more than {}",
                humantime_secs(retention.as_secs())
            );
            match eraser.erase(&entry, "retention", &reason).await {
                Ok(_) => {
                    deleted += 1;
                    info!(%conversation, "sweep: deleted a conversation past its retention")
                }
                Err(turnpike_lifecycle::erasure::ErasureError::Busy) => {}
                Err(e) => warn!(%conversation, error = %e, "sweep: retention could not delete"),
            }
        }
    }

    /// Claims `wake`'s conversation for this worker. A lease held by an owner between turns
    /// (the record has no turn open and has not reached the wake's event) is most often let go
    /// within tens of milliseconds, when that owner finishes its turn's last steps (usage,
    /// promotion, the release) outside the slot it gave up; so the claim is tried again a few
    /// times, [`BETWEEN_TURNS_RETRY`] apart, before the wake goes back to the bus for a whole
    /// `busy_delay` (about a turn, when each message follows the reply to the one before).
    /// When the owner takes the event itself instead, or is gone until its lease runs out, the
    /// retries are lost: at most [`BETWEEN_TURNS_RETRIES`] claims and their waits, with the slot
    /// and the tenant's running count held. Returns the lease, or, when it stayed held, the
    /// settlement the record gave (read once, before the retries) to settle the wake by.
    async fn claim_for(&self, wake: &Wake) -> turnpike_router::Result<Result<Claimed, Settlement>> {
        let claim = || self.claim_or_resume(wake.conversation);
        if let Some(lease) = claim().await? {
            return Ok(Ok(lease));
        }
        let settlement = self.settlement_by_record(wake).await;
        let between_turns = matches!(
            settlement,
            Settlement::Record { lane_through, turn_open: false } if wake.seq > lane_through
        );
        if between_turns {
            for _ in 0..BETWEEN_TURNS_RETRIES {
                tokio::time::sleep(BETWEEN_TURNS_RETRY).await;
                if let Some(lease) = claim().await? {
                    return Ok(Ok(lease));
                }
            }
        }
        Ok(Err(settlement))
    }

    /// The lease of `conversation`: a lease kept here resumed (see [`crate::kept`]), else a
    /// claim's (`None` when someone holds it).
    async fn claim_or_resume(
        &self,
        conversation: turnpike_schemas::ConversationId,
    ) -> turnpike_router::Result<Option<Claimed>> {
        let inner = &self.inner;
        if let Some(kept) = inner.kept.take(conversation) {
            if let Some(lease) = self.resume(kept.lease).await {
                return Ok(Some(Claimed {
                    lease,
                    resumed: Some(kept.head),
                }));
            }
        }
        let claimed = inner
            .bus
            .claim(conversation, inner.worker, inner.config.lease_ttl)
            .await?;
        Ok(claimed.map(|lease| Claimed {
            lease,
            resumed: None,
        }))
    }

    /// A kept lease, ready for a drain: as it is while its next renewal is not due, else
    /// renewed first (a compare-and-set at its revision). `None` when someone took it over, or
    /// the renewal failed (then it is released, in case it is still ours).
    async fn resume(&self, lease: Lease) -> Option<Lease> {
        let inner = &self.inner;
        let (ttl, every) = (inner.config.lease_ttl, inner.config.renew_every);
        if crate::kept::renewal_due_in(&lease, ttl, every) > RESUME_SLACK {
            return Some(lease);
        }
        match inner.bus.renew(&lease, ttl).await {
            Ok(renewed) => Some(renewed),
            Err(e) if e.kind() == turnpike_router::ErrorKind::LeaseLost => {
                debug!(target: WAKES, conversation = %lease.conversation, "a kept lease was taken over");
                None
            }
            Err(e) => {
                warn!(conversation = %lease.conversation, error = %e, "cannot renew a kept lease; releasing it");
                let _ = inner.bus.release(&lease).await;
                None
            }
        }
    }

    /// Releases the leases kept unused for `unused` (all of them with `Duration::ZERO`).
    /// A few at a time (each is a round trip to the bus).
    async fn release_kept(&self, unused: Duration) {
        use futures::StreamExt as _;
        let inner = &self.inner;
        let leases = inner.kept.take_unused(unused, std::time::Instant::now());
        futures::stream::iter(leases)
            .for_each_concurrent(KEPT_RELEASES_AT_ONCE, |lease| async move {
                debug!(target: WAKES, conversation = %lease.conversation, "kept lease released");
                if let Err(e) = inner.bus.release(&lease).await {
                    warn!(conversation = %lease.conversation, error = %e, "cannot release a kept lease; it lapses");
                }
            })
            .await;
    }

    /// Releases every kept lease, after any release already under way (so that none is left
    /// held when this returns), within [`KEPT_RELEASE_WAIT`]: a bus that does not answer
    /// leaves the rest to lapse, as a crash would.
    async fn release_kept_now(&self) {
        let _ = tokio::time::timeout(KEPT_RELEASE_WAIT, async {
            let _releasing = self.inner.releasing_kept.lock().await;
            self.release_kept(Duration::ZERO).await;
        })
        .await;
    }

    /// How the record settles a wake nobody here owns: done only when the turn that consumed
    /// it is complete (an open turn's owner may still die before batch two, and then this wake
    /// must come back), and never from a record under repair (it may be half old, half new).
    async fn settlement_by_record(&self, wake: &Wake) -> Settlement {
        let inner = &self.inner;
        let busy = inner.config.busy_delay;
        let record = inner.conversations.record(ConversationPrefix::new(
            wake.tenant.clone(),
            wake.conversation,
        ));
        let settlement = match record.head().await {
            Ok(head) => Settlement::Record {
                lane_through: head.state().lane_through,
                turn_open: head.state().turn_open,
            },
            Err(_) => return Settlement::Busy,
        };
        let acks = turnpike_router::settle::outcome(wake.seq, wake.deliveries, settlement, busy)
            == turnpike_router::settle::Outcome::Ack;
        if acks && !matches!(record.repair_pending().await, Ok(false)) {
            return Settlement::Busy;
        }
        settlement
    }

    /// Acks `wake` when the record, read now, holds its event in a complete turn; gives it back
    /// untouched otherwise.
    async fn settle_if_done(&self, wake: Wake) -> Option<Wake> {
        let settlement = self.settlement_by_record(&wake).await;
        let outcome =
            turnpike_router::settle::outcome(wake.seq, wake.deliveries, settlement, Duration::ZERO);
        if outcome != turnpike_router::settle::Outcome::Ack {
            return Some(wake);
        }
        wake.settle(settlement, Duration::ZERO).await;
        None
    }

    /// Handles one wake (public so tests can deliver wakes by hand): waits for a turn slot
    /// first, outside the fair intake.
    pub async fn handle(&self, wake: Wake) {
        let inner = &self.inner;
        let Ok(permit) = inner.slots.clone().acquire_owned().await else {
            return;
        };
        let running = inner.dispatch.running(wake.tenant.clone());
        self.handle_with(wake, Some((permit, running))).await
    }

    /// Handles one wake, with a turn slot already taken for it, if any (else one is taken
    /// when the wake needs it).
    async fn handle_with(&self, wake: Wake, slot: Option<Slot>) {
        let inner = &self.inner;
        let Some(wake) = self.offer_to_owner(wake).await else {
            return;
        };
        let busy = inner.config.busy_delay;
        // A wake this worker's last drain of the conversation went past (a message that came
        // while it ran): done, when the record says so, without a claim.
        let wake = if inner.drained_past(wake.conversation, wake.seq) {
            match self.settle_if_done(wake).await {
                None => return,
                Some(wake) => wake,
            }
        } else {
            wake
        };
        // A wake that came without a slot (its owner here was closing) waits for one in the
        // fair intake like any other.
        let Some((permit, running)) = slot else {
            self.put_off_unless_queued(wake);
            return;
        };
        let claimed = self.claim_for(&wake).await;
        let result = match &claimed {
            Ok(Ok(Claimed {
                resumed: Some(_), ..
            })) => "kept",
            Ok(Ok(_)) => "won",
            Ok(Err(_)) => "held",
            Err(_) => "failed",
        };
        metrics::counter!("turnpike_lease_claims_total", "result" => result).increment(1);
        match claimed {
            Ok(Ok(Claimed { lease, resumed })) => {
                debug!(target: WAKES, conversation = %wake.conversation, seq = wake.seq, epoch = lease.revision, resumed = resumed.is_some(), "claim won");
                inner
                    .config
                    .failpoints
                    .hit("claim-won", wake.conversation)
                    .await;
                let slot = Arc::new(OwnerSlot::default());
                if !inner.register_owner(wake.conversation, slot.clone()) {
                    debug!(target: WAKES, conversation = %wake.conversation, seq = wake.seq, "claim won while an owner here was closing: released");
                    let _ = inner.bus.release(&lease).await;
                    wake.settle(Settlement::Busy, busy).await;
                    return;
                }
                let tenant = wake.tenant.clone();
                debug!(conversation = %wake.conversation, worker = %inner.worker, epoch = lease.revision, "lease taken");
                let _ = slot.offer(wake).await;
                self.spawn_owner(
                    tenant,
                    Claimed { lease, resumed },
                    slot,
                    permit,
                    running,
                    None,
                );
            }
            Ok(Err(settlement)) => {
                drop((permit, running));
                debug!(target: WAKES, conversation = %wake.conversation, seq = wake.seq, ?settlement, "claim found the lease held");
                wake.settle(settlement, busy).await;
            }
            Err(e) => {
                warn!(conversation = %wake.conversation, error = %e, "cannot claim");
                wake.settle(Settlement::Busy, busy).await;
            }
        }
    }
}

/// How many more times a claim is tried when the lease's owner is between turns, and how far
/// apart: an owner releases within a few tens of milliseconds of its turn's commit (measured in
/// `bench fleet`: 5–51 ms), so 3 × 15 ms covers most hand-overs.
const BETWEEN_TURNS_RETRIES: usize = 3;
const BETWEEN_TURNS_RETRY: Duration = Duration::from_millis(15);

/// How many kept leases are released at once, and how long a stopping worker waits for them.
const KEPT_RELEASES_AT_ONCE: usize = 32;
const KEPT_RELEASE_WAIT: Duration = Duration::from_secs(5);

/// A kept lease whose renewal is due within this is renewed before it is resumed.
const RESUME_SLACK: Duration = Duration::from_millis(500);

/// A claim won: its lease, and when it is a kept lease resumed, the head its last drain left.
struct Claimed {
    lease: Lease,
    resumed: Option<turnpike_artifactory::Head>,
}

/// The longest a wake waits in the fair intake for a slot before it goes back to the bus:
/// well within any ack wait, so a waiting wake is never redelivered under it.
const MAX_WAITING: Duration = Duration::from_secs(1);

/// How many drained conversations a worker remembers (the least recently drained or asked
/// about goes first).
const RECENT: usize = 4096;
/// How long a worker remembers a drained conversation nothing happened to (memory that follows
/// the conversations in use).
const RECENT_IDLE: Duration = Duration::from_secs(120);

/// The most conversations one sweep deletes for retention.
const RETENTION_PER_SWEEP: usize = 100;

/// `90s`, `30m`, `24h`, `7d`: the largest unit that divides the time.
fn humantime_secs(secs: u64) -> String {
    for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60)] {
        if secs >= size && secs.is_multiple_of(size) {
            return format!("{}{unit}", secs / size);
        }
    }
    format!("{secs}s")
}

/// How many conversations a worker owns at once: its slots.
fn slot_permits(config: &WorkerConfig) -> u32 {
    u32::try_from(config.slots.max(1)).unwrap_or(u32::MAX)
}

/// How many wakes a worker handles at once (claiming, or handing to an owner): twice its slots.
fn intake_permits(config: &WorkerConfig) -> u32 {
    u32::try_from(2 * config.slots.max(1)).unwrap_or(u32::MAX)
}

/// Tasks aborted when this is dropped.
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}
