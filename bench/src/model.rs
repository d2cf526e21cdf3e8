//! `turnpike bench model`: what Turnpike adds to a real model, measured beside the model alone.
//!
//! - time to first token: the same request (system prompt, one user message, temperature 0)
//!   straight to the model server, and through Turnpike — a message posted to the API of a
//!   fresh conversation, timed to the first `delta` frame on its WebSocket — interleaved, one
//!   conversation at a time; the difference is what a user feels Turnpike add;
//! - a tool-using turn: accept → `turn_complete` over the API, beside the time its model calls
//!   took (timed by a pass-through in front of the server): the ratio is the turn's cost in
//!   Turnpike's own work (records, tools, workspace, lanes) per unit of model time.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use futures::StreamExt as _;
use serde_json::{json, Value};
use turnpike_edge::client::{Client, Cursor};
use turnpike_edge::model::Frame;

use crate::edge::EdgeStack;

/// The app the benchmark hosts.
pub const APP: &str = "bench-model";
const SYSTEM: &str = "You are a helpful assistant. Answer briefly.";
const QUESTION: &str = "Name three colours of the rainbow.";

/// The `bench-model` app's manifest: `plain` on the server at `url`; `tools` (made to call a
/// tool in its first round, three rounds at most) on `tools_url` (the timing pass-through).
pub fn manifest(url: &str, tools_url: &str, model: &str) -> String {
    format!(
        r#"app = "{APP}"

[agents.plain]
provider = "openai"
model = "{model}"
base_url = "{url}"
api_key_env = ""
system_prompt = "{SYSTEM}"
temperature = 0.0
max_tokens = 16
context_length = 4096
reply_reserve = 512

[agents.tools]
provider = "openai"
model = "{model}"
base_url = "{tools_url}"
api_key_env = ""
system_prompt = "You work with files in the workspace: write them, list them, read them."
tools = ["write_file", "list_files", "read_file"]
tool_choice = "write_file"
temperature = 0.0
max_tokens = 64
max_rounds = 3
context_length = 4096
reply_reserve = 512
"#
    )
}

/// What to run.
pub struct Plan {
    /// The model server's API base (`…/v1`).
    pub url: String,
    /// The model's name there.
    pub model: String,
    pub samples: usize,
    pub turns: usize,
}

/// Time to the first streamed content straight from the server.
async fn direct_first_token(http: &reqwest::Client, plan: &Plan) -> Result<Duration> {
    let body = json!({
        "model": plan.model,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        "stream": true,
        "stream_options": {"include_usage": true},
        "temperature": 0.0,
        "max_tokens": 16,
    });
    let t0 = Instant::now();
    let response = http
        .post(format!("{}/chat/completions", plan.url))
        .json(&body)
        .send()
        .await?
        .error_for_status()?;
    let mut bytes = response.bytes_stream();
    let mut buffer = String::new();
    while let Some(chunk) = bytes.next().await {
        buffer.push_str(&String::from_utf8_lossy(&chunk?));
        for line in buffer.lines() {
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            if v["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
            {
                let first = t0.elapsed();
                // Let the server finish, so the next request does not wait behind this one.
                while bytes.next().await.is_some() {}
                return Ok(first);
            }
        }
    }
    bail!("the server streamed no content")
}

/// A new conversation of `app`'s `agent` over the API; returns its id.
pub(crate) async fn create_in(client: &Client, app: &str, agent: &str) -> Result<String> {
    let reply = client
        .post("/v1/conversations", &json!({"app": app, "agent": agent}))
        .await
        .map_err(anyhow::Error::msg)?
        .into_ok()
        .map_err(anyhow::Error::msg)?;
    Ok(reply["id"].as_str().unwrap_or_default().to_owned())
}

async fn create(client: &Client, agent: &str) -> Result<String> {
    create_in(client, APP, agent).await
}

/// Sends `text` as a message to `conv`.
pub(crate) async fn say(client: &Client, conv: &str, text: &str) -> Result<()> {
    client
        .post(
            &format!("/v1/conversations/{conv}/messages"),
            &json!({ "text": text }),
        )
        .await
        .map_err(anyhow::Error::msg)?
        .into_ok()
        .map_err(anyhow::Error::msg)?;
    Ok(())
}

/// Waits for `turn_complete` on the conversation's rows; returns its outcome.
async fn complete(client: &Client, cursor: &mut Cursor) -> Result<String> {
    complete_within(
        client,
        cursor,
        Duration::from_millis(2),
        Duration::from_secs(300),
    )
    .await
}

/// Waits, looking every `poll`, at most `wait`, for `turn_complete` on the conversation's
/// rows; returns its outcome.
pub(crate) async fn complete_within(
    client: &Client,
    cursor: &mut Cursor,
    poll: Duration,
    wait: Duration,
) -> Result<String> {
    let deadline = Instant::now() + wait;
    loop {
        for row in cursor.read(client).await.map_err(anyhow::Error::msg)? {
            if row["kind"] == "turn_complete" {
                return Ok(row["data"]["outcome"].as_str().unwrap_or("?").to_owned());
            }
        }
        if Instant::now() > deadline {
            bail!("the turn did not complete within {} s", wait.as_secs());
        }
        tokio::time::sleep(poll).await;
    }
}

/// Time to the first `delta` frame through Turnpike, on a fresh conversation.
async fn turnpike_first_token(client: &Client) -> Result<Duration> {
    let conv = create(client, "plain").await?;
    let mut stream = client.stream(&conv).await.map_err(anyhow::Error::msg)?;
    match stream.next_within(Duration::from_secs(10)).await {
        Some(Frame::Ready { .. }) => {}
        other => bail!("the stream did not start: {other:?}"),
    }
    let mut cursor = Cursor::new(&conv);
    cursor.read(client).await.map_err(anyhow::Error::msg)?;
    let t0 = Instant::now();
    say(client, &conv, QUESTION).await?;
    let first = loop {
        match stream.next_within(Duration::from_secs(60)).await {
            Some(Frame::Delta { .. }) => break t0.elapsed(),
            Some(Frame::Closed { reason }) => bail!("the stream closed: {reason}"),
            Some(_) => {}
            None => bail!("no delta within a minute"),
        }
    };
    // Let the turn finish before the next sample.
    complete(client, &mut cursor).await?;
    stream.close().await;
    Ok(first)
}

/// Every model call's duration, as timed by the pass-through.
pub type CallTimes = Arc<Mutex<Vec<Duration>>>;

/// `turnpike bench model` over `stack` (whose `bench-model` app is [`manifest`]); `calls` is
/// what the pass-through in front of the `tools` agent's server timed.
pub async fn run(stack: EdgeStack, plan: Plan, calls: CallTimes) -> Result<ExitCode> {
    let client = Client::new(&stack.url, &stack.token);
    let http = reqwest::Client::new();
    println!(
        "turnpike bench model: {} at {}, {} samples of time to first token, {} tool-using turns",
        plan.model, plan.url, plan.samples, plan.turns
    );
    // Warm both paths (the server's prompt cache, Turnpike's first conversation).
    direct_first_token(&http, &plan).await?;
    turnpike_first_token(&client).await?;
    let (mut direct, mut through) = (Vec::new(), Vec::new());
    for _ in 0..plan.samples {
        direct.push(direct_first_token(&http, &plan).await?);
        through.push(turnpike_first_token(&client).await?);
    }
    let (d50, d99) = (
        crate::series::percentile_ms(&mut direct, 0.5),
        crate::series::percentile_ms(&mut direct, 0.99),
    );
    let (t50, t99) = (
        crate::series::percentile_ms(&mut through, 0.5),
        crate::series::percentile_ms(&mut through, 0.99),
    );
    println!("first token, straight from the server   p50 {d50:>8.2} ms   p99 {d99:>8.2} ms   (the floor)");
    println!("first token, through Turnpike (API, WS) p50 {t50:>8.2} ms   p99 {t99:>8.2} ms");
    println!(
        "added by Turnpike                        p50 {:>8.2} ms   p99 {:>8.2} ms   (goal ≤ 2 ms p50)",
        t50 - d50,
        t99 - d99
    );

    let mut ratios = Vec::new();
    for i in 0..plan.turns {
        let conv = create(&client, "tools").await?;
        let mut cursor = Cursor::new(&conv);
        cursor.read(&client).await.map_err(anyhow::Error::msg)?;
        calls.lock().expect("call times lock").clear();
        let t0 = Instant::now();
        say(
            &client,
            &conv,
            "Write a file notes.txt with a short shopping list, then list the files.",
        )
        .await?;
        let outcome = complete(&client, &mut cursor).await?;
        let turn = t0.elapsed();
        let model: Duration = calls.lock().expect("call times lock").iter().sum();
        let rounds = calls.lock().expect("call times lock").len();
        if rounds == 0 {
            return Err(anyhow!("the turn made no model call"));
        }
        let ratio = turn.as_secs_f64() / model.as_secs_f64();
        println!(
            "tool-using turn {}: {rounds} model calls, {outcome}; turn {:.1} ms, model {:.1} ms: ×{ratio:.3} (Turnpike's share {:.1} ms)",
            i + 1,
            turn.as_secs_f64() * 1e3,
            model.as_secs_f64() * 1e3,
            (turn - model.min(turn)).as_secs_f64() * 1e3
        );
        ratios.push(ratio);
    }
    if !ratios.is_empty() {
        ratios.sort_by(f64::total_cmp);
        println!(
            "tool-using turn time / its model time: median ×{:.3}",
            ratios[ratios.len() / 2]
        );
    }
    stack.server.abort();
    stack.workers.stop().await;
    Ok(ExitCode::SUCCESS)
}

/// A pass-through in front of the model server at `upstream` that times each call from the
/// request to the end of its streamed response. Returns its API base and the times.
pub async fn timing_proxy(
    upstream: &str,
) -> Result<(String, CallTimes, tokio::task::JoinHandle<()>)> {
    use axum::body::{Body, Bytes};
    use axum::extract::State;
    use axum::response::Response;

    #[derive(Clone)]
    struct Up {
        url: String,
        http: reqwest::Client,
        times: CallTimes,
    }
    async fn forward(State(up): State<Up>, body: Bytes) -> Response {
        let t0 = Instant::now();
        let sent = up
            .http
            .post(format!("{}/chat/completions", up.url))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await;
        match sent {
            Ok(r) => {
                let status = r.status().as_u16();
                let times = up.times.clone();
                let mut upstream = r.bytes_stream();
                // Forward chunk by chunk; the call ends with the stream.
                let stream = async_stream(move |tx| async move {
                    while let Some(chunk) = upstream.next().await {
                        if tx.send(chunk.map_err(std::io::Error::other)).await.is_err() {
                            return;
                        }
                    }
                    times.lock().expect("call times lock").push(t0.elapsed());
                });
                Response::builder()
                    .status(status)
                    .header("content-type", "text/event-stream")
                    .body(Body::from_stream(stream))
                    .expect("a response")
            }
            Err(e) => Response::builder()
                .status(502)
                .body(Body::from(e.to_string()))
                .expect("a response"),
        }
    }
    let times: CallTimes = Default::default();
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(forward))
        .with_state(Up {
            url: upstream.trim_end_matches('/').to_owned(),
            http: reqwest::Client::new(),
            times: times.clone(),
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/v1", listener.local_addr()?);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((url, times, task))
}

/// A stream fed by a task through a channel.
fn async_stream<F, Fut>(
    f: F,
) -> impl futures::Stream<Item = std::result::Result<bytes::Bytes, std::io::Error>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<std::result::Result<bytes::Bytes, std::io::Error>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(f(tx));
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
}
