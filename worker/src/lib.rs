//! Claiming lanes and running turns.
//!
//! # Layout
//! - [`worker`]: the claim loop — wakes in, conversation owners out, bounded by turn slots
//! - [`owner`]: one conversation's owner: lease, recovery, turns, wake acknowledgement
//! - [`pool`]: workers of one process, started and stopped together
//! - [`turn`]: one turn through batch one, the agent, and batch two
//! - [`agent`]: the [`Agent`] trait and the built-in echo agent
//! - [`workspace`]: a fresh directory per turn, deleted however the turn ends
//! - [`config`]: worker settings and fault injection for tests

pub mod agent;
pub mod config;
pub mod error;
pub mod owner;
pub mod pool;
pub mod turn;
pub mod worker;
pub mod workspace;

pub use agent::{Agent, EchoAgent};
pub use config::{Fault, WorkerConfig};
pub use error::{Error, Result};
pub use pool::WorkerPool;
pub use turn::TurnContext;
pub use worker::Worker;
pub use workspace::Workspace;
