//! `turnpike bench remote`: what a remote app costs a turn. The floor is a no-op turn of the
//! built-in loop (the `echo` model); beside it, the same turn run by a remote app (an
//! in-process HTTP app that says one thing and is done), and a turn whose app streams many
//! `say` actions, for the cost of one action.

use std::convert::Infallible;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use axum::body::Body;
use axum::extract::Json;
use axum::routing::post;
use serde_json::Value;
use turnpike_edge::client::{Client, Cursor};

use crate::edge::EdgeStack;

/// The app the benchmark hosts.
pub const APP: &str = "bench-remote";

/// The manifest: `builtin` (the agent loop, echo model) and `remote` (the app at `url`).
pub fn manifest(url: &str) -> String {
    format!(
        r#"app = "{APP}"

[agents.builtin]
provider = "echo"

[agents.remote]
provider = "echo"
[agents.remote.remote]
url = "{url}"
max_actions = 100000
"#
    )
}

/// An app that answers `say N` with N `say` actions (and anything else with one), then `done`.
pub async fn app_server() -> Result<(String, tokio::task::JoinHandle<()>)> {
    async fn turn(Json(context): Json<Value>) -> axum::response::Response {
        let said = context["inputs"][0]["text"].as_str().unwrap_or_default();
        let n: usize = said
            .strip_prefix("say ")
            .and_then(|n| n.parse().ok())
            .unwrap_or(1);
        let lines = (0..n)
            .map(|i| format!("{{\"type\":\"say\",\"text\":\"w{i} \"}}\n"))
            .chain(std::iter::once("{\"type\":\"done\"}\n".to_owned()))
            .map(Ok::<_, Infallible>);
        axum::response::Response::builder()
            .header("content-type", "application/x-ndjson")
            .body(Body::from_stream(futures::stream::iter(lines)))
            .expect("a response")
    }
    let app = axum::Router::new().route("/v1/turns", post(turn)).route(
        "/v1/turns/{id}/messages",
        post(|| async { axum::http::StatusCode::NO_CONTENT }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(async move {
        // Each action is written as it is made: no waiting for the worker's ACK (Nagle).
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let _ = axum::serve(listener, app).await;
    });
    Ok((url, server))
}

/// One turn on a fresh conversation of `agent`: from the message's submission to its
/// `turn_complete` row.
async fn turn(client: &Client, agent: &str, text: &str) -> Result<Duration> {
    let conv = crate::model::create_in(client, APP, agent).await?;
    let mut cursor = Cursor::new(&conv);
    cursor.read(client).await.map_err(anyhow::Error::msg)?;
    let t0 = Instant::now();
    crate::model::say(client, &conv, text).await?;
    let outcome = crate::model::complete_within(
        client,
        &mut cursor,
        Duration::from_millis(1),
        Duration::from_secs(120),
    )
    .await?;
    if outcome != "replied" {
        bail!("a {agent} turn ended {outcome}");
    }
    Ok(t0.elapsed())
}

/// Runs the benchmark over `stack` (hosting [`manifest`]): `samples` turns of each kind,
/// alternating, and `streamed` actions in the long turns.
pub async fn run(stack: EdgeStack, samples: usize, streamed: usize) -> Result<ExitCode> {
    let client = Client::new(&stack.url, &stack.token);
    println!("turnpike bench remote: {samples} no-op turns each, built-in loop and remote app; {streamed} streamed actions");
    turn(&client, "builtin", "warm").await?;
    turn(&client, "remote", "warm").await?;
    let (mut builtin, mut remote, mut one, mut many) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..samples {
        builtin.push(turn(&client, "builtin", "hello").await?);
        remote.push(turn(&client, "remote", "hello").await?);
    }
    let runs = (samples / 5).max(3);
    for _ in 0..runs {
        one.push(turn(&client, "remote", "say 1").await?);
        many.push(turn(&client, "remote", &format!("say {streamed}")).await?);
    }
    let (b50, b99) = (
        crate::series::percentile_ms(&mut builtin, 0.5),
        crate::series::percentile_ms(&mut builtin, 0.99),
    );
    let (r50, r99) = (
        crate::series::percentile_ms(&mut remote, 0.5),
        crate::series::percentile_ms(&mut remote, 0.99),
    );
    println!(
        "no-op turn, built-in loop (echo)   p50 {b50:>8.2} ms   p99 {b99:>8.2} ms   (the floor)"
    );
    println!("no-op turn, remote app over HTTP   p50 {r50:>8.2} ms   p99 {r99:>8.2} ms");
    println!(
        "added by the remote app            p50 {:>8.2} ms   p99 {:>8.2} ms   (×{:.2} of the floor at p50)",
        r50 - b50,
        r99 - b99,
        r50 / b50
    );
    let (o50, m50) = (
        crate::series::percentile_ms(&mut one, 0.5),
        crate::series::percentile_ms(&mut many, 0.5),
    );
    println!(
        "streamed actions: 1 in {o50:.2} ms, {streamed} in {m50:.2} ms (p50): {:.1} µs per action",
        (m50 - o50) * 1e3 / (streamed.max(2) - 1) as f64
    );
    stack.server.abort();
    stack.workers.stop().await;
    Ok(ExitCode::SUCCESS)
}
