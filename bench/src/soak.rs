//! `turnpike bench soak`: memory over a long run. N turns of an echo agent through the API, on
//! the embedded stack (`turnpike serve`) and on a fleet (a nats-server, a router and a worker
//! process sharing a file store), by closed-loop clients over many conversations; each
//! process's resident memory (anonymous and file-backed, from `/proc/<pid>/status`) and thread
//! count are sampled as the turns go by. Memory that grows with work — something kept per
//! event, message or turn, a cache without a bound, or a thread pool that keeps growing — shows
//! as anonymous memory that keeps rising after warm-up; the report gives each process's growth
//! from the first sample after warm-up to the last. A sample is the median of every reading
//! (twice a second) over its window of turns, not one reading: memory moves with the turns in
//! flight. The processes give freed memory back to the kernel at once (see `allocator_env`),
//! so that what they keep is what they hold, not what the allocator holds for later.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde_json::json;
use turnpike_edge::client::{Client, Cursor};

use crate::fleet::{free_port, process_args, start, start_with, Proc};

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The `turnpike` binary to start servers from.
    pub binary: PathBuf,
    /// The `nats-server` binary, for the fleet; `None`: the embedded stack only.
    pub nats_server: Option<PathBuf>,
    /// Turns in all, per stack.
    pub turns: usize,
    pub conversations: usize,
    /// Clients sending at once.
    pub clients: usize,
    /// Memory samples over the run.
    pub samples: usize,
    /// The share of the run before the first window of turns that counts (warm-up), in percent.
    pub warm_up_percent: usize,
    /// Turns a conversation takes before its client moves on to a new one (0: never): the
    /// conversations keep a steady length (a context that grows for the whole run makes every
    /// turn's working copies of it grow too), and their number grows with the run.
    pub per_conversation: usize,
    /// Soaks the fleet only.
    pub fleet_only: bool,
}

/// One process's resident memory, in bytes, and its threads (each holds a stack and an
/// allocator heap, so a thread pool that grows shows as memory that grows).
#[derive(Debug, Clone, Copy, Default)]
pub struct Resident {
    pub anonymous: u64,
    pub file: u64,
    pub threads: u64,
}

/// Reads `RssAnon`, `RssFile` and `Threads` of process `pid`.
pub fn resident(pid: u32) -> Result<Resident> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok(Resident {
        anonymous: field("RssAnon:") * 1024,
        file: field("RssFile:") * 1024,
        threads: field("Threads:"),
    })
}

/// `turnpike bench soak`.
pub async fn run(plan: Plan) -> Result<ExitCode> {
    if plan.turns == 0 || plan.conversations == 0 || plan.clients == 0 || plan.samples < 2 {
        bail!("turns, conversations and clients must be positive, samples at least 2");
    }
    let rotation = match plan.per_conversation {
        0 => "each for the whole run".to_owned(),
        n => format!("each for {n} turns, then a new one in its place"),
    };
    println!(
        "soak: {} turns of an echo agent over {} conversations at a time ({rotation}) by {} clients, through the API; resident memory sampled {} times, growth measured after the first {}% of the turns",
        plan.turns, plan.conversations, plan.clients, plan.samples, plan.warm_up_percent
    );
    println!("allocator: {}", allocator_said());
    let mut flat = true;
    if plan.fleet_only && plan.nats_server.is_none() {
        bail!("--fleet-only needs a nats-server");
    }
    let scratch = std::env::temp_dir();
    let need = plan.turns as u64 * DISK_PER_TURN;
    match free_disk(&scratch) {
        Some(free) if free < need => bail!(
            "{} turns need about {} GB of disk under {} (its stores grow by about {} KB a turn, a million turns about 20 GB); {} GB are free: free some, point TMPDIR elsewhere or run fewer --turns",
            plan.turns,
            need.div_ceil(1 << 30),
            scratch.display(),
            DISK_PER_TURN / 1024,
            free >> 30
        ),
        Some(free) => println!(
            "disk: about {} GB needed under {}, {} GB free",
            need.div_ceil(1 << 30),
            scratch.display(),
            free >> 30
        ),
        None => println!("disk: cannot tell how much is free under {}", scratch.display()),
    }
    if !plan.fleet_only {
        flat &= soak(&plan, Stack::Embedded).await?;
    }
    if let Some(nats) = &plan.nats_server {
        flat &= soak(&plan, Stack::Fleet(nats.clone())).await?;
    }
    Ok(if flat {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// What a soaked stack's store, bus and record grow by per turn, on disk, at most (a fleet's
/// file store and JetStream's file store held about 16 GB after 800,000 turns).
const DISK_PER_TURN: u64 = 20 * 1024;

/// Bytes free to an unprivileged writer on the file system holding `path`.
fn free_disk(path: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `stat` a writable statvfs.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return None;
    }
    Some(stat.f_bavail as u64 * stat.f_frsize as u64)
}

enum Stack {
    Embedded,
    Fleet(PathBuf),
}

/// The stack's processes, the API's URL, and the processes to watch.
struct Running {
    _procs: Vec<Proc>,
    url: String,
    watched: Vec<(String, u32)>,
    _dir: tempfile::TempDir,
}

fn start_stack(plan: &Plan, stack: &Stack) -> Result<Running> {
    let dir = tempfile::tempdir()?;
    let apps = dir.path().join("apps");
    std::fs::create_dir_all(&apps)?;
    std::fs::write(
        apps.join("soak.toml"),
        "app = \"soak\"\n\n[agents.echo]\nprovider = \"echo\"\n",
    )?;
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        "[[tokens]]\ntoken = \"bench\"\nidentity = \"local:bench\"\n",
    )?;
    let port = free_port()?;
    let url = format!("http://127.0.0.1:{port}");
    let edge = |args: &mut Vec<String>| {
        args.extend([
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--tokens".into(),
            tokens.display().to_string(),
            "--rate-per-second".into(),
            "0".into(),
        ])
    };
    let allocator = allocator_env();
    let mut procs = Vec::new();
    let mut watched = Vec::new();
    match stack {
        Stack::Embedded => {
            let mut args = vec![
                "--data-dir".into(),
                dir.path().join("serve").display().to_string(),
                "--apps".into(),
                apps.display().to_string(),
                "--admin-listen".into(),
                "off".into(),
                "serve".into(),
            ];
            edge(&mut args);
            let serve = start_with(
                "turnpike serve",
                &plan.binary,
                &args,
                "API listening on",
                &allocator,
            )?;
            watched.push(("serve".to_owned(), serve.child.id()));
            procs.push(serve);
        }
        Stack::Fleet(nats_server) => {
            let key = dir.path().join("signing.key");
            std::fs::write(
                &key,
                turnpike_artifactory::RecordSigner::generate()?.to_hex(),
            )?;
            let store = dir.path().join("store");
            std::fs::create_dir_all(&store)?;
            let nats_port = free_port()?;
            procs.push(start(
                "nats-server",
                nats_server,
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
            )?);
            let common =
                |data: &str| process_args(&dir.path().join(data), &store, &key, nats_port, &apps);
            let mut args = common("router");
            args.push("router".into());
            edge(&mut args);
            let router = start_with(
                "router",
                &plan.binary,
                &args,
                "API listening on",
                &allocator,
            )?;
            watched.push(("router".to_owned(), router.child.id()));
            procs.push(router);
            let mut args = common("worker");
            args.push("worker".into());
            let worker = start_with("worker", &plan.binary, &args, "ready", &allocator)?;
            watched.push(("worker".to_owned(), worker.child.id()));
            procs.push(worker);
        }
    }
    Ok(Running {
        _procs: procs,
        url,
        watched,
        _dir: dir,
    })
}

/// Runs one stack's soak; returns whether every process's anonymous memory stayed within 10%
/// after warm-up.
async fn soak(plan: &Plan, stack: Stack) -> Result<bool> {
    let name = match &stack {
        Stack::Embedded => "embedded (turnpike serve)".to_owned(),
        Stack::Fleet(_) => "fleet (nats-server, router, worker)".to_owned(),
    };
    println!("\n{name}:");
    let running = start_stack(plan, &stack)?;
    let client = Client::new(&running.url, "bench");
    let mut ids = Vec::new();
    for _ in 0..plan.conversations {
        ids.push(new_conversation(&client).await?);
    }
    let done = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..plan.clients)
        .map(|c| {
            let mine: Vec<String> = ids.iter().skip(c).step_by(plan.clients).cloned().collect();
            let (client, done, total) = (client.clone(), done.clone(), plan.turns);
            let per_conversation = plan.per_conversation;
            tokio::spawn(async move { drive(client, mine, done, total, per_conversation).await })
        })
        .collect();
    println!(
        "  {:>9}  {:>8}  {:<8} {:>10} {:>10} {:>10} {:>8}",
        "turns", "turns/s", "process", "anon MiB", "(max)", "file MiB", "threads"
    );
    // One window of readings per sample: each process's memory read every READING_GAP while
    // the window's turns run.
    let mut samples: Vec<Sample> = Vec::new();
    let mut window: Vec<Vec<Resident>> = vec![Vec::new(); running.watched.len()];
    let mut read_at = Instant::now();
    let mut next = 1;
    let mut last_turns = (0usize, Instant::now());
    while next <= plan.samples {
        if read_at.elapsed() >= READING_GAP {
            read_at = Instant::now();
            for (k, (_, pid)) in running.watched.iter().enumerate() {
                window[k].push(resident(*pid)?);
            }
        }
        let at = plan.turns * next / plan.samples;
        let turns = done.load(Ordering::Relaxed);
        if turns < at && !tasks.iter().all(|t| t.is_finished()) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let rate = (turns - last_turns.0) as f64 / last_turns.1.elapsed().as_secs_f64();
        let from = last_turns.0;
        last_turns = (turns, Instant::now());
        let mut row = Vec::new();
        for (k, (process, pid)) in running.watched.iter().enumerate() {
            let mut readings = std::mem::take(&mut window[k]);
            readings.push(resident(*pid)?);
            let level = Level::of(readings);
            println!(
                "  {turns:>9}  {rate:>8.0}  {process:<8} {:>10.1} {:>10.1} {:>10.1} {:>8}",
                level.median.anonymous as f64 / 1048576.0,
                level.max_anonymous as f64 / 1048576.0,
                level.median.file as f64 / 1048576.0,
                level.median.threads
            );
            row.push(level.median);
        }
        samples.push(Sample {
            from,
            to: turns,
            row,
        });
        next += 1;
        if tasks.iter().all(|t| t.is_finished()) {
            break;
        }
    }
    for t in tasks {
        t.await??;
    }
    let took = started.elapsed();
    let turns = done.load(Ordering::Relaxed).min(plan.turns);
    println!(
        "  {turns} turns in {:.0} s ({:.0} turns/s)",
        took.as_secs_f64(),
        turns as f64 / took.as_secs_f64()
    );
    let warm = plan.turns * plan.warm_up_percent / 100;
    // The first window that starts after warm-up, against the last.
    let Some(first) = samples.iter().position(|s| s.from >= warm) else {
        bail!("no sample after warm-up");
    };
    let last = samples.last().expect("samples");
    let mut flat = true;
    for (k, (process, _)) in running.watched.iter().enumerate() {
        let from = samples[first].row[k].anonymous as f64;
        let to = last.row[k].anonymous as f64;
        let growth = (to - from) / from.max(1.0);
        println!(
            "  {process}: anonymous memory {:.1} → {:.1} MiB, from turns {}–{} to turns {}–{} (medians; {:+.1}%; {:.0} bytes per turn)",
            from / 1048576.0,
            to / 1048576.0,
            samples[first].from,
            samples[first].to,
            last.from,
            last.to,
            100.0 * growth,
            (to - from) / (last.to - samples[first].to).max(1) as f64
        );
        flat &= growth <= 0.10;
    }
    Ok(flat)
}

/// The memory of every watched process over one window of turns (`from` to `to`).
struct Sample {
    from: usize,
    to: usize,
    row: Vec<Resident>,
}

/// How often a process's memory is read while the turns run. Resident memory moves with the
/// turns in flight, by several MiB within a second and in swings of a minute or more, so a
/// reading at one moment can land on a peak or a trough: a sample is the median of every reading
/// of its window of turns (with the window's peak beside it), and growth compares those medians.
const READING_GAP: Duration = Duration::from_millis(500);

/// A process's memory over a window: its median reading (by anonymous memory, with the last
/// reading's file memory and threads) and its highest anonymous memory.
struct Level {
    median: Resident,
    max_anonymous: u64,
}

impl Level {
    fn of(readings: Vec<Resident>) -> Level {
        Level {
            max_anonymous: readings.iter().map(|r| r.anonymous).max().unwrap_or(0),
            median: median_of(readings),
        }
    }
}

/// The reading of median anonymous memory, with the last reading's file memory and threads.
fn median_of(mut readings: Vec<Resident>) -> Resident {
    let last = readings.last().copied().unwrap_or_default();
    readings.sort_by_key(|r| r.anonymous);
    Resident {
        anonymous: readings.get(readings.len() / 2).map_or(0, |r| r.anonymous),
        ..last
    }
}

/// The allocator's (mimalloc's) setting for how long a thread keeps the memory it freed before
/// giving it back to the kernel, in milliseconds.
const PURGE_DELAY: &str = "MIMALLOC_PURGE_DELAY";

/// What the soaked processes are told of the allocator: give freed memory back at once (a
/// purge delay of 0), unless the caller's environment chose a delay (which they inherit).
///
/// Why: the soak looks for memory kept per turn, and at mimalloc's default delay (1 s) a busy
/// process's resident memory keeps rising by a few bytes a turn for hundreds of thousands of
/// turns while its live heap does not (heaptrack counted a worker's live heap at 7.5 MiB after
/// 45,000 turns and 7.6 MiB after 120,000, as its resident memory rose by a fifth; with a delay
/// of 0 the same soak's resident memory stayed within 5%). With the delay at 0, resident memory
/// follows live data, and what grows is ours. The runtime's own default stays mimalloc's: at 0
/// the portable embedder loses about a third of its throughput (`turnpike bench embed`).
fn allocator_env() -> Vec<(&'static str, String)> {
    match std::env::var_os(PURGE_DELAY) {
        Some(_) => Vec::new(),
        None => vec![(PURGE_DELAY, "0".into())],
    }
}

/// How the soak's processes purge freed memory, for the report.
fn allocator_said() -> String {
    match std::env::var_os(PURGE_DELAY) {
        Some(ms) => format!(
            "freed memory given back after {} ms ({PURGE_DELAY} from the environment)",
            ms.to_string_lossy()
        ),
        None => format!(
            "freed memory given back at once ({PURGE_DELAY}=0, for the default mimalloc build; set it to soak with another delay), so resident memory follows live data"
        ),
    }
}

/// A new conversation with the soak's echo agent.
async fn new_conversation(client: &Client) -> Result<String> {
    let made = client
        .post(
            "/v1/conversations",
            &json!({"app": "soak", "agent": "echo"}),
        )
        .await
        .map_err(anyhow::Error::msg)?
        .into_ok()
        .map_err(anyhow::Error::msg)?;
    Ok(made["id"].as_str().unwrap_or_default().to_owned())
}

/// Runs turns over `ids` in turn (each message once the previous turn of its conversation
/// completed) until `done` reaches `total`; a conversation that took `per_conversation` turns
/// (0: no limit) is left for a new one.
async fn drive(
    client: Client,
    mut ids: Vec<String>,
    done: Arc<AtomicUsize>,
    total: usize,
    per_conversation: usize,
) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut cursors: Vec<(Cursor, usize)> = ids.iter().map(|id| (Cursor::new(id), 0)).collect();
    let mut sent = vec![0usize; ids.len()];
    let mut k = 0;
    while done.fetch_add(1, Ordering::Relaxed) < total {
        let i = k % ids.len();
        k += 1;
        if per_conversation > 0 && sent[i] >= per_conversation {
            ids[i] = new_conversation(&client).await?;
            cursors[i] = (Cursor::new(&ids[i]), 0);
            sent[i] = 0;
        }
        let id = &ids[i];
        sent[i] += 1;
        let n = sent[i];
        let reply = client
            .send(
                reqwest::Method::POST,
                &format!("/v1/conversations/{id}/messages"),
                Some(&json!({"text": format!("turn {n}")})),
                Some(&format!("soak-{n}")),
            )
            .await
            .map_err(anyhow::Error::msg)?;
        if reply.status != 202 {
            bail!("{id}: message {n}: {} {}", reply.status, reply.body);
        }
        let (cursor, complete) = &mut cursors[i];
        let deadline = Instant::now() + Duration::from_secs(120);
        // Polled soon, then less and less often: the reads are not what is measured, and a
        // client reading every 2 ms spends the server's CPU on reads instead of turns.
        let mut pause = Duration::from_millis(1);
        while *complete < n {
            let rows = cursor.read(&client).await.map_err(anyhow::Error::msg)?;
            *complete += rows.iter().filter(|r| r["kind"] == "turn_complete").count();
            if *complete >= n {
                break;
            }
            if Instant::now() > deadline {
                bail!("{id}: turn {n} did not complete within 120 s");
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_is_the_median_reading_not_a_peak() {
        let at = |anonymous, threads| Resident {
            anonymous,
            file: 7,
            threads,
        };
        let m = median_of(vec![at(50, 1), at(90, 2), at(48, 3), at(52, 4), at(49, 5)]);
        assert_eq!((m.anonymous, m.file, m.threads), (50, 7, 5));
        assert_eq!(median_of(Vec::new()).anonymous, 0);
        let level = Level::of(vec![at(50, 1), at(90, 2), at(48, 3)]);
        assert_eq!((level.median.anonymous, level.max_anonymous), (50, 90));
    }
}
