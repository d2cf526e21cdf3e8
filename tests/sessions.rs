//! Sessions: schedules fire messages into lanes with nobody typing, each firing once across a
//! fleet, with missed-firing and overlap policies; the API and `turnpike schedule` show them.
//!
//! The checks count: every tick of a schedule is accounted for exactly once (a fired firing's
//! event is on its lane once, a missed claim stands for the firings it says), whatever was
//! killed or stopped.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;
use turnpike_artifactory::schedules::{Firing, Missed, Outcome, Overlap, Schedule, Target, Timing};
use turnpike_artifactory::{ConversationPrefix, Conversations, Schedules};
use turnpike_router::bus::{now_ms, Bus};
use turnpike_schemas::{ConversationId, EntryBody, EventBody, ScheduleId};
use turnpike_tests::edge::{Server, ALICE, ALICE_OF_BETA, BOB};
use turnpike_tests::fixtures::{owner, tenant};
use turnpike_tests::fleet::Fleet;
use turnpike_tests::lanes::create_conversations;
use turnpike_tests::turns::{Rig, RigOptions};

const LONG: Duration = Duration::from_secs(120);

/// A reply at once, every turn.
const QUICK: &str = "[[turn]]\n[[turn.step]]\ntext = \"done\"\n";

/// A turn that outlasts a one-second interval.
const SLOW: &str = "[[turn]]\n[[turn.step]]\ntext = \"done\"\ndelay_ms = 2500\n";

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_turnpike"))
}

/// A schedule of the fixture owner firing every second into `target` (app `support`, agent
/// `helper`: the rig's).
fn every_second(target: Target, missed: Missed, overlap: Overlap, grace_ms: u64) -> Schedule {
    let now = now_ms();
    Schedule {
        id: ScheduleId::new(),
        tenant: tenant(),
        owner: owner(),
        app: "support".parse().unwrap(),
        agent: "helper".parse().unwrap(),
        timing: Timing::Every { every_ms: 1_000 },
        target,
        text: "the hourly report".into(),
        missed,
        overlap,
        jitter_ms: 0,
        grace_ms,
        paused: false,
        created_ms: now,
        updated_ms: now,
    }
}

/// Every kept claim of a schedule, oldest first.
async fn claims(schedules: &Schedules, id: ScheduleId) -> Vec<Firing> {
    let mut all = schedules.recent(id, usize::MAX).await.unwrap();
    all.reverse();
    all
}

/// Waits until `done` holds for the schedule's claims.
async fn until_claims(
    schedules: &Schedules,
    id: ScheduleId,
    what: &str,
    done: impl Fn(&[Firing]) -> bool,
) -> Vec<Firing> {
    let deadline = Instant::now() + LONG;
    loop {
        let all = claims(schedules, id).await;
        if done(&all) {
            return all;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {LONG:?}; claims: {all:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The schedule's claims once it is paused and settled: no new claim for two intervals and a
/// little more (the pause is seen at the holder's next listing, within a second).
async fn settled_claims(schedules: &Schedules, id: ScheduleId) -> Vec<Firing> {
    let mut count = claims(schedules, id).await.len();
    loop {
        tokio::time::sleep(Duration::from_millis(2_100)).await;
        let now = claims(schedules, id).await.len();
        if now == count {
            let all = claims(schedules, id).await;
            // The latest claim seen through too (a claim is made before its message is
            // published; each earlier one was finished before the next was claimed).
            if let Some(last) = all.last() {
                if matches!(last.outcome, Outcome::Fired { .. }) {
                    let deadline = Instant::now() + LONG;
                    while !schedules.is_done(id, last.fire_ms).await.unwrap() {
                        assert!(
                            Instant::now() < deadline,
                            "{id}: {} never done",
                            last.fire_ms
                        );
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            return all;
        }
        count = now;
    }
}

/// How many firings a claim stands for: a fired one itself and the missed ones it stands for,
/// a missed one its count, a skipped one itself.
fn stands_for(f: &Firing) -> u64 {
    match &f.outcome {
        Outcome::Fired { missed, .. } => 1 + missed,
        Outcome::Missed { count } => *count,
        Outcome::Skipped { .. } => 1,
    }
}

/// The conversation and event of a fired firing.
fn fired(f: &Firing) -> (ConversationId, turnpike_schemas::EventId) {
    match &f.outcome {
        Outcome::Fired {
            conversation,
            event,
            ..
        } => (*conversation, *event),
        other => panic!("not fired: {other:?} ({f:?})"),
    }
}

/// The events on a lane, in order.
async fn lane_events(bus: &dyn Bus, conversation: ConversationId) -> Vec<turnpike_schemas::Event> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = bus.read_lane(conversation, after, None, 500).await.unwrap();
        let Some(last) = page.last() else { break };
        after = last.seq;
        out.extend(page.into_iter().map(|m| m.event));
    }
    out
}

/// The lane's events once `event` is among them (a claim is made before its message is
/// published: the latest claim's message may still be on its way).
async fn lane_events_with(
    bus: &dyn Bus,
    conversation: ConversationId,
    event: turnpike_schemas::EventId,
) -> Vec<turnpike_schemas::Event> {
    let deadline = Instant::now() + LONG;
    loop {
        let events = lane_events(bus, conversation).await;
        if events.iter().any(|e| e.id == event) {
            return events;
        }
        assert!(
            Instant::now() < deadline,
            "event {event} not on the lane of {conversation} within {LONG:?}: {events:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts that the claims after `after_ms` account for every tick once: consecutive claims
/// are as far apart as the firings between them that the later one stands for.
fn assert_every_tick_once(all: &[Firing], after_ms: u64) {
    let mut last = after_ms;
    for f in all.iter().filter(|f| f.fire_ms > after_ms) {
        let ticks = (f.fire_ms - last) / 1_000;
        assert_eq!(
            (f.fire_ms - last) % 1_000,
            0,
            "fire times are whole intervals apart"
        );
        assert_eq!(
            ticks,
            stands_for(f),
            "the claim at {} stands for {} firings but follows the previous by {ticks}: {all:#?}",
            f.fire_ms,
            stands_for(f)
        );
        last = f.fire_ms;
    }
}

/// The fleet (here: the rig's one worker) stopped for several ticks, then started: each
/// missed-firing policy does what it says, and every tick is accounted for once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn firings_missed_while_the_workers_were_down_follow_each_policy() {
    let mut options = RigOptions::new(QUICK);
    options.lease_ttl = Duration::from_secs(1);
    options.schedules = true;
    let mut rig = Rig::with(options).await;
    let schedules = Schedules::new(rig.conversations.store().clone());
    let grace = 1_500;
    let policies = [Missed::Skip, Missed::Latest, Missed::All { cap: 2 }];
    let mut made = Vec::new();
    for missed in policies {
        let s = every_second(Target::New, missed, Overlap::Queue, grace);
        schedules.put(&s).await.unwrap();
        made.push(s);
    }
    let mut before = HashMap::new();
    for s in &made {
        let all = until_claims(&schedules, s.id, "a first firing", |c| !c.is_empty()).await;
        assert!(matches!(all[0].outcome, Outcome::Fired { missed: 0, .. }));
        before.insert(s.id, all.last().unwrap().fire_ms);
    }
    rig.pause().await;
    let mut stopped = HashMap::new();
    for s in &made {
        stopped.insert(s.id, claims(&schedules, s.id).await.last().unwrap().fire_ms);
    }
    // The scenario: nothing runs for six ticks (this is the outage, not a synchronisation);
    // at least four of them are later than the grace when the worker is back.
    tokio::time::sleep(Duration::from_millis(6_000)).await;
    rig.run();
    let restarted = now_ms();
    for s in &made {
        let all = until_claims(&schedules, s.id, "firing on time again", |c| {
            c.last().is_some_and(|f| f.fire_ms >= restarted + 1_000)
        })
        .await;
        assert_every_tick_once(&all, all[0].fire_ms);
        let after: Vec<&Firing> = all.iter().filter(|f| f.fire_ms > stopped[&s.id]).collect();
        match s.missed {
            Missed::Skip => {
                let Outcome::Missed { count } = after[0].outcome else {
                    panic!("skip: the first claim after the outage is not missed: {after:#?}")
                };
                assert!(count >= 3, "six ticks down, {count} missed");
                assert!(after[1..]
                    .iter()
                    .all(|f| matches!(f.outcome, Outcome::Fired { missed: 0, .. })));
            }
            Missed::Latest => {
                let Outcome::Fired { missed, .. } = after[0].outcome else {
                    panic!("latest: the first claim after the outage did not fire: {after:#?}")
                };
                assert!(missed >= 2, "latest fired one for {missed} more");
                assert!(
                    after[0].fire_ms + grace < after[0].claimed_ms,
                    "the one fired was late"
                );
            }
            Missed::All { .. } => {
                let Outcome::Missed { count } = after[0].outcome else {
                    panic!("all (cap 2): the oldest are missed first: {after:#?}")
                };
                assert!(count >= 1);
                for late in &after[1..3] {
                    assert!(matches!(late.outcome, Outcome::Fired { missed: 0, .. }));
                    assert!(
                        late.fire_ms + grace < late.claimed_ms,
                        "the capped catch-up fires late firings: {after:#?}"
                    );
                }
            }
        }
        // A new conversation per firing, its message on its lane once, answered.
        for f in &all {
            if let Outcome::Fired {
                conversation,
                event,
                ..
            } = &f.outcome
            {
                let events = lane_events_with(rig.bus.as_ref(), *conversation, *event).await;
                assert_eq!(
                    events.iter().filter(|e| e.id == *event).count(),
                    1,
                    "{conversation}"
                );
                assert_eq!(events.len(), 1);
            }
        }
    }
}

/// The overlap policies, each with a turn (2.5 s) that outlasts the interval (1 s), into one
/// standing conversation each: skip records skips, queue fires every time, cancel stops the
/// running turn before it fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_policies_hold_with_a_turn_that_outlasts_the_interval() {
    let mut options = RigOptions::new(SLOW);
    options.lease_ttl = Duration::from_secs(2);
    options.schedules = true;
    let rig = Rig::with(options).await;
    let schedules = Schedules::new(rig.conversations.store().clone());
    let convs =
        create_conversations(&rig.conversations, &turnpike_tests::fixtures::signer(), 3).await;
    let mut made = Vec::new();
    for (overlap, conversation) in [Overlap::Skip, Overlap::Queue, Overlap::Cancel]
        .into_iter()
        .zip(convs.iter().copied())
    {
        let s = every_second(
            Target::Same { conversation },
            Missed::Latest,
            overlap,
            60_000,
        );
        schedules.put(&s).await.unwrap();
        made.push(s);
    }
    for s in &made {
        until_claims(&schedules, s.id, "six claims", |c| c.len() >= 6).await;
    }
    for s in &mut made {
        s.paused = true;
        schedules.put(s).await.unwrap();
    }
    for (s, conversation) in made.iter().zip(&convs) {
        // Settled: the pause seen (no claim for two intervals) and every fired message taken.
        let all = settled_claims(&schedules, s.id).await;
        assert_every_tick_once(&all, all[0].fire_ms);
        let fired: Vec<&Firing> = all
            .iter()
            .filter(|f| matches!(f.outcome, Outcome::Fired { .. }))
            .collect();
        let skipped = all.len() - fired.len();
        let events = lane_events(rig.bus.as_ref(), *conversation).await;
        let messages: Vec<_> = events
            .iter()
            .filter(|e| matches!(e.body, EventBody::Message { .. }))
            .collect();
        // Each fired firing's message is on the lane once; nothing else of the schedule's.
        let keys: BTreeSet<_> = messages
            .iter()
            .map(|e| e.idempotency_key.clone().unwrap())
            .collect();
        assert_eq!(keys.len(), messages.len(), "a message twice");
        assert_eq!(messages.len(), fired.len(), "{:?}", s.overlap);
        let stops = fired
            .iter()
            .filter(|f| matches!(f.outcome, Outcome::Fired { stop: Some(_), .. }))
            .count();
        let record = rig
            .conversations
            .record(ConversationPrefix::new(tenant(), *conversation));
        match s.overlap {
            Overlap::Skip => {
                assert!(skipped >= 2, "skip: {skipped} skipped of {}", all.len());
                assert_eq!(stops, 0);
            }
            Overlap::Queue => {
                assert_eq!(skipped, 0, "queue skips nothing");
                assert_eq!(stops, 0);
            }
            Overlap::Cancel => {
                assert_eq!(skipped, 0, "cancel skips nothing");
                assert!(stops >= 2, "cancel stopped {stops} turns");
                let deadline = Instant::now() + LONG;
                loop {
                    let entries = record.entries().await.unwrap();
                    let cancelled = entries
                        .iter()
                        .filter(|e| matches!(e.body, EntryBody::Cancelled(_)))
                        .count();
                    if cancelled >= 1 {
                        break;
                    }
                    assert!(Instant::now() < deadline, "no turn was cancelled");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// A schedule firing every second on a fleet of three worker processes, each SIGKILLed in turn
/// (and replaced) while it fires: every tick in the window fires exactly once — one event on
/// the lane per tick, none twice, none skipped — and each is answered in the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tick_fires_exactly_once_on_a_fleet_with_workers_killed() {
    let fleet = Fleet::start(&binary()).await;
    let conversations: &Conversations = &fleet.conversations;
    let schedules = Schedules::new(conversations.store().clone());
    let (entry, _, _) = conversations
        .create(
            &turnpike_tests::fixtures::signer(),
            turnpike_artifactory::NewConversation {
                tenant: tenant(),
                owner: owner(),
                app: "demo".parse().unwrap(),
                agent: "echo".parse().unwrap(),
                at_ms: now_ms(),
                instructions: None,
                started_by: None,
            },
        )
        .await
        .unwrap();
    let conversation = entry.conversation;
    let mut workers: Vec<_> = (0..3).map(|_| fleet.worker(&[]).0).collect();
    let mut s = every_second(
        Target::Same { conversation },
        Missed::All { cap: 1_000 },
        Overlap::Queue,
        600_000,
    );
    s.app = "demo".parse().unwrap();
    s.agent = "echo".parse().unwrap();
    schedules.put(&s).await.unwrap();
    // Kill the oldest worker after every few firings and replace it: by the third round each
    // of the first three is killed, so whichever held the schedule's shard was.
    for round in 1..=4usize {
        until_claims(&schedules, s.id, "firings", |c| c.len() >= round * 3).await;
        let mut doomed = workers.remove(0);
        doomed.kill();
        workers.push(fleet.worker(&[]).0);
    }
    until_claims(&schedules, s.id, "firings after the kills", |c| {
        c.len() >= 15
    })
    .await;
    s.paused = true;
    schedules.put(&s).await.unwrap();
    let bus: &dyn Bus = fleet.bus.as_ref();
    // Settled: no new claim for two seconds, and the record has taken every message.
    let all = settled_claims(&schedules, s.id).await;
    assert!(all.len() < 32, "every claim kept for the check");
    assert_every_tick_once(&all, s.created_ms);
    assert!(all
        .iter()
        .all(|f| matches!(f.outcome, Outcome::Fired { missed: 0, .. })));
    let events = lane_events(bus, conversation).await;
    let keys: Vec<String> = events
        .iter()
        .map(|e| e.idempotency_key.clone().unwrap_or_default())
        .collect();
    let expected: Vec<String> = all
        .iter()
        .map(|f| turnpike_worker::schedules::firing_key(s.id, f.fire_ms))
        .collect();
    assert_eq!(
        keys, expected,
        "one event per tick, in tick order, none twice"
    );
    let record = conversations.record(ConversationPrefix::new(tenant(), conversation));
    let deadline = Instant::now() + LONG;
    loop {
        let state = record.head().await.unwrap().state().clone();
        if state.messages as usize == all.len() && !state.turn_open {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the record took {} of {} messages",
            state.messages,
            all.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Through the API of `turnpike serve`: a schedule is created, fires into a new conversation
/// of its maker that gets answered, and shows its firings and next firing; another identity
/// (or tenant) sees none of it; bad input is refused with nothing written; pause, resume and
/// delete work; `turnpike schedule` lists it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_and_cli_show_schedules_to_their_maker_only() {
    let server = Server::start(&binary(), None, &[], false).unwrap();
    let alice = server.client(ALICE);
    let bob = server.client(BOB);
    let beta = server.client(ALICE_OF_BETA);
    for bad in [
        json!({"app": "demo", "agent": "echo", "text": "hi"}),
        json!({"app": "demo", "agent": "echo", "text": "hi", "cron": "61 * * * *"}),
        json!({"app": "demo", "agent": "echo", "text": "hi", "cron": "0 9 * * *", "zone": "Mars/Base"}),
        json!({"app": "demo", "agent": "echo", "text": "hi", "every_seconds": 0}),
        json!({"app": "demo", "agent": "echo", "text": "hi", "every_seconds": 18_446_744_073_709_551_615u64}),
        json!({"app": "demo", "agent": "echo", "text": "hi", "every_seconds": 5, "jitter_seconds": 18_446_744_073_709_551_615u64}),
        json!({"app": "demo", "agent": "echo", "text": "hi", "every_seconds": 5, "cron": "* * * * *"}),
        json!({"app": "demo", "agent": "echo", "text": "", "every_seconds": 5}),
        json!({"app": "demo", "agent": "echo", "text": "hi", "every_seconds": 5, "missed": "latest", "catch_up": 3}),
        json!({"app": "demo", "agent": "echo", "text": "hi", "every_seconds": 5, "surprise": 1}),
    ] {
        let reply = alice.post("/v1/schedules", &bad).await.unwrap();
        assert_eq!(reply.status, 422, "{bad}: {:?}", reply.body);
    }
    let reply = alice
        .post(
            "/v1/schedules",
            &json!({"app": "nope", "agent": "echo", "text": "hi", "every_seconds": 5}),
        )
        .await
        .unwrap();
    assert_eq!(reply.status, 404);
    // Bob's conversation is not Alice's to fire into.
    let bobs = turnpike_tests::edge::create(&bob, "demo", "echo").await;
    let reply = alice
        .post(
            "/v1/schedules",
            &json!({"conversation": bobs, "text": "hi", "every_seconds": 5}),
        )
        .await
        .unwrap();
    assert_eq!(reply.status, 404);
    assert_eq!(
        alice.get("/v1/schedules").await.unwrap().body["schedules"],
        json!([]),
        "nothing refused was written"
    );

    let made = alice
        .post(
            "/v1/schedules",
            &json!({"app": "demo", "agent": "echo", "text": "daily digest", "every_seconds": 1}),
        )
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let id = made["id"].as_str().unwrap().to_owned();
    assert!(made["next_ms"].as_u64().unwrap() > made["created_ms"].as_u64().unwrap());
    let deadline = Instant::now() + LONG;
    let fired = loop {
        let view = alice
            .get(&format!("/v1/schedules/{id}"))
            .await
            .unwrap()
            .into_ok()
            .unwrap();
        if let Some(f) = view["firings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["outcome"] == "fired")
        {
            break f.clone();
        }
        assert!(Instant::now() < deadline, "never fired: {view}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let conversation = fired["conversation"].as_str().unwrap();
    // A firing is claimed before its conversation is created: wait until it is there.
    let deadline = Instant::now() + LONG;
    while alice
        .get(&format!("/v1/conversations/{conversation}"))
        .await
        .unwrap()
        .status
        != 200
    {
        assert!(Instant::now() < deadline, "{conversation} never created");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    turnpike_tests::edge::wait_for_complete_turns(&alice, conversation, 1, LONG)
        .await
        .unwrap();
    let rows = alice
        .get(&format!("/v1/conversations/{conversation}/messages"))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    assert!(rows.to_string().contains("daily digest"), "{rows}");
    // Nobody else sees it, or its conversation.
    for other in [&bob, &beta] {
        for path in [format!("/v1/schedules/{id}")] {
            assert_eq!(other.get(&path).await.unwrap().status, 404);
        }
        assert_eq!(
            other
                .post(&format!("/v1/schedules/{id}/pause"), &json!({}))
                .await
                .unwrap()
                .status,
            404
        );
        assert_eq!(
            other
                .delete(&format!("/v1/schedules/{id}"))
                .await
                .unwrap()
                .status,
            404
        );
        assert_eq!(
            other.get("/v1/schedules").await.unwrap().body["schedules"],
            json!([])
        );
        assert_eq!(
            other
                .get(&format!("/v1/conversations/{conversation}"))
                .await
                .unwrap()
                .status,
            404
        );
    }
    // The CLI, as Alice.
    let out = std::process::Command::new(binary())
        .args(["schedule", "--url", &server.base, "--token", ALICE, "list"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&id) && text.contains("every 1s") && text.contains("fired"),
        "{text}"
    );
    let out = std::process::Command::new(binary())
        .args([
            "schedule",
            "--url",
            &server.base,
            "--token",
            ALICE,
            "pause",
            &id,
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let view = alice
        .get(&format!("/v1/schedules/{id}"))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    assert_eq!(view["paused"], true);
    assert!(
        view.get("next_ms").is_none(),
        "a paused schedule has no next firing"
    );
    let resumed = alice
        .post(&format!("/v1/schedules/{id}/resume"), &json!({}))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    assert_eq!(resumed["paused"], false);
    let reply = alice.delete(&format!("/v1/schedules/{id}")).await.unwrap();
    assert_eq!(reply.status, 204);
    assert_eq!(
        alice
            .get(&format!("/v1/schedules/{id}"))
            .await
            .unwrap()
            .status,
        404
    );
    // Erasing the user erases their schedules.
    let kept = alice
        .post(
            "/v1/schedules",
            &json!({"app": "demo", "agent": "echo", "text": "hourly", "cron": "@hourly", "zone": "Europe/Berlin"}),
        )
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    assert_eq!(kept["zone"], "Europe/Berlin");
    alice.delete("/v1/me").await.unwrap().into_ok().unwrap();
    assert_eq!(
        alice.get("/v1/schedules").await.unwrap().body["schedules"],
        json!([])
    );
    let kept_id = kept["id"].as_str().unwrap();
    assert_eq!(
        alice
            .get(&format!("/v1/schedules/{kept_id}"))
            .await
            .unwrap()
            .status,
        404
    );
}

/// SIGKILL at each step boundary of a firing, with no later firing to rescue it: a worker
/// hangs right after claiming a firing (nothing published), or after creating its new
/// conversation (its message not published), and is killed; the worker that takes the shard
/// over finishes that firing — its event on its lane once — and goes on with the next ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firing_cut_short_at_each_step_is_finished_once_by_the_next_holder() {
    let fleet = Fleet::start(&binary()).await;
    let conversations: &Conversations = &fleet.conversations;
    let schedules = Schedules::new(conversations.store().clone());
    let bus: &dyn Bus = fleet.bus.as_ref();
    let (entry, _, _) = conversations
        .create(
            &turnpike_tests::fixtures::signer(),
            turnpike_artifactory::NewConversation {
                tenant: tenant(),
                owner: owner(),
                app: "demo".parse().unwrap(),
                agent: "echo".parse().unwrap(),
                at_ms: now_ms(),
                instructions: None,
                started_by: None,
            },
        )
        .await
        .unwrap();
    for (failpoint, target) in [
        (
            "schedule-claimed",
            Target::Same {
                conversation: entry.conversation,
            },
        ),
        ("schedule-conversation", Target::New),
    ] {
        let (mut doomed, _) = fleet.failing_worker(&format!("{failpoint}=hang"));
        let mut s = every_second(target, Missed::All { cap: 1_000 }, Overlap::Queue, 600_000);
        s.app = "demo".parse().unwrap();
        s.agent = "echo".parse().unwrap();
        schedules.put(&s).await.unwrap();
        doomed
            .wait_for_line(&format!("failpoint {failpoint}"), LONG)
            .unwrap();
        let cut = claims(&schedules, s.id).await;
        assert_eq!(cut.len(), 1, "one firing claimed before the hang");
        doomed.kill();
        let (_next, _) = fleet.worker(&[]);
        until_claims(&schedules, s.id, "firings after the takeover", |c| {
            c.len() >= 3
        })
        .await;
        s.paused = true;
        schedules.put(&s).await.unwrap();
        let all = settled_claims(&schedules, s.id).await;
        assert_eq!(all[0], cut[0], "the cut-short claim stands");
        assert_every_tick_once(&all, s.created_ms);
        let mut keys = Vec::new();
        let mut read = std::collections::HashSet::new();
        for f in &all {
            let (conversation, event) = fired(f);
            let events = lane_events(bus, conversation).await;
            assert_eq!(
                events.iter().filter(|e| e.id == event).count(),
                1,
                "{failpoint}: firing {} on its lane once",
                f.fire_ms
            );
            if read.insert(conversation) {
                keys.extend(
                    events
                        .iter()
                        .filter_map(|e| e.idempotency_key.clone())
                        .filter(|k| k.contains(&s.id.to_string())),
                );
            }
        }
        let expected: Vec<String> = all
            .iter()
            .map(|f| turnpike_worker::schedules::firing_key(s.id, f.fire_ms))
            .collect();
        assert_eq!(keys, expected, "{failpoint}: each tick once, in order");
        // Nothing of this schedule fires into the next round.
        schedules.delete(&s).await.unwrap();
    }
}

use turnpike_tests::receiver::{services_python as python, verifies, Receiver};

/// The Standard Webhooks headers of `body` for delivery `id` at `timestamp` (seconds), signed
/// by the reference library (`standardwebhooks` from PyPI) with `secret`.
fn standard_headers(secret: &str, id: &str, timestamp: i64, body: &str) -> Vec<(String, String)> {
    // The body on stdin: it may be larger than an argument may be.
    let script = "import sys, datetime\n\
                  from standardwebhooks.webhooks import Webhook\n\
                  secret, msg_id, ts = sys.argv[1:4]\n\
                  body = sys.stdin.read()\n\
                  at = datetime.datetime.fromtimestamp(int(ts), tz=datetime.timezone.utc)\n\
                  print(Webhook(secret).sign(msg_id, at, body))\n";
    let mut child = std::process::Command::new(python())
        .args(["-c", script, secret, id, &timestamp.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the services' python");
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(body.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    vec![
        ("webhook-id".into(), id.into()),
        ("webhook-timestamp".into(), timestamp.to_string()),
        (
            "webhook-signature".into(),
            String::from_utf8(out.stdout).unwrap().trim().to_owned(),
        ),
    ]
}

/// GitHub's headers of `body` for delivery `id`, signed with `secret`.
fn github_headers(secret: &str, id: &str, body: &str) -> Vec<(String, String)> {
    use hmac::Mac as _;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    vec![
        ("x-github-delivery".into(), id.into()),
        (
            "x-hub-signature-256".into(),
            format!("sha256={}", hex::encode(mac.finalize().into_bytes())),
        ),
    ]
}

async fn deliver(
    base: &str,
    path: &str,
    headers: &[(String, String)],
    body: &str,
) -> (u16, serde_json::Value) {
    let mut request = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .body(body.to_owned());
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (
        status,
        response.json().await.unwrap_or(serde_json::Value::Null),
    )
}

const HOOKS_MANIFEST: &str = r#"
app = "ci"

[agents.triage]
provider = "echo"

[hooks.push]
agent = "triage"
tenant = "default"
owner = "local:alice"
signature = "standard"
secret_env = "CI_PUSH_SECRET"
max_bytes = 2048

[hooks.issues]
agent = "triage"
tenant = "default"
owner = "local:alice"
signature = "github"
secret_env = "CI_ISSUES_SECRET"
conversation = "/issue/number"

[hooks.bulk]
agent = "triage"
tenant = "default"
owner = "local:alice"
signature = "standard"
secret_env = "CI_PUSH_SECRET"
payload = "attachment"
max_bytes = 1048576
"#;

/// Inbound webhooks through `turnpike serve`: a delivery signed by the Standard Webhooks
/// reference library becomes one message in a new conversation of the hook's owner, answered;
/// the same delivery id again adds nothing; a bad signature, an old timestamp, an oversized
/// body and an unknown hook are refused with nothing enqueued; GitHub-signed deliveries with
/// the same issue number go into one conversation, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_deliveries_become_one_message_each_and_bad_ones_nothing() {
    let apps = turnpike_tests::edge::apps_with(&[("ci.toml", HOOKS_MANIFEST)]);
    let push_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let issues_secret = "it is a secret to everybody";
    let server = Server::start_with_env(
        &binary(),
        Some(apps.path()),
        &[],
        false,
        &[
            ("CI_PUSH_SECRET", push_secret.into()),
            ("CI_ISSUES_SECRET", issues_secret.into()),
        ],
    )
    .unwrap();
    let alice = server.client(ALICE);
    let now = (now_ms() / 1000) as i64;
    let body = r#"{"ref":"refs/heads/main","commits":3}"#;
    let conversations_of_alice = || async {
        alice.get("/v1/conversations?limit=100").await.unwrap().body["conversations"]
            .as_array()
            .unwrap()
            .len()
    };
    // Refused, and nothing written: a wrong secret, a tampered body, an old timestamp, no
    // signature, an oversized body, an unknown hook.
    let wrong = standard_headers("whsec_c2VjcmV0LW5vdC10aGUtcmlnaHQtb25l", "msg_1", now, body);
    assert_eq!(
        deliver(&server.base, "/v1/hooks/ci/push", &wrong, body)
            .await
            .0,
        401
    );
    let good = standard_headers(push_secret, "msg_1", now, body);
    let tampered = body.replace('3', "4");
    assert_eq!(
        deliver(&server.base, "/v1/hooks/ci/push", &good, &tampered)
            .await
            .0,
        401
    );
    let old = standard_headers(push_secret, "msg_1", now - 3_600, body);
    assert_eq!(
        deliver(&server.base, "/v1/hooks/ci/push", &old, body)
            .await
            .0,
        401
    );
    assert_eq!(
        deliver(&server.base, "/v1/hooks/ci/push", &[], body)
            .await
            .0,
        401
    );
    let mut extreme = good.clone();
    extreme[1].1 = i64::MIN.to_string();
    assert_eq!(
        deliver(&server.base, "/v1/hooks/ci/push", &extreme, body)
            .await
            .0,
        401
    );
    // Signed, but no message can be made of it: refused before anything is claimed.
    let blank = standard_headers(push_secret, "msg_blank", now, "   ");
    assert_eq!(
        deliver(&server.base, "/v1/hooks/ci/push", &blank, "   ")
            .await
            .0,
        422
    );
    let huge = format!("{{\"pad\":\"{}\"}}", "x".repeat(4096));
    let signed_huge = standard_headers(push_secret, "msg_big", now, &huge);
    let (status, error) = deliver(&server.base, "/v1/hooks/ci/push", &signed_huge, &huge).await;
    assert_eq!(status, 413, "{error}");
    assert_eq!(
        deliver(&server.base, "/v1/hooks/ci/nope", &good, body)
            .await
            .0,
        404
    );
    assert_eq!(
        conversations_of_alice().await,
        0,
        "nothing refused was enqueued"
    );

    // A good delivery: one message in a new conversation of the owner, answered.
    let (status, first) = deliver(&server.base, "/v1/hooks/ci/push", &good, body).await;
    assert_eq!(status, 202, "{first}");
    assert_eq!(first["duplicate"], false);
    let conversation = first["conversation"].as_str().unwrap().to_owned();
    turnpike_tests::edge::wait_for_complete_turns(&alice, &conversation, 1, LONG)
        .await
        .unwrap();
    // The sender retries (its own retry, or a redelivery later): the same answer, nothing new.
    let again = standard_headers(push_secret, "msg_1", now + 5, body);
    let (status, second) = deliver(&server.base, "/v1/hooks/ci/push", &again, body).await;
    assert_eq!(status, 202);
    assert_eq!(second["duplicate"], true);
    assert_eq!(second["conversation"], first["conversation"]);
    assert_eq!(second["event_id"], first["event_id"]);
    assert_eq!(conversations_of_alice().await, 1);
    // A sender's long delivery id is taken (the message's key is a hash of it).
    let long_id = format!("msg_{}", "x".repeat(200));
    let long = standard_headers(push_secret, &long_id, now, body);
    let (status, reply) = deliver(&server.base, "/v1/hooks/ci/push", &long, body).await;
    assert_eq!(status, 202, "{reply}");
    assert_eq!(conversations_of_alice().await, 2);
    let rows = alice
        .get(&format!("/v1/conversations/{conversation}/messages"))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let delivered: Vec<_> = rows["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "user_message")
        .collect();
    assert_eq!(delivered.len(), 1, "{rows}");
    assert_eq!(delivered[0]["text"], body, "the payload is the message");

    // GitHub-signed issue events: routed by /issue/number.
    let mut issue_conversations = Vec::new();
    for (delivery, number) in [("gh-1", 7), ("gh-2", 7), ("gh-3", 8), ("gh-1", 7)] {
        let body = format!(r#"{{"action":"opened","issue":{{"number":{number}}}}}"#);
        let headers = github_headers(issues_secret, delivery, &body);
        let (status, reply) = deliver(&server.base, "/v1/hooks/ci/issues", &headers, &body).await;
        assert_eq!(status, 202, "{reply}");
        issue_conversations.push(reply["conversation"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        issue_conversations[0], issue_conversations[1],
        "same issue, same conversation"
    );
    assert_ne!(issue_conversations[0], issue_conversations[2]);
    assert_eq!(issue_conversations[0], issue_conversations[3]);
    let bad = github_headers("not it", "gh-4", "{}");
    assert_eq!(
        deliver(&server.base, "/v1/hooks/ci/issues", &bad, "{}")
            .await
            .0,
        401
    );
    let no_key = r#"{"action":"ping"}"#;
    let headers = github_headers(issues_secret, "gh-5", no_key);
    assert_eq!(
        deliver(&server.base, "/v1/hooks/ci/issues", &headers, no_key)
            .await
            .0,
        422
    );
    turnpike_tests::edge::wait_for_complete_turns(&alice, &issue_conversations[0], 2, LONG)
        .await
        .unwrap();
    let rows = alice
        .get(&format!(
            "/v1/conversations/{}/messages",
            issue_conversations[0]
        ))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let messages = rows["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "user_message")
        .count();
    assert_eq!(messages, 2, "gh-1 and gh-2, gh-1 once: {rows}");
    assert_eq!(conversations_of_alice().await, 4);

    // A payload larger than a message can be, as an attachment: stored whole, the turn's
    // input, once; larger than the hook takes: refused, nothing enqueued.
    let big = format!("{{\"commits\":\"{}\"}}", "c".repeat(200 << 10));
    let headers = standard_headers(push_secret, "bulk-1", now, &big);
    let (status, first) = deliver(&server.base, "/v1/hooks/ci/bulk", &headers, &big).await;
    assert_eq!(status, 202, "{first}");
    let bulk = first["conversation"].as_str().unwrap().to_owned();
    turnpike_tests::edge::wait_for_complete_turns(&alice, &bulk, 1, LONG)
        .await
        .unwrap();
    let (status, again) = deliver(&server.base, "/v1/hooks/ci/bulk", &headers, &big).await;
    assert_eq!((status, &again["duplicate"]), (202, &json!(true)));
    let rows = alice
        .get(&format!("/v1/conversations/{bulk}/messages"))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let attached: Vec<_> = rows["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "attachment")
        .collect();
    assert_eq!(attached.len(), 1, "{rows}");
    let reference = attached[0]["data"]["event"]["body"]["reference"]
        .as_str()
        .unwrap();
    let (status, stored) = alice
        .bytes(&format!("/v1/files?reference={reference}"), true)
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(stored, big.as_bytes(), "the payload, whole");
    let huge = "x".repeat((1 << 20) + 1);
    let headers = standard_headers(push_secret, "bulk-2", now, &huge);
    assert_eq!(
        deliver(&server.base, "/v1/hooks/ci/bulk", &headers, &huge)
            .await
            .0,
        413
    );
    assert_eq!(conversations_of_alice().await, 5);
}

/// An app-wide schedule declared in the app's manifest fires into a new conversation of the
/// app's identity each time, on its interval's grid, each tick once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_wide_schedule_in_a_manifest_fires_as_the_apps_identity() {
    let mut options = RigOptions::new(QUICK);
    options.lease_ttl = Duration::from_secs(1);
    options.schedules = true;
    options.manifest_extra = format!(
        "[schedules.digest]\nagent = \"helper\"\ntenant = \"{t}\"\nevery_seconds = 1\ntext = \"the digest\"\n\n\
         [schedules.standing]\nagent = \"helper\"\ntenant = \"{t}\"\nevery_seconds = 1\ntext = \"the round\"\nconversation = \"same\"\n",
        t = tenant()
    );
    let rig = Rig::with(options).await;
    let schedules = Schedules::new(rig.conversations.store().clone());
    let id =
        turnpike_worker::schedules::manifest_schedule_id(&"support".parse().unwrap(), "digest");
    let all = until_claims(&schedules, id, "three firings", |c| c.len() >= 3).await;
    assert_every_tick_once(&all, all[0].fire_ms);
    let app_identity: turnpike_schemas::Identity = "schedule:support:digest".parse().unwrap();
    for f in &all {
        assert_eq!(f.fire_ms % 1_000, 0, "on the interval's grid");
        let (conversation, event) = fired(f);
        // Its message on the lane first: a claim is made before its conversation is created
        // and its message published.
        let events = lane_events_with(rig.bus.as_ref(), conversation, event).await;
        let entry = rig
            .conversations
            .directory()
            .lookup(conversation, &tenant(), &app_identity)
            .await
            .unwrap();
        assert_eq!(entry.owner, app_identity);
        assert_eq!(entry.app.as_str(), "support");
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].id, event);
        assert_eq!(events[0].address.identity, app_identity);
    }
    // `conversation = "same"`: every firing into one standing conversation, made by the first
    // and owned by the schedule's app identity.
    let support: turnpike_schemas::AppId = "support".parse().unwrap();
    let standing_id = turnpike_worker::schedules::manifest_schedule_id(&support, "standing");
    let standing_identity: turnpike_schemas::Identity =
        "schedule:support:standing".parse().unwrap();
    let standing = turnpike_worker::schedules::manifest_schedule_conversation(
        &tenant(),
        &support,
        "standing",
        &standing_identity,
        &"helper".parse().unwrap(),
    );
    let all = until_claims(&schedules, standing_id, "three standing firings", |c| {
        c.len() >= 3
    })
    .await;
    assert_every_tick_once(&all, all[0].fire_ms);
    let mut events_fired = Vec::new();
    for f in &all {
        let (conversation, event) = fired(f);
        assert_eq!(conversation, standing, "{f:?}");
        lane_events_with(rig.bus.as_ref(), standing, event).await;
        events_fired.push(event);
    }
    let events = lane_events(rig.bus.as_ref(), standing).await;
    assert!(
        events_fired
            .iter()
            .all(|e| events.iter().filter(|x| x.id == *e).count() == 1),
        "each firing once on the one lane"
    );
    assert!(events
        .iter()
        .all(|e| e.address.identity == standing_identity));
    let entry = rig
        .conversations
        .directory()
        .lookup(standing, &tenant(), &standing_identity)
        .await
        .unwrap();
    assert_eq!(entry.owner, standing_identity);
}

fn payload(request: &serde_json::Value) -> serde_json::Value {
    serde_json::from_str(request["body"].as_str().unwrap()).unwrap()
}

const WEBHOOK_MANIFEST: &str = r#"
app = "ops"

[agents.helper]
provider = "echo"

[agents.guarded]
provider = "script"
script = "ops.script.toml"
tools = ["write_file", "list_files"]
approval = [{ tool = "write_file" }]

[agents.strict]
provider = "script"
script = "ops.script.toml"
tools = ["write_file", "list_files"]
approval = [{ tool = "write_file" }]
headless = "deny"

[hooks.alert]
agent = "guarded"
tenant = "default"
owner = "local:alice"
signature = "standard"
secret_env = "OPS_ALERT_SECRET"

[hooks.strict]
agent = "strict"
tenant = "default"
owner = "local:alice"
signature = "standard"
secret_env = "OPS_ALERT_SECRET"
"#;

const WEBHOOK_SCRIPT: &str = r#"
[[turn]]
when = "alert"
[[turn.step]]
text = "Writing the report. "
tool_calls = [{ name = "write_file", arguments = { path = "report.md", content = "all clear\n" } }]
[[turn.step]]
text = "Report written: {last_tool}"

[[turn]]
[[turn.step]]
text = "unused"
[[turn.step]]
text = "Approved and written."
"#;

async fn subscribe(
    client: &turnpike_edge::client::Client,
    body: serde_json::Value,
) -> (String, String) {
    let made = client.post("/v1/webhooks", &body).await.unwrap();
    assert_eq!(made.status, 201, "{:?}", made.body);
    (
        made.body["id"].as_str().unwrap().to_owned(),
        made.body["secret"].as_str().unwrap().to_owned(),
    )
}

/// Outbound webhooks through `turnpike serve`: a receiver that fails its first three attempts
/// gets the turn's event once more and accepts it, under one `webhook-id`, signed so the
/// Standard Webhooks library verifies it (and not with another secret); another identity's
/// and another tenant's subscribers hear nothing of it; a receiver that never answers ends as
/// a dead letter its owner (only) lists and redelivers on command; a URL on 127.0.0.1, a
/// private range or the metadata address is refused at delivery (and one that redirects
/// there is not followed), while the host the operator allowed is reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_are_delivered_once_retried_signed_refused_inside_and_dead_lettered() {
    let receiver = Receiver::start().await;
    let port = receiver.port;
    let server = Server::start_with_env(
        &binary(),
        None,
        &[
            "--outbound-allow",
            "localhost",
            "--webhook-backoff",
            "0,1s,1s,1s",
            "--webhook-timeout-secs",
            "1",
        ],
        false,
        // A proxy would resolve the name again, past the addresses checked: none is used.
        &[
            ("HTTP_PROXY", "http://127.0.0.1:9".into()),
            ("http_proxy", "http://127.0.0.1:9".into()),
            ("ALL_PROXY", "http://127.0.0.1:9".into()),
        ],
    )
    .unwrap();
    let (alice, bob, beta) = (
        server.client(ALICE),
        server.client(BOB),
        server.client(ALICE_OF_BETA),
    );
    let (flaky, secret) = subscribe(&alice, json!({"url": format!("http://localhost:{port}/flaky/alice"), "events": ["turn.completed"]})).await;
    subscribe(
        &bob,
        json!({"url": format!("http://localhost:{port}/ok/bob")}),
    )
    .await;
    subscribe(
        &beta,
        json!({"url": format!("http://localhost:{port}/ok/beta")}),
    )
    .await;
    // Refused inside: an address (only the host name `localhost` is allowed), a private
    // range, the metadata address; and a redirect, not followed.
    for url in [
        format!("http://127.0.0.1:{port}/ok/inside"),
        "http://10.1.2.3/ok".to_owned(),
        "http://169.254.169.254/latest/meta-data".to_owned(),
        format!("http://localhost:{port}/redirect/alice"),
    ] {
        subscribe(&alice, json!({"url": url, "events": ["turn.completed"]})).await;
    }
    // Refused at once: not a URL one can deliver to.
    for bad in [
        json!({"url": "ftp://example.com/"}),
        json!({"url": "http://localhost/", "events": ["turn.done"]}),
    ] {
        let refused = alice.post("/v1/webhooks", &bad).await.unwrap();
        assert_eq!(refused.status, 422, "{bad}: {:?}", refused.body);
    }
    let listed = alice.get("/v1/webhooks").await.unwrap().into_ok().unwrap();
    assert_eq!(listed["webhooks"].as_array().unwrap().len(), 5);
    assert!(
        !listed.to_string().contains(&secret),
        "a secret is shown once"
    );

    let conversation = alice
        .post(
            "/v1/conversations",
            &json!({"app": "demo", "agent": "echo"}),
        )
        .await
        .unwrap()
        .into_ok()
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let sent = alice
        .post(
            &format!("/v1/conversations/{conversation}/messages"),
            &json!({"text": "hello hooks"}),
        )
        .await
        .unwrap();
    assert!(sent.status < 300, "{:?}", sent.body);

    // Three failures, then accepted: four attempts of one message.
    let attempts = turnpike_tests::wait::until(LONG, "the fourth attempt", || async {
        let got = receiver.on("/flaky/alice");
        (got.iter().any(|r| r["status"] == 200)).then_some(got)
    })
    .await;
    assert_eq!(attempts.len(), 4, "{attempts:?}");
    let ids: BTreeSet<_> = attempts
        .iter()
        .map(|r| r["headers"]["webhook-id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 1, "one webhook-id on every attempt");
    let accepted = attempts.last().unwrap();
    assert!(
        verifies(&secret, accepted),
        "the reference library verifies it"
    );
    assert!(
        !verifies("whsec_c2VjcmV0LW5vdC10aGUtcmlnaHQtb25l", accepted),
        "another secret does not"
    );
    let event = payload(accepted);
    assert_eq!(event["type"], "turn.completed");
    assert_eq!(event["data"]["conversation"], conversation.as_str());
    assert_eq!(event["data"]["identity"], "local:alice");
    assert_eq!(event["data"]["session"], false);
    assert!(event["data"]["reply"]
        .as_str()
        .unwrap()
        .contains("hello hooks"));

    // Inside addresses: refused after resolution, never reached; the redirect not followed.
    let dead = turnpike_tests::wait::until(LONG, "four dead letters", || async {
        let dead = alice
            .get("/v1/webhooks/dead-letters")
            .await
            .unwrap()
            .into_ok()
            .unwrap();
        (dead["dead_letters"].as_array().unwrap().len() >= 4).then_some(dead)
    })
    .await;
    let letters = dead["dead_letters"].as_array().unwrap();
    assert_eq!(letters.len(), 4, "{dead}");
    let refused = letters
        .iter()
        .filter(|d| d["last_error"].as_str().unwrap().starts_with("refused"))
        .count();
    assert_eq!(refused, 3, "{dead}");
    assert!(letters.iter().all(|d| d["attempts"] == 4), "{dead}");
    assert!(
        letters.iter().any(|d| d["last_error"]
            .as_str()
            .unwrap()
            .contains("redirects are not followed")),
        "{dead}"
    );
    assert!(receiver.on("/ok/inside").is_empty());
    assert!(
        receiver.on("/ok/redirected").is_empty(),
        "the redirect was not followed"
    );
    assert_eq!(receiver.on("/redirect/alice").len(), 4);
    // Nobody else hears of alice's turn, nor sees her dead letters.
    let bobs = bob
        .get("/v1/webhooks/dead-letters")
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    assert!(
        bobs["dead_letters"].as_array().unwrap().is_empty(),
        "{bobs}"
    );
    let some = letters[0]["id"].as_str().unwrap();
    let stolen = bob
        .post(
            &format!("/v1/webhooks/dead-letters/{some}/redeliver"),
            &json!({}),
        )
        .await
        .unwrap();
    assert_eq!(stolen.status, 404);
    assert!(
        bob.delete(&format!("/v1/webhooks/{flaky}"))
            .await
            .unwrap()
            .status
            == 404
    );

    // A receiver that never answers: a dead letter; redelivered on command once it answers.
    receiver.hang(true);
    let (_, hang_secret) = subscribe(
        &alice,
        json!({"url": format!("http://localhost:{port}/hang/alice"), "conversation": conversation}),
    )
    .await;
    alice
        .post(
            &format!("/v1/conversations/{conversation}/messages"),
            &json!({"text": "second"}),
        )
        .await
        .unwrap();
    let hung = turnpike_tests::wait::until(LONG, "the hanging receiver's dead letter", || async {
        let dead = alice
            .get("/v1/webhooks/dead-letters")
            .await
            .unwrap()
            .into_ok()
            .unwrap();
        dead["dead_letters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["last_error"].as_str().unwrap().contains("no answer"))
            .cloned()
    })
    .await;
    assert_eq!(hung["type"], "turn.completed");
    receiver.hang(false);
    // The hung attempts are answered now too, late: the redelivery is the one signed after
    // the request for it (each attempt timed out a second or more before its dead letter).
    let asked_secs = now_ms() / 1_000;
    let id = hung["id"].as_str().unwrap();
    let again = alice
        .post(
            &format!("/v1/webhooks/dead-letters/{id}/redeliver"),
            &json!({}),
        )
        .await
        .unwrap();
    assert_eq!(again.status, 202, "{:?}", again.body);
    let last = turnpike_tests::wait::until(LONG, "the redelivery", || async {
        receiver.on("/hang/alice").into_iter().find(|got| {
            got["status"] == 200
                && got["headers"]["webhook-timestamp"]
                    .as_str()
                    .and_then(|t| t.parse::<u64>().ok())
                    .is_some_and(|t| t >= asked_secs)
        })
    })
    .await;
    let last = &last;
    assert!(verifies(&hang_secret, last));
    assert_eq!(
        last["headers"]["webhook-id"], hung["message_id"],
        "redelivered under its own id"
    );
    // Both of alice's turns were told to her flaky receiver, each accepted once.
    turnpike_tests::wait::until(LONG, "the second turn's event", || async {
        let ok: Vec<_> = receiver
            .on("/flaky/alice")
            .into_iter()
            .filter(|r| r["status"] == 200)
            .collect();
        (ok.len() == 2).then_some(())
    })
    .await;
    let accepted: Vec<String> = receiver
        .on("/flaky/alice")
        .into_iter()
        .filter(|r| r["status"] == 200)
        .map(|r| r["headers"]["webhook-id"].as_str().unwrap().to_owned())
        .collect();
    assert_ne!(accepted[0], accepted[1]);
    assert!(receiver.on("/ok/bob").is_empty(), "bob owns none of it");
    assert!(
        receiver.on("/ok/beta").is_empty(),
        "another tenant hears nothing"
    );
    // Erasure takes alice's subscriptions and what was kept of her deliveries.
    assert_eq!(alice.delete("/v1/me").await.unwrap().status, 200);
    let left = alice.get("/v1/webhooks").await.unwrap().into_ok().unwrap();
    assert!(left["webhooks"].as_array().unwrap().is_empty(), "{left}");
    let dead = alice
        .get("/v1/webhooks/dead-letters")
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    assert!(
        dead["dead_letters"].as_array().unwrap().is_empty(),
        "{dead}"
    );
    let bobs = bob.get("/v1/webhooks").await.unwrap().into_ok().unwrap();
    assert_eq!(bobs["webhooks"].as_array().unwrap().len(), 1, "bob's stays");
}

/// Headless turns: a hook's delivery starts a session turn that calls a gated tool. With
/// `headless = "park"` it parks, a `turn.parked` webhook names the approval, and an approval
/// through the API resumes it; with `headless = "deny"` the call is not run, its result
/// records why, and the turn completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_turn_at_a_gated_call_parks_and_notifies_or_is_denied_with_its_reason() {
    let receiver = Receiver::start().await;
    let port = receiver.port;
    let apps = turnpike_tests::edge::apps_with(&[
        ("ops.toml", WEBHOOK_MANIFEST),
        ("ops.script.toml", WEBHOOK_SCRIPT),
    ]);
    let hook_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let server = Server::start_with_env(
        &binary(),
        Some(apps.path()),
        &["--outbound-allow", "localhost"],
        false,
        &[("OPS_ALERT_SECRET", hook_secret.into())],
    )
    .unwrap();
    let alice = server.client(ALICE);
    let (_, secret) = subscribe(
        &alice,
        json!({"url": format!("http://localhost:{port}/ok/alice")}),
    )
    .await;
    let now = (now_ms() / 1000) as i64;
    let body = r#"{"alert":"disk almost full"}"#;
    let headers = standard_headers(hook_secret, "alert-1", now, body);
    let (status, accepted) = deliver(&server.base, "/v1/hooks/ops/alert", &headers, body).await;
    assert_eq!(status, 202, "{accepted}");
    let parked_conversation = accepted["conversation"].as_str().unwrap().to_owned();

    // Parked, and told: the card travels in the webhook.
    let parked = turnpike_tests::wait::until(LONG, "a turn.parked webhook", || async {
        receiver
            .on("/ok/alice")
            .into_iter()
            .find(|r| payload(r)["type"] == "turn.parked")
    })
    .await;
    assert!(verifies(&secret, &parked));
    let data = payload(&parked)["data"].clone();
    assert_eq!(data["conversation"], parked_conversation.as_str());
    assert_eq!(data["session"], true);
    assert_eq!(data["origin"]["kind"], "hook");
    assert_eq!(data["parked"]["kind"], "approval");
    assert_eq!(data["parked"]["tool"], "write_file");
    let request = data["parked"]["request_id"].as_str().unwrap();
    let approved = alice
        .post(
            &format!("/v1/conversations/{parked_conversation}/approvals/{request}/approve"),
            &json!({}),
        )
        .await
        .unwrap();
    assert_eq!(approved.status, 202, "{:?}", approved.body);
    let completed =
        turnpike_tests::wait::until(LONG, "the resumed turn's turn.completed", || async {
            receiver.on("/ok/alice").into_iter().find(|r| {
                let p = payload(r);
                p["type"] == "turn.completed"
                    && p["data"]["conversation"] == parked_conversation.as_str()
            })
        })
        .await;
    assert!(payload(&completed)["data"]["reply"]
        .as_str()
        .unwrap()
        .contains("Approved and written."));

    // Denied: the call is not run, the reason is recorded, the turn goes on to its reply.
    let headers = standard_headers(hook_secret, "alert-2", now, body);
    let (status, accepted) = deliver(&server.base, "/v1/hooks/ops/strict", &headers, body).await;
    assert_eq!(status, 202, "{accepted}");
    let denied_conversation = accepted["conversation"].as_str().unwrap().to_owned();
    turnpike_tests::edge::wait_for_complete_turns(&alice, &denied_conversation, 1, LONG)
        .await
        .unwrap();
    let rows = alice
        .get(&format!("/v1/conversations/{denied_conversation}/messages"))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let results: Vec<_> = rows["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "tool_result")
        .collect();
    assert_eq!(results.len(), 1, "{rows}");
    assert!(
        results[0]
            .to_string()
            .contains("nobody is there to give it"),
        "{rows}"
    );
    assert!(
        !rows.to_string().contains("approval_request"),
        "nothing parked: {rows}"
    );
    let files = alice
        .get(&format!("/v1/conversations/{denied_conversation}/files"))
        .await
        .unwrap();
    assert!(
        !files.body.to_string().contains("report.md"),
        "the write did not run"
    );
    // A schedule's firing is told (schedule.firing), and so is its session's turn.
    let schedule = alice
        .post(
            "/v1/schedules",
            &json!({"app": "ops", "agent": "helper", "every_seconds": 1, "text": "tick"}),
        )
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let firing = turnpike_tests::wait::until(LONG, "a schedule.firing webhook", || async {
        receiver.on("/ok/alice").into_iter().find(|r| {
            let p = payload(r);
            p["type"] == "schedule.firing" && p["data"]["schedule"] == schedule["id"]
        })
    })
    .await;
    let fired = payload(&firing)["data"].clone();
    assert_eq!(fired["outcome"], "fired", "{fired}");
    let session = fired["conversation"].as_str().unwrap().to_owned();
    let told = turnpike_tests::wait::until(LONG, "the firing's turn.completed", || async {
        receiver.on("/ok/alice").into_iter().find(|r| {
            let p = payload(r);
            p["type"] == "turn.completed" && p["data"]["conversation"] == session.as_str()
        })
    })
    .await;
    let data = payload(&told)["data"].clone();
    assert_eq!(data["session"], true);
    assert_eq!(data["origin"]["kind"], "schedule");
    assert_eq!(data["origin"]["schedule"], schedule["id"]);
    let id = schedule["id"].as_str().unwrap();
    alice.delete(&format!("/v1/schedules/{id}")).await.unwrap();
    // A person's turn of the same agent still parks on the call (only sessions deny).
    let chat = alice
        .post(
            "/v1/conversations",
            &json!({"app": "ops", "agent": "strict"}),
        )
        .await
        .unwrap()
        .into_ok()
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    alice
        .post(
            &format!("/v1/conversations/{chat}/messages"),
            &json!({"text": "alert by hand"}),
        )
        .await
        .unwrap();
    turnpike_tests::wait::until(LONG, "the chat's turn.parked", || async {
        receiver.on("/ok/alice").into_iter().find(|r| {
            let p = payload(r);
            p["type"] == "turn.parked" && p["data"]["conversation"] == chat.as_str()
        })
    })
    .await;
}

/// Every waiting delivery in the store, with its message, across the shards.
async fn waiting(
    webhooks: &turnpike_artifactory::Webhooks,
) -> Vec<turnpike_artifactory::webhooks::Delivery> {
    let mut all = Vec::new();
    for shard in 0..turnpike_artifactory::webhooks::SHARDS {
        let (due, _) = webhooks.due(shard, u64::MAX, usize::MAX).await.unwrap();
        for p in due {
            if let Some(d) = webhooks.read(&p).await.unwrap() {
                all.push(d);
            }
        }
    }
    all
}

/// The outbox survives its owner: a worker killed after batch two and before the promotion
/// (nothing else is ever sent to the conversation) has told nobody; the next worker's sweep
/// finishes the promotion and enqueues the turn's event, once, with the failure's text read
/// back from the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turns_event_is_enqueued_once_by_whoever_finishes_its_promotion() {
    let mut options = RigOptions::new(QUICK);
    options.paused = true;
    options.lease_ttl = Duration::from_millis(600);
    options.manifest_extra = format!(
        "[webhooks.ops]\nurl = \"http://localhost:9/hook\"\ntenant = \"{}\"\nsecret_env = \"TURNPIKE_TEST_NO_SUCH_SECRET\"\n",
        tenant()
    );
    let mut rig = Rig::with(options).await;
    let webhooks = rig.conversations.webhooks();
    rig.run_hanging_at("before-promotion");
    rig.say("status").await;
    rig.wait_turns(1).await;
    rig.crash().await;
    assert!(waiting(&webhooks).await.is_empty(), "nobody told yet");
    // The dead owner's lease lapses; a new worker's sweep finishes what it left.
    rig.wait_lease_free().await;
    rig.run();
    let marks = rig.conversations.open_turns();
    turnpike_tests::wait::until(LONG, "the sweep to finish the promotion", || async {
        marks.list().await.unwrap().is_empty().then_some(())
    })
    .await;
    let enqueued = waiting(&webhooks).await;
    assert_eq!(enqueued.len(), 1, "{enqueued:#?}");
    let d = &enqueued[0];
    assert_eq!(
        d.message.kind,
        turnpike_schemas::webhook::EventKind::TurnCompleted
    );
    assert_eq!(d.message.data["conversation"], rig.conv.to_string());
    assert_eq!(d.message.data["turn"], "turn_1");
    assert_eq!(d.message.data["reply"], "done");
    // Its secret is not set: every attempt fails and says so, nothing panics.
    turnpike_tests::wait::until(LONG, "a failed attempt", || async {
        let d = waiting(&webhooks).await.pop()?;
        d.last_error
            .filter(|e| e.contains("TURNPIKE_TEST_NO_SUCH_SECRET"))
    })
    .await;
    rig.stop().await;
}
