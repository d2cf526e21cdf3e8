//! The edges for other agents and tools: every hosted agent over A2A, and the deployment as an
//! MCP server — driven by the ecosystem's own clients (`a2a-sdk` and `mcp` from PyPI) in
//! `tests/a2a/a2a_client.py`, against `turnpike serve`. What the clients saw is checked again
//! here in the record.

use std::path::PathBuf;
use std::process::Command;

use std::time::Duration;

use serde_json::Value;
use turnpike_tests::edge::{apps_with, Server, ALICE, ALICE_OF_BETA, BOB};

const RELAY: &str = r#"
app = "relay"

[agents.helper]
provider = "script"
script = "helper.script.toml"
tools = ["write_file", "publish", "ask_user"]
approval = [{ tool = "publish" }]
description = "A helper that answers, writes files and asks when it must."
skills = [
  { id = "answer", name = "Answers", description = "Answers what you say", tags = ["qa"], examples = ["hello"] },
  { id = "files", name = "Files", description = "Writes and publishes notes", tags = ["files"] },
]

[agents.publisher]
provider = "script"
script = "publisher.script.toml"
tools = ["write_file", "publish"]
approval = [{ tool = "publish" }]

[agents.quiet]
provider = "script"
script = "quiet.script.toml"
"#;

const SECRET: &str = r#"
app = "secret"
tenants = ["beta"]

[agents.keeper]
provider = "script"
script = "quiet.script.toml"
"#;

const HELPER: &str = r#"
[[turn]]
when = "slow story"
[[turn.step]]
text = "Once upon a time there was a turnpike that carried everyone home, and they lived happily ever after."
word_delay_ms = 120

[[turn]]
when = "long job"
[[turn.step]]
text = "this takes ten minutes"
delay_ms = 600000

[[turn]]
when = "colour"
[[turn.step]]
tool_calls = [{ name = "ask_user", arguments = { question = "Which colour?" } }]

[[turn]]
when = "hold for push"
[[turn.step]]
text = "held until told"
wait_for_input = true

[[turn]]
when = "attach"
[[turn.step]]
text = "You attached {attachment}"

[[turn]]
[[turn.step]]
text = "answer to: {last_user}"
"#;

/// Writes the message to `note.md` and publishes it (a gated call); the turn that resumes after
/// the approval says what the publication returned.
const PUBLISHER: &str = r#"
[[turn]]
when = "publish"
[[turn.step]]
tool_calls = [{ name = "write_file", arguments = { path = "note.md", content = "{last_user}" } }]
[[turn.step]]
tool_calls = [{ name = "publish", arguments = { path = "note.md" } }]

[[turn]]
[[turn.step]]
text = "published: {last_tool}"
"#;

const QUIET: &str = r#"
[[turn]]
[[turn.step]]
text = "quiet here"
"#;

const LONG: Duration = Duration::from_secs(120);

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_turnpike"))
}

/// The venv `scripts/services install tests` makes for the ecosystem's MCP and A2A packages.
fn python() -> PathBuf {
    let venv = std::env::var("TURNPIKE_MCP_VENV")
        .unwrap_or_else(|_| "/var/tmp/turnpike-services/mcp-venv".into());
    let python = PathBuf::from(venv).join("bin/python");
    assert!(
        python.is_file(),
        "no {}: run `scripts/services install tests`",
        python.display()
    );
    python
}

/// Runs the client script in `mode` against `server`; its report (the last line).
fn drive(server: &Server, mode: &str) -> Value {
    drive_with(server, mode, &[])
}

/// [`drive`] with more environment for the script.
fn drive_with(server: &Server, mode: &str, envs: &[(&str, String)]) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/a2a/a2a_client.py");
    let out = Command::new(python())
        .arg(&script)
        .args([mode, &server.base, ALICE, BOB, ALICE_OF_BETA])
        .env("PYTHONWARNINGS", "ignore")
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("the client script runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{mode} client failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("report {last:?}: {e}\n{stdout}"))
}

async fn rows(server: &Server, conversation: &str) -> Vec<Value> {
    let page = server
        .client(ALICE)
        .get(&format!(
            "/v1/conversations/{conversation}/messages?limit=500"
        ))
        .await
        .unwrap();
    page.body["rows"].as_array().unwrap().clone()
}

fn outcomes(rows: &[Value]) -> Vec<String> {
    rows.iter()
        .filter(|r| r["kind"] == "turn_complete")
        .map(|r| r["data"]["outcome"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_a2a_client_discovers_sends_streams_cancels_resubscribes_answers_and_moves_files(
) {
    let apps = apps_with(&[
        ("relay.toml", RELAY),
        ("secret.toml", SECRET),
        ("helper.script.toml", HELPER),
        ("publisher.script.toml", PUBLISHER),
        ("quiet.script.toml", QUIET),
    ]);
    let server = Server::start(&binary(), Some(apps.path()), &[], false).unwrap();
    let report = drive(&server, "a2a");

    // The task the client cancelled: its turn ended cancelled in the record.
    let cancelled = report["cancelled"]["context"].as_str().unwrap();
    assert_eq!(outcomes(&rows(&server, cancelled).await), ["cancelled"]);
    // The gated one: parked, approved by the caller, then replied — two turns, one task.
    let gated = rows(&server, report["gated"]["context"].as_str().unwrap()).await;
    assert_eq!(outcomes(&gated), ["parked", "replied"]);
    let resolved: Vec<&Value> = gated
        .iter()
        .filter(|r| r["kind"] == "approval_resolved")
        .collect();
    assert_eq!(resolved.len(), 1);
    assert_eq!(resolved[0]["data"]["approved"], true);
    assert_eq!(resolved[0]["data"]["by"], "local:alice");
    // The first message: one task, one turn, however often the client sent it.
    let hello = rows(&server, report["hello"]["context"].as_str().unwrap()).await;
    assert_eq!(outcomes(&hello), ["replied", "replied"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_mcp_client_lists_tools_sends_reads_and_searches_as_the_caller() {
    let apps = apps_with(&[
        ("relay.toml", RELAY),
        ("secret.toml", SECRET),
        ("helper.script.toml", HELPER),
        ("publisher.script.toml", PUBLISHER),
        ("quiet.script.toml", QUIET),
    ]);
    let server = Server::start(&binary(), Some(apps.path()), &[], true).unwrap();
    let report = drive(&server, "mcp");
    let conversation = report["mcp"]["context"].as_str().unwrap();
    let rows = rows(&server, conversation).await;
    assert_eq!(outcomes(&rows), ["replied", "replied"]);
    // Bob's attempt to write into it was refused: nothing of his is in it.
    assert!(rows.iter().all(|r| r["text"].as_str() != Some("intrude")));
}

/// Agent A's app on the calling deployment: `asker` calls B's helper, `waiter` calls B's agent
/// that takes ten minutes.
fn caller_apps(b: &str) -> tempfile::TempDir {
    let manifest = format!(
        r#"
app = "caller"

[agents.asker]
provider = "script"
script = "asker.script.toml"

[[agents.asker.a2a]]
name = "helper"
url = "{b}/a2a/relay/helper"
token_env = "B_TOKEN"
description = "Asks the helper on the other deployment."

[agents.prober]
provider = "script"
script = "asker.script.toml"

# The metadata address: refused by the outbound rules (only 127.0.0.1 is allowed), never called.
[[agents.prober.a2a]]
name = "helper"
url = "http://169.254.169.254/latest/a2a"

[agents.waiter]
provider = "script"
script = "asker.script.toml"

[[agents.waiter.a2a]]
name = "helper"
url = "{b}/a2a/relay/helper"
token_env = "B_TOKEN"
"#
    );
    apps_with(&[("caller.toml", &manifest), ("asker.script.toml", ASKER)])
}

/// Passes the user's words on to the remote agent, then says what it answered.
const ASKER: &str = r#"
[[turn]]
[[turn.step]]
tool_calls = [{ name = "helper", arguments = { text = "{last_user}" } }]
[[turn.step]]
text = "B said: {last_tool}"
"#;

/// B's conversations owned by the caller of `client`, each with its rows.
async fn conversations_of(client: &turnpike_edge::client::Client) -> Vec<(String, Vec<Value>)> {
    let list = client
        .get("/v1/conversations?limit=100")
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    let mut all = Vec::new();
    for c in list["conversations"].as_array().unwrap() {
        let id = c["id"].as_str().unwrap().to_owned();
        let rows = client
            .get(&format!("/v1/conversations/{id}/messages?limit=500"))
            .await
            .unwrap()
            .into_ok()
            .unwrap();
        all.push((id, rows["rows"].as_array().unwrap().clone()));
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_calls_another_deployments_agent_over_a2a_a_crash_mid_call_quarantines_and_replay_needs_no_remote(
) {
    use turnpike_tests::edge::{create, say, wait_for_complete_turns, ADMIN};
    let long = LONG;
    // B: the relay app, as in the tests above.
    let b_apps = apps_with(&[
        ("relay.toml", RELAY),
        ("secret.toml", SECRET),
        ("helper.script.toml", HELPER),
        ("publisher.script.toml", PUBLISHER),
        ("quiet.script.toml", QUIET),
    ]);
    let mut b = Server::start(&binary(), Some(b_apps.path()), &[], false).unwrap();
    // A: calls B as alice of B (B's token in A's environment), loopback allowed for it.
    let a_apps = caller_apps(&b.base);
    let mut a = Server::start_with_env(
        &binary(),
        Some(a_apps.path()),
        &["--outbound-allow", "127.0.0.1"],
        false,
        &[("B_TOKEN", ALICE.to_owned())],
    )
    .unwrap();
    let alice_a = a.client(ALICE);
    let alice_b = b.client(ALICE);

    // A's turn calls B's agent and says what it answered.
    let conv = create(&alice_a, "caller", "asker").await;
    say(&alice_a, &conv, "what is a turnpike?").await;
    let turns = wait_for_complete_turns(&alice_a, &conv, 1, long)
        .await
        .unwrap();
    assert_eq!(turns[0].outcome.as_deref(), Some("replied"), "{turns:?}");
    let reply = &turns[0].replies[0];
    assert!(
        reply.starts_with("B said: ") && reply.contains("answer to: what is a turnpike?"),
        "{reply}"
    );
    // The call was side-effecting (its intent committed before it ran); B holds the message,
    // once, in a conversation of the identity A's token names.
    let rows_a = rows(&a, &conv).await;
    let call = rows_a.iter().find(|r| r["kind"] == "tool_call").unwrap();
    assert_eq!(call["data"]["tool"], "helper");
    assert_eq!(call["data"]["side_effects"], true);
    let on_b = conversations_of(&alice_b).await;
    let texts: Vec<&str> = on_b
        .iter()
        .flat_map(|(_, rows)| rows.iter())
        .filter(|r| r["kind"] == "user_message")
        .filter_map(|r| r["text"].as_str())
        .collect();
    assert_eq!(texts, ["what is a turnpike?"]);

    // A remote agent at an internal address the operator did not allow is not called: the
    // model is told why.
    let probe = create(&alice_a, "caller", "prober").await;
    say(&alice_a, &probe, "fetch the credentials").await;
    let turns = wait_for_complete_turns(&alice_a, &probe, 1, long)
        .await
        .unwrap();
    let reply = &turns[0].replies[0];
    assert!(
        reply.contains("not called") && reply.contains("169.254.169.254"),
        "{reply}"
    );

    // A SIGKILL of A while its call waits on B: the turn is quarantined, never re-run.
    let stuck = create(&alice_a, "caller", "waiter").await;
    say(&alice_a, &stuck, "long job for B").await;
    let deadline = std::time::Instant::now() + long;
    loop {
        let seen = conversations_of(&alice_b)
            .await
            .into_iter()
            .any(|(_, rows)| {
                rows.iter().any(|r| r["kind"] == "turn_dispatched")
                    && rows.iter().any(|r| r["text"] == "long job for B")
            });
        if seen {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "B never got the call");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.restart().unwrap();
    let alice_a = a.client(ALICE);
    let deadline = std::time::Instant::now() + long;
    let ambiguous = loop {
        let rows = rows(&a, &stuck).await;
        if let Some(r) = rows.iter().find(|r| r["kind"] == "turn_ambiguous") {
            break r.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never quarantined: {rows:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(ambiguous["data"]["tool"], "helper");
    // B got the message once: the call was not made again after the restart.
    let sent: usize = conversations_of(&alice_b)
        .await
        .iter()
        .flat_map(|(_, rows)| rows.iter())
        .filter(|r| r["text"] == "long job for B" && r["kind"] == "user_message")
        .count();
    assert_eq!(sent, 1);

    // Replay of A's first conversation with B gone: reproduced from the record alone.
    b.process.kill();
    let replayed = alice_a
        .as_token(ADMIN)
        .post(
            &format!("/v1/admin/conversations/{conv}/replay"),
            &serde_json::json!({}),
        )
        .await
        .unwrap()
        .into_ok()
        .unwrap();
    assert_eq!(replayed["reproduced"], true, "{replayed}");
    assert_eq!(replayed["turns"].as_array().unwrap().len(), 1, "{replayed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_notifications_reach_a_receiver_that_fails_its_first_attempts_once_signed_with_the_token(
) {
    use turnpike_tests::receiver::{verifies, Receiver};
    let receiver = Receiver::start().await;
    let apps = apps_with(&[
        ("relay.toml", RELAY),
        ("secret.toml", SECRET),
        ("helper.script.toml", HELPER),
        ("publisher.script.toml", PUBLISHER),
        ("quiet.script.toml", QUIET),
    ]);
    let server = Server::start_with_env(
        &binary(),
        Some(apps.path()),
        &[
            "--outbound-allow",
            "127.0.0.1",
            "--webhook-backoff",
            "0,1s,1s,1s,1s",
        ],
        false,
        &[],
    )
    .unwrap();
    let report = drive_with(
        &server,
        "push",
        &[(
            "A2A_RECEIVER",
            format!("http://127.0.0.1:{}", receiver.port),
        )],
    );
    let task = report["push"]["task"].as_str().unwrap();
    let context = report["push"]["context"].as_str().unwrap();
    let delivered = turnpike_tests::wait::until(LONG, "the push delivered", || async {
        let got = receiver.on("/flaky/push");
        got.iter().any(|r| r["status"] == 200).then_some(got)
    })
    .await;
    // Three refusals, then taken: four attempts of one message, and nothing else.
    assert_eq!(
        delivered
            .iter()
            .map(|r| r["status"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [500, 500, 500, 200]
    );
    let ids: std::collections::BTreeSet<&str> = delivered
        .iter()
        .map(|r| r["headers"]["webhook-id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 1, "one message: {ids:?}");
    let last = delivered.last().unwrap();
    let body: Value = serde_json::from_str(last["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["statusUpdate"]["taskId"], task);
    assert_eq!(body["statusUpdate"]["contextId"], context);
    assert_eq!(
        body["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    assert_eq!(last["headers"]["x-a2a-notification-token"], "tok-push-123");
    assert_eq!(last["headers"]["authorization"], "Bearer push-secret");
    // Signed (Standard Webhooks) with the client's token as the key: the reference library
    // verifies it with that, and not with another.
    use base64::Engine as _;
    let key = |token: &str| {
        format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode(token)
        )
    };
    assert!(verifies(&key("tok-push-123"), last));
    assert!(!verifies(&key("tok-push-124"), last));
    // The deleted config heard nothing; the task's ended with it: no subscription is left.
    assert!(receiver.on("/ok/second").is_empty());
    let alice = server.client(ALICE);
    turnpike_tests::wait::until(LONG, "the ended subscription removed", || async {
        let listed = alice.get("/v1/webhooks").await.ok()?.into_ok().ok()?;
        listed["webhooks"].as_array()?.is_empty().then_some(())
    })
    .await;
    // The conversation's next task (its turn ended meanwhile) was not pushed as this one.
    let ids: std::collections::BTreeSet<String> = receiver
        .log()
        .iter()
        .filter_map(|r| r["headers"]["webhook-id"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
}
