//! Lanes end to end: a real nats-server, worker processes killed for real, records checked.
//! The same scenarios run on the embedded backend (in-process workers, and a `serve` process
//! killed and restarted).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use turnpike_artifactory::{Conversations, RecordSigner};
use turnpike_router::bus::{Bus, Wake, WakeAck};
use turnpike_router::embedded::{EmbeddedBus, EmbeddedConfig};
use turnpike_schemas::entry::TurnDispatched;
use turnpike_schemas::{ConversationId, EntryBody};
use turnpike_tests::fixtures::{self, signer};
use turnpike_tests::fleet::Fleet;
use turnpike_tests::lanes::{
    check_conversation, create_conversations, publish, record, wait_for_turns,
};
use turnpike_tests::process::Process;
use turnpike_worker::{Apps, EchoAgent, Worker, WorkerConfig, WorkerPool};

const LONG: Duration = Duration::from_secs(240);

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_turnpike"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_conversations_on_four_worker_processes_keep_order_and_lose_nothing() {
    let fleet = Fleet::start(&binary()).await;
    let workers: Vec<_> = (0..4).map(|_| fleet.worker(&[])).collect();
    let convs = create_conversations(&fleet.conversations, &signer(), 200).await;
    publish(fleet.bus.clone(), &fleet.conversations, &convs, 0, 20, LONG)
        .await
        .unwrap();
    wait_for_turns(&fleet.conversations, &convs, 20, LONG)
        .await
        .unwrap();
    for (i, conv) in convs.iter().enumerate() {
        check_conversation(&fleet.conversations, &signer(), *conv, i, 20)
            .await
            .unwrap();
    }
    // Work was spread: more than one worker dispatched turns.
    let mut dispatchers = std::collections::HashSet::new();
    for conv in convs.iter().take(50) {
        for d in dispatched(&fleet.conversations, *conv).await {
            dispatchers.insert(d.worker.to_string());
        }
    }
    assert!(
        dispatchers.len() > 1,
        "one worker did everything: {dispatchers:?}"
    );
    assert!(dispatchers
        .iter()
        .all(|d| workers.iter().any(|(_, id)| id == d)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turnpike_workers_lists_the_live_workers_of_a_fleet_and_not_a_killed_one() {
    let fleet = Fleet::start(&binary()).await;
    let (_kept, kept) = fleet.worker(&["--heartbeat-ms", "200", "--slots", "7"]);
    let (mut doomed, doomed_id) = fleet.worker(&["--heartbeat-ms", "200"]);
    let listed = |fleet: &Fleet| -> Vec<serde_json::Value> {
        let out = fleet.run(&["workers", "--window-ms", "1500", "--json"]);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let ids = |beats: &[serde_json::Value]| -> Vec<String> {
        let mut ids: Vec<String> = beats
            .iter()
            .map(|b| b["worker"].as_str().unwrap().to_owned())
            .collect();
        ids.sort();
        ids
    };
    let beats = listed(&fleet);
    let mut both = vec![kept.clone(), doomed_id.clone()];
    both.sort();
    assert_eq!(ids(&beats), both);
    let mine = beats.iter().find(|b| b["worker"] == kept.as_str()).unwrap();
    assert_eq!(
        (mine["slots"].as_u64(), mine["owned"].as_u64()),
        (Some(7), Some(0))
    );
    // A worker killed is no longer heard from.
    doomed.kill();
    assert_eq!(ids(&listed(&fleet)), [kept]);
    // Without a fleet there is nothing to list: a clear error.
    let embedded = std::process::Command::new(binary())
        .args([
            "--data-dir",
            &fleet.data.path().to_string_lossy(),
            "workers",
        ])
        .output()
        .unwrap();
    assert!(!embedded.status.success());
    assert!(String::from_utf8_lossy(&embedded.stderr).contains("needs --nats-url"));
}

/// Waits until each of `workers` has sent a heartbeat on `beats` (from now on).
async fn beats_from(
    beats: &mut futures::stream::BoxStream<'static, turnpike_router::Heartbeat>,
    workers: &[&str],
) {
    use futures::StreamExt as _;
    let mut waiting: std::collections::BTreeSet<&str> = workers.iter().copied().collect();
    tokio::time::timeout(LONG, async {
        while !waiting.is_empty() {
            let beat = beats.next().await.expect("the heartbeat watch ended");
            waiting.remove(beat.worker.to_string().as_str());
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no heartbeat from {waiting:?}"));
}

/// Waits until the worker whose admin listener is `admin` counts `n` workers in its fleet.
async fn fleet_size_reaches(admin: &turnpike_edge::client::Client, n: usize) {
    let series = "turnpike_worker_fleet_size ";
    turnpike_tests::wait::until(LONG, &format!("a fleet size of {n}"), || async {
        let (status, body) = admin.bytes("/metrics", false).await.unwrap();
        assert_eq!(status, 200);
        let text = String::from_utf8(body).unwrap();
        let size = text
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok());
        (size == Some(n as f64)).then_some(())
    })
    .await;
}

/// A starting worker learns its fleet's size within a round trip, not after a heartbeat
/// period: it sends its first beat once it watches heartbeats, and a running worker answers a
/// worker it has not heard before with a beat at once. With beats an hour apart, nothing else
/// could make these beats or these counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_worker_is_answered_at_once_and_every_worker_counts_it() {
    let fleet = Fleet::start(&binary()).await;
    let mut beats = fleet.bus.watch_heartbeats().await.unwrap();
    let hour = ["--heartbeat-ms", "3600000"];
    let listen = || {
        format!(
            "127.0.0.1:{}",
            turnpike_tests::services::free_port().unwrap()
        )
    };
    let (a_listen, b_listen) = (listen(), listen());
    let (_a, a) = fleet.worker(&[&hour[..], &["--admin-listen", &a_listen]].concat());
    // Its first beat, sent once it watches.
    beats_from(&mut beats, &[&a]).await;
    let a_admin = turnpike_edge::client::Client::new(&format!("http://{a_listen}"), "");
    fleet_size_reaches(&a_admin, 1).await;

    // A second worker beats once it watches; the first answers it, the second answers the
    // first (new to it), and both count two.
    let (_b, b) = fleet.worker(&[&hour[..], &["--admin-listen", &b_listen]].concat());
    beats_from(&mut beats, &[&b]).await;
    beats_from(&mut beats, &[&a]).await;
    beats_from(&mut beats, &[&b]).await;
    let b_admin = turnpike_edge::client::Client::new(&format!("http://{b_listen}"), "");
    fleet_size_reaches(&a_admin, 2).await;
    fleet_size_reaches(&b_admin, 2).await;

    // A third, as this test: both answer it and count it.
    let stranger = turnpike_schemas::WorkerId::new();
    fleet
        .bus
        .heartbeat(&turnpike_router::Heartbeat {
            worker: stranger,
            owned: 0,
            slots: 1,
            at_ms: turnpike_router::bus::now_ms(),
            every_ms: 3_600_000,
        })
        .await;
    beats_from(&mut beats, &[&stranger.to_string(), &a, &b]).await;
    fleet_size_reaches(&a_admin, 3).await;
    fleet_size_reaches(&b_admin, 3).await;
}

/// A wake delivered by hand, acknowledged nowhere.
struct HandAck;

#[async_trait]
impl WakeAck for HandAck {
    async fn ack(&self) -> turnpike_router::Result<()> {
        Ok(())
    }
    async fn nak(&self, _: Duration) -> turnpike_router::Result<()> {
        Ok(())
    }
    async fn progress(&self) -> turnpike_router::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_woken_for_one_conversation_open_one_turn() {
    let fleet = Fleet::start(&binary()).await;
    let convs = create_conversations(&fleet.conversations, &signer(), 1).await;
    publish(fleet.bus.clone(), &fleet.conversations, &convs, 0, 1, LONG)
        .await
        .unwrap();
    let seq = fleet.bus.lane_last(convs[0]).await.unwrap();
    let make = || {
        Worker::new(
            fleet.bus.clone(),
            fleet.conversations.clone(),
            signer(),
            Arc::new(Apps::new().with_fallback(Arc::new(EchoAgent))),
            WorkerConfig::default(),
        )
    };
    let (a, b) = (make(), make());
    let wake = || Wake::new(convs[0], fixtures::tenant(), seq, 1, Box::new(HandAck));
    tokio::join!(a.handle(wake()), b.handle(wake()));
    wait_for_turns(&fleet.conversations, &convs, 1, LONG)
        .await
        .unwrap();
    tokio::join!(a.idle(), b.idle());
    check_conversation(&fleet.conversations, &signer(), convs[0], 0, 1)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_between_the_batches_is_recovered_under_the_same_turn_id() {
    let fleet = Fleet::start(&binary()).await;
    let convs = create_conversations(&fleet.conversations, &signer(), 1).await;
    let (mut doomed, doomed_id) = fleet.failing_worker("after-batch-one=hang");
    publish(fleet.bus.clone(), &fleet.conversations, &convs, 0, 3, LONG)
        .await
        .unwrap();
    doomed
        .wait_for_line("failpoint after-batch-one", LONG)
        .unwrap();
    doomed.kill();
    let (_rescuer, rescuer_id) = fleet.worker(&[]);
    wait_for_turns(&fleet.conversations, &convs, 3, LONG)
        .await
        .unwrap();
    check_conversation(&fleet.conversations, &signer(), convs[0], 0, 3)
        .await
        .unwrap();
    // Turn 1 was dispatched by the killed worker and completed by the other.
    let first_dispatch = dispatched(&fleet.conversations, convs[0])
        .await
        .into_iter()
        .next()
        .unwrap();
    assert_eq!(first_dispatch.turn.number(), 1);
    assert_eq!(first_dispatch.worker.to_string(), doomed_id);
    assert_ne!(doomed_id, rescuer_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_held_by_a_killed_worker_is_taken_over_after_its_ttl() {
    // Killed as its owner starts, and before it is registered (nothing is sent afterwards:
    // the wakes come back by themselves).
    for failpoint in ["after-claim", "claim-won"] {
        let fleet = Fleet::start(&binary()).await;
        let convs = create_conversations(&fleet.conversations, &signer(), 1).await;
        let (mut doomed, _) = fleet.failing_worker(&format!("{failpoint}=hang"));
        publish(fleet.bus.clone(), &fleet.conversations, &convs, 0, 5, LONG)
            .await
            .unwrap();
        doomed
            .wait_for_line(&format!("failpoint {failpoint}"), LONG)
            .unwrap();
        doomed.kill();
        let (_rescuer, _) = fleet.worker(&[]);
        wait_for_turns(&fleet.conversations, &convs, 5, LONG)
            .await
            .unwrap();
        check_conversation(&fleet.conversations, &signer(), convs[0], 0, 5)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_restart_in_the_middle_of_a_run_loses_and_duplicates_nothing() {
    let mut fleet = Fleet::start(&binary()).await;
    let _workers: Vec<_> = (0..2).map(|_| fleet.worker(&[])).collect();
    let convs = create_conversations(&fleet.conversations, &signer(), 30).await;
    publish(fleet.bus.clone(), &fleet.conversations, &convs, 0, 5, LONG)
        .await
        .unwrap();
    wait_for_turns(&fleet.conversations, &convs[..1], 1, LONG)
        .await
        .unwrap();
    fleet.nats.restart().unwrap();
    // Publishers retry with the same idempotency keys until NATS is back.
    publish(fleet.bus.clone(), &fleet.conversations, &convs, 5, 10, LONG)
        .await
        .unwrap();
    wait_for_turns(&fleet.conversations, &convs, 10, LONG)
        .await
        .unwrap();
    for (i, conv) in convs.iter().enumerate() {
        check_conversation(&fleet.conversations, &signer(), *conv, i, 10)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_idempotency_key_sent_three_times_is_one_event() {
    let fleet = Fleet::start(&binary()).await;
    let convs = create_conversations(&fleet.conversations, &signer(), 1).await;
    for _ in 0..3 {
        // `publish` sends event j with key `k{j}`: three sends of event 0.
        publish(fleet.bus.clone(), &fleet.conversations, &convs, 0, 1, LONG)
            .await
            .unwrap();
    }
    assert_eq!(
        fleet
            .bus
            .read_lane(convs[0], 0, None, 10)
            .await
            .unwrap()
            .len(),
        1
    );
    let (_w, _) = fleet.worker(&[]);
    wait_for_turns(&fleet.conversations, &convs, 1, LONG)
        .await
        .unwrap();
    check_conversation(&fleet.conversations, &signer(), convs[0], 0, 1)
        .await
        .unwrap();
}

/// The record's `turn_dispatched` entries for `conversation`, in record order.
async fn dispatched(
    conversations: &Conversations,
    conversation: turnpike_schemas::ConversationId,
) -> Vec<TurnDispatched> {
    record(conversations, conversation)
        .entries()
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.body {
            EntryBody::TurnDispatched(d) => Some(d),
            _ => None,
        })
        .collect()
}

/// The workers that opened the conversation's turns, in record order.
async fn dispatchers(
    conversations: &Conversations,
    conversation: turnpike_schemas::ConversationId,
) -> Vec<String> {
    let opened = dispatched(conversations, conversation).await;
    opened.iter().map(|d| d.worker.to_string()).collect()
}

/// An embedded bus and a local store in a temporary directory, for workers in this process.
fn embedded_in_process() -> (tempfile::TempDir, Arc<dyn Bus>, Conversations) {
    let dir = tempfile::tempdir().unwrap();
    let bus: Arc<dyn Bus> =
        EmbeddedBus::open(&dir.path().join("bus.redb"), EmbeddedConfig::default()).unwrap();
    let conversations = Conversations::new(
        turnpike_artifactory::open_store(dir.path().join("store").to_str().unwrap()).unwrap(),
    );
    (dir, bus, conversations)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_workers_keep_order_and_lose_nothing() {
    let (dir, bus, conversations) = embedded_in_process();
    let convs = create_conversations(&conversations, &signer(), 100).await;
    let pool = WorkerPool::start((0..4).map(|_| {
        Worker::new(
            bus.clone(),
            conversations.clone(),
            signer(),
            Arc::new(Apps::new().with_fallback(Arc::new(EchoAgent))),
            WorkerConfig {
                workspace_root: dir.path().join("workspaces"),
                ..WorkerConfig::default()
            },
        )
    }));
    publish(bus.clone(), &conversations, &convs, 0, 10, LONG)
        .await
        .unwrap();
    wait_for_turns(&conversations, &convs, 10, LONG)
        .await
        .unwrap();
    pool.stop().await;
    // Every turn had a workspace, and none is left behind.
    let left: Vec<_> = std::fs::read_dir(dir.path().join("workspaces"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "{left:?}");
    for (i, conv) in convs.iter().enumerate() {
        check_conversation(&conversations, &signer(), *conv, i, 10)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_serve_killed_and_restarted_loses_and_duplicates_nothing() {
    let data = tempfile::tempdir().unwrap();
    let key = signer().to_hex();
    let conversations = Conversations::new(
        turnpike_artifactory::open_store(data.path().join("store").to_str().unwrap()).unwrap(),
    );
    let convs =
        create_conversations(&conversations, &RecordSigner::from_hex(&key).unwrap(), 20).await;
    // Accepted while nothing runs: the events wait, durable, in the embedded bus.
    {
        let bus: Arc<dyn Bus> =
            EmbeddedBus::open(&data.path().join("bus.redb"), EmbeddedConfig::default()).unwrap();
        publish(bus, &conversations, &convs, 0, 10, LONG)
            .await
            .unwrap();
    }
    let serve = || {
        let args: Vec<String> = vec![
            "--data-dir".into(),
            data.path().to_string_lossy().into_owned(),
            "serve".into(),
            "--workers".into(),
            "2".into(),
            "--lease-ttl-ms".into(),
            "2000".into(),
        ];
        let mut p =
            Process::start(&binary(), &args, &[("TURNPIKE_SIGNING_KEY", key.clone())]).unwrap();
        p.wait_for_line("worker wkr_", Duration::from_secs(60))
            .unwrap();
        p
    };
    let mut first = serve();
    wait_for_turns(&conversations, &convs[..1], 2, LONG)
        .await
        .unwrap();
    first.kill();
    let _second = serve();
    wait_for_turns(&conversations, &convs, 10, LONG)
        .await
        .unwrap();
    for (i, conv) in convs.iter().enumerate() {
        check_conversation(&conversations, &signer(), *conv, i, 10)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_events_are_refused_at_ingress_and_never_reach_a_lane() {
    use turnpike_router::{ErrorKind, Ingress};
    use turnpike_schemas::EventBody;
    let fleet = Fleet::start(&binary()).await;
    let convs = create_conversations(&fleet.conversations, &signer(), 1).await;
    let ingress = Ingress::new(fleet.bus.clone(), fleet.conversations.clone());
    let owner = fixtures::owner();
    let too_long = EventBody::Message {
        text: "x".repeat(turnpike_schemas::event::MAX_TEXT_BYTES + 1),
    };
    let err = ingress
        .submit(&fixtures::tenant(), &owner, convs[0], too_long, None)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid);
    assert!(err.to_string().contains("limit"), "{err}");
    let empty = EventBody::Message { text: " ".into() };
    assert_eq!(
        ingress
            .submit(&fixtures::tenant(), &owner, convs[0], empty, None)
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::Invalid
    );
    let bad_key = Some("has spaces".to_owned());
    let hi = || EventBody::Message { text: "hi".into() };
    assert_eq!(
        ingress
            .submit(&fixtures::tenant(), &owner, convs[0], hi(), bad_key)
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::Invalid
    );
    // Someone else's conversation, and one that does not exist, look the same.
    let stranger: turnpike_schemas::Identity = "oidc:acme:u-99".parse().unwrap();
    let theirs = ingress
        .submit(&fixtures::tenant(), &stranger, convs[0], hi(), None)
        .await
        .unwrap_err();
    let missing = ingress
        .submit(
            &fixtures::tenant(),
            &owner,
            turnpike_schemas::ConversationId::new(),
            hi(),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(
        (theirs.kind(), missing.kind()),
        (ErrorKind::NotFound, ErrorKind::NotFound)
    );
    assert!(fleet
        .bus
        .read_lane(convs[0], 0, None, 10)
        .await
        .unwrap()
        .is_empty());
}

/// SIGTERM while a wake's lease claim has been won but its owner is not running yet: the worker
/// waits for that wake's owner and releases the lease, so the next worker does not wait for the
/// lease's TTL (a minute here; the turn must be done well before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_between_a_won_claim_and_its_owner_leaves_no_lease_behind() {
    let fleet = Fleet::start(&binary()).await;
    let convs = create_conversations(&fleet.conversations, &signer(), 1).await;
    let (mut first, _) =
        fleet.worker_with(&["--lease-ttl-ms", "60000"], Some("claim-won=pause(1500)"));
    publish(fleet.bus.clone(), &fleet.conversations, &convs, 0, 1, LONG)
        .await
        .unwrap();
    first.wait_for_line("failpoint claim-won", LONG).unwrap();
    let status = first.terminate(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status:?}");
    let (_second, _) = fleet.worker(&[]);
    wait_for_turns(&fleet.conversations, &convs, 1, Duration::from_secs(30))
        .await
        .unwrap();
    check_conversation(&fleet.conversations, &signer(), convs[0], 0, 1)
        .await
        .unwrap();
}

/// SIGTERM while an owner that has finished (and left the owner map) has not released its
/// lease yet: the worker waits for the release, so the next worker does not wait for the
/// lease's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_before_a_finished_owner_releases_its_lease_leaves_no_lease_behind() {
    let fleet = Fleet::start(&binary()).await;
    let convs = create_conversations(&fleet.conversations, &signer(), 1).await;
    let (mut first, _) = fleet.worker_with(
        &["--lease-ttl-ms", "60000"],
        Some("before-release=pause(1500)"),
    );
    publish(fleet.bus.clone(), &fleet.conversations, &convs, 0, 1, LONG)
        .await
        .unwrap();
    first
        .wait_for_line("failpoint before-release", LONG)
        .unwrap();
    let status = first.terminate(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status:?}");
    let (_second, _) = fleet.worker(&[]);
    publish(fleet.bus.clone(), &fleet.conversations, &convs, 1, 2, LONG)
        .await
        .unwrap();
    wait_for_turns(&fleet.conversations, &convs, 2, Duration::from_secs(30))
        .await
        .unwrap();
    check_conversation(&fleet.conversations, &signer(), convs[0], 0, 2)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_a_worker_cleanly_and_another_continues_without_waiting_for_leases() {
    let fleet = Fleet::start(&binary()).await;
    let convs = create_conversations(&fleet.conversations, &signer(), 5).await;
    // A long lease: if the stopping worker did not release, the next one would wait a minute.
    let (mut first, _) = fleet.worker(&["--lease-ttl-ms", "60000"]);
    publish(fleet.bus.clone(), &fleet.conversations, &convs, 0, 2, LONG)
        .await
        .unwrap();
    wait_for_turns(&fleet.conversations, &convs, 2, LONG)
        .await
        .unwrap();
    let status = first.terminate(Duration::from_secs(60)).unwrap();
    assert!(status.success(), "{status:?}");
    let (_second, _) = fleet.worker(&[]);
    publish(fleet.bus.clone(), &fleet.conversations, &convs, 2, 4, LONG)
        .await
        .unwrap();
    wait_for_turns(&fleet.conversations, &convs, 4, Duration::from_secs(50))
        .await
        .unwrap();
    for (i, conv) in convs.iter().enumerate() {
        check_conversation(&fleet.conversations, &signer(), *conv, i, 4)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_owner_that_wakes_up_after_a_takeover_is_fenced() {
    let fleet = Fleet::start(&binary()).await;
    let convs = create_conversations(&fleet.conversations, &signer(), 1).await;
    let (mut zombie, _) = fleet.failing_worker("after-batch-one=pause(3000)");
    publish(fleet.bus.clone(), &fleet.conversations, &convs, 0, 1, LONG)
        .await
        .unwrap();
    zombie
        .wait_for_line("failpoint after-batch-one", LONG)
        .unwrap();
    // Frozen mid-turn: its lease is not renewed and expires; another worker takes over and
    // completes turn 1 under the same turn id.
    zombie.freeze();
    let (_rescuer, _) = fleet.worker(&[]);
    wait_for_turns(&fleet.conversations, &convs, 1, LONG)
        .await
        .unwrap();
    // The zombie wakes up past its lease: its fence stops it before it writes anything — no
    // turn log, snapshot or file of its lands over the new owner's — and it stops.
    let log = fleet.store.path().join(
        record(&fleet.conversations, convs[0])
            .prefix()
            .turn_log(turnpike_schemas::TurnId::FIRST)
            .as_ref(),
    );
    // The record shows the turn complete just before the rescuer promotes its log to the
    // canonical key: wait for the promotion.
    let deadline = std::time::Instant::now() + LONG;
    while !log.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the rescuer never promoted the turn log"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = std::fs::metadata(&log).unwrap().modified().unwrap();
    let thawed_at = std::time::SystemTime::now();
    zombie.thaw();
    zombie.wait_for_line("fenced", LONG).unwrap();
    let after = std::fs::metadata(&log).unwrap().modified().unwrap();
    assert_eq!(before, after, "the zombie rewrote the turn log");
    assert!(after < thawed_at);
    publish(fleet.bus.clone(), &fleet.conversations, &convs, 1, 3, LONG)
        .await
        .unwrap();
    wait_for_turns(&fleet.conversations, &convs, 3, LONG)
        .await
        .unwrap();
    check_conversation(&fleet.conversations, &signer(), convs[0], 0, 3)
        .await
        .unwrap();
}

/// An owner frozen at the end of its drain, past its lease, cannot clear its open-turn mark;
/// a sweep clears it meanwhile (the turns are closed). When the owner wakes up and claims the
/// lease again for a message that came, it must mark the conversation before that turn's batch
/// one: a record that ends in an open turn always has a mark, or a crash now would leave the
/// turn to no one (no later event, and no mark for the sweep). Whether the owner's re-read or
/// the message's wake claims the lease first is a race (the wake wins most often): the
/// scenario runs on fresh conversations until the owner's re-claim was seen, and each round
/// checks the mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_whose_mark_was_swept_while_it_was_frozen_marks_again_before_its_next_turn() {
    const PAUSE: Duration = Duration::from_millis(1500);
    let fleet = Fleet::start(&binary()).await;
    let marks = fleet.conversations.open_turns();
    let (mut frozen, _) = fleet.worker_with(
        &["--log", "warn,turnpike_wakes=debug"],
        Some("drain-end=pause(1500),after-batch-one=pause(1000)"),
    );
    let sweeper = Worker::new(
        fleet.bus.clone(),
        fleet.conversations.clone(),
        signer(),
        Arc::new(Apps::new().with_fallback(Arc::new(EchoAgent))),
        short_leases(),
    );
    for round in 1..=30 {
        let conv = create_conversations(&fleet.conversations, &signer(), 1).await[0];
        let prefix = turnpike_artifactory::ConversationPrefix::new(fixtures::tenant(), conv);
        publish(fleet.bus.clone(), &fleet.conversations, &[conv], 0, 1, LONG)
            .await
            .unwrap();
        frozen
            .wait_for_line(&format!("drain-end: Pause(1.5s) at {conv}"), LONG)
            .unwrap();
        frozen.freeze();
        // The pause began before its line was read: it is over by this instant.
        let pause_over = tokio::time::Instant::now() + PAUSE;
        assert!(marks.is_marked(&prefix).await.unwrap());
        // Its lease lapses; a sweep takes it, finds every turn closed and clears the mark.
        until(LONG, "the sweep clears the mark", || async {
            sweeper.sweep().await;
            !marks.is_marked(&prefix).await.unwrap()
        })
        .await;
        publish(fleet.bus.clone(), &fleet.conversations, &[conv], 1, 2, LONG)
            .await
            .unwrap();
        // Frozen until its pause is over, so that the owner wakes up with its drain's end due
        // at once (not its lease's renewal first, which would find the lease taken and stop
        // it).
        tokio::time::sleep_until(pause_over).await;
        frozen.thaw();
        // Turn 2 is open (paused after its batch one), by whichever path it was claimed.
        frozen
            .wait_for_line(
                &format!("after-batch-one: Pause(1s) at {conv} turn_2"),
                LONG,
            )
            .unwrap();
        assert!(
            marks.is_marked(&prefix).await.unwrap(),
            "turn 2 is open with no mark for the sweep (round {round})"
        );
        wait_for_turns(&fleet.conversations, &[conv], 2, LONG)
            .await
            .unwrap();
        check_conversation(&fleet.conversations, &signer(), conv, 0, 2)
            .await
            .unwrap();
        // Only this round's conversation has an owner: a re-claim seen now is its own.
        if frozen
            .wait_for_line("claimed again", Duration::from_millis(1))
            .is_ok()
        {
            return;
        }
    }
    panic!("in 30 rounds, the owner never claimed the lease again before the wake did");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_router_of_a_fleet_serves_any_conversation_and_streams_from_any_worker() {
    use turnpike_edge::client::{Client, Cursor};
    use turnpike_edge::model::Frame;
    let fleet = Fleet::start(&binary()).await;
    let tokens = fleet.data.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        "[[tokens]]\ntoken = \"t-ana\"\nidentity = \"oidc:acme:ana\"\ntenant = \"acme\"\n",
    )
    .unwrap();
    let _workers: Vec<_> = (0..2).map(|_| fleet.worker(&[])).collect();
    let (_a, base_a) = fleet.router(&tokens);
    let (_b, base_b) = fleet.router(&tokens);
    let a = Client::new(&base_a, "t-ana");
    let b = Client::new(&base_b, "t-ana");

    // Created through router A, streamed through router B, written to through A.
    let created = a
        .post(
            "/v1/conversations",
            &serde_json::json!({"app": "demo", "agent": "assistant"}),
        )
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(created["tenant"], "acme");
    let mut stream = b.stream(&id).await.unwrap();
    assert!(matches!(
        stream.next_within(LONG).await,
        Some(Frame::Ready { .. })
    ));
    a.post(
        &format!("/v1/conversations/{id}/messages"),
        &serde_json::json!({"text": "hello fleet"}),
    )
    .await
    .unwrap()
    .into_ok()
    .unwrap();
    let mut cursor = Cursor::new(&id);
    let (mut streamed, mut replied) = (String::new(), None);
    let deadline = std::time::Instant::now() + LONG;
    while replied.is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "no reply through router B"
        );
        match stream.next_within(Duration::from_secs(10)).await {
            Some(Frame::Delta { text, .. }) => streamed.push_str(&text),
            _ => {
                let rows = cursor.read(&b).await.unwrap();
                replied = rows
                    .iter()
                    .find(|r| r["kind"] == "assistant_message")
                    .and_then(|r| r["text"].as_str().map(str::to_owned));
            }
        }
    }
    let reply = replied.unwrap();
    assert!(reply.contains("hello fleet"), "{reply}");
    // The deltas crossed NATS from whichever worker ran the turn to router B. They are advisory
    // and may trail the committed row: keep reading until they cover it (or time runs out).
    while streamed.trim_end() != reply.trim_end() && std::time::Instant::now() < deadline {
        match stream.next_within(Duration::from_secs(5)).await {
            Some(Frame::Delta { text, .. }) => streamed.push_str(&text),
            Some(_) => {}
            None => break,
        }
    }
    assert!(
        !streamed.is_empty() && reply.starts_with(streamed.trim_end()),
        "{streamed:?}"
    );
    // Both routers list it.
    for client in [&a, &b] {
        let list = client
            .get("/v1/conversations")
            .await
            .unwrap()
            .into_ok()
            .unwrap();
        assert_eq!(list["conversations"][0]["id"], id.as_str());
    }
}

/// A wake handle that remembers what was done with it.
#[derive(Clone, Default)]
struct Recorded(Arc<std::sync::Mutex<Vec<&'static str>>>);

#[async_trait]
impl WakeAck for Recorded {
    async fn ack(&self) -> turnpike_router::Result<()> {
        self.0.lock().unwrap().push("ack");
        Ok(())
    }
    async fn nak(&self, _: Duration) -> turnpike_router::Result<()> {
        self.0.lock().unwrap().push("nak");
        Ok(())
    }
    async fn progress(&self) -> turnpike_router::Result<()> {
        Ok(())
    }
}

/// Waits until `check` holds, polling; fails after `timeout` saying `what`.
async fn until<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + timeout;
    while !check().await {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A turn left open after batch one: its owner (`config`, hanging there) still holds the
/// lease, and the event's wake was taken and acked beforehand, so nothing on the bus will ever
/// bring it back.
struct LeftOpen {
    conversation: ConversationId,
    /// The event's lane sequence.
    seq: u64,
    /// The owner, hanging after batch one (`crash` it to let its lease lapse).
    doomed: Worker,
    record: turnpike_artifactory::Record,
}

async fn a_turn_left_open(fleet: &Fleet, apps: &Arc<Apps>, config: &WorkerConfig) -> LeftOpen {
    use turnpike_worker::Failpoints;
    let convs = create_conversations(&fleet.conversations, &signer(), 1).await;
    publish(fleet.bus.clone(), &fleet.conversations, &convs, 0, 1, LONG)
        .await
        .unwrap();
    // The bus's own wake is taken and acked here: nothing will ever bring this event back.
    let real = fleet.bus.next_wake().await.unwrap();
    let seq = real.seq;
    real.ack().await.unwrap();
    let doomed = Worker::new(
        fleet.bus.clone(),
        fleet.conversations.clone(),
        signer(),
        apps.clone(),
        WorkerConfig {
            failpoints: Failpoints::default().with(
                "after-batch-one",
                turnpike_lifecycle::failpoints::Action::Hang,
            ),
            ..config.clone()
        },
    );
    doomed
        .handle(Wake::new(
            convs[0],
            fixtures::tenant(),
            seq,
            1,
            Box::new(HandAck),
        ))
        .await;
    let rec = record(&fleet.conversations, convs[0]);
    until(LONG, "batch one of turn 1", || async {
        rec.head().await.unwrap().state().turn_open
    })
    .await;
    LeftOpen {
        conversation: convs[0],
        seq,
        doomed,
        record: rec,
    }
}

/// Leases that lapse 1.5 s after their owner dies.
fn short_leases() -> WorkerConfig {
    WorkerConfig {
        lease_ttl: Duration::from_millis(1500),
        renew_every: Duration::from_millis(500),
        ..WorkerConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_turn_is_never_acked_by_a_bystander_and_a_sweep_recovers_it_with_no_event_left() {
    let fleet = Fleet::start(&binary()).await;
    let apps = Arc::new(Apps::new().with_fallback(Arc::new(EchoAgent)));
    let config = short_leases();
    let LeftOpen {
        conversation,
        seq,
        doomed,
        record: rec,
    } = a_turn_left_open(&fleet, &apps, &config).await;
    let convs = [conversation];

    // A bystander gets the wake again while the turn is open: it cannot take the lease, and
    // the lane is committed past the wake — but the turn is not complete, so it must not ack.
    let bystander = Worker::new(
        fleet.bus.clone(),
        fleet.conversations.clone(),
        signer(),
        apps,
        config,
    );
    let seen = Recorded::default();
    bystander
        .handle(Wake::new(
            convs[0],
            fixtures::tenant(),
            seq,
            2,
            Box::new(seen.clone()),
        ))
        .await;
    assert_eq!(*seen.0.lock().unwrap(), ["nak"]);

    // The owner dies between the batches, holding its lease. No event will come: the sweep
    // alone must find the open turn once the lease lapses, and finish it under its id.
    doomed.crash();
    let deadline = std::time::Instant::now() + LONG;
    loop {
        bystander.sweep().await;
        let head = rec.head().await.unwrap();
        if head.state().last_turn == 1 && !head.state().turn_open {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the sweep never recovered the turn"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bystander.idle().await;
    check_conversation(&fleet.conversations, &signer(), convs[0], 0, 1)
        .await
        .unwrap();
    let dispatches = fixtures::dispatched_turns(&rec.entries().await.unwrap()).len();
    assert_eq!(dispatches, 1, "recovered under the same turn id");
    // The mark went with the turn.
    assert!(fleet
        .conversations
        .open_turns()
        .list()
        .await
        .unwrap()
        .is_empty());
}

/// A worker stopped while its sweep is claiming the lease of a turn left open waits for the
/// sweep to be done with that lease: once the stop returns, the lease is free for any worker
/// (not held until its time to live runs out by a sweep that outlived its worker's stop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_worker_waits_for_its_sweep_to_let_go_of_the_lease_it_claims() {
    let fleet = Fleet::start(&binary()).await;
    let apps = Arc::new(Apps::new().with_fallback(Arc::new(EchoAgent)));
    let config = short_leases();
    let left = a_turn_left_open(&fleet, &apps, &config).await;
    left.doomed.crash();
    let bus = turnpike_tests::counting_bus::CountingBus::new(fleet.bus.clone());
    bus.hold_claims(left.conversation);
    // The sweep's owner will re-run the turn left open: it runs until released here.
    let hold = HoldOne::new(left.conversation);
    let sweeper = Worker::new(
        bus.clone(),
        fleet.conversations.clone(),
        signer(),
        Arc::new(Apps::new().with_fallback(hold.clone())),
        WorkerConfig {
            lease_ttl: Duration::from_secs(120),
            ..config
        },
    );
    let pool = WorkerPool::start([sweeper]);
    // The first sweep runs at once and reaches the claim, held back here.
    until(LONG, "the sweep claims", || async { bus.claims_held() > 0 }).await;
    // The doomed owner's lease lapses (a probe claim wins, and lets go at once).
    let free = || async {
        let probe = turnpike_schemas::WorkerId::new();
        match fleet
            .bus
            .claim(left.conversation, probe, Duration::from_secs(10))
            .await
        {
            Ok(Some(lease)) => fleet.bus.release(&lease).await.is_ok(),
            _ => false,
        }
    };
    until(LONG, "the lease lapses", free).await;
    let mut stop = tokio::spawn(pool.stop());
    // Stopping waits for the sweep's claim; a stop that does not wait returns at once.
    let returned = tokio::time::timeout(Duration::from_secs(2), &mut stop)
        .await
        .is_ok();
    bus.let_claims_go();
    // The sweep won the lease and its owner runs the turn again (holding the lease).
    until(LONG, "the recovered turn runs", || async {
        hold.running.load(std::sync::atomic::Ordering::SeqCst)
    })
    .await;
    if !returned {
        hold.release.add_permits(1);
        stop.await.unwrap();
    }
    let lease_free = free().await;
    hold.release.add_permits(1);
    assert!(
        lease_free,
        "the stop returned while its sweep went on to hold the lease (before the claim: {returned})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_after_batch_one_with_no_later_event_is_finished_by_another() {
    let fleet = Fleet::start(&binary()).await;
    let convs = create_conversations(&fleet.conversations, &signer(), 1).await;
    let (mut doomed, _) = fleet.failing_worker("after-batch-one=hang");
    publish(fleet.bus.clone(), &fleet.conversations, &convs, 0, 1, LONG)
        .await
        .unwrap();
    doomed
        .wait_for_line("failpoint after-batch-one", LONG)
        .unwrap();
    doomed.kill();
    // Nothing else is sent to this lane.
    let (_rescuer, _) = fleet.worker(&["--sweep-every-ms", "500"]);
    wait_for_turns(&fleet.conversations, &convs, 1, LONG)
        .await
        .unwrap();
    check_conversation(&fleet.conversations, &signer(), convs[0], 0, 1)
        .await
        .unwrap();
}

const CHAOS_CONVERSATIONS: usize = 30;
const CHAOS_MESSAGES: usize = 10;

/// Sends `text` to conversation `id` with `key`, through whichever router answers; retries
/// with the same key until one accepts it.
async fn send_somewhere(
    bases: &[String],
    token: &str,
    id: &str,
    text: &str,
    key: &str,
    first: usize,
) {
    let deadline = std::time::Instant::now() + LONG;
    let body = serde_json::json!({ "text": text });
    let path = format!("/v1/conversations/{id}/messages");
    for attempt in 0.. {
        let base = &bases[(first + attempt) % bases.len()];
        let client = turnpike_edge::client::Client::new(base, token);
        match client
            .send(reqwest::Method::POST, &path, Some(&body), Some(key))
            .await
        {
            Ok(reply) if reply.status == 202 => return,
            Ok(reply) if reply.status < 500 && reply.status != 429 => {
                panic!("{text}: refused with {}: {:?}", reply.status, reply.body)
            }
            _ => {}
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{text} was never accepted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_driven_through_the_api_while_workers_and_routers_are_killed_finishes_everything() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use turnpike_tests::edge::{turns_of, TurnSummary};
    let mut fleet = Fleet::start(&binary()).await;
    let apps = tempfile::tempdir().unwrap();
    std::fs::write(
        apps.path().join("chaos.toml"),
        "app = \"chaos\"\n\n[agents.echo]\nprovider = \"echo\"\n",
    )
    .unwrap();
    fleet.apps = Some(apps.path().to_path_buf());
    let tokens = fleet.data.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        "[[tokens]]\ntoken = \"t-ana\"\nidentity = \"oidc:acme:ana\"\ntenant = \"acme\"\n",
    )
    .unwrap();
    let fleet = Arc::new(fleet);
    const WORKER_ARGS: [&str; 2] = ["--sweep-every-ms", "1000"];
    let workers: Arc<std::sync::Mutex<Vec<Process>>> = Arc::new(std::sync::Mutex::new(
        (0..3).map(|_| fleet.worker(&WORKER_ARGS).0).collect(),
    ));
    let ports: Vec<u16> = (0..2)
        .map(|_| turnpike_tests::services::free_port().unwrap())
        .collect();
    let routers: Arc<std::sync::Mutex<Vec<Process>>> = Arc::new(std::sync::Mutex::new(
        ports
            .iter()
            .map(|p| fleet.router_on(&tokens, *p).0)
            .collect(),
    ));
    let bases: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();

    let client = turnpike_edge::client::Client::new(&bases[0], "t-ana");
    let mut ids = Vec::new();
    for _ in 0..CHAOS_CONVERSATIONS {
        let created = client
            .post(
                "/v1/conversations",
                &serde_json::json!({"app": "chaos", "agent": "echo"}),
            )
            .await
            .unwrap()
            .into_ok()
            .unwrap();
        ids.push(created["id"].as_str().unwrap().to_owned());
    }

    // Every second a random worker is SIGKILLed and replaced; every fourth, a router too. The
    // thread that starts processes must outlive them (the harness kills a process when its
    // starting thread ends), so it stays until the test is done.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let killer = {
        let (stop, done, kills, fleet, workers, routers, tokens, ports) = (
            stop.clone(),
            done.clone(),
            kills.clone(),
            fleet.clone(),
            workers.clone(),
            routers.clone(),
            tokens.clone(),
            ports.clone(),
        );
        std::thread::spawn(move || {
            let mut tick = 0usize;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_secs(1));
                tick += 1;
                let victim = (tick * 7919 + 13) % 3;
                workers.lock().unwrap()[victim].kill();
                kills.fetch_add(1, Ordering::Relaxed);
                let fresh = fleet.worker(&WORKER_ARGS).0;
                workers.lock().unwrap()[victim] = fresh;
                if tick.is_multiple_of(4) {
                    let r = tick / 4 % 2;
                    routers.lock().unwrap()[r].kill();
                    let fresh = fleet.router_on(&tokens, ports[r]).0;
                    routers.lock().unwrap()[r] = fresh;
                }
            }
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
            workers.lock().unwrap().clear();
            routers.lock().unwrap().clear();
        })
    };
    for m in 0..CHAOS_MESSAGES {
        let sends = ids.iter().enumerate().map(|(i, id)| {
            let bases = bases.clone();
            async move {
                let text = format!("c{i}-m{m}");
                send_somewhere(&bases, "t-ana", id, &text, &format!("key-{i}-{m}"), i + m).await
            }
        });
        futures::future::join_all(sends).await;
        // Spread the sends over several kills.
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let kills = kills.load(Ordering::Relaxed);
    assert!(
        kills >= 3,
        "only {kills} kills happened during the send phase"
    );

    // Nobody helps from here on: every conversation must finish by itself.
    let deadline = std::time::Instant::now() + LONG;
    let mut unfinished: Vec<(usize, Vec<TurnSummary>)> = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let expected: Vec<String> = (0..CHAOS_MESSAGES).map(|m| format!("c{i}-m{m}")).collect();
        let turns = loop {
            let client = turnpike_edge::client::Client::new(&bases[i % 2], "t-ana");
            let mut cursor = turnpike_edge::client::Cursor::new(id);
            let rows = cursor.read(&client).await.unwrap_or_default();
            let turns = turns_of(&rows);
            let inputs: Vec<String> = turns.iter().flat_map(|t| t.inputs.clone()).collect();
            if inputs.len() >= CHAOS_MESSAGES && turns.iter().all(|t| t.outcome.is_some()) {
                break turns;
            }
            if std::time::Instant::now() > deadline {
                unfinished.push((i, turns));
                break Vec::new();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        if turns.is_empty() {
            continue;
        }
        let inputs: Vec<String> = turns.iter().flat_map(|t| t.inputs.clone()).collect();
        assert_eq!(
            inputs, expected,
            "conversation {i}: each message once, in order"
        );
        for t in &turns {
            assert_eq!(
                t.outcome.as_deref(),
                Some("replied"),
                "conversation {i}: {t:?}"
            );
        }
        let prefix = turnpike_artifactory::ConversationPrefix::new(
            "acme".parse().unwrap(),
            id.parse().unwrap(),
        );
        let keys = turnpike_artifactory::TrustedKeys::new([signer().verifying_key()]);
        turnpike_artifactory::Record::new(fleet.conversations.store().clone(), prefix)
            .verify(&keys, None)
            .await
            .unwrap()
            .unwrap_or_else(|f| panic!("conversation {i} does not verify: {f:?}"));
    }
    done.store(true, Ordering::Relaxed);
    tokio::task::spawn_blocking(move || killer.join().unwrap())
        .await
        .unwrap();
    assert!(
        unfinished.is_empty(),
        "unfinished conversations: {unfinished:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_shard_count_or_a_recreated_lane_stream_stops_processes_from_starting() {
    let fleet = Fleet::start(&binary()).await;
    // The first process persists the layout.
    let (_first, _) = fleet.worker(&[]);
    // Another shard count: refused, saying what to do.
    let (mut other, line) = fleet.spawn(
        vec!["--shards".into(), "4".into(), "worker".into()],
        "lane shards",
    );
    assert!(line.contains("--shards 8"), "{line}");
    assert!(other.wait_exit(LONG).is_some_and(|code| code != 0));
    // A lane stream deleted and recreated: its sequences restart; refused too.
    let client = async_nats::connect(fleet.nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    js.delete_stream("TP_LANES_0").await.unwrap();
    let (mut again, line) = fleet.spawn(vec!["worker".into()], "was recreated");
    assert!(line.contains("TP_LANES_0"), "{line}");
    assert!(again.wait_exit(LONG).is_some_and(|code| code != 0));
}

/// A fleet hosting the `queue` app, with a router; returns it, the apps directory (kept for
/// the fleet's life) and a client of the router.
async fn queue_fleet() -> (Fleet, tempfile::TempDir, std::path::PathBuf) {
    let mut fleet = Fleet::start(&binary()).await;
    let apps = turnpike_tests::edge::queue_apps();
    fleet.apps = Some(apps.path().to_path_buf());
    let tokens = fleet.data.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        "[[tokens]]\ntoken = \"t-ana\"\nidentity = \"oidc:acme:ana\"\ntenant = \"acme\"\n",
    )
    .unwrap();
    (fleet, apps, tokens)
}

async fn queue_conversation(client: &turnpike_edge::client::Client, agent: &str) -> String {
    let created = client
        .post(
            "/v1/conversations",
            &serde_json::json!({"app": "queue", "agent": agent}),
        )
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    created["id"].as_str().unwrap().to_owned()
}

async fn say(client: &turnpike_edge::client::Client, id: &str, text: &str) {
    client
        .post(
            &format!("/v1/conversations/{id}/messages"),
            &serde_json::json!({ "text": text }),
        )
        .await
        .unwrap()
        .into_ok()
        .unwrap();
}

fn assert_each_answered(turns: &[turnpike_tests::edge::TurnSummary], words: &[String]) {
    assert_eq!(turns.len(), words.len(), "{turns:#?}");
    for (turn, word) in turns.iter().zip(words) {
        assert_eq!(turn.outcome.as_deref(), Some("replied"), "{turns:#?}");
        assert_eq!(&turn.inputs, &vec![word.clone()], "{turns:#?}");
        assert_eq!(
            turn.replies,
            vec![format!("answer to: {word}")],
            "{turns:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_fleet_every_message_gets_its_own_turn_in_order() {
    use turnpike_tests::edge::{wait_for_complete_turns, wait_for_status};
    let (fleet, _apps, tokens) = queue_fleet().await;
    let _workers: Vec<_> = (0..2).map(|_| fleet.worker(&[])).collect();
    let (_router, base) = fleet.router(&tokens);
    let client = turnpike_edge::client::Client::new(&base, "t-ana");

    // A second message while the slow model thinks about the first.
    let id = queue_conversation(&client, "slow").await;
    say(&client, &id, "one").await;
    wait_for_status(&client, &id, "running", LONG)
        .await
        .unwrap();
    say(&client, &id, "two").await;
    let turns = wait_for_complete_turns(&client, &id, 2, LONG)
        .await
        .unwrap();
    assert_each_answered(&turns, &["one".into(), "two".into()]);

    // Twenty in a burst.
    let id = queue_conversation(&client, "quick").await;
    let words: Vec<String> = (1..=20).map(|i| format!("burst {i:02}")).collect();
    for word in &words {
        say(&client, &id, word).await;
    }
    let turns = wait_for_complete_turns(&client, &id, 20, LONG)
        .await
        .unwrap();
    assert_each_answered(&turns, &words);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_killed_after_batch_one_is_retried_under_its_id_before_the_waiting_message() {
    use turnpike_tests::edge::wait_for_complete_turns;
    let (fleet, _apps, tokens) = queue_fleet().await;
    let (mut doomed, _) = fleet.failing_worker("after-batch-one=hang");
    let (_router, base) = fleet.router(&tokens);
    let client = turnpike_edge::client::Client::new(&base, "t-ana");
    let id = queue_conversation(&client, "slow").await;
    say(&client, &id, "one").await;
    doomed
        .wait_for_line("failpoint after-batch-one", LONG)
        .unwrap();
    // The second message is on the lane when the first turn's worker dies.
    say(&client, &id, "two").await;
    doomed.kill();
    let (_rescuer, _) = fleet.worker(&[]);
    let turns = wait_for_complete_turns(&client, &id, 2, LONG)
        .await
        .unwrap();
    assert_eq!(turns[0].turn, "turn_1");
    assert_each_answered(&turns, &["one".into(), "two".into()]);
}

/// The kinds of a conversation's record entries, in order.
async fn entry_kinds(fleet: &Fleet, id: &str) -> Vec<String> {
    let conversation: turnpike_schemas::ConversationId = id.parse().unwrap();
    let record = fleet
        .conversations
        .record(turnpike_artifactory::ConversationPrefix::new(
            "acme".parse().unwrap(),
            conversation,
        ));
    record
        .entries()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.body.kind().as_str().to_owned())
        .collect()
}

/// Waits until each worker has logged `more` sweeps past what it had logged.
fn wait_for_sweeps(workers: &mut [(Process, String)], more: usize) {
    for (process, _) in workers.iter_mut() {
        let seen = process.count_lines("sweep done");
        process
            .wait_for_lines("sweep done", seen + more, LONG)
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_conversations_close_once_in_a_fleet_reopen_on_the_next_message_and_an_explicit_close_stays(
) {
    use turnpike_tests::edge::{wait_for_complete_turns, wait_for_status};
    let mut fleet = Fleet::start(&binary()).await;
    let apps = tempfile::tempdir().unwrap();
    std::fs::write(
        apps.path().join("naps.toml"),
        "app = \"naps\"\nidle_timeout = \"2s\"\n\n[agents.echo]\nprovider = \"echo\"\n",
    )
    .unwrap();
    fleet.apps = Some(apps.path().to_path_buf());
    let tokens = fleet.data.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        "[[tokens]]\ntoken = \"t-ana\"\nidentity = \"oidc:acme:ana\"\ntenant = \"acme\"\n",
    )
    .unwrap();
    // Both workers sweep often, so both race for every idle conversation.
    let sweeping = [
        "--sweep-every-ms",
        "200",
        "--log",
        "warn,turnpike_worker::worker=debug",
    ];
    let mut workers: Vec<_> = (0..2).map(|_| fleet.worker(&sweeping)).collect();
    let (_router, base) = fleet.router(&tokens);
    let client = turnpike_edge::client::Client::new(&base, "t-ana");
    let id = turnpike_tests::edge::create(&client, "naps", "echo").await;
    say(&client, &id, "hello").await;
    wait_for_complete_turns(&client, &id, 1, LONG)
        .await
        .unwrap();

    // Closed as idle once, whichever worker got there first, however many sweeps follow.
    wait_for_status(&client, &id, "idle_closed", LONG)
        .await
        .unwrap();
    wait_for_sweeps(&mut workers, 5);
    let kinds = entry_kinds(&fleet, &id).await;
    let closes = |kinds: &[String]| kinds.iter().filter(|k| *k == "idle_closed").count();
    assert_eq!(closes(&kinds), 1, "{kinds:?}");
    let last_meaningful: Vec<&String> = kinds.iter().filter(|k| *k != "signed_root").collect();
    assert_eq!(last_meaningful.last().unwrap().as_str(), "idle_closed");

    // The next message reopens it (recorded before its input) and runs as usual.
    say(&client, &id, "again").await;
    let turns = wait_for_complete_turns(&client, &id, 2, LONG)
        .await
        .unwrap();
    assert_eq!(turns[1].outcome.as_deref(), Some("replied"), "{turns:#?}");
    let kinds = entry_kinds(&fleet, &id).await;
    let reopened = kinds
        .iter()
        .position(|k| k == "reopened")
        .expect("reopened");
    let message = kinds
        .iter()
        .rposition(|k| k == "user_message")
        .expect("the second message");
    assert!(reopened < message, "{kinds:?}");
    assert!(
        kinds[kinds.iter().position(|k| k == "idle_closed").unwrap()..reopened]
            .iter()
            .all(|k| k == "idle_closed" || k == "signed_root"),
        "nothing was taken before the reopening: {kinds:?}"
    );
    // The timer started again: a second idle period, closed once too.
    wait_for_status(&client, &id, "idle_closed", LONG)
        .await
        .unwrap();
    wait_for_sweeps(&mut workers, 3);
    assert_eq!(closes(&entry_kinds(&fleet, &id).await), 2);

    // An explicit close stays closed: a message is refused and nothing reopens it.
    client
        .post(
            &format!("/v1/conversations/{id}/close"),
            &serde_json::json!({}),
        )
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let refused = client
        .post(
            &format!("/v1/conversations/{id}/messages"),
            &serde_json::json!({ "text": "let me back in" }),
        )
        .await
        .unwrap();
    assert_eq!(refused.status, 409, "{:?}", refused.body);
    let before = entry_kinds(&fleet, &id).await;
    wait_for_sweeps(&mut workers, 3);
    wait_for_status(&client, &id, "closed", LONG).await.unwrap();
    assert_eq!(entry_kinds(&fleet, &id).await, before);

    // A conversation of an app that closes nothing as idle stays open.
    let demo = turnpike_tests::edge::create(&client, "demo", "assistant").await;
    say(&client, &demo, "stay").await;
    wait_for_complete_turns(&client, &demo, 1, LONG)
        .await
        .unwrap();
    wait_for_sweeps(&mut workers, 3);
    let view = client
        .get(&format!("/v1/conversations/{demo}"))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    assert_eq!(view["status"], "idle", "{view}");
}

/// `/readyz` of an admin listener: its status and body.
async fn readyz(port: u16) -> (u16, serde_json::Value) {
    let admin = turnpike_edge::client::Client::new(&format!("http://127.0.0.1:{port}"), "");
    let (status, body) = admin.bytes("/readyz", false).await.unwrap();
    (status, serde_json::from_slice(&body).unwrap_or_default())
}

/// Polls `/readyz` until `want` holds of it.
async fn readyz_until(port: u16, what: &str, want: impl Fn(u16, &serde_json::Value) -> bool) {
    let deadline = std::time::Instant::now() + LONG;
    loop {
        let (status, body) = readyz(port).await;
        if want(status, &body) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: still {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn check_ok(body: &serde_json::Value, name: &str) -> Option<bool> {
    body["checks"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
        .and_then(|c| c["ok"].as_bool())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_bus_and_fails_first_on_sigterm_while_the_running_turn_finishes() {
    use turnpike_tests::edge::{wait_for_complete_turns, wait_for_status};
    let (mut fleet, _apps, tokens) = queue_fleet().await;
    let port = turnpike_tests::services::free_port().unwrap();
    let listen = format!("127.0.0.1:{port}");
    let (mut worker, _) = fleet.worker(&["--admin-listen", &listen]);
    readyz_until(port, "ready at start", |s, b| {
        s == 200 && check_ok(b, "bus") == Some(true) && check_ok(b, "cell").is_some()
    })
    .await;

    // NATS goes away: not ready, and says why; back: ready again.
    fleet.nats.stop().unwrap();
    readyz_until(port, "not ready without NATS", |s, b| {
        s == 503 && check_ok(b, "bus") == Some(false)
    })
    .await;
    fleet.nats.restart().unwrap();
    readyz_until(port, "ready again", |s, b| {
        s == 200 && check_ok(b, "bus") == Some(true)
    })
    .await;

    // A turn runs (the slow model takes 2 s) when SIGTERM comes: readiness fails at once,
    // the turn finishes, the process exits by itself, and the client loses nothing.
    let (_router, base) = fleet.router(&tokens);
    let client = turnpike_edge::client::Client::new(&base, "t-ana");
    let id = queue_conversation(&client, "slow").await;
    say(&client, &id, "finish me").await;
    wait_for_status(&client, &id, "running", LONG)
        .await
        .unwrap();
    worker.signal_term();
    readyz_until(port, "draining on SIGTERM", |s, b| {
        s == 503 && check_ok(b, "draining") == Some(false)
    })
    .await;
    let turns = wait_for_complete_turns(&client, &id, 1, LONG)
        .await
        .unwrap();
    assert_eq!(turns[0].outcome.as_deref(), Some("replied"), "{turns:#?}");
    assert_eq!(turns[0].replies, vec!["answer to: finish me".to_owned()]);
    assert_eq!(worker.wait_exit(LONG), Some(0), "the worker exits cleanly");
    // Nobody else ran it: the draining worker finished its own turn.
    let kinds = entry_kinds(&fleet, &id).await;
    assert_eq!(
        kinds.iter().filter(|k| *k == "turn_dispatched").count(),
        1,
        "{kinds:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_on_sigterm_refuses_new_streams_and_closes_open_ones_with_1001_after_its_grace() {
    use turnpike_edge::client::{Client, Cursor};
    use turnpike_tests::edge::wait_for_complete_turns;
    let (fleet, _apps, tokens) = queue_fleet().await;
    let _worker = fleet.worker(&[]);
    let port = turnpike_tests::services::free_port().unwrap();
    let api = turnpike_tests::services::free_port().unwrap();
    let (mut leaving, _) = fleet.spawn(
        vec![
            "router".into(),
            "--listen".into(),
            format!("127.0.0.1:{api}"),
            "--tokens".into(),
            tokens.display().to_string(),
            "--admin-listen".into(),
            format!("127.0.0.1:{port}"),
            "--ws-grace-ms".into(),
            "1500".into(),
        ],
        "router ready",
    );
    let (_staying, other) = fleet.router(&tokens);
    let a = Client::new(&format!("http://127.0.0.1:{api}"), "t-ana");
    let b = Client::new(&other, "t-ana");
    let id = queue_conversation(&a, "quick").await;
    let mut stream = a.stream(&id).await.unwrap();
    say(&a, &id, "before").await;
    wait_for_complete_turns(&a, &id, 1, LONG).await.unwrap();

    leaving.signal_term();
    readyz_until(port, "draining on SIGTERM", |s, b| {
        s == 503 && check_ok(b, "draining") == Some(false)
    })
    .await;
    // No new stream here (503: try another router); the open one goes on, then is told to
    // go away.
    let refused = a
        .stream(&id)
        .await
        .err()
        .expect("no new stream while draining");
    assert!(refused.contains("503"), "{refused}");
    say(&b, &id, "during").await;
    while stream.next_within(LONG).await.is_some() {}
    assert_eq!(stream.close_code(), Some(1001));
    assert_eq!(leaving.wait_exit(LONG), Some(0), "the router exits cleanly");
    // The client resumes on another router: every row, once.
    let turns = wait_for_complete_turns(&b, &id, 2, LONG).await.unwrap();
    assert_eq!(turns[1].inputs, vec!["during".to_owned()]);
    let mut cursor = Cursor::new(&id);
    let rows = cursor.read(&b).await.unwrap();
    let seqs: Vec<u64> = rows.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
    let mut unique = seqs.clone();
    unique.dedup();
    assert_eq!(seqs, unique);
    assert!(rows.iter().any(|r| r["text"] == "before"));
    assert!(rows.iter().any(|r| r["text"] == "during"));
}

/// An agent that holds one conversation's turn until released, and answers the others at once.
struct HoldOne {
    held: turnpike_schemas::ConversationId,
    started: tokio::sync::Notify,
    running: std::sync::atomic::AtomicBool,
    release: tokio::sync::Semaphore,
}

impl HoldOne {
    fn new(held: turnpike_schemas::ConversationId) -> Arc<Self> {
        Arc::new(HoldOne {
            held,
            started: tokio::sync::Notify::new(),
            running: Default::default(),
            release: tokio::sync::Semaphore::new(0),
        })
    }

    /// Sends the held conversation a message and waits until its turn runs (and waits).
    async fn hold(&self, bus: &Arc<dyn Bus>, conversations: &Conversations) {
        let started = self.started.notified();
        publish(bus.clone(), conversations, &[self.held], 0, 1, LONG)
            .await
            .unwrap();
        if !self.running.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::timeout(LONG, started)
                .await
                .expect("the held turn starts");
        }
    }
}

#[async_trait]
impl turnpike_worker::App for HoldOne {
    async fn on_reactive_event(
        &self,
        turn: &dyn turnpike_agent::Turn,
    ) -> turnpike_agent::Result<turnpike_schemas::entry::TurnOutcome> {
        if turn.conversation() == self.held {
            self.running
                .store(true, std::sync::atomic::Ordering::SeqCst);
            self.started.notify_waiters();
            let _ = self.release.acquire().await;
        }
        Ok(turnpike_schemas::entry::TurnOutcome::Replied)
    }
}

/// A worker whose turn slots are all taken keeps at most one wake per tenant for its next free
/// slot (its fair intake), and only for a moment (its `busy_delay`, at most a second, here
/// longer than that): a worker with room gets the wake, while the busy worker's turn still
/// runs — and every wake is settled once the turns are done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_every_slot_taken_leaves_wakes_to_a_worker_with_room() {
    a_busy_worker_and_a_roomy_one(Duration::from_secs(600)).await;
}

/// The same with a short `busy_delay`: the waiting wake goes back to the bus sooner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_busy_past_its_busy_delay_hands_wakes_back() {
    a_busy_worker_and_a_roomy_one(Duration::from_millis(100)).await;
}

/// One worker (one slot, `busy_delay`) holds a turn; another conversation's message comes, and
/// then a worker with room, which must run it (the busy worker takes the wake into its intake
/// and gives it back).
async fn a_busy_worker_and_a_roomy_one(busy_delay: Duration) {
    let (dir, bus, conversations) = embedded_in_process();
    let convs = create_conversations(&conversations, &signer(), 2).await;
    let (held, other) = (convs[0], convs[1]);
    let agent = HoldOne::new(held);
    let worker = |bus: Arc<dyn Bus>| {
        Worker::new(
            bus,
            conversations.clone(),
            signer(),
            Arc::new(Apps::new().with_fallback(agent.clone())),
            WorkerConfig {
                slots: 1,
                busy_delay,
                workspace_root: dir.path().join("workspaces"),
                ..WorkerConfig::default()
            },
        )
    };
    let busy_bus = turnpike_tests::counting_bus::CountingBus::new(bus.clone());
    let busy = worker(busy_bus.clone());
    let busy_id = busy.id().to_string();
    let busy_pool = WorkerPool::start([busy]);
    // The busy worker's one slot is taken by a turn that waits.
    agent.hold(&bus, &conversations).await;
    assert_eq!(busy_bus.wakes(), 1);
    // Another conversation's message: the busy worker takes it into its intake.
    publish(bus.clone(), &conversations, &[other], 0, 1, LONG)
        .await
        .unwrap();
    until(LONG, "the busy worker takes the wake", || async {
        busy_bus.wakes() >= 2
    })
    .await;
    // A worker with room.
    let roomy = worker(bus.clone());
    let roomy_id = roomy.id().to_string();
    let roomy_pool = WorkerPool::start([roomy]);
    wait_for_turns(&conversations, &[other], 1, LONG)
        .await
        .unwrap();
    let dispatched = dispatchers(&conversations, other).await;
    assert_eq!(dispatched, [roomy_id]);
    assert!(agent.running.load(std::sync::atomic::Ordering::SeqCst));
    agent.release.add_permits(1);
    wait_for_turns(&conversations, &[held], 1, LONG)
        .await
        .unwrap();
    let settled_by = std::time::Instant::now() + LONG;
    while bus.unsettled().await.unwrap() != Some(0) {
        assert!(
            std::time::Instant::now() < settled_by,
            "wakes left unsettled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    roomy_pool.stop().await;
    busy_pool.stop().await;
    let busy_dispatched = dispatchers(&conversations, held).await;
    assert_eq!(busy_dispatched, [busy_id]);
}

/// A running worker with one turn slot, idle and waiting for wakes, still sweeps: a turn left
/// open by a dead owner, with no event left to bring it back, is recovered by its periodic
/// sweep (waiting for a wake must not hold the slot a sweep needs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_with_one_slot_still_recovers_an_open_turn_by_its_sweep() {
    let fleet = Fleet::start(&binary()).await;
    let apps = Arc::new(Apps::new().with_fallback(Arc::new(EchoAgent)));
    let config = WorkerConfig {
        slots: 1,
        lease_ttl: Duration::from_millis(1500),
        renew_every: Duration::from_millis(500),
        sweep_every: Duration::from_millis(200),
        ..WorkerConfig::default()
    };
    let LeftOpen {
        conversation,
        doomed,
        record: rec,
        ..
    } = a_turn_left_open(&fleet, &apps, &config).await;
    let convs = [conversation];
    doomed.crash();
    let pool = WorkerPool::start([Worker::new(
        fleet.bus.clone(),
        fleet.conversations.clone(),
        signer(),
        apps,
        config,
    )]);
    until(LONG, "the sweep recovers turn 1", || async {
        let head = rec.head().await.unwrap();
        head.state().last_turn == 1 && !head.state().turn_open
    })
    .await;
    pool.stop().await;
    check_conversation(&fleet.conversations, &signer(), convs[0], 0, 1)
        .await
        .unwrap();
}

/// A worker whose slots are all taken still does the rest of its sweep: with a turn left open
/// elsewhere that it has no slot to take over, it still closes a conversation gone idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_no_slot_for_a_takeover_still_closes_idle_conversations() {
    let (dir, bus, conversations) = embedded_in_process();
    let convs = create_conversations(&conversations, &signer(), 2).await;
    let (held, idle) = (convs[0], convs[1]);
    let agent = HoldOne::new(held);
    let worker = |sweep_every: Duration| {
        Worker::new(
            bus.clone(),
            conversations.clone(),
            signer(),
            Arc::new(Apps::new().with_fallback(agent.clone())),
            WorkerConfig {
                slots: 1,
                sweep_every,
                busy_delay: Duration::from_secs(600),
                idle_timeout: Some(Duration::from_millis(500)),
                workspace_root: dir.path().join("workspaces"),
                ..WorkerConfig::default()
            },
        )
    };
    // The sweeping worker's one slot is held by a turn that waits.
    let sweeper = WorkerPool::start([worker(Duration::from_millis(100))]);
    agent.hold(&bus, &conversations).await;
    // Another worker (sweeping only as it starts) runs a turn in the other conversation, which
    // then goes idle.
    let other = WorkerPool::start([worker(Duration::from_secs(3600))]);
    publish(bus.clone(), &conversations, &[idle], 0, 1, LONG)
        .await
        .unwrap();
    wait_for_turns(&conversations, &[idle], 1, LONG)
        .await
        .unwrap();
    // A turn left open somewhere, which the sweeper has no slot to take over.
    let orphan =
        turnpike_artifactory::ConversationPrefix::new(fixtures::tenant(), ConversationId::new());
    conversations.open_turns().mark(&orphan).await.unwrap();
    until(LONG, "the idle conversation is closed", || async {
        record(&conversations, idle)
            .entries()
            .await
            .unwrap()
            .iter()
            .any(|e| matches!(e.body, EntryBody::IdleClosed(_)))
    })
    .await;
    assert!(agent.running.load(std::sync::atomic::Ordering::SeqCst));
    agent.release.add_permits(1);
    other.stop().await;
    sweeper.stop().await;
}

/// Leases a lone worker keeps between drains (`turnpike_worker::kept`'s contract).
mod kept_leases {
    use super::*;
    use turnpike_schemas::{Epoch, WorkerId};
    use turnpike_tests::counting_bus::CountingBus;

    /// A worker on `bus` that keeps leases for `keep`, with leases of `ttl`.
    fn keeper(
        dir: &tempfile::TempDir,
        bus: Arc<dyn Bus>,
        conversations: &Conversations,
        keep: Duration,
        ttl: Duration,
    ) -> Worker {
        Worker::new(
            bus,
            conversations.clone(),
            signer(),
            Arc::new(Apps::new().with_fallback(Arc::new(EchoAgent))),
            WorkerConfig {
                keep_lease_for: keep,
                lease_ttl: ttl,
                renew_every: ttl / 3,
                workspace_root: dir.path().join("workspaces"),
                ..WorkerConfig::default()
            },
        )
    }

    async fn alone(worker: &Worker) {
        until(LONG, "the worker counts itself alone", || async {
            worker.alone()
        })
        .await;
    }

    /// Whether a probe claim of `conv` wins (it lets go at once).
    async fn lease_free(bus: &dyn Bus, conv: ConversationId) -> bool {
        match bus
            .claim(conv, WorkerId::new(), Duration::from_secs(60))
            .await
            .unwrap()
        {
            Some(lease) => {
                bus.release(&lease).await.unwrap();
                true
            }
            None => false,
        }
    }

    /// Sends message `i` (0-based) to `conv` and waits for its turn.
    async fn turn(
        bus: Arc<dyn Bus>,
        conversations: &Conversations,
        conv: ConversationId,
        i: usize,
    ) {
        publish(bus, conversations, &[conv], i, i + 1, LONG)
            .await
            .unwrap();
        wait_for_turns(conversations, &[conv], i as u64 + 1, LONG)
            .await
            .unwrap();
    }

    /// The epochs the record's turns were opened under, in order.
    async fn epochs(conversations: &Conversations, conv: ConversationId) -> Vec<Epoch> {
        let opened = dispatched(conversations, conv).await;
        opened.iter().map(|d| d.epoch).collect()
    }

    /// Leases never lapse in this test (10 minutes), so only a release frees one.
    const FOREVER: Duration = Duration::from_secs(600);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lone_worker_takes_each_next_message_on_its_kept_lease_and_lets_it_go_when_another_joins(
    ) {
        let (dir, bus, conversations) = embedded_in_process();
        let conv = create_conversations(&conversations, &signer(), 1).await[0];
        let counting = CountingBus::new(bus.clone());
        let worker = keeper(&dir, counting.clone(), &conversations, FOREVER, FOREVER);
        let pool = WorkerPool::start([worker.clone()]);
        alone(&worker).await;
        for i in 0..4 {
            turn(bus.clone(), &conversations, conv, i).await;
            // Its owner is gone (so the next message cannot reach it), and the lease stays
            // with the worker.
            worker.idle().await;
            assert!(
                !lease_free(&*bus, conv).await,
                "the lease was let go after turn {}",
                i + 1
            );
        }
        // One claim for four drains, nothing released, one read of the lane's end after each
        // drain (step 9); and every turn under the one epoch.
        let calls = counting.lease_calls(conv);
        assert_eq!((calls.claims, calls.releases), (1, 0), "{calls:?}");
        assert_eq!(counting.counted().heads, 4);
        let opened = epochs(&conversations, conv).await;
        assert_eq!(opened.len(), 4);
        assert!(opened.iter().all(|e| *e == opened[0]), "{opened:?}");
        check_conversation(&conversations, &signer(), conv, 0, 4)
            .await
            .unwrap();

        // A second worker joins: the first is no longer alone and lets its kept lease go (it
        // would never lapse by itself here).
        let joined =
            WorkerPool::start([keeper(&dir, bus.clone(), &conversations, FOREVER, FOREVER)]);
        until(LONG, "the kept lease is released", || async {
            lease_free(&*bus, conv).await
        })
        .await;
        assert!(!worker.alone());
        assert_eq!(counting.lease_calls(conv).releases, 1);
        // The conversation goes on, whoever takes it.
        turn(bus.clone(), &conversations, conv, 4).await;
        joined.stop().await;
        pool.stop().await;
        check_conversation(&conversations, &signer(), conv, 0, 5)
            .await
            .unwrap();
        let opened = epochs(&conversations, conv).await;
        assert!(opened[4] > opened[3], "{opened:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kept_lease_goes_once_unused_for_its_time_and_when_the_worker_stops() {
        let (dir, bus, conversations) = embedded_in_process();
        let convs = create_conversations(&conversations, &signer(), 2).await;
        let counting = CountingBus::new(bus.clone());
        let conv = convs[0];
        // Unused for 2 s: released, while the worker runs on alone.
        let worker = keeper(
            &dir,
            counting.clone(),
            &conversations,
            Duration::from_secs(2),
            FOREVER,
        );
        let pool = WorkerPool::start([worker.clone()]);
        alone(&worker).await;
        turn(bus.clone(), &conversations, convs[0], 0).await;
        worker.idle().await;
        // Kept first: held, never released.
        assert!(!lease_free(&*bus, conv).await, "the lease was not kept");
        assert_eq!(counting.lease_calls(conv).releases, 0);
        until(LONG, "the unused kept lease is released", || async {
            lease_free(&*bus, convs[0]).await
        })
        .await;
        assert!(worker.alone());
        assert_eq!(counting.lease_calls(conv).releases, 1);
        // The next message claims afresh.
        turn(bus.clone(), &conversations, convs[0], 1).await;
        assert_eq!(counting.lease_calls(conv).claims, 2);
        pool.stop().await;
        check_conversation(&conversations, &signer(), convs[0], 0, 2)
            .await
            .unwrap();

        // Kept for ever: a stopping worker lets it go before `stop` returns.
        let worker = keeper(&dir, bus.clone(), &conversations, FOREVER, FOREVER);
        let pool = WorkerPool::start([worker.clone()]);
        alone(&worker).await;
        turn(bus.clone(), &conversations, convs[1], 0).await;
        worker.idle().await;
        assert!(!lease_free(&*bus, convs[1]).await, "the lease was not kept");
        pool.stop().await;
        assert!(
            lease_free(&*bus, convs[1]).await,
            "the stopped worker left its lease held"
        );
    }

    /// A kept lease that lapsed and was taken by someone else is never resumed under its old
    /// epoch: the worker tries to renew it, loses, claims, finds it held, and runs nothing
    /// until the other holder lets go; then the turn runs under a newer epoch.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kept_lease_taken_over_after_it_lapsed_is_not_resumed() {
        let (dir, bus, conversations) = embedded_in_process();
        let conv = create_conversations(&conversations, &signer(), 1).await[0];
        let counting = CountingBus::new(bus.clone());
        let worker = keeper(
            &dir,
            counting.clone(),
            &conversations,
            FOREVER,
            Duration::from_millis(1500),
        );
        let pool = WorkerPool::start([worker.clone()]);
        alone(&worker).await;
        turn(bus.clone(), &conversations, conv, 0).await;
        // Another holder takes the lease once it lapses, and keeps it.
        let deadline = std::time::Instant::now() + LONG;
        let taken = loop {
            if let Some(lease) = bus.claim(conv, WorkerId::new(), FOREVER).await.unwrap() {
                break lease;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the kept lease never lapsed"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let before = counting.lease_calls(conv);
        publish(bus.clone(), &conversations, &[conv], 1, 2, LONG)
            .await
            .unwrap();
        // The wake came: a renewal of the kept lease was tried and lost, then a claim found
        // the lease held.
        until(LONG, "the worker tries the lease", || async {
            let now = counting.lease_calls(conv);
            now.renewals > before.renewals && now.claims > before.claims
        })
        .await;
        let head = record(&conversations, conv).head().await.unwrap();
        assert_eq!(head.state().last_turn, 1, "a turn ran under a lapsed lease");
        assert!(
            !head.state().turn_open,
            "a turn opened under a lapsed lease"
        );
        bus.release(&taken).await.unwrap();
        wait_for_turns(&conversations, &[conv], 2, LONG)
            .await
            .unwrap();
        pool.stop().await;
        check_conversation(&conversations, &signer(), conv, 0, 2)
            .await
            .unwrap();
        let opened = epochs(&conversations, conv).await;
        assert!(
            opened[1] > taken.epoch(),
            "{opened:?} vs {:?}",
            taken.epoch()
        );
    }

    /// SIGKILL while a lone worker process keeps a lease, and the next message is the last
    /// event: nothing rescues it but the lease's lapse, and then another worker runs it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lone_worker_killed_while_it_keeps_a_lease_loses_nothing() {
        let fleet = Fleet::start(&binary()).await;
        let conv = create_conversations(&fleet.conversations, &signer(), 1).await[0];
        let listen = format!(
            "127.0.0.1:{}",
            turnpike_tests::services::free_port().unwrap()
        );
        let (mut doomed, doomed_id) = fleet.worker(&[
            "--keep-lease-ms",
            "3000",
            "--lease-ttl-ms",
            "9000",
            "--admin-listen",
            &listen,
        ]);
        let admin = turnpike_edge::client::Client::new(&format!("http://{listen}"), "");
        fleet_size_reaches(&admin, 1).await;
        turn(fleet.bus.clone(), &fleet.conversations, conv, 0).await;
        assert!(
            !lease_free(&*fleet.bus, conv).await,
            "the lease was not kept"
        );
        doomed.kill();
        publish(fleet.bus.clone(), &fleet.conversations, &[conv], 1, 2, LONG)
            .await
            .unwrap();
        let (_rescuer, rescuer_id) = fleet.worker(&[]);
        wait_for_turns(&fleet.conversations, &[conv], 2, LONG)
            .await
            .unwrap();
        check_conversation(&fleet.conversations, &signer(), conv, 0, 2)
            .await
            .unwrap();
        assert_eq!(
            dispatchers(&fleet.conversations, conv).await,
            [doomed_id, rescuer_id]
        );
    }
}
