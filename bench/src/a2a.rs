//! `turnpike bench a2a`: the A2A edge beside the REST API, over `turnpike serve`'s stack in one
//! process on loopback (the embedded bus, one worker, the demo app's scripted model, which
//! streams its reply word by word).
//!
//! - time to first token: REST (post a message, first `delta` on the conversation's WebSocket)
//!   against A2A `SendStreamingMessage` (first streamed piece of the reply), one conversation at
//!   a time, the same agent;
//! - time to the whole reply: REST (post, then the turn's `turn_complete` row) against a
//!   blocking A2A `SendMessage`;
//! - submissions per second at N clients: REST messages accepted (202) against A2A tasks
//!   accepted (`SendMessage` with `returnImmediately`), the workers running the turns meanwhile.

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use futures::StreamExt as _;
use serde_json::{json, Value};
use turnpike_edge::client::{Client, Cursor};
use turnpike_edge::model::Frame;

use crate::edge::{create, wait_idle, EdgeStack};
use crate::series::percentile_ms;

/// What to run.
pub struct Plan {
    /// Sequential samples of each latency.
    pub rounds: usize,
    /// Submissions in each throughput run.
    pub messages: usize,
    pub clients: usize,
}

/// `turnpike bench a2a` over `stack`.
pub async fn run(stack: EdgeStack, plan: Plan) -> Result<ExitCode> {
    let client = Client::new(&stack.url, &stack.token);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()?;
    let a2a = format!("{}/a2a/demo/assistant", stack.url);

    // Time to first token, one conversation at a time.
    let conv = create(&client).await?;
    let mut stream = client.stream(&conv).await.map_err(anyhow::Error::msg)?;
    let mut cursor = Cursor::new(&conv);
    let (mut rest_first, mut rest_whole) = (Vec::new(), Vec::new());
    for round in 0..plan.rounds {
        let t0 = Instant::now();
        client
            .post(
                &format!("/v1/conversations/{conv}/messages"),
                &json!({"text": format!("hello {round}")}),
            )
            .await
            .map_err(anyhow::Error::msg)?
            .into_ok()
            .map_err(anyhow::Error::msg)?;
        let (mut first, mut done) = (None, None);
        while first.is_none() || done.is_none() {
            match stream.next_within(Duration::from_secs(60)).await {
                Some(Frame::Delta { .. }) if first.is_none() => first = Some(t0.elapsed()),
                Some(Frame::Rows { .. }) => {
                    let rows = cursor.read(&client).await.map_err(anyhow::Error::msg)?;
                    if done.is_none() && rows.iter().any(|r| r["kind"] == "turn_complete") {
                        done = Some(t0.elapsed());
                    }
                }
                Some(_) => {}
                None => return Err(anyhow!("{conv}: the stream ended or stalled")),
            }
        }
        rest_first.extend(first);
        rest_whole.extend(done);
    }
    stream.close().await;

    let context = create(&client).await?;
    let (mut a2a_first, mut a2a_whole) = (Vec::new(), Vec::new());
    for round in 0..plan.rounds {
        let t0 = Instant::now();
        let body = send_body(
            &format!("s{round}"),
            &context,
            "SendStreamingMessage",
            false,
        );
        let response = http
            .post(&a2a)
            .bearer_auth(&stack.token)
            .json(&body)
            .send()
            .await?;
        let mut events = response.bytes_stream();
        let mut buffer = Vec::new();
        let mut first = None;
        'read: while let Some(chunk) = events.next().await {
            buffer.extend_from_slice(&chunk?);
            while let Some(end) = find(&buffer, b"\n\n") {
                let event: Vec<u8> = buffer.drain(..end + 2).collect();
                let text = String::from_utf8_lossy(&event);
                let Some(data) = text.lines().find_map(|l| l.strip_prefix("data:")) else {
                    continue;
                };
                let event: Value = serde_json::from_str(data.trim())?;
                if first.is_none() && event["result"]["artifactUpdate"].is_object() {
                    first = Some(t0.elapsed());
                    break 'read;
                }
            }
        }
        a2a_first.push(first.ok_or_else(|| anyhow!("no streamed piece"))?);
        // Let the turn end before the next (the conversation's lane is one at a time).
        wait_idle(&client, &context).await?;

        let t0 = Instant::now();
        let body = send_body(&format!("b{round}"), &context, "SendMessage", false);
        let answer: Value = http
            .post(&a2a)
            .bearer_auth(&stack.token)
            .json(&body)
            .send()
            .await?
            .json()
            .await?;
        if answer["result"]["task"]["status"]["state"] != "TASK_STATE_COMPLETED" {
            return Err(anyhow!("SendMessage answered {answer}"));
        }
        a2a_whole.push(t0.elapsed());
    }
    let line = |name: &str, rest: &mut Vec<Duration>, a2a: &mut Vec<Duration>| {
        let (r50, r99) = (percentile_ms(rest, 0.5), percentile_ms(rest, 0.99));
        let (a50, a99) = (percentile_ms(a2a, 0.5), percentile_ms(a2a, 0.99));
        println!(
            "{name}: REST p50 {r50:.2} ms, p99 {r99:.2} ms; A2A p50 {a50:.2} ms, p99 {a99:.2} ms; A2A adds p50 {:+.2} ms, p99 {:+.2} ms (×{:.2} / ×{:.2}); {} samples each",
            a50 - r50,
            a99 - r99,
            a50 / r50,
            a99 / r99,
            a2a.len()
        );
    };
    line(
        "first token (REST: message + WebSocket delta; A2A: SendStreamingMessage)",
        &mut rest_first,
        &mut a2a_first,
    );
    line(
        "whole reply (REST: message + turn_complete row; A2A: blocking SendMessage)",
        &mut rest_whole,
        &mut a2a_whole,
    );

    // Throughput: REST messages and A2A tasks accepted per second, at `clients` at once.
    let mut contexts = Vec::new();
    for _ in 0..200 {
        contexts.push(create(&client).await?);
    }
    let contexts = Arc::new(contexts);
    let (c, cs) = (client.clone(), contexts.clone());
    let rest = throughput(plan.messages, plan.clients, move |i| {
        let (client, contexts) = (c.clone(), cs.clone());
        async move {
            let reply = client
                .send(
                    reqwest::Method::POST,
                    &format!(
                        "/v1/conversations/{}/messages",
                        contexts[i % contexts.len()]
                    ),
                    Some(&json!({"text": format!("load {i}")})),
                    Some(&format!("rest-{i}")),
                )
                .await
                .map_err(anyhow::Error::msg)?;
            (reply.status == 202)
                .then_some(())
                .ok_or_else(|| anyhow!("message {i}: {} {:?}", reply.status, reply.body))
        }
    })
    .await?;
    let (h, cs, u, tk) = (
        http.clone(),
        contexts.clone(),
        a2a.clone(),
        stack.token.clone(),
    );
    let tasks = throughput(plan.messages, plan.clients, move |i| {
        let (http, contexts, url, token) = (h.clone(), cs.clone(), u.clone(), tk.clone());
        async move {
            let body = send_body(
                &format!("t{i}"),
                &contexts[i % contexts.len()],
                "SendMessage",
                true,
            );
            let answer: Value = http
                .post(&url)
                .bearer_auth(&token)
                .json(&body)
                .send()
                .await?
                .json()
                .await?;
            answer["result"]["task"]["id"]
                .is_string()
                .then_some(())
                .ok_or_else(|| anyhow!("task {i}: {answer}"))
        }
    })
    .await?;
    println!(
        "accepted at {} clients over 200 conversations, workers running the turns: REST {:.0} messages/s, A2A {:.0} tasks/s (×{:.2}); {} each",
        plan.clients,
        rest,
        tasks,
        tasks / rest,
        plan.messages
    );
    stack.server.abort();
    stack.workers.stop().await;
    Ok(ExitCode::SUCCESS)
}

fn send_body(id: &str, context: &str, method: &str, immediately: bool) -> Value {
    json!({
        "jsonrpc": "2.0", "id": id, "method": method,
        "params": {
            "message": {"messageId": format!("bench-{id}"), "role": "ROLE_USER",
                        "parts": [{"text": format!("hello {id}")}], "contextId": context},
            "configuration": {"returnImmediately": immediately},
        },
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Runs `one(i)` for i in 0..total from `clients` tasks at once; per second.
async fn throughput<F, Fut>(total: usize, clients: usize, one: F) -> Result<f64>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..clients.max(1))
        .map(|_| {
            let (next, one) = (next.clone(), one.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return Ok::<_, anyhow::Error>(());
                    }
                    one(i).await?;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(total as f64 / t0.elapsed().as_secs_f64())
}
