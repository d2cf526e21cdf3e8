//! The command line, run as a user would: the real binary on a real data directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

struct Cli {
    data: tempfile::TempDir,
    /// `--local-store` for every command (none: the embedded default's choice).
    layout: Option<&'static str>,
}

impl Cli {
    /// A data directory whose store keeps a file per object: the tests read, damage and plant
    /// objects on disk.
    fn new() -> Self {
        Cli {
            data: tempfile::tempdir().unwrap(),
            layout: Some("files"),
        }
    }

    /// A data directory as a user gets it (its store is the database).
    fn on_default() -> Self {
        Cli {
            data: tempfile::tempdir().unwrap(),
            layout: None,
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args)
            .output()
            .expect("the turnpike binary runs")
    }

    /// The binary on this data directory, with no configuration from the environment.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_turnpike"));
        command.arg("--data-dir").arg(self.data.path());
        if let Some(layout) = self.layout {
            command.args(["--local-store", layout]);
        }
        command.args(args);
        for (key, _) in std::env::vars() {
            if key.starts_with("TURNPIKE_") || key.starts_with("AWS_") {
                command.env_remove(key);
            }
        }
        command.env("TURNPIKE_ADMIN_LISTEN", "127.0.0.1:0");
        command
    }

    /// Creates a conversation with one echo turn; returns its id.
    fn conversation(&self, actor: &str) -> String {
        let out = self.run(&["record", "append", "--actor", actor, "--message", "hello"]);
        assert!(out.status.success(), "{}", text(&out));
        let stdout = String::from_utf8(out.stdout).unwrap();
        stdout
            .lines()
            .find_map(|l| l.strip_prefix("created "))
            .expect("the new conversation's id")
            .trim()
            .to_owned()
    }

    fn batch_path(&self, conversation: &str, seq: u64) -> PathBuf {
        self.data
            .path()
            .join("store/tenants/default/conversations")
            .join(conversation)
            .join(format!("record/{seq:020}"))
    }
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn edit(path: &Path, from: &str, to: &str) {
    let content = std::fs::read_to_string(path).unwrap();
    assert!(content.contains(from), "{from:?} not in {}", path.display());
    std::fs::write(path, content.replacen(from, to, 1)).unwrap();
}

const ACTOR: &str = "oidc:acme:u-17";

#[test]
fn demo_runs_a_multi_turn_conversation_with_tools_files_and_a_folded_follow_up() {
    let cli = Cli::new();
    let out = cli.run(&["demo"]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "turn_1 [replied]",
        "turn_2 [replied]",
        "attachment (local:me): notes.txt at conv:at:",
        "(folded into the running turn) follow-up (local:me): Also list the action items",
        "tool call call_1_0 pull(",
        "tool call call_3_0 publish(",
        "download: /v1/files/conv:fi:",
        "turn_1: reproduced",
        "turn_2: reproduced",
        "verified conv_",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in\n{stdout}"
        );
    }
    // Turn 2 read turn 1's published report by reference.
    assert!(stdout.contains(r##""text":"# Meeting report"##), "{stdout}");
    // The follow-up reached the report written in the same turn.
    assert!(
        stdout.contains("covers your follow-up too: \"Also list the action items, please.\""),
        "{stdout}"
    );
    assert!(cli.data.path().join("keys/record-signing.key").is_file());
    assert!(cli.data.path().join("apps/demo.toml").is_file());

    // Replay with a what-if reports where it diverges.
    let conv = stdout
        .lines()
        .find_map(|l| l.strip_prefix("created "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_owned();
    let what_if = cli.run(&[
        "conversation",
        "replay",
        &conv,
        "--actor",
        "local:me",
        "--what-if",
        "turn_1/result/call_3_0={\"error\":\"disk full\"}",
    ]);
    assert!(what_if.status.success(), "{}", text(&what_if));
    let report = String::from_utf8_lossy(&what_if.stdout);
    assert!(
        report.contains("DIVERGES: turn_1 diverges at block 10") && report.contains("disk full"),
        "{report}"
    );
    let bad = cli.run(&[
        "conversation",
        "replay",
        &conv,
        "--actor",
        "local:me",
        "--what-if",
        "turn_1/step/3=x",
    ]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("turn_<n>/output/<k>"));

    // The project versions the turns published, as a plain git repository.
    let repo = cli.data.path().join("export.git");
    let export = cli.run(&[
        "git",
        "export",
        &conv,
        repo.to_str().unwrap(),
        "--actor",
        "local:me",
    ]);
    assert!(export.status.success(), "{}", text(&export));
    let git = |args: &[&str]| turnpike_tests::git::git(&repo, args);
    git(&["fsck", "--full"]);
    assert!(git(&["show", "turn_1:report.md"]).starts_with("# Meeting report"));
    assert!(git(&["log", "--format=%s", "main"]).contains("turn_1"));
    let again = cli.run(&[
        "git",
        "export",
        &conv,
        repo.to_str().unwrap(),
        "--actor",
        "local:me",
    ]);
    assert_eq!(again.status.code(), Some(2), "{}", text(&again));

    // The demo searched its turns by meaning; the index rebuilds from the records, and
    // `turnpike search` finds the owner's rows — and nobody else's.
    assert!(stdout.contains("search (hybrid"), "{stdout}");
    let rebuild = cli.run(&["index", "rebuild", "--full"]);
    assert!(rebuild.status.success(), "{}", text(&rebuild));
    assert!(
        String::from_utf8_lossy(&rebuild.stdout).contains("indexed 2 turns of 1 conversations"),
        "{}",
        text(&rebuild)
    );
    let search = |actor: &str, extra: &[&str]| {
        let mut args = vec!["search", "when does the launch happen", "--actor", actor];
        args.extend_from_slice(extra);
        cli.run(&args)
    };
    let out = search("local:me", &["--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let page: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let hits = page["hits"].as_array().unwrap();
    assert!(!hits.is_empty(), "{page}");
    assert!(hits.iter().all(|h| h["conversation"] == conv.as_str()));
    assert!(
        hits.iter().any(|h| h["snippet"]
            .as_str()
            .is_some_and(|s| s.contains("Thursday"))),
        "{page}"
    );
    let stranger = search("local:someone-else", &[]);
    assert!(stranger.status.success(), "{}", text(&stranger));
    assert_eq!(String::from_utf8_lossy(&stranger.stdout).trim(), "no hits");
    let bad = search("local:me", &["--mode", "fuzzy"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown mode \"fuzzy\""));
}

#[test]
fn a_bad_manifest_is_refused_at_start_with_its_file_field_and_reason() {
    let cli = Cli::new();
    let apps = cli.data.path().join("my-apps");
    std::fs::create_dir_all(&apps).unwrap();
    std::fs::write(
        apps.join("shop.toml"),
        "app = \"shop\"\n[agents.clerk]\nprovider = \"openai\"\nmodel = \"m\"\ntools = [\"teleport\"]\n",
    )
    .unwrap();
    let out = cli.run(&[
        "--apps",
        apps.to_str().unwrap(),
        "serve",
        "--listen",
        "127.0.0.1:0",
    ]);
    assert!(!out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("shop.toml")
            && stderr.contains("agents.clerk.tools")
            && stderr.contains("unknown tool \"teleport\""),
        "{stderr}"
    );
}

#[test]
fn verify_passes_on_a_good_record_and_fails_on_a_tampered_one() {
    let cli = Cli::new();
    let conv = cli.conversation(ACTOR);
    let more = cli.run(&[
        "record",
        "append",
        "--actor",
        ACTOR,
        "--conversation",
        &conv,
        "--message",
        "again",
    ]);
    assert!(more.status.success(), "{}", text(&more));

    let ok = cli.run(&["conversation", "verify", &conv, "--actor", ACTOR]);
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok));
    assert!(String::from_utf8_lossy(&ok.stdout).contains("verified"));

    let replay = cli.run(&["conversation", "replay", &conv, "--actor", ACTOR]);
    assert_eq!(replay.status.code(), Some(0), "{}", text(&replay));
    let transcript = String::from_utf8_lossy(&replay.stdout);
    assert!(
        transcript.contains("turn_1 [replied]") && transcript.contains("turn_2 [replied]"),
        "{transcript}"
    );
    assert!(
        transcript.contains("user (oidc:acme:u-17): again"),
        "{transcript}"
    );

    // Batch 3 is turn 2's batch one: its user message sits at position 2 + 7 = 9 (turn 1 is
    // its message and dispatch, then its reply, its model call's usage and its completion).
    edit(&cli.batch_path(&conv, 3), "again", "AGAIN");
    let bad = cli.run(&["conversation", "verify", &conv, "--actor", ACTOR]);
    assert_eq!(bad.status.code(), Some(1), "{}", text(&bad));
    let stdout = String::from_utf8_lossy(&bad.stdout);
    assert!(
        stdout.contains("FAILED")
            && stdout.contains("position 9 (batch 3)")
            && stdout.contains("edited"),
        "{stdout}"
    );

    // Repair removes the edited entry and re-signs; the record verifies again.
    let repair = cli.run(&["conversation", "repair", &conv, "--actor", ACTOR]);
    assert_eq!(repair.status.code(), Some(0), "{}", text(&repair));
    assert!(
        String::from_utf8_lossy(&repair.stdout).contains("removed entry 9 of batch 3"),
        "{}",
        text(&repair)
    );
    let again = cli.run(&["conversation", "verify", &conv, "--actor", ACTOR]);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
}

#[test]
fn truncation_is_caught_by_the_kept_checkpoint() {
    let cli = Cli::new();
    let conv = cli.conversation(ACTOR);
    let more = cli.run(&[
        "record",
        "append",
        "--actor",
        ACTOR,
        "--conversation",
        &conv,
        "--message",
        "again",
    ]);
    assert!(more.status.success(), "{}", text(&more));
    let ok = cli.run(&["conversation", "verify", &conv, "--actor", ACTOR]);
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok));
    std::fs::remove_file(cli.batch_path(&conv, 4)).unwrap();
    for extra in [&[][..], &["--incremental"][..]] {
        let mut args = vec!["conversation", "verify", &conv, "--actor", ACTOR];
        args.extend_from_slice(extra);
        let bad = cli.run(&args);
        assert_eq!(bad.status.code(), Some(1), "{}", text(&bad));
        assert!(
            String::from_utf8_lossy(&bad.stdout).contains("truncated"),
            "{}",
            text(&bad)
        );
    }
}

#[test]
fn incremental_verify_checks_only_new_entries() {
    let cli = Cli::new();
    let conv = cli.conversation(ACTOR);
    assert!(cli
        .run(&["conversation", "verify", &conv, "--actor", ACTOR])
        .status
        .success());
    let more = cli.run(&[
        "record",
        "append",
        "--actor",
        ACTOR,
        "--conversation",
        &conv,
        "--message",
        "again",
    ]);
    assert!(more.status.success());
    let inc = cli.run(&[
        "conversation",
        "verify",
        &conv,
        "--actor",
        ACTOR,
        "--incremental",
    ]);
    assert_eq!(inc.status.code(), Some(0), "{}", text(&inc));
    // Turn 2 adds two batches: its message and dispatch, then its reply, its usage and its
    // completion, each with a signed root.
    assert!(
        String::from_utf8_lossy(&inc.stdout).contains("7 entries in 2 batches checked"),
        "{}",
        text(&inc)
    );
}

#[test]
fn a_malformed_actor_is_refused_with_a_clear_message() {
    let cli = Cli::new();
    let conv = cli.conversation(ACTOR);
    for bad in ["octocat", "a:b:c:d", "GitHub:octocat", "oidc::x"] {
        let out = cli.run(&["conversation", "verify", &conv, "--actor", bad]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("invalid identity") && stderr.contains("--actor"),
            "{stderr}"
        );
    }
}

#[test]
fn another_identity_cannot_tell_a_conversation_exists() {
    let cli = Cli::new();
    let conv = cli.conversation(ACTOR);
    let missing = "conv_01HZY3W5R8G7V2T6Q4M9K0JX1C";
    let theirs = cli.run(&["conversation", "replay", &conv, "--actor", "oidc:acme:u-18"]);
    let nothing = cli.run(&[
        "conversation",
        "replay",
        missing,
        "--actor",
        "oidc:acme:u-18",
    ]);
    assert_eq!(theirs.status.code(), Some(2));
    assert_eq!(nothing.status.code(), Some(2));
    let a = String::from_utf8_lossy(&theirs.stderr).replace(&conv, "<id>");
    let b = String::from_utf8_lossy(&nothing.stderr).replace(missing, "<id>");
    assert_eq!(a, b);
    assert!(a.contains("not found"), "{a}");
    assert!(theirs.stdout.is_empty());
}

#[test]
fn a_fleet_store_without_a_signing_key_is_refused() {
    let cli = Cli::new();
    let out = cli.run(&[
        "--store",
        "memory://",
        "record",
        "append",
        "--actor",
        ACTOR,
        "--message",
        "hi",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("signing key is required"),
        "{}",
        text(&out)
    );
}

#[test]
fn send_serve_and_tail_run_turns_on_the_embedded_default() {
    let cli = Cli::new();
    // Accepted while nothing serves: durable in the embedded bus.
    let sent = cli.run(&["send", "new", "--actor", ACTOR, "--text", "hello lanes"]);
    assert!(sent.status.success(), "{}", text(&sent));
    let stdout = String::from_utf8_lossy(&sent.stdout).into_owned();
    let conv = stdout.lines().next().unwrap().trim().to_owned();
    assert!(stdout.contains("accepted evt_"), "{stdout}");
    let again = cli.run(&[
        "send",
        &conv,
        "--actor",
        ACTOR,
        "--text",
        "twice",
        "--idempotency-key",
        "k1",
    ]);
    let dup = cli.run(&[
        "send",
        &conv,
        "--actor",
        ACTOR,
        "--text",
        "twice",
        "--idempotency-key",
        "k1",
    ]);
    assert!(again.status.success() && dup.status.success());
    assert!(
        String::from_utf8_lossy(&dup.stdout).contains("duplicate"),
        "{}",
        text(&dup)
    );
    let bad = cli.run(&["send", &conv, "--actor", ACTOR, "--text", ""]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("empty"),
        "{}",
        text(&bad)
    );

    let mut serve = cli
        .command(&["serve", "--workers", "2", "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // tail --follow exits once two turns are committed.
    let tail = cli.run(&[
        "tail",
        &conv,
        "--actor",
        ACTOR,
        "--follow",
        "--until-turns",
        "2",
        "--timeout-secs",
        "120",
    ]);
    let _ = serve.kill();
    let _ = serve.wait();
    assert!(tail.status.success(), "{}", text(&tail));
    let rows = String::from_utf8_lossy(&tail.stdout);
    assert!(rows.contains("assistant: echo: hello lanes"), "{rows}");
    assert!(rows.contains("assistant: echo: twice"), "{rows}");
    assert_eq!(rows.matches("echo: twice").count(), 1, "{rows}");
    let verify = cli.run(&["conversation", "verify", &conv, "--actor", ACTOR]);
    assert_eq!(verify.status.code(), Some(0), "{}", text(&verify));
}

/// Item 9 of the third adversarial look: while `turnpike serve` holds the data directory (and
/// its embedded bus), `turnpike send` goes through its API, as the actor the data directory's
/// token file names — and says how to get in when it names no token for the actor.
#[test]
fn send_reaches_a_running_server_through_its_api() {
    let cli = Cli::new();
    let mut serve = turnpike_tests::process::Process::start(
        Path::new(env!("CARGO_BIN_EXE_turnpike")),
        &[
            "--data-dir".into(),
            cli.data.path().display().to_string(),
            "--local-store".into(),
            "files".into(),
            "serve".into(),
            "--workers".into(),
            "1".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
        ],
        &[("TURNPIKE_ADMIN_LISTEN", "127.0.0.1:0".to_owned())],
    )
    .unwrap();
    let line = serve
        .wait_for_line("API listening on", std::time::Duration::from_secs(60))
        .unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap()
        .trim_end_matches("/v1")
        .to_owned();
    let sent = cli.run(&[
        "send",
        "new",
        "--actor",
        "local:me",
        "--text",
        "while serving",
        "--url",
        &url,
    ]);
    assert!(sent.status.success(), "{}", text(&sent));
    assert!(
        String::from_utf8_lossy(&sent.stderr).contains("sending through its API"),
        "{}",
        text(&sent)
    );
    let stdout = String::from_utf8_lossy(&sent.stdout).into_owned();
    let conv = stdout.lines().next().unwrap().trim().to_owned();
    assert!(stdout.contains("accepted evt_"), "{stdout}");
    let tail = cli.run(&[
        "tail",
        &conv,
        "--actor",
        "local:me",
        "--follow",
        "--until-turns",
        "1",
        "--timeout-secs",
        "120",
    ]);
    assert!(tail.status.success(), "{}", text(&tail));
    assert!(
        String::from_utf8_lossy(&tail.stdout).contains("echo: while serving"),
        "{}",
        text(&tail)
    );
    // An actor the token file has no token for is told so, and nothing is sent.
    let stranger = cli.run(&[
        "send",
        &conv,
        "--actor",
        ACTOR,
        "--text",
        "let me in",
        "--url",
        &url,
    ]);
    assert!(!stranger.status.success());
    assert!(
        String::from_utf8_lossy(&stranger.stderr).contains("holds no token for oidc:acme:u-17"),
        "{}",
        text(&stranger)
    );
    serve.kill();
}

/// A bench stopped by SIGTERM stops the servers it started (a soak is often stopped by hand:
/// its `serve` must not be left running behind it).
#[test]
fn a_bench_stopped_by_a_signal_stops_the_servers_it_started() {
    use std::io::BufRead as _;
    let cli = Cli::new();
    let mut bench = KilledOnDrop(
        cli.command(&[
            "bench",
            "soak",
            // Far more than it runs before the signal, and little enough disk for its check.
            "--turns",
            "100000",
            "--conversations",
            "2",
            "--clients",
            "1",
            "--nats-server",
            "none",
        ])
        .env_remove("MIMALLOC_PURGE_DELAY")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap(),
    );
    let bench = &mut bench.0;
    // The table's header is printed once its server is up and the conversations are made.
    let mut lines = std::io::BufReader::new(bench.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.unwrap().contains("turns/s")),
        "the soak did not start"
    );
    let children = children_of(bench.id());
    assert!(!children.is_empty(), "the soak runs a server of its own");
    // Its server gives freed memory back at once, so its resident memory follows live data.
    for child in &children {
        let environ = std::fs::read(format!("/proc/{child}/environ")).unwrap();
        assert!(
            environ
                .split(|b| *b == 0)
                .any(|v| v == b"MIMALLOC_PURGE_DELAY=0"),
            "server {child} keeps the allocator's default purge delay"
        );
    }
    // SAFETY: a signal to the child this test started.
    assert_eq!(unsafe { libc::kill(bench.id() as i32, libc::SIGTERM) }, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = bench.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the bench did not stop"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(130));
    for child in children {
        assert!(
            !Path::new(&format!("/proc/{child}")).exists(),
            "server {child} was left running"
        );
    }
}

/// A child process killed (and reaped) when the test lets go of it, a failed assertion included:
/// a soak left behind would run its million turns after the test.
struct KilledOnDrop(std::process::Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The processes `pid` started (from `/proc/<pid>/task/*/children`).
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let children = std::fs::read_to_string(task.unwrap().path().join("children"));
        out.extend(
            children
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok()),
        );
    }
    out
}

/// The benchmarks run (their numbers are for the closing notes, not for tests).
#[test]
fn the_benchmarks_run() {
    let cli = Cli::new();
    let record = cli.run(&["bench", "record", "--appends", "64"]);
    assert!(record.status.success(), "{}", text(&record));
    assert!(String::from_utf8_lossy(&record.stdout).contains("incremental verify takes"));
    let lanes = cli.run(&[
        "bench",
        "lanes",
        "--conversations",
        "4",
        "--turns",
        "2",
        "--samples",
        "4",
        "--workers",
        "2",
        "--repeat",
        "2",
    ]);
    assert!(lanes.status.success(), "{}", text(&lanes));
    let out = String::from_utf8_lossy(&lanes.stdout);
    assert!(
        out.contains("turnpike embedded accept -> turn start"),
        "{out}"
    );
    // The floor is measured twice, before the turns and after them.
    assert!(
        out.contains("before the turns") && out.contains("raw JetStream messages"),
        "{out}"
    );
    // Each round on its own streams and stores, then the medians of the goals' figures.
    let rounds = out
        .lines()
        .filter(|l| l.starts_with("1 ") || l.starts_with("2 "))
        .count();
    assert_eq!(rounds, 2, "{out}");
    assert!(
        out.contains("median of 2 rounds: a turn on JetStream costs the CPU of"),
        "{out}"
    );
    // The edge benchmark over the stack the binary wires (turnpike-bench measures, the binary
    // starts the edge and its worker).
    let edge = cli.run(&[
        "bench",
        "edge",
        "--conversations",
        "2",
        "--rounds",
        "2",
        "--messages",
        "20",
        "--clients",
        "2",
    ]);
    assert!(edge.status.success(), "{}", text(&edge));
    let out = String::from_utf8_lossy(&edge.stdout);
    assert!(
        out.contains("over the API, 2 concurrent conversation(s)"),
        "{out}"
    );
    assert!(out.contains("messages accepted/s"), "{out}");
    let git = cli.run(&["bench", "git", "--turns", "10"]);
    assert!(git.status.success(), "{}", text(&git));
    assert!(String::from_utf8_lossy(&git.stdout).contains("turn    10"));
    // Erasure leaves nothing behind (the benchmark checks the store is empty after).
    let erase = cli.run(&["bench", "erase", "--conversations", "3"]);
    assert!(erase.status.success(), "{}", text(&erase));
    let out = String::from_utf8_lossy(&erase.stdout);
    assert!(
        out.contains("3 conversations in") && out.contains("0 object reads"),
        "{out}"
    );
    let remote = cli.run(&["bench", "remote", "--samples", "5", "--actions", "20"]);
    assert!(remote.status.success(), "{}", text(&remote));
    assert!(
        String::from_utf8_lossy(&remote.stdout).contains("µs per action"),
        "{}",
        text(&remote)
    );
}

#[test]
fn an_admin_runs_operator_commands_in_its_own_tenant_only_and_is_logged() {
    let cli = Cli::new();
    let conv = cli.conversation(ACTOR);
    let admin = "oidc:acme:ops";
    // Not named an admin: like anyone else, it is not found.
    let plain = cli.run(&["conversation", "verify", &conv, "--actor", admin]);
    assert_eq!(plain.status.code(), Some(2), "{}", text(&plain));
    // Named an admin (flag or environment), in the conversation's tenant: it verifies, and the
    // use is logged with who did it.
    let ok = cli.run(&[
        "--admin",
        admin,
        "conversation",
        "verify",
        &conv,
        "--actor",
        admin,
    ]);
    assert!(ok.status.success(), "{}", text(&ok));
    let stderr = String::from_utf8_lossy(&ok.stderr);
    assert!(
        stderr.contains(&format!("admin {admin} ran `verify` on {conv}")),
        "{stderr}"
    );
    let via_env = cli
        .command(&["conversation", "replay", &conv, "--actor", admin])
        .env("TURNPIKE_ADMINS", format!("local:x,{admin}"))
        .output()
        .unwrap();
    assert!(via_env.status.success(), "{}", text(&via_env));
    // An admin of another tenant gets what a missing conversation gets.
    let elsewhere = cli.run(&[
        "--admin",
        admin,
        "conversation",
        "verify",
        &conv,
        "--actor",
        admin,
        "--tenant",
        "other",
    ]);
    assert_eq!(elsewhere.status.code(), Some(2), "{}", text(&elsewhere));
    assert!(!String::from_utf8_lossy(&elsewhere.stdout).contains("verified"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_lists_dead_letters_and_requeues_one_once() {
    let cli = Cli::new();
    let sent = cli.run(&["send", "new", "--actor", ACTOR, "--text", "first"]);
    assert!(sent.status.success(), "{}", text(&sent));
    let conv = String::from_utf8_lossy(&sent.stdout)
        .lines()
        .next()
        .unwrap()
        .trim()
        .to_owned();
    let empty = cli.run(&["conversation", "dead-letters", &conv, "--actor", ACTOR]);
    assert!(
        String::from_utf8_lossy(&empty.stdout).contains("no dead letters"),
        "{}",
        text(&empty)
    );
    // A newer event kind lands on the lane (as from a newer binary mid-upgrade).
    let address = serde_json::json!({
        "tenant": "default", "app": "demo", "agent": "echo",
        "conversation": conv, "identity": ACTOR,
    });
    let raw = serde_json::to_vec(&serde_json::json!({
        "version": 2, "id": turnpike_schemas::EventId::new().to_string(), "address": address,
        "accepted_at_ms": 1, "body": { "kind": "poll", "question": "lunch?" },
    }))
    .unwrap();
    {
        use turnpike_router::bus::Bus as _;
        let bus = turnpike_router::EmbeddedBus::open(
            &cli.data.path().join("bus.redb"),
            turnpike_router::embedded::EmbeddedConfig::default(),
        )
        .unwrap();
        let seq = bus
            .republish(conv.parse().unwrap(), &raw, "upgrade")
            .await
            .unwrap()
            .seq;
        assert_eq!(seq, 2);
    }
    // A letter left by an owner that died before it committed the parking: the record does
    // not hold it, so it is never requeued (its message was taken after all).
    let letters = cli
        .data
        .path()
        .join("store/tenants/default/conversations")
        .join(&conv)
        .join("dead-letters");
    std::fs::create_dir_all(&letters).unwrap();
    let orphan = turnpike_artifactory::DeadLetter::new(1, "an owner died here", 1, b"{}");
    std::fs::write(
        letters.join(format!("{:020}", 1)),
        serde_json::to_vec(&orphan).unwrap(),
    )
    .unwrap();
    let rows = |cli: &Cli| {
        String::from_utf8_lossy(&cli.run(&["tail", &conv, "--actor", ACTOR]).stdout).into_owned()
    };
    let serve_until = |cli: &Cli, what: &str| {
        let mut serve = cli
            .command(&["serve", "--workers", "1", "--listen", "127.0.0.1:0"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while !rows(cli).contains(what) {
            assert!(
                std::time::Instant::now() < deadline,
                "never: {what}\n{}",
                rows(cli)
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = serve.kill();
        let _ = serve.wait();
    };
    serve_until(&cli, "lane message 2 set aside");
    assert!(rows(&cli).contains("echo: first"), "{}", rows(&cli));
    let listed = cli.run(&["conversation", "dead-letters", &conv, "--actor", ACTOR]);
    let listing = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listing.contains("lane sequence 2") && listing.contains("lunch?"),
        "{}",
        text(&listed)
    );
    let requeue = |seq: &str, actor: &str| {
        cli.run(&[
            "conversation",
            "requeue",
            &conv,
            "--actor",
            actor,
            "--seq",
            seq,
        ])
    };
    // Another identity cannot see or requeue them; the orphan is refused.
    let other = requeue("2", "oidc:acme:mallory");
    assert_eq!(other.status.code(), Some(2), "{}", text(&other));
    let orphaned = requeue("1", ACTOR);
    assert!(!orphaned.status.success(), "{}", text(&orphaned));
    assert!(
        String::from_utf8_lossy(&orphaned.stderr).contains("not set aside"),
        "{}",
        text(&orphaned)
    );
    let requeued = requeue("2", ACTOR);
    assert!(requeued.status.success(), "{}", text(&requeued));
    assert!(
        String::from_utf8_lossy(&requeued.stdout).contains("at lane sequence 3"),
        "{}",
        text(&requeued)
    );
    let twice = requeue("2", ACTOR);
    assert!(!twice.status.success(), "{}", text(&twice));
    assert!(
        String::from_utf8_lossy(&twice.stderr).contains("requeued already"),
        "{}",
        text(&twice)
    );
    // This binary still cannot read it: parked again, once, at its new sequence.
    serve_until(&cli, "lane message 3 set aside");
    assert_eq!(rows(&cli).matches("set aside").count(), 2, "{}", rows(&cli));
    assert_eq!(rows(&cli).matches("echo: first").count(), 1);
}

#[tokio::test]
async fn repair_waits_for_the_lease_so_no_turn_appends_while_it_rewrites() {
    let nats = turnpike_tests::nats::NatsServer::start().expect("nats-server");
    let cli = Cli::new();
    let conv = cli.conversation(ACTOR);
    let bus = turnpike_router::JetStreamBus::connect(turnpike_router::JetStreamConfig {
        url: nats.url(),
        ..Default::default()
    })
    .await
    .unwrap();
    use turnpike_router::bus::Bus as _;
    let lease = bus
        .claim(
            conv.parse().unwrap(),
            turnpike_schemas::WorkerId::new(),
            std::time::Duration::from_secs(60),
        )
        .await
        .unwrap()
        .expect("the lease is free");
    let url = nats.url();
    let repair = |cli: &Cli| {
        cli.run(&[
            "--nats-url",
            &url,
            "conversation",
            "repair",
            &conv,
            "--actor",
            ACTOR,
        ])
    };
    let busy = repair(&cli);
    assert!(!busy.status.success(), "{}", text(&busy));
    assert!(
        String::from_utf8_lossy(&busy.stderr).contains("a worker owns"),
        "{}",
        text(&busy)
    );
    bus.release(&lease).await.unwrap();
    let done = repair(&cli);
    assert!(done.status.success(), "{}", text(&done));
    // The repair gave the lease back: a worker can take the conversation at once.
    assert!(bus
        .claim(
            conv.parse().unwrap(),
            turnpike_schemas::WorkerId::new(),
            std::time::Duration::from_secs(60),
        )
        .await
        .unwrap()
        .is_some());
}

#[test]
fn a_batch_reported_appended_is_on_disk_when_the_process_is_killed_right_after() {
    use std::io::BufRead as _;
    let cli = Cli::on_default();
    // `created <id>` is printed once the opening batch is appended (and synced): kill the
    // process the moment the line arrives, wherever it is.
    let mut child = cli
        .command(&["record", "append", "--actor", ACTOR, "--message", "hello"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut conv = None;
    for line in std::io::BufReader::new(stdout).lines() {
        if let Some(id) = line.unwrap().strip_prefix("created ") {
            child.kill().unwrap();
            conv = Some(id.trim().to_owned());
            break;
        }
    }
    let _ = child.wait();
    let conv = conv.expect("the conversation was created");
    let store = cli.data.path().join("store");
    assert!(store.join("objects.sqlite").is_file(), "the default store");
    let batch = tokio::runtime::Runtime::new().unwrap().block_on(async {
        use object_store::ObjectStoreExt as _;
        let store = turnpike_artifactory::open_store(store.to_str().unwrap()).unwrap();
        let prefix = turnpike_artifactory::ConversationPrefix::new(
            "default".parse().unwrap(),
            conv.parse().unwrap(),
        );
        let got = store.get(&prefix.record_batch(0)).await;
        got.expect("the opening batch is on disk")
            .bytes()
            .await
            .unwrap()
    });
    assert!(
        String::from_utf8_lossy(&batch).contains("conversation_opened"),
        "{}",
        String::from_utf8_lossy(&batch)
    );
    // Whatever else the killed process wrote is whole: the record verifies.
    let verify = cli.run(&["conversation", "verify", &conv, "--actor", ACTOR]);
    assert_eq!(verify.status.code(), Some(0), "{}", text(&verify));
}

#[test]
fn failpoints_exist_only_in_test_builds_and_the_binary_has_no_fault_flag() {
    let tree = |edges: &str| {
        let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["tree", "--offline", "-p", "turnpike", "-e", edges])
            .args(["-i", "turnpike-worker", "--prefix", "none"])
            .output()
            .expect("cargo tree runs");
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    // What a release build compiles: the worker without its failpoints …
    let release = tree("normal,features");
    assert!(
        release.contains("turnpike-worker feature \"default\""),
        "{release}"
    );
    assert!(!release.contains("failpoints"), "{release}");
    // … while the tests (dev-dependencies) turn them on.
    assert!(tree("all,features").contains("turnpike-worker feature \"failpoints\""));
    // No command line can reach them.
    let cli = Cli::new();
    let help = cli.run(&["worker", "--help"]);
    assert!(help.status.success());
    assert!(!String::from_utf8_lossy(&help.stdout).contains("--fault"));
    let refused = cli.run(&["worker", "--fault", "hang-after-claim"]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
}

/// Every command's `--help` (and every subcommand's) ends with its page of the book, and the
/// page is there.
#[test]
fn every_commands_help_ends_with_a_page_of_the_book_that_exists() {
    let help = |args: &[&str]| -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_turnpike"))
            .args(args)
            .arg("--help")
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    // The commands a help lists, under its "Commands:" heading (not `help` itself).
    let commands = |text: &str| -> Vec<String> {
        text.lines()
            .skip_while(|l| !l.starts_with("Commands:"))
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .filter(|c| c != "help")
            .collect()
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let check = |args: &[&str]| {
        let text = help(args);
        let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap();
        let page = last
            .strip_prefix("The book: ")
            .unwrap_or_else(|| panic!("{args:?} ends with {last:?}"));
        let page = page.split_whitespace().next().unwrap();
        assert!(root.join(page).is_file(), "{args:?}: {page} is not a page");
        text
    };
    let top = commands(&check(&[]));
    assert!(top.len() > 10, "{top:?}");
    for command in &top {
        let text = check(&[command]);
        for sub in commands(&text) {
            check(&[command, &sub]);
        }
    }
}
