//! The web console in a real browser: headless Chromium driven by Selenium
//! (`tests/console/console.py`) against `turnpike serve`, and once against a fleet of two routers
//! and a worker over NATS. The Python side asks this side to kill or restart the server
//! (`@@kill`, `@@restart` on its stdout; `ok` on its stdin). Screenshots of failures land in
//! `<target>/console-artifacts/`.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use turnpike_tests::edge::{apps_with, Server, ADMIN, ALICE, BOB};
use turnpike_tests::fixtures::signer;
use turnpike_tests::nats::NatsServer;
use turnpike_tests::process::Process;

const LONG: Duration = Duration::from_secs(120);

const MANIFEST: &str = r#"
app = "console"

[agents.assistant]
provider = "script"
script = "assistant.script.toml"
tools = ["write_file", "publish", "read_file", "list_files", "ask_user"]
approval = [{ tool = "publish" }]
context_length = 32000

[agents.other]
provider = "script"
script = "other.script.toml"
context_length = 8000

[agents.writer]
provider = "script"
script = "writer.script.toml"
tools = ["write_file"]
"#;

const ASSISTANT: &str = r#"
[[turn]]
when = "story"
[[turn.step]]
text = "Once upon a time there was a turnpike that carried everyone home, and they lived happily ever after."
word_delay_ms = 150

[[turn]]
when = "slow"
[[turn.step]]
text = "Slowly, one word at a time, this reply takes its time to arrive here."
word_delay_ms = 400

[[turn]]
when = "publish"
[[turn.step]]
tool_calls = [{ name = "write_file", arguments = { path = "note.md", content = "{last_user}" } }]
[[turn.step]]
tool_calls = [{ name = "publish", arguments = { path = "note.md" } }]
[[turn.step]]
text = "after publish: {last_tool}"

[[turn]]
when = "attach"
[[turn.step]]
text = "You attached {attachment}"

[[turn]]
when = "colour"
[[turn.step]]
tool_calls = [{ name = "ask_user", arguments = { question = "Which colour?" } }]

# What a resumed turn (after an approval) and anything else gets.
[[turn]]
[[turn.step]]
text = "answer to: {last_user} (last tool: {last_tool})"
"#;

const OTHER: &str = r#"
[[turn]]
[[turn.step]]
text = "the other agent here: {last_user}"
"#;

const WRITER: &str = r#"
[[turn]]
[[turn.step]]
tool_calls = [{ name = "write_file", arguments = { path = "note.md", content = "{last_user}" } }]
[[turn.step]]
text = "saved"
"#;

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_turnpike"))
}

fn apps() -> tempfile::TempDir {
    apps_with(&[
        ("console.toml", MANIFEST),
        ("assistant.script.toml", ASSISTANT),
        ("other.script.toml", OTHER),
        ("writer.script.toml", WRITER),
    ])
}

fn python() -> String {
    std::env::var("TURNPIKE_BROWSER_PYTHON").unwrap_or_else(|_| {
        panic!("TURNPIKE_BROWSER_PYTHON is not set: run `eval \"$(scripts/services test-env)\"` after `scripts/services install tests`")
    })
}

fn artifacts() -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target")
            .display()
            .to_string()
    });
    PathBuf::from(target).join("console-artifacts")
}

/// Runs the browser scenarios `groups` against `base`, doing what they ask of `server` (kill,
/// restart). Panics with the script's output if any scenario fails.
fn run_browser(groups: &[&str], base: &str, other_base: &str, mut on_command: impl FnMut(&str)) {
    let downloads = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/console/console.py");
    let mut child = Command::new(python())
        .arg(&script)
        .args(groups)
        .env("CONSOLE_BASE", base)
        .env("CONSOLE_OTHER_BASE", other_base)
        .env("CONSOLE_ALICE", ALICE)
        .env("CONSOLE_BOB", BOB)
        .env("CONSOLE_ADMIN", ADMIN)
        .env("CONSOLE_ARTIFACTS", artifacts())
        .env("CONSOLE_DOWNLOADS", downloads.path())
        .env("SE_OFFLINE", "true")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the browser test");
    let mut stdin = child.stdin.take().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    for line in stdout.lines() {
        let line = line.unwrap();
        match line.strip_prefix("@@") {
            Some(command) => {
                on_command(command);
                writeln!(stdin, "ok").unwrap();
                stdin.flush().unwrap();
            }
            None => eprintln!("{line}"),
        }
    }
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "the browser scenarios {groups:?} failed (screenshots in {})",
        artifacts().display()
    );
}

#[test]
fn the_console_in_a_browser_against_serve() {
    let apps = apps();
    let mut server = Server::start(&binary(), Some(apps.path()), &[], true).unwrap();
    let base = server.base.clone();
    run_browser(
        &["chat", "admin", "narrow"],
        &base,
        &base,
        |command| match command {
            "kill" => server.process.kill(),
            "restart" => server.restart().unwrap(),
            other => panic!("unknown command {other:?}"),
        },
    );
}

#[test]
fn the_console_in_a_browser_against_a_fleet_of_two_routers() {
    let nats = NatsServer::start().unwrap();
    let apps = apps();
    let store = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let tokens = data.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[tokens]]\ntoken = \"{ALICE}\"\nidentity = \"local:alice\"\n\n\
             [[tokens]]\ntoken = \"{BOB}\"\nidentity = \"local:bob\"\n\n\
             [[tokens]]\ntoken = \"{ADMIN}\"\nidentity = \"local:operator\"\nadmin = true\n"
        ),
    )
    .unwrap();
    let common = || -> Vec<String> {
        vec![
            "--data-dir".into(),
            data.path().display().to_string(),
            "--apps".into(),
            apps.path().display().to_string(),
            "--store".into(),
            format!("file://{}", store.path().display()),
            "--nats-url".into(),
            nats.url(),
        ]
    };
    let envs = [
        ("TURNPIKE_SIGNING_KEY", signer().to_hex()),
        ("TURNPIKE_LOG", "warn".to_owned()),
        ("TURNPIKE_EMBEDDING_MODEL", "/nonexistent-model".to_owned()),
    ];
    let mut worker_args = common();
    worker_args.push("worker".into());
    let mut worker = Process::start(&binary(), &worker_args, &envs).unwrap();
    worker.wait_for_line("worker wkr_", LONG).unwrap();
    let mut routers = Vec::new();
    let mut bases = Vec::new();
    for _ in 0..2 {
        let port = turnpike_tests::services::free_port().unwrap();
        let mut args = common();
        args.extend([
            "router".into(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--tokens".into(),
            tokens.display().to_string(),
        ]);
        let mut router = Process::start(&binary(), &args, &envs).unwrap();
        router.wait_for_line("router ready", LONG).unwrap();
        routers.push(router);
        bases.push(format!("http://127.0.0.1:{port}"));
    }
    run_browser(&["fleet"], &bases[0], &bases[1], |command| {
        panic!("the fleet scenario asked for {command:?}")
    });
}
