//! A conversation on the embedded bus with one worker hosting a scripted agent: for tests of
//! the turn (the agent loop, tools, approvals, compaction, switching).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::memory::InMemory;
use object_store::ObjectStore;
use tempfile::TempDir;
use turnpike_artifactory::{ConversationPrefix, Conversations, Record, TurnLogs};
use turnpike_router::embedded::{EmbeddedBus, EmbeddedConfig};
use turnpike_router::{Bus, Ingress};
use turnpike_schemas::entry::IngressDirective;
use turnpike_schemas::{Block, ConversationId, Event, EventBody, Identity, TurnId, TurnLog};
use turnpike_worker::tools::Tool;
use turnpike_worker::{Apps, Failpoints, Registry, Worker, WorkerConfig, WorkerPool};

use crate::counting::CountingStore;
use crate::counting_bus::CountingBus;
use crate::fixtures::{owner, signer, tenant};
use crate::lanes::{create_conversations, wait_for_turns};

/// How long a rig waits for anything.
pub const LONG: Duration = Duration::from_secs(30);

/// What the rig's app looks like.
pub struct RigOptions {
    /// The `helper` agent's script.
    pub script: String,
    pub max_rounds: u32,
    /// Tools of the `helper` agent.
    pub tools: Vec<String>,
    /// More lines for the `helper` agent's manifest table (e.g. `approval = […]`).
    pub agent_extra: String,
    /// More of the manifest after the `helper` agent (e.g. another agent).
    pub manifest_extra: String,
    /// Native tools added to the registry.
    pub native: Vec<Arc<dyn Tool>>,
    pub directive: Option<IngressDirective>,
    pub lease_ttl: Duration,
    /// Start with no worker running (see [`Rig::run`]).
    pub paused: bool,
    /// A bare git repository the worker mirrors project versions into.
    pub git_remote: Option<String>,
    /// Give the worker a cell (bubblewrap sandbox) for `exec`.
    pub cell: bool,
    /// Index finished turns into this index (and answer `search` from it).
    pub index: Option<turnpike_index::Index>,
    /// How often a running turn polls its lane besides the bus's signals.
    pub lane_poll: Duration,
    /// How long a wake is put off when another owner holds its conversation.
    pub busy_delay: Duration,
    /// What MCP servers' sandboxes may be granted to read (`/var/tmp`: the services' venvs
    /// and the tests' own files there).
    pub mcp_read_roots: Vec<PathBuf>,
    /// Internal addresses url MCP servers may be at (the tests' servers run on loopback).
    pub outbound_allow: Vec<String>,
    /// The worker fires schedules (off by default: its shard listings would count in the
    /// store counts other tests measure).
    pub schedules: bool,
}

impl RigOptions {
    pub fn new(script: &str) -> Self {
        RigOptions {
            script: script.to_owned(),
            max_rounds: 8,
            tools: ["read_file", "list_files", "write_file", "pull", "publish"]
                .map(String::from)
                .to_vec(),
            agent_extra: String::new(),
            manifest_extra: String::new(),
            native: Vec::new(),
            directive: None,
            lease_ttl: Duration::from_secs(15),
            paused: false,
            git_remote: None,
            cell: false,
            index: None,
            lane_poll: Duration::from_millis(10),
            busy_delay: Duration::from_millis(50),
            mcp_read_roots: vec!["/var/tmp".into()],
            outbound_allow: vec!["127.0.0.1".into()],
            schedules: false,
        }
    }
}

/// One conversation (app `support`, agent `helper`, owned by the fixture owner) and a worker.
pub struct Rig {
    pub counting: Arc<CountingStore>,
    /// The worker's bus, counting its lane reads.
    pub lane_reads: Arc<CountingBus>,
    make_worker: Box<dyn Fn(Failpoints) -> Worker + Send + Sync>,
    _dir: TempDir,
    pub bus: Arc<dyn Bus>,
    pub conversations: Conversations,
    pool: Option<WorkerPool>,
    pub conv: ConversationId,
    pub ingress: Ingress,
    workspaces: PathBuf,
    /// The queue finished turns go to for indexing (with [`RigOptions::index`]).
    pub indexing: Option<turnpike_index::indexer::IndexQueue>,
}

impl Rig {
    /// A rig with the script and round limit, otherwise defaults, its worker running.
    pub async fn start(script: &str, max_rounds: u32) -> Rig {
        let mut options = RigOptions::new(script);
        options.max_rounds = max_rounds;
        Self::with(options).await
    }

    pub async fn with(options: RigOptions) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("helper.script.toml"), &options.script).unwrap();
        let tools: Vec<String> = options.tools.iter().map(|t| format!("{t:?}")).collect();
        let manifest = format!(
            "app = \"support\"\n[agents.helper]\nprovider = \"script\"\nscript = \"helper.script.toml\"\n\
             system_prompt = \"You help.\"\nmax_rounds = {}\ntools = [{}]\n{}\n{}\n",
            options.max_rounds,
            tools.join(", "),
            options.agent_extra,
            options.manifest_extra
        );
        std::fs::write(dir.path().join("support.toml"), manifest).unwrap();
        let mut registry = Registry::builtin();
        for tool in options.native {
            registry = registry.with(tool);
        }
        let apps = Arc::new(Apps::new().load_dir(dir.path(), &registry).unwrap());
        let registry_for_workers = registry.clone();
        let counting = CountingStore::new(Arc::new(InMemory::new()));
        let store: Arc<dyn ObjectStore> = counting.clone();
        let conversations = Conversations::new(store);
        // A crashed worker's wakes come back after the ack wait: keep it near the lease TTL.
        let embedded: Arc<dyn Bus> = EmbeddedBus::open(
            &dir.path().join("bus.redb"),
            EmbeddedConfig {
                ack_wait: options.lease_ttl * 2,
                ..EmbeddedConfig::default()
            },
        )
        .unwrap();
        let lane_reads = CountingBus::new(embedded);
        let bus: Arc<dyn Bus> = lane_reads.clone();
        let workspaces = dir.path().join("workspaces");
        let ttl = options.lease_ttl;
        let schedules = options.schedules;
        let lane_poll = options.lane_poll;
        let busy_delay = options.busy_delay;
        let git_remote = options.git_remote.clone();
        let mcp_read_roots = options.mcp_read_roots.clone();
        let outbound = turnpike_agent::outbound::Outbound::parse(&options.outbound_allow)
            .expect("the rig's outbound allowlist");
        let cell: Result<Arc<turnpike_worker::cell::Cell>, String> = if options.cell {
            turnpike_worker::cell::Cell::detect(turnpike_worker::cell::CellConfig::default())
                .await
                .map(Arc::new)
        } else {
            Err("no sandbox (cell) is set up on this worker".into())
        };
        let indexing = options.index.map(|index| {
            turnpike_index::indexer::IndexQueue::start(turnpike_index::indexer::Indexer::new(
                index,
                conversations.store().clone(),
            ))
        });
        let make_worker = {
            let (bus, conversations, workspaces, indexing) = (
                bus.clone(),
                conversations.clone(),
                workspaces.clone(),
                indexing.clone(),
            );
            move |failpoints: Failpoints| {
                let worker = Worker::new(
                    bus.clone(),
                    conversations.clone(),
                    signer(),
                    apps.clone(),
                    WorkerConfig {
                        workspace_root: workspaces.clone(),
                        lane_poll,
                        lease_ttl: ttl,
                        renew_every: ttl / 3,
                        busy_delay,
                        failpoints,
                        git_remote: git_remote.clone(),
                        mcp_read_roots: mcp_read_roots.clone(),
                        outbound: outbound.clone(),
                        schedules: schedules.then(|| turnpike_worker::schedules::SchedulerConfig {
                            lease_ttl: ttl,
                            ..Default::default()
                        }),
                        ..WorkerConfig::default()
                    },
                )
                .with_cell(cell.clone())
                .with_tools(registry_for_workers.clone());
                match &indexing {
                    Some(queue) => worker.with_index(queue.clone()),
                    None => worker,
                }
            }
        };
        let conv = create_conversations(&conversations, &signer(), 1).await[0];
        let mut ingress = Ingress::new(bus.clone(), conversations.clone());
        if let Some(d) = options.directive {
            ingress = ingress.with_directive(d);
        }
        let mut rig = Rig {
            counting,
            lane_reads,
            make_worker: Box::new(make_worker),
            _dir: dir,
            bus,
            conversations,
            pool: None,
            conv,
            ingress,
            workspaces,
            indexing,
        };
        if !options.paused {
            rig.run();
        }
        rig
    }

    /// Starts a fresh worker (after [`RigOptions::paused`], [`Self::crash`] or [`Self::pause`]).
    pub fn run(&mut self) {
        assert!(self.pool.is_none(), "a worker is already running");
        self.pool = Some(WorkerPool::start([(self.make_worker)(
            Failpoints::default(),
        )]));
    }

    /// Starts a fresh worker that hangs at the failpoint `name` (see
    /// [`turnpike_lifecycle::failpoints`]).
    pub fn run_hanging_at(&mut self, name: &str) {
        self.run_with(
            Failpoints::default().with(name, turnpike_lifecycle::failpoints::Action::Hang),
        );
    }

    /// Starts a fresh worker with `failpoints`.
    pub fn run_with(&mut self, failpoints: Failpoints) {
        assert!(self.pool.is_none(), "a worker is already running");
        self.pool = Some(WorkerPool::start([(self.make_worker)(failpoints)]));
    }

    /// A worker of this rig that is not started: for calling [`Worker::sweep`] by hand.
    pub fn idle_worker(&self) -> Worker {
        (self.make_worker)(Failpoints::default())
    }

    /// Stops the worker gracefully.
    pub async fn pause(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.stop().await;
        }
    }

    /// Drops the worker as a crash would: turns stop where they are, leases stay held until
    /// they expire.
    pub async fn crash(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.crash().await;
        }
    }

    /// Submits `body` as the owner, through ingress.
    pub async fn send(&self, body: EventBody) {
        self.ingress
            .submit(&tenant(), &owner(), self.conv, body, None)
            .await
            .unwrap();
    }

    /// Publishes `body` as `identity` straight to the lane (as an edge that checked a grant
    /// would).
    pub async fn send_as(&self, identity: &Identity, body: EventBody) {
        let mut event = Event::new(
            turnpike_schemas::Address {
                tenant: tenant(),
                app: "support".parse().unwrap(),
                agent: "helper".parse().unwrap(),
                conversation: self.conv,
                identity: identity.clone(),
            },
            body,
            1,
        );
        event.idempotency_key = None;
        self.bus.publish(&event).await.unwrap();
    }

    pub async fn say(&self, text: &str) {
        self.send(EventBody::Message { text: text.into() }).await
    }

    /// Waits until `n` turns are closed.
    pub async fn wait_turns(&self, n: u64) {
        wait_for_turns(&self.conversations, &[self.conv], n, LONG)
            .await
            .unwrap();
    }

    /// Waits until the worker is done with every turn it committed: the open-turn mark it sets
    /// before a drain's first batch one is cleared once the drain ends with each turn promoted
    /// (a turn's canonical objects, its version's ref among them, are written just after its
    /// commit, so a reader of those keys waits for this, not only for [`Self::wait_turns`]).
    pub async fn wait_settled(&self) {
        let open_turns = self.conversations.open_turns();
        let deadline = Instant::now() + LONG;
        while open_turns.is_marked(&self.prefix()).await.unwrap() {
            assert!(Instant::now() < deadline, "the conversation never settled");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until the conversation's lease is free — a dead owner's has lapsed: a probe claim
    /// wins, and lets go at once.
    pub async fn wait_lease_free(&self) {
        crate::wait::until(LONG, "the conversation's lease to be free", || async {
            let lease = self
                .bus
                .claim(self.conv, turnpike_schemas::WorkerId::new(), LONG)
                .await
                .unwrap()?;
            self.bus.release(&lease).await.unwrap();
            Some(())
        })
        .await
    }

    pub fn prefix(&self) -> ConversationPrefix {
        ConversationPrefix::new(tenant(), self.conv)
    }

    pub fn record(&self) -> Record {
        Record::new(self.conversations.store().clone(), self.prefix())
    }

    pub async fn log(&self, n: u64) -> TurnLog {
        TurnLogs::new(self.conversations.store().clone())
            .read(&self.prefix(), TurnId::new(n).unwrap())
            .await
            .unwrap()
    }

    /// Waits until the record closes a turn as ambiguous (a side-effecting call cut short);
    /// returns that entry.
    pub async fn wait_ambiguous(&self) -> turnpike_schemas::entry::TurnAmbiguous {
        let deadline = Instant::now() + LONG;
        loop {
            let entries = self.record().entries().await.unwrap();
            if let Some(a) = entries.iter().find_map(|e| match &e.body {
                turnpike_schemas::EntryBody::TurnAmbiguous(a) => Some(a.clone()),
                _ => None,
            }) {
                return a;
            }
            assert!(Instant::now() < deadline, "no turn_ambiguous");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until turn `n` is dispatched (batch one committed).
    pub async fn wait_dispatched(&self, n: u64) {
        let deadline = Instant::now() + LONG;
        loop {
            let head = self.record().head().await.unwrap();
            if head.state().last_turn >= n {
                return;
            }
            assert!(Instant::now() < deadline, "turn {n} was never dispatched");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops the worker and checks that no workspace was left behind.
    pub async fn stop(mut self) {
        self.pause().await;
        let left: Vec<_> = std::fs::read_dir(&self.workspaces)
            .map(|d| d.filter_map(|e| e.ok()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "workspaces left behind: {left:?}");
    }
}

/// The texts of a log's assistant messages.
pub fn replies(log: &TurnLog) -> Vec<String> {
    log.blocks
        .iter()
        .filter_map(|b| match b {
            Block::AssistantMessage { text } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

/// The tools a log's calls named, in order.
pub fn tool_calls(log: &TurnLog) -> Vec<String> {
    log.blocks
        .iter()
        .filter_map(|b| match b {
            Block::ToolCall { tool, .. } => Some(tool.clone()),
            _ => None,
        })
        .collect()
}
