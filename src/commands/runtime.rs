//! `turnpike serve`, `router` and `worker`: the bus, the workers, and shutdown on signals.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use tracing::info;
use turnpike_artifactory::{Head, Record};
use turnpike_router::embedded::{EmbeddedBus, EmbeddedConfig};
use turnpike_router::{Bus, JetStreamBus, JetStreamConfig, Shards};
use turnpike_worker::cell::{Cell, CellConfig};
use turnpike_worker::{Apps, Failpoints, Worker, WorkerConfig, WorkerPool};

use crate::cli::{Global, RouterArgs, ServeArgs, WorkerArgs};
use crate::env::{open_index, Env};
use turnpike_index::indexer::{IndexQueue, Indexer};

/// Where the deployment's lane layout is persisted, in the object store every process shares.
const LANE_LAYOUT: &str = "bus/lane-layout.json";

/// Persists the lane layout on first start, and refuses to run when this process's layout does
/// not match it (another shard count, a recreated lane stream): the records' lane positions
/// would no longer match the lanes, and events would be skipped.
async fn check_lane_layout(
    store: &Arc<dyn object_store::ObjectStore>,
    layout: &turnpike_router::layout::LaneLayout,
) -> Result<()> {
    use object_store::{ObjectStoreExt as _, PutMode, PutOptions, PutPayload};
    let path = object_store::path::Path::from(LANE_LAYOUT);
    let bytes = serde_json::to_vec_pretty(layout)?;
    let create = PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    match store.put_opts(&path, PutPayload::from(bytes), create).await {
        Ok(_) => return Ok(()),
        Err(
            object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. },
        ) => {}
        Err(e) => return Err(e).context("persisting the lane layout"),
    }
    let persisted = store.get(&path).await?.bytes().await?;
    let persisted: turnpike_router::layout::LaneLayout =
        serde_json::from_slice(&persisted).with_context(|| format!("reading {LANE_LAYOUT}"))?;
    layout.check(&persisted).map_err(anyhow::Error::msg)
}

/// This process's name on NATS (`/connz` shows it): its command and pid.
fn connection_name() -> String {
    const ROLES: &[&str] = &["serve", "router", "worker", "demo", "lanes", "bench"];
    let role = std::env::args()
        .skip(1)
        .find(|a| ROLES.contains(&a.as_str()))
        .unwrap_or_else(|| "cli".into());
    format!("turnpike {role} pid {}", std::process::id())
}

/// Opens the bus the flags select: JetStream with `--nats-url`, else the embedded bus.
/// A fleet's lane layout is checked against the one persisted in `env`'s store.
pub async fn open_bus(global: &Global, env: &Env, ack_wait: Duration) -> Result<Arc<dyn Bus>> {
    open_bus_for(global, env, ack_wait, None).await
}

/// [`open_bus`] for a process running workers with `slots` turn slots in all: it pulls about as
/// many wakes ahead as it can start turns for, leaving the rest to workers with free slots.
pub async fn open_bus_for(
    global: &Global,
    env: &Env,
    ack_wait: Duration,
    slots: Option<usize>,
) -> Result<Arc<dyn Bus>> {
    match &global.nats_url {
        Some(url) => {
            let bus = JetStreamBus::connect(JetStreamConfig {
                url: url.clone(),
                auth: turnpike_router::jetstream::NatsAuth {
                    credentials_file: global.nats_creds.clone(),
                    nkey_file: global.nats_nkey_file.clone(),
                    user: global.nats_user.clone(),
                    password: global.nats_password.clone(),
                    token: global.nats_token.clone(),
                    ca_file: global.nats_ca.clone(),
                    cert_file: global.nats_cert.clone(),
                    key_file: global.nats_key.clone(),
                    require_tls: global.nats_require_tls,
                },
                shards: Shards::new(global.shards),
                replicas: global.replicas.max(1),
                ack_wait,
                name: connection_name(),
                prefetch: slots.map_or(16, |s| {
                    turnpike_router::jetstream::prefetch_for(s, global.shards)
                }),
                ..Default::default()
            })
            .await
            .with_context(|| format!("connecting to NATS at {url}"))?;
            check_lane_layout(env.conversations.store(), &bus.layout()).await?;
            Ok(bus)
        }
        None => {
            let path = global.data_dir.join("bus.redb");
            let bus = EmbeddedBus::open(
                &path,
                EmbeddedConfig {
                    ack_wait,
                    ..Default::default()
                },
            )
            .with_context(|| {
                format!(
                    "opening the embedded bus {} (is `turnpike serve` running on this data directory?)",
                    path.display()
                )
            })?;
            Ok(bus)
        }
    }
}

/// How outbound webhooks are delivered: the backoff given (or the default), the attempt's
/// timeout, delivery shards passing on as fast as conversations do.
fn webhook_config(
    args: &WorkerArgs,
    ttl: Duration,
) -> Result<turnpike_worker::webhooks::WebhookConfig> {
    let mut config = turnpike_worker::webhooks::WebhookConfig {
        lease_ttl: ttl,
        timeout: Duration::from_secs(args.webhook_timeout_secs.clamp(1, 300)),
        ..Default::default()
    };
    if !args.webhook_backoff.is_empty() {
        config.backoff = args
            .webhook_backoff
            .iter()
            .map(|d| match d.trim() {
                "0" => Ok(Duration::ZERO),
                d => turnpike_agent::duration::parse_duration(d),
            })
            .collect::<std::result::Result<_, _>>()
            .map_err(|why| anyhow::anyhow!("--webhook-backoff {why}"))?;
    }
    Ok(config)
}

/// How long a lone worker keeps a lease (`--keep-lease-ms`): at most a third of the lease's
/// time to live (so a kept lease never lapses while kept) and [`MAX_KEEP_LEASE`] (within what
/// a deletion waits for a held lease); a longer setting is cut down, and said so.
fn keep_lease_for(ms: u64, ttl: Duration) -> Duration {
    let asked = Duration::from_millis(ms);
    let most = (ttl / 3).min(MAX_KEEP_LEASE);
    if asked > most {
        eprintln!(
            "--keep-lease-ms {ms} is cut down to {}: at most a third of the lease's time to live and {} s",
            most.as_millis(),
            MAX_KEEP_LEASE.as_secs()
        );
        tracing::warn!(
            asked_ms = ms,
            kept_ms = most.as_millis() as u64,
            "--keep-lease-ms cut down"
        );
    }
    asked.min(most)
}

/// The longest `--keep-lease-ms` honoured: well within the 5 s a deletion through the API
/// waits for a held lease.
const MAX_KEEP_LEASE: Duration = Duration::from_secs(3);

/// The workers' settings, and what was refused (said at start and in `/readyz`).
fn worker_config(global: &Global, args: &WorkerArgs) -> Result<(WorkerConfig, Vec<String>)> {
    let ttl = Duration::from_millis(args.lease_ttl_ms.max(300));
    let mut refused = Vec::new();
    let config = WorkerConfig {
        slots: args.slots.max(1),
        lease_ttl: ttl,
        renew_every: ttl / 3,
        keep_lease_for: keep_lease_for(args.keep_lease_ms, ttl),
        sweep_every: Duration::from_millis(args.sweep_every_ms.max(100)),
        retention: match turnpike_worker::config::parse_retention(&args.retention) {
            Ok(retention) => retention,
            Err(why) => {
                // Deleting on a misread setting would lose data: nothing is deleted.
                eprintln!("retention is off: --retention {why}");
                tracing::warn!(%why, "retention is off: the setting does not parse");
                refused.push(format!("retention is off: --retention {why}"));
                None
            }
        },
        idle_timeout: turnpike_worker::config::parse_idle_timeout(&args.idle_timeout)
            .map_err(|why| anyhow::anyhow!("--idle-timeout {why}"))?,
        grace: Duration::from_millis(args.grace_ms),
        heartbeat_every: Duration::from_millis(args.heartbeat_ms.max(100)),
        git_remote: args.git_remote.clone(),
        mcp_read_roots: args.mcp_read_roots.clone(),
        outbound: turnpike_agent::outbound::Outbound::parse(&args.outbound_allow)
            .map_err(|why| anyhow::anyhow!("--outbound-allow {why}"))?,
        fair: turnpike_worker::fair::FairShare::parse(&args.tenant_weights, &args.tenant_caps)
            .map_err(anyhow::Error::msg)?,
        prices: match &args.prices {
            Some(path) => Some(Arc::new(
                turnpike_worker::usage::PriceTable::load(path).map_err(anyhow::Error::msg)?,
            )),
            None => None,
        },
        budgets: global.budgets.clone(),
        failpoints: Failpoints::from_env().map_err(anyhow::Error::msg)?,
        // Schedule shards pass on as fast as conversations do.
        schedules: Some(turnpike_worker::schedules::SchedulerConfig {
            lease_ttl: ttl,
            ..Default::default()
        }),
        webhooks: Some(webhook_config(args, ttl)?),
        ..Default::default()
    };
    // A budget in dollars counts costs, which only a price table gives.
    if config.prices.is_none() {
        for budget in &config.budgets {
            if matches!(budget.limit, turnpike_router::usage::Limit::MicroUsd(_)) {
                let why = format!(
                    "budget {budget} is in dollars but no price table is set (--prices): calls cost nothing, so it never runs out"
                );
                eprintln!("warning: {why}");
                tracing::warn!(%why, "a budget cannot work");
                refused.push(why);
            }
        }
    }
    Ok((config, refused))
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return ctrl_c.await.unwrap_or(()),
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await.unwrap_or(());
}

/// The cell's init (Landlock inside cells): the small `turnpike-cell-init` beside this binary
/// when it is there (a workspace build makes it), else this very binary, which runs as the init
/// when started under the init's name — so every build has the full sandbox.
pub fn cell_init_binary() -> Option<std::path::PathBuf> {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            tracing::warn!(error = %e, "this binary cannot find itself: cells run without Landlock (bubblewrap, seccomp and limits still apply)");
            return None;
        }
    };
    let small = exe.with_file_name("turnpike-cell-init");
    Some(if small.is_file() { small } else { exe })
}

/// Sets up the sandbox for `exec` once per process, or says why there is none (then `exec`
/// refuses: code never runs outside a cell).
pub async fn detect_cell() -> Result<Arc<Cell>, String> {
    let cell = Cell::detect(CellConfig {
        init: cell_init_binary(),
        ..CellConfig::default()
    })
    .await
    .map(Arc::new);
    match &cell {
        Ok(_) => info!("the cell (bubblewrap sandbox) is ready for exec"),
        Err(why) => tracing::warn!("exec is disabled: {why}"),
    }
    cell
}

/// The index queue for this process's workers, or `None` (search off, with a warning saying
/// why and how to turn it on). `catch_up`: index whatever the records hold that the index lacks
/// (the embedded default does this at start).
pub async fn indexing(global: &Global, env: &Env, catch_up: bool) -> Option<IndexQueue> {
    indexing_with(global, open_index(global).await, env, catch_up)
}

/// [`indexing`] over an index already opened (or the reason there is none). Its work (what
/// finished turns add to the index, and the catch-up) runs on the turn runtime, beside the
/// turns that make it, not beside the edge.
pub fn indexing_with(
    global: &Global,
    index: Result<turnpike_index::Index, String>,
    env: &Env,
    catch_up: bool,
) -> Option<IndexQueue> {
    let turns = turns_for(global);
    let _entered = turns.as_ref().ok().map(tokio::runtime::Handle::enter);
    match index {
        Ok(index) => {
            let indexer = Indexer::new(index, env.conversations.store().clone());
            if catch_up {
                let sweeper = indexer.clone();
                tokio::spawn(async move {
                    match sweeper.rebuild(false).await {
                        Ok((_, 0)) => {}
                        Ok((c, t)) => info!(conversations = c, turns = t, "index caught up"),
                        Err(e) => tracing::warn!(error = %e, "could not catch the index up"),
                    }
                });
            }
            Some(IndexQueue::start(indexer))
        }
        Err(why) => {
            tracing::warn!("search is off: {why}");
            None
        }
    }
}

/// `count` workers hosting `apps`.
pub async fn workers(
    env: &Env,
    bus: &Arc<dyn Bus>,
    apps: &Arc<Apps>,
    count: usize,
    config: &WorkerConfig,
    indexing: Option<IndexQueue>,
) -> Vec<Worker> {
    workers_on(detect_cell().await, env, bus, apps, count, config, indexing)
}

/// [`workers`] with the cell detected already.
fn workers_on(
    cell: Result<Arc<Cell>, String>,
    env: &Env,
    bus: &Arc<dyn Bus>,
    apps: &Arc<Apps>,
    count: usize,
    config: &WorkerConfig,
    indexing: Option<IndexQueue>,
) -> Vec<Worker> {
    (0..count.max(1))
        .map(|_| {
            let worker = Worker::new(
                bus.clone(),
                env.conversations.clone(),
                env.signer.clone(),
                apps.clone(),
                config.clone(),
            )
            .with_cell(cell.clone());
            match &indexing {
                Some(queue) => worker.with_index(queue.clone()),
                None => worker,
            }
        })
        .collect()
}

/// Starts `workers` on the process's turn runtime (see [`turn_runtime`]).
pub(crate) fn start_pool(global: &Global, workers: Vec<Worker>) -> Result<WorkerPool> {
    let _entered = turns_for(global)?.enter();
    Ok(WorkerPool::start(workers))
}

/// The turn runtime, with the process's setting of blocking threads (64 unless set).
fn turns_for(global: &Global) -> Result<tokio::runtime::Handle> {
    turn_runtime(global.blocking_threads.map_or(64, usize::from))
}

/// The turn runtime, once built (see [`turn_runtime`]).
static TURNS: std::sync::Mutex<Option<tokio::runtime::Runtime>> = std::sync::Mutex::new(None);

/// The runtime a process's workers run their turns on, apart from the one its edge and admin
/// listener answer on. In one run queue, a request waits behind a poll of every owner runnable
/// at once: with a backlog, hundreds of them. Apart, the OS shares the cores between the two
/// runtimes' threads, and the edge's — asleep until a request comes — get one at once
/// (`bench edge` over the API with turns running: about 9,000 messages accepted per second,
/// against about 5,900 in one runtime). Built on first use with a thread per core and
/// `blocking_threads` for blocking work (cells, git); [`shutdown_turns`] ends it.
pub(crate) fn turn_runtime(blocking_threads: usize) -> Result<tokio::runtime::Handle> {
    let mut turns = TURNS.lock().expect("turn runtime lock");
    if let Some(runtime) = turns.as_ref() {
        return Ok(runtime.handle().clone());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .thread_name("turnpike-turns")
        .max_blocking_threads(blocking_threads.max(1))
        .enable_all()
        .build()
        .context("starting the turns' runtime")?;
    Ok(turns.insert(runtime).handle().clone())
}

/// Ends the turn runtime, if one was built: what still runs there (a turn past its grace
/// period) is dropped, so its workspace and cell are cleaned up as they would be at the end of
/// a single runtime. Call it from outside async code (the end of `main`): a runtime may not be
/// dropped from within one.
pub fn shutdown_turns() {
    let runtime = TURNS.lock().expect("turn runtime lock").take();
    if let Some(runtime) = runtime {
        runtime.shutdown_timeout(Duration::from_secs(5));
    }
}

/// Workers running, with their admin listener.
struct Running {
    pool: WorkerPool,
    admin: Option<tokio::task::JoinHandle<()>>,
    /// Set on SIGTERM: `/readyz` fails from then on.
    draining: Arc<std::sync::atomic::AtomicBool>,
}

/// Starts the workers, and the admin listener with their probes. `cell_required`: a worker
/// without its sandbox is not ready (a fleet's: others can take its turns); the embedded
/// default runs turns without one (`exec` refuses) and says so in `/readyz`, ready.
#[allow(clippy::too_many_arguments)]
async fn run_workers(
    global: &Global,
    env: &Env,
    bus: Arc<dyn Bus>,
    apps: Arc<turnpike_worker::Apps>,
    count: usize,
    args: &WorkerArgs,
    indexing: Option<IndexQueue>,
    cell_required: bool,
) -> Result<Running> {
    let hosted: Vec<String> = apps.ids().iter().map(|a| a.to_string()).collect();
    eprintln!("hosting apps: {}", hosted.join(", "));
    let (config, refused) = worker_config(global, args)?;
    let cell = detect_cell().await;
    let probes = crate::commands::admin::Probes {
        bus: Some(bus.clone()),
        store: env.conversations.store().clone(),
        cell: Some(cell.as_ref().map(|_| ()).map_err(Clone::clone)),
        cell_required,
        refused,
        draining: Default::default(),
    };
    let draining = probes.draining.clone();
    let admin = crate::commands::admin::start(&global.admin_listen, probes).await?;
    metrics::gauge!("turnpike_worker_slots").set((config.slots * count.max(1)) as f64);
    let workers = workers_on(cell, env, &bus, &apps, count, &config, indexing);
    let mut pool = start_pool(global, workers)?;

    if args.apps_poll_ms > 0 {
        pool.keep(apps.watch(std::time::Duration::from_millis(args.apps_poll_ms)));
    }
    for id in pool.ids() {
        eprintln!("worker {id} ready");
    }
    Ok(Running {
        pool,
        admin,
        draining,
    })
}

/// Binds the edge's address and serves it in the background until `stop` fires.
async fn start_edge(
    edge: turnpike_edge::Edge,
    listen: std::net::SocketAddr,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let bound = listener.local_addr()?;
    eprintln!(
        "API listening on http://{bound}/v1 (OpenAPI: http://{bound}/v1/openapi.json; web console: http://{bound}/)"
    );
    Ok(tokio::spawn(async move {
        let mut stop = stop;
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        if let Err(e) = edge.serve(listener, shutdown).await {
            tracing::error!(error = %e, "the API server failed");
        }
    }))
}

/// Runs `workers` in-process workers until `record` has committed its lane through `seq` with
/// no turn open; returns the head then.
pub async fn run_until_committed(
    env: &Env,
    bus: Arc<dyn Bus>,
    record: &Record,
    seq: u64,
    count: usize,
) -> Result<Head> {
    let apps = env.apps(false)?;
    let workers = self::workers(env, &bus, &apps, count, &WorkerConfig::default(), None).await;
    let pool = WorkerPool::start(workers);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let head = loop {
        let head = record.head().await?;
        if head.state().lane_through >= seq && !head.state().turn_open {
            break head;
        }
        if std::time::Instant::now() > deadline {
            pool.stop().await;
            anyhow::bail!(
                "the workers did not commit the lane within a minute (state {:?})",
                head.state()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    pool.stop().await;
    Ok(head)
}

/// `turnpike serve`: the embedded default.
pub async fn serve(global: &Global, args: ServeArgs) -> Result<ExitCode> {
    anyhow::ensure!(
        global.nats_url.is_none(),
        "`serve` is the embedded default; for NATS run `turnpike router` and `turnpike worker`"
    );
    let env = Env::open(global)?;
    let bus = open_bus(global, &env, Duration::from_millis(args.worker.ack_wait_ms)).await?;
    eprintln!("serving from {}", global.data_dir.display());
    let apps = env.apps(false)?;
    let index = open_index(global).await;
    let search = index.as_ref().ok().cloned();
    let indexing = indexing_with(global, index, &env, true);
    let edge =
        crate::commands::edge::build(global, &env, bus.clone(), &apps, search, &args.edge, true)
            .await?;
    if args.edge.tokens.is_none() && !args.edge.has_jwt() {
        eprintln!(
            "API token for local:me is in {}",
            crate::commands::edge::default_tokens_path(global).display()
        );
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let draining_edge = edge.clone();
    let server = start_edge(edge, args.edge.listen, stop_rx).await?;
    let Running {
        pool,
        admin,
        draining,
    } = run_workers(
        global,
        &env,
        bus,
        apps,
        args.workers,
        &args.worker,
        indexing,
        false,
    )
    .await?;
    shutdown_signal().await;
    // Not ready from now on, before anything stops: traffic moves away first.
    draining.store(true, std::sync::atomic::Ordering::Release);
    info!("shutting down: no new claims, running turns get their grace period");
    pool.stop().await;
    // Open streams saw the turns through; they close with 1001 once their grace is over.
    draining_edge.drain();
    draining_edge.drained(Duration::from_secs(3)).await;
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    if let Some(admin) = admin {
        admin.abort();
    }
    Ok(ExitCode::SUCCESS)
}

/// `turnpike worker`: one fleet worker.
pub async fn worker(global: &Global, args: WorkerArgs) -> Result<ExitCode> {
    anyhow::ensure!(
        global.nats_url.is_some(),
        "a fleet worker needs --nats-url (or TURNPIKE_NATS_URL)"
    );
    let env = Env::open(global)?;
    let bus = open_bus_for(
        global,
        &env,
        Duration::from_millis(args.ack_wait_ms),
        Some(args.slots.max(1)),
    )
    .await?;
    // A fleet shares one index: Postgres. A worker's own embedded index would hold only the
    // turns it happened to run.
    let indexing = if global.index.database_url.is_some() {
        indexing(global, &env, false).await
    } else {
        tracing::warn!(
            "search is off: a fleet worker needs --database-url (Postgres with pgvector) for the shared index"
        );
        None
    };
    let apps = env.apps(false)?;
    let Running {
        pool,
        admin,
        draining,
    } = run_workers(global, &env, bus, apps, 1, &args, indexing, true).await?;
    shutdown_signal().await;
    draining.store(true, std::sync::atomic::Ordering::Release);
    info!("shutting down: no new claims, running turns get their grace period");
    pool.stop().await;
    if let Some(admin) = admin {
        admin.abort();
    }
    Ok(ExitCode::SUCCESS)
}

/// `turnpike router`: makes sure the bus topology exists and serves the edge until signalled.
pub async fn router(global: &Global, args: RouterArgs) -> Result<ExitCode> {
    anyhow::ensure!(
        global.nats_url.is_some(),
        "a fleet router needs --nats-url (or TURNPIKE_NATS_URL)"
    );
    let env = Env::open(global)?;
    let bus = open_bus(global, &env, Duration::from_secs(30)).await?;
    let apps = env.apps(false)?;
    // A fleet searches the shared index in Postgres; without it, `/v1/search` says search is off.
    let search = if global.index.database_url.is_some() {
        match open_index(global).await {
            Ok(index) => Some(index),
            Err(why) => {
                tracing::warn!("search is off: {why}");
                None
            }
        }
    } else {
        None
    };
    let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probes = crate::commands::admin::Probes {
        bus: Some(bus.clone()),
        store: env.conversations.store().clone(),
        cell: None,
        cell_required: false,
        refused: Vec::new(),
        draining: draining.clone(),
    };
    let edge =
        crate::commands::edge::build(global, &env, bus, &apps, search, &args.edge, false).await?;
    // The catalogue a router checks conversations against follows its apps folders.
    let watch =
        (args.apps_poll_ms > 0).then(|| apps.watch(Duration::from_millis(args.apps_poll_ms)));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let draining_edge = edge.clone();
    let server = start_edge(edge, args.edge.listen, stop_rx).await?;
    // Ready only once the API is bound.
    let admin = crate::commands::admin::start(&global.admin_listen, probes).await?;
    eprintln!("router ready: {} lane streams", global.shards);
    shutdown_signal().await;
    // Not ready, no new streams; open ones go on for the grace, then close with 1001.
    draining.store(true, std::sync::atomic::Ordering::Release);
    draining_edge.drain();
    draining_edge.drained(Duration::from_secs(3)).await;
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    if let Some(watch) = watch {
        watch.abort();
    }
    if let Some(admin) = admin {
        admin.abort();
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::{keep_lease_for, turn_runtime};
    use std::time::Duration;

    #[test]
    fn a_kept_lease_never_outlives_a_third_of_its_ttl_or_three_seconds() {
        let secs = Duration::from_secs;
        assert_eq!(keep_lease_for(1_000, secs(15)), secs(1));
        assert_eq!(keep_lease_for(0, secs(15)), Duration::ZERO);
        assert_eq!(keep_lease_for(600_000, secs(15)), secs(3));
        assert_eq!(keep_lease_for(2_500, secs(3)), secs(1));
        assert_eq!(keep_lease_for(u64::MAX, secs(9)), secs(3));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn turns_run_on_their_own_runtime_built_once() {
        let first = turn_runtime(4).unwrap();
        let again = turn_runtime(4).unwrap();
        assert_eq!(first.id(), again.id(), "one turn runtime per process");
        assert_ne!(
            first.id(),
            tokio::runtime::Handle::current().id(),
            "not the caller's runtime"
        );
        // What the pool spawns there runs on the turn runtime's threads, and tasks those spawn
        // stay there.
        let on = first
            .spawn(async {
                let inner =
                    tokio::spawn(async { std::thread::current().name().map(str::to_owned) });
                (
                    std::thread::current().name().map(str::to_owned),
                    inner.await.unwrap(),
                )
            })
            .await
            .unwrap();
        assert_eq!(on.0.as_deref(), Some("turnpike-turns"));
        assert_eq!(on.1.as_deref(), Some("turnpike-turns"));
    }
}
