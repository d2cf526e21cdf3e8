//! `turnpike bench edge`: the HTTP/WebSocket edge over `turnpike serve`'s stack, in one process
//! on loopback: the embedded bus, one worker, the demo app's scripted model (it streams its
//! reply word by word).
//!
//! - accept → first streamed token: a client posts a message and times the first `delta` frame
//!   on the conversation's WebSocket, at 1 and at N concurrent conversations; beside it, the
//!   same path in process (ingress + the live subscription, no HTTP) as the baseline;
//! - messages accepted per second at the edge (202s), many clients over many conversations,
//!   beside in-process ingress on the same bus.

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use futures::StreamExt as _;
use serde_json::json;
use turnpike_edge::client::{Client, Cursor, FrameStream};
use turnpike_edge::model::Frame;
use turnpike_router::{Bus, Ingress};
use turnpike_schemas::live::LiveFrame;
use turnpike_schemas::{ConversationId, EventBody, Identity};
use turnpike_worker::WorkerPool;

/// What to run.
pub struct Plan {
    pub conversations: Vec<usize>,
    pub rounds: usize,
    pub messages: usize,
    pub clients: usize,
    /// Stop the workers before the throughput run.
    pub accept_only: bool,
}

/// The stack under test, which the caller starts: an edge serving on loopback over a bus with
/// workers running the demo app's scripted model.
pub struct EdgeStack {
    /// The edge's base URL.
    pub url: String,
    /// A token the edge accepts, for `owner`.
    pub token: String,
    pub owner: Identity,
    pub bus: Arc<dyn Bus>,
    /// Ingress on the same bus and store: the in-process floor.
    pub ingress: Ingress,
    pub workers: WorkerPool,
    /// The task serving the edge; aborted at the end.
    pub server: tokio::task::JoinHandle<()>,
}

/// `turnpike bench edge` over `stack`.
pub async fn run(stack: EdgeStack, plan: Plan) -> Result<ExitCode> {
    let EdgeStack {
        url,
        token,
        owner,
        bus,
        ingress,
        workers: pool,
        server,
    } = stack;
    let client = Client::new(&url, &token);
    // Baseline: the same path in process.
    let mut base = Vec::new();
    let conv = create(&client).await?;
    let conversation: ConversationId = conv.parse()?;
    for round in 0..30 {
        let mut live = bus.subscribe_live(conversation).await?;
        let t0 = Instant::now();
        ingress
            .submit(
                &"default".parse()?,
                &owner,
                conversation,
                EventBody::Message {
                    text: format!("hello {round}"),
                },
                None,
            )
            .await?;
        loop {
            let frame = tokio::time::timeout(Duration::from_secs(30), live.next())
                .await
                .map_err(|_| anyhow!("no delta within 30 s"))?
                .ok_or_else(|| anyhow!("the live stream ended"))?;
            if let Ok(LiveFrame::Delta { .. }) = serde_json::from_slice(&frame) {
                base.push(t0.elapsed());
                break;
            }
        }
        wait_idle(&client, &conv).await?;
    }
    let (b50, b99) = (
        crate::series::percentile_ms(&mut base, 0.5),
        crate::series::percentile_ms(&mut base, 0.99),
    );
    println!("in process (ingress + live subscription): accept → first token p50 {b50:.2} ms, p99 {b99:.2} ms ({} samples)", base.len());

    for &n in &plan.conversations {
        let rounds = if plan.rounds > 0 {
            plan.rounds
        } else {
            (60 / n.max(1)).clamp(3, 50)
        };
        let (mut accept, mut first) = latency(&client, n.max(1), rounds).await?;
        let (f50, f99) = (
            crate::series::percentile_ms(&mut first, 0.5),
            crate::series::percentile_ms(&mut first, 0.99),
        );
        println!(
            "over the API, {n} concurrent conversation(s): accept → first token p50 {f50:.2} ms, p99 {f99:.2} ms (×{:.2} / ×{:.2} the in-process baseline); accept (202) p50 {:.2} ms, p99 {:.2} ms; {} samples",
            f50 / b50,
            f99 / b99,
            crate::series::percentile_ms(&mut accept, 0.5),
            crate::series::percentile_ms(&mut accept, 0.99),
            first.len()
        );
    }

    // Throughput at the edge, beside in-process ingress.
    let targets: Vec<String> = {
        let mut v = Vec::new();
        for _ in 0..200 {
            v.push(create(&client).await?);
        }
        v
    };
    let ids: Vec<ConversationId> = targets
        .iter()
        .map(|t| t.parse())
        .collect::<Result<_, _>>()?;
    let pool = if plan.accept_only {
        pool.stop().await;
        None
    } else {
        Some(pool)
    };
    let meanwhile = if plan.accept_only {
        "no workers running"
    } else {
        "workers running the turns meanwhile"
    };
    let t0 = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..plan.clients)
        .map(|_| {
            let (ingress, owner, ids, next) =
                (ingress.clone(), owner.clone(), ids.clone(), next.clone());
            let total = plan.messages;
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return Ok::<_, anyhow::Error>(());
                    }
                    ingress
                        .submit(
                            &"default".parse()?,
                            &owner,
                            ids[i % ids.len()],
                            EventBody::Message {
                                text: format!("load {i}"),
                            },
                            Some(format!("direct-{i}")),
                        )
                        .await?;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    let direct = plan.messages as f64 / t0.elapsed().as_secs_f64();
    println!(
        "in process: {direct:.0} messages accepted/s ({} messages, {} submitters, {meanwhile})",
        plan.messages, plan.clients
    );

    let t0 = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..plan.clients)
        .map(|_| {
            let (client, targets, next) = (client.clone(), targets.clone(), next.clone());
            let total = plan.messages;
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return Ok::<_, anyhow::Error>(latencies);
                    }
                    let t = Instant::now();
                    let reply = client
                        .send(
                            reqwest::Method::POST,
                            &format!("/v1/conversations/{}/messages", targets[i % targets.len()]),
                            Some(&json!({"text": format!("load {i}")})),
                            Some(&format!("edge-{i}")),
                        )
                        .await
                        .map_err(anyhow::Error::msg)?;
                    if reply.status != 202 {
                        return Err(anyhow!("message {i}: {} {:?}", reply.status, reply.body));
                    }
                    latencies.push(t.elapsed());
                }
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await??);
    }
    let over_api = plan.messages as f64 / t0.elapsed().as_secs_f64();
    println!(
        "over the API: {over_api:.0} messages accepted/s (×{:.2} in-process), 202 in p50 {:.2} ms, p99 {:.2} ms ({} messages, {} clients, {} conversations, {meanwhile})",
        over_api / direct,
        crate::series::percentile_ms(&mut latencies, 0.5),
        crate::series::percentile_ms(&mut latencies, 0.99),
        plan.messages,
        plan.clients,
        targets.len()
    );
    server.abort();
    if let Some(pool) = pool {
        pool.stop().await;
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn create(client: &Client) -> Result<String> {
    let reply = client
        .post(
            "/v1/conversations",
            &json!({"app": "demo", "agent": "assistant"}),
        )
        .await
        .map_err(anyhow::Error::msg)?
        .into_ok()
        .map_err(anyhow::Error::msg)?;
    Ok(reply["id"].as_str().unwrap_or_default().to_owned())
}

/// Waits until the conversation has no turn running and nothing waiting on its lane.
pub(crate) async fn wait_idle(client: &Client, conv: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let view = client
            .get(&format!("/v1/conversations/{conv}"))
            .await
            .map_err(anyhow::Error::msg)?
            .body;
        let messages = view["messages"].as_u64().unwrap_or(0);
        if view["status"] == "idle" && view["turns"].as_u64() == Some(messages) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(anyhow!("{conv} did not settle: {view}"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `n` conversations, each sending `rounds` messages one after another (all conversations at
/// once): (accept latencies, first-token latencies).
async fn latency(
    client: &Client,
    n: usize,
    rounds: usize,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let mut convs = Vec::new();
    for _ in 0..n {
        let conv = create(client).await?;
        let stream = client.stream(&conv).await.map_err(anyhow::Error::msg)?;
        convs.push((conv, stream));
    }
    let tasks: Vec<_> = convs
        .into_iter()
        .map(|(conv, stream)| {
            let client = client.clone();
            tokio::spawn(async move { one_conversation(client, conv, stream, rounds).await })
        })
        .collect();
    let (mut accept, mut first) = (Vec::new(), Vec::new());
    for t in tasks {
        let (a, f) = t.await??;
        accept.extend(a);
        first.extend(f);
    }
    Ok((accept, first))
}

async fn one_conversation(
    client: Client,
    conv: String,
    mut stream: FrameStream,
    rounds: usize,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let (mut accept, mut first) = (Vec::new(), Vec::new());
    let mut cursor = Cursor::new(&conv);
    for round in 0..rounds {
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
        accept.push(t0.elapsed());
        let mut got_first = false;
        let mut done = 0;
        // Until the turn completed and its first delta was seen (deltas are advisory and may
        // arrive after the turn's last row).
        while done == 0 || !got_first {
            match stream.next_within(Duration::from_secs(60)).await {
                Some(Frame::Delta { .. }) if !got_first => {
                    first.push(t0.elapsed());
                    got_first = true;
                }
                Some(Frame::Rows { .. }) => {
                    let rows = cursor.read(&client).await.map_err(anyhow::Error::msg)?;
                    done += rows.iter().filter(|r| r["kind"] == "turn_complete").count();
                }
                Some(_) => {}
                None => return Err(anyhow!("{conv}: the stream ended or stalled")),
            }
        }
    }
    Ok((accept, first))
}
