//! `turnpike bench webhooks`: outbound webhook deliveries per second against a local
//! receiver. N deliveries of an app-wide webhook are enqueued (the outbox, as turns' ends write
//! it), then dispatchers in this process — 1 and W of them, sharing the delivery shards under
//! the embedded bus's leases — deliver them: each read from the store, its address checked,
//! signed, POSTed, and noted delivered. The floor, in the same run: the same signed POST sent N
//! times by a bare HTTP client at the same concurrency, with nothing read or written.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use turnpike_artifactory::webhooks::{Delivery, Message, SigningSecret, Subscriber};
use turnpike_artifactory::Webhooks;
use turnpike_router::bus::now_ms;
use turnpike_router::embedded::{EmbeddedBus, EmbeddedConfig};
use turnpike_router::Bus;
use turnpike_schemas::webhook::EventKind;
use turnpike_worker::webhooks::{Dispatcher, WebhookConfig};

/// What to run.
pub struct Plan {
    pub deliveries: usize,
    /// Dispatcher counts to measure.
    pub dispatchers: Vec<usize>,
    /// Deliveries in flight per shard (and the floor's concurrency).
    pub concurrency: usize,
}

/// The receiver: answers 200 to every POST and counts them.
async fn receiver() -> Result<(u16, Arc<AtomicU64>)> {
    let count = Arc::new(AtomicU64::new(0));
    let counted = count.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |_body: bytes::Bytes| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::Relaxed);
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((port, count))
}

const SECRET_ENV: &str = "TURNPIKE_BENCH_WEBHOOK_SECRET";
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

pub async fn run(plan: Plan) -> Result<ExitCode> {
    // The dispatcher reads an app webhook's secret from the environment, as deployed.
    // SAFETY: set once, before any thread of this benchmark reads the environment.
    unsafe { std::env::set_var(SECRET_ENV, SECRET) };
    let (port, received) = receiver().await?;
    let url = format!("http://127.0.0.1:{port}/hook");
    println!(
        "turnpike bench webhooks: {} deliveries of an app's webhook to a local receiver (axum, answers 204), {} in flight per shard; the store: the embedded default's (SQLite)",
        plan.deliveries, plan.concurrency
    );
    let floor = floor(&url, plan.deliveries, plan.concurrency).await?;
    println!(
        "\n{:>11} {:>11} {:>14} {:>9}",
        "dispatchers", "deliveries", "deliveries/s", "of floor"
    );
    println!(
        "{:>11} {:>11} {:>14.0} {:>9}",
        "floor", plan.deliveries, floor, "1.00"
    );
    for &n in &plan.dispatchers {
        let rate = measure(&plan, n.max(1), &url, &received).await?;
        println!(
            "{:>11} {:>11} {:>14.0} {:>9.2}",
            n,
            plan.deliveries,
            rate,
            rate / floor
        );
    }
    println!("\nfloor: the same signed POST by a bare HTTP client at the same concurrency, nothing read or written; dispatchers: each delivery read from the store, its address resolved and checked, signed, POSTed and deleted once answered");
    Ok(ExitCode::SUCCESS)
}

/// Bare POSTs per second.
async fn floor(url: &str, n: usize, concurrency: usize) -> Result<f64> {
    use futures::StreamExt as _;
    let client = reqwest::Client::new();
    let secret = SigningSecret::parse(SECRET)?;
    let body = br#"{"type":"turn.completed","timestamp":"2026-01-01T00:00:00Z","data":{}}"#;
    let started = Instant::now();
    let sent: Vec<bool> = futures::stream::iter(0..n)
        .map(|i| {
            let client = client.clone();
            let id = format!("msg_{i}");
            let signature = secret.sign(&id, now_ms() / 1000, body);
            async move {
                client
                    .post(url)
                    .header("content-type", "application/json")
                    .header("webhook-id", id)
                    .header("webhook-timestamp", (now_ms() / 1000).to_string())
                    .header("webhook-signature", signature)
                    .body(&body[..])
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    anyhow::ensure!(
        sent.iter().all(|ok| *ok),
        "the receiver refused a bare POST"
    );
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Deliveries per second with `dispatchers` dispatchers.
async fn measure(
    plan: &Plan,
    dispatchers: usize,
    url: &str,
    received: &Arc<AtomicU64>,
) -> Result<f64> {
    let dir = tempfile::tempdir()?;
    let bus: Arc<dyn Bus> =
        EmbeddedBus::open(&dir.path().join("bus.redb"), EmbeddedConfig::default())?;
    let store = turnpike_artifactory::open_store(&format!(
        "sqlite://{}",
        dir.path().join("store.db").display()
    ))?;
    let webhooks = Webhooks::new(store, None);
    // Enqueued first, as turns' ends would have: the measure is the delivery alone.
    let at = now_ms();
    {
        use futures::StreamExt as _;
        let enqueued: Vec<Result<()>> = futures::stream::iter(0..plan.deliveries)
            .map(|i| {
                let webhooks = webhooks.clone();
                async move {
                    let delivery = Delivery::new(
                        "bench".parse()?,
                        Subscriber::App {
                            app: "bench".parse()?,
                            name: "out".into(),
                            url: url.to_owned(),
                            secret_env: SECRET_ENV.into(),
                        },
                        Message {
                            id: format!("msg_{i:08}"),
                            kind: EventKind::TurnCompleted,
                            at_ms: at,
                            data: serde_json::json!({"turn": i}),
                        },
                    );
                    webhooks.enqueue(&delivery, at).await?;
                    Ok(())
                }
            })
            .buffer_unordered(64)
            .collect()
            .await;
        enqueued.into_iter().collect::<Result<Vec<()>>>()?;
    }
    let before = received.load(Ordering::Relaxed);
    let peers = Arc::new(AtomicUsize::new(dispatchers));
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let tasks: Vec<_> = (0..dispatchers)
        .map(|_| {
            let dispatcher = Dispatcher::new(
                bus.clone(),
                webhooks.clone(),
                turnpike_agent::outbound::Outbound::parse(&["127.0.0.1".into()])
                    .expect("an address"),
                turnpike_schemas::WorkerId::new(),
                WebhookConfig {
                    concurrency: plan.concurrency,
                    tick: Duration::from_millis(50),
                    ..WebhookConfig::default()
                },
                peers.clone(),
                Arc::new(tokio::sync::Notify::new()),
            );
            tokio::spawn(dispatcher.run(stopping.clone()))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(600);
    while received.load(Ordering::Relaxed) - before < plan.deliveries as u64 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "not every delivery arrived within 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    let _ = stop.send(true);
    for t in tasks {
        let _ = t.await;
    }
    Ok(plan.deliveries as f64 / elapsed.as_secs_f64())
}
