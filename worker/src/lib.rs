//! Claiming lanes and running turns: what only a worker does. It claims wakes, owns
//! conversations under leases (fenced writes), rebuilds each turn's context from the stores,
//! commits batch one, hands the turn to the harness (`turnpike-agent`) through the
//! [`turnpike_agent::Turn`] it implements ([`turn::TurnContext`]), and commits batch two. It runs
//! the tools that touch the stores and the host (the cell, the resolver's `pull`, `publish`,
//! `search`, recall).
//!
//! It must not hold what the harness decides (the loop, models, approvals, compaction, remote
//! apps, replay) nor what operators share with the API (erasure, phases: `turnpike-lifecycle`).
//!
//! # Layout
//! - [`worker`]: the claim loop — wakes in, conversation owners out, bounded by turn slots
//! - [`owner`]: one conversation's owner: lease, recovery, turns, wake acknowledgement
//! - `owners`: the owners a worker runs now (the owner map, turn slots, drained lanes)
//! - [`parking`]: lane messages that can never be taken become dead letters, not retries
//! - [`pool`]: workers of one process, started and stopped together
//! - [`reach`]: what a turn may bring in from other conversations (all participants may see it)
//! - [`recall`]: rows of the user's other conversations the context rebuild brings in
//! - [`turn`]: one turn through batch one, the app's callback, and batch two
//! - [`search`]: the `search` tool's view of the hybrid index, as the caller
//! - [`cell`]: the sandbox generated code runs in (bubblewrap, seccomp, limits)
//! - [`tools`]: the tool registry and the built-in tools
//! - [`timeline`]: the context rebuilt from the previous turn's snapshot (or the latest summary
//!   and the turn logs after it), and the snapshot a turn leaves
//! - [`usage`]: each model call's `usage` entry, its cost (the price table), budgets
//! - [`workspace`]: a fresh directory per turn, deleted however the turn ends
//! - [`schedules`]: the scheduler: schedule shards held under leases, each firing once
//! - [`config`]: worker settings
//! - [`error`]: the crate's error type
//!
//! The book: `book/src/concepts/turn.md`, `book/src/operating/fleet.md` (and `book/src/SUMMARY.md` for the rest).

pub mod a2a;
pub mod cell;
pub mod config;
mod dispatch;
pub mod error;
pub mod fair;
mod idle;
mod kept;
pub mod mcp;
mod metrics;
pub mod owner;
mod owners;
pub mod parking;
pub mod pool;
pub mod reach;
pub mod recall;
mod roster;
pub mod schedules;
pub mod search;
pub mod shards;
pub mod timeline;
pub mod tools;
pub mod turn;
pub mod usage;
pub mod webhooks;
pub mod worker;
pub mod workspace;

pub use config::WorkerConfig;
pub use error::{Error, Result};
pub use pool::WorkerPool;
pub use tools::Registry;
pub use turn::TurnContext;
pub use turnpike_agent::{AgentLoopApp, AgentSpec, App, Apps, EchoAgent, Manifest, OnNewMessage};
pub use turnpike_lifecycle::Failpoints;
pub use worker::Worker;
pub use workspace::Workspace;
