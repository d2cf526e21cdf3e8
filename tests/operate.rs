//! Operating a deployment: the admin listener's `/metrics` scrape is valid Prometheus text
//! (checked by `promtool`), moves with the work done, and has as many series after many
//! conversations as after a few; `/livez` answers. (Readiness against a stopped bus and the
//! drain on SIGTERM are in `lanes.rs`, beside the fleet they need.)

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use turnpike_edge::client::Client;
use turnpike_tests::edge::{create, say, wait_for_complete_turns, Server, ALICE};

const LONG: Duration = Duration::from_secs(90);

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_turnpike"))
}

async fn scrape(admin: &Client) -> String {
    let (status, body) = admin.bytes("/metrics", false).await.unwrap();
    assert_eq!(status, 200);
    String::from_utf8(body).unwrap()
}

/// Every series of a scrape: its name and labels, without the value.
fn series(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s.to_owned()))
        .collect()
}

/// The value of one series (`name{labels}` exactly as scraped), or 0 when absent.
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

fn promtool(text: &str) {
    use std::io::Write as _;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; scripts/services installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `n` conversations with one answered message each.
async fn conversations(client: &Client, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = create(client, "demo", "assistant").await;
        say(client, &id, &format!("hello number {i}")).await;
        ids.push(id);
    }
    for id in &ids {
        wait_for_complete_turns(client, id, 1, LONG).await.unwrap();
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_scrape_is_valid_moves_with_the_work_and_does_not_grow_with_conversations() {
    let port = turnpike_tests::services::free_port().unwrap();
    let listen = format!("127.0.0.1:{port}");
    let server = Server::start(&binary(), None, &["--admin-listen", &listen], false).unwrap();
    let admin = Client::new(&format!("http://{listen}"), "");
    let (status, live) = admin.bytes("/livez", false).await.unwrap();
    assert_eq!((status, live.as_slice()), (200, b"ok".as_slice()));
    let alice = server.client(ALICE);

    conversations(&alice, 2).await;
    let first = scrape(&admin).await;
    promtool(&first);
    assert_eq!(
        value(&first, r#"turnpike_turns_total{outcome="replied"}"#),
        2.0
    );
    assert_eq!(
        value(&first, r#"turnpike_submissions_total{kind="message"}"#),
        2.0
    );
    assert_eq!(
        value(&first, "turnpike_turn_schedule_to_start_seconds_count"),
        2.0
    );
    assert_eq!(
        value(
            &first,
            r#"turnpike_turn_duration_seconds_count{outcome="replied"}"#
        ),
        2.0
    );
    assert_eq!(value(&first, "turnpike_worker_slots"), 64.0);
    // The demo's scripted model streams its replies: each call's first text is timed.
    let first_tokens: f64 = first
        .lines()
        .filter(|l| l.starts_with("turnpike_model_time_to_first_token_seconds_count{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert!(first_tokens >= 2.0, "{first}");
    assert!(
        value(
            &first,
            r#"turnpike_http_request_duration_seconds_count{route="/v1/conversations/{id}/messages",method="POST",status="202"}"#
        ) >= 2.0,
        "{first}"
    );
    // Histograms have buckets; there are no summaries.
    assert!(first.contains("turnpike_record_append_seconds_bucket{le="));
    assert!(!first.contains("quantile="), "{first}");

    // Four more conversations: the counters move, the series stay the same.
    conversations(&alice, 4).await;
    let second = scrape(&admin).await;
    promtool(&second);
    assert_eq!(
        value(&second, r#"turnpike_turns_total{outcome="replied"}"#),
        6.0
    );
    assert_eq!(
        value(&second, "turnpike_turn_schedule_to_start_seconds_count"),
        6.0
    );
    let bounded = |s: &BTreeSet<String>| -> BTreeSet<String> {
        // Whether a claim ever found its lease held is timing, not growth.
        s.iter()
            .filter(|s| !s.starts_with("turnpike_lease_claims_total"))
            .cloned()
            .collect()
    };
    assert_eq!(bounded(&series(&second)), bounded(&series(&first)));
    for s in series(&second) {
        for leak in ["conv_", "local:", "evt_", "wkr_"] {
            assert!(!s.contains(leak), "a label grows with the data: {s}");
        }
    }
    // The slots are free again once the turns are done.
    let deadline = std::time::Instant::now() + LONG;
    loop {
        let text = scrape(&admin).await;
        assert!(text.contains("\nturnpike_worker_slots_used "), "{text}");
        if value(&text, "turnpike_worker_slots_used") == 0.0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "slots stayed used");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `turnpike_*` metric names in `text`, without histogram suffixes.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("turnpike_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_lowercase() || bytes[end] == b'_') {
            end += 1;
        }
        let name = &text[start..end];
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        names.insert(base.to_owned());
        i = end;
    }
    names
}

#[test]
fn the_alerts_and_the_dashboard_use_only_metrics_the_binary_describes() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let alerts = root.join("deploy/prometheus/alerts.yaml");
    let out = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&alerts)
        .output()
        .expect("promtool");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let described =
        metric_names(&std::fs::read_to_string(root.join("src/commands/admin.rs")).unwrap());
    let dashboard = std::fs::read_to_string(root.join("deploy/grafana/turnpike.json")).unwrap();
    let parsed: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
    assert!(!parsed["panels"].as_array().unwrap().is_empty());
    for (file, text) in [
        ("alerts.yaml", std::fs::read_to_string(&alerts).unwrap()),
        ("turnpike.json", dashboard),
    ] {
        let used = metric_names(&text);
        assert!(!used.is_empty(), "{file} uses no metric");
        for name in used {
            assert!(
                described.contains(&name),
                "{file} uses {name}, which the binary does not export"
            );
        }
    }
}
