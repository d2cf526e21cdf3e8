//! The command line.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use turnpike_schemas::{ConversationId, Identity};

/// Turnpike: a runtime that hosts many apps' AI agents for many users on one shared pool of
/// workers.
#[derive(Debug, Parser)]
#[command(name = "turnpike", version, about, args_override_self = true)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Prints what a command would run with (secrets redacted).
    Show {
        /// The command whose settings to print.
        #[arg(long = "for", default_value = "serve", value_parser = ["serve", "router", "worker"])]
        command: String,
        /// One JSON object per setting.
        #[arg(long)]
        json: bool,
    },
}

/// How a local store keeps its objects (`--local-store`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LocalStore {
    /// One SQLite database in the directory.
    Sqlite,
    /// A file per object.
    Files,
}

/// Flags every command takes.
#[derive(Debug, Clone, Args)]
pub struct Global {
    /// A TOML file of settings: keys are the flags' long names (`slots = 8`,
    /// `nats-url = "…"`). The environment and flags override it.
    #[arg(long, global = true, env = "TURNPIKE_CONFIG")]
    pub config: Option<PathBuf>,

    /// Where the embedded default keeps its data (store, keys, trusted checkpoints).
    #[arg(
        long,
        global = true,
        env = "TURNPIKE_DATA_DIR",
        default_value = "./turnpike-data"
    )]
    pub data_dir: PathBuf,

    /// The object store, for a fleet: `s3://bucket[/prefix]`, `file:///path`, `sqlite:///path`
    /// (one database in that directory, with group commit) or `memory://`.
    /// Without it, the store is `<data-dir>/store`.
    #[arg(long, global = true, env = "TURNPIKE_STORE")]
    pub store: Option<String>,

    /// How the embedded default keeps objects in `<data-dir>/store`: `sqlite` (one database,
    /// writes committed together) or `files` (a file per object). Default: what the directory
    /// already holds, and `sqlite` for a new one.
    #[arg(long, global = true, env = "TURNPIKE_LOCAL_STORE", value_enum)]
    pub local_store: Option<LocalStore>,

    /// The most threads the process starts for blocking work (file-store operations, git,
    /// archives, workspace walks); past it, such work queues, bounded by the disk anyway. Each
    /// thread keeps its stack and its own allocator pages (the async runtime's default of 512
    /// let a worker on a slow disk reach 468 threads), so a process that does little blocking
    /// work needs few. Default: 8 for `turnpike router` (it reads records and writes accepted
    /// events, no workspaces), 64 for every other command. Per async runtime: a process that
    /// runs workers (`serve`, `worker`) has two, the turns' and the rest's (the API, the admin
    /// listener), and the turns' does nearly all of its blocking work.
    #[arg(long, global = true, env = "TURNPIKE_BLOCKING_THREADS",
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub blocking_threads: Option<u16>,

    /// Skip fsync on a local store (faster; a power cut may then lose writes the caller saw
    /// succeed, a killed process loses none). By default a write is on disk when it returns.
    #[arg(long, global = true, env = "TURNPIKE_NO_FSYNC")]
    pub no_fsync: bool,

    /// The record signing key file (64 hex characters). The embedded default creates one under
    /// the data directory; with `--store` a key is required (this, or TURNPIKE_SIGNING_KEY).
    #[arg(long, global = true, env = "TURNPIKE_SIGNING_KEY_FILE")]
    pub signing_key: Option<PathBuf>,

    /// Identities that may run the operator commands (`conversation verify|replay|repair`,
    /// `git export`) on any conversation of their own tenant (`--tenant`). Every such use is
    /// logged with who did it.
    #[arg(
        long = "admin",
        global = true,
        env = "TURNPIKE_ADMINS",
        value_delimiter = ','
    )]
    pub admins: Vec<Identity>,

    /// Daily spending limits (UTC), e.g. `tenant=acme:tokens=1000000` or `app=demo:usd=5`
    /// (each tenant's use of the app). Routers refuse new messages once one is spent (429);
    /// workers refuse turns already queued, recording why. Repeat the flag or separate by
    /// commas; in the config file, `budget = ["…", "…"]`.
    #[arg(
        long = "budget",
        global = true,
        env = "TURNPIKE_BUDGETS",
        value_delimiter = ','
    )]
    pub budgets: Vec<turnpike_router::usage::Budget>,

    /// More trusted public keys (64 hex characters each), e.g. during a key rotation.
    #[arg(
        long = "trusted-key",
        global = true,
        env = "TURNPIKE_TRUSTED_KEYS",
        value_delimiter = ','
    )]
    pub trusted_keys: Vec<String>,

    /// Where `serve`, `router` and `worker` answer probes and scrapes (`/livez`, `/readyz`,
    /// `/metrics`); `off` for nowhere.
    #[arg(
        long,
        global = true,
        env = "TURNPIKE_ADMIN_LISTEN",
        default_value = "127.0.0.1:7701"
    )]
    pub admin_listen: String,

    /// Log filter in `RUST_LOG` syntax (also read from TURNPIKE_LOG, then RUST_LOG).
    #[arg(long, global = true, env = "TURNPIKE_LOG")]
    pub log: Option<String>,

    /// NATS for a fleet (JetStream lanes): one server, or several separated by commas (the
    /// client fails over between them). Without it, the embedded bus under the data directory.
    #[arg(long, global = true, env = "TURNPIKE_NATS_URL", hide_env_values = true)]
    pub nats_url: Option<String>,

    /// A NATS credentials file (`.creds`: a user JWT and its nkey seed).
    #[arg(long, global = true, env = "TURNPIKE_NATS_CREDS")]
    pub nats_creds: Option<PathBuf>,

    /// A file holding the NATS user's nkey seed (`SU…`).
    #[arg(long, global = true, env = "TURNPIKE_NATS_NKEY_FILE")]
    pub nats_nkey_file: Option<PathBuf>,

    /// A NATS user (with --nats-password).
    #[arg(long, global = true, env = "TURNPIKE_NATS_USER")]
    pub nats_user: Option<String>,

    /// The NATS user's password (better from the environment than on a command line).
    #[arg(
        long,
        global = true,
        env = "TURNPIKE_NATS_PASSWORD",
        hide_env_values = true
    )]
    pub nats_password: Option<String>,

    /// A NATS token (better from the environment than on a command line).
    #[arg(
        long,
        global = true,
        env = "TURNPIKE_NATS_TOKEN",
        hide_env_values = true
    )]
    pub nats_token: Option<String>,

    /// CA certificates (PEM) to verify the NATS servers with; TLS is then required.
    #[arg(long, global = true, env = "TURNPIKE_NATS_CA")]
    pub nats_ca: Option<PathBuf>,

    /// A client certificate (PEM) for NATS servers that verify clients (with --nats-key).
    #[arg(long, global = true, env = "TURNPIKE_NATS_CERT")]
    pub nats_cert: Option<PathBuf>,

    /// The client certificate's key (PEM).
    #[arg(long, global = true, env = "TURNPIKE_NATS_KEY")]
    pub nats_key: Option<PathBuf>,

    /// Refuse to talk to NATS without TLS (implied by a password, a token or a client
    /// certificate).
    #[arg(long, global = true, env = "TURNPIKE_NATS_REQUIRE_TLS")]
    pub nats_require_tls: bool,

    /// Lane streams in a fleet (fixed for a deployment).
    #[arg(long, global = true, env = "TURNPIKE_SHARDS", default_value_t = 8)]
    pub shards: u32,

    /// Replicas of every stream in a fleet (raise on a NATS cluster).
    #[arg(long, global = true, env = "TURNPIKE_REPLICAS", default_value_t = 1)]
    pub replicas: usize,

    /// A folder of app manifests (`*.toml`) to host besides `<data-dir>/apps`.
    #[arg(long, global = true, env = "TURNPIKE_APPS")]
    pub apps: Option<PathBuf>,

    /// Send traces (one per turn, from the edge's accept to the worker's model, tool and cell
    /// spans) to this OpenTelemetry collector over OTLP/HTTP, e.g. `http://otel:4318`.
    #[arg(long, global = true, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// Log format.
    #[arg(long, global = true, env = "TURNPIKE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    #[command(flatten)]
    pub index: IndexArgs,
}

/// Where the hybrid index lives and what embeds text for it.
#[derive(Debug, Clone, Args)]
pub struct IndexArgs {
    /// Postgres with pgvector for the index (a fleet), e.g.
    /// `postgres://user@127.0.0.1:5432/turnpike`. Without it: the embedded index under
    /// `<data-dir>/index`.
    #[arg(
        long,
        global = true,
        env = "TURNPIKE_DATABASE_URL",
        hide_env_values = true
    )]
    pub database_url: Option<String>,

    /// The local sentence-embedding model (a directory with config.json, tokenizer.json and
    /// model.safetensors; `scripts/services install all` fetches all-MiniLM-L6-v2).
    #[arg(
        long,
        global = true,
        env = "TURNPIKE_EMBEDDING_MODEL",
        default_value = "/var/tmp/turnpike-services/models/all-MiniLM-L6-v2"
    )]
    pub embedding_model: PathBuf,

    /// An OpenAI-compatible embeddings endpoint (up to and including `/v1`) to use instead of
    /// the local model.
    #[arg(long, global = true, env = "TURNPIKE_EMBEDDINGS_URL")]
    pub embeddings_url: Option<String>,

    /// The endpoint's model.
    #[arg(
        long,
        global = true,
        env = "TURNPIKE_EMBEDDINGS_MODEL",
        default_value = "text-embedding-3-small"
    )]
    pub embeddings_model: String,

    /// The endpoint model's dimension.
    #[arg(
        long,
        global = true,
        env = "TURNPIKE_EMBEDDINGS_DIMENSION",
        default_value_t = 1536
    )]
    pub embeddings_dimension: usize,

    /// The environment variable that holds the endpoint's API key ("" for none).
    #[arg(
        long,
        global = true,
        env = "TURNPIKE_EMBEDDINGS_KEY_ENV",
        default_value = "OPENAI_API_KEY"
    )]
    pub embeddings_key_env: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum QueryNumberingArg {
    Position,
    Id,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum JudgmentsFormatArg {
    Auto,
    Smart,
    Trec,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GradesArg {
    LowerIsBetter,
    HigherIsBetter,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The demo assistant's model: `script` (deterministic, the default) or `local` (a small
    /// language model served by llama.cpp on 127.0.0.1:8080; started here when installed with
    /// `scripts/services install llm` and not already running).
    #[arg(long, value_enum, default_value_t = DemoModel::Script)]
    pub model: DemoModel,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DemoModel {
    Script,
    Local,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Runs the whole system on the embedded default and shows what it did.
    Demo(DemoArgs),
    /// The configuration: `config show [--for serve|router|worker]` prints every setting of
    /// that command, its value and where it came from (default, file, env, flag).
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Read-only checks and operator tools for one conversation.
    #[command(subcommand)]
    Conversation(ConversationCommand),
    /// Runs one echo turn through ingress, the lane and both batches of the record (embedded).
    #[command(subcommand)]
    Record(RecordCommand),
    /// The embedded default: router and workers in one process, data under `--data-dir`.
    Serve(Box<ServeArgs>),
    /// A fleet router: creates the lane streams, consumers and lease stream, and serves the
    /// HTTP/WebSocket edge.
    Router(RouterArgs),
    /// A fleet worker: claims lanes from NATS and runs their turns.
    Worker(WorkerArgs),
    /// Puts an event on a conversation's lane.
    Send(SendArgs),
    /// Prints a conversation's committed rows from the record, optionally following it.
    Tail(TailArgs),
    /// Lists a fleet's live workers: those whose heartbeat arrives within a window.
    Workers(WorkersArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Project versions (one git ref per successful turn).
    #[command(subcommand)]
    Git(GitCommand),
    /// The sandbox for generated code.
    #[command(subcommand)]
    Cell(CellCommand),
    /// Searches all of the actor's conversations by meaning and by words.
    Search(SearchArgs),
    /// Talks to a conversation through the API of `turnpike serve` (or a fleet's router).
    Chat(ChatArgs),
    /// Your schedules, through the API: messages fired into conversations by a cron expression
    /// or an interval, each firing once across the fleet.
    Schedule(ScheduleArgs),
    /// Your outbound webhooks, through the API: turn events of your conversations, signed
    /// (Standard Webhooks), retried, then dead letters.
    Webhook(WebhookArgs),
    /// The hybrid index.
    #[command(subcommand)]
    Index(IndexCommand),
    /// Prints a page of the book's reference, generated from these definitions: every command
    /// and its options (`cli`), or the configuration file's keys (`config`).
    Reference {
        #[arg(value_enum)]
        page: ReferencePage,
    },
}

/// A page of the book's reference (`turnpike reference`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReferencePage {
    /// Every command and its options.
    Cli,
    /// The configuration file's keys (`--config`), per long-running command.
    Config,
    /// The kinds of entry a conversation's record holds.
    Entries,
    /// The API's error codes.
    Errors,
    /// The HTTP API's endpoints, from its OpenAPI document.
    Api,
}

#[derive(Debug, Args)]
pub struct ChatArgs {
    /// The API's address.
    #[arg(long, env = "TURNPIKE_URL", default_value = "http://127.0.0.1:7700")]
    pub url: String,
    /// The bearer token; default: the one `turnpike serve` generated in `<data-dir>/tokens.toml`.
    #[arg(long, env = "TURNPIKE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Continue this conversation (default: pick one, or start one).
    #[arg(long)]
    pub conversation: Option<String>,
    /// Start a new conversation with this app (and `--agent`).
    #[arg(long)]
    pub app: Option<String>,
    #[arg(long)]
    pub agent: Option<String>,
}

/// How a command reaches the API (`turnpike schedule`, `turnpike webhook`).
#[derive(Debug, Args)]
pub struct ApiArgs {
    /// The API's address.
    #[arg(
        long,
        env = "TURNPIKE_URL",
        default_value = "http://127.0.0.1:7700",
        global = true
    )]
    pub url: String,
    /// The bearer token; default: the one `turnpike serve` generated in `<data-dir>/tokens.toml`.
    #[arg(long, env = "TURNPIKE_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ScheduleArgs {
    #[command(flatten)]
    pub api: ApiArgs,
    #[command(subcommand)]
    pub command: ScheduleCommand,
}

#[derive(Debug, Args)]
pub struct WebhookArgs {
    #[command(flatten)]
    pub api: ApiArgs,
    #[command(subcommand)]
    pub command: WebhookCommand,
}

#[derive(Debug, Subcommand)]
pub enum WebhookCommand {
    /// Lists your subscriptions: ID, URL, EVENTS, CONVERSATION.
    List,
    /// Subscribes to turn events of your conversations and prints the id and the signing
    /// secret (shown this once).
    Create {
        /// Where deliveries go (http or https).
        #[arg(value_name = "URL")]
        endpoint: String,
        /// The kinds wanted (turn.completed, turn.failed, turn.cancelled, turn.parked,
        /// schedule.firing); default: all. Repeatable.
        #[arg(long = "event", value_delimiter = ',')]
        events: Vec<String>,
        /// Only this conversation of yours (default: every one you own).
        #[arg(long)]
        conversation: Option<String>,
    },
    /// Deletes a subscription.
    Delete { id: String },
    /// Lists deliveries that ran out of attempts (yours; a tenant's admin sees every one).
    DeadLetters,
    /// Puts a dead letter back in line, its attempts from zero.
    Redeliver { id: String },
}

#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Lists your schedules: ID, WHEN, NEXT, LAST (the latest firing and its outcome), PAUSED.
    List,
    /// Shows one schedule and its latest firings (fired, skipped, missed) with their
    /// conversations.
    Show { id: String },
    /// Creates a schedule and prints its id. Exactly one of `--cron` and `--every`.
    Create(Box<ScheduleCreate>),
    /// Stops firing until resumed.
    Pause { id: String },
    /// Fires again.
    Resume { id: String },
    /// Deletes a schedule and its history.
    Delete { id: String },
}

#[derive(Debug, Args)]
pub struct ScheduleCreate {
    /// The message each firing sends.
    #[arg(long)]
    pub text: String,
    /// A cron expression (5 fields, or 6 with seconds first; `@daily`, …).
    #[arg(long)]
    pub cron: Option<String>,
    /// The IANA time zone of `--cron` (default UTC).
    #[arg(long)]
    pub zone: Option<String>,
    /// Fire every this many seconds.
    #[arg(long)]
    pub every: Option<u64>,
    /// The app and agent of each new conversation.
    #[arg(long)]
    pub app: Option<String>,
    #[arg(long)]
    pub agent: Option<String>,
    /// Fire into this conversation of yours every time (default: a new one per firing).
    #[arg(long)]
    pub conversation: Option<String>,
    /// Firings missed while nothing could fire them: skip, latest (default), all.
    #[arg(long)]
    pub missed: Option<String>,
    /// With `--missed all`: the most missed firings fired.
    #[arg(long)]
    pub catch_up: Option<u32>,
    /// When the previous firing's turn still runs: skip, queue (default), cancel.
    #[arg(long)]
    pub overlap: Option<String>,
    /// Put each firing off by up to this many seconds.
    #[arg(long)]
    pub jitter: Option<u64>,
    /// A firing later than this many seconds is missed (default 60).
    #[arg(long)]
    pub grace: Option<u64>,
}

#[derive(Debug, Args)]
pub struct SearchArgs {
    /// What to look for (words, or web-search syntax: "a phrase", -excluded, or).
    pub query: String,
    #[command(flatten)]
    pub actor: Actor,
    /// Which retrievers: hybrid (both, fused), lexical or vector.
    #[arg(long, default_value = "hybrid")]
    pub mode: String,
    #[arg(long)]
    pub app: Option<turnpike_schemas::AppId>,
    #[arg(long)]
    pub agent: Option<turnpike_schemas::AgentId>,
    #[arg(long)]
    pub conversation: Option<turnpike_schemas::ConversationId>,
    /// Only these kinds (prompt, completion, summary, attachment, file); repeatable.
    #[arg(long = "kind")]
    pub kinds: Vec<String>,
    /// Only rows at or after this time (ms since the epoch).
    #[arg(long)]
    pub since_ms: Option<i64>,
    /// Only rows before this time (ms since the epoch).
    #[arg(long)]
    pub until_ms: Option<i64>,
    /// Hits per page (1..=100).
    #[arg(long, default_value_t = 10)]
    pub limit: usize,
    /// Where the page starts (the `next` a previous page printed).
    #[arg(long, default_value_t = 0)]
    pub offset: usize,
    /// At most this many hits per conversation.
    #[arg(long)]
    pub per_conversation: Option<usize>,
    /// Favour recent rows: a row this many hours old gets half the boost.
    #[arg(long)]
    pub recency_half_life_hours: Option<f64>,
    /// Print the page as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum IndexCommand {
    /// Indexes every completed turn the index lacks, from the records (all conversations, or
    /// one). Idempotent: rows already there are rewritten unchanged.
    Rebuild {
        #[arg(long)]
        conversation: Option<ConversationId>,
        /// Forget the marks first, so every turn is written again.
        #[arg(long)]
        full: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum CellCommand {
    /// Runs a Python script in a fresh cell and prints the result and the files it produced.
    Run {
        file: PathBuf,
        /// The workspace to run over (default: a fresh empty one, removed afterwards).
        #[arg(long)]
        workspace: Option<PathBuf>,
        /// Wall-clock limit in seconds.
        #[arg(long, default_value_t = 30)]
        timeout_secs: u64,
    },
}

#[derive(Debug, Subcommand)]
pub enum GitCommand {
    /// Writes a plain bare repository with one tag `turn_<n>` per version and `main` at the last.
    Export {
        conversation: ConversationId,
        /// Where to write it (created; must not be a repository already).
        dir: PathBuf,
        #[command(flatten)]
        actor: Actor,
    },
}

/// Settings of the workers a process runs.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Conversations owned at once per worker (turn slots).
    #[arg(long, default_value_t = 64)]
    pub slots: usize,
    /// Lease time-to-live in milliseconds (renewed at a third of it).
    #[arg(long, default_value_t = 15_000)]
    pub lease_ttl_ms: u64,
    /// How long a worker alone on the bus keeps a conversation's lease after its lane is
    /// drained, for the next message to take it up without a claim, in milliseconds (0: let it
    /// go at once, as workers of a fleet do; at most 3 s and a third of the lease's time-to-live).
    /// A deletion of the conversation waits for it; after a crash, the conversation's next
    /// message waits out the lease's time-to-live.
    #[arg(long, default_value_t = 1_000)]
    pub keep_lease_ms: u64,
    /// How often to sweep for turns left open by dead owners, in milliseconds (also once at
    /// start).
    #[arg(long, default_value_t = 30_000)]
    pub sweep_every_ms: u64,
    /// How long a delivered wake may go unacknowledged before redelivery, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub ack_wait_ms: u64,
    /// Grace period for running turns at shutdown, in milliseconds.
    #[arg(long, default_value_t = 20_000)]
    pub grace_ms: u64,
    /// How often the worker announces itself (`turnpike workers` lists it, and other workers
    /// count it until two of these pass without a beat), in milliseconds.
    #[arg(long, default_value_t = 5_000)]
    pub heartbeat_ms: u64,
    /// How often to look for changed manifests in the apps folders, in milliseconds (0: never;
    /// a change that does not load keeps the running apps and is logged).
    #[arg(long, default_value_t = 2_000)]
    pub apps_poll_ms: u64,
    /// Delete conversations closed for longer than this (`off`, or e.g. `24h`, `7d`); a
    /// setting that does not parse deletes nothing and says so at start.
    #[arg(long, default_value = "off")]
    pub retention: String,
    /// Close conversations idle for this long (`off`, or e.g. `30m`, `24h`) when their app's
    /// manifest sets no `idle_timeout`; the next message reopens them.
    #[arg(long, default_value = "off")]
    pub idle_timeout: String,
    /// The price table (TOML: `version`, then `[[price]]` with `provider`, `model`,
    /// `input_usd_per_mtok`, `output_usd_per_mtok`, optionally `cached_input_usd_per_mtok`):
    /// each model call's `usage` entry carries its cost from it.
    #[arg(long, env = "TURNPIKE_PRICES")]
    pub prices: Option<PathBuf>,
    /// A bare git repository to mirror every project version into
    /// (`refs/turnpike/<conversation>/turn_<n>`).
    #[arg(long, env = "TURNPIKE_GIT_REMOTE")]
    pub git_remote: Option<String>,
    /// A host directory an app's MCP servers may be given read access to (their
    /// installation: a manifest's `read_only` paths must lie under one of these). Repeatable.
    #[arg(
        long = "mcp-read-root",
        env = "TURNPIKE_MCP_READ_ROOTS",
        value_delimiter = ',',
        default_value = "/opt"
    )]
    pub mcp_read_roots: Vec<PathBuf>,
    /// An internal address, range (CIDR) or host name that apps' MCP servers may be called
    /// at. Loopback, link-local (cloud metadata), private and shared ranges are refused
    /// otherwise, checked after DNS resolution. Repeatable.
    #[arg(
        long = "outbound-allow",
        env = "TURNPIKE_OUTBOUND_ALLOW",
        value_delimiter = ','
    )]
    pub outbound_allow: Vec<String>,
    /// When outbound webhook deliveries are attempted, each after the one before failed: a
    /// comma-separated list of durations (`0,5s,5m,30m,2h,5h,10h,10h` by default: eight
    /// attempts over about 28 hours); past the last, a delivery is a dead letter.
    #[arg(
        long = "webhook-backoff",
        env = "TURNPIKE_WEBHOOK_BACKOFF",
        value_delimiter = ','
    )]
    pub webhook_backoff: Vec<String>,
    /// The longest one webhook delivery attempt may take, in seconds.
    #[arg(
        long = "webhook-timeout-secs",
        env = "TURNPIKE_WEBHOOK_TIMEOUT_SECS",
        default_value_t = 15
    )]
    pub webhook_timeout_secs: u64,
    /// A tenant's share of the turn slots when work waits, as `TENANT=WEIGHT` (`*=WEIGHT`:
    /// every tenant not named; 1 by default): a tenant of weight 2 gets twice the slots of
    /// one of weight 1. Repeatable.
    #[arg(
        long = "tenant-weight",
        env = "TURNPIKE_TENANT_WEIGHTS",
        value_delimiter = ','
    )]
    pub tenant_weights: Vec<String>,
    /// The most turns of a tenant a worker runs at once, as `TENANT=N` (`*=N`: every tenant not
    /// named; no cap by default). Repeatable.
    #[arg(
        long = "tenant-cap",
        env = "TURNPIKE_TENANT_CAPS",
        value_delimiter = ','
    )]
    pub tenant_caps: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Workers in this process (each has `--slots` turn slots; one is usually right).
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    #[command(flatten)]
    pub worker: WorkerArgs,
    #[command(flatten)]
    pub edge: EdgeArgs,
}

#[derive(Debug, Args)]
pub struct RouterArgs {
    #[command(flatten)]
    pub edge: EdgeArgs,
    /// How often to look for changed manifests in the apps folders, in milliseconds (0: never).
    #[arg(long, default_value_t = 2_000)]
    pub apps_poll_ms: u64,
}

/// The HTTP/WebSocket edge.
#[derive(Debug, Clone, Args)]
pub struct EdgeArgs {
    /// Where the API listens.
    #[arg(long, env = "TURNPIKE_LISTEN", default_value = "127.0.0.1:7700")]
    pub listen: std::net::SocketAddr,
    /// Bearer tokens → identities (TOML; see deploy/README.md). `turnpike serve` creates
    /// `<data-dir>/tokens.toml` with one token for `local:me` when neither this nor `--jwks` is set.
    #[arg(long, env = "TURNPIKE_TOKENS")]
    pub tokens: Option<PathBuf>,
    /// Verify JWTs against the keys in this JWKS file (with --jwt-issuer and --jwt-audience).
    #[arg(long, env = "TURNPIKE_JWKS")]
    pub jwks: Option<PathBuf>,
    /// Verify JWTs against the keys the identity provider publishes at this URL, cached for
    /// its Cache-Control max-age (5 minutes without one) and fetched again on an unknown key
    /// id (at most every 10 s); the last good keys stay in use while it cannot be reached.
    #[arg(long, env = "TURNPIKE_JWKS_URL")]
    pub jwks_url: Option<String>,
    /// Find the JWKS URL by OIDC discovery: `<--jwt-issuer>/.well-known/openid-configuration`.
    /// One of --jwks, --jwks-url and --jwt-discover at a time (the server refuses to start
    /// with two).
    #[arg(long, env = "TURNPIKE_JWT_DISCOVER")]
    pub jwt_discover: bool,
    #[arg(long, env = "TURNPIKE_JWT_ISSUER", default_value = "")]
    pub jwt_issuer: String,
    #[arg(long, env = "TURNPIKE_JWT_AUDIENCE", default_value = "turnpike")]
    pub jwt_audience: String,
    /// Identities from JWTs are `oidc:<this>:<sub>`.
    #[arg(long, env = "TURNPIKE_JWT_IDENTITY_SCOPE", default_value = "sso")]
    pub jwt_identity_scope: String,
    /// The claim that names the caller's tenant.
    #[arg(long, default_value = "tenant")]
    pub jwt_tenant_claim: String,
    /// The claim that, when true, makes the caller an admin.
    #[arg(long, default_value = "turnpike_admin")]
    pub jwt_admin_claim: String,
    /// Requests per second per identity (0: no limit).
    #[arg(long, env = "TURNPIKE_RATE_PER_SECOND", default_value_t = 50)]
    pub rate_per_second: u32,
    /// Requests an identity may burst above the rate.
    #[arg(long, default_value_t = 100)]
    pub rate_burst: u32,
    /// Event submissions in flight to the bus at once; beyond it, 503 with Retry-After.
    #[arg(long, default_value_t = 1024)]
    pub max_in_flight: usize,
    /// On SIGTERM, how long open WebSocket streams go on before they are closed with 1001 (going
    /// away), in milliseconds; new streams are refused at once.
    #[arg(long, default_value_t = 5_000)]
    pub ws_grace_ms: u64,
    /// A built book to serve at `/book/`, the console's help (`mdbook build book`, then
    /// `--book book/book`); without it `/book/` says where the book is.
    #[arg(long, env = "TURNPIKE_BOOK")]
    pub book: Option<PathBuf>,
    /// The deployment's round limit: no turn runs more model rounds than this, whatever its
    /// agent allows (recorded with each turn's inputs).
    #[arg(long, env = "TURNPIKE_MAX_ROUNDS")]
    pub max_rounds: Option<u32>,
    /// An identity that must approve every gated tool call (recorded with each turn's inputs).
    #[arg(long, env = "TURNPIKE_REQUIRED_APPROVER")]
    pub required_approver: Option<Identity>,
}

impl EdgeArgs {
    /// Whether JWTs are verified (a JWKS file, URL, or discovery).
    pub fn has_jwt(&self) -> bool {
        self.jwks.is_some() || self.jwks_url.is_some() || self.jwt_discover
    }
}

/// The book's page for each command (`--help` ends with it); the rest point at the command
/// reference, which lists every flag.
const BOOK_PAGES: &[(&str, &str)] = &[
    ("demo", "getting-started/quickstart.md"),
    ("serve", "getting-started/first-agent.md"),
    ("chat", "getting-started/first-agent.md"),
    ("router", "operating/fleet.md"),
    ("worker", "operating/fleet.md"),
    ("workers", "operating/fleet.md"),
    ("conversation", "operating/runbook.md"),
    ("bench", "operating/benchmarks.md"),
    ("search", "guides/search.md"),
    ("schedule", "guides/sessions.md"),
    ("webhook", "guides/sessions.md"),
    ("config", "reference/config.md"),
];

/// The command line with each command's `--help` ending in its page of the book.
pub fn with_book_pages(command: clap::Command) -> clap::Command {
    command
        .after_help(
            "The book: book/src/SUMMARY.md (every command and flag: book/src/reference/cli.md)",
        )
        .mut_subcommands(|sub| {
            let page = BOOK_PAGES
                .iter()
                .find(|(name, _)| *name == sub.get_name())
                .map_or("reference/cli.md", |(_, page)| page);
            with_page(sub, &format!("The book: book/src/{page}"))
        })
}

/// `command` and every command under it, ending their help with `line`.
fn with_page(command: clap::Command, line: &str) -> clap::Command {
    command
        .after_help(line.to_owned())
        .mut_subcommands(|sub| with_page(sub, line))
}

impl Command {
    /// The bound on the process's blocking threads when `--blocking-threads` is not given: a
    /// router does little blocking work, and every thread it starts keeps its allocator pages
    /// (a fleet soak's router grew 22% to 600k turns under 64, 11% to 800k under 8, flat
    /// after 300k).
    pub fn default_blocking_threads(&self) -> u16 {
        match self {
            Command::Router(_) => 8,
            _ => 64,
        }
    }

    /// Whether the command serves or talks over the network for long (a server, a benchmark,
    /// an interactive client) rather than printing a result and ending.
    pub fn is_long_running(&self) -> bool {
        matches!(
            self,
            Command::Serve(_)
                | Command::Router(_)
                | Command::Worker(_)
                | Command::Bench(_)
                | Command::Demo(_)
                | Command::Chat(_)
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EventKindArg {
    Message,
    FollowUp,
    Steer,
    Stop,
    /// Approve `--request` (`--text` is the reason).
    Approve,
    /// Deny `--request` (`--text` is the reason).
    Deny,
    /// Answer question `--request` with `--text`.
    Answer,
    /// Hand the conversation to agent `--text`.
    SwitchAgent,
    /// Summarise older turns now.
    Compact,
}

#[derive(Debug, Args)]
pub struct SendArgs {
    /// The conversation; `new` creates one (its id is printed first).
    pub conversation: String,
    #[command(flatten)]
    pub actor: Actor,
    /// The text of the event.
    #[arg(long, default_value = "")]
    pub text: String,
    #[arg(long, value_enum, default_value_t = EventKindArg::Message)]
    pub kind: EventKindArg,
    /// The approval request or question an `approve`, `deny` or `answer` is for.
    #[arg(long)]
    pub request: Option<turnpike_schemas::RequestId>,
    /// The client's idempotency key: a retried send with the same key is accepted once.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// The API of a `turnpike serve` holding this data directory: used when it does (with the
    /// token `<data-dir>/tokens.toml` holds for `--actor`).
    #[arg(long, env = "TURNPIKE_URL", default_value = "http://127.0.0.1:7700")]
    pub url: String,
}

#[derive(Debug, Args)]
pub struct WorkersArgs {
    /// How long to listen, in milliseconds (a worker beats every `--heartbeat-ms`, 5 s by
    /// default).
    #[arg(long, default_value_t = 6_000)]
    pub window_ms: u64,
    /// One JSON object per worker.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct TailArgs {
    pub conversation: ConversationId,
    #[command(flatten)]
    pub actor: Actor,
    /// Keep printing rows as they are committed.
    #[arg(long)]
    pub follow: bool,
    /// Exit once the record holds this many completed turns (with --follow).
    #[arg(long)]
    pub until_turns: Option<u64>,
    /// Give up following after this many seconds (exit code 1).
    #[arg(long)]
    pub timeout_secs: Option<u64>,
}

#[derive(Debug, Subcommand)]
pub enum ConversationCommand {
    /// Verifies the record: every digest, root and signature; exits 1 on any failure.
    Verify {
        conversation: ConversationId,
        #[command(flatten)]
        actor: Actor,
        /// Verify only what was appended since the last successful verify.
        #[arg(long)]
        incremental: bool,
    },
    /// Prints the committed transcript, then incomplete and quarantined turns apart.
    Replay {
        conversation: ConversationId,
        #[command(flatten)]
        actor: Actor,
        /// Changes one recorded step and reports where the replay diverges:
        /// `turn_<n>/output/<k>=<text>` (the k-th model output of turn n says `<text>`) or
        /// `turn_<n>/result/<call_id>=<json>` (a tool call's result is `<json>`).
        #[arg(long)]
        what_if: Option<turnpike_agent::replay::WhatIf>,
    },
    /// Creates a conversation owned by the actor and prints its id.
    Create {
        #[command(flatten)]
        actor: Actor,
        #[arg(long, default_value = "demo")]
        app: turnpike_schemas::AppId,
        #[arg(long, default_value = "echo")]
        agent: turnpike_schemas::AgentId,
    },
    /// Lists the tenant's conversations for an operator (an admin): NAME PHASE READY AGENT AGE,
    /// like `kubectl get`; `--json` adds every condition with its reason.
    List {
        #[command(flatten)]
        actor: Actor,
        #[arg(long)]
        app: Option<turnpike_schemas::AppId>,
        /// Only this phase: idle, running, waiting, closed.
        #[arg(long)]
        status: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Deletes a conversation from every store (its owner, or an admin of its tenant): record,
    /// turn logs, files, attachments, project versions, index rows, grants, directory entry,
    /// the rest of its lane. A tombstone keeps who, when, why and the record's final root.
    Delete {
        conversation: ConversationId,
        #[command(flatten)]
        actor: Actor,
        /// Why (kept in the tombstone).
        #[arg(long, default_value = "erasure requested")]
        reason: String,
    },
    /// Writes one archive (a tar file) of a conversation (its owner, or an admin of its
    /// tenant): the record (verifiable offline with the public key the archive carries), turn
    /// logs, files, attachments, and the project as a git bundle.
    Export {
        conversation: ConversationId,
        /// Where to write it (must not exist).
        file: PathBuf,
        #[command(flatten)]
        actor: Actor,
    },
    /// Restores an exported conversation into this deployment under the same id: checked
    /// first (names, the record's signatures), re-signed here with the original root kept as
    /// provenance, and indexed when the deployment has an index.
    Import {
        file: PathBuf,
        /// The exporting deployment's public key (64 hex characters; repeat it for several):
        /// the archive must be signed by one of them. Without it the archive vouches for
        /// itself, and the import says its origin is not verified.
        #[arg(long)]
        expect_key: Vec<String>,
        /// Only check the archive offline (its names, and its record against the key): write
        /// nothing.
        #[arg(long)]
        check: bool,
    },
    /// Removes unreadable entries and re-signs the rest; reports what it removed.
    Repair {
        conversation: ConversationId,
        #[command(flatten)]
        actor: Actor,
    },
    /// Lists the lane messages set aside as dead letters (unreadable, or refused by the record).
    DeadLetters {
        conversation: ConversationId,
        #[command(flatten)]
        actor: Actor,
    },
    /// Puts a dead letter's bytes back on the conversation's lane (e.g. after an upgrade that
    /// reads them); the letter notes who requeued it and where.
    Requeue {
        conversation: ConversationId,
        #[command(flatten)]
        actor: Actor,
        /// The lane sequence the letter was parked at.
        #[arg(long)]
        seq: u64,
    },
}

/// The identity a command acts as.
#[derive(Debug, Args)]
pub struct Actor {
    /// Who acts: `provider:external_id` or `provider:scope:external_id`.
    #[arg(long = "actor")]
    pub identity: Identity,
    /// The tenant the actor acts in: another tenant's conversations are not found.
    #[arg(long = "tenant", default_value = "default")]
    pub tenant: turnpike_schemas::TenantId,
}

#[derive(Debug, Subcommand)]
pub enum RecordCommand {
    /// Runs one echo turn through both batches of the record, creating the conversation if
    /// none is given.
    Append {
        #[command(flatten)]
        actor: Actor,
        /// The conversation; a new one is created when absent.
        #[arg(long)]
        conversation: Option<ConversationId>,
        /// The user message of the turn.
        #[arg(long)]
        message: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Accept → turn start latency, turns per second and CPU per turn, beside raw JetStream, on
    /// JetStream and on the embedded backend. The workers' store: a fresh local one, or
    /// `--store` (e.g. `memory://`, to see what the durable store costs a turn).
    Lanes {
        /// NATS to measure against; default: a nats-server started for the run.
        #[arg(long)]
        nats: Option<String>,
        /// Conversations in the throughput run.
        #[arg(long, default_value_t = 1000)]
        conversations: usize,
        /// Turns per conversation in the throughput run.
        #[arg(long, default_value_t = 10)]
        turns: usize,
        /// Events in the latency runs (one at a time).
        #[arg(long, default_value_t = 300)]
        samples: usize,
        /// Workers in the process (one is what a fleet runs per process; each has its turn slots).
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// Record metrics as `serve`, `router` and `worker` do (the Prometheus recorder), to
        /// measure their cost against a run without.
        #[arg(long)]
        metrics: bool,
        /// Rounds, each the whole measurement on fresh streams, stores and conversations (one
        /// nats-server): every round's figures and their medians, steadier on a noisy machine
        /// than one run's.
        #[arg(long, default_value_t = 1)]
        repeat: usize,
    },
    /// A fleet on this machine (nats-server, routers and worker processes) driven through the
    /// API with a model that takes a fixed time: turns/s and schedule-to-start for each worker
    /// count, and the scaling over the first.
    Fleet {
        /// Router processes.
        #[arg(long, default_value_t = 2)]
        routers: usize,
        /// Worker process counts to measure, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
        workers: Vec<usize>,
        /// Turn slots per worker.
        #[arg(long, default_value_t = 4)]
        slots: usize,
        /// The scripted model's time per call, in milliseconds.
        #[arg(long, default_value_t = 250)]
        model_delay_ms: u64,
        /// Turns each conversation runs.
        #[arg(long, default_value_t = 8)]
        turns: usize,
        /// The nats-server binary.
        #[arg(long, default_value = "nats-server")]
        nats_server: PathBuf,
    },
    /// One tenant's burst against another's single messages: tenant B's wait for a reply on an
    /// idle system and while tenant A's burst of N messages (into N conversations) is worked
    /// off, on the embedded bus and on JetStream; the ratio is what fair share keeps small.
    Fairness {
        /// Burst sizes, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "600,6000")]
        bursts: Vec<usize>,
        /// Workers in the process.
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// Turn slots per worker.
        #[arg(long, default_value_t = 64)]
        slots: usize,
        /// The agent's time per turn, in milliseconds.
        #[arg(long, default_value_t = 250)]
        turn_ms: u64,
        /// B's single messages in each phase.
        #[arg(long, default_value_t = 10)]
        singles: usize,
        /// The embedded bus only (no nats-server).
        #[arg(long)]
        embedded_only: bool,
    },
    /// Firing lag at many schedules: fire time → message on the lane and → turn dispatched, at
    /// 1 and W workers in this process, beside a bare timer for the same fire times (the floor).
    Schedules {
        /// Schedules, spread evenly over their interval, each into its own conversation.
        #[arg(long, default_value_t = 10_000)]
        schedules: usize,
        /// Each schedule's interval, in seconds.
        #[arg(long, default_value_t = 20)]
        every_secs: u64,
        /// How long firings are measured, in seconds (after the warm-up).
        #[arg(long, default_value_t = 20)]
        window_secs: u64,
        /// Worker counts to measure, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,3")]
        workers: Vec<usize>,
    },
    /// Outbound webhook deliveries per second against a local receiver, by 1 and W
    /// dispatchers in this process, beside a bare HTTP client's POSTs (the floor).
    Webhooks {
        /// Deliveries enqueued, then delivered.
        #[arg(long, default_value_t = 5_000)]
        deliveries: usize,
        /// Dispatcher counts to measure, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,3")]
        dispatchers: Vec<usize>,
        /// Deliveries in flight per shard (and the floor's concurrency).
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
    },
    /// Resident memory over a long run: N turns of an echo agent through the API on the embedded
    /// stack and on a fleet (nats-server, router, worker), each process's anonymous and
    /// file-backed memory sampled as the turns go by; fails when anonymous memory grows more
    /// than 10% after warm-up.
    Soak {
        /// Turns per stack.
        #[arg(long, default_value_t = 100_000)]
        turns: usize,
        #[arg(long, default_value_t = 1_000)]
        conversations: usize,
        /// Clients sending at once (each with its share of the conversations).
        #[arg(long, default_value_t = 16)]
        clients: usize,
        /// Memory samples over the run.
        #[arg(long, default_value_t = 10)]
        samples: usize,
        /// The share of the turns before growth is measured, in percent.
        #[arg(long, default_value_t = 10)]
        warm_up_percent: usize,
        /// The nats-server binary for the fleet; `none`: the embedded stack only.
        #[arg(long, default_value = "nats-server")]
        nats_server: PathBuf,
        /// Turns a conversation takes before its client leaves it for a new one (0: never), so
        /// conversations keep a steady length while their number grows with the run.
        #[arg(long, default_value_t = 100)]
        turns_per_conversation: usize,
        /// Skip the embedded stack (soak the fleet only).
        #[arg(long)]
        fleet_only: bool,
    },
    /// What Turnpike adds to a real model: time to first token straight from the server and
    /// through the API, and a tool-using turn's time beside its model calls' time.
    Model {
        /// The model server's API base; the default is the local model (`scripts/services
        /// install llm`), started for the run when nothing serves there.
        #[arg(long, default_value = "http://127.0.0.1:8080/v1")]
        url: String,
        /// The model's name on that server.
        #[arg(long, default_value = "smollm2")]
        model: String,
        /// Time-to-first-token samples on each path (interleaved).
        #[arg(long, default_value_t = 20)]
        samples: usize,
        /// Tool-using turns.
        #[arg(long, default_value_t = 3)]
        turns: usize,
    },
    /// How fast conversations (10 turns, 3 files each) are deleted from every store, beside
    /// deleting as many plain objects; and the sweep's cost when nothing is due.
    Erase {
        #[arg(long, default_value_t = 50)]
        conversations: usize,
        /// Where the local store goes (default: the system's temporary folder).
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// An object store URL instead (e.g. s3://bucket/prefix against moto).
        #[arg(long)]
        store: Option<String>,
    },
    /// What a remote app costs: a no-op turn run by an app over HTTP beside the same turn of
    /// the built-in loop, and the cost of one streamed action.
    Remote {
        /// No-op turns of each kind (interleaved).
        #[arg(long, default_value_t = 100)]
        samples: usize,
        /// `say` actions in the long turns.
        #[arg(long, default_value_t = 2000)]
        actions: usize,
    },
    /// The HTTP edge over `turnpike serve`'s stack (embedded bus, workers, the demo's scripted
    /// model): accept → first streamed token at 1 and at many concurrent conversations, and
    /// messages accepted per second.
    Edge {
        /// Concurrent conversations in each latency run.
        #[arg(long, value_delimiter = ',', default_value = "1,200")]
        conversations: Vec<usize>,
        /// Messages per conversation in each latency run.
        #[arg(long, default_value_t = 0)]
        rounds: usize,
        /// Messages posted in the throughput run.
        #[arg(long, default_value_t = 5000)]
        messages: usize,
        /// Clients posting at once in the throughput run.
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// Stop the workers before the throughput run (accepting only, no turns competing).
        #[arg(long)]
        accept_only: bool,
        /// Where to keep the data (a temporary directory under it); default: the system's temp dir.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// The A2A edge beside the REST API over `turnpike serve`'s stack (the demo's scripted
    /// model): time to first token and to the whole reply, and submissions per second at many
    /// clients.
    A2a {
        /// Sequential samples of each latency.
        #[arg(long, default_value_t = 30)]
        rounds: usize,
        /// Submissions in each throughput run.
        #[arg(long, default_value_t = 2000)]
        messages: usize,
        /// Clients submitting at once in the throughput runs.
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// Where to keep the data (a temporary directory under it); default: the system's temp dir.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Context rebuild time at turn 10, 100 and 1,000 of one conversation, with compaction off
    /// and with a summary at turn 900, on the local filesystem.
    Context {
        /// Rebuilds measured per scenario.
        #[arg(long, default_value_t = 50)]
        samples: usize,
        /// Another object store to measure on (`s3://bucket/prefix` with AWS_* settings).
        #[arg(long)]
        store: Option<String>,
        /// Where to write (a temporary directory under it); default: the system's temp dir.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Cell start → first byte of output for `print(1)`, beside plain `python3 -c 'print(1)'`.
    Cell {
        #[arg(long, default_value_t = 200)]
        runs: usize,
        /// Leave Landlock out (bubblewrap, seccomp and limits only), to see its share.
        #[arg(long)]
        without_landlock: bool,
    },
    /// An MCP tool call (mcp-server-time) through Turnpike's path — sandboxed like a cell, the
    /// Rust SDK as client — beside the Python `mcp` client's, and a stdio server's start cost.
    Mcp {
        /// The venv with `mcp` and `mcp-server-time` (scripts/services install tests).
        #[arg(
            long,
            env = "TURNPIKE_MCP_VENV",
            default_value = "/var/tmp/turnpike-services/mcp-venv"
        )]
        venv: PathBuf,
        #[arg(long, default_value_t = 500)]
        calls: usize,
        #[arg(long, default_value_t = 20)]
        starts: usize,
    },
    /// Project versions: publish time per turn and one-file checkout time from turn N of a
    /// 1,000-turn lineage (100 files, a few changed per turn), on the local filesystem.
    Git {
        /// Turns in the lineage.
        #[arg(long, default_value_t = 1000)]
        turns: u64,
        /// Where to write (a temporary directory under it); default: the system's temp dir.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Search quality on a test collection in the SMART format (documents .I/.T/.W, queries
    /// .I/.W, judgments `query doc [grade]`): nDCG@10 and MAP of full text, vectors and hybrid,
    /// on the embedded backend and (with --database-url) on Postgres.
    Search {
        /// The collection's directory (e.g. Cranfield).
        #[arg(long)]
        collection: PathBuf,
        /// Print one JSON object per backend.
        #[arg(long)]
        json: bool,
        /// How the judgments name queries: by position in the queries file, or by `.I` id.
        #[arg(long, value_enum, default_value_t = QueryNumberingArg::Position)]
        query_numbering: QueryNumberingArg,
        /// What grades mean: 1 = most relevant (Cranfield), or higher = more relevant.
        #[arg(long, value_enum, default_value_t = GradesArg::LowerIsBetter)]
        grades: GradesArg,
        /// The documents file, where its content cannot tell (else found in the directory).
        #[arg(long)]
        docs: Option<PathBuf>,
        /// The queries file, where its content cannot tell.
        #[arg(long)]
        queries: Option<PathBuf>,
        /// The judgments file, where its content cannot tell.
        #[arg(long)]
        judgments: Option<PathBuf>,
        /// The judgments' shape: `smart` (`query doc [grade]`, or four columns with the last two
        /// unused) or `trec` (`query 0 doc relevance`); `auto` tells by the content.
        #[arg(long, value_enum, default_value_t = JudgmentsFormatArg::Auto)]
        judgments_format: JudgmentsFormatArg,
        /// Where to build the embedded index (a temporary directory under it).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// The local embedder: documents per second (batched, as a rebuild embeds them) and short
    /// queries one at a time (as a search or recall does), on a SMART collection.
    Embed {
        /// The collection's directory (e.g. Cranfield).
        #[arg(long)]
        collection: PathBuf,
        /// Documents to embed (the collection's first).
        #[arg(long, default_value_t = 200)]
        docs: usize,
    },
    /// Index scale: synthetic rows (384-d vectors, generated text) spread over users; indexing
    /// rows per second and hybrid query latency, on the embedded backend and (with
    /// --database-url) on Postgres.
    Index {
        #[arg(long, default_value_t = 1_000_000)]
        rows: usize,
        /// Users the rows belong to (every query is scoped to one).
        #[arg(long, default_value_t = 1000)]
        users: usize,
        /// Queries timed per backend.
        #[arg(long, default_value_t = 500)]
        queries: usize,
        /// Which backends.
        #[arg(long, value_enum, default_value_t = turnpike_bench::search::Backends::Both)]
        backend: turnpike_bench::search::Backends,
        /// Where to build the embedded index (a temporary directory under it).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Leave the rows in Postgres afterwards (tenant `bench<pid>`), for EXPLAIN.
        #[arg(long)]
        keep: bool,
        /// Load nothing: time queries over the rows an earlier run left under this tenant
        /// (`--rows`/`--users` must match that run; the indexing rate is then meaningless).
        #[arg(long)]
        reuse_tenant: Option<turnpike_schemas::TenantId>,
        /// `maintenance_work_mem` (MiB) for building Postgres's vector index after the load:
        /// the graph of a million rows takes about 2 GiB, and a parallel build reserves it in
        /// shared memory.
        #[arg(long, default_value_t = 4096)]
        build_memory: u32,
    },
    /// Record appends per second and verify throughput on the local filesystem.
    Record {
        /// How many 1-entry batches to append (16-entry batches: a sixteenth of it).
        #[arg(long, default_value_t = 2000)]
        appends: u64,
        /// Where to write (a temporary directory under it); default: the system's temp dir.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}
