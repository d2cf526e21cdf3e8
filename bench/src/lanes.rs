//! `turnpike bench lanes`: what turnpike adds over raw JetStream, measured in one run.
//!
//! - the floor: raw JetStream publish → pull-consume latency, and messages per second;
//! - turnpike on JetStream and on the embedded bus: accept (publish acknowledged) → turn start
//!   (the agent is called, after batch one committed), and turns per second over many
//!   conversations, with a no-op agent: from the first publish until the last turn started
//!   (and, reported beside it, until every wake is settled too);
//! - CPU per raw message and per turn over those same stretches: this process's (the bench
//!   client, the router's ingress and the worker) and, when the run started it, the
//!   nats-server's. A turn's CPU over a raw message's says what the rate ratio above can reach
//!   when CPU is what limits both.

use std::collections::HashMap;
use std::net::TcpListener;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use async_nats::jetstream::{self, consumer::pull, stream};
use async_trait::async_trait;
use futures::StreamExt as _;
use turnpike_agent::Turn;
use turnpike_artifactory::{open_store_with, Conversations, NewConversation, RecordSigner};
use turnpike_router::embedded::{EmbeddedBus, EmbeddedConfig};
use turnpike_router::{Bus, Ingress, JetStreamBus, JetStreamConfig};
use turnpike_schemas::entry::TurnOutcome;
use turnpike_schemas::{ConversationId, EventBody, EventId, Identity};
use turnpike_worker::{App, Apps, Worker, WorkerConfig, WorkerPool};

use crate::cpu::{CpuTime, CpuUsed};

/// Records when each turn's agent started, by input event.
#[derive(Default)]
struct Starts {
    at: Mutex<HashMap<EventId, Instant>>,
    notify: tokio::sync::Notify,
}

struct NoopAgent(Arc<Starts>);

#[async_trait]
impl App for NoopAgent {
    async fn on_reactive_event(&self, turn: &dyn Turn) -> turnpike_agent::Result<TurnOutcome> {
        let now = Instant::now();
        let mut at = self.0.at.lock().expect("starts lock");
        for e in turn.inputs() {
            at.entry(e.id).or_insert(now);
        }
        drop(at);
        self.0.notify.notify_waiters();
        Ok(TurnOutcome::Replied)
    }
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort_unstable();
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub(crate) struct Nats {
    child: tokio::process::Child,
    _dir: tempfile::TempDir,
    pub(crate) url: String,
}

/// A nats-server for one run, on a free loopback port (killed when dropped).
pub(crate) async fn start_nats() -> Result<Nats> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let dir = tempfile::tempdir()?;
    let child = tokio::process::Command::new("nats-server")
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting nats-server (scripts/services install, or pass --nats URL)")?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        anyhow::ensure!(Instant::now() < deadline, "nats-server did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(Nats {
        child,
        _dir: dir,
        url: format!("nats://127.0.0.1:{port}"),
    })
}

/// The floor: raw JetStream publish → pull-consume, on a stream of its own named after `name`
/// (on the server a run starts, each measurement begins with an empty stream and a consumer
/// no one pulled from before).
async fn raw_jetstream(
    url: &str,
    name: &str,
    nats_pid: Option<u32>,
    samples: usize,
    burst: usize,
) -> Result<(Vec<Duration>, f64, CpuUsed)> {
    let client = async_nats::connect(url).await?;
    let js = jetstream::new(client);
    let subject = format!("bench.{name}");
    let stream = js
        .get_or_create_stream(stream::Config {
            name: format!("BENCH_{}", name.to_uppercase()),
            subjects: vec![subject.clone()],
            ..Default::default()
        })
        .await?;
    let consumer = stream
        .get_or_create_consumer(
            "bench",
            pull::Config {
                durable_name: Some("bench".into()),
                ..Default::default()
            },
        )
        .await?;
    let mut messages = consumer.messages().await?;
    let mut latencies = Vec::with_capacity(samples);
    for _ in 0..samples {
        let start = Instant::now();
        js.publish(subject.clone(), "x".into()).await?.await?;
        let m = messages.next().await.context("consumer ended")??;
        m.ack().await.map_err(|e| anyhow::anyhow!("{e}"))?;
        latencies.push(start.elapsed());
    }
    let start = Instant::now();
    let cpu = CpuTime::now(nats_pid);
    let publisher = {
        let js = js.clone();
        tokio::spawn(async move {
            // A window of acknowledgements in flight: the client bounds how many it keeps.
            let mut acks = std::collections::VecDeque::with_capacity(256);
            for _ in 0..burst {
                if acks.len() == 256 {
                    let ack: jetstream::context::PublishAckFuture =
                        acks.pop_front().expect("a pending ack");
                    ack.await?;
                }
                acks.push_back(js.publish(subject.clone(), "x".into()).await?);
            }
            for a in acks {
                a.await?;
            }
            anyhow::Ok(())
        })
    };
    for _ in 0..burst {
        let m = messages.next().await.context("consumer ended")??;
        m.ack().await.map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    publisher.await??;
    let rate = burst as f64 / start.elapsed().as_secs_f64();
    Ok((latencies, rate, cpu.until(&CpuTime::now(nats_pid))))
}

struct Measured {
    latencies: Vec<Duration>,
    /// Turns over the time until the last one started.
    turns_per_second: f64,
    /// Turns over the time until every wake was settled.
    settled_per_second: f64,
    /// CPU used from the first message published until every wake was settled.
    cpu: CpuUsed,
}

/// Turnpike on a bus: latency one event at a time, then throughput over many conversations.
#[allow(clippy::too_many_arguments)]
async fn turnpike(
    nats_pid: Option<u32>,
    fsync: bool,
    bus: Arc<dyn Bus>,
    store_location: &str,
    workers: usize,
    samples: usize,
    conversations: usize,
    turns: usize,
) -> Result<Measured> {
    let store = open_store_with(store_location, fsync)?;
    let convs_store = Conversations::new(store);
    let signer = RecordSigner::generate()?;
    let starts = Arc::new(Starts::default());
    let pool = WorkerPool::start((0..workers).map(|_| {
        Worker::new(
            bus.clone(),
            convs_store.clone(),
            signer.clone(),
            Arc::new(Apps::new().with_fallback(Arc::new(NoopAgent(starts.clone())))),
            WorkerConfig::default(),
        )
    }));
    let owner: Identity = "local:bench".parse()?;
    let create = |n: usize| {
        let convs_store = convs_store.clone();
        let signer = signer.clone();
        let owner = owner.clone();
        async move {
            let mut out: Vec<ConversationId> = Vec::with_capacity(n);
            for _ in 0..n {
                let (entry, _, _) = convs_store
                    .create(
                        &signer,
                        NewConversation {
                            tenant: "bench".parse()?,
                            owner: owner.clone(),
                            app: "bench".parse()?,
                            agent: "noop".parse()?,
                            at_ms: 0,
                            instructions: None,
                            started_by: None,
                        },
                    )
                    .await?;
                out.push(entry.conversation);
            }
            anyhow::Ok(out)
        }
    };
    let ingress = Ingress::new(bus.clone(), convs_store.clone());

    // Latency: one event at a time, each on a fresh conversation.
    let convs = create(samples).await?;
    let mut latencies = Vec::with_capacity(samples);
    for conv in &convs {
        let body = EventBody::Message { text: "hi".into() };
        let (event, _) = ingress
            .submit(&"bench".parse()?, &owner, *conv, body, None)
            .await?;
        let accepted = Instant::now();
        loop {
            let notified = starts.notify.notified();
            if let Some(at) = starts.at.lock().expect("starts lock").get(&event.id) {
                latencies.push(at.saturating_duration_since(accepted));
                break;
            }
            tokio::time::timeout(Duration::from_secs(30), notified)
                .await
                .context("a turn never started")?;
        }
    }

    // Throughput: every conversation gets `turns` messages at once.
    let convs = create(conversations).await?;
    let already = starts.at.lock().expect("starts lock").len();
    let start = Instant::now();
    let cpu = CpuTime::now(nats_pid);
    let mut publishers = Vec::new();
    for chunk in convs.chunks(conversations.div_ceil(16).max(1)) {
        let chunk = chunk.to_vec();
        let ingress = ingress.clone();
        let owner = owner.clone();
        publishers.push(tokio::spawn(async move {
            for t in 0..turns {
                for conv in &chunk {
                    let body = EventBody::Message {
                        text: format!("m{t}"),
                    };
                    ingress
                        .submit(&"bench".parse()?, &owner, *conv, body, None)
                        .await?;
                }
            }
            anyhow::Ok(())
        }));
    }
    for p in publishers {
        p.await??;
    }
    let want = already + conversations * turns;
    loop {
        let notified = starts.notify.notified();
        if starts.at.lock().expect("starts lock").len() >= want {
            break;
        }
        tokio::time::timeout(Duration::from_secs(60), notified)
            .await
            .context("turns stalled")?;
    }
    let turns_per_second = (conversations * turns) as f64 / start.elapsed().as_secs_f64();
    // A second clock stops once every wake is settled too, so that work a worker leaves for
    // later (wakes for events its drains already took, some put off for a `busy_delay`) shows.
    let settle_by = Instant::now() + Duration::from_secs(60);
    while bus.unsettled().await?.is_some_and(|n| n > 0) {
        anyhow::ensure!(Instant::now() < settle_by, "wakes were never settled");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let settled_per_second = (conversations * turns) as f64 / start.elapsed().as_secs_f64();
    let cpu = cpu.until(&CpuTime::now(nats_pid));
    pool.stop().await;
    Ok(Measured {
        latencies,
        turns_per_second,
        settled_per_second,
        cpu,
    })
}

/// Runs the benchmark. `store`: the workers' object store (any location `--store` takes, e.g.
/// `memory://` to see what durability costs); default: a fresh local store per bus, a SQLite
/// database with `sqlite`, else a file per object.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    fsync: bool,
    sqlite: bool,
    store: Option<String>,
    nats: Option<String>,
    conversations: usize,
    turns: usize,
    samples: usize,
    workers: usize,
) -> Result<ExitCode> {
    let started;
    let (url, nats_pid) = match nats {
        Some(url) => (url, None),
        None => {
            started = start_nats().await?;
            (started.url.clone(), started.child.id())
        }
    };
    let store_name = match &store {
        Some(location) => location.clone(),
        None if sqlite => "local, one SQLite database".to_owned(),
        None => "local, a file per object".to_owned(),
    };
    println!("turnpike bench lanes: {workers} workers in-process, {conversations} conversations x {turns} turns, {samples} latency samples, NATS at {url}, fsync {} (local stores), store: {store_name}", if fsync { "on" } else { "off" });
    let (mut floor, floor_rate, floor_cpu) =
        raw_jetstream(&url, "raw", nats_pid, samples, conversations * turns).await?;

    let dir = tempfile::tempdir()?;
    let js_bus = JetStreamBus::connect(JetStreamConfig {
        url: url.clone(),
        ..Default::default()
    })
    .await?;
    let location = |name: &str| -> Result<String> {
        if let Some(location) = &store {
            return Ok(location.clone());
        }
        let path = dir.path().join(name);
        let path = path.to_str().context("a UTF-8 path")?;
        Ok(if sqlite {
            format!("sqlite://{path}")
        } else {
            format!("file://{path}")
        })
    };
    let mut js = turnpike(
        nats_pid,
        fsync,
        js_bus,
        &location("js-store")?,
        workers,
        samples,
        conversations,
        turns,
    )
    .await?;
    let embedded_bus = EmbeddedBus::open(&dir.path().join("bus.redb"), EmbeddedConfig::default())?;
    let mut emb = turnpike(
        None,
        fsync,
        embedded_bus,
        &location("emb-store")?,
        workers,
        samples,
        conversations,
        turns,
    )
    .await?;
    // The floor's CPU once more, after the turns: a raw message's CPU moves from run to run
    // about as much as a turn's, so the ratio below divides by both measurements together.
    let (_, _, floor_cpu_after) =
        raw_jetstream(&url, "raw_after", nats_pid, 0, conversations * turns).await?;

    println!(
        "\n{:<44} {:>10} {:>10} {:>14}",
        "", "p50 ms", "p99 ms", "per second"
    );
    println!(
        "{:<44} {:>10.3} {:>10.3} {:>14.0}",
        "raw JetStream publish -> pull-consume",
        ms(percentile(&mut floor, 0.5)),
        ms(percentile(&mut floor, 0.99)),
        floor_rate
    );
    for (name, m) in [
        ("turnpike JetStream accept -> turn start", &mut js),
        ("turnpike embedded accept -> turn start", &mut emb),
    ] {
        println!(
            "{:<44} {:>10.3} {:>10.3} {:>14.0}",
            name,
            ms(percentile(&mut m.latencies, 0.5)),
            ms(percentile(&mut m.latencies, 0.99)),
            m.turns_per_second
        );
    }
    let added = ms(percentile(&mut js.latencies, 0.5)) - ms(percentile(&mut floor, 0.5));
    let share = 100.0 * js.turns_per_second / floor_rate;
    println!(
        "\nturnpike on JetStream adds {added:.3} ms at p50 over raw JetStream (goal: at most 2 ms)"
    );
    println!("turnpike on JetStream reaches {share:.1}% of raw JetStream's message rate as turns per second (goal: at least 10%)");
    println!(
        "until every wake was settled too: {:.0} turns/s on JetStream ({:.1}%), {:.0} turns/s embedded",
        js.settled_per_second,
        100.0 * js.settled_per_second / floor_rate,
        emb.settled_per_second
    );
    print_cpu(
        conversations * turns,
        [&floor_cpu, &floor_cpu_after],
        &js.cpu,
        &emb.cpu,
    );
    Ok(ExitCode::SUCCESS)
}

/// CPU per raw message and per turn: what the rates above come from. Other load on a shared
/// machine moves it less than the rates, though not to nothing (runs vary by about a tenth).
/// The nats-server's share is known when this run started it. `raw`: the floor measured
/// before the turns and after them, each over `operations` messages; a raw message's CPU is
/// their mean.
fn print_cpu(operations: usize, raw: [&CpuUsed; 2], js: &CpuUsed, embedded: &CpuUsed) {
    println!(
        "\n{:<44} {:>10} {:>12} {:>10}",
        "CPU per operation, microseconds", "turnpike", "nats-server", "total"
    );
    let total = |used: &CpuUsed, operations: usize| {
        let (own, other) = used.per(operations);
        own + other.unwrap_or(0.0)
    };
    let floor = raw[0].plus(raw[1]);
    for (name, used, operations) in [
        (
            "raw JetStream message (bench client)",
            &floor,
            2 * operations,
        ),
        ("turn on JetStream", js, operations),
        ("turn embedded (no NATS)", embedded, operations),
    ] {
        let (own, other) = used.per(operations);
        let other = other.map_or_else(|| "-".to_owned(), |o| format!("{o:.1}"));
        println!(
            "{name:<44} {own:>10.1} {other:>12} {:>10.1}",
            total(used, operations)
        );
    }
    println!(
        "(a raw message's CPU, in total: {:.1} before the turns, {:.1} after them)",
        total(raw[0], operations),
        total(raw[1], operations)
    );
    if floor.other.is_some() && js.other.is_some() {
        println!(
            "a turn on JetStream costs the CPU of {:.1} raw JetStream messages (at equal CPU use, 10% of its rate means at most 10)",
            total(js, operations) / total(&floor, 2 * operations).max(f64::EPSILON)
        );
    }
}
