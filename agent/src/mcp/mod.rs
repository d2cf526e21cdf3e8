//! Tools from MCP servers: the servers an agent's manifest names ([`spec`]), and a client for
//! one ([`client`]). Which process runs a server, in what sandbox, and which credential an
//! HTTP server gets is the host's: it starts a stdio server and hands its pipes to
//! [`client::Session::over_pipes`], or connects to a URL with [`client::Session::over_http`].
//! Calls reach the server only through [`crate::Turn::run_tool`], like every tool's: gated by
//! the same approvals, a side-effecting call's intent committed first, and replayed from the
//! record without any server.

pub mod client;
pub mod spec;

pub use client::{CallResult, FilePart, McpTool, Session};
pub use spec::{ServerSpec, Transport};
