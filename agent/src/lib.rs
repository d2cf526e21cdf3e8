//! The harness: what an agent does between a turn's batch one and its batch two.
//!
//! It owns the built-in agent loop (rounds, the closing call, stop), the model providers and
//! token accounting, approvals (the canonical form an approval binds to, gates, what is
//! pending), compaction, the remote-app protocol and its driver, replay and what-ifs, and the
//! apps' manifests. It sees a turn only through the [`Turn`] trait, which the worker
//! implements: it never takes a lease, reads a lane or writes the record itself — everything
//! durable goes through the turn, which commits it first.
//!
//! It must not depend on the stores, the bus or the worker (`turnpike-artifactory`,
//! `turnpike-router`, `turnpike-worker`): replay runs the very same loop as a live turn, over
//! recorded outputs, with nothing but a turn log.
//!
//! # Layout
//! - [`turn`]: [`Turn`], the running turn as the harness sees it (its ids, its inputs, what it
//!   did, its lane, its context, its tools)
//! - [`apps`]: manifests, the [`App`] trait (`on_reactive_event`), routing, and the echo app
//! - [`spec`]: one agent as its manifest makes it ([`AgentSpec`])
//! - [`live`]: a live turn of an agent: its prelude (answers, compaction, recall), then the loop
//! - [`agent_loop`]: the built-in agent loop (rounds, closing call, folding, stop)
//! - [`remote`]: agents run by a remote app over HTTP (the protocol, its driver, its replay)
//! - [`approvals`]: gated calls, the canonical form an approval binds to, what is pending
//! - [`compaction`]: older turns summarised so the context stays within the agent's budget
//! - [`replay`]: re-running recorded turns, and what-ifs
//! - [`model`]: model providers — `openai`, `script`, `echo`, and `replay`'s recorded outputs
//! - [`message`]: what a model is sent: messages, tool calls, tool specs
//! - [`tokens`]: token accounting (a configured tokenizer, else the estimate)
//! - [`timeline`]: the rows of the turns before this one, as model messages
//! - [`tools`]: what the harness knows of tools (descriptions, allowlists, outputs); the host
//!   runs them
//! - [`duration`]: durations as manifests write them
//! - [`recall`]: what an agent asks recall for; the host runs the query
//! - [`error`]: the crate's error type
//!
//! The book: `book/src/guides/manifests.md` (and `book/src/SUMMARY.md` for the rest).

pub mod a2a;
pub mod agent_loop;
pub mod approvals;
pub mod apps;
pub mod compaction;
pub mod duration;
pub mod error;
pub mod live;
pub mod mcp;
pub mod message;
mod metrics;
pub mod model;
pub mod outbound;
pub mod recall;
pub mod remote;
pub mod replay;
pub mod spec;
pub mod timeline;
pub mod tokens;
pub mod tools;
pub mod turn;

pub use apps::echo::EchoAgent;
pub use apps::{AgentLoopApp, AgentSpec, App, Apps, Manifest, OnNewMessage};
pub use error::{Error, ErrorKind, Result};
pub use tools::{ToolCatalog, ToolDescription, ToolOutput, Toolset};
pub use turn::Turn;
