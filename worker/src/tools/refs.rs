//! Tools that cross the workspace's edge, always host-side and as the turn's bound identity:
//! `pull` (a reference into the workspace), `publish` (a workspace file as a hosted artifact),
//! `search` (the hybrid index) and `exec` (generated code in the cell).

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::{json, Value};
use turnpike_resolver::ResolveError;
use turnpike_schemas::{Block, Identity, TenantId};

use super::files::{read_bounded, workspace_path, write_file};
use super::{str_arg, Tool, ToolContext, ToolOutput};
use turnpike_agent::model::ToolSpec;

/// The largest file `publish` hosts.
const MAX_PUBLISH_BYTES: u64 = 64 * 1024 * 1024;

/// `pull {reference, path?}`: resolves a reference as the bound identity into the workspace.
pub struct Pull;

#[async_trait]
impl Tool for Pull {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "pull".into(),
            description: "Copy the bytes a reference (conv:…) locates into the workspace.".into(),
            parameters: json!({"type": "object", "properties": {
                "reference": {"type": "string"},
                "path": {"type": "string", "description": "where in the workspace; default: the reference's file name"}},
                "required": ["reference"]}),
        }
    }

    async fn call(&self, cx: &ToolContext<'_>, args: Value) -> Result<ToolOutput, String> {
        let text = str_arg(&args, "reference")?;
        // In a shared conversation, only what every participant may see comes in; anything
        // else looks exactly like a reference to nothing.
        if let Ok(reference) = text.parse::<turnpike_schemas::Reference>() {
            if !cx.reach.allows(reference.conversation()).await {
                return Err(ResolveError::NotFound(reference.to_string()).to_string());
            }
        }
        let resolved = cx
            .resolver
            .resolve_str(cx.identity, text)
            .await
            .map_err(|e| match e {
                ResolveError::Unavailable(m) => format!("the store failed; retry later: {m}"),
                other => other.to_string(),
            })?;
        let reference: turnpike_schemas::Reference = text.parse().map_err(|e| format!("{e}"))?;
        let default_name = reference
            .path()
            .segments()
            .last()
            .cloned()
            .unwrap_or_else(|| "pulled".into());
        let target = args
            .get("path")
            .and_then(Value::as_str)
            .unwrap_or(&default_name);
        let (rel, full) = workspace_path(cx.workspace, target)?;
        let size = resolved.bytes.len();
        write_file(full, resolved.bytes.to_vec())
            .await
            .map_err(|e| format!("cannot write {rel}: {e}"))?;
        Ok(json!({"path": rel.to_relative_path(), "size": size, "media_type": resolved.media_type}).into())
    }
}

/// `publish {path}`: hosts a workspace file; the user gets a reference and a download path.
pub struct Publish;

#[async_trait]
impl Tool for Publish {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "publish".into(),
            description:
                "Publish a workspace file so the user can download it; returns its reference."
                    .into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}},
                "required": ["path"]}),
        }
    }

    async fn call(&self, cx: &ToolContext<'_>, args: Value) -> Result<ToolOutput, String> {
        let raw = str_arg(&args, "path")?;
        let (rel, full) = workspace_path(cx.workspace, raw)?;
        let (bytes, size) =
            tokio::task::spawn_blocking(move || read_bounded(&full, MAX_PUBLISH_BYTES + 1))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("cannot read {rel}: {e}"))?;
        if size > MAX_PUBLISH_BYTES {
            return Err(format!(
                "{rel} is {size} bytes, more than the {MAX_PUBLISH_BYTES} a file may have"
            ));
        }
        cx.fence.check().map_err(|e| e.to_string())?;
        cx.hosted.store(true, std::sync::atomic::Ordering::Relaxed);
        let reference = cx
            .files
            .host(cx.prefix, cx.turn, cx.attempt, &rel, Bytes::from(bytes))
            .await
            .map_err(|e| format!("the store failed; retry later: {e}"))?;
        let name = rel.segments().last().cloned().unwrap_or_default();
        let media_type = turnpike_resolver::families::media_type_of(&name).to_owned();
        Ok(ToolOutput {
            output: json!({
                "reference": reference.to_string(),
                "download": format!("/v1/files?reference={reference}"),
                "size": size,
            }),
            blocks: vec![Block::File {
                path: rel.to_relative_path(),
                reference,
                size,
                media_type,
            }],
        })
    }
}

/// The hybrid index as tools see it (implemented by the index; scoped to `identity`).
#[async_trait]
pub trait SearchIndex: Send + Sync + 'static {
    /// Ranked hits (references, snippets, scores) for `query`, only ever `identity`'s own.
    async fn search(
        &self,
        tenant: &TenantId,
        identity: &Identity,
        query: &str,
        limit: usize,
    ) -> Result<Value, String>;

    /// The rows a turn recalls (see [`crate::recall`]): `identity`'s own, best first, with
    /// snippets read as `identity`.
    async fn recall(
        &self,
        tenant: &TenantId,
        identity: &Identity,
        query: &str,
        filter: &crate::recall::RecallFilter,
    ) -> Result<Vec<turnpike_schemas::RecallHit>, String>;
}

/// `search {query, limit?}`.
pub struct Search;

#[async_trait]
impl Tool for Search {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "search".into(),
            description: "Search all of the user's conversations by meaning and by words.".into(),
            parameters: json!({"type": "object", "properties": {
                "query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 50}},
                "required": ["query"]}),
        }
    }

    async fn call(&self, cx: &ToolContext<'_>, args: Value) -> Result<ToolOutput, String> {
        let query = str_arg(&args, "query")?;
        let limit = args
            .get("limit")
            .and_then(Value::as_u64)
            .unwrap_or(10)
            .clamp(1, 50) as usize;
        let Some(index) = cx.search else {
            return Err("search is not available: this worker has no index configured".into());
        };
        let mut found = index
            .search(cx.prefix.tenant(), cx.identity, query, limit)
            .await?;
        // Unless the caller is the conversation's only reader, only hits every participant may
        // see.
        if !cx.reach.private_to(cx.identity).await {
            if let Some(hits) = found.get_mut("hits").and_then(Value::as_array_mut) {
                let mut kept = Vec::with_capacity(hits.len());
                for hit in hits.drain(..) {
                    let visible = match hit
                        .get("conversation")
                        .and_then(Value::as_str)
                        .and_then(|c| c.parse().ok())
                    {
                        Some(conversation) => cx.reach.allows(conversation).await,
                        None => false,
                    };
                    if visible {
                        kept.push(hit);
                    }
                }
                *hits = kept;
            }
        }
        Ok(found.into())
    }
}

/// `exec {code, language?}`: generated code in the cell, over the turn's workspace. Fails closed:
/// without a working sandbox it refuses and says what is missing; code never runs outside one.
/// Files the run created or changed are reported with the references they will have once the
/// turn publishes its project version (`conv:gi:<conv>/turn_<n>/<path>`).
pub struct Exec;

#[async_trait]
impl Tool for Exec {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "exec".into(),
            description: "Run Python 3 code in an isolated cell over the workspace (no network)."
                .into(),
            parameters: json!({"type": "object", "properties": {
                "code": {"type": "string"}, "language": {"type": "string", "enum": ["python"]}},
                "required": ["code"]}),
        }
    }

    async fn call(&self, cx: &ToolContext<'_>, args: Value) -> Result<ToolOutput, String> {
        let code = str_arg(&args, "code")?;
        match args.get("language").and_then(Value::as_str) {
            None | Some("python") => {}
            Some(other) => return Err(format!("language {other:?} is not supported (python)")),
        }
        let cell = match cx.cell {
            Ok(cell) => cell,
            Err(why) => return Err(format!("exec is not available: {why}")),
        };
        let result = cell
            .run(cx.workspace, crate::cell::Language::Python, code)
            .await
            .map_err(|e| format!("the cell failed: {e}"))?;
        let files: Vec<Value> = result
            .files
            .iter()
            .map(|f| {
                let reference = turnpike_schemas::RefPath::parse(&f.path).ok().map(|p| {
                    turnpike_schemas::Reference::new(
                        turnpike_schemas::Family::git(),
                        cx.prefix.conversation(),
                        cx.turn,
                        p,
                    )
                    .to_string()
                });
                json!({"path": f.path, "size": f.size, "reference": reference})
            })
            .collect();
        Ok(json!({
            "exit_code": result.exit_code,
            "signal": result.signal,
            "timed_out": result.timed_out,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "truncated": result.truncated,
            "duration_ms": result.duration_ms,
            "cpu_ms": result.cpu_ms,
            "files": files,
        })
        .into())
    }
}
