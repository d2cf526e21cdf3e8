//! Fair share between tenants (DESIGN step 2, invariant 13): when the pool is full, a burst of
//! one tenant delays that tenant, not the others; a tenant's cap on running turns holds.
//!
//! The bounds are counts, not times: how many of the bursting tenant's turns started after the
//! other tenant's message was accepted and before its turn started. First come, first served
//! would start the whole burst first.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use turnpike_artifactory::{ConversationPrefix, Conversations, NewConversation, Record};
use turnpike_router::bus::Bus;
use turnpike_router::embedded::{EmbeddedBus, EmbeddedConfig};
use turnpike_router::Ingress;
use turnpike_schemas::{ConversationId, EntryBody, EventBody, Identity, TenantId};
use turnpike_tests::fixtures::signer;
use turnpike_tests::fleet::Fleet;
use turnpike_worker::fair::FairShare;
use turnpike_worker::{Apps, Worker, WorkerConfig, WorkerPool};

const LONG: Duration = Duration::from_secs(240);

fn tenant(name: &str) -> TenantId {
    name.parse().unwrap()
}

fn user(tenant: &str) -> Identity {
    format!("oidc:{tenant}:u-1").parse().unwrap()
}

/// Creates `n` conversations of `tenant` (app `fair`, agent `slow`).
async fn conversations_of(
    conversations: &Conversations,
    name: &str,
    n: usize,
) -> Vec<ConversationId> {
    let mut out = Vec::new();
    for _ in 0..n {
        let (entry, _, _) = conversations
            .create(
                &signer(),
                NewConversation {
                    tenant: tenant(name),
                    owner: user(name),
                    app: "fair".parse().unwrap(),
                    agent: "slow".parse().unwrap(),
                    at_ms: 1,
                    instructions: None,
                    started_by: None,
                },
            )
            .await
            .unwrap();
        out.push(entry.conversation);
    }
    out
}

/// One message to each conversation of `name`, all at once; returns when every one is accepted.
async fn burst(
    bus: &Arc<dyn Bus>,
    conversations: &Conversations,
    name: &str,
    convs: &[ConversationId],
) {
    let ingress = Ingress::new(bus.clone(), conversations.clone());
    let sends = convs.iter().map(|conv| {
        let ingress = ingress.clone();
        let conv = *conv;
        async move {
            ingress
                .submit(
                    &tenant(name),
                    &user(name),
                    conv,
                    EventBody::Message { text: "go".into() },
                    Some(format!("go-{conv}")),
                )
                .await
                .unwrap();
        }
    });
    futures::future::join_all(sends).await;
}

/// An agent that takes `delay` per turn and notes when each turn ran.
struct Timed {
    delay: Duration,
    ran: Mutex<Vec<Ran>>,
}

#[async_trait]
impl turnpike_worker::App for Timed {
    async fn on_reactive_event(
        &self,
        turn: &dyn turnpike_agent::Turn,
    ) -> turnpike_agent::Result<turnpike_schemas::entry::TurnOutcome> {
        let start = Instant::now();
        tokio::time::sleep(self.delay).await;
        self.ran
            .lock()
            .unwrap()
            .push((turn.conversation(), start, Instant::now()));
        Ok(turnpike_schemas::entry::TurnOutcome::Replied)
    }
}

struct Embedded {
    dir: tempfile::TempDir,
    bus: Arc<dyn Bus>,
    conversations: Conversations,
}

fn embedded() -> Embedded {
    let dir = tempfile::tempdir().unwrap();
    let bus: Arc<dyn Bus> =
        EmbeddedBus::open(&dir.path().join("bus.redb"), EmbeddedConfig::default()).unwrap();
    let conversations = Conversations::new(
        turnpike_artifactory::open_store(dir.path().join("store").to_str().unwrap()).unwrap(),
    );
    Embedded {
        dir,
        bus,
        conversations,
    }
}

fn workers(
    e: &Embedded,
    agent: &Arc<Timed>,
    n: usize,
    slots: usize,
    fair: FairShare,
) -> WorkerPool {
    WorkerPool::start((0..n).map(|_| {
        Worker::new(
            e.bus.clone(),
            e.conversations.clone(),
            signer(),
            Arc::new(Apps::new().with_fallback(agent.clone())),
            WorkerConfig {
                slots,
                fair: fair.clone(),
                workspace_root: e.dir.path().join("workspaces"),
                ..WorkerConfig::default()
            },
        )
    }))
}

/// A turn that ran: its conversation, when it started and when it ended.
type Ran = (ConversationId, Instant, Instant);

/// How many turns of conversations other than `b` started after `accepted` (B's message
/// accepted) and before `b`'s turn.
fn started_before(ran: &[Ran], b: ConversationId, accepted: Instant) -> usize {
    let b_start = ran.iter().find(|(c, _, _)| *c == b).unwrap().1;
    ran.iter()
        .filter(|(c, start, _)| *c != b && *start > accepted && *start < b_start)
        .count()
}

/// Each of `conversations` conversations had exactly one turn: nothing lost or run twice.
fn each_ran_once(ran: &[Ran], conversations: usize) {
    let mut runs: HashMap<ConversationId, usize> = HashMap::new();
    for (c, _, _) in ran {
        *runs.entry(*c).or_default() += 1;
    }
    assert_eq!(runs.len(), conversations);
    assert!(runs.values().all(|n| *n == 1), "{runs:?}");
}

/// Waits until the bus has no wake left unsettled.
async fn until_settled(bus: &Arc<dyn Bus>) {
    turnpike_tests::wait::until(LONG, "every wake settled", || async {
        (bus.unsettled().await.unwrap() == Some(0)).then_some(())
    })
    .await
}

async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + LONG;
    while !check() {
        assert!(Instant::now() < deadline, "{what}: not within {LONG:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Tenant A sends one message to each of 60 conversations; right after, tenant B sends one.
/// Two workers of two slots, 200 ms a turn: A's burst is 15 turn times of work. B's turn
/// starts before at most two turn times' worth of A's (8 turns on 4 slots); first come, first
/// served would start all 56 still waiting first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_one_tenant_does_not_hold_back_another_tenants_turn_on_the_embedded_bus() {
    let e = embedded();
    let a = conversations_of(&e.conversations, "alpha", 60).await;
    let b = conversations_of(&e.conversations, "beta", 1).await;
    let agent = Arc::new(Timed {
        delay: Duration::from_millis(200),
        ran: Mutex::new(Vec::new()),
    });
    let pool = workers(&e, &agent, 2, 2, FairShare::default());
    burst(&e.bus, &e.conversations, "alpha", &a).await;
    burst(&e.bus, &e.conversations, "beta", &b).await;
    let b_accepted = Instant::now();
    until("every turn ran", || agent.ran.lock().unwrap().len() == 61).await;
    pool.stop().await;
    let ran = agent.ran.lock().unwrap().clone();
    let a_before_b = started_before(&ran, b[0], b_accepted);
    assert!(
        a_before_b <= 8,
        "{a_before_b} of A's turns started after B's message was accepted and before B's turn"
    );
    // Nothing was lost or run twice.
    each_ran_once(&ran, 61);
}

/// A cap of 2 running turns for tenant A on a worker of 8 slots: never more than 2 of A's turns
/// at once, while tenant B (no cap) runs more than 2 at once beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_cap_on_running_turns_holds_and_leaves_the_other_slots_to_others() {
    let e = embedded();
    let a = conversations_of(&e.conversations, "alpha", 12).await;
    let b = conversations_of(&e.conversations, "beta", 4).await;
    let agent = Arc::new(Timed {
        delay: Duration::from_millis(300),
        ran: Mutex::new(Vec::new()),
    });
    let fair = FairShare::parse(&[], &["alpha=2".into()]).unwrap();
    let pool = workers(&e, &agent, 1, 8, fair);
    burst(&e.bus, &e.conversations, "alpha", &a).await;
    burst(&e.bus, &e.conversations, "beta", &b).await;
    until("every turn ran", || agent.ran.lock().unwrap().len() == 16).await;
    pool.stop().await;
    let ran = agent.ran.lock().unwrap().clone();
    let most_at_once = |convs: &[ConversationId]| {
        let mut edges: Vec<(Instant, i32)> = ran
            .iter()
            .filter(|(c, _, _)| convs.contains(c))
            .flat_map(|(_, s, e)| [(*s, 1), (*e, -1)])
            .collect();
        // An end before a start at the same instant.
        edges.sort();
        let (mut now, mut most) = (0, 0);
        for (_, d) in edges {
            now += d;
            most = most.max(now);
        }
        most
    };
    assert!(most_at_once(&a) <= 2, "A ran {} at once", most_at_once(&a));
    assert_eq!(most_at_once(&a), 2, "the cap is reached, not undercut");
    assert!(most_at_once(&b) > 2, "B ran {} at once", most_at_once(&b));
}

/// The same burst on a fleet (JetStream, two worker processes of two slots, a scripted model
/// taking 200 ms) with one worker SIGKILLed during the burst: B's turn still starts before at
/// most a bounded number of A's, and every turn of both tenants completes exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_on_a_fleet_with_a_worker_killed_does_not_hold_back_another_tenant() {
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_turnpike"));
    let mut fleet = Fleet::start(&binary).await;
    let apps = tempfile::tempdir().unwrap();
    std::fs::write(
        apps.path().join("fair.toml"),
        "app = \"fair\"\n\n[agents.slow]\nprovider = \"script\"\nscript = \"slow.script.toml\"\n",
    )
    .unwrap();
    std::fs::write(
        apps.path().join("slow.script.toml"),
        "[[turn]]\n[[turn.step]]\ntext = \"done\"\ndelay_ms = 200\n",
    )
    .unwrap();
    fleet.apps = Some(apps.path().to_path_buf());
    let bus: Arc<dyn Bus> = fleet.bus.clone();
    let a = conversations_of(&fleet.conversations, "alpha", 60).await;
    let b = conversations_of(&fleet.conversations, "beta", 1).await;
    let (mut doomed, _) = fleet.worker(&["--slots", "2"]);
    let (_survivor, _) = fleet.worker(&["--slots", "2"]);
    burst(&bus, &fleet.conversations, "alpha", &a).await;
    // Killed during the burst, holding turns and wakes: its leases lapse, its wakes come back.
    until_dispatched(&fleet.conversations, &a, 4).await;
    doomed.kill();
    burst(&bus, &fleet.conversations, "beta", &b).await;
    let b_accepted = turnpike_router::bus::now_ms();
    let (_replacement, _) = fleet.worker(&["--slots", "2"]);
    let mut starts = HashMap::new();
    for conv in a.iter().chain(&b) {
        starts.insert(
            *conv,
            completed_once(&fleet.conversations, *conv, &tenant_of(&a, conv)).await,
        );
    }
    let b_start = starts[&b[0]];
    let a_before_b = a
        .iter()
        .filter(|c| starts[c] > b_accepted && starts[c] < b_start)
        .count();
    // Two turn times of the fleet's 4 slots, and the killed worker's turns taken over.
    assert!(
        a_before_b <= 12,
        "{a_before_b} of A's turns started after B's message was accepted and before B's turn"
    );
}

/// One worker of one slot, where every promotion hangs (a failpoint right after batch two):
/// each owner that owes its slot gives it up when its batch two commits, so the three
/// conversations' turns all complete (the last owner, owing nothing, keeps its slot). An owner
/// that kept its slot through the promotion would complete one turn, then hold the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_slot_goes_to_the_next_wake_when_batch_two_commits_not_after_the_promotion() {
    use turnpike_lifecycle::failpoints::Action;
    let e = embedded();
    let a = conversations_of(&e.conversations, "alpha", 2).await;
    let b = conversations_of(&e.conversations, "beta", 1).await;
    let (agent, pool) = one_slot_stalled_promotions(
        &e,
        Action::Hang,
        WorkerConfig {
            grace: Duration::from_millis(200),
            ..WorkerConfig::default()
        },
    );
    burst(&e.bus, &e.conversations, "alpha", &a).await;
    burst(&e.bus, &e.conversations, "beta", &b).await;
    for (name, conv) in [("alpha", a[0]), ("alpha", a[1]), ("beta", b[0])] {
        let record = record(&e.conversations, name, conv);
        let deadline = Instant::now() + LONG;
        loop {
            let state = record.head().await.unwrap().state().clone();
            if state.last_turn >= 1 && !state.turn_open {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{conv}: its turn never completed ({} turns ran): a slot is held through a promotion",
                agent.ran.lock().unwrap().len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert_eq!(agent.ran.lock().unwrap().len(), 3, "each turn ran once");
    pool.stop().await;
}

/// A worker stopped while an owner that gave up its slot is still promoting its turn waits
/// for that owner: its lease is released (free for any worker at once), not left to lapse.
/// The slot it gave up went to another tenant's stop, recorded at once, so no slot is held
/// when the worker stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_worker_waits_for_an_owner_that_gave_up_its_slot_to_release_its_lease() {
    use turnpike_lifecycle::failpoints::Action;
    let e = embedded();
    let a = conversations_of(&e.conversations, "alpha", 1).await;
    let b = conversations_of(&e.conversations, "beta", 1).await;
    let (_agent, pool) = one_slot_stalled_promotions(
        &e,
        Action::Pause(Duration::from_secs(3)),
        WorkerConfig {
            lease_ttl: Duration::from_secs(120),
            ..WorkerConfig::default()
        },
    );
    burst(&e.bus, &e.conversations, "alpha", &a).await;
    until_dispatched_of(&e.conversations, "alpha", &a, 1).await;
    // While A's turn runs, B stops a conversation with nothing running: it waits for the slot.
    Ingress::new(e.bus.clone(), e.conversations.clone())
        .submit(
            &tenant("beta"),
            &user("beta"),
            b[0],
            EventBody::Stop { reason: None },
            Some("stop".into()),
        )
        .await
        .unwrap();
    // B's stop recorded: A's owner gave the slot up after its batch two, and promotes (3 s).
    let b_record = record(&e.conversations, "beta", b[0]);
    let deadline = Instant::now() + LONG;
    while b_record.head().await.unwrap().state().lane_through < 1 {
        assert!(Instant::now() < deadline, "B's stop never recorded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let a_head = record(&e.conversations, "alpha", a[0])
        .head()
        .await
        .unwrap();
    assert!(a_head.state().last_turn >= 1 && !a_head.state().turn_open);
    pool.stop().await;
    let lease = e
        .bus
        .claim(
            a[0],
            turnpike_schemas::WorkerId::new(),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert!(lease.is_some(), "the stopped worker left A's lease held");
}

/// One worker of one slot (otherwise `config`), whose agent takes 300 ms a turn and whose
/// promotions stall at the `before-promotion` failpoint with `stall`.
fn one_slot_stalled_promotions(
    e: &Embedded,
    stall: turnpike_lifecycle::failpoints::Action,
    config: WorkerConfig,
) -> (Arc<Timed>, WorkerPool) {
    let agent = Arc::new(Timed {
        delay: Duration::from_millis(300),
        ran: Mutex::new(Vec::new()),
    });
    let worker = Worker::new(
        e.bus.clone(),
        e.conversations.clone(),
        signer(),
        Arc::new(Apps::new().with_fallback(agent.clone())),
        WorkerConfig {
            slots: 1,
            failpoints: turnpike_worker::Failpoints::default().with("before-promotion", stall),
            workspace_root: e.dir.path().join("workspaces"),
            ..config
        },
    );
    (agent, WorkerPool::start([worker]))
}

fn tenant_of(a: &[ConversationId], conv: &ConversationId) -> String {
    if a.contains(conv) { "alpha" } else { "beta" }.to_owned()
}

fn record(conversations: &Conversations, name: &str, conv: ConversationId) -> Record {
    conversations.record(ConversationPrefix::new(tenant(name), conv))
}

/// Waits until `n` of the conversations (of tenant alpha) have a turn dispatched.
async fn until_dispatched(conversations: &Conversations, convs: &[ConversationId], n: usize) {
    until_dispatched_of(conversations, "alpha", convs, n).await
}

/// Waits until `n` of the conversations of tenant `name` have a turn dispatched.
async fn until_dispatched_of(
    conversations: &Conversations,
    name: &str,
    convs: &[ConversationId],
    n: usize,
) {
    let deadline = Instant::now() + LONG;
    loop {
        let mut dispatched = 0;
        for conv in convs {
            let head = record(conversations, name, *conv).head().await.unwrap();
            if head.state().last_turn > 0 || head.state().turn_open {
                dispatched += 1;
            }
        }
        if dispatched >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{n} turns not dispatched within {LONG:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the conversation's one turn is complete; checks it ran once (one dispatch, or
/// a dispatch and its recovery under the same turn id) and returns when it was first
/// dispatched.
async fn completed_once(conversations: &Conversations, conv: ConversationId, name: &str) -> u64 {
    let record = record(conversations, name, conv);
    let deadline = Instant::now() + LONG;
    loop {
        let head = record.head().await.unwrap();
        if head.state().last_turn >= 1 && !head.state().turn_open {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{conv}: no complete turn within {LONG:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let entries = record.entries().await.unwrap();
    let dispatched: Vec<_> = entries
        .iter()
        .filter_map(|e| match &e.body {
            EntryBody::TurnDispatched(d) => Some(d.clone()),
            _ => None,
        })
        .collect();
    let complete = entries
        .iter()
        .filter(|e| matches!(e.body, EntryBody::TurnComplete(_)))
        .count();
    let messages = entries
        .iter()
        .filter(|e| matches!(e.body, EntryBody::UserMessage(_)))
        .count();
    assert_eq!((messages, complete), (1, 1), "{conv}: {entries:#?}");
    assert!(
        dispatched.iter().all(|d| d.turn == dispatched[0].turn),
        "{conv}: one turn, retried under its own id at most: {dispatched:#?}"
    );
    dispatched[0].at_ms
}

/// An agent that holds its first conversation's turn until let go; any other turn is at once.
struct Gated {
    first: ConversationId,
    gate: tokio::sync::Semaphore,
    ran: Mutex<Vec<ConversationId>>,
}

#[async_trait]
impl turnpike_worker::App for Gated {
    async fn on_reactive_event(
        &self,
        turn: &dyn turnpike_agent::Turn,
    ) -> turnpike_agent::Result<turnpike_schemas::entry::TurnOutcome> {
        if turn.conversation() == self.first {
            let _ = self.gate.acquire().await.map(|p| p.forget());
        }
        self.ran.lock().unwrap().push(turn.conversation());
        Ok(turnpike_schemas::entry::TurnOutcome::Replied)
    }
}

/// Ten events reach a lane while its first wake waits for the one slot: the nine later wakes
/// ride with the first and go to its owner. None is put off and delivered again — each of the
/// eleven wakes is taken off the bus once — and every event is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lanes_later_wakes_ride_with_its_first_and_are_taken_off_the_bus_once() {
    let e = embedded();
    let counting = turnpike_tests::counting_bus::CountingBus::new(e.bus.clone());
    let bus: Arc<dyn Bus> = counting.clone();
    let convs = conversations_of(&e.conversations, "alpha", 2).await;
    let (busy, lane) = (convs[0], convs[1]);
    let agent = Arc::new(Gated {
        first: busy,
        gate: tokio::sync::Semaphore::new(0),
        ran: Mutex::new(Vec::new()),
    });
    let pool = WorkerPool::start([Worker::new(
        bus.clone(),
        e.conversations.clone(),
        signer(),
        Arc::new(Apps::new().with_fallback(agent.clone())),
        WorkerConfig {
            slots: 1,
            // A wake waits for the slot up to a second before it is handed back.
            busy_delay: Duration::from_secs(1),
            workspace_root: e.dir.path().join("workspaces"),
            ..WorkerConfig::default()
        },
    )]);
    burst(&bus, &e.conversations, "alpha", &[busy]).await;
    until_dispatched(&e.conversations, &[busy], 1).await;
    let ingress = Ingress::new(bus.clone(), e.conversations.clone());
    let sends = (0..10).map(|i| {
        let ingress = ingress.clone();
        async move {
            ingress
                .submit(
                    &tenant("alpha"),
                    &user("alpha"),
                    lane,
                    EventBody::Message {
                        text: format!("m{i}"),
                    },
                    Some(format!("m{i}")),
                )
                .await
                .unwrap()
                .1
                .seq
        }
    });
    // All at once: the first wake is queued a moment before the slot is let go, well within
    // the second a waiting wake may wait here.
    let last = futures::future::join_all(sends)
        .await
        .into_iter()
        .max()
        .unwrap();
    until("the lane's wakes taken off the bus", || {
        counting.wakes() >= 11
    })
    .await;
    agent.gate.add_permits(1);
    let record = record(&e.conversations, "alpha", lane);
    let deadline = Instant::now() + LONG;
    loop {
        let state = record.head().await.unwrap().state().clone();
        if state.lane_through >= last && !state.turn_open {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the lane's events never answered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every wake settled (one put off would be delivered again, and counted, first).
    until_settled(&bus).await;
    assert_eq!(
        counting.wakes(),
        11,
        "a wake was put off and delivered again (ran: {:?})",
        agent.ran.lock().unwrap()
    );
    pool.stop().await;
}

/// A lone worker of two slots (it hears no other) keeps a burst of 30 conversations waiting —
/// fifteen times its slots, within the sixteen times it keeps — and puts none of them off:
/// each of the 31 wakes is taken off the bus once, though the last wait longer than the bus's
/// ack wait (kept in progress meanwhile, not redelivered). Another tenant's message, sent after
/// the burst, still starts in the next free slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_worker_keeps_a_burst_waiting_without_putting_it_off_and_another_tenant_goes_next() {
    let dir = tempfile::tempdir().unwrap();
    let embedded = EmbeddedBus::open(
        &dir.path().join("bus.redb"),
        EmbeddedConfig {
            ack_wait: Duration::from_millis(1500),
            ..EmbeddedConfig::default()
        },
    )
    .unwrap();
    let counting = turnpike_tests::counting_bus::CountingBus::new(embedded);
    let bus: Arc<dyn Bus> = counting.clone();
    let conversations = Conversations::new(
        turnpike_artifactory::open_store(dir.path().join("store").to_str().unwrap()).unwrap(),
    );
    let a = conversations_of(&conversations, "alpha", 30).await;
    let b = conversations_of(&conversations, "beta", 1).await;
    let agent = Arc::new(Timed {
        delay: Duration::from_millis(150),
        ran: Mutex::new(Vec::new()),
    });
    let worker = Worker::new(
        bus.clone(),
        conversations.clone(),
        signer(),
        Arc::new(Apps::new().with_fallback(agent.clone())),
        WorkerConfig {
            slots: 2,
            workspace_root: dir.path().join("workspaces"),
            ..WorkerConfig::default()
        },
    );
    let pool = WorkerPool::start([worker.clone()]);
    until("the worker counted itself alone", || worker.alone()).await;
    burst(&bus, &conversations, "alpha", &a).await;
    burst(&bus, &conversations, "beta", &b).await;
    let b_accepted = Instant::now();
    until("every turn ran", || agent.ran.lock().unwrap().len() == 31).await;
    until_settled(&bus).await;
    pool.stop().await;
    let ran = agent.ran.lock().unwrap().clone();
    // 30 turns of 150 ms on 2 slots: the last of A's started past the bus's ack wait.
    let last_start = ran.iter().map(|(_, start, _)| *start).max().unwrap();
    assert!(last_start.duration_since(b_accepted) > Duration::from_millis(1500));
    assert_eq!(
        counting.wakes(),
        31,
        "a wake was put off, given back or redelivered"
    );
    let a_before_b = started_before(&ran, b[0], b_accepted);
    // At most two turn times' worth (first come, first served: all 28 still waiting).
    assert!(
        a_before_b <= 4,
        "{a_before_b} of A's turns started after B's message was accepted and before B's turn"
    );
    each_ran_once(&ran, 31);
}
