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
async fn turnpike(
    nats_pid: Option<u32>,
    o: &Options,
    bus: Arc<dyn Bus>,
    store_location: &str,
) -> Result<Measured> {
    let (workers, samples, conversations, turns) = (o.workers, o.samples, o.conversations, o.turns);
    let store = open_store_with(store_location, o.fsync)?;
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

/// What `turnpike bench lanes` measures, and how often.
pub struct Options {
    /// Whether the local stores flush to disk at every commit.
    pub fsync: bool,
    /// The local stores: one SQLite database (else a file per object).
    pub sqlite: bool,
    /// The workers' object store (any location `--store` takes, e.g. `memory://` to see what
    /// durability costs); default: a fresh local store per bus and round.
    pub store: Option<String>,
    /// NATS to measure against; default: a nats-server started for the run.
    pub nats: Option<String>,
    pub conversations: usize,
    pub turns: usize,
    pub samples: usize,
    pub workers: usize,
    /// Rounds, each a whole measurement (floor, both buses, floor again) on fresh streams,
    /// stores and conversations; more than one adds their medians.
    pub repeat: usize,
}

/// One round's measurements.
struct Round {
    floor: Vec<Duration>,
    floor_rate: f64,
    /// The floor's CPU before the turns and after them.
    floor_cpu: [CpuUsed; 2],
    js: Measured,
    emb: Measured,
}

impl Round {
    /// Turnpike on JetStream's accept → turn start over raw JetStream's publish → consume, at
    /// p50, in milliseconds.
    fn added_ms(&mut self) -> f64 {
        ms(percentile(&mut self.js.latencies, 0.5)) - ms(percentile(&mut self.floor, 0.5))
    }

    /// A turn's CPU on JetStream in raw messages' (`None` without the nats-server's share).
    fn cpu_ratio(&self, operations: usize) -> Option<f64> {
        let floor = self.floor_cpu[0].plus(&self.floor_cpu[1]);
        (floor.other.is_some() && self.js.cpu.other.is_some()).then(|| {
            total_per(&self.js.cpu, operations)
                / total_per(&floor, 2 * operations).max(f64::EPSILON)
        })
    }
}

/// Microseconds of CPU per operation, this process's and the other's together.
fn total_per(used: &CpuUsed, operations: usize) -> f64 {
    let (own, other) = used.per(operations);
    own + other.unwrap_or(0.0)
}

/// One round: the floor, turnpike on JetStream and on the embedded bus, the floor again. `n`
/// names its streams and stores apart from other rounds'.
async fn round(
    o: &Options,
    url: &str,
    nats_pid: Option<u32>,
    dir: &std::path::Path,
    n: usize,
) -> Result<Round> {
    let operations = o.conversations * o.turns;
    let (floor, floor_rate, floor_cpu) =
        raw_jetstream(url, &format!("raw{n}"), nats_pid, o.samples, operations).await?;
    let js_bus = JetStreamBus::connect(JetStreamConfig {
        url: url.to_owned(),
        ..Default::default()
    })
    .await?;
    let location = |name: &str| -> Result<String> {
        if let Some(location) = &o.store {
            return Ok(location.clone());
        }
        let path = dir.join(format!("{name}{n}"));
        let path = path.to_str().context("a UTF-8 path")?;
        Ok(if o.sqlite {
            format!("sqlite://{path}")
        } else {
            format!("file://{path}")
        })
    };
    let js = turnpike(nats_pid, o, js_bus, &location("js-store")?).await?;
    let embedded_bus =
        EmbeddedBus::open(&dir.join(format!("bus{n}.redb")), EmbeddedConfig::default())?;
    let emb = turnpike(None, o, embedded_bus, &location("emb-store")?).await?;
    // The floor's CPU once more, after the turns: a raw message's CPU moves from run to run
    // about as much as a turn's, so the ratio divides by both measurements together.
    let (_, _, floor_cpu_after) =
        raw_jetstream(url, &format!("raw_after{n}"), nats_pid, 0, operations).await?;
    Ok(Round {
        floor,
        floor_rate,
        floor_cpu: [floor_cpu, floor_cpu_after],
        js,
        emb,
    })
}

/// Runs the benchmark: the first round in full, and with `repeat` every round's line and the
/// medians of its two goals' figures.
pub async fn run(o: Options) -> Result<ExitCode> {
    let started;
    let (url, nats_pid) = match &o.nats {
        Some(url) => (url.clone(), None),
        None => {
            started = start_nats().await?;
            (started.url.clone(), started.child.id())
        }
    };
    let store_name = match &o.store {
        Some(location) => location.clone(),
        None if o.sqlite => "local, one SQLite database".to_owned(),
        None => "local, a file per object".to_owned(),
    };
    println!(
        "turnpike bench lanes: {} workers in-process, {} conversations x {} turns, {} latency samples, NATS at {url}, fsync {} (local stores), store: {store_name}{}",
        o.workers,
        o.conversations,
        o.turns,
        o.samples,
        if o.fsync { "on" } else { "off" },
        if o.repeat > 1 {
            format!(", {} rounds", o.repeat)
        } else {
            String::new()
        }
    );
    let operations = o.conversations * o.turns;
    let dir = tempfile::tempdir()?;
    let mut rounds = Vec::with_capacity(o.repeat);
    for n in 0..o.repeat.max(1) {
        let mut r = round(&o, &url, nats_pid, dir.path(), n).await?;
        if n == 0 {
            print_round(&mut r, operations);
        }
        if o.repeat > 1 {
            if n == 0 {
                println!(
                    "\n{:<8} {:>16} {:>14} {:>14} {:>18} {:>16}",
                    "round",
                    "adds ms at p50",
                    "turn CPU µs",
                    "raw msg CPU µs",
                    "CPU in raw msgs",
                    "turns/s on JS"
                );
            }
            let ratio = r
                .cpu_ratio(operations)
                .map_or_else(|| "-".to_owned(), |x| format!("{x:.1}"));
            println!(
                "{:<8} {:>16.3} {:>14.1} {:>14.1} {ratio:>18} {:>16.0}",
                n + 1,
                r.added_ms(),
                total_per(&r.js.cpu, operations),
                total_per(&r.floor_cpu[0].plus(&r.floor_cpu[1]), 2 * operations),
                r.js.turns_per_second
            );
        }
        rounds.push(r);
    }
    if rounds.len() > 1 {
        let mut added: Vec<f64> = rounds.iter_mut().map(Round::added_ms).collect();
        let mut ratios: Vec<f64> = rounds
            .iter()
            .filter_map(|r| r.cpu_ratio(operations))
            .collect();
        println!(
            "median of {} rounds: turnpike on JetStream adds {:.3} ms at p50 (goal: at most 1 ms)",
            rounds.len(),
            median(&mut added)
        );
        if !ratios.is_empty() {
            println!(
                "median of {} rounds: a turn on JetStream costs the CPU of {:.1} raw JetStream messages (goal: at most 15)",
                ratios.len(),
                median(&mut ratios)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The middle value (the mean of the two middle ones for an even count); `values` non-empty.
fn median(values: &mut [f64]) -> f64 {
    values.sort_unstable_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// The first round's tables: latencies and rates, then CPU per operation.
fn print_round(r: &mut Round, operations: usize) {
    println!(
        "\n{:<44} {:>10} {:>10} {:>14}",
        "", "p50 ms", "p99 ms", "per second"
    );
    println!(
        "{:<44} {:>10.3} {:>10.3} {:>14.0}",
        "raw JetStream publish -> pull-consume",
        ms(percentile(&mut r.floor, 0.5)),
        ms(percentile(&mut r.floor, 0.99)),
        r.floor_rate
    );
    for (name, m) in [
        ("turnpike JetStream accept -> turn start", &mut r.js),
        ("turnpike embedded accept -> turn start", &mut r.emb),
    ] {
        println!(
            "{:<44} {:>10.3} {:>10.3} {:>14.0}",
            name,
            ms(percentile(&mut m.latencies, 0.5)),
            ms(percentile(&mut m.latencies, 0.99)),
            m.turns_per_second
        );
    }
    let added = r.added_ms();
    let share = 100.0 * r.js.turns_per_second / r.floor_rate;
    println!(
        "\nturnpike on JetStream adds {added:.3} ms at p50 over raw JetStream (goal: at most 1 ms)"
    );
    println!("turnpike on JetStream reaches {share:.1}% of raw JetStream's message rate as turns per second (goal: at least 10%)");
    println!(
        "until every wake was settled too: {:.0} turns/s on JetStream ({:.1}%), {:.0} turns/s embedded",
        r.js.settled_per_second,
        100.0 * r.js.settled_per_second / r.floor_rate,
        r.emb.settled_per_second
    );
    print_cpu(operations, r);
}

/// CPU per raw message and per turn: what the rates above come from. Other load on a shared
/// machine moves it less than the rates, though not to nothing (runs vary by about a tenth).
/// The nats-server's share is known when this run started it. The floor is measured before
/// the turns and after them, each over `operations` messages; a raw message's CPU is their
/// mean.
fn print_cpu(operations: usize, r: &Round) {
    println!(
        "\n{:<44} {:>10} {:>12} {:>10}",
        "CPU per operation, microseconds", "turnpike", "nats-server", "total"
    );
    let floor = r.floor_cpu[0].plus(&r.floor_cpu[1]);
    for (name, used, operations) in [
        (
            "raw JetStream message (bench client)",
            &floor,
            2 * operations,
        ),
        ("turn on JetStream", &r.js.cpu, operations),
        ("turn embedded (no NATS)", &r.emb.cpu, operations),
    ] {
        let (own, other) = used.per(operations);
        let other = other.map_or_else(|| "-".to_owned(), |o| format!("{o:.1}"));
        println!(
            "{name:<44} {own:>10.1} {other:>12} {:>10.1}",
            total_per(used, operations)
        );
    }
    println!(
        "(a raw message's CPU, in total: {:.1} before the turns, {:.1} after them)",
        total_per(&r.floor_cpu[0], operations),
        total_per(&r.floor_cpu[1], operations)
    );
    if let Some(ratio) = r.cpu_ratio(operations) {
        println!(
            "a turn on JetStream costs the CPU of {ratio:.1} raw JetStream messages (goal: at most 15)"
        );
    }
}
