//! Claiming lanes and running turns.
//!
//! # Layout
//! - [`worker`]: the claim loop — wakes in, conversation owners out, bounded by turn slots
//! - [`owner`]: one conversation's owner: lease, recovery, turns, wake acknowledgement
//! - [`fence`]: the owner's lease deadline; fenced writes stop before it lapses
//! - [`parking`]: lane messages that can never be taken become dead letters, not retries
//! - [`pool`]: workers of one process, started and stopped together
//! - [`reach`]: what a turn may bring in from other conversations (all participants may see it)
//! - [`recall`]: rows of the user's other conversations the context rebuild brings in
//! - [`turn`]: one turn through batch one, the app's callback, and batch two
//! - [`apps`]: manifests, the [`App`] trait (`on_reactive_event`), routing, and the echo app
//!   (`apps::echo`, no model)
//! - [`agent_loop`]: the built-in agent loop (rounds, closing call, folding, stop)
//! - [`remote`]: agents run by a remote app over HTTP (the protocol, its driver, its replay)
//! - [`approvals`]: gated calls, the canonical form an approval binds to, what is pending
//! - [`compaction`]: older turns summarised so the context stays within the agent's budget
//! - [`search`]: the `search` tool's view of the hybrid index, as the caller
//! - [`model`]: model providers — `openai`, `script`, `replay`
//! - [`cell`]: the sandbox generated code runs in (bubblewrap, seccomp, limits)
//! - [`tools`]: the tool registry and the built-in tools
//! - [`timeline`]: the context rebuilt from the previous turn's snapshot (or the latest summary
//!   and the turn logs after it)
//! - [`tokens`]: token accounting (a configured tokenizer, else the estimate)
//! - [`usage`]: each model call's `usage` entry, its cost (the price table), the ledger, budgets
//! - [`replay`]: re-running recorded turns, and what-ifs
//! - [`workspace`]: a fresh directory per turn, deleted however the turn ends
//! - [`erasure`]: deleting a conversation from every store, with a tombstone; finishing cut-short deletions
//! - [`phases`]: conversation phases and conditions for operators (`conversation list`)
//! - [`config`]: worker settings
//! - [`error`]: the crate's error type
//! - [`failpoints`]: where tests crash a worker at a step boundary (a test-only feature)

pub mod agent_loop;
pub mod approvals;
pub mod apps;
pub mod cell;
pub mod compaction;
pub mod config;
pub mod erasure;
pub mod error;
pub mod failpoints;
pub mod fence;
mod idle;
mod metrics;
pub mod model;
pub mod owner;
pub mod parking;
pub mod phases;
pub mod pool;
pub mod reach;
pub mod recall;
pub mod remote;
pub mod replay;
pub mod search;
pub mod timeline;
pub mod tokens;
pub mod tools;
pub mod turn;
pub mod usage;
pub mod worker;
pub mod workspace;

pub use apps::echo::EchoAgent;
pub use apps::{AgentLoopApp, AgentSpec, App, Apps, Manifest, OnNewMessage};
pub use config::WorkerConfig;
pub use error::{Error, Result};
pub use failpoints::Failpoints;
pub use pool::WorkerPool;
pub use tools::Registry;
pub use turn::TurnContext;
pub use worker::Worker;
pub use workspace::Workspace;
