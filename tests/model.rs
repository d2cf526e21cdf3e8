//! A real language model behind `turnpike serve`: llama.cpp's OpenAI-compatible server with
//! SmolLM2-135M-Instruct (the harness starts it), an `openai` agent pointed at it, and clients
//! over the API. Next to the protocol-server tests in `worker/tests/openai.rs`, which stay: those
//! pin the protocol; these show the whole path holds with a model nobody scripted.
//!
//! The model is tiny and sampled at temperature 0. The tests assert what the runtime does with
//! whatever it says — history sent, deltas equal to the committed reply, usage recorded, a stop
//! that cancels the HTTP request, bad tool arguments refused — never what it says.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use turnpike_artifactory::{ConversationPrefix, Conversations};
use turnpike_edge::client::{Client, Cursor};
use turnpike_edge::model::Frame;
use turnpike_schemas::{Block, ConversationId, TurnId, TurnLog};
use turnpike_tests::edge::{say, turns_of, wait_for_complete_turns, Server, ALICE};
use turnpike_tests::llm::{self, LlamaServer, RecordingProxy};

const LONG: Duration = Duration::from_secs(120);

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_turnpike"))
}

/// The `local` app: agents on the model server at `url`. `tiny` has a context as small as its
/// server's (see the trimming test).
fn apps(url: &str, tiny_url: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let manifest = format!(
        r#"
app = "local"

[agents.chat]
provider = "openai"
model = "{model}"
base_url = "{url}"
api_key_env = ""
system_prompt = "You are a helpful assistant. Answer in one or two short sentences."
temperature = 0.0
context_length = 4096
reply_reserve = 1024

[agents.counted]
provider = "openai"
model = "{model}"
base_url = "{url}"
api_key_env = ""
system_prompt = "You are a helpful assistant. Answer in one short sentence."
temperature = 0.0
max_tokens = 64
stream = false
context_length = 4096
reply_reserve = 1024

[agents.reader]
provider = "openai"
model = "{model}"
base_url = "{url}"
api_key_env = ""
system_prompt = "You read files for the user with the read_file tool."
temperature = 0.0
tools = ["read_file"]
tool_choice = "read_file"
max_tokens = 200
max_rounds = 3
context_length = 4096
reply_reserve = 1024

[agents.timekeeper]
provider = "openai"
model = "{model}"
base_url = "{url}"
api_key_env = ""
system_prompt = "You tell the time with your tools."
temperature = 0.0
tool_choice = "time__get_current_time"
max_tokens = 200
max_rounds = 2
context_length = 4096
reply_reserve = 1024

[[agents.timekeeper.mcp]]
name = "time"
command = ["{venv}/bin/mcp-server-time", "--local-timezone", "UTC"]
read_only = ["{venv}"]

[agents.tiny]
provider = "openai"
model = "{model}"
base_url = "{tiny_url}"
api_key_env = ""
system_prompt = "Answer briefly."
temperature = 0.0
max_tokens = 128
context_length = {tiny}
reply_reserve = 160
"#,
        model = llm::MODEL,
        tiny = TINY_CONTEXT,
        venv = mcp_venv(),
    );
    std::fs::write(dir.path().join("local.toml"), manifest).unwrap();
    dir
}

/// The context of the `tiny` agent and of the server it talks to.
const TINY_CONTEXT: u32 = 512;

fn serve(apps: &Path) -> Server {
    // The MCP servers' venv is the operator's grant to their sandboxes.
    Server::start_with_env(
        &binary(),
        Some(apps),
        &[],
        false,
        &[("TURNPIKE_MCP_READ_ROOTS", mcp_venv())],
    )
    .expect("turnpike serve")
}

fn mcp_venv() -> String {
    std::env::var("TURNPIKE_MCP_VENV")
        .unwrap_or_else(|_| "/var/tmp/turnpike-services/mcp-venv".into())
}

async fn create(client: &Client, agent: &str) -> String {
    turnpike_tests::edge::create(client, "local", agent).await
}

/// The committed turn log of `turn`, read from the server's store.
async fn turn_log(server: &Server, id: &str, turn: u64) -> TurnLog {
    let store = turnpike_artifactory::open_store(server.store_dir().to_str().unwrap()).unwrap();
    let conversations = Conversations::new(store);
    let conv: ConversationId = id.parse().unwrap();
    let prefix = ConversationPrefix::new("default".parse().unwrap(), conv);
    conversations
        .turn_logs()
        .read(&prefix, TurnId::new(turn).unwrap())
        .await
        .unwrap()
}

async fn all_rows(client: &Client, id: &str) -> Vec<Value> {
    let mut cursor = Cursor::new(id);
    cursor.read(client).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_turns_stream_and_the_server_receives_their_history() {
    let model = llm::shared();
    // Between the worker and the server, a pass-through that keeps what the server received.
    let proxy = RecordingProxy::start(&model.url()).await.unwrap();
    let apps = apps(&proxy.url(), &model.url());
    let server = serve(apps.path());
    let alice = server.client(ALICE);
    let id = create(&alice, "chat").await;

    // Turn 1, streamed: the deltas a WebSocket client sees are the committed reply.
    let mut stream = alice.stream(&id).await.unwrap();
    assert!(matches!(
        stream.next_within(Duration::from_secs(10)).await,
        Some(Frame::Ready { .. })
    ));
    say(
        &alice,
        &id,
        "My name is Ada and I keep bees. Say hello to me.",
    )
    .await;
    let mut streamed = String::new();
    let deadline = Instant::now() + LONG;
    loop {
        assert!(Instant::now() < deadline, "turn 1 never completed");
        match stream.next_within(Duration::from_secs(5)).await {
            Some(Frame::Delta { turn, text }) => {
                assert_eq!(turn, "turn_1");
                streamed.push_str(&text);
            }
            Some(Frame::Closed { reason }) => panic!("the stream closed: {reason}"),
            _ => {}
        }
        let turns = turns_of(&all_rows(&alice, &id).await);
        if turns.first().is_some_and(|t| t.outcome.is_some()) {
            break;
        }
    }
    // Deltas published before the commit all arrived before its rows frame; drain what is left.
    while let Some(frame) = stream.next_within(Duration::from_millis(500)).await {
        if let Frame::Delta { text, .. } = frame {
            streamed.push_str(&text);
        }
    }
    let turns = wait_for_complete_turns(&alice, &id, 1, LONG).await.unwrap();
    assert_eq!(turns[0].outcome.as_deref(), Some("replied"), "{turns:#?}");
    assert_eq!(turns[0].replies.len(), 1);
    assert!(!streamed.is_empty(), "no delta reached the client");
    assert_eq!(streamed, turns[0].replies[0], "the deltas are the reply");

    // Turns 2 and 3: each request carries the conversation so far.
    say(&alice, &id, "What insects do I keep?").await;
    wait_for_complete_turns(&alice, &id, 2, LONG).await.unwrap();
    say(&alice, &id, "And what is my name?").await;
    let turns = wait_for_complete_turns(&alice, &id, 3, LONG).await.unwrap();
    assert!(turns
        .iter()
        .all(|t| t.outcome.as_deref() == Some("replied")));

    // The server received the conversation so far with each turn: turn 3's request holds
    // both earlier exchanges, in order, before its own message.
    let requests = proxy.requests();
    assert_eq!(requests.len(), 3, "one model call per turn");
    let messages: Vec<(String, String)> = requests[2]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap().to_owned(),
                m["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = [
        ("user", "My name is Ada and I keep bees. Say hello to me."),
        ("assistant", turns[0].replies[0].as_str()),
        ("user", "What insects do I keep?"),
        ("assistant", turns[1].replies[0].as_str()),
        ("user", "And what is my name?"),
    ]
    .iter()
    .map(|(r, c)| (r.to_string(), c.to_string()))
    .collect();
    assert_eq!(messages[0].0, "system");
    assert_eq!(messages[1..], want[..]);
    assert_eq!(requests[2]["temperature"], json!(0.0));
    // llama-cpp-python streams no usage (it ignores `stream_options`): the turn log then says
    // nothing rather than inventing a count (see the next test for usage it reports).
    for turn in 1..=3 {
        assert_eq!(turn_log(&server, &id, turn).await.usage, None);
    }
    // The record still counts each call, marked as the runtime's estimate.
    let rows = all_rows(&alice, &id).await;
    let usage: Vec<&Value> = rows.iter().filter(|r| r["kind"] == "usage").collect();
    assert_eq!(usage.len(), 3, "one call per turn: {usage:#?}");
    for row in usage {
        assert_eq!(row["data"]["estimated"], true, "{row:#}");
        assert!(row["data"]["input_tokens"].as_u64().unwrap() > 0, "{row:#}");
        assert!(row["data"].get("cost").is_none(), "no price table: no cost");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_the_server_reports_lands_in_the_turn_log_the_record_the_api_and_the_ledger() {
    // Unstreamed (`stream = false`), llama-cpp-python reports usage: it is summed per turn in
    // the turn log, and each call is a `usage` entry priced from the price table.
    let model = llm::shared();
    let apps = apps(&model.url(), &model.url());
    // Not in the apps folder: every file there is read as a manifest.
    let prices_dir = tempfile::tempdir().unwrap();
    let prices = prices_dir.path().join("prices.toml");
    std::fs::write(
        &prices,
        format!(
            "version = \"test-1\"\n[[price]]\nprovider = \"openai\"\nmodel = \"{}\"\ninput_usd_per_mtok = 1000\noutput_usd_per_mtok = 3000\n",
            llm::MODEL
        ),
    )
    .unwrap();
    let server = Server::start(
        &binary(),
        Some(apps.path()),
        &["--prices", prices.to_str().unwrap()],
        false,
    )
    .expect("turnpike serve");
    let alice = server.client(ALICE);
    let id = create(&alice, "counted").await;
    let mut stream = alice.stream(&id).await.unwrap();
    say(&alice, &id, "Tell me one fact about the moon.").await;
    let mut streamed = String::new();
    let turns = loop {
        if let Some(Frame::Delta { text, .. }) =
            stream.next_within(Duration::from_millis(200)).await
        {
            streamed.push_str(&text);
        }
        let turns = turns_of(&all_rows(&alice, &id).await);
        if turns.first().is_some_and(|t| t.outcome.is_some()) {
            break turns;
        }
    };
    while let Some(frame) = stream.next_within(Duration::from_millis(500)).await {
        if let Frame::Delta { text, .. } = frame {
            streamed.push_str(&text);
        }
    }
    assert_eq!(turns[0].outcome.as_deref(), Some("replied"), "{turns:#?}");
    // The reply arrives whole, as one delta, and is what was committed.
    assert_eq!(streamed, turns[0].replies[0]);
    say(&alice, &id, "And one more fact, please.").await;
    wait_for_complete_turns(&alice, &id, 2, LONG).await.unwrap();
    let one = turn_log(&server, &id, 1)
        .await
        .usage
        .expect("usage of turn 1");
    let two = turn_log(&server, &id, 2)
        .await
        .usage
        .expect("usage of turn 2");
    assert!(
        one.prompt_tokens > 0 && one.completion_tokens > 0,
        "{one:?}"
    );
    assert!(one.completion_tokens <= 64, "max_tokens holds: {one:?}");
    // Turn 2's prompt holds turn 1's exchange.
    assert!(
        two.prompt_tokens > one.prompt_tokens + one.completion_tokens,
        "{one:?} {two:?}"
    );
    // The record: one `usage` entry per call, as reported (not estimated), priced.
    let rows = all_rows(&alice, &id).await;
    let usage: Vec<&Value> = rows.iter().filter(|r| r["kind"] == "usage").collect();
    assert_eq!(usage.len(), 2, "{usage:#?}");
    for (row, log) in usage.iter().zip([one, two]) {
        let data = &row["data"];
        assert_eq!(data["provider"], "openai");
        assert_eq!(data["model"], llm::MODEL, "the response's model");
        assert_eq!(data["estimated"], false);
        assert_eq!(data["input_tokens"], log.prompt_tokens);
        assert_eq!(data["output_tokens"], log.completion_tokens);
        // $1000 and $3000 per million tokens: a token costs 1000 and 3000 millionths.
        assert_eq!(
            data["cost"],
            json!({"micro_usd": log.prompt_tokens * 1000 + log.completion_tokens * 3000, "prices": "test-1"})
        );
    }
    // The API rolls the record up; the ledger (admins, per day) holds the same.
    let tokens =
        one.prompt_tokens + one.completion_tokens + two.prompt_tokens + two.completion_tokens;
    let cost = (one.prompt_tokens + two.prompt_tokens) * 1000
        + (one.completion_tokens + two.completion_tokens) * 3000;
    let api = alice
        .get(&format!("/v1/conversations/{id}/usage"))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let total = &api["total"];
    assert_eq!(
        (total["turns"].as_u64(), total["calls"].as_u64()),
        (Some(2), Some(2)),
        "{api:#}"
    );
    assert_eq!(
        total["input_tokens"].as_u64().unwrap() + total["output_tokens"].as_u64().unwrap(),
        tokens
    );
    assert_eq!(total["cost_micro_usd"].as_u64(), Some(cost));
    assert_eq!(api["estimated_calls"], 0);
    assert_eq!(api["last_input_tokens"].as_u64(), Some(two.prompt_tokens));
    assert_eq!(api["by_model"][0]["model"], llm::MODEL);
    let admin = server.client(turnpike_tests::edge::ADMIN);
    // The ledger counts a turn just after its commit (the tenant's day, then the app's).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let ledger = loop {
        let ledger = admin
            .get("/v1/usage?app=local")
            .await
            .unwrap()
            .into_ok()
            .unwrap();
        if ledger["total"]["turns"] == 2 || std::time::Instant::now() > deadline {
            break ledger;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(ledger["total"]["turns"], 2, "{ledger:#}");
    assert_eq!(
        ledger["total"]["input_tokens"].as_u64().unwrap()
            + ledger["total"]["output_tokens"].as_u64().unwrap(),
        tokens
    );
    assert_eq!(ledger["total"]["cost_micro_usd"].as_u64(), Some(cost));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_mid_stream_cancels_the_request_and_the_turn() {
    let model = llm::shared();
    let apps = apps(&model.url(), &model.url());
    let server = serve(apps.path());
    let alice = server.client(ALICE);
    let id = create(&alice, "chat").await;
    let disconnects_before = model.log().matches("Disconnected from client").count();

    let mut stream = alice.stream(&id).await.unwrap();
    say(
        &alice,
        &id,
        "Write a very long story about a dragon who learns to cook. Use at least two thousand words.",
    )
    .await;
    let deadline = Instant::now() + LONG;
    loop {
        assert!(Instant::now() < deadline, "no delta arrived");
        if let Some(Frame::Delta { .. }) = stream.next_within(Duration::from_secs(5)).await {
            break;
        }
    }
    let stopped = alice
        .post(
            &format!("/v1/conversations/{id}/stop"),
            &json!({"reason": "enough"}),
        )
        .await
        .unwrap();
    assert_eq!(stopped.status, 202, "{:?}", stopped.body);
    let turns = wait_for_complete_turns(&alice, &id, 1, LONG).await.unwrap();
    assert_eq!(turns[0].outcome.as_deref(), Some("cancelled"), "{turns:#?}");
    // The HTTP request was dropped: the server saw its client go and stopped generating.
    let deadline = Instant::now() + LONG;
    while model.log().matches("Disconnected from client").count() <= disconnects_before {
        assert!(
            Instant::now() < deadline,
            "the server never saw the request cancelled:\n{}",
            model.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_tool_call_runs_the_real_tool_path_and_a_bad_argument_is_refused_visibly() {
    let model = llm::shared();
    let apps = apps(&model.url(), &model.url());
    let server = serve(apps.path());
    let alice = server.client(ALICE);
    let id = create(&alice, "reader").await;
    say(
        &alice,
        &id,
        "Read the file at the absolute path /etc/passwd and tell me what it says.",
    )
    .await;
    let turns = wait_for_complete_turns(&alice, &id, 1, LONG).await.unwrap();
    let rows = all_rows(&alice, &id).await;
    assert_eq!(turns[0].outcome.as_deref(), Some("replied"), "{rows:#?}");
    assert_eq!(turns[0].replies.len(), 1, "{turns:#?}");
    assert!(!turns[0].replies[0].trim().is_empty());

    let log = turn_log(&server, &id, 1).await;
    // The first round was made to call read_file; every call got a result.
    let calls: Vec<(&String, &Value)> = log
        .blocks
        .iter()
        .filter_map(|b| match b {
            Block::ToolCall {
                call_id,
                tool,
                arguments,
            } => {
                assert_eq!(tool, "read_file");
                Some((call_id, arguments))
            }
            _ => None,
        })
        .collect();
    assert!(
        !calls.is_empty(),
        "the forced tool was not called: {log:#?}"
    );
    let (first_id, first_args) = calls[0];
    let path = first_args["path"].as_str().unwrap_or_default();
    let (ok, output, at) = log
        .blocks
        .iter()
        .enumerate()
        .find_map(|(i, b)| match b {
            Block::ToolResult {
                call_id,
                ok,
                output,
            } if call_id == first_id => Some((*ok, output.clone(), i)),
            _ => None,
        })
        .expect("the call has a result");
    // Nothing outside the workspace is read: an absolute path or `..` is refused with a
    // message that says so (the tiny model, asked for /etc/passwd, writes exactly that).
    assert!(
        path.starts_with('/') || path.split('/').any(|s| s == ".."),
        "the model wrote {path:?}: this test wants a path outside the workspace"
    );
    assert!(!ok, "{output}");
    let error = output["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(path) && error.contains("not allowed"),
        "{error}"
    );
    assert!(!output.to_string().contains("root:"), "{output}");
    // The model saw the refusal: a later round (or the closing call) answered after it.
    assert!(
        log.blocks[at + 1..]
            .iter()
            .any(|b| matches!(b, Block::AssistantMessage { .. })),
        "{log:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_model_forced_to_an_mcp_tool_calls_it_and_gets_the_server_s_answer() {
    let model = llm::shared();
    let apps = apps(&model.url(), &model.url());
    let server = serve(apps.path());
    let alice = server.client(ALICE);
    let id = create(&alice, "timekeeper").await;
    say(&alice, &id, "What time is it in UTC?").await;
    let turns = wait_for_complete_turns(&alice, &id, 1, LONG).await.unwrap();
    let log = turn_log(&server, &id, 1).await;
    let rows = all_rows(&alice, &id).await;
    assert_eq!(turns[0].outcome.as_deref(), Some("replied"), "{rows:#?}");
    let call = log
        .blocks
        .iter()
        .find_map(|b| match b {
            Block::ToolCall { call_id, tool, .. } => Some((call_id.clone(), tool.clone())),
            _ => None,
        })
        .expect("the forced MCP tool was not called");
    assert_eq!(call.1, "time__get_current_time");
    // The server answered (the time, or why the model's arguments were wrong): a result the
    // sandboxed server made, not a refusal of the runtime.
    let output = log
        .blocks
        .iter()
        .find_map(|b| match b {
            Block::ToolResult {
                call_id, output, ..
            } if *call_id == call.0 => Some(output.clone()),
            _ => None,
        })
        .expect("the call has a result");
    let text = output.to_string();
    assert!(
        !text.contains("no tool named") && !text.contains("MCP server \\\"time\\\": "),
        "{text}"
    );
    assert!(
        output.get("content").is_some() || output.get("error").is_some(),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_too_small_for_the_history_still_gets_a_request_the_server_accepts() {
    // Its own server, with a context as small as the agent's: a request that did not fit
    // would be refused by the server, and the turn would fail.
    let small = LlamaServer::start_with_context(TINY_CONTEXT).unwrap();
    let model = llm::shared();
    let apps = apps(&model.url(), &small.url());
    let server = serve(apps.path());
    let alice = server.client(ALICE);
    let id = create(&alice, "tiny").await;
    let filler = "The harbour town kept its old lighthouse, its fish market and its long stone pier, and every summer the festival filled the square with music. ".repeat(3);
    for turn in 1..=6 {
        say(
            &alice,
            &id,
            &format!("Note {turn}: {filler} Reply with one word."),
        )
        .await;
        let turns = wait_for_complete_turns(&alice, &id, turn, LONG)
            .await
            .unwrap();
        let last = turns.last().unwrap();
        assert_eq!(last.outcome.as_deref(), Some("replied"), "{turns:#?}");
    }
    // Six notes do not fit in 512 tokens: the requests were trimmed or compacted, and each
    // fitted the server's context.
    let total_notes = 6 * (filler.len() as u64 / 4);
    let _ = &server;
    assert!(total_notes > u64::from(TINY_CONTEXT), "the notes would fit");
    let log = small.log();
    assert!(
        !log.contains("exceed context window"),
        "the server refused a request:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_benchmark_runs_against_the_real_server() {
    let model = llm::shared();
    let data = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(binary())
        .args(["--data-dir", &data.path().to_string_lossy()])
        .args([
            "bench",
            "model",
            "--url",
            &model.url(),
            "--samples",
            "2",
            "--turns",
            "1",
        ])
        .env("TURNPIKE_EMBEDDING_MODEL", "/nonexistent-model")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("added by Turnpike"), "{stdout}");
    // The tool-using turn was made to call write_file first: at least two model calls.
    let turn = stdout
        .lines()
        .find(|l| l.starts_with("tool-using turn 1:"))
        .unwrap_or_else(|| panic!("{stdout}"));
    let calls: usize = turn
        .split_whitespace()
        .nth(3)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{turn}"));
    assert!(calls >= 2, "{turn}");
}
