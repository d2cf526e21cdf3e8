//! The command line.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use turnpike_schemas::{ConversationId, Identity};

/// Turnpike: a runtime that hosts many apps' AI agents for many users on one shared pool of
/// workers.
#[derive(Debug, Parser)]
#[command(name = "turnpike", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every command takes.
#[derive(Debug, Args)]
pub struct Global {
    /// Where the embedded default keeps its data (store, keys, trusted checkpoints).
    #[arg(
        long,
        global = true,
        env = "TURNPIKE_DATA_DIR",
        default_value = "./turnpike-data"
    )]
    pub data_dir: PathBuf,

    /// The object store, for a fleet: `s3://bucket[/prefix]`, `file:///path` or `memory://`.
    /// Without it, the store is `<data-dir>/store`.
    #[arg(long, global = true, env = "TURNPIKE_STORE")]
    pub store: Option<String>,

    /// The record signing key file (64 hex characters). The embedded default creates one under
    /// the data directory; with `--store` a key is required (this, or TURNPIKE_SIGNING_KEY).
    #[arg(long, global = true, env = "TURNPIKE_SIGNING_KEY_FILE")]
    pub signing_key: Option<PathBuf>,

    /// More trusted public keys (64 hex characters each), e.g. during a key rotation.
    #[arg(
        long = "trusted-key",
        global = true,
        env = "TURNPIKE_TRUSTED_KEYS",
        value_delimiter = ','
    )]
    pub trusted_keys: Vec<String>,

    /// Log filter in `RUST_LOG` syntax (also read from TURNPIKE_LOG, then RUST_LOG).
    #[arg(long, global = true, env = "TURNPIKE_LOG")]
    pub log: Option<String>,

    /// Log format.
    #[arg(long, global = true, env = "TURNPIKE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Runs the whole system on the embedded default and shows what it did.
    Demo,
    /// Read-only checks and operator tools for one conversation.
    #[command(subcommand)]
    Conversation(ConversationCommand),
    /// Writes to a conversation record directly (until lanes and turns exist).
    #[command(subcommand)]
    Record(RecordCommand),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
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
    },
    /// Removes unreadable entries and re-signs the rest; reports what it removed.
    Repair {
        conversation: ConversationId,
        #[command(flatten)]
        actor: Actor,
    },
}

/// The identity a command acts as.
#[derive(Debug, Args)]
pub struct Actor {
    /// Who acts: `provider:external_id` or `provider:scope:external_id`.
    #[arg(long = "actor")]
    pub identity: Identity,
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
