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
use turnpike_tests::edge::{create, say, submit, turns_of, wait_for_complete_turns, Server, ALICE};
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
struct SampleApp {
    process: Process,
    port: u16,
}

impl SampleApp {
    /// The Python sample (`examples/support_bot/app.py`, on `sdk/python`).
    fn start() -> SampleApp {
        let script = repo().join("examples/support_bot/app.py");
        Self::run(Path::new("python3"), &script)
    }

    /// The same sample in TypeScript (`examples/support_bot_ts`, on `sdk/typescript`), built
    /// from its sources first, run by Node.
    fn typescript() -> SampleApp {
        build_typescript();
        let script = repo().join("examples/support_bot_ts/dist/app.js");
        Self::run(Path::new("node"), &script)
    }

    fn run(program: &Path, script: &Path) -> SampleApp {
        let mut process = Process::start(
            program,
            &[script.display().to_string(), "--port".into(), "0".into()],
            &[("SUPPORT_BOT_SECRET", SECRET.to_owned())],
        )
        .unwrap_or_else(|e| panic!("{}: {e:#}", program.display()));
        let line = process
            .wait_for_line("serving on", Duration::from_secs(30))
            .expect("the app starts");
        let port = line.rsplit(':').next().unwrap().trim().parse().unwrap();
        SampleApp { process, port }
    }
}

/// Builds the TypeScript SDK and its sample (`npm run build`: the TypeScript compiler that
/// `scripts/services install tests` put in their `node_modules`), once per test binary.
fn build_typescript() {
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        for dir in ["sdk/typescript", "examples/support_bot_ts"] {
            let out = std::process::Command::new("npm")
                .args(["run", "--silent", "build"])
                .current_dir(repo().join(dir))
                .output()
                .expect("npm (run `scripts/services install tests`)");
            assert!(
                out.status.success(),
                "npm run build in {dir}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    });
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
    the_sample_app_streams_calls_tools_and_the_model_parks_on_an_approval_and_replays(
        SampleApp::start(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typescript_app_streams_calls_tools_and_the_model_parks_on_an_approval_and_replays() {
    the_sample_app_streams_calls_tools_and_the_model_parks_on_an_approval_and_replays(
        SampleApp::typescript(),
    )
    .await
}

/// The TypeScript SDK's own check: it plays the worker against its sample and against small
/// apps on the SDK (keepalives, a given-up wait, refusals, the deadline, bad requests).
#[test]
fn the_typescript_sdk_passes_its_own_protocol_check() {
    build_typescript();
    let out = std::process::Command::new("node")
        .arg("test/smoke.mjs")
        .current_dir(repo().join("sdk/typescript"))
        .output()
        .expect("node");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && said.contains("smoke: ok"), "{said}");
}

/// Text streams, a follow-up reaches the app mid-turn, the model summarises, a gated tool
/// parks the turn, the approved call's turn publishes a file, and replay re-drives both turns
/// without the app — whichever SDK the sample is written with.
async fn the_sample_app_streams_calls_tools_and_the_model_parks_on_an_approval_and_replays(
    mut app: SampleApp,
) {
    let apps = apps(app.port, &[]);
    let server = serve(apps.path());
    let alice = server.client(ALICE);
    let id = create(&alice, "support", "bot").await;
    let mut deltas = Deltas::open(&alice, &id).await;

    // Text streams while the turn runs; a follow-up reaches the app mid-turn and it answers.
    say(&alice, &id, "ticket: printer on fire").await;
    deltas.until("Send details as follow-ups").await;
    submit(&alice, &id, "follow-ups", json!({"text": "It smokes"})).await;
    deltas.until("Noted: It smokes").await;
    submit(&alice, &id, "follow-ups", json!({"text": "submit"})).await;

    // The model (the script provider) summarises; writing the ticket is gated: the turn
    // parks on the approval, with the canonical arguments.
    let approval = pending_approval(&alice, &id).await;
    assert_eq!(approval["tool"], "write_file", "{approval}");
    assert_eq!(approval["arguments"]["path"], "ticket.md", "{approval}");
    deltas.until("Summary: printer on fire").await;
    let turns = wait_for_complete_turns(&alice, &id, 1, LONG).await.unwrap();
    assert_eq!(turns[0].outcome.as_deref(), Some("parked"), "{turns:#?}");
    assert_eq!(
        turns[0].inputs,
        ["ticket: printer on fire", "It smokes", "submit"]
    );

    // Approved: the next turn writes the file and calls the app, whose publish call the
    // worker runs; the app reports the file.
    let request = approval["request_id"].as_str().unwrap();
    submit(
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
        assert!(
            deltas.text.contains(reply.as_str()),
            "{reply:?} never streamed"
        );
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
    let mut app = SampleApp::start();
    let apps = apps(app.port, &[]);
    let server = serve(apps.path());
    let alice = server.client(ALICE);
    let id = create(&alice, "support", "bot").await;
    let mut deltas = Deltas::open(&alice, &id).await;
    say(&alice, &id, "ticket: lost badge").await;
    deltas.until("Send details").await;
    submit(&alice, &id, "follow-ups", json!({"text": "blue lanyard"})).await;
    deltas.until("Noted: blue lanyard").await;
    submit(&alice, &id, "stop", json!({})).await;
    let turns = wait_for_complete_turns(&alice, &id, 1, LONG).await.unwrap();
    assert_eq!(turns[0].outcome.as_deref(), Some("cancelled"), "{turns:#?}");
    // The app heard the stop: its handler was cancelled.
    let line = app
        .process
        .wait_for_line("stopped", LONG)
        .expect("the app logs the stop");
    assert!(line.contains(&id), "{line}");
    // What the app said before the stop is in the record.
    assert!(turns[0]
        .replies
        .iter()
        .any(|r| r.contains("Noted: blue lanyard")));
    // The conversation goes on: the next message is answered by the app through the model.
    let all = turn(&alice, &id, "hello there", 2).await;
    let turns = turns_of(&all);
    assert_eq!(turns[1].outcome.as_deref(), Some("replied"), "{turns:#?}");
    assert_eq!(turns[1].replies, ["Summary: hello there"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_turn_is_replaced_and_the_app_called_again_with_the_same_key() {
    let mut app = SampleApp::start();
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
    let key = format!("key default/{id}/turn_1");
    assert!(first.ends_with(&key), "{first}");
    let second = app.process.wait_for_lines(&key, 2, LONG).unwrap().remove(1);
    assert_ne!(first, second, "a new attempt, a new exchange");
    let attempt = |line: &str| line.split(" attempt ").nth(1).unwrap().to_owned();
    assert_ne!(attempt(&first), attempt(&second));
    // The new attempt completes the turn, once.
    let alice = server.client(ALICE);
    submit(&alice, &id, "follow-ups", json!({"text": "submit"})).await;
    let turns = wait_for_complete_turns(&alice, &id, 1, LONG).await.unwrap();
    assert_eq!(turns.len(), 1, "{turns:#?}");
    assert_eq!(turns[0].outcome.as_deref(), Some("parked"), "{turns:#?}");
    let all = rows(&alice, &id).await;
    let completes = all.iter().filter(|r| r["kind"] == "turn_complete").count();
    assert_eq!(completes, 1);
}

/// An app that misbehaves on purpose, by what the user says: `malformed` (an unknown action),
/// `huge` (a line past the agent's limit), `slow` (answers, then says nothing); anything else
/// gets a proper reply. It keeps what the worker sends it.
struct RawApp {
    port: u16,
    received: Arc<Mutex<Vec<Value>>>,
}

impl RawApp {
    async fn start() -> RawApp {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let keep = received.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(Self::serve(socket, keep.clone()));
            }
        });
        RawApp { port, received }
    }

    async fn serve(socket: tokio::net::TcpStream, received: Arc<Mutex<Vec<Value>>>) {
        let mut socket = BufReader::new(socket);
        loop {
            let mut head = Vec::new();
            loop {
                let mut line = String::new();
                if socket.read_line(&mut line).await.unwrap_or(0) == 0 {
                    return;
                }
                if line == "\r\n" {
                    break;
                }
                head.push(line);
            }
            let length: usize = head
                .iter()
                .find_map(|h| {
                    let (k, v) = h.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            let mut body = vec![0; length];
            socket.read_exact(&mut body).await.unwrap();
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            if head[0].contains("/messages") {
                received.lock().unwrap().push(body);
                let _ = socket
                    .write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
                    .await;
                continue;
            }
            let said = body["inputs"][0]["text"].as_str().unwrap_or_default();
            if said.starts_with("wait ") || said.starts_with("more ") {
                Self::hasty(socket, said).await;
                return;
            }
            let actions = match said {
                "malformed" => {
                    "{\"type\":\"say\",\"text\":\"hm\"}\n{\"type\":\"shout\"}\n".to_owned()
                }
                "huge" => format!("{{\"type\":\"say\",\"text\":\"{}\"}}\n", "x".repeat(4000)),
                "slow" => String::new(),
                "chatty" => (0..20)
                    .map(|i| {
                        format!("{{\"type\":\"model\",\"id\":\"m{i}\",\"max_tokens\":100000}}\n")
                    })
                    .collect(),
                _ => {
                    "{\"type\":\"say\",\"text\":\"hi from raw\"}\n{\"type\":\"done\"}\n".to_owned()
                }
            };
            let _ = socket
                .write_all(
                    format!("HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\nconnection: close\r\n\r\n{actions}")
                        .as_bytes(),
                )
                .await;
            if matches!(said, "slow" | "malformed" | "chatty") {
                // Hold the stream open until the worker hangs up.
                let mut rest = Vec::new();
                let _ = socket.read_to_end(&mut rest).await;
            }
            return;
        }
    }
}

impl RawApp {
    /// Says one line, waits as long as the message asks ("wait 120 …": 120 ms), then sends
    /// `done`, never reading follow-ups.
    async fn hasty(mut socket: BufReader<tokio::net::TcpStream>, said: &str) {
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\nconnection: close\r\n\r\n";
        let say = json!({"type": "say", "text": format!("got {said}")});
        let _ = socket.write_all(format!("{head}{say}\n").as_bytes()).await;
        let _ = socket.flush().await;
        let words: Vec<&str> = said.split_whitespace().collect();
        if let (Some(&"wait"), Some(ms)) = (words.first(), words.get(1)) {
            let ms: u64 = ms.parse().unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let _ = socket.write_all(b"{\"type\":\"done\"}\n").await;
        let mut rest = Vec::new();
        let _ = socket.read_to_end(&mut rest).await;
    }
}

/// Item 1 of the third adversarial look: a follow-up sent while the app is between its last
/// `say` and its `done` — which the app never reads — gets a turn and a reply of its own,
/// every time. Each round races a follow-up against a `done` the app sends 0–300 ms after
/// the line the test waits for; whichever wins, nothing is swallowed and no turn fails.
async fn every_unread_follow_up_gets_its_own_turn(server: &Server, app: &str, rounds: usize) {
    unread_follow_ups(server, app, "wait", rounds).await
}

/// The race above, with messages starting with `verb` (`wait`, or `patience` for an app that
/// first gives up a wait for events).
async fn unread_follow_ups(server: &Server, app: &str, verb: &str, rounds: usize) {
    let alice = server.client(ALICE);
    let id = create(&alice, app, "hasty").await;
    let mut deltas = Deltas::open(&alice, &id).await;
    let mut expected = Vec::new();
    for round in 0..rounds {
        let delay = [0, 20, 60, 150, 300][round % 5];
        let message = format!("{verb} {delay} r{round}");
        say(&alice, &id, &message).await;
        deltas.until(&format!("got {message}")).await;
        let follow_up = format!("more r{round}");
        submit(&alice, &id, "follow-ups", json!({ "text": follow_up })).await;
        expected.push(message);
        expected.push(follow_up);
        wait_for_complete_turns(&alice, &id, expected.len(), LONG)
            .await
            .unwrap_or_else(|e| panic!("{app}, round {round}: {e:#}"));
    }
    let turns = turns_of(&rows(&alice, &id).await);
    assert_eq!(turns.len(), expected.len(), "{turns:#?}");
    for (turn, input) in turns.iter().zip(&expected) {
        assert_eq!(turn.outcome.as_deref(), Some("replied"), "{turn:#?}");
        assert_eq!(turn.inputs, std::slice::from_ref(input), "{turns:#?}");
        assert_eq!(turn.replies, [format!("got {input}")], "{turns:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_a_raw_app_never_reads_starts_the_next_turn_every_time() {
    let raw = RawApp::start().await;
    let manifest = format!(
        "app = \"raw\"\n[agents.hasty]\nprovider = \"echo\"\n[agents.hasty.remote]\nurl = \"http://127.0.0.1:{}\"\n",
        raw.port
    );
    let apps = apps(1, &[("raw.toml", manifest)]);
    let server = serve(apps.path());
    every_unread_follow_up_gets_its_own_turn(&server, "raw", 15).await;
    // Nothing was pushed to the app: it asked for no events.
    assert!(raw.received.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_a_python_app_never_reads_starts_the_next_turn_every_time() {
    let mut process = Process::start(
        Path::new("python3"),
        &[
            repo().join("tests/apps/hasty.py").display().to_string(),
            "--port".into(),
            "0".into(),
        ],
        &[(
            "PYTHONPATH",
            repo().join("sdk/python").display().to_string(),
        )],
    )
    .expect("python3");
    let line = process
        .wait_for_line("serving on", Duration::from_secs(30))
        .expect("the app starts");
    let port: u16 = line.rsplit(':').next().unwrap().trim().parse().unwrap();
    let manifest = format!(
        "app = \"py\"\n[agents.hasty]\nprovider = \"echo\"\n[agents.hasty.remote]\nurl = \"http://127.0.0.1:{port}\"\n"
    );
    let apps = apps(1, &[("py.toml", manifest)]);
    let server = serve(apps.path());
    every_unread_follow_up_gets_its_own_turn(&server, "py", 15).await;
    // A handler that gives up waiting for events (a timeout around `next_event`) is heard at
    // once — its wait does not hold the turn — and what arrives afterwards still gets a turn
    // and a reply of its own.
    unread_follow_ups(&server, "py", "patience", 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_oversized_slow_and_unreachable_apps_fail_the_turn_with_a_recorded_reason() {
    let raw = RawApp::start().await;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let manifest = format!(
        r#"
app = "raw"

[agents.edgy]
provider = "echo"
[agents.edgy.remote]
url = "http://127.0.0.1:{}"
read_timeout_ms = 500
max_line_bytes = 1024

[agents.gone]
provider = "echo"
[agents.gone.remote]
url = "http://127.0.0.1:{closed}"
connect_timeout_ms = 500
"#,
        raw.port
    );
    let apps = apps(1, &[("raw.toml", manifest)]);
    let server = serve(apps.path());
    let alice = server.client(ALICE);
    let id = create(&alice, "raw", "edgy").await;
    let error_of = |rows: &[Value], turn: &str| -> String {
        rows.iter()
            .find(|r| r["kind"] == "error" && r.to_string().contains(turn))
            .map(|r| r.to_string())
            .unwrap_or_else(|| panic!("no error row for {turn}: {rows:#?}"))
    };
    let cases = [
        ("malformed", "unknown variant `shout`"),
        ("huge", "an action longer than 1024 bytes"),
        ("slow", "silent for longer than the read timeout of 500 ms"),
        // As the built-in loop: a model call per round and a closing one (8 + 1).
        ("chatty", "asked the model more than 9 times in one turn"),
    ];
    for (n, (text, reason)) in cases.iter().enumerate() {
        let all = turn(&alice, &id, text, n + 1).await;
        let turns = turns_of(&all);
        assert_eq!(
            turns[n].outcome.as_deref(),
            Some("failed"),
            "{text}: {turns:#?}"
        );
        let error = error_of(&all, &format!("turn_{}", n + 1));
        assert!(error.contains(reason), "{text}: {error}");
    }
    // The app heard why its turn was refused; the model answered nine calls, no more.
    let received = raw.received.lock().unwrap().clone();
    let answered = received
        .iter()
        .filter(|m| m["type"] == "model_result")
        .count();
    assert_eq!(answered, 9, "{received:?}");
    assert!(
        received
            .iter()
            .any(|m| m["type"] == "refused" && m["message"].as_str().unwrap().contains("shout")),
        "{received:?}"
    );
    // The conversation goes on, and nothing was retried on its own: one turn per message.
    let all = turn(&alice, &id, "hello", 5).await;
    let turns = turns_of(&all);
    assert_eq!(turns.len(), 5);
    assert_eq!(turns[4].outcome.as_deref(), Some("replied"));
    assert_eq!(turns[4].replies, ["hi from raw"]);

    // An app nobody answers for: a clear failure, recorded.
    let id = create(&alice, "raw", "gone").await;
    let all = turn(&alice, &id, "hello", 1).await;
    assert_eq!(turns_of(&all)[0].outcome.as_deref(), Some("failed"));
    let error = error_of(&all, "turn_1");
    assert!(
        error.contains("cannot reach the app at http://127.0.0.1:"),
        "{error}"
    );
}

/// Writes a file whole (a temporary name, then a rename): a reload never sees half of it.
fn put(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!("{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, dir.join(name)).unwrap();
}

/// Waits until the API's catalogue lists `app` (with `model`, if given).
async fn listed(client: &Client, app: &str, model: Option<&str>) {
    let deadline = Instant::now() + LONG;
    loop {
        let apps = client.get("/v1/apps").await.unwrap().into_ok().unwrap();
        let found = apps["apps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["id"] == app);
        if let Some(found) = found {
            if model.is_none_or(|m| found["agents"][0]["model"] == m) {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{app} never listed as wanted: {apps}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_manifest_is_picked_up_by_a_running_worker_and_a_broken_one_refused() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = |n: u32| {
        format!("app = \"hot\"\n[agents.a]\nprovider = \"script\"\nmodel = \"v{n}\"\nscript = \"v{n}.script.toml\"\n")
    };
    let script = |text: &str| format!("[[turn]]\n[[turn.step]]\ntext = \"{text} {{last_user}}\"\n");
    put(dir.path(), "v1.script.toml", &script("one:"));
    put(dir.path(), "hot.toml", &manifest(1));
    let mut server = Server::start_with_env(
        &binary(),
        Some(dir.path()),
        &["--apps-poll-ms", "100"],
        false,
        &[("RUST_LOG", "warn,turnpike_worker=info".to_owned())],
    )
    .unwrap();
    let alice = server.client(ALICE);
    let id = create(&alice, "hot", "a").await;
    let all = turn(&alice, &id, "a", 1).await;
    assert_eq!(turns_of(&all)[0].replies, ["one: a"]);

    // An app the API does not know yet is refused...
    let unknown = alice
        .post("/v1/conversations", &json!({"app": "fresh", "agent": "a"}))
        .await
        .unwrap();
    assert_eq!(unknown.status, 404, "{:?}", unknown.body);
    // ... until its manifest appears: the API's catalogue and the worker follow the folder.
    put(
        dir.path(),
        "fresh.toml",
        "app = \"fresh\"\n[agents.a]\nprovider = \"echo\"\n",
    );
    listed(&alice, "fresh", None).await;
    let fresh = create(&alice, "fresh", "a").await;
    let outcome = turns_of(&turn(&alice, &fresh, "hi", 1).await)[0]
        .outcome
        .clone();
    assert_eq!(outcome.as_deref(), Some("replied"));

    // A changed manifest naming a new script: the next turn runs on it, without a restart.
    put(dir.path(), "v2.script.toml", &script("two:"));
    put(dir.path(), "hot.toml", &manifest(2));
    listed(&alice, "hot", Some("v2")).await;
    let all = turn(&alice, &id, "b", 2).await;
    assert_eq!(turns_of(&all)[1].replies, ["two: b"]);

    // A broken manifest: refused, with the reason; the running one keeps serving.
    put(
        dir.path(),
        "hot.toml",
        "app = \"hot\"\n[agents.a]\nprovider = \"nope\"\n",
    );
    let refused = server
        .process
        .wait_for_line("kept the running apps", LONG)
        .unwrap();
    assert!(refused.contains("unknown provider"), "{refused}");
    let all = turn(&alice, &id, "c", 3).await;
    assert_eq!(turns_of(&all)[2].replies, ["two: c"]);
    listed(&alice, "hot", Some("v2")).await;
}
