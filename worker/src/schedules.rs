//! The scheduler: fires schedules into lanes, each firing once across a fleet.
//!
//! Schedules are spread over [`SHARDS`] shards. Every worker runs a scheduler that holds the
//! leases of free shards (the bus's leases, so a shard has one holder at a time and passes on
//! when its holder dies) and fires the schedules of the shards it holds.
//!
//! # Contract
//! - A firing is (schedule, fire time). Its holder **claims** it in the store (create-only:
//!   one claim wins) with everything it will do — the conversation, the event id, the lane
//!   position before it — and only then publishes. Whoever finds a claim (the next holder
//!   after a crash, a zombie that lost its lease) finishes it the same way: it looks for the
//!   event on the lane after that position and publishes the same event (same id, same
//!   idempotency key: deduplicated on the bus) only when it is not there. So a firing's event
//!   is on its lane once, whatever is killed when.
//! - Firings are claimed in fire-time order; a schedule's latest claim is its cursor. A shard
//!   taken over resumes from each schedule's cursor, finishing its latest claim first.
//! - Late firings (later than the schedule's grace) follow its [`Missed`] policy; a firing
//!   due while the previous firing's turn still runs follows its [`Overlap`] policy.
//! - A firing is a message from the schedule's owner: ingress checks it as it checks theirs
//!   (the conversation must be theirs and open; budgets apply).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, warn};
use turnpike_artifactory::schedules::{
    Claim, Firing, Missed, Outcome, Overlap, Schedule, Target, SHARDS,
};
use turnpike_artifactory::{Conversations, NewConversation, RecordSigner, Schedules};
use turnpike_router::bus::{now_ms, Bus};

use crate::shards::ShardLeases;
use turnpike_router::Ingress;
use turnpike_schemas::{ConversationId, EventBody, EventId, ScheduleId, WorkerId};

/// How the scheduler paces itself.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// How long a shard's lease lasts without renewal (a dead holder's shards pass on after).
    pub lease_ttl: Duration,
    /// How often due firings are looked for.
    pub tick: Duration,
    /// How often a held shard's schedules are listed again (new, changed, deleted ones).
    pub refresh: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            lease_ttl: Duration::from_secs(6),
            tick: Duration::from_millis(100),
            refresh: Duration::from_secs(1),
        }
    }
}

/// The lease tag of schedule shards (see [`crate::shards::shard_key`]).
pub const SHARD_TAG: u64 = 0x5343_4845_4455_4c45;

/// The id of an app-wide schedule: the same in every process (a hash of its app and name).
pub fn manifest_schedule_id(app: &turnpike_schemas::AppId, name: &str) -> ScheduleId {
    ScheduleId::from_ulid(hashed_ulid(&format!("manifest-schedule:{app}:{name}")))
}

/// The standing conversation of an app-wide schedule with `conversation = "same"`: fixed by
/// tenant, app, name, owner and agent, so every process fires into the same one (made by
/// whichever firing finds it missing), and a manifest that gives the schedule another owner or
/// agent starts another conversation rather than sending as a stranger to the old one.
pub fn manifest_schedule_conversation(
    tenant: &turnpike_schemas::TenantId,
    app: &turnpike_schemas::AppId,
    name: &str,
    owner: &turnpike_schemas::Identity,
    agent: &turnpike_schemas::AgentId,
) -> ConversationId {
    ConversationId::from_ulid(hashed_ulid(&format!(
        "manifest-schedule-conversation:{tenant}:{app}:{name}:{owner}:{agent}"
    )))
}

/// A ULID of the first 16 bytes of `text`'s SHA-256.
fn hashed_ulid(text: &str) -> ulid::Ulid {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(text.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    ulid::Ulid::from_bytes(bytes)
}

/// The idempotency key of a firing's message.
pub fn firing_key(id: ScheduleId, fire_ms: u64) -> String {
    format!("schedule:{id}:{fire_ms}")
}

/// Fires the schedules of the shards it holds.
pub struct Scheduler {
    bus: Arc<dyn Bus>,
    conversations: Conversations,
    schedules: Schedules,
    ingress: Ingress,
    signer: RecordSigner,
    worker: WorkerId,
    config: SchedulerConfig,
    failpoints: turnpike_lifecycle::failpoints::Failpoints,
    /// The hosted apps, whose manifests may declare app-wide schedules.
    apps: Option<Arc<turnpike_agent::apps::Apps>>,
    /// How many schedulers share the shards (the live workers): each holds its part.
    peers: Arc<std::sync::atomic::AtomicUsize>,
    /// Tells subscribers of each firing's outcome.
    notifier: Option<Arc<crate::webhooks::Notifier>>,
}

/// What the holder of a shard keeps of it.
#[derive(Default)]
struct Held {
    listed: Option<Instant>,
    tracked: HashMap<ScheduleId, Tracked>,
}

/// What the holder knows of a schedule.
struct Tracked {
    schedule: Schedule,
    /// The latest claimed fire time (0: none yet).
    cursor: u64,
    /// The conversation of the latest fired firing (for the overlap policy).
    previous: Option<ConversationId>,
    /// Whether the latest claim was seen through (published, if it fires).
    settled: bool,
    /// When its next firing is due, jitter included (`None`: to be worked out again).
    due_at: Option<u64>,
    /// Claims made since its old ones were last pruned.
    unpruned: usize,
}

impl Scheduler {
    pub fn new(
        bus: Arc<dyn Bus>,
        conversations: Conversations,
        signer: RecordSigner,
        worker: WorkerId,
        config: SchedulerConfig,
    ) -> Self {
        Self {
            ingress: Ingress::new(bus.clone(), conversations.clone()),
            schedules: Schedules::new(conversations.store().clone()),
            bus,
            conversations,
            signer,
            worker,
            config,
            failpoints: Default::default(),
            apps: None,
            peers: Arc::new(std::sync::atomic::AtomicUsize::new(1)),
            notifier: None,
        }
    }

    /// Tells the owner's subscribers (`schedule.firing`) how each firing went.
    pub fn with_notifier(mut self, notifier: Arc<crate::webhooks::Notifier>) -> Self {
        self.notifier = Some(notifier);
        self
    }

    /// Holds about `SHARDS / peers` shards (rounded up), `peers` kept current by the caller;
    /// past its part it lets shards go, for schedulers that started later.
    pub fn with_peers(mut self, peers: Arc<std::sync::atomic::AtomicUsize>) -> Self {
        self.peers = peers;
        self
    }

    /// Fires the app-wide schedules `apps`' manifests declare too (read at each listing: a
    /// reload shows within a refresh).
    pub fn with_apps(mut self, apps: Arc<turnpike_agent::apps::Apps>) -> Self {
        self.apps = Some(apps);
        self
    }

    /// Hangs or pauses where tests say: `schedule-claimed` (a firing claimed, nothing of it
    /// done) and `schedule-conversation` (its new conversation created, its message not
    /// published).
    pub fn with_failpoints(
        mut self,
        failpoints: turnpike_lifecycle::failpoints::Failpoints,
    ) -> Self {
        self.failpoints = failpoints;
        self
    }

    /// Publishes firings through `ingress` (one with the deployment's directive and budgets).
    pub fn with_ingress(mut self, ingress: Ingress) -> Self {
        self.ingress = ingress;
        self
    }

    /// Holds free shards and fires their schedules until `stop` turns true (then lets its
    /// shards go, so another scheduler takes them at once) or its task is aborted (a crash:
    /// its shards pass on when their leases run out).
    pub async fn run(self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut leases: ShardLeases<Held> = ShardLeases::new(
            self.bus.clone(),
            self.worker,
            "schedules",
            SHARD_TAG,
            SHARDS,
            self.config.lease_ttl,
            self.peers.clone(),
        );
        // The earliest firing due in a held shard: woken for it, not only every tick.
        let mut next_due = u64::MAX;
        loop {
            // At least a moment: a firing that failed is due again at once, and is retried
            // after this, not in a busy loop.
            let wait = Duration::from_millis(next_due.saturating_sub(now_ms()).max(5))
                .min(self.config.tick);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = async { let _ = stop.wait_for(|stop| *stop).await; } => {
                    leases.release_all().await;
                    return;
                }
            }
            leases.maintain().await;
            next_due = u64::MAX;
            for (shard, fresh_until, h) in leases.fresh() {
                if h.listed.is_none_or(|t| t.elapsed() >= self.config.refresh) {
                    self.list(shard, h).await;
                }
                // Schedules fire side by side (each one's firings in order): a shard's many
                // firings due at once do not wait for each other's store and bus round trips.
                {
                    use futures::StreamExt as _;
                    let this = &self;
                    futures::stream::iter(h.tracked.values_mut())
                        .for_each_concurrent(FIRING_CONCURRENCY, |t| async move {
                            this.fire_due(t, fresh_until).await;
                        })
                        .await;
                }
                for t in h.tracked.values_mut() {
                    if !t.schedule.paused && t.settled {
                        next_due = next_due.min(due_at(t));
                    }
                }
            }
        }
    }

    /// The app-wide schedules of the hosted manifests that fall in `shard`, as schedules
    /// starting now (an interval's firings on its own grid: multiples of it since the epoch, the
    /// same in every process).
    fn manifest_schedules(&self, shard: u32) -> Vec<Schedule> {
        let Some(apps) = &self.apps else {
            return Vec::new();
        };
        let now = now_ms();
        apps.schedules()
            .into_iter()
            .filter_map(|(app, spec)| {
                let id = manifest_schedule_id(&app, &spec.name);
                if turnpike_artifactory::schedules::shard_of(id) != shard {
                    return None;
                }
                let created_ms = match spec.timing {
                    turnpike_artifactory::schedules::Timing::Every { every_ms } => {
                        now / every_ms.max(1) * every_ms.max(1)
                    }
                    turnpike_artifactory::schedules::Timing::Cron { .. } => now,
                };
                let target = if spec.same {
                    Target::Same {
                        conversation: manifest_schedule_conversation(
                            &spec.tenant,
                            &app,
                            &spec.name,
                            &spec.owner,
                            &spec.agent,
                        ),
                    }
                } else {
                    Target::New
                };
                Some(Schedule {
                    id,
                    tenant: spec.tenant,
                    owner: spec.owner,
                    app,
                    agent: spec.agent,
                    timing: spec.timing,
                    target,
                    text: spec.text,
                    missed: spec.missed,
                    overlap: spec.overlap,
                    jitter_ms: spec.jitter_ms,
                    grace_ms: spec.grace_ms,
                    paused: false,
                    created_ms,
                    updated_ms: created_ms,
                })
            })
            .collect()
    }

    /// Lists a shard's schedules: new ones are tracked from their cursor, changed ones take
    /// their new definition, deleted ones are dropped.
    async fn list(&self, shard: u32, held: &mut Held) {
        let listed = match self.schedules.in_shard(shard).await {
            Ok(listed) => listed,
            Err(e) => {
                warn!(shard, error = %e, "cannot list a shard's schedules");
                return;
            }
        };
        held.listed = Some(Instant::now());
        let declared = self.manifest_schedules(shard);
        let from_manifests: std::collections::HashSet<ScheduleId> =
            declared.iter().map(|s| s.id).collect();
        let mut listed = listed;
        listed.extend(declared);
        let mut seen = std::collections::HashSet::new();
        for mut schedule in listed {
            seen.insert(schedule.id);
            if let Some(t) = held.tracked.get_mut(&schedule.id) {
                if from_manifests.contains(&schedule.id) {
                    // An app-wide schedule's start is when this holder first saw it.
                    schedule.created_ms = t.schedule.created_ms;
                    schedule.updated_ms = t.schedule.updated_ms;
                }
                if t.schedule != schedule {
                    t.schedule = schedule;
                    t.due_at = None;
                }
                continue;
            }
            let (cursor, previous) = match self.schedules.recent(schedule.id, 1).await {
                Ok(recent) => match recent.first() {
                    Some(f) => (
                        f.fire_ms,
                        match &f.outcome {
                            Outcome::Fired { conversation, .. } => Some(*conversation),
                            _ => None,
                        },
                    ),
                    None => (0, None),
                },
                Err(e) => {
                    warn!(schedule = %schedule.id, error = %e, "cannot read a schedule's firings");
                    continue;
                }
            };
            held.tracked.insert(
                schedule.id,
                Tracked {
                    schedule,
                    cursor,
                    previous,
                    settled: cursor == 0,
                    due_at: None,
                    // Pruned after the first claim (a schedule taken over may have many).
                    unpruned: usize::MAX / 2,
                },
            );
        }
        held.tracked.retain(|id, _| seen.contains(id));
    }

    /// Fires what is due of one schedule (and first sees its latest claim through).
    async fn fire_due(&self, t: &mut Tracked, fresh_until: Instant) {
        if !t.settled {
            match self.schedules.firing(t.schedule.id, t.cursor).await {
                Ok(firing) => match self.finish(&t.schedule, &firing).await {
                    Ok(()) => t.settled = true,
                    Err(e) => {
                        warn!(schedule = %t.schedule.id, fire_ms = t.cursor, error = %e, "cannot finish a claimed firing; retrying");
                        return;
                    }
                },
                // Pruned or deleted: nothing to finish.
                Err(e) if e.kind() == turnpike_artifactory::ErrorKind::NotFound => t.settled = true,
                Err(e) => {
                    warn!(schedule = %t.schedule.id, error = %e, "cannot read a claimed firing");
                    return;
                }
            }
        }
        if t.schedule.paused {
            return;
        }
        let now = now_ms();
        if now < due_at(t) {
            return;
        }
        t.due_at = None;
        let due = due_firings(&t.schedule, t.cursor, now);
        if due.is_empty() {
            return;
        }
        let grace = t.schedule.grace_ms;
        let s = &t.schedule;
        let late = due
            .iter()
            .take_while(|f| now.saturating_sub(**f + s.jitter_of(**f)) > grace)
            .count();
        let mut plan: Vec<(u64, u64)> = Vec::new(); // (fire time, missed before it)
        if late > 0 {
            let last_late = due[late - 1];
            match t.schedule.missed {
                Missed::Skip => {
                    let missed = Firing {
                        fire_ms: last_late,
                        claimed_ms: now,
                        outcome: Outcome::Missed { count: late as u64 },
                    };
                    if !self.claim_and_finish(t, missed, fresh_until).await {
                        return;
                    }
                }
                Missed::Latest => plan.push((last_late, late as u64 - 1)),
                Missed::All { cap } => {
                    let cap = cap as usize;
                    let fired_from = late.saturating_sub(cap);
                    if fired_from > 0 {
                        let missed = Firing {
                            fire_ms: due[fired_from - 1],
                            claimed_ms: now,
                            outcome: Outcome::Missed {
                                count: fired_from as u64,
                            },
                        };
                        if !self.claim_and_finish(t, missed, fresh_until).await {
                            return;
                        }
                    }
                    plan.extend(due[fired_from..late].iter().map(|f| (*f, 0)));
                }
            }
        }
        plan.extend(due[late..].iter().map(|f| (*f, 0)));
        for (fire_ms, missed) in plan {
            let firing = match self.decide(t, fire_ms, missed).await {
                Ok(firing) => firing,
                Err(e) => {
                    warn!(schedule = %t.schedule.id, fire_ms, error = %e, "cannot decide a firing; retrying");
                    return;
                }
            };
            if !self.claim_and_finish(t, firing, fresh_until).await {
                return;
            }
        }
    }

    /// What firing `fire_ms` does: the overlap policy against the previous firing's turn, the
    /// conversation and the event.
    async fn decide(&self, t: &Tracked, fire_ms: u64, missed: u64) -> crate::error::Result<Firing> {
        let s = &t.schedule;
        let mut stop = None;
        if let Some(previous) = t.previous {
            if self.running(s, previous).await? {
                match s.overlap {
                    Overlap::Skip => {
                        return Ok(Firing {
                            fire_ms,
                            claimed_ms: now_ms(),
                            outcome: Outcome::Skipped {
                                reason: "the previous firing's turn was still running".into(),
                            },
                        })
                    }
                    Overlap::Cancel => stop = Some(previous),
                    Overlap::Queue => {}
                }
            }
        }
        let (conversation, lane_after) = match s.target {
            Target::New => (ConversationId::new(), 0),
            Target::Same { conversation } => {
                (conversation, self.bus.lane_last(conversation).await?)
            }
        };
        Ok(Firing {
            fire_ms,
            claimed_ms: now_ms(),
            outcome: Outcome::Fired {
                conversation,
                event: EventId::new(),
                lane_after,
                stop,
                missed,
            },
        })
    }

    /// Whether the turn of `conversation` still runs, or its lane holds events not yet taken.
    async fn running(
        &self,
        s: &Schedule,
        conversation: ConversationId,
    ) -> crate::error::Result<bool> {
        let (_, record) = match self
            .conversations
            .open(conversation, &s.tenant, &s.owner)
            .await
        {
            Ok(opened) => opened,
            Err(e) if e.kind() == turnpike_artifactory::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let head = record.head().await?;
        let state = head.state();
        if state.turn_open {
            return Ok(true);
        }
        Ok(self.bus.lane_last(conversation).await? > state.lane_through)
    }

    /// Claims `firing` and sees it (or the claim that won) through; moves the cursor. False:
    /// stop for now (retried on the next tick).
    async fn claim_and_finish(
        &self,
        t: &mut Tracked,
        firing: Firing,
        fresh_until: Instant,
    ) -> bool {
        let id = t.schedule.id;
        if Instant::now() >= fresh_until {
            // The lease may have lapsed mid-pass: the next pass renews it first.
            return false;
        }
        let won = match self.schedules.claim(id, &firing).await {
            Ok(Claim::Won) => {
                self.failpoints
                    .hit("schedule-claimed", format!("{id} {}", firing.fire_ms))
                    .await;
                firing
            }
            Ok(Claim::Lost(theirs)) => theirs,
            Err(e) => {
                warn!(schedule = %id, fire_ms = firing.fire_ms, error = %e, "cannot claim a firing; retrying");
                return false;
            }
        };
        t.cursor = won.fire_ms;
        t.settled = false;
        if let Outcome::Fired { conversation, .. } = &won.outcome {
            t.previous = Some(*conversation);
        }
        if let Err(e) = self.finish(&t.schedule, &won).await {
            warn!(schedule = %id, fire_ms = won.fire_ms, error = %e, "cannot finish a firing; retrying");
            return false;
        }
        // Told before the firing counts as settled: a holder that dies first leaves it
        // unsettled, and whoever finishes it tells (create-only: once while it waits).
        if let Some(notifier) = &self.notifier {
            let message = firing_message(&t.schedule, &won);
            if let Err(e) = notifier
                .firing(&t.schedule.tenant, &t.schedule.owner, message)
                .await
            {
                warn!(schedule = %id, fire_ms = won.fire_ms, error = %e, "cannot tell subscribers of a firing; retrying");
                return false;
            }
        }
        t.settled = true;
        metrics::counter!("turnpike_schedule_firings_total", "outcome" => outcome_name(&won.outcome)).increment(1);
        if matches!(won.outcome, Outcome::Fired { .. }) {
            let lag = now_ms().saturating_sub(won.fire_ms + t.schedule.jitter_of(won.fire_ms));
            metrics::histogram!("turnpike_schedule_firing_lag_seconds").record(lag as f64 / 1000.0);
        }
        t.unpruned = t.unpruned.saturating_add(1);
        if t.unpruned >= 16 {
            match self.schedules.prune(id).await {
                Ok(()) => t.unpruned = 0,
                Err(e) => debug!(schedule = %id, error = %e, "cannot prune old firings"),
            }
        }
        true
    }

    /// Sees a claimed firing through: for a fired one, the stop (if any), the conversation (a
    /// new one, or an app-wide schedule's standing one, is made as the claim names it) and the
    /// message, each only if not there yet.
    async fn finish(&self, s: &Schedule, firing: &Firing) -> crate::error::Result<()> {
        let Outcome::Fired {
            conversation,
            event,
            lane_after,
            stop,
            ..
        } = &firing.outcome
        else {
            return Ok(());
        };
        // Seen through before (by this holder or another): nothing more, however long ago —
        // the lane may have let the event go since (its age limit).
        if self.schedules.is_done(s.id, firing.fire_ms).await? {
            return Ok(());
        }
        // The message is on the lane: so is the stop that went before it.
        let published = self
            .ingress
            .find_on_lane(*conversation, *lane_after, *event)
            .await?
            .is_some();
        if published {
            self.schedules.mark_done(s.id, firing.fire_ms).await?;
            return Ok(());
        }
        if let Some(previous) = stop {
            let stopped = self
                .ingress
                .submit(
                    &s.tenant,
                    &s.owner,
                    *previous,
                    EventBody::Stop {
                        reason: Some(format!("schedule {} fires again", s.id)),
                    },
                    Some(format!("{}:stop", firing_key(s.id, firing.fire_ms))),
                )
                .await;
            if let Err(e) = stopped {
                // A conversation closed or deleted since has nothing to stop.
                debug!(schedule = %s.id, error = %e, "the previous firing's turn was not stopped");
            }
        }
        // A standing conversation is made by the first firing that finds it missing: an
        // app-wide schedule's. (A user's schedule names one of theirs, made already; deleted,
        // its tombstone keeps it from being made again, and the firing is refused below.)
        let make = match s.target {
            Target::New => true,
            Target::Same { conversation } => {
                match self
                    .conversations
                    .directory()
                    .lookup_unchecked(conversation)
                    .await
                {
                    Ok(_) => false,
                    Err(e) if e.kind() == turnpike_artifactory::ErrorKind::NotFound => true,
                    Err(e) => return Err(e.into()),
                }
            }
        };
        if make {
            let made = self
                .conversations
                .ensure(
                    &self.signer,
                    *conversation,
                    NewConversation {
                        tenant: s.tenant.clone(),
                        owner: s.owner.clone(),
                        app: s.app.clone(),
                        agent: s.agent.clone(),
                        at_ms: firing.claimed_ms,
                        instructions: None,
                        started_by: Some(turnpike_schemas::Origin::Schedule {
                            schedule: s.id,
                            fire_ms: firing.fire_ms,
                        }),
                    },
                )
                .await;
            match made {
                Ok(_) => {}
                // A standing conversation deleted (or its id taken): refused for good, the
                // firing is over.
                Err(e)
                    if matches!(s.target, Target::Same { .. })
                        && matches!(
                            e.kind(),
                            turnpike_artifactory::ErrorKind::NotFound
                                | turnpike_artifactory::ErrorKind::AlreadyExists
                        ) =>
                {
                    warn!(schedule = %s.id, fire_ms = firing.fire_ms, error = %e, "a firing's conversation cannot be made");
                    self.schedules.mark_done(s.id, firing.fire_ms).await?;
                    return Ok(());
                }
                Err(e) => return Err(e.into()),
            }
            self.failpoints
                .hit(
                    "schedule-conversation",
                    format!("{} {}", s.id, firing.fire_ms),
                )
                .await;
        }
        // Not on the lane (looked for above): publish it, the same event under the same key.
        let sent = self
            .ingress
            .submit_as(
                &s.tenant,
                &s.owner,
                *conversation,
                EventBody::Message {
                    text: s.text.clone(),
                },
                turnpike_router::Trigger {
                    id: *event,
                    key: firing_key(s.id, firing.fire_ms),
                    origin: turnpike_schemas::Origin::Schedule {
                        schedule: s.id,
                        fire_ms: firing.fire_ms,
                    },
                },
            )
            .await;
        let outcome: crate::error::Result<()> = match sent {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    turnpike_router::ErrorKind::Closed
                        | turnpike_router::ErrorKind::NotFound
                        | turnpike_router::ErrorKind::BudgetSpent
                        | turnpike_router::ErrorKind::Invalid
                ) =>
            {
                // Refused for good (the conversation closed or went, a budget is spent): the
                // firing is over; the next one tries again.
                warn!(schedule = %s.id, fire_ms = firing.fire_ms, error = %e, "a firing's message was refused");
                Ok(())
            }
            Err(e) => Err(e.into()),
        };
        outcome?;
        self.schedules.mark_done(s.id, firing.fire_ms).await?;
        Ok(())
    }
}

/// The `schedule.firing` message of a decided firing (its id fixed by schedule and fire time).
fn firing_message(s: &Schedule, f: &Firing) -> turnpike_artifactory::webhooks::Message {
    use sha2::Digest as _;
    let key = format!("firing\0{}\0{}", s.id, f.fire_ms);
    let mut data = serde_json::json!({
        "tenant": s.tenant.to_string(),
        "app": s.app.to_string(),
        "agent": s.agent.to_string(),
        "schedule": s.id.to_string(),
        "fire_ms": f.fire_ms,
        "outcome": outcome_name(&f.outcome),
    });
    let fields = data.as_object_mut().expect("an object");
    match &f.outcome {
        Outcome::Fired {
            conversation,
            event,
            missed,
            ..
        } => {
            fields.insert("conversation".into(), conversation.to_string().into());
            fields.insert("event".into(), event.to_string().into());
            fields.insert("missed".into(), (*missed).into());
        }
        Outcome::Skipped { reason } => {
            fields.insert("reason".into(), reason.clone().into());
        }
        Outcome::Missed { count } => {
            fields.insert("missed".into(), (*count).into());
        }
    }
    turnpike_artifactory::webhooks::Message {
        id: format!("msg_{}", &hex::encode(sha2::Sha256::digest(key))[..32]),
        kind: turnpike_schemas::webhook::EventKind::ScheduleFiring,
        at_ms: f.claimed_ms,
        data,
    }
}

/// When the schedule's next firing is due, jitter included (`u64::MAX`: never), remembered
/// until its cursor or definition changes.
fn due_at(t: &mut Tracked) -> u64 {
    *t.due_at.get_or_insert_with(|| {
        let s = &t.schedule;
        s.next_after(t.cursor.max(s.created_ms))
            .map_or(u64::MAX, |next| next + s.jitter_of(next))
    })
}

fn outcome_name(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Fired { .. } => "fired",
        Outcome::Skipped { .. } => "skipped",
        Outcome::Missed { .. } => "missed",
    }
}

/// How many schedules of a shard fire at once.
const FIRING_CONCURRENCY: usize = 32;

/// The most firings looked at in one go (a schedule down for long, firing each second).
const MAX_DUE: usize = 100_000;

/// The fire times after `cursor` (and after the schedule's creation) that are due at `now`
/// (jitter included), oldest first.
pub fn due_firings(s: &Schedule, cursor: u64, now: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut after = cursor.max(s.created_ms);
    while out.len() < MAX_DUE {
        let Some(next) = s.next_after(after) else {
            break;
        };
        if next + s.jitter_of(next) > now {
            break;
        }
        out.push(next);
        after = next;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnpike_artifactory::schedules::Timing;

    fn every_second() -> Schedule {
        Schedule {
            id: ScheduleId::new(),
            tenant: "acme".parse().unwrap(),
            owner: "u:alice".parse().unwrap(),
            app: "demo".parse().unwrap(),
            agent: "echo".parse().unwrap(),
            timing: Timing::Every { every_ms: 1_000 },
            target: Target::New,
            text: "tick".into(),
            missed: Missed::Skip,
            overlap: Overlap::Queue,
            jitter_ms: 0,
            grace_ms: 60_000,
            paused: false,
            created_ms: 10_000,
            updated_ms: 10_000,
        }
    }

    #[test]
    fn due_firings_start_after_the_cursor_and_stop_at_now() {
        let s = every_second();
        assert!(due_firings(&s, 0, 10_999).is_empty());
        assert_eq!(due_firings(&s, 0, 13_500), [11_000, 12_000, 13_000]);
        assert_eq!(due_firings(&s, 12_000, 13_500), [13_000]);
        assert!(due_firings(&s, 13_000, 13_999).is_empty());
    }

    #[test]
    fn shard_keys_are_distinct_and_no_conversation_minted_now_has_one() {
        let keys: std::collections::HashSet<_> = (0..SHARDS)
            .map(|s| crate::shards::shard_key(SHARD_TAG, s))
            .collect();
        assert_eq!(keys.len(), SHARDS as usize);
        assert!(keys.iter().all(|k| k.ulid().timestamp_ms() == 0));
        assert!(ConversationId::new().ulid().timestamp_ms() > 0);
    }
}
