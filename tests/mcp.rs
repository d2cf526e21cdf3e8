//! Tools from MCP servers: real servers from PyPI (`mcp-server-time`, `mcp-server-git`) over
//! stdio, sandboxed in a cell over the turn's workspace; a streamable-HTTP server written with
//! the `mcp` package (`tests/mcp/ledger_server.py`); and a server that misbehaves on purpose
//! (`tests/mcp/bad_server.py`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use turnpike_schemas::entry::TurnOutcome;
use turnpike_schemas::{Block, EntryBody, EventBody, RequestId};
use turnpike_tests::services::{free_port, Service};
use turnpike_tests::turns::{replies, Rig, RigOptions, LONG};

/// The venv `scripts/services install tests` makes for the MCP servers (the system's Python).
fn mcp_venv() -> PathBuf {
    let venv = std::env::var("TURNPIKE_MCP_VENV")
        .unwrap_or_else(|_| "/var/tmp/turnpike-services/mcp-venv".into());
    let venv = PathBuf::from(venv);
    assert!(
        venv.join("bin/mcp-server-git").is_file(),
        "no MCP servers at {}: run `scripts/services install tests`",
        venv.display()
    );
    venv
}

/// This test suite's own servers (`tests/mcp`).
fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp")
}

/// The results of a turn's tool calls, by tool name, in order.
fn results(log: &turnpike_schemas::TurnLog) -> Vec<(String, bool, Value)> {
    let names: std::collections::HashMap<&str, &str> = log
        .blocks
        .iter()
        .filter_map(|b| match b {
            Block::ToolCall { call_id, tool, .. } => Some((call_id.as_str(), tool.as_str())),
            _ => None,
        })
        .collect();
    log.blocks
        .iter()
        .filter_map(|b| match b {
            Block::ToolResult {
                call_id,
                output,
                ok,
            } => Some((names[call_id.as_str()].to_owned(), *ok, output.clone())),
            _ => None,
        })
        .collect()
}

/// The record's `error` entries' messages.
async fn errors(rig: &Rig) -> Vec<String> {
    rig.record()
        .entries()
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.body {
            EntryBody::Error(e) => Some(e.message),
            _ => None,
        })
        .collect()
}

/// Every turn of the rig's conversation replays to what was recorded — with no MCP server
/// running.
async fn replays(rig: &Rig, turns: u64) {
    let mut logs = Vec::new();
    for t in 1..=turns {
        logs.push(rig.log(t).await);
    }
    for r in turnpike_agent::replay::replay(&logs, None).await {
        assert_eq!(r.divergence, None, "{}", r.turn);
        assert_eq!(r.outcome, Ok(r.recorded_outcome), "{}", r.turn);
    }
}

const TIME_AND_GIT: &str = r#"
[[turn]]
when = "look"
[[turn.step]]
tool_calls = [{ name = "exec", arguments = { code = "import subprocess as s; open('notes.txt', 'w').write('hello'); [s.run(c, check=True) for c in (['git', 'init', '-q', 'repo'], ['git', '-C', 'repo', '-c', 'user.email=t@example.com', '-c', 'user.name=t', 'commit', '-q', '--allow-empty', '-m', 'the first commit'])]; print('made')" } }]
[[turn.step]]
tool_calls = [
  { name = "time__get_current_time", arguments = { timezone = "UTC" } },
  { name = "git__git_log", arguments = { repo_path = "/work/repo" } },
  { name = "git__git_status", arguments = { repo_path = "OUTSIDE" } },
]
[[turn.step]]
text = "looked"
"#;

#[tokio::test]
async fn an_agent_uses_time_and_git_servers_in_one_turn_and_the_git_server_sees_only_its_workspace()
{
    let venv = mcp_venv();
    // A repository on the host, outside every workspace (under /var/tmp, which the sandbox
    // does not hide behind a private mount): the server must not reach it.
    let outside = tempfile::tempdir_in("/var/tmp").unwrap();
    let repo = outside.path().join("secret-repo");
    for args in [
        vec!["init", "-q", repo.to_str().unwrap()],
        vec![
            "-C",
            repo.to_str().unwrap(),
            "-c",
            "user.email=o@example.com",
            "-c",
            "user.name=o",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "outside",
        ],
    ] {
        assert!(std::process::Command::new("git")
            .args(&args)
            .status()
            .unwrap()
            .success());
    }
    let script = TIME_AND_GIT.replace("OUTSIDE", repo.to_str().unwrap());
    let mut o = RigOptions::new(&script);
    o.cell = true;
    o.tools.push("exec".into());
    let v = venv.display();
    o.manifest_extra = format!(
        "[[agents.helper.mcp]]\nname = \"time\"\ncommand = [\"{v}/bin/mcp-server-time\", \"--local-timezone\", \"UTC\"]\nread_only = [\"{v}\"]\n\n\
         [[agents.helper.mcp]]\nname = \"git\"\ncommand = [\"{v}/bin/mcp-server-git\"]\nread_only = [\"{v}\"]\ntools = [\"git_status\", \"git_log\"]\n"
    );
    let rig = Rig::with(o).await;
    rig.say("look around").await;
    rig.wait_turns(1).await;
    let log = rig.log(1).await;
    assert_eq!(
        log.outcome,
        TurnOutcome::Replied,
        "{:?}",
        errors(&rig).await
    );
    let results = results(&log);
    let names: Vec<&str> = results.iter().map(|(n, ..)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "exec",
            "time__get_current_time",
            "git__git_log",
            "git__git_status"
        ]
    );
    let (_, ok, time) = &results[1];
    assert!(ok, "{time}");
    let time: Value = serde_json::from_str(time["content"].as_str().unwrap()).unwrap();
    assert_eq!(time["timezone"], "UTC");
    assert!(time["datetime"].as_str().unwrap().starts_with("20"));
    // The repository the turn's own code made is the server's to read.
    let (_, ok, history) = &results[2];
    assert!(ok, "{history}");
    assert!(history["content"]
        .as_str()
        .unwrap()
        .contains("the first commit"));
    // The host's repository does not exist for it.
    let (_, ok, status) = &results[3];
    assert!(
        !ok,
        "the server reached a path outside the workspace: {status}"
    );
    assert!(!status.to_string().contains("outside"), "{status}");
    // Read-only tools (the servers mark them so) run without a committed intent.
    let intents: Vec<String> = rig
        .record()
        .entries()
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.body {
            EntryBody::ToolCall(c) if c.side_effects => Some(c.tool),
            _ => None,
        })
        .collect();
    // `exec` changes only the workspace; the servers mark all three tools read-only.
    assert_eq!(
        intents,
        Vec::<String>::new(),
        "a read-only tool had an intent"
    );
    replays(&rig, 1).await;
    rig.stop().await;
}

/// The ledger server, started on a free port, its ledger and hold files in `dir`.
struct Ledger {
    _service: Service,
    url: String,
    ledger: PathBuf,
    hold: PathBuf,
}

impl Ledger {
    fn start(dir: &Path) -> Ledger {
        Self::start_with(dir, None)
    }

    /// A ledger that takes only the bearer tokens of `tokens` (token → user).
    fn start_with(dir: &Path, tokens: Option<&Value>) -> Ledger {
        let venv = mcp_venv();
        let port = free_port().unwrap();
        let (ledger, hold) = (dir.join("ledger.jsonl"), dir.join("hold"));
        let mut args = vec![
            fixtures().join("ledger_server.py").display().to_string(),
            port.to_string(),
            ledger.display().to_string(),
            hold.display().to_string(),
        ];
        args.extend(tokens.map(Value::to_string));
        let service = Service::start_logging(
            venv.join("bin/python").to_str().unwrap(),
            &args,
            ([127, 0, 0, 1], port).into(),
            LONG,
            "TERM",
            Some(&dir.join("server.log")),
        )
        .unwrap();
        Ledger {
            _service: service,
            url: format!("http://127.0.0.1:{port}/mcp"),
            ledger,
            hold,
        }
    }

    /// The calls the server started: (to, idempotency key).
    fn calls(&self) -> Vec<(String, String)> {
        std::fs::read_to_string(&self.ledger)
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                (
                    v["to"].as_str().unwrap().to_owned(),
                    v["key"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    /// Who each call was from, by the token it carried (`None`: no known token).
    fn users(&self) -> Vec<Option<String>> {
        std::fs::read_to_string(&self.ledger)
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                v["user"].as_str().map(str::to_owned)
            })
            .collect()
    }

    fn manifest(&self, extra: &str) -> String {
        format!(
            "[[agents.helper.mcp]]\nname = \"ledger\"\nurl = \"{}\"\n{extra}\n",
            self.url
        )
    }
}

const SEND: &str = r#"
[[turn]]
when = "send"
[[turn.step]]
tool_calls = [{ name = "ledger__send", arguments = { to = "ana" } }]
[[turn.step]]
text = "after send: {last_tool}"

[[turn]]
[[turn.step]]
text = "said: {last_user} / {last_tool}"
"#;

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + LONG;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_side_effecting_call_cut_by_a_crash_is_quarantined_and_the_server_saw_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = Ledger::start(dir.path());
    std::fs::write(&server.hold, "").unwrap();
    let mut o = RigOptions::new(SEND);
    o.manifest_extra = server.manifest("");
    o.lease_ttl = Duration::from_millis(900);
    let mut rig = Rig::with(o).await;
    rig.say("send it").await;
    wait_until("the call never reached the server", || {
        server.calls().len() == 1
    })
    .await;
    // The worker dies mid-call, and nothing more is said: no later event rescues the turn.
    rig.crash().await;
    std::fs::remove_file(&server.hold).unwrap();
    rig.run();
    let ambiguous = rig.wait_ambiguous().await;
    assert_eq!(ambiguous.tool, "ledger__send");
    let calls = server.calls();
    assert_eq!(calls.len(), 1, "the call ran again: {calls:?}");
    // The call carried a key that names it (conversation, turn, call): 64 hex digits.
    assert_eq!(calls[0].1.len(), 64, "{calls:?}");
    // The conversation goes on.
    rig.say("hello").await;
    rig.wait_turns(2).await;
    assert_eq!(rig.log(2).await.outcome, TurnOutcome::Replied);
    assert_eq!(server.calls().len(), 1);
    rig.stop().await;
}

#[tokio::test]
async fn a_gated_mcp_call_parks_runs_once_approved_and_a_denial_reaches_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let server = Ledger::start(dir.path());
    let mut o = RigOptions::new(SEND);
    o.agent_extra = "approval = [{ tool = \"ledger__send\" }]".into();
    o.manifest_extra = server.manifest("");
    let rig = Rig::with(o).await;
    rig.say("send it").await;
    rig.wait_turns(1).await;
    let log = rig.log(1).await;
    assert_eq!(log.outcome, TurnOutcome::Parked);
    let request = log
        .blocks
        .iter()
        .find_map(|b| match b {
            Block::ApprovalRequest {
                request_id, tool, ..
            } => Some((*request_id, tool.clone())),
            _ => None,
        })
        .expect("an approval request");
    assert_eq!(request.1, "ledger__send");
    assert!(server.calls().is_empty(), "ran before it was approved");
    rig.send(answer(request.0, true)).await;
    rig.wait_turns(2).await;
    assert_eq!(server.calls().len(), 1);
    let approved = replies(&rig.log(2).await).join(" ");
    assert!(approved.contains("sent to ana"), "{approved}");
    // Once more, denied: the agent hears it, the server never does.
    rig.say("send it").await;
    rig.wait_turns(3).await;
    let log = rig.log(3).await;
    let request = log
        .blocks
        .iter()
        .find_map(|b| match b {
            Block::ApprovalRequest { request_id, .. } => Some(*request_id),
            _ => None,
        })
        .unwrap();
    rig.send(answer(request, false)).await;
    rig.wait_turns(4).await;
    let denied = replies(&rig.log(4).await).join(" ");
    assert!(denied.contains("denied"), "{denied}");
    assert_eq!(server.calls().len(), 1, "a denied call ran");
    drop(server);
    replays(&rig, 4).await;
    rig.stop().await;
}

fn answer(request_id: RequestId, approve: bool) -> EventBody {
    EventBody::ApprovalResponse {
        request_id,
        approve,
        reason: (!approve).then(|| "not now".into()),
        tool: None,
        arguments: None,
    }
}

const BAD_CALL: &str = r#"
[[turn]]
when = "call"
[[turn.step]]
tool_calls = [{ name = "bad__echo", arguments = { text = "hi" } }]
[[turn.step]]
text = "went on: {last_tool}"

[[turn]]
[[turn.step]]
text = "said: {last_user}"
"#;

/// A rig whose agent has the bad server in `mode`, with a call timeout of two seconds; the
/// server's script is copied to `dir` (a sandbox cannot be given paths under `/work`, where
/// this repository may be, nor under `/tmp`; the rig grants `/var/tmp`).
async fn bad_rig(dir: &Path, mode: &str) -> Rig {
    let python = "/usr/bin/python3";
    let script = dir.join("bad_server.py");
    std::fs::copy(fixtures().join("bad_server.py"), &script).unwrap();
    // The sandboxed server runs as a uid of its own: it must be able to read the script.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut o = RigOptions::new(BAD_CALL);
    o.cell = true;
    o.manifest_extra = format!(
        "[[agents.helper.mcp]]\nname = \"bad\"\ncommand = [\"{python}\", \"{}\", \"{mode}\"]\nread_only = [\"{}\"]\ntimeout_secs = 2\nstart_timeout_secs = 3\n",
        script.display(),
        dir.display()
    );
    Rig::with(o).await
}

#[tokio::test]
async fn a_server_that_misbehaves_on_a_call_is_a_clear_error_and_the_turn_goes_on() {
    for (mode, reason) in [
        ("fine", "echo: hi"),
        ("crash", "the call failed: Transport closed"),
        ("hang", "no answer within 2s"),
        // Lines that are not JSON-RPC, or one over the 4 MiB cap, are dropped: no answer comes.
        ("garbage", "no answer within 2s"),
        ("flood", "no answer within 2s"),
    ] {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let rig = bad_rig(dir.path(), mode).await;
        rig.say("call it").await;
        rig.wait_turns(1).await;
        let log = rig.log(1).await;
        assert_eq!(log.outcome, TurnOutcome::Replied, "{mode}");
        let results = results(&log);
        let (_, ok, output) = &results[0];
        let fine = mode == "fine";
        assert_eq!(*ok, fine, "{mode}: {output}");
        assert!(output.to_string().contains(reason), "{mode}: {output}");
        if !fine {
            assert!(
                output["error"]
                    .as_str()
                    .unwrap()
                    .starts_with("MCP server \"bad\": "),
                "{mode}: {output}"
            );
        }
        // The conversation goes on.
        rig.say("next").await;
        rig.wait_turns(2).await;
        assert_eq!(replies(&rig.log(2).await), ["said: next"], "{mode}");
        rig.stop().await;
    }
}

#[tokio::test]
async fn a_server_that_cannot_start_fails_the_turn_with_its_reason() {
    for (mode, reason) in [
        ("exit", "cannot open its configuration"),
        ("silent", "did not answer within 3s"),
        ("many", "lists more than 256 tools (300 so far)"),
        ("twice", "lists the tool \"echo\" twice"),
    ] {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let rig = bad_rig(dir.path(), mode).await;
        rig.say("call it").await;
        rig.wait_turns(1).await;
        assert_eq!(rig.log(1).await.outcome, TurnOutcome::Failed, "{mode}");
        let errors = errors(&rig).await;
        assert!(
            errors
                .iter()
                .any(|e| e.contains("MCP server \"bad\"") && e.contains(reason)),
            "{mode}: {errors:?}"
        );
        rig.stop().await;
    }
}

#[tokio::test]
async fn a_manifest_names_mcp_tools_in_gates_and_tool_choice_and_refuses_bad_servers() {
    use turnpike_agent::apps::Manifest;
    let registry = turnpike_worker::tools::Registry::builtin();
    let base = Path::new("/");
    let ok = Manifest::parse(
        "app = \"a\"\n[agents.x]\nprovider = \"echo\"\ntool_choice = \"git__git_status\"\napproval = [{ tool = \"git__git_commit\" }]\n[[agents.x.mcp]]\nname = \"git\"\ncommand = [\"/bin/true\"]\n",
        base,
        &registry,
    )
    .unwrap();
    assert_eq!(ok.agents.values().next().unwrap().mcp[0].name, "git");
    for (text, why) in [
        ("[[agents.x.mcp]]\nname = \"git\"\ncommand = [\"/bin/true\"]\n[[agents.x.mcp]]\nname = \"git\"\nurl = \"http://a/\"\n", "named twice"),
        ("approval = [{ tool = \"hg__status\" }]\n", "unknown tool"),
        // A gate on a tool the server's allowlist leaves out names nothing the agent may call.
        ("approval = [{ tool = \"git__git_commit\" }]\n[[agents.x.mcp]]\nname = \"git\"\ncommand = [\"/bin/true\"]\ntools = [\"git_status\"]\n", "unknown tool"),
        ("[[agents.x.mcp]]\nname = \"git\"\n", "agents.x.mcp[0].needs either"),
    ] {
        let text = format!("app = \"a\"\n[agents.x]\nprovider = \"echo\"\n{text}");
        let e = Manifest::parse(&text, base, &registry).err().unwrap();
        assert!(e.contains(why), "{e}");
    }
}

/// A remote app that asks for one MCP tool call and ends its turn: one HTTP request, its
/// actions as NDJSON (the worker answers the call on the exchange's `/messages`, which this
/// app does not need).
async fn raw_app_calling(tool: &'static str) -> u16 {
    use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut socket = tokio::io::BufReader::new(socket);
                let mut length = 0usize;
                let mut first = String::new();
                loop {
                    let mut line = String::new();
                    if socket.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    if first.is_empty() {
                        first = line.clone();
                    }
                    if line == "\r\n" {
                        break;
                    }
                    if let Some((k, v)) = line.split_once(':') {
                        if k.eq_ignore_ascii_case("content-length") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                    }
                }
                let mut body = vec![0; length];
                let _ = socket.read_exact(&mut body).await;
                if first.contains("/messages") {
                    let _ = socket
                        .write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
                        .await;
                    return;
                }
                let call = serde_json::json!({"type": "tool", "id": "t1", "name": tool, "arguments": {"to": "a remote app"}});
                let actions = format!("{call}\n{{\"type\":\"done\"}}\n");
                let _ = socket
                    .write_all(
                        format!("HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\nconnection: close\r\n\r\n{actions}")
                            .as_bytes(),
                    )
                    .await;
                let mut rest = Vec::new();
                let _ = socket.read_to_end(&mut rest).await;
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_app_calls_an_mcp_tool_with_its_tool_action() {
    use turnpike_tests::edge::{create, say, wait_for_complete_turns, Server, ALICE};
    let dir = tempfile::tempdir().unwrap();
    let server = Ledger::start(dir.path());
    let port = raw_app_calling("ledger__send").await;
    let apps = tempfile::tempdir().unwrap();
    std::fs::write(
        apps.path().join("raw.toml"),
        format!(
            "app = \"raw\"\n[agents.caller]\nprovider = \"echo\"\n[agents.caller.remote]\nurl = \"http://127.0.0.1:{port}\"\n{}",
            server.manifest("").replace("agents.helper", "agents.caller")
        ),
    )
    .unwrap();
    let serve = Server::start(
        Path::new(env!("CARGO_BIN_EXE_turnpike")),
        Some(apps.path()),
        &["--outbound-allow", "127.0.0.1"],
        false,
    )
    .unwrap();
    let alice = serve.client(ALICE);
    let id = create(&alice, "raw", "caller").await;
    say(&alice, &id, "go").await;
    let turns = wait_for_complete_turns(&alice, &id, 1, LONG).await.unwrap();
    assert_eq!(turns[0].outcome.as_deref(), Some("replied"), "{turns:#?}");
    let calls = server.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].0, "a remote app");
}

#[tokio::test]
async fn a_server_is_shown_only_host_paths_the_operator_grants_links_resolved() {
    let venv = mcp_venv();
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    // A link inside the grant (the rig grants /var/tmp) to a place outside it.
    std::os::unix::fs::symlink("/etc", dir.path().join("etc")).unwrap();
    for (path, reason) in [
        (
            "/etc".to_owned(),
            "not under a directory the operator grants",
        ),
        (
            dir.path().join("etc").display().to_string(),
            "not under a directory the operator grants",
        ),
        ("/var/tmp/no-such-dir-here".to_owned(), "No such file"),
    ] {
        let mut o = RigOptions::new(BAD_CALL);
        o.cell = true;
        o.manifest_extra = format!(
            "[[agents.helper.mcp]]\nname = \"time\"\ncommand = [\"{}/bin/mcp-server-time\"]\nread_only = [\"{}\", \"{path}\"]\n",
            venv.display(),
            venv.display()
        );
        let rig = Rig::with(o).await;
        rig.say("call it").await;
        rig.wait_turns(1).await;
        assert_eq!(rig.log(1).await.outcome, TurnOutcome::Failed, "{path}");
        let errors = errors(&rig).await;
        assert!(
            errors.iter().any(|e| e.contains(reason)),
            "{path}: {errors:?}"
        );
        rig.stop().await;
    }
}

const DESK: &str = r#"
app = "desk"

[agents.helper]
provider = "script"
script = "helper.script.toml"

[[agents.helper.mcp]]
name = "ledger"
url = "URL"
connection = true
tools = ["send"]

[agents.gated]
provider = "script"
script = "helper.script.toml"
approval = [{ tool = "ledger__send" }]

[[agents.gated.mcp]]
name = "ledger"
url = "URL"
connection = true
tools = ["send"]
"#;

/// Every file under `dir` whose bytes hold `needle`.
fn files_holding(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() {
                let bytes = std::fs::read(&path).unwrap_or_default();
                if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                    found.push(path);
                }
            }
        }
    }
    found
}

/// Item 4: per-user connections, through the API of `turnpike serve`. The HTTP server takes
/// only known bearer tokens and logs whose each call carried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sender_calls_with_their_own_connection_and_a_missing_one_parks_until_they_connect() {
    use reqwest::Method;
    use serde_json::json;
    use turnpike_tests::edge::{
        apps_with, create, say, wait_for_complete_turns, Server, ALICE, BOB,
    };
    const ALICE_SECRET: &str = "sk-alice-3c9e51f0a7d24b68";
    const BOB_SECRET: &str = "sk-bob-8f2d64ae17c95b03";
    let dir = tempfile::tempdir().unwrap();
    let tokens = json!({ ALICE_SECRET: "alice", BOB_SECRET: "bob" });
    let ledger = Ledger::start_with(dir.path(), Some(&tokens));
    let manifest = DESK.replace("URL", &ledger.url);
    let apps = apps_with(&[("desk.toml", &manifest), ("helper.script.toml", SEND)]);
    // Everything at debug, spans included: the scan below reads it all.
    let mut tp = Server::start_with_env(
        Path::new(env!("CARGO_BIN_EXE_turnpike")),
        Some(apps.path()),
        &["--local-store", "files", "--outbound-allow", "127.0.0.1"],
        false,
        &[("RUST_LOG", "debug".into())],
    )
    .unwrap();
    let (alice, bob) = (tp.client(ALICE), tp.client(BOB));
    let connect = |client: &turnpike_edge::client::Client, token: &str| {
        let (client, body) = (client.clone(), json!({ "token": token }));
        async move {
            client
                .send(
                    Method::PUT,
                    "/v1/connections/desk/ledger",
                    Some(&body),
                    None,
                )
                .await
                .unwrap()
        }
    };

    // Only a server of the app that takes a connection keeps one.
    for path in [
        "/v1/connections/desk/nosuch",
        "/v1/connections/nosuch/ledger",
    ] {
        let refused = alice
            .send(
                Method::PUT,
                path,
                Some(&json!({ "token": ALICE_SECRET })),
                None,
            )
            .await
            .unwrap();
        assert_eq!(refused.status, 404, "{path}: {:?}", refused.body);
    }
    // Alice connects; her turn's call carries her token.
    let made = connect(&alice, ALICE_SECRET).await.into_ok().unwrap();
    assert_eq!(
        (made["app"].as_str(), made["server"].as_str()),
        (Some("desk"), Some("ledger"))
    );
    let listed = alice
        .get("/v1/connections")
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    assert_eq!(
        listed["connections"].as_array().unwrap().len(),
        1,
        "{listed}"
    );
    assert!(!listed.to_string().contains(ALICE_SECRET));
    let theirs = bob.get("/v1/connections").await.unwrap().into_ok().unwrap();
    assert_eq!(
        theirs["connections"],
        json!([]),
        "Bob sees Alice's connection"
    );
    let conv = create(&alice, "desk", "helper").await;
    say(&alice, &conv, "send it").await;
    let turns = wait_for_complete_turns(&alice, &conv, 1, LONG)
        .await
        .unwrap();
    assert_eq!(turns[0].outcome.as_deref(), Some("replied"), "{turns:#?}");
    assert!(
        turns[0].replies.join(" ").contains("sent to ana"),
        "{turns:#?}"
    );
    assert_eq!(ledger.users(), vec![Some("alice".to_owned())]);

    // Alice shares the conversation with Bob, who has no connection: his turn parks on a
    // connection card for him; Alice's token is not used for him.
    let granted = alice
        .post(
            &format!("/v1/conversations/{conv}/grants"),
            &json!({ "identity": "local:bob" }),
        )
        .await
        .unwrap();
    assert!(granted.ok(), "{:?}", granted.body);
    say(&bob, &conv, "send it").await;
    let turns = wait_for_complete_turns(&bob, &conv, 2, LONG).await.unwrap();
    assert_eq!(turns[1].outcome.as_deref(), Some("parked"), "{turns:#?}");
    let pending = bob
        .get(&format!("/v1/conversations/{conv}/pending"))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let card = &pending["approvals"][0];
    assert_eq!(card["connection"], "ledger", "{pending}");
    assert_eq!(card["tool"], "ledger__send", "{pending}");
    assert_eq!(card["approvers"], json!(["local:bob"]), "{pending}");
    assert_eq!(
        ledger.users().len(),
        1,
        "a call ran without Bob's connection"
    );

    // A credential that cannot travel in a header is refused; nothing is stored.
    let bad = connect(&bob, "two words").await;
    assert_eq!(bad.status, 422, "{:?}", bad.body);
    // A credential the server refuses (revoked, say): the resumed call is not run and says
    // why; the next call asks Bob to connect again.
    let made = connect(&bob, "sk-bob-revoked").await.into_ok().unwrap();
    assert_eq!(made["resumed"], json!([conv]), "{made}");
    let turns = wait_for_complete_turns(&bob, &conv, 3, LONG).await.unwrap();
    assert!(
        turns[2]
            .replies
            .join(" ")
            .contains("missing or was refused"),
        "{turns:#?}"
    );
    say(&bob, &conv, "send it").await;
    let turns = wait_for_complete_turns(&bob, &conv, 4, LONG).await.unwrap();
    assert_eq!(turns[3].outcome.as_deref(), Some("parked"), "{turns:#?}");
    assert_eq!(
        ledger.users().len(),
        1,
        "a call ran without Bob's connection"
    );
    // Bob connects: the parked call runs, with his own token, and the turn completes.
    let made = connect(&bob, BOB_SECRET).await.into_ok().unwrap();
    assert_eq!(made["resumed"], json!([conv]), "{made}");
    let turns = wait_for_complete_turns(&bob, &conv, 5, LONG).await.unwrap();
    assert_eq!(turns[4].outcome.as_deref(), Some("replied"), "{turns:#?}");
    assert!(
        turns[4].replies.join(" ").contains("sent to ana"),
        "{turns:#?}"
    );
    assert_eq!(
        ledger.users(),
        vec![Some("alice".to_owned()), Some("bob".to_owned())]
    );
    // A gated call on Bob's connection, in Alice's conversation shared with him: only Bob
    // may approve it (approved, it runs with the approver's credential); Alice's approval is
    // refused and runs nothing.
    let gated = create(&alice, "desk", "gated").await;
    let granted = alice
        .post(
            &format!("/v1/conversations/{gated}/grants"),
            &json!({ "identity": "local:bob" }),
        )
        .await
        .unwrap();
    assert!(granted.ok(), "{:?}", granted.body);
    say(&bob, &gated, "send it").await;
    let turns = wait_for_complete_turns(&bob, &gated, 1, LONG)
        .await
        .unwrap();
    assert_eq!(turns[0].outcome.as_deref(), Some("parked"), "{turns:#?}");
    let pending = bob
        .get(&format!("/v1/conversations/{gated}/pending"))
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let card = pending["approvals"][0].clone();
    assert_eq!(card["approvers"], json!(["local:bob"]), "{pending}");
    assert!(card.get("connection").is_none(), "{pending}");
    let request = card["request_id"].as_str().unwrap().to_owned();
    let approve = |client: &turnpike_edge::client::Client| {
        let (client, path) = (
            client.clone(),
            format!("/v1/conversations/{gated}/approvals/{request}/approve"),
        );
        async move {
            let sent = client.post(&path, &json!({})).await.unwrap();
            assert_eq!(sent.status, 202, "{:?}", sent.body);
        }
    };
    let calls = ledger.users().len();
    approve(&alice).await;
    wait_for_complete_turns(&bob, &gated, 2, LONG)
        .await
        .unwrap();
    assert_eq!(
        ledger.users().len(),
        calls,
        "Alice's approval ran Bob's call"
    );
    approve(&bob).await;
    let turns = wait_for_complete_turns(&bob, &gated, 3, LONG)
        .await
        .unwrap();
    assert!(
        turns[2].replies.join(" ").contains("sent to ana"),
        "{turns:#?}"
    );
    assert_eq!(ledger.users().last().unwrap().as_deref(), Some("bob"));
    // Connecting again resumes nothing more.
    let again = connect(&bob, BOB_SECRET).await.into_ok().unwrap();
    assert!(again.get("resumed").is_none(), "{again}");

    // Disconnected: gone for Bob, Alice's untouched.
    let gone = bob.delete("/v1/connections/desk/ledger").await.unwrap();
    assert_eq!(gone.status, 204);
    assert_eq!(
        bob.get("/v1/connections/desk/ledger").await.unwrap().status,
        404
    );
    assert_eq!(
        alice
            .get("/v1/connections/desk/ledger")
            .await
            .unwrap()
            .status,
        200
    );

    // The credentials appear in no object of the store, no log line and no span.
    for secret in [ALICE_SECRET, BOB_SECRET] {
        assert_eq!(files_holding(tp.data.path(), secret), Vec::<PathBuf>::new());
        let lines = tp.process.lines();
        assert!(lines.len() > 50, "debug logs were expected: {lines:?}");
        let leaked: Vec<&String> = lines.iter().filter(|l| l.contains(secret)).collect();
        assert!(leaked.is_empty(), "{leaked:?}");
    }
}

/// Invariant 12: a url server at an internal address (here loopback, by address and by a
/// name that resolves there) is not called unless the operator allows that address; the
/// server hears nothing, and the turn fails saying why and how to allow it.
#[tokio::test]
async fn a_url_server_at_an_internal_address_is_refused_unless_the_operator_allows_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = Ledger::start(dir.path());
    let by_name = server.url.replace("127.0.0.1", "localhost");
    for (url, allow) in [
        (server.url.clone(), vec![]),
        (by_name.clone(), vec![]),
        // Allowing another internal range does not let loopback through.
        (server.url.clone(), vec!["10.0.0.0/8".to_owned()]),
    ] {
        let mut o = RigOptions::new(SEND);
        o.manifest_extra = format!("[[agents.helper.mcp]]\nname = \"ledger\"\nurl = \"{url}\"\n");
        o.outbound_allow = allow;
        let rig = Rig::with(o).await;
        rig.say("send it").await;
        rig.wait_turns(1).await;
        assert_eq!(rig.log(1).await.outcome, TurnOutcome::Failed, "{url}");
        let errors = errors(&rig).await;
        assert!(
            errors.iter().any(|e| e.contains("MCP server \"ledger\"")
                && e.contains("an internal address")
                && e.contains("--outbound-allow")),
            "{url}: {errors:?}"
        );
        rig.stop().await;
    }
    assert!(server.calls().is_empty(), "{:?}", server.calls());
    // Allowed by the operator (as the other tests' rigs are): called.
    let mut o = RigOptions::new(SEND);
    o.manifest_extra = format!("[[agents.helper.mcp]]\nname = \"ledger\"\nurl = \"{by_name}\"\n");
    o.outbound_allow = vec!["localhost".into()];
    let rig = Rig::with(o).await;
    rig.say("send it").await;
    rig.wait_turns(1).await;
    assert_eq!(rig.log(1).await.outcome, TurnOutcome::Replied);
    assert_eq!(server.calls().len(), 1);
    rig.stop().await;
}
