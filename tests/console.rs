//! The web console in a real browser: headless Chromium driven by Selenium
//! (`tests/console/console.py`) against `turnpike serve`, and once against a fleet of two routers
//! and a worker over NATS. The Python side asks this side to kill or restart the server
//! (`@@kill`, `@@restart` on its stdout; `ok` on its stdin). Screenshots of failures land in
//! `<target>/console-artifacts/`.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use turnpike_tests::edge::{apps_with, tokens_file, Server, ADMIN, ALICE, BOB};
use turnpike_tests::fleet::Fleet;

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
compaction = "SUMMARY of {messages} messages"

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

# Three rounds, each streamed slowly: room to steer between rounds and to stop it.
[[turn]]
when = "long task"
[[turn.step]]
text = "Step one: looking around the workspace before anything else. "
word_delay_ms = 250
tool_calls = [{ name = "list_files", arguments = {} }]
[[turn.step]]
text = "Step two: taking your steer into account, {last_user}. "
word_delay_ms = 250
tool_calls = [{ name = "list_files", arguments = {} }]
[[turn.step]]
text = "Step three: a long and careful conclusion that takes many words to arrive, one at a time, slowly, so that there is time to stop it."
word_delay_ms = 250

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_browser_against_a_fleet_of_two_routers() {
    let apps = apps();
    let mut fleet = Fleet::start(&binary()).await;
    fleet.apps = Some(apps.path().to_path_buf());
    let tokens = tokens_file(fleet.data.path()).unwrap();
    let _worker = fleet.worker(&[]);
    let (_a, first) = fleet.router(&tokens);
    let (_b, second) = fleet.router(&tokens);
    tokio::task::spawn_blocking(move || {
        run_browser(&["fleet"], &first, &second, |command| {
            panic!("the fleet scenario asked for {command:?}")
        })
    })
    .await
    .unwrap();
}

/// The versions API behind the console's project view: only what the record names, only to
/// whoever may read the conversation.
#[test]
fn project_versions_show_what_the_record_names_to_those_who_may_read_it() {
    use turnpike_tests::edge::{create, say, wait_for_complete_turns, ALICE_OF_BETA};
    let apps = turnpike_tests::edge::writer_apps();
    // A ref is planted on disk: a file per object, not the database.
    let server = Server::start(
        &binary(),
        Some(apps.path()),
        &["--local-store", "files"],
        false,
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let alice = server.client(ALICE);
        let id = create(&alice, "life", "writer").await;
        say(&alice, &id, "alpha one").await;
        wait_for_complete_turns(&alice, &id, 1, LONG).await.unwrap();
        say(&alice, &id, "beta two").await;
        wait_for_complete_turns(&alice, &id, 2, LONG).await.unwrap();
        let get = |client: &turnpike_edge::client::Client, path: String| {
            let client = client.clone();
            async move { client.get(&path).await.unwrap() }
        };

        let list = get(&alice, format!("/v1/conversations/{id}/versions")).await;
        let turns: Vec<&str> = list.body["versions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["turn"].as_str().unwrap())
            .collect();
        assert_eq!(turns, ["turn_1", "turn_2"], "{:?}", list.body);

        let files = get(&alice, format!("/v1/conversations/{id}/versions/turn_2")).await;
        let file = &files.body["files"][0];
        assert_eq!(file["path"], "note.md", "{:?}", files.body);
        assert_eq!(file["size"], 8);
        let reference = file["reference"].as_str().unwrap();
        assert!(reference.starts_with("conv:gi:"), "{reference}");
        let (status, bytes) = alice
            .bytes(&format!("/v1/files?reference={reference}"), true)
            .await
            .unwrap();
        assert_eq!((status, bytes.as_slice()), (200, &b"beta two"[..]));

        let diff = get(
            &alice,
            format!("/v1/conversations/{id}/versions/turn_2/diff"),
        )
        .await;
        assert_eq!(diff.body["from"], "turn_1", "{:?}", diff.body);
        let change = &diff.body["changes"][0];
        assert_eq!(change["change"], "modified");
        let patch = change["patch"].as_str().unwrap();
        assert!(
            patch.contains("-alpha one") && patch.contains("+beta two"),
            "{patch}"
        );
        let first = get(
            &alice,
            format!("/v1/conversations/{id}/versions/turn_1/diff"),
        )
        .await;
        assert!(first.body.get("from").is_none(), "{:?}", first.body);
        assert_eq!(first.body["changes"][0]["change"], "added");

        // Nobody else sees any of it, exactly as if the conversation did not exist.
        for token in [BOB, ALICE_OF_BETA] {
            let other = server.client(token);
            for path in ["versions", "versions/turn_2", "versions/turn_2/diff"] {
                let r = get(&other, format!("/v1/conversations/{id}/{path}")).await;
                assert_eq!(r.status, 404, "{token} {path}: {:?}", r.body);
            }
        }
        // A turn that cannot be one, or has no version, is not found; a malformed `from` is refused.
        for (path, status) in [
            ("versions/turn_0", 404),
            ("versions/x", 404),
            ("versions/turn_9", 404),
            ("versions/turn_2/diff?from=turn_9", 404),
            ("versions/turn_2/diff?from=..%2Fturn_1", 422),
        ] {
            let r = get(&alice, format!("/v1/conversations/{id}/{path}")).await;
            assert_eq!(r.status, status, "{path}: {:?}", r.body);
        }

        // A ref planted in the store for a turn the record does not name is never shown.
        let refs = turnpike_tests::edge::files_under(&server.store_dir())
            .into_iter()
            .find(|f| f.ends_with("git/refs/turn_1"))
            .expect("turn_1's ref");
        let planted = server
            .store_dir()
            .join(refs.replace("git/refs/turn_1", "git/refs/turn_3"));
        std::fs::copy(server.store_dir().join(&refs), &planted).unwrap();
        let list = get(&alice, format!("/v1/conversations/{id}/versions")).await;
        assert_eq!(list.body["versions"].as_array().unwrap().len(), 2);
        let r = get(&alice, format!("/v1/conversations/{id}/versions/turn_3")).await;
        assert_eq!(r.status, 404, "{:?}", r.body);
    });
}
