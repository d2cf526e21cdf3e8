//! The configuration file: every flag of `serve`, `router` and `worker` can be set in it;
//! flags beat the environment, which beats the file, which beats the defaults; a bad file is
//! refused at start with the file, the key and the reason; `config show` redacts passwords.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_turnpike"))
}

/// `turnpike` with only the environment the test gives it.
fn turnpike(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut command = Command::new(binary());
    command.args(args);
    for (key, _) in std::env::vars() {
        if key.starts_with("TURNPIKE_") || key.starts_with("AWS_") {
            command.env_remove(key);
        }
    }
    command.envs(envs.iter().copied());
    command.output().unwrap()
}

/// `config show --for command --json` with `config` (a file), as (key → (values, source)).
fn show(
    config: Option<&Path>,
    before: &[&str],
    command: &str,
    envs: &[(&str, &str)],
) -> Vec<Value> {
    let mut args: Vec<String> = Vec::new();
    if let Some(config) = config {
        args.extend(["--config".into(), config.display().to_string()]);
    }
    args.extend(before.iter().map(|s| s.to_string()));
    args.extend(["config", "show", "--for", command, "--json"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = turnpike(&args, envs);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn setting<'a>(shown: &'a [Value], key: &str) -> &'a Value {
    shown
        .iter()
        .find(|s| s["key"] == key)
        .unwrap_or_else(|| panic!("no {key} in {shown:?}"))
}

/// A value for a flag that has none by default.
fn sample(key: &str) -> toml::Value {
    let s = |v: &str| toml::Value::String(v.into());
    match key {
        "store" => s("memory://"),
        "local-store" => s("sqlite"),
        "nats-url" => s("nats://127.0.0.1:4222"),
        "database-url" => s("postgres://app:secret@127.0.0.1:5432/turnpike"),
        "embeddings-url" => s("http://127.0.0.1:9/v1"),
        "log" => s("warn"),
        "admin" | "required-approver" => s("local:ops"),
        "trusted-key" => s(&"ab".repeat(32)),
        "max-rounds" => toml::Value::Integer(3),
        "blocking-threads" => toml::Value::Integer(16),
        "git-remote" => s("/tmp/mirror.git"),
        "otlp-endpoint" => s("http://127.0.0.1:4318"),
        "budget" => toml::Value::Array(vec![
            "app=demo:tokens=100000".into(),
            "tenant=acme:usd=2.5".into(),
        ]),
        _ => s("/tmp/some-file"),
    }
}

#[test]
fn every_flag_of_serve_router_and_worker_can_be_set_in_the_file() {
    let dir = tempfile::tempdir().unwrap();
    for command in ["serve", "router", "worker"] {
        let defaults = show(None, &[], command, &[]);
        assert!(defaults.len() > 10, "{defaults:?}");
        let mut file = toml::Table::new();
        for s in &defaults {
            let key = s["key"].as_str().unwrap().to_owned();
            let values: Vec<&str> = s["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            let value = match values.as_slice() {
                [] => sample(&key),
                // A switch: set it.
                ["false"] => toml::Value::Boolean(true),
                [one] => toml::Value::String(one.to_string()),
                many => toml::Value::Array(many.iter().map(|v| (*v).into()).collect()),
            };
            file.insert(key, value);
        }
        let path = dir.path().join(format!("{command}.toml"));
        std::fs::write(&path, toml::to_string(&file).unwrap()).unwrap();
        for s in show(Some(&path), &[], command, &[]) {
            assert_eq!(s["source"], "file", "{command}: {s}");
        }
    }
}

#[test]
fn flags_beat_the_environment_which_beats_the_file_which_beats_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("turnpike.toml");
    std::fs::write(
        &path,
        "slots = 7\nadmin-listen = \"127.0.0.1:1111\"\nlease_ttl_ms = 9000\ndatabase-url = \"postgres://app:hunter2@db/turnpike\"\n",
    )
    .unwrap();
    let env = [("TURNPIKE_ADMIN_LISTEN", "127.0.0.1:2222")];
    let shown = show(Some(&path), &[], "worker", &env);
    assert_eq!(setting(&shown, "slots")["values"][0], "7");
    assert_eq!(setting(&shown, "slots")["source"], "file");
    assert_eq!(setting(&shown, "lease-ttl-ms")["values"][0], "9000");
    assert_eq!(
        setting(&shown, "admin-listen")["values"][0],
        "127.0.0.1:2222"
    );
    assert_eq!(setting(&shown, "admin-listen")["source"], "env");
    assert_eq!(setting(&shown, "grace-ms")["source"], "default");
    // Secrets are not shown.
    let url = setting(&shown, "database-url")["values"][0]
        .as_str()
        .unwrap();
    assert!(
        !url.contains("hunter2") && url.contains("REDACTED"),
        "{url}"
    );
    let shown = show(
        Some(&path),
        &["--admin-listen", "127.0.0.1:3333"],
        "worker",
        &env,
    );
    assert_eq!(
        setting(&shown, "admin-listen")["values"][0],
        "127.0.0.1:3333"
    );
    assert_eq!(setting(&shown, "admin-listen")["source"], "flag");
    // The file also comes from TURNPIKE_CONFIG.
    let shown = show(
        None,
        &[],
        "worker",
        &[("TURNPIKE_CONFIG", path.to_str().unwrap())],
    );
    assert_eq!(setting(&shown, "slots")["values"][0], "7");
}

#[test]
fn a_default_that_depends_on_the_command_is_shown_as_the_command_would_run() {
    let blocking = |before: &[&str], command: &str| {
        let shown = show(None, before, command, &[]);
        let s = setting(&shown, "blocking-threads");
        (
            s["values"][0].as_str().unwrap().to_owned(),
            s["source"].as_str().unwrap().to_owned(),
        )
    };
    assert_eq!(blocking(&[], "router"), ("8".into(), "default".into()));
    assert_eq!(blocking(&[], "worker"), ("64".into(), "default".into()));
    assert_eq!(
        blocking(&["--blocking-threads", "12"], "router"),
        ("12".into(), "flag".into())
    );
}

#[test]
fn a_bad_file_is_refused_at_start_with_the_file_the_key_and_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    for (text, key, reason) in [
        ("sloths = 7\n", "sloths", "not a setting"),
        ("slots = \"many\"\n", "slots", "invalid value"),
        ("slots = { n = 1 }\n", "slots", "is not a value"),
        ("no-fsync = \"perhaps\"\n", "no-fsync", "true or false"),
        (
            "budget = [\"app=demo:euros=5\"]\n",
            "budget",
            "SCOPE=ID:LIMIT=N",
        ),
        ("slots = 7\nslots = 8\n", "", "duplicate key"),
        ("slots = \n", "line 1", ""),
        // The offending line is not echoed: it may hold a secret.
        ("slots = 7\nnats-password = \"hunter2\n", "line 2", ""),
    ] {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, text).unwrap();
        let data = dir.path().join("data");
        let out = turnpike(
            &[
                "--config",
                path.to_str().unwrap(),
                "--data-dir",
                data.to_str().unwrap(),
                "serve",
            ],
            &[],
        );
        assert_eq!(out.status.code(), Some(2), "{text}");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            said.contains(&format!("config file {}", path.display())),
            "{text}: {said}"
        );
        assert!(
            said.contains(key) && said.contains(reason),
            "{text}: {said}"
        );
        assert!(!data.exists(), "{text}: nothing ran");
    }
}

#[test]
fn a_process_runs_with_the_settings_of_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let port = turnpike_tests::services::free_port().unwrap();
    let path = dir.path().join("turnpike.toml");
    std::fs::write(
        &path,
        format!(
            "listen = \"127.0.0.1:{port}\"\ndata-dir = \"{}\"\nembedding-model = \"/nonexistent\"\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let mut process = turnpike_tests::process::Process::start(
        &binary(),
        &["serve".to_owned()],
        &[("TURNPIKE_CONFIG", path.display().to_string())],
    )
    .unwrap();
    let line = process
        .wait_for_line("API listening on", Duration::from_secs(60))
        .unwrap();
    assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
    assert!(dir.path().join("data/store").exists());
}
