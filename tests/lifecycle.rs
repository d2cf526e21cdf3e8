//! Deleting conversations: erasure by the owner or an admin of the tenant (over the API and the
//! CLI) removes the conversation from every store — the object store's listing, the index, the
//! lane — and leaves a tombstone; a stranger deletes nothing; a deletion cut short by a crash is
//! finished by the next sweep.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use turnpike_edge::client::Client;
use turnpike_router::bus::Bus as _;
use turnpike_tests::edge::{
    create, files_under, say, wait_for_complete_turns, Server, ADMIN, ALICE, BETA_ADMIN, BOB,
};
use turnpike_tests::process::Process;

const LONG: Duration = Duration::from_secs(90);

/// These tests read and damage objects on disk: a file per object, not the database.
const FILES: &[&str] = &["--local-store", "files"];

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_turnpike"))
}

fn apps() -> tempfile::TempDir {
    turnpike_tests::edge::writer_apps()
}

/// A conversation of alice's with one turn that published a file, and an attachment.
async fn conversation(client: &Client, text: &str) -> String {
    let id = create(client, "life", "writer").await;
    let attached = client
        .attach(&id, "notes.txt", "text/plain", b"attached words".to_vec())
        .await
        .unwrap();
    assert!(attached.status < 300, "{:?}", attached.body);
    say(client, &id, text).await;
    let turns = wait_for_complete_turns(client, &id, 1, LONG).await.unwrap();
    assert_eq!(turns[0].outcome.as_deref(), Some("replied"), "{turns:#?}");
    id
}

/// The store's objects that belong to `id` (its tombstone aside).
fn objects_of(store: &Path, id: &str) -> Vec<String> {
    files_under(store)
        .into_iter()
        .filter(|p| p.contains(id) && !p.starts_with("tombstones"))
        .collect()
}

async fn memory_of(client: &Client, id: &str) -> Vec<Value> {
    let page = client
        .get(&format!("/v1/memory?conversation={id}"))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    page["rows"].as_array().unwrap().clone()
}

async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + LONG;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn tombstone(store: &Path, id: &str) -> Value {
    let path = store.join(format!("tombstones/default/{id}.json"));
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasure_removes_a_conversation_from_every_store_and_leaves_a_tombstone() {
    let apps = apps();
    let mut server = Server::start(&binary(), Some(apps.path()), FILES, true).unwrap();
    let store = server.store_dir();
    let alice = server.client(ALICE);
    let mine = conversation(&alice, "Keep the blue folder.").await;
    let theirs = conversation(&alice, "Water the plants.").await;
    for id in [&mine, &theirs] {
        wait_until("the index to remember it", || {
            let (alice, id) = (alice.clone(), id.clone());
            async move { memory_of(&alice, &id).await.len() >= 2 }
        })
        .await;
        let objects = objects_of(&store, id);
        for part in ["/record/", "/turns/", "/attachments/", "/git/", "/files/"] {
            assert!(
                objects.iter().any(|p| p.contains(part)),
                "no {part} in {objects:#?}"
            );
        }
    }

    // Bob, with whom it is shared (he reads and writes it), and an admin of another tenant:
    // not found, nothing deleted.
    let shared = alice
        .post(
            &format!("/v1/conversations/{mine}/grants"),
            &json!({"identity": "local:bob"}),
        )
        .await
        .unwrap();
    assert_eq!(shared.status, 200, "{:?}", shared.body);
    let seen = server
        .client(BOB)
        .get(&format!("/v1/conversations/{mine}"))
        .await
        .unwrap();
    assert_eq!(seen.status, 200, "the grantee sees it");
    for token in [BOB, BETA_ADMIN] {
        let refused = server
            .client(token)
            .delete(&format!("/v1/conversations/{mine}"))
            .await
            .unwrap();
        assert_eq!(refused.status, 404, "{:?}", refused.body);
    }
    assert!(!objects_of(&store, &mine).is_empty());
    assert!(memory_of(&alice, &mine).await.len() >= 2);

    // The owner deletes one; an admin of the tenant the other.
    let done = alice
        .delete(&format!("/v1/conversations/{mine}"))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    assert_eq!(done["reason"], "erasure requested by the owner");
    assert_eq!(done["owner"], done["deleted_by"]);
    assert!(
        done["final_root"].as_str().is_some_and(|r| r.len() == 64),
        "{done}"
    );
    assert!(done["final_leaves"].as_u64().unwrap() > 0);
    assert!(done["finished_ms"].as_u64().is_some());
    let by_admin = server
        .client(ADMIN)
        .delete(&format!("/v1/conversations/{theirs}"))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    assert_eq!(
        by_admin["reason"],
        "erasure requested by an admin of the tenant"
    );

    for id in [&mine, &theirs] {
        // Gone from the object store (the tombstone stays), the directory, the index.
        assert_eq!(objects_of(&store, id), Vec::<String>::new());
        let gone = alice.get(&format!("/v1/conversations/{id}")).await.unwrap();
        assert_eq!(gone.status, 404);
        // An indexer that was writing this conversation's rows as the erasure deleted them
        // finds the tombstone right after its write and deletes them again itself: gone
        // within moments, whatever the interleaving.
        wait_until("the index to forget it", || {
            let (alice, id) = (alice.clone(), id.clone());
            async move { memory_of(&alice, &id).await.is_empty() }
        })
        .await;
        let listed = alice
            .get("/v1/conversations")
            .await
            .unwrap()
            .into_ok()
            .unwrap();
        assert!(!listed.to_string().contains(id.as_str()), "{listed}");
        let kept = tombstone(&store, id);
        assert_eq!(kept["conversation"], id.as_str());
        // A message to it is refused; deleting again is not found.
        let late = alice
            .post(
                &format!("/v1/conversations/{id}/messages"),
                &json!({"text": "hello?"}),
            )
            .await
            .unwrap();
        assert_eq!(late.status, 404, "{:?}", late.body);
        let again = alice
            .delete(&format!("/v1/conversations/{id}"))
            .await
            .unwrap();
        assert_eq!(again.status, 404);
    }
    // The lanes are empty (read with the server stopped: the embedded bus is its).
    server.process.kill();
    let bus = turnpike_router::embedded::EmbeddedBus::open(
        &server.data.path().join("bus.redb"),
        Default::default(),
    )
    .unwrap();
    for id in [&mine, &theirs] {
        let lane = bus
            .read_lane(id.parse().unwrap(), 0, None, 100)
            .await
            .unwrap();
        assert!(lane.is_empty(), "{lane:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_cut_short_by_a_crash_is_finished_by_the_next_sweep() {
    let apps = apps();
    let mut server = Server::start(
        &binary(),
        Some(apps.path()),
        &["--sweep-every-ms", "500", "--local-store", "files"],
        true,
    )
    .unwrap();
    let store = server.store_dir();
    let alice = server.client(ALICE);
    let id = conversation(&alice, "Call the plumber.").await;
    wait_until("the index to remember it", || {
        let alice = alice.clone();
        let id = id.clone();
        async move { memory_of(&alice, &id).await.len() >= 2 }
    })
    .await;
    server.process.kill();

    // The CLI deletes as the owner and is killed between the directory and the objects.
    let data = server.data.path().display().to_string();
    let mut cli = Process::start(
        &binary(),
        &[
            "--data-dir".into(),
            data,
            "conversation".into(),
            "delete".into(),
            id.clone(),
            "--actor".into(),
            "local:alice".into(),
            "--reason".into(),
            "the user asked".into(),
        ],
        &[
            (
                "TURNPIKE_FAILPOINTS",
                "erase-after-directory=hang".to_owned(),
            ),
            (
                "TURNPIKE_EMBEDDING_MODEL",
                turnpike_tests::index::model_dir().display().to_string(),
            ),
        ],
    )
    .unwrap();
    cli.wait_for_line("failpoint erase-after-directory", LONG)
        .unwrap();
    cli.kill();
    let pending = tombstone(&store, &id);
    assert_eq!(pending["reason"], "the user asked");
    assert!(pending.get("finished_ms").is_none(), "{pending}");
    assert!(
        !objects_of(&store, &id).is_empty(),
        "cut short before the objects"
    );
    assert!(store
        .join(format!("tombstones-pending/default/{id}"))
        .exists());

    // The next start sweeps: the deletion is finished, everywhere.
    server.restart().unwrap();
    let alice = server.client(ALICE);
    // The finished tombstone is written before the pending marker is removed: wait for both.
    wait_until("the sweep to finish the deletion", || {
        let store = store.clone();
        let id = id.clone();
        async move {
            tombstone(&store, &id).get("finished_ms").is_some()
                && !store
                    .join(format!("tombstones-pending/default/{id}"))
                    .exists()
        }
    })
    .await;
    assert_eq!(objects_of(&store, &id), Vec::<String>::new());
    assert!(!store
        .join(format!("tombstones-pending/default/{id}"))
        .exists());
    assert!(memory_of(&alice, &id).await.is_empty());
    let gone = alice.get(&format!("/v1/conversations/{id}")).await.unwrap();
    assert_eq!(gone.status, 404);
}

async fn close(client: &Client, id: &str) {
    client
        .post(&format!("/v1/conversations/{id}/close"), &json!({}))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_closed_conversations_and_a_malformed_setting_deletes_nothing() {
    let apps = apps();
    let server = Server::start(
        &binary(),
        Some(apps.path()),
        &[
            "--retention",
            "1s",
            "--sweep-every-ms",
            "200",
            "--local-store",
            "files",
        ],
        false,
    )
    .unwrap();
    let store = server.store_dir();
    let alice = server.client(ALICE);
    let closed = conversation(&alice, "Old news.").await;
    let open = conversation(&alice, "Still going.").await;
    close(&alice, &closed).await;
    wait_until("retention to delete the closed conversation", || {
        let store = store.clone();
        let closed = closed.clone();
        async move {
            store
                .join(format!("tombstones/default/{closed}.json"))
                .exists()
                && tombstone(&store, &closed).get("finished_ms").is_some()
        }
    })
    .await;
    let kept = tombstone(&store, &closed);
    assert_eq!(kept["deleted_by"], "retention");
    assert_eq!(kept["reason"], "retention: closed for more than 1s");
    assert_eq!(objects_of(&store, &closed), Vec::<String>::new());
    // The open one is untouched.
    assert!(!objects_of(&store, &open).is_empty());
    let view = alice
        .get(&format!("/v1/conversations/{open}"))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    assert_eq!(view["id"], open.as_str());

    // A setting that does not parse: said at start, and nothing is deleted, sweep after sweep.
    let admin_port = turnpike_tests::services::free_port().unwrap();
    let admin_listen = format!("127.0.0.1:{admin_port}");
    let mut careful = Server::start_with_env(
        &binary(),
        Some(apps.path()),
        &[
            "--retention",
            "banana",
            "--sweep-every-ms",
            "200",
            "--admin-listen",
            &admin_listen,
            "--local-store",
            "files",
        ],
        false,
        &[("RUST_LOG", "warn,turnpike_worker::worker=debug".to_owned())],
    )
    .unwrap();
    let said = careful
        .process
        .wait_for_line("retention is off", LONG)
        .unwrap();
    assert!(said.contains("banana"), "{said}");
    // And in the readiness details (ready all the same: it deletes nothing, safely).
    let (status, body) = Client::new(&format!("http://{admin_listen}"), "")
        .bytes("/readyz", false)
        .await
        .unwrap();
    assert_eq!(status, 200);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert!(
        body["checks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "settings"
                && c["detail"].as_str().unwrap().contains("retention is off")),
        "{body}"
    );
    let store = careful.store_dir();
    let alice = careful.client(ALICE);
    let closed = conversation(&alice, "Keep me anyway.").await;
    close(&alice, &closed).await;
    let sweeps = careful.process.count_lines("sweep done");
    careful
        .process
        .wait_for_lines("sweep done", sweeps + 3, LONG)
        .unwrap();
    assert!(!store
        .join(format!("tombstones/default/{closed}.json"))
        .exists());
    assert!(!objects_of(&store, &closed).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_erases_everything_of_theirs_and_nothing_of_anyone_elses() {
    let apps = apps();
    let server = Server::start(&binary(), Some(apps.path()), FILES, false).unwrap();
    let store = server.store_dir();
    let (alice, bob) = (server.client(ALICE), server.client(BOB));
    let bobs = [
        conversation(&bob, "Bob's first.").await,
        conversation(&bob, "Bob's second.").await,
    ];
    let alices = conversation(&alice, "Alice's own.").await;
    let erased = bob.delete("/v1/me").await.unwrap().into_ok().unwrap();
    let gone: Vec<&str> = erased["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["conversation"].as_str().unwrap())
        .collect();
    assert_eq!(gone.len(), 2, "{erased}");
    for id in &bobs {
        assert!(gone.contains(&id.as_str()));
        assert_eq!(objects_of(&store, id), Vec::<String>::new());
        assert_eq!(
            tombstone(&store, id)["deleted_by"],
            erased["conversations"][0]["owner"]
        );
    }
    assert!(!objects_of(&store, &alices).is_empty());
    let mine = alice
        .get(&format!("/v1/conversations/{alices}"))
        .await
        .unwrap();
    assert_eq!(mine.status, 200);
    // Again: nothing left to erase.
    let again = bob.delete("/v1/me").await.unwrap().into_ok().unwrap();
    assert_eq!(again["conversations"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_phases_and_what_is_degraded() {
    let apps = apps();
    let mut server = Server::start(&binary(), Some(apps.path()), FILES, false).unwrap();
    let store = server.store_dir();
    let alice = server.client(ALICE);
    let idle = conversation(&alice, "Idle one.").await;
    let closed = conversation(&alice, "Closed one.").await;
    close(&alice, &closed).await;
    let broken = conversation(&alice, "Broken one.").await;
    // Its last batch is damaged on disk: its head no longer verifies.
    let record = store.join(format!("tenants/default/conversations/{broken}/record"));
    let mut batches: Vec<_> = std::fs::read_dir(&record)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    batches.sort();
    std::fs::write(batches.last().unwrap(), b"{}").unwrap();

    let refused = alice.get("/v1/admin/conversations").await.unwrap();
    assert_eq!(refused.status, 403);
    let admin = server.client(ADMIN);
    let list = admin
        .get("/v1/admin/conversations")
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let of = |id: &str| -> Value {
        list["conversations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["conversation"] == id)
            .unwrap_or_else(|| panic!("{id} not listed: {list}"))
            .clone()
    };
    let condition = |c: &Value, kind: &str| -> Value {
        c["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["kind"] == kind)
            .unwrap()
            .clone()
    };
    let i = of(&idle);
    assert_eq!(
        (i["phase"].as_str(), i["ready"].as_bool()),
        (Some("Idle"), Some(true)),
        "{i}"
    );
    assert_eq!(condition(&i, "Degraded")["status"], false);
    let c = of(&closed);
    assert_eq!(
        (c["phase"].as_str(), c["ready"].as_bool()),
        (Some("Closed"), Some(false)),
        "{c}"
    );
    let b = of(&broken);
    let degraded = condition(&b, "Degraded");
    assert_eq!(degraded["status"], true, "{b}");
    assert!(
        degraded["reason"]
            .as_str()
            .unwrap()
            .contains("does not verify"),
        "{degraded}"
    );
    // Filters; another tenant's admin sees none of it.
    let closed_only = admin
        .get("/v1/admin/conversations?status=closed")
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    assert_eq!(closed_only["conversations"].as_array().unwrap().len(), 1);
    let beta = server
        .client(BETA_ADMIN)
        .get("/v1/admin/conversations")
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    assert_eq!(beta["conversations"], json!([]));

    // The same from the CLI, like `kubectl get`.
    server.process.kill();
    let out = std::process::Command::new(binary())
        .args(["--data-dir", server.data.path().to_str().unwrap()])
        .args([
            "--admin",
            "local:ops",
            "conversation",
            "list",
            "--actor",
            "local:ops",
        ])
        .env("TURNPIKE_EMBEDDING_MODEL", "/nonexistent-model")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("READY"),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&idle) && l.contains("Idle") && l.contains("True")),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&closed) && l.contains("Closed") && l.contains("False")),
        "{text}"
    );
    assert!(
        text.contains("Degraded: the record's head does not verify"),
        "{text}"
    );
}

/// Every object left under a conversation's prefix in the rig's store.
async fn objects_under(rig: &turnpike_tests::turns::Rig) -> Vec<String> {
    use futures::TryStreamExt as _;
    use object_store::ObjectStore as _;
    rig.conversations
        .store()
        .list(Some(&rig.prefix().dir()))
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await
        .unwrap()
}

/// A rig whose conversation has one finished turn and a second left open by a crashed owner
/// (its lease lapses after `ttl`, its open-turn mark stays set).
async fn rig_with_an_open_turn(ttl: Duration) -> turnpike_tests::turns::Rig {
    let mut options = turnpike_tests::turns::RigOptions::new(
        "[[turn]]\n[[turn.step]]\ntext = \"echo: {last_user}\"\n",
    );
    options.lease_ttl = ttl;
    let mut rig = turnpike_tests::turns::Rig::with(options).await;
    rig.say("first").await;
    rig.wait_turns(1).await;
    rig.wait_settled().await;
    rig.crash().await;
    rig.run_hanging_at("after-batch-one");
    rig.say("second").await;
    rig.wait_dispatched(2).await;
    rig.crash().await;
    rig
}

/// Erases the rig's conversation with `eraser`, waiting out the crashed owner's lease.
fn erase_when_free(
    rig: &turnpike_tests::turns::Rig,
    eraser: turnpike_lifecycle::erasure::Eraser,
) -> tokio::task::JoinHandle<
    Result<turnpike_artifactory::Tombstone, turnpike_lifecycle::erasure::ErasureError>,
> {
    let directory = rig.conversations.directory().clone();
    let conversation = rig.conv;
    tokio::spawn(async move {
        let entry = directory.lookup_unchecked(conversation).await.unwrap();
        let deadline = Instant::now() + LONG;
        loop {
            match eraser.erase(&entry, "local:alice", "the user asked").await {
                Err(turnpike_lifecycle::erasure::ErasureError::Busy) => {
                    assert!(
                        Instant::now() < deadline,
                        "the crashed owner's lease never lapsed"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => return other,
            }
        }
    })
}

/// Item 3 of the third adversarial look: a deleter whose lease renewal fails once keeps its
/// lease (it retries), so a sweeper racing it all along can take nothing over; when the
/// deletion reports done, nothing is left under the conversation's prefix, and the sweeps
/// after it write nothing there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleter_keeps_its_lease_through_a_failed_renewal_and_a_racing_sweep_writes_nothing() {
    let ttl = Duration::from_millis(900);
    let rig = rig_with_an_open_turn(ttl).await;
    assert!(!objects_under(&rig).await.is_empty());
    let bus: std::sync::Arc<dyn turnpike_router::Bus> = rig.lane_reads.clone();
    // A long deletion: it pauses between the directory and the objects for three lease times.
    let eraser = turnpike_lifecycle::erasure::Eraser::new(rig.conversations.clone(), bus, None)
        .with_lease_ttl(ttl)
        .with_failpoints(turnpike_worker::Failpoints::default().with(
            "erase-after-directory",
            turnpike_lifecycle::failpoints::Action::Pause(ttl * 3),
        ));
    rig.lane_reads.fail_renewals(1);
    let erasing = erase_when_free(&rig, eraser);
    let sweeper = rig.idle_worker();
    let racer = turnpike_schemas::WorkerId::new();
    // Until the directory entry is gone the deleter may not hold the lease yet.
    let deadline = Instant::now() + LONG;
    while rig
        .conversations
        .directory()
        .lookup_unchecked(rig.conv)
        .await
        .is_ok()
    {
        assert!(Instant::now() < deadline, "the deletion never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while !erasing.is_finished() {
        sweeper.sweep().await;
        let taken = rig.bus.claim(rig.conv, racer, ttl).await.unwrap();
        assert!(
            taken.is_none() || erasing.is_finished(),
            "the deleter's lease lapsed while it deleted"
        );
        if let Some(lease) = taken {
            rig.bus.release(&lease).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tombstone = erasing.await.unwrap().expect("the deletion finishes");
    assert!(tombstone.finished_ms.is_some());
    assert_eq!(objects_under(&rig).await, Vec::<String>::new());
    for _ in 0..3 {
        sweeper.sweep().await;
    }
    assert_eq!(objects_under(&rig).await, Vec::<String>::new());
    assert!(!rig
        .conversations
        .open_turns()
        .is_marked(&rig.prefix())
        .await
        .unwrap());
}

/// Item 3, the other way: a deleter that cannot renew at all stops before its lease can lapse
/// (the deletion fails, its tombstone pending), and the sweep's `finish_pending` finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleter_that_cannot_renew_stops_before_its_lease_lapses_and_the_sweep_finishes() {
    let ttl = Duration::from_millis(900);
    let rig = rig_with_an_open_turn(ttl).await;
    let bus: std::sync::Arc<dyn turnpike_router::Bus> = rig.lane_reads.clone();
    let eraser = turnpike_lifecycle::erasure::Eraser::new(rig.conversations.clone(), bus, None)
        .with_lease_ttl(ttl)
        .with_failpoints(turnpike_worker::Failpoints::default().with(
            "erase-after-directory",
            turnpike_lifecycle::failpoints::Action::Pause(ttl * 3),
        ));
    rig.lane_reads.fail_renewals(usize::MAX);
    let result = erase_when_free(&rig, eraser.clone()).await.unwrap();
    let why = result
        .expect_err("a deleter without its lease stops")
        .to_string();
    assert!(why.contains("could not be renewed"), "{why}");
    // It stopped in its pause, before the objects: they are all still there, and pending.
    assert!(!objects_under(&rig).await.is_empty());
    let pending = rig.conversations.tombstones().pending().await.unwrap();
    assert_eq!(pending.len(), 1);
    rig.lane_reads.fail_renewals(0);
    let finisher = turnpike_lifecycle::erasure::Eraser::new(
        rig.conversations.clone(),
        rig.lane_reads.clone(),
        None,
    );
    assert_eq!(finisher.finish_pending().await.unwrap(), 1);
    assert_eq!(objects_under(&rig).await, Vec::<String>::new());
}

/// A deletion waits a few seconds for an owner finishing a turn (the reply the user just saw),
/// but not for a turn that goes on running: that one is `409`, and nothing is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_during_a_running_turn_is_refused_after_a_short_wait_and_deletes_nothing() {
    let apps = turnpike_tests::edge::queue_apps();
    let server = Server::start(&binary(), Some(apps.path()), FILES, false).unwrap();
    let store = server.store_dir();
    let alice = server.client(ALICE);
    let id = create(&alice, "queue", "stuck").await;
    say(&alice, &id, "take your time").await;
    turnpike_tests::edge::wait_for_status(&alice, &id, "running", LONG)
        .await
        .unwrap();
    let refused = alice
        .delete(&format!("/v1/conversations/{id}"))
        .await
        .unwrap();
    assert_eq!(refused.status, 409, "{:?}", refused.body);
    assert!(!objects_of(&store, &id).is_empty());
    let all = alice.delete("/v1/me").await.unwrap();
    assert_eq!(all.status, 409, "{:?}", all.body);
    assert!(
        all.body["message"].as_str().unwrap().contains(&id),
        "{:?}",
        all.body
    );
    // Stopped, it is deleted.
    turnpike_tests::edge::submit(&alice, &id, "stop", json!({})).await;
    let deadline = Instant::now() + LONG;
    loop {
        let reply = alice
            .delete(&format!("/v1/conversations/{id}"))
            .await
            .unwrap();
        if reply.status == 200 {
            break;
        }
        assert_eq!(reply.status, 409, "{:?}", reply.body);
        assert!(Instant::now() < deadline, "the stopped turn never let go");
    }
    assert_eq!(objects_of(&store, &id), Vec::<String>::new());
}
