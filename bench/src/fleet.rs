//! `turnpike bench fleet`: a fleet of processes on this machine — a nats-server, R routers and W
//! workers (separate `turnpike` processes sharing a file store) — driven through the HTTP API
//! by closed-loop clients, with a scripted model that takes a fixed time per call, so the
//! model's time, not this machine's cores, is what bounds a worker. For W = 1, 2, 4, …: turns
//! per second and schedule-to-start (the edge's accept → the turn's dispatch, read from each
//! record) beside what a first-come, first-served dispatcher over all the fleet's slots would
//! have given for the same arrivals and turn times, and the scaling efficiency as a ratio of
//! W = 1's throughput.
//!
//! The load: twice as many conversations as the fleet has turn slots, each sending its next
//! message once its previous turn completed (seen through the conversation's WebSocket and its
//! rows), so the workers are never idle and queues stay bounded. Schedule-to-start therefore
//! includes the wait for a free slot: at twice the capacity, about one model call.
//!
//! Beside the percentiles, each turn is grouped by how it found its slot against its
//! conversation's turn before (kept by that owner, a new claim on the same worker, or on
//! another), with how many of each waited longer than first come, first served's p99, and each
//! worker's own count of the fleet (its `turnpike_worker_fleet_size`, which spaces its put-off
//! wakes) when the clients start and when they are done. To see
//! where a slow start's time went: `TURNPIKE_BENCH_LOGS=DIR` keeps every process's log and each
//! measurement's turns (`turns-W.tsv`) in DIR, `TURNPIKE_BENCH_RUST_LOG` sets the processes'
//! `RUST_LOG` (`warn,turnpike_wakes=debug` traces each wake through the workers), and
//! `scripts/fleet-waits DIR W` groups the turns by what happened to their wakes.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use serde_json::{json, Value};
use turnpike_edge::client::{Client, Cursor};

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The `turnpike` binary to start routers and workers from.
    pub binary: PathBuf,
    /// The `nats-server` binary.
    pub nats_server: PathBuf,
    pub routers: usize,
    /// Worker counts to measure, in order (the first is the baseline of the efficiency).
    pub workers: Vec<usize>,
    /// Turn slots per worker.
    pub slots: usize,
    /// The scripted model's time per call.
    pub model_delay: Duration,
    /// Turns each conversation runs per measurement.
    pub turns: usize,
}

/// A child process killed when dropped.
pub(crate) struct Proc {
    pub(crate) child: Child,
    name: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `program` and waits until a line of its stderr contains `ready` (the rest of its
/// output is drained in the background).
pub(crate) fn start(name: &str, program: &Path, args: &[String], ready: &str) -> Result<Proc> {
    start_with(name, program, args, ready, &[])
}

/// [`start`] with more environment variables for the process.
pub(crate) fn start_with(
    name: &str,
    program: &Path,
    args: &[String],
    ready: &str,
    envs: &[(&str, String)],
) -> Result<Proc> {
    let mut child = Command::new(program)
        .args(args)
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .env(
            "RUST_LOG",
            std::env::var("TURNPIKE_BENCH_RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        // Read before RUST_LOG, and a format the logs kept for `scripts/fleet-waits` must not
        // take from the caller's environment.
        .env_remove("TURNPIKE_LOG")
        .env("TURNPIKE_LOG_FORMAT", "text")
        .env("TURNPIKE_EMBEDDING_MODEL", "/nonexistent")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {name} ({})", program.display()))?;
    let stderr = child.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    let needle = ready.to_owned();
    let mut log = std::env::var_os("TURNPIKE_BENCH_LOGS").and_then(|dir| {
        std::fs::create_dir_all(&dir).ok()?;
        let file = Path::new(&dir).join(format!("{}.log", name.replace(' ', "-")));
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)
            .ok()
    });
    std::thread::spawn(move || {
        let mut said = Vec::new();
        let mut sent = false;
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(log) = log.as_mut() {
                use std::io::Write as _;
                // One write per line: processes of the same name append to one file.
                let _ = log.write_all(format!("{line}\n").as_bytes());
            }
            if !sent {
                if line.contains(&needle) {
                    let _ = tx.send(Ok(()));
                    sent = true;
                } else {
                    said.push(line);
                }
            }
        }
        if !sent {
            let _ = tx.send(Err(said.join("\n")));
        }
    });
    let proc = Proc {
        child,
        name: name.to_owned(),
    };
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Ok(())) => Ok(proc),
        Ok(Err(said)) => bail!("{} exited before it was ready:\n{said}", proc.name),
        Err(_) => bail!("{} was not ready within 60 s", proc.name),
    }
}

pub(crate) fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The app every turn runs: one scripted call that takes `delay`.
fn write_app(dir: &Path, delay: Duration) -> Result<()> {
    std::fs::write(
        dir.join("fleet.toml"),
        "app = \"fleet\"\n\n[agents.model]\nprovider = \"script\"\nscript = \"model.script.toml\"\n",
    )?;
    std::fs::write(
        dir.join("model.script.toml"),
        format!(
            "[[turn]]\n[[turn.step]]\ntext = \"done: {{last_user}}\"\ndelay_ms = {}\n",
            delay.as_millis()
        ),
    )?;
    Ok(())
}

/// One measurement's result.
struct Measured {
    workers: usize,
    turns: usize,
    per_second: f64,
    s2s_p50_ms: f64,
    s2s_p99_ms: f64,
    /// What a first-come, first-served dispatcher over all the fleet's slots would have given
    /// for the same arrivals and turn times.
    fcfs_p50_ms: f64,
    fcfs_p99_ms: f64,
    /// Schedule-to-start by how each turn found its slot (see [`Found`]).
    paths: Vec<(Found, Vec<Duration>)>,
    /// Each worker's own count of the fleet (`turnpike_worker_fleet_size`) when the clients
    /// start, and when they are done: what the intake believed.
    counted: [Vec<Option<f64>>; 2],
}

/// `turnpike bench fleet`.
pub async fn run(plan: Plan) -> Result<ExitCode> {
    if plan.workers.is_empty() || plan.routers == 0 {
        bail!("at least one router and one worker count");
    }
    println!(
        "fleet on this machine: nats-server, {} router(s), W worker processes × {} slots; a scripted model taking {} ms per call; {} turns per conversation, 2 × W × slots conversations in a closed loop",
        plan.routers,
        plan.slots,
        plan.model_delay.as_millis(),
        plan.turns
    );
    let mut results: Vec<Measured> = Vec::new();
    for &w in &plan.workers {
        let m = measure(&plan, w).await?;
        let ideal = (w * plan.slots) as f64 / plan.model_delay.as_secs_f64();
        let efficiency = results
            .first()
            .map(|base| m.per_second / (base.per_second * w as f64 / base.workers as f64));
        println!(
            "W = {w}: {:.1} turns/s ({} turns; {:.0}% of the model-bound ceiling {ideal:.1}/s); schedule-to-start p50 {:.1} ms, p99 {:.1} ms (first come, first served: p50 {:.1} ms, p99 {:.1} ms; p99 x{:.2}){}",
            m.per_second,
            m.turns,
            100.0 * m.per_second / ideal,
            m.s2s_p50_ms,
            m.s2s_p99_ms,
            m.fcfs_p50_ms,
            m.fcfs_p99_ms,
            m.s2s_p99_ms / m.fcfs_p99_ms.max(1.0),
            match (results.first(), efficiency) {
                (Some(base), Some(e)) => format!(
                    "; ×{:.2} W = {} (scaling efficiency {:.0}%)",
                    m.per_second / base.per_second,
                    base.workers,
                    100.0 * e
                ),
                _ => String::new(),
            }
        );
        let show = |sizes: &[Option<f64>]| {
            sizes
                .iter()
                .map(|s| s.map_or("?".to_owned(), |s| s.to_string()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "  the workers' own count of the fleet: [{}] at the start, [{}] at the end",
            show(&m.counted[0]),
            show(&m.counted[1])
        );
        for (path, waits) in &m.paths {
            let mut waits = waits.clone();
            let over = waits
                .iter()
                .filter(|w| w.as_secs_f64() * 1e3 > m.fcfs_p99_ms)
                .count();
            println!(
                "  {:<45} {:>5} turns; p50 {:>6.1} ms, p99 {:>6.1} ms; {over} over first come, first served's p99",
                path.describe(),
                waits.len(),
                crate::series::percentile_ms(&mut waits, 0.5),
                crate::series::percentile_ms(&mut waits, 0.99),
            );
        }
        results.push(m);
    }
    Ok(ExitCode::SUCCESS)
}

async fn measure(plan: &Plan, workers: usize) -> Result<Measured> {
    let dir = tempfile::tempdir()?;
    let apps = dir.path().join("apps");
    std::fs::create_dir_all(&apps)?;
    write_app(&apps, plan.model_delay)?;
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        "[[tokens]]\ntoken = \"bench\"\nidentity = \"local:bench\"\n",
    )?;
    let key = dir.path().join("signing.key");
    std::fs::write(
        &key,
        turnpike_artifactory::RecordSigner::generate()?.to_hex(),
    )?;
    let store = dir.path().join("store");
    std::fs::create_dir_all(&store)?;
    let nats_port = free_port()?;
    let _nats = start(
        "nats-server",
        &plan.nats_server,
        &[
            "-js".into(),
            "-a".into(),
            "127.0.0.1".into(),
            "-p".into(),
            nats_port.to_string(),
            "-sd".into(),
            dir.path().join("nats").display().to_string(),
        ],
        "Server is ready",
    )?;
    let common = |data: &str| process_args(&dir.path().join(data), &store, &key, nats_port, &apps);
    let mut procs = Vec::new();
    let mut urls = Vec::new();
    for r in 0..plan.routers {
        let port = free_port()?;
        let mut args = common(&format!("router-{r}"));
        args.extend([
            "router".into(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--tokens".into(),
            tokens.display().to_string(),
            "--rate-per-second".into(),
            "0".into(),
        ]);
        procs.push(start(
            &format!("router {r}"),
            &plan.binary,
            &args,
            "API listening on",
        )?);
        urls.push(format!("http://127.0.0.1:{port}"));
    }
    let mut admins = Vec::new();
    for k in 0..workers {
        let mut args = common(&format!("worker-{k}"));
        // Each worker's own count of the fleet is read from its scrape.
        let admin = format!("127.0.0.1:{}", free_port()?);
        if let Some(at) = args.iter().position(|a| a == "--admin-listen") {
            args[at + 1] = admin.clone();
        }
        args.extend(["worker".into(), "--slots".into(), plan.slots.to_string()]);
        procs.push(start(&format!("worker {k}"), &plan.binary, &args, "ready")?);
        admins.push(Client::new(&format!("http://{admin}"), ""));
    }
    let clients: Vec<Client> = urls.iter().map(|u| Client::new(u, "bench")).collect();
    let conversations = 2 * workers * plan.slots;
    let mut ids = Vec::new();
    for i in 0..conversations {
        let client = &clients[i % clients.len()];
        let made = client
            .post(
                "/v1/conversations",
                &json!({"app": "fleet", "agent": "model"}),
            )
            .await
            .map_err(anyhow::Error::msg)?
            .into_ok()
            .map_err(anyhow::Error::msg)?;
        ids.push(made["id"].as_str().unwrap_or_default().to_owned());
    }
    let counted_first = fleet_sizes(&admins).await;
    let started = Instant::now();
    let tasks: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let client = clients[i % clients.len()].clone();
            let (id, turns) = (id.clone(), plan.turns);
            tokio::spawn(async move { drive(client, id, turns).await })
        })
        .collect();
    let mut timed = Vec::new();
    for t in tasks {
        timed.extend(t.await??);
    }
    let took = started.elapsed();
    let counted = [counted_first, fleet_sizes(&admins).await];
    drop(procs);
    let turns = timed.len();
    let mut s2s: Vec<Duration> = timed.iter().map(Timed::waited).collect();
    let mut fcfs = first_come_first_served(&timed, workers * plan.slots);
    let paths = by_path(&timed);
    if let Some(dir) = std::env::var_os("TURNPIKE_BENCH_LOGS") {
        let rows: String = timed
            .iter()
            .map(|t| {
                format!(
                    "{}\t{}\t{}\t{}\t{}\t{}\n",
                    t.conversation, t.accepted_ms, t.started_ms, t.ended_ms, t.worker, t.epoch
                )
            })
            .collect();
        let tsv = Path::new(&dir).join(format!("turns-{workers}.tsv"));
        if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&tsv, rows)) {
            eprintln!("cannot keep the turns in {}: {e}", tsv.display());
        }
    }
    Ok(Measured {
        workers,
        turns,
        per_second: turns as f64 / took.as_secs_f64(),
        s2s_p50_ms: crate::series::percentile_ms(&mut s2s, 0.5),
        s2s_p99_ms: crate::series::percentile_ms(&mut s2s, 0.99),
        fcfs_p50_ms: crate::series::percentile_ms(&mut fcfs, 0.5),
        fcfs_p99_ms: crate::series::percentile_ms(&mut fcfs, 0.99),
        paths,
        counted,
    })
}

/// Each worker's own count of its fleet, from its scrape (`None`: not read).
async fn fleet_sizes(admins: &[Client]) -> Vec<Option<f64>> {
    let mut sizes = Vec::new();
    for admin in admins {
        let size = match admin.bytes("/metrics", false).await {
            Ok((200, body)) => String::from_utf8_lossy(&body).lines().find_map(|l| {
                l.strip_prefix("turnpike_worker_fleet_size ")?
                    .trim()
                    .parse()
                    .ok()
            }),
            _ => None,
        };
        sizes.push(size);
    }
    sizes
}

/// How a turn found its slot, against its conversation's turn before it (read from the two
/// turns' dispatches).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Found {
    /// The conversation's first turn of the measurement.
    First,
    /// The owner of the turn before ran it, under the same lease (no new claim).
    Kept,
    /// A new claim on the worker that ran the turn before: by a wake queued there, or by that
    /// owner again for what came while it let go (the trace's `claimed again`).
    SameWorker,
    /// A new claim on another worker.
    Moved,
}

impl Found {
    fn describe(self) -> &'static str {
        match self {
            Found::First => "a conversation's first turn",
            Found::Kept => "run by the owner of the turn before",
            Found::SameWorker => "a new claim, on the worker of the turn before",
            Found::Moved => "a new claim, on another worker",
        }
    }
}

/// Each turn's schedule-to-start, grouped by its [`Found`] (turns are in conversation order,
/// one conversation after another).
fn by_path(turns: &[Timed]) -> Vec<(Found, Vec<Duration>)> {
    let mut paths: std::collections::BTreeMap<Found, Vec<Duration>> = Default::default();
    let mut before: Option<&Timed> = None;
    for t in turns {
        let path = match before {
            Some(b) if b.conversation == t.conversation => {
                if b.worker == t.worker && b.epoch == t.epoch {
                    Found::Kept
                } else if b.worker == t.worker {
                    Found::SameWorker
                } else {
                    Found::Moved
                }
            }
            _ => Found::First,
        };
        paths.entry(path).or_default().push(t.waited());
        before = Some(t);
    }
    paths.into_iter().collect()
}

/// One turn's times (milliseconds since the epoch): its message accepted, its dispatch, and
/// when its client saw it complete; and where it ran (its dispatch's worker and lease epoch).
#[derive(Debug, Clone, Default, PartialEq)]
struct Timed {
    conversation: String,
    accepted_ms: u64,
    started_ms: u64,
    ended_ms: u64,
    worker: String,
    epoch: u64,
}

impl Timed {
    /// Its schedule-to-start: accepted → dispatched.
    fn waited(&self) -> Duration {
        Duration::from_millis(self.started_ms.saturating_sub(self.accepted_ms))
    }
}

/// The schedule-to-start of each turn had one queue in front of all `slots` slots taken them
/// in arrival order, each for as long as it really ran: the figure a dispatcher that knows
/// the whole fleet gives.
fn first_come_first_served(turns: &[Timed], slots: usize) -> Vec<Duration> {
    let mut arrivals: Vec<&Timed> = turns.iter().collect();
    arrivals.sort_by_key(|t| t.accepted_ms);
    // When each slot is free next.
    let mut free: std::collections::BinaryHeap<std::cmp::Reverse<u64>> =
        (0..slots.max(1)).map(|_| std::cmp::Reverse(0)).collect();
    let mut waits = Vec::with_capacity(turns.len());
    for t in arrivals {
        let std::cmp::Reverse(at) = free.pop().expect("a slot");
        let start = at.max(t.accepted_ms);
        waits.push(Duration::from_millis(start - t.accepted_ms));
        let ran = t.ended_ms.saturating_sub(t.started_ms);
        free.push(std::cmp::Reverse(start + ran));
    }
    waits
}

/// Runs `turns` turns in one conversation, each message sent once the previous turn completed;
/// returns each turn's times (accepted and dispatched from the record).
async fn drive(client: Client, id: String, turns: usize) -> Result<Vec<Timed>> {
    let mut ended = Vec::with_capacity(turns);
    let mut stream = client.stream(&id).await.map_err(anyhow::Error::msg)?;
    let mut cursor = Cursor::new(&id);
    let mut rows: Vec<Value> = Vec::new();
    for n in 1..=turns {
        let sent = client
            .send(
                reqwest::Method::POST,
                &format!("/v1/conversations/{id}/messages"),
                Some(&json!({"text": format!("turn {n}")})),
                Some(&format!("bench-{n}")),
            )
            .await
            .map_err(anyhow::Error::msg)?;
        if sent.status != 202 {
            bail!("{id}: message {n}: {} {}", sent.status, sent.body);
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            rows.extend(cursor.read(&client).await.map_err(anyhow::Error::msg)?);
            let complete = rows.iter().filter(|r| r["kind"] == "turn_complete").count();
            if complete >= n {
                ended.push(turnpike_router::bus::now_ms());
                break;
            }
            if Instant::now() > deadline {
                bail!("{id}: turn {n} did not complete within 120 s");
            }
            // A "new rows" frame, or a look anyway after a second (frames are advisory).
            let _ = stream.next_within(Duration::from_secs(1)).await;
        }
    }
    stream.close().await;
    let pairs = schedule_to_start(&rows)
        .ok_or_else(|| anyhow!("{id}: the rows do not pair messages and dispatches"))?;
    Ok(pairs
        .into_iter()
        .zip(ended)
        .map(|(d, ended_ms)| Timed {
            conversation: id.clone(),
            accepted_ms: d.accepted_ms,
            started_ms: d.at_ms,
            ended_ms,
            worker: d.worker,
            epoch: d.epoch,
        })
        .collect())
}

/// A turn's accept (its first message's `accepted_at_ms`) and its `turn_dispatched`.
#[derive(Debug, Clone, PartialEq)]
struct Dispatched {
    accepted_ms: u64,
    at_ms: u64,
    worker: String,
    epoch: u64,
}

/// Each turn's accept and dispatch.
fn schedule_to_start(rows: &[Value]) -> Option<Vec<Dispatched>> {
    let mut accepted = None;
    let mut out = Vec::new();
    for row in rows {
        match row["kind"].as_str()? {
            "user_message" => {
                accepted = accepted.or(row["data"]["event"]["accepted_at_ms"].as_u64());
            }
            "turn_dispatched" => {
                let data = &row["data"];
                out.push(Dispatched {
                    accepted_ms: accepted.take()?,
                    at_ms: data["at_ms"].as_u64()?,
                    worker: data["worker"].as_str()?.to_owned(),
                    epoch: data["epoch"].as_u64()?,
                });
            }
            _ => {}
        }
    }
    Some(out)
}

/// The flags a fleet process (router or worker) of a bench starts with: its own data
/// directory, the shared file store, signing key, NATS server and apps; no admin listener.
pub(crate) fn process_args(
    data: &Path,
    store: &Path,
    key: &Path,
    nats_port: u16,
    apps: &Path,
) -> Vec<String> {
    vec![
        "--data-dir".into(),
        data.display().to_string(),
        "--store".into(),
        format!("file://{}", store.display()),
        "--signing-key".into(),
        key.display().to_string(),
        "--nats-url".into(),
        format!("nats://127.0.0.1:{nats_port}"),
        "--apps".into(),
        apps.display().to_string(),
        "--admin-listen".into(),
        "off".into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_to_start_pairs_each_dispatch_with_its_first_message() {
        let rows = vec![
            json!({"kind": "conversation_opened", "data": {}}),
            json!({"kind": "user_message", "data": {"event": {"accepted_at_ms": 1000}}}),
            json!({"kind": "turn_dispatched", "data": {"at_ms": 1040, "worker": "w1", "epoch": 3}}),
            json!({"kind": "turn_complete", "data": {}}),
            json!({"kind": "user_message", "data": {"event": {"accepted_at_ms": 2000}}}),
            json!({"kind": "user_message", "data": {"event": {"accepted_at_ms": 2005}}}),
            json!({"kind": "turn_dispatched", "data": {"at_ms": 2300, "worker": "w2", "epoch": 4}}),
        ];
        let pairs: Vec<(u64, u64)> = schedule_to_start(&rows)
            .unwrap()
            .iter()
            .map(|d| (d.accepted_ms, d.at_ms))
            .collect();
        assert_eq!(pairs, [(1000, 1040), (2000, 2300)]);
    }

    #[test]
    fn first_come_first_served_queues_arrivals_in_order_over_the_slots() {
        let t = |accepted_ms, ran| Timed {
            accepted_ms,
            ended_ms: ran,
            ..Timed::default()
        };
        // Two slots; three turns of 100 ms at once, then one long after.
        let waits = first_come_first_served(&[t(0, 100), t(0, 100), t(0, 100), t(500, 100)], 2);
        let ms: Vec<u64> = waits.iter().map(|d| d.as_millis() as u64).collect();
        assert_eq!(ms, [0, 0, 100, 0]);
    }

    #[test]
    fn each_turn_is_grouped_by_how_it_found_its_slot_against_the_turn_before() {
        let t = |conversation: &str, worker: &str, epoch, wait: u64| Timed {
            conversation: conversation.into(),
            accepted_ms: 1000,
            started_ms: 1000 + wait,
            worker: worker.into(),
            epoch,
            ..Timed::default()
        };
        let turns = [
            t("a", "w1", 1, 5),
            t("a", "w1", 1, 6),
            t("a", "w1", 2, 300),
            t("a", "w2", 3, 500),
            t("b", "w2", 3, 7),
            t("b", "w1", 3, 600),
        ];
        let found: Vec<(Found, Vec<u64>)> = by_path(&turns)
            .into_iter()
            .map(|(f, w)| (f, w.iter().map(|d| d.as_millis() as u64).collect()))
            .collect();
        assert_eq!(
            found,
            [
                (Found::First, vec![5, 7]),
                (Found::Kept, vec![6]),
                (Found::SameWorker, vec![300]),
                (Found::Moved, vec![500, 600]),
            ]
        );
    }
}
