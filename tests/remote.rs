//! Apps in any language: the Python sample app (`examples/support_bot`, on the SDK in
//! `sdk/python`) runs as a real process and drives turns of `turnpike serve` over the remote
//! app protocol; a raw HTTP app in this file misbehaves on purpose.
//!
//! The worker stays the one writer: what the app says streams to clients and lands in the
//! record, its tool calls run through the approval gate, its model calls are answered by the
//! `script` provider, and replay re-drives its turns without it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use turnpike_edge::client::{Client, Cursor};
use turnpike_edge::model::Frame;
use turnpike_tests::edge::{turns_of, wait_for_complete_turns, Server, ALICE};
use turnpike_tests::process::Process;

const LONG: Duration = Duration::from_secs(90);
const SECRET: &str = "s3cret-for-the-support-bot";

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_turnpike"))
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The sample app, running: its stderr (the SDK's log) can be waited on.
struct PyApp {
    process: Process,
    port: u16,
}

impl PyApp {
    fn start() -> PyApp {
        let script = repo().join("examples/support_bot/app.py");
        let mut process = Process::start(
            Path::new("python3"),
            &[script.display().to_string(), "--port".into(), "0".into()],
            &[("SUPPORT_BOT_SECRET", SECRET.to_owned())],
        )
        .expect("python3");
        let line = process
            .wait_for_line("serving on", Duration::from_secs(30))
            .expect("the app starts");
        let port = line.rsplit(':').next().unwrap().trim().parse().unwrap();
        PyApp { process, port }
    }
}

/// An apps folder with the sample's manifest pointed at `port` (and `extra` manifests).
fn apps(port: u16, extra: &[(&str, String)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let sample = repo().join("examples/support_bot");
    let manifest = std::fs::read_to_string(sample.join("support.toml"))
        .unwrap()
        .replace("http://127.0.0.1:9000", &format!("http://127.0.0.1:{port}"));
    std::fs::write(dir.path().join("support.toml"), manifest).unwrap();
    std::fs::copy(
        sample.join("support.script.toml"),
        dir.path().join("support.script.toml"),
    )
    .unwrap();
    for (name, text) in extra {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

fn serve(apps: &Path) -> Server {
    Server::start_with_env(
        &binary(),
        Some(apps),
        &[],
        false,
        &[
            ("SUPPORT_BOT_SECRET", SECRET.to_owned()),
            ("RUST_LOG", "warn,turnpike_worker=info".to_owned()),
        ],
    )
    .expect("turnpike serve")
}

async fn create(client: &Client, app: &str, agent: &str) -> String {
    let reply = client
        .post("/v1/conversations", &json!({"app": app, "agent": agent}))
        .await
        .unwrap();
    assert_eq!(reply.status, 201, "{:?}", reply.body);
    reply.body["id"].as_str().unwrap().to_owned()
}

async fn post(client: &Client, id: &str, what: &str, body: Value) {
    let sent = client
        .post(&format!("/v1/conversations/{id}/{what}"), &body)
        .await
        .unwrap();
    assert_eq!(sent.status, 202, "{what}: {:?}", sent.body);
}

async fn say(client: &Client, id: &str, text: &str) {
    post(client, id, "messages", json!({ "text": text })).await;
}

async fn rows(client: &Client, id: &str) -> Vec<Value> {
    Cursor::new(id).read(client).await.unwrap()
}

/// The deltas of a conversation's stream, read until they contain `needle`.
struct Deltas {
    stream: turnpike_edge::client::FrameStream,
    text: String,
}

impl Deltas {
    async fn open(client: &Client, id: &str) -> Deltas {
        let mut stream = client.stream(id).await.unwrap();
        assert!(matches!(
            stream.next_within(Duration::from_secs(10)).await,
            Some(Frame::Ready { .. })
        ));
        Deltas {
            stream,
            text: String::new(),
        }
    }

    async fn until(&mut self, needle: &str) {
        let deadline = Instant::now() + LONG;
        while !self.text.contains(needle) {
            assert!(
                Instant::now() < deadline,
                "{needle:?} never streamed; got {:?}",
                self.text
            );
            match self.stream.next_within(Duration::from_secs(1)).await {
                Some(Frame::Delta { text, .. }) => self.text.push_str(&text),
                Some(Frame::Closed { reason }) => panic!("the stream closed: {reason}"),
                _ => {}
            }
        }
    }
}

async fn pending_approval(client: &Client, id: &str) -> Value {
    let deadline = Instant::now() + LONG;
    loop {
        let pending = client
            .get(&format!("/v1/conversations/{id}/pending"))
            .await
            .unwrap()
            .into_ok()
            .unwrap();
        if let Some(first) = pending["approvals"].as_array().and_then(|a| a.first()) {
            return first.clone();
        }
        assert!(Instant::now() < deadline, "no approval came: {pending}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A row's field, at its top level or under `data`.
fn field<'r>(row: &'r Value, name: &str) -> &'r Value {
    match &row[name] {
        Value::Null => &row["data"][name],
        v => v,
    }
}

fn run_cli(server: &Server, args: &[&str]) -> std::process::Output {
    let mut all = vec!["--data-dir", server.data.path().to_str().unwrap()];
    all.extend_from_slice(args);
    std::process::Command::new(binary())
        .args(&all)
        .env("TURNPIKE_EMBEDDING_MODEL", "/nonexistent-model")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_app_streams_calls_tools_and_the_model_parks_on_an_approval_and_replays() {
    let mut app = PyApp::start();
    let apps = apps(app.port, &[]);
    let server = serve(apps.path());
    let alice = server.client(ALICE);
    let id = create(&alice, "support", "bot").await;
    let mut deltas = Deltas::open(&alice, &id).await;

    // Text streams while the turn runs; a follow-up reaches the app mid-turn and it answers.
    say(&alice, &id, "ticket: printer on fire").await;
    deltas.until("Send details as follow-ups").await;
    post(&alice, &id, "follow-ups", json!({"text": "It smokes"})).await;
    deltas.until("Noted: It smokes").await;
    post(&alice, &id, "follow-ups", json!({"text": "submit"})).await;

    // The model (the script provider) summarises; writing the ticket is gated: the turn
    // parks on the approval, with the canonical arguments.
    let approval = pending_approval(&alice, &id).await;
    assert_eq!(approval["tool"], "write_file", "{approval}");
    assert_eq!(approval["arguments"]["path"], "ticket.md", "{approval}");
    deltas.until("Summary: printer on fire").await;
    let turns = wait_for_complete_turns(&alice, &id, 1, LONG).await.unwrap();
    assert_eq!(turns[0].outcome.as_deref(), Some("parked"), "{turns:#?}");
    assert_eq!(turns[0].inputs, ["ticket: printer on fire", "It smokes", "submit"]);

    // Approved: the next turn writes the file and calls the app, whose publish call the
    // worker runs; the app reports the file.
    let request = approval["request_id"].as_str().unwrap();
    post(
        &alice,
        &id,
        &format!("approvals/{request}/approve"),
        json!({}),
    )
    .await;
    let turns = wait_for_complete_turns(&alice, &id, 2, LONG).await.unwrap();
    assert_eq!(turns[1].outcome.as_deref(), Some("replied"), "{turns:#?}");
    let filed = turns[1].replies.join("");
    let reference = filed
        .split_whitespace()
        .find(|w| w.starts_with("conv:fi:"))
        .unwrap_or_else(|| panic!("no file reference in {filed:?}"))
        .to_owned();
    let (status, bytes) = alice
        .bytes(&format!("/v1/files?reference={reference}"), true)
        .await
        .unwrap();
    assert_eq!(status, 200);
    let ticket = String::from_utf8(bytes).unwrap();
    assert!(ticket.starts_with("# printer on fire"), "{ticket}");
    assert!(ticket.contains("- It smokes"), "{ticket}");

    // What streamed is what was recorded: every reply of turn 1 streamed.
    for reply in &turns[0].replies {
        assert!(deltas.text.contains(reply.as_str()), "{reply:?} never streamed");
    }

    // Replay re-drives both turns from their exchange logs with the app gone.
    app.process.kill();
    let replay = run_cli(
        &server,
        &["conversation", "replay", &id, "--actor", "local:alice"],
    );
    let out = String::from_utf8_lossy(&replay.stdout);
    assert_eq!(
        replay.status.code(),
        Some(0),
        "{out}{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    assert!(
        out.contains("turn_1: reproduced") && out.contains("turn_2: reproduced"),
        "{out}"
    );
    assert!(!out.contains("DIVERGES"), "{out}");
    // A what-if that changes what the app was told diverges where it was told.
    let all = rows(&alice, &id).await;
    // (The last result is turn 2's publish, which the app asked for.)
    let call = all
        .iter()
        .rfind(|r| r["kind"] == "tool_result")
        .and_then(|r| field(r, "call_id").as_str())
        .unwrap()
        .to_owned();
    let what_if = format!(r#"turn_2/result/{call}={{"reference":"conv:fi:other"}}"#);
    let changed = run_cli(
        &server,
        &[
            "conversation",
            "replay",
            &id,
            "--actor",
            "local:alice",
            "--what-if",
            &what_if,
        ],
    );
    let out = String::from_utf8_lossy(&changed.stdout).to_string()
        + &String::from_utf8_lossy(&changed.stderr);
    assert!(out.contains("DIVERGES: turn_2"), "{out}");
}

/// Sends a message and waits until its turn is complete; returns the conversation's rows.
async fn turn(client: &Client, id: &str, text: &str, count: usize) -> Vec<Value> {
    say(client, id, text).await;
    wait_for_complete_turns(client, id, count, LONG)
        .await
        .unwrap();
    rows(client, id).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_reaches_the_app_mid_turn_and_the_conversation_goes_on() {
    let mut app = PyApp::start();
    let apps = apps(app.port, &[]);
    let server = serve(apps.path());
    let alice = server.client(ALICE);
    let id = create(&alice, "support", "bot").await;
    let mut deltas = Deltas::open(&alice, &id).await;
    say(&alice, &id, "ticket: lost badge").await;
    deltas.until("Send details").await;
    post(&alice, &id, "follow-ups", json!({"text": "blue lanyard"})).await;
    deltas.until("Noted: blue lanyard").await;
    post(&alice, &id, "stop", json!({})).await;
    let turns = wait_for_complete_turns(&alice, &id, 1, LONG).await.unwrap();
    assert_eq!(turns[0].outcome.as_deref(), Some("cancelled"), "{turns:#?}");
    // The app heard the stop: its handler was cancelled.
    let line = app
        .process
        .wait_for_line("stopped", LONG)
        .expect("the app logs the stop");
    assert!(line.contains(&id), "{line}");
    // What the app said before the stop is in the record.
    assert!(turns[0].replies.iter().any(|r| r.contains("Noted: blue lanyard")));
    // The conversation goes on: the next message is answered by the app through the model.
    let all = turn(&alice, &id, "hello there", 2).await;
    let turns = turns_of(&all);
    assert_eq!(turns[1].outcome.as_deref(), Some("replied"), "{turns:#?}");
    assert_eq!(turns[1].replies, ["Summary: hello there"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_turn_is_replaced_and_the_app_called_again_with_the_same_key() {
    let mut app = PyApp::start();
    let apps = apps(app.port, &[]);
    let mut server = serve(apps.path());
    let alice = server.client(ALICE);
    let id = create(&alice, "support", "bot").await;
    say(&alice, &id, "ticket: broken chair").await;
    let first = app
        .process
        .wait_for_line(&format!("turn {id}.turn_1."), LONG)
        .unwrap();
    // The app is waiting for details: the worker dies (SIGKILL), another takes over.
    server.restart().unwrap();
    let key = format!("key {id}/turn_1");
    assert!(first.ends_with(&key), "{first}");
    let second = app.process.wait_for_lines(&key, 2, LONG).unwrap().remove(1);
    assert_ne!(first, second, "a new attempt, a new exchange");
    let attempt = |line: &str| line.split(" attempt ").nth(1).unwrap().to_owned();
    assert_ne!(attempt(&first), attempt(&second));
    // The new attempt completes the turn, once.
    let alice = server.client(ALICE);
    post(&alice, &id, "follow-ups", json!({"text": "submit"})).await;
    let turns = wait_for_complete_turns(&alice, &id, 1, LONG).await.unwrap();
    assert_eq!(turns.len(), 1, "{turns:#?}");
    assert_eq!(turns[0].outcome.as_deref(), Some("parked"), "{turns:#?}");
    let all = rows(&alice, &id).await;
    let completes = all
        .iter()
        .filter(|r| r["kind"] == "turn_complete")
        .count();
    assert_eq!(completes, 1);
}

