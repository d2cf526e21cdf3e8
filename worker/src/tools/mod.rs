//! Tools: the registry of every tool this worker runs. The harness knows them by description
//! (an agent's allowlist is a [`Toolset`] made from this registry, a [`ToolCatalog`]); calls
//! run here, in the trusted runtime, through [`run_call`].
//!
//! Contract of a [`Tool`]: it works only through its [`ToolContext`] — the turn's workspace,
//! the resolver as the turn's bound identity, the conversation's hosted files — and returns a
//! JSON result or an error message for the model. Results larger than
//! [`MAX_RESULT_BYTES`] are hosted as a file; the model gets a preview and the reference.

mod files;
mod people;
mod project;
mod refs;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::{json, Value};
use turnpike_artifactory::git::{Lineage, Project};
use turnpike_artifactory::{ConversationPrefix, Files};
use turnpike_resolver::Resolver;
use turnpike_schemas::{AgentId, Block, Identity, RefPath, TurnId};

use turnpike_agent::message::ToolSpec;
pub use turnpike_agent::tools::{ToolCatalog, ToolDescription, ToolOutput, Toolset};

pub use files::{ListFiles, ReadFile, WriteFile};
pub use people::{AskUser, SwitchAgent};
pub use project::Checkout;
pub use refs::{Exec, Publish, Pull, Search, SearchIndex};

/// The largest tool result handed to the model inline, in bytes of JSON.
pub const MAX_RESULT_BYTES: usize = 8 * 1024;
/// How much of a large result the model sees inline.
const PREVIEW_BYTES: usize = 1024;

/// What a tool call can reach.
pub struct ToolContext<'a> {
    pub workspace: &'a Path,
    /// The identity the turn is bound to; every resolution runs as it.
    pub identity: &'a Identity,
    pub prefix: &'a ConversationPrefix,
    pub turn: TurnId,
    /// The attempt running the turn: what it hosts is written under its own keys.
    pub attempt: u64,
    pub resolver: &'a Resolver,
    pub files: &'a Files,
    pub search: Option<&'a Arc<dyn SearchIndex>>,
    /// The call being run.
    pub call_id: &'a str,
    /// The agent running the turn, and every agent of its app.
    pub agent: &'a AgentId,
    pub app_agents: &'a [AgentId],
    /// The conversation's project (its git lineage), opened on first use.
    pub project: Option<ProjectHandle<'a>>,
    /// The sandbox for generated code, or why there is none on this worker.
    pub cell: &'a Result<Arc<crate::cell::Cell>, String>,
    /// The owner's lease deadline: checked before anything is hosted.
    pub fence: &'a turnpike_lifecycle::fence::Fence,
    /// What the turn may bring in from other conversations.
    pub reach: &'a crate::reach::Reach,
    /// Set once the turn hosts a file (its attempt's files are then promoted after commit).
    pub hosted: &'a std::sync::atomic::AtomicBool,
}

/// The turn's project directory, opened on first use.
pub struct ProjectHandle<'a> {
    pub cell: &'a tokio::sync::OnceCell<Project>,
    pub lineage: &'a Lineage,
    pub workspace: &'a Path,
    pub base: Option<turnpike_schemas::ProjectVersion>,
}

impl ProjectHandle<'_> {
    /// The project, opened now if it was not.
    pub async fn get(&self) -> Result<&Project, String> {
        self.cell
            .get_or_try_init(|| Project::open(self.lineage.clone(), self.workspace, self.base))
            .await
            .map_err(|e| format!("the project cannot be opened: {e}"))
    }
}

impl ToolContext<'_> {
    /// A key for this call that stays the same when the turn is retried: pass it on to an
    /// external service so a repeated side effect is recognised (SHA-256 of conversation, turn
    /// and call id, hex).
    pub fn idempotency_key(&self) -> String {
        let mut hasher = <sha2::Sha256 as sha2::Digest>::new();
        sha2::Digest::update(
            &mut hasher,
            format!(
                "{}\n{}\n{}",
                self.prefix.conversation(),
                self.turn,
                self.call_id
            ),
        );
        hex::encode(sha2::Digest::finalize(hasher))
    }
}

/// One tool.
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    /// Name, description and argument schema, as the model sees them.
    fn spec(&self) -> ToolSpec;

    /// Whether a call has effects outside the turn's workspace.
    fn side_effects(&self) -> bool {
        false
    }

    /// Runs one call. An `Err` is a message for the model, not a failure of the turn.
    async fn call(&self, cx: &ToolContext<'_>, arguments: Value) -> Result<ToolOutput, String>;
}

/// Every tool a worker knows, by name.
#[derive(Clone, Default)]
pub struct Registry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

impl Registry {
    /// The built-in tools: `read_file`, `list_files`, `write_file`, `pull`, `publish`,
    /// `search`, `exec`, `ask_user`, `checkout` and `system__switch_to_agent`.
    pub fn builtin() -> Self {
        Self::default()
            .with(Arc::new(AskUser))
            .with(Arc::new(Checkout))
            .with(Arc::new(SwitchAgent))
            .with(Arc::new(ReadFile))
            .with(Arc::new(ListFiles))
            .with(Arc::new(WriteFile))
            .with(Arc::new(Pull))
            .with(Arc::new(Publish))
            .with(Arc::new(Search))
            .with(Arc::new(Exec))
    }

    /// Adds (or replaces) a tool, e.g. an app's native one.
    pub fn with(mut self, tool: Arc<dyn Tool>) -> Self {
        self.tools.insert(tool.spec().name, tool);
        self
    }

    /// Whether a tool of this name exists.
    pub fn contains(&self, name: &str) -> bool {
        self.tools.contains_key(name)
    }

    /// The names of every tool.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    /// The tool named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// The tools an allowlist names, in its order; unknown names are an error naming them.
    pub fn allow(&self, names: &[String]) -> Result<Toolset, String> {
        Toolset::allow(self, names)
    }
}

impl ToolCatalog for Registry {
    fn describe(&self, name: &str) -> Option<ToolDescription> {
        self.tools.get(name).map(|t| ToolDescription {
            spec: t.spec(),
            side_effects: t.side_effects(),
        })
    }

    fn names(&self) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }
}

/// Runs a call of an allowed tool and bounds its result. A call of a tool outside the
/// allowlist is an error result, never a call.
pub async fn run_call(
    registry: &Registry,
    tools: &Toolset,
    cx: &ToolContext<'_>,
    call_id: &str,
    name: &str,
    arguments: Value,
) -> (bool, ToolOutput) {
    let tool = tools.get(name).and_then(|_| registry.get(name));
    let Some(tool) = tool else {
        return (
            false,
            json!({"error": format!("no tool named {name:?} is available to this agent")}).into(),
        );
    };
    match tool.call(cx, arguments).await {
        Ok(out) => (true, bound(cx, call_id, out).await),
        Err(message) => (false, json!({ "error": message }).into()),
    }
}

pub(crate) async fn bound(cx: &ToolContext<'_>, call_id: &str, mut out: ToolOutput) -> ToolOutput {
    let text = out.output.to_string();
    if text.len() <= MAX_RESULT_BYTES {
        return out;
    }
    let name = format!("{}.json", sanitize(call_id));
    let path = RefPath::from_segments(["tool-output".to_owned(), name]).expect("a valid path");
    let size = text.len();
    let preview: String = text.chars().take(PREVIEW_BYTES).collect();
    if let Err(e) = cx.fence.check() {
        out.output = json!({ "error": e.to_string() });
        return out;
    }
    cx.hosted.store(true, std::sync::atomic::Ordering::Relaxed);
    match cx
        .files
        .host(cx.prefix, cx.turn, cx.attempt, &path, Bytes::from(text))
        .await
    {
        Ok(reference) => {
            out.blocks.push(Block::File {
                path: path.to_relative_path(),
                reference: reference.clone(),
                size: size as u64,
                media_type: "application/json".into(),
            });
            out.output = json!({
                "truncated": true,
                "size": size,
                "preview": preview,
                "reference": reference.to_string(),
            });
        }
        Err(e) => {
            out.output = json!({
                "truncated": true,
                "size": size,
                "preview": preview,
                "error": format!("the full result could not be stored: {e}"),
            });
        }
    }
    out
}

pub(crate) fn sanitize(id: &str) -> String {
    let s: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if s.is_empty() {
        "call".into()
    } else {
        s
    }
}

/// A string argument, or an error naming it.
pub(crate) fn str_arg<'v>(args: &'v Value, name: &str) -> Result<&'v str, String> {
    args.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("the argument {name:?} (a string) is required"))
}
