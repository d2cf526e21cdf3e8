//! The MCP servers of a running turn: started (a stdio server, sandboxed in a cell over the
//! turn's workspace) or connected (an HTTP server) when the turn asks for its toolset, used by
//! its calls, ended with the turn. Nothing is shared between turns: a server process holds
//! nothing of another turn, identity or conversation.
//!
//! Contract: a server that cannot start, list or name its tools fails the turn with its name
//! and why; a call that fails (a crash, a hang past its timeout, an answer that is not MCP)
//! is an error result the model sees, and the turn goes on. Results are bounded like every
//! tool's: images and embedded resources are hosted as files, large text as a file with a
//! preview.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Map, Value};
use turnpike_agent::mcp::{CallResult, McpTool, ServerSpec, Session, Transport};
use turnpike_agent::tools::{ToolOutput, Toolset};
use turnpike_agent::AgentSpec;
use turnpike_schemas::{Block, RefPath};

use crate::cell::{Cell, CellProcess, Extra};
use crate::tools::ToolContext;

/// The most files one result is kept with, and their most bytes in all.
const MAX_FILES: usize = 16;
const MAX_FILE_BYTES: usize = 16 << 20;

/// The `_meta` key a call's idempotency key travels under.
pub const IDEMPOTENCY_META: &str = "turnpike/idempotency-key";

/// One server, live for the turn.
struct Live {
    spec: ServerSpec,
    /// `None`: it needs the sender's connection, which they lack; its allowlisted tools are
    /// offered, and a call of one parks for the connection.
    session: Option<Session>,
    tools: Vec<McpTool>,
    /// The sandboxed process of a stdio server; it ends when this is dropped.
    _process: Option<CellProcess>,
}

/// The MCP servers of one turn.
#[derive(Default)]
pub struct TurnServers {
    live: tokio::sync::OnceCell<Vec<Arc<Live>>>,
}

impl TurnServers {
    /// The agent's toolset with its servers' tools after its own: every server started and
    /// listed (at once) the first time; the same servers after that. The error names the
    /// server that failed.
    pub async fn toolset(
        &self,
        agent: &AgentSpec,
        workspace: &Path,
        cell: &Result<Arc<Cell>, String>,
        grants: &Grants<'_>,
        sender: &Sender<'_>,
    ) -> Result<Toolset, String> {
        let live = self
            .live
            .get_or_try_init(|| async {
                let starts = agent
                    .mcp
                    .iter()
                    .map(|spec| start(spec, workspace, cell, grants, sender));
                futures::future::try_join_all(starts).await
            })
            .await?;
        let tools = live
            .iter()
            .filter(|l| l.session.is_some())
            .flat_map(|l| l.tools.iter().map(|t| t.description.clone()));
        let mut set = agent.tools.clone().with(tools);
        for l in live.iter().filter(|l| l.session.is_none()) {
            set = set.with_unconnected(&l.spec.name, l.tools.iter().map(|t| t.description.clone()));
        }
        Ok(set)
    }

    /// Runs a call of a tool the model knows as `name`, if one of the turn's servers offers it
    /// (none: it is not an MCP tool). `Err` inside: the call did not give a result.
    pub async fn call(
        &self,
        cx: &ToolContext<'_>,
        tools: &Toolset,
        name: &str,
        arguments: Value,
    ) -> Option<(bool, ToolOutput)> {
        let live = self.live.get()?;
        let (server, tool) = live.iter().find_map(|l| {
            let own = l.spec.own_name(name)?;
            l.tools
                .iter()
                .any(|t| t.description.spec.name == name)
                .then_some((l, own))
        })?;
        let Some(session) = &server.session else {
            // Run without the sender's connection (approved as a gated call before they
            // connected, or approved instead of connecting): it says what is missing.
            return Some((
                false,
                json!({ "error": format!(
                    "not run: {} needs your connection to MCP server {:?}, which is missing or was refused (PUT /v1/connections/<app>/{}); connect and ask again",
                    name, server.spec.name, server.spec.name
                ) })
                .into(),
            ));
        };
        let mut meta = Map::new();
        meta.insert(IDEMPOTENCY_META.into(), json!(cx.idempotency_key()));
        let started = std::time::Instant::now();
        let result = session.call(tool, arguments, meta).await;
        tracing::debug!(server = %server.spec.name, tool, elapsed_ms = started.elapsed().as_millis() as u64, ok = result.is_ok(), "mcp call");
        let side_effects = tools.side_effects(name);
        Some(match result {
            Ok(result) => output(cx, &server.spec.name, result).await,
            // A call with effects that gave no answer may still have taken effect: the model
            // is told so, not invited to try again blindly.
            Err(why) if side_effects => (
                false,
                json!({ "error": format!("MCP server {:?}: {why}", server.spec.name),
                        "outcome": "unknown: the call may have taken effect; check before calling it again" }).into(),
            ),
            Err(why) => (
                false,
                json!({ "error": format!("MCP server {:?}: {why}", server.spec.name) }).into(),
            ),
        })
    }
}

/// Whose turn it is, for servers that take a user's connection: the sender's own credential
/// is the only one a call carries (in a shared conversation too).
pub struct Sender<'a> {
    /// Users' connections; `None`: the deployment has no connection key.
    pub connections: Option<&'a turnpike_artifactory::Connections>,
    pub tenant: &'a turnpike_schemas::TenantId,
    pub identity: &'a turnpike_schemas::Identity,
    pub app: &'a str,
}

impl Sender<'_> {
    /// The sender's credential for `server`; `Ok(None)`: they have not connected.
    async fn secret(&self, server: &str) -> Result<Option<turnpike_artifactory::Secret>, String> {
        let Some(connections) = self.connections else {
            return Err("it needs each user's connection, and this deployment keeps none: set TURNPIKE_CONNECTION_KEY (64 hex characters) on every process".into());
        };
        let scope = turnpike_artifactory::connections::Scope {
            tenant: self.tenant,
            identity: self.identity,
            app: self.app,
            server,
        };
        match connections.secret(&scope).await {
            Ok(secret) => Ok(secret),
            // Sealed under another key, or damaged: as good as none — the user connects again.
            Err(e) if e.kind() == turnpike_artifactory::ErrorKind::Corrupt => {
                tracing::warn!(server, error = %e, "a stored connection does not open; the user is asked to connect again");
                Ok(None)
            }
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Leaves a waiting mark for each `connection_required` card among a parked turn's `blocks`,
/// so that its sender connecting resumes the turn. Written before the card commits (a mark
/// whose card never commits resumes nothing); one that cannot be written is logged, and the
/// card is answered by hand (an approval once connected).
pub(crate) async fn mark_waiting(
    env: &crate::turn::TurnEnv,
    app: &str,
    sender: &turnpike_schemas::Identity,
    blocks: &[Block],
) {
    let Some(connections) = &env.connections else {
        return;
    };
    let prefix = env.record.prefix();
    for block in blocks {
        let Block::ApprovalRequest {
            request_id,
            connection: Some(server),
            ..
        } = block
        else {
            continue;
        };
        let scope = turnpike_artifactory::connections::Scope {
            tenant: prefix.tenant(),
            identity: sender,
            app,
            server,
        };
        let waiting = turnpike_artifactory::connections::Waiting {
            conversation: prefix.conversation(),
            request_id: *request_id,
        };
        if let Err(e) = connections.wait(&scope, &waiting).await {
            tracing::warn!(conversation = %prefix.conversation(), %request_id, error = %e,
                "cannot mark the turn as waiting for a connection; approve its card once connected");
        }
    }
}

/// Whether a server's refusal to start says the credential was not accepted (HTTP 401 or 403).
fn refused_credential(why: &str) -> bool {
    ["401", "403", "Unauthorized", "Forbidden"]
        .iter()
        .any(|s| why.contains(s))
}

/// The tools a server that needs a connection offers before the sender has connected: its
/// allowlist, with arguments the model fills as it sees fit (the server checks them once
/// the call runs).
fn unconnected_tools(spec: &ServerSpec) -> Vec<McpTool> {
    spec.tools
        .iter()
        .flatten()
        .map(|tool| McpTool::unlisted(spec, tool))
        .collect()
}

/// What the operator grants servers: what a sandbox may read besides `/usr`, and which
/// internal addresses a url server may be at.
pub struct Grants<'a> {
    /// Internal addresses a url server may resolve to (public ones need no grant).
    pub outbound: &'a turnpike_agent::outbound::Outbound,
    /// `read_only` paths must lie under one of these, once resolved.
    pub roots: &'a [PathBuf],
    /// Never inside, around or beside these (every turn's workspace, the cell's scratch).
    pub never: &'a [PathBuf],
}

impl Grants<'_> {
    /// The manifest's paths, resolved (links followed on the host, so the mount is what was
    /// checked); the error names the first path refused and why.
    fn check(&self, paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
        let resolve = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let roots: Vec<PathBuf> = self.roots.iter().map(|r| resolve(r)).collect();
        let never: Vec<PathBuf> = self.never.iter().map(|n| resolve(n)).collect();
        paths
            .iter()
            .map(|p| {
                let real = std::fs::canonicalize(p)
                    .map_err(|e| format!("read_only {}: {e}", p.display()))?;
                if !roots.iter().any(|r| real.starts_with(r)) {
                    return Err(format!(
                        "read_only {} is not under a directory the operator grants MCP servers ({}; see --mcp-read-root)",
                        p.display(),
                        roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ")
                    ));
                }
                if never.iter().any(|n| real.starts_with(n) || n.starts_with(&real)) {
                    return Err(format!(
                        "read_only {} would show workspaces or the sandbox's scratch",
                        p.display()
                    ));
                }
                Ok(real)
            })
            .collect()
    }
}

/// Starts (or connects to) one server and lists its tools.
async fn start(
    spec: &ServerSpec,
    workspace: &Path,
    cell: &Result<Arc<Cell>, String>,
    grants: &Grants<'_>,
    sender: &Sender<'_>,
) -> Result<Arc<Live>, String> {
    let failed = |why: String| format!("MCP server {:?}: {why}", spec.name);
    let (session, process) = match &spec.transport {
        Transport::Stdio {
            command,
            read_only,
            network,
        } => {
            let cell = cell.as_ref().map_err(|why| failed(why.clone()))?;
            let read_only = grants.check(read_only).map_err(failed)?;
            let extra = Extra {
                read_only: &read_only,
                network: *network,
                // The server lives beside the host's own work on the workspace: it reads it.
                read_only_workspace: true,
            };
            let mut process = cell
                .spawn(workspace, command, &extra)
                .await
                .map_err(failed)?;
            let (Some(stdout), Some(stdin)) =
                (process.child.stdout.take(), process.child.stdin.take())
            else {
                return Err(failed("its pipes could not be opened".into()));
            };
            match Session::over_pipes(spec, stdout, stdin).await {
                Ok(session) => (session, Some(process)),
                Err(why) => {
                    // What it said on its way out explains more than a closed pipe.
                    let _ = tokio::time::timeout(
                        std::time::Duration::from_secs(2),
                        process.child.wait(),
                    )
                    .await;
                    let said = process.stderr_tail();
                    let why = if said.is_empty() {
                        why
                    } else {
                        format!("{why}; it wrote: {}", tail(&said, 600))
                    };
                    return Err(failed(why));
                }
            }
        }
        Transport::Http { url } if spec.connection => {
            let pinned = grants.outbound.resolve(url).await.map_err(failed)?;
            let unconnected = || {
                Arc::new(Live {
                    spec: spec.clone(),
                    session: None,
                    tools: unconnected_tools(spec),
                    _process: None,
                })
            };
            let Some(secret) = sender.secret(&spec.name).await.map_err(failed)? else {
                return Ok(unconnected());
            };
            match Session::over_http(spec, url, Some(secret.expose().to_owned()), &pinned).await {
                Ok(session) => (session, None),
                // The server refuses the credential (expired, revoked): the user is asked to
                // connect again, as if they never had.
                Err(why) if refused_credential(&why) => {
                    tracing::info!(server = %spec.name, "the server refused a user's connection; asking them to connect again");
                    return Ok(unconnected());
                }
                Err(why) => return Err(failed(why)),
            }
        }
        Transport::Http { url } => {
            let pinned = grants.outbound.resolve(url).await.map_err(failed)?;
            (
                Session::over_http(spec, url, None, &pinned)
                    .await
                    .map_err(failed)?,
                None,
            )
        }
    };
    let tools = session.tools().await.map_err(failed)?;
    Ok(Arc::new(Live {
        spec: spec.clone(),
        session: Some(session),
        tools,
        _process: process,
    }))
}

/// A call's result as the model and the turn log get it: text (or the error's text) inline,
/// files hosted with their references, bounded like every tool's result.
async fn output(cx: &ToolContext<'_>, server: &str, result: CallResult) -> (bool, ToolOutput) {
    let mut out = ToolOutput::default();
    let text = result.text.join("\n");
    let mut body = Map::new();
    body.insert(
        if result.is_error { "error" } else { "content" }.into(),
        json!(text),
    );
    if let Some(structured) = result.structured {
        body.insert("structured".into(), structured);
    }
    if !result.links.is_empty() {
        body.insert("links".into(), json!(result.links));
    }
    let mut files = Vec::new();
    let given = result.files.len();
    let mut bytes = 0usize;
    for (i, file) in result.files.into_iter().enumerate() {
        bytes += file.bytes.len();
        if i >= MAX_FILES || bytes > MAX_FILE_BYTES {
            files.push(json!({"not_kept": given - i, "why": format!("a result keeps at most {MAX_FILES} files and {MAX_FILE_BYTES} bytes")}));
            break;
        }
        match host(cx, server, i, &file.name, &file.media_type, file.bytes).await {
            Ok(block) => {
                if let Block::File {
                    path, reference, ..
                } = &block
                {
                    files.push(json!({"path": path, "reference": reference.to_string(), "media_type": file.media_type}));
                }
                out.blocks.push(block);
            }
            Err(why) => files.push(json!({"name": file.name, "error": why})),
        }
    }
    if !files.is_empty() {
        body.insert("files".into(), json!(files));
    }
    out.output = Value::Object(body);
    let out = crate::tools::bound(cx, cx.call_id, out).await;
    (!result.is_error, out)
}

/// Hosts a file a call returned, under `mcp/<server>/<call>-<i>-<name>`.
async fn host(
    cx: &ToolContext<'_>,
    server: &str,
    i: usize,
    name: &str,
    media_type: &str,
    bytes: Vec<u8>,
) -> Result<Block, String> {
    let file = format!(
        "{}-{}-{}",
        crate::tools::sanitize(cx.call_id),
        i + 1,
        crate::tools::sanitize(name)
    );
    let path = RefPath::from_segments(["mcp".to_owned(), server.to_owned(), file])
        .map_err(|e| e.to_string())?;
    cx.fence.check().map_err(|e| e.to_string())?;
    cx.hosted.store(true, std::sync::atomic::Ordering::Relaxed);
    let size = bytes.len() as u64;
    let reference = cx
        .files
        .host(cx.prefix, cx.turn, cx.attempt, &path, Bytes::from(bytes))
        .await
        .map_err(|e| format!("the file could not be stored: {e}"))?;
    Ok(Block::File {
        path: path.to_relative_path(),
        reference,
        size,
        media_type: media_type.to_owned(),
    })
}

fn tail(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}
