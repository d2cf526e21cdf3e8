//! Apps: what a worker hosts. An app is a TOML manifest naming its agents, plus optional native
//! callbacks through the [`App`] trait; the default callback runs the built-in agent loop.
//! One worker hosts many apps; a turn routes by (tenant, app, agent).
//!
//! ```toml
//! app = "demo"
//! tenants = ["acme"]            # optional: only these tenants (default: any)
//!
//! [agents.assistant]
//! provider = "openai"           # "openai" | "script" | "echo"
//! model = "gpt-4o-mini"
//! base_url = "https://api.openai.com/v1"   # openai only
//! api_key_env = "OPENAI_API_KEY"           # openai only; the variable holding the key
//!                                          # ("" sends none, for a local server)
//! script = "assistant.script.toml"         # script only; relative to the manifest
//! system_prompt = "You are a careful assistant."
//! tools = ["read_file", "write_file", "publish"]
//! max_rounds = 8                # model and tool rounds per turn (lowered, never raised, by
//!                               # deployment config and ingress directives)
//! context_length = 128000       # tokens the model takes
//! reply_reserve = 4096          # tokens kept free for the reply
//! tokenizer = "gpt.tokenizer.json"         # optional: a Hugging Face tokenizer.json for the
//!                               # model family (relative to the manifest); else an estimate
//! tool_choice = "auto"          # "auto" (default), "required", "none" or a tool's name: a
//!                               # forced choice applies to the first round of each turn
//! temperature = 0.0             # sampling temperature (0–2); absent: the endpoint's default
//! max_tokens = 512              # the most tokens a reply may take (≤ reply_reserve); absent:
//!                               # the endpoint's default
//! recall = { k = 5, scope = "identity", kinds = ["prompt", "completion"], min_score = 0.0,
//!            budget_tokens = 1000 }   # optional: rows of the user's other conversations that
//!                               # match the turn's input join its context (see `recall`)
//! stream = true                 # openai: stream replies (default); false: one response per
//!                               # call (for endpoints that report usage only unstreamed)
//! stall_timeout_secs = 60       # openai: the longest gap between streamed chunks
//! deadline_secs = 600           # openai: the longest a model call may take
//! approval = [{ tool = "publish" },        # calls that need a person's approval: always, or
//!   { tool = "write_file", arg = "path", matches = "deploy/*" }]   # when an argument matches
//! compaction_prompt = "Summarise …"        # how older turns are summarised
//! remote = { url = "http://127.0.0.1:9000" }   # optional: a remote app runs the agent's
//!                               # turns (see `remote`); `provider` answers its model calls
//! index = true                  # false: the agent's turns are not indexed (not searchable,
//!                               # not recalled: nothing of them is remembered)
//! on_new_message = "queue"      # a message arriving while a turn runs: "queue" (default; it
//!                               # starts its own turn after this one) or "interrupt" (the
//!                               # running turn is cancelled, "superseded by a new message")
//! description = "Answers questions about the demo."   # what the agent is for (its A2A card)
//! skills = [{ id = "answer", name = "Answers", description = "Answers a question",
//!             tags = ["qa"], examples = ["What is Turnpike?"] }]   # what its A2A card lists
//! a2a = [{ name = "researcher", url = "https://other.example/a2a/research/researcher",
//!          token_env = "RESEARCHER_TOKEN" }]   # remote agents the model may call, each a
//!                               # side-effecting tool (see `crate::a2a`)
//! headless = "park"             # a gated call in a session's turn (a schedule or a hook sent
//!                               # its input): "park" (default; subscribers hear turn.parked)
//!                               # or "deny" (not run; its result says why)
//!
//! [webhooks.ops]                # app-wide: this tenant's turn events of the app, signed
//! url = "https://ops.example.com/turnpike"
//! tenant = "acme"               # default: the app's only tenant
//! agent = "helper"              # optional: only this agent's turns
//! events = ["turn.failed", "turn.parked"]  # default: every kind
//! secret_env = "OPS_WEBHOOK_SECRET"        # holds a whsec_… secret
//! ```
//!
//! A manifest that does not fit is refused at start with the file, the field and the reason.

pub mod echo;
mod jobs;
mod webhooks;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use turnpike_schemas::entry::TurnOutcome;
use turnpike_schemas::{AgentId, AppId, TenantId};

use crate::approvals::{Gate, Policy};
use crate::error::Result;
use crate::model::openai::{OpenAi, OpenAiConfig};
use crate::model::script::{Script, ScriptModel};
use crate::model::{ModelProvider, ToolChoice};
pub use crate::spec::{AgentSpec, Headless, OnNewMessage, DEFAULT_COMPACTION_PROMPT};
use crate::tokens::TokenCounter;
use crate::tools::{ToolCatalog, Toolset};
use crate::turn::Turn;

/// The most rounds any agent may take.
pub const DEFAULT_MAX_ROUNDS: u32 = 8;

/// An app's native callbacks.
#[async_trait]
pub trait App: Send + Sync + 'static {
    /// Does the work of one turn (between batch one and batch two) and says how it ended.
    async fn on_reactive_event(&self, turn: &dyn Turn) -> Result<TurnOutcome>;
}

/// The default callback: the built-in agent loop over the turn's agent.
#[derive(Debug, Default, Clone, Copy)]
pub struct AgentLoopApp;

#[async_trait]
impl App for AgentLoopApp {
    async fn on_reactive_event(&self, turn: &dyn Turn) -> Result<TurnOutcome> {
        crate::live::run_live(turn).await
    }
}

#[derive(Clone)]
struct HostedApp {
    hooks: BTreeMap<String, turnpike_schemas::HookSpec>,
    webhooks: BTreeMap<String, turnpike_schemas::webhook::WebhookSpec>,
    schedules: BTreeMap<String, turnpike_schemas::schedule::ScheduleSpec>,
    tenants: Vec<TenantId>,
    idle_timeout: IdleTimeout,
    agents: BTreeMap<AgentId, Arc<AgentSpec>>,
    callbacks: Arc<dyn App>,
}

/// Where a turn goes.
pub struct Route {
    pub callbacks: Arc<dyn App>,
    /// The agent's spec; `None` for a native app without a manifest.
    pub agent: Option<Arc<AgentSpec>>,
}

/// The apps a worker hosts: native apps and manifests given in code, and the manifests of the
/// apps folders, which [`Apps::reload`] reads again while the worker runs (a folder that no
/// longer loads keeps the apps it had, and says why).
#[derive(Default)]
pub struct Apps {
    fixed: HashMap<AppId, HostedApp>,
    loaded: RwLock<HashMap<AppId, HostedApp>>,
    dirs: Vec<PathBuf>,
    /// The tools manifests are checked against (set by [`Self::load_dir`]).
    catalog: Option<Arc<dyn ToolCatalog + Send + Sync>>,
    /// What the folders held at the last (re)load.
    fingerprint: Mutex<u64>,
    fallback: Option<Arc<dyn App>>,
}

impl Apps {
    /// No apps: every turn fails with a clear error until some are added.
    pub fn new() -> Self {
        Self::default()
    }

    /// Hosts `callbacks` for every app and agent not otherwise hosted.
    pub fn with_fallback(mut self, callbacks: Arc<dyn App>) -> Self {
        self.fallback = Some(callbacks);
        self
    }

    /// Hosts a native app with no manifest.
    pub fn with_native(mut self, app: AppId, callbacks: Arc<dyn App>) -> Self {
        self.fixed.insert(
            app,
            HostedApp {
                hooks: BTreeMap::new(),
                webhooks: BTreeMap::new(),
                schedules: BTreeMap::new(),
                tenants: Vec::new(),
                idle_timeout: IdleTimeout::Default,
                agents: BTreeMap::new(),
                callbacks,
            },
        );
        self
    }

    /// Hosts an app from its manifest, with the built-in agent loop as its callback (or
    /// `callbacks`).
    pub fn with_manifest(mut self, manifest: Manifest, callbacks: Option<Arc<dyn App>>) -> Self {
        self.fixed
            .insert(manifest.app.clone(), hosted(manifest, callbacks));
        self
    }

    /// Loads every `*.toml` manifest of a folder (scripts named `*.script.toml` are skipped);
    /// [`Self::reload`] reads the folder again.
    pub fn load_dir<C>(mut self, dir: &Path, tools: &C) -> Result<Self, String>
    where
        C: ToolCatalog + Clone + Send + Sync + 'static,
    {
        self.dirs.push(dir.to_path_buf());
        self.catalog = Some(Arc::new(tools.clone()));
        let loaded = self.read_dirs()?;
        *self.loaded.get_mut().expect("apps lock") = loaded;
        *self.fingerprint.get_mut().expect("fingerprint lock") = fingerprint(&self.dirs);
        Ok(self)
    }

    /// Every manifest of the folders, checked (a bad one, or an app declared twice, is an
    /// error naming the file).
    fn read_dirs(&self) -> Result<HashMap<AppId, HostedApp>, String> {
        let mut loaded = HashMap::new();
        for dir in &self.dirs {
            let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(|e| format!("cannot read the apps folder {}: {e}", dir.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| is_manifest(p))
                .collect();
            paths.sort();
            for path in paths {
                let catalog = self.catalog.as_deref().expect("set with the folders");
                let manifest = Manifest::load(&path, catalog)?;
                if self.fixed.contains_key(&manifest.app) || loaded.contains_key(&manifest.app) {
                    return Err(format!(
                        "{}: app: {} is declared twice",
                        path.display(),
                        manifest.app
                    ));
                }
                loaded.insert(manifest.app.clone(), hosted(manifest, None));
            }
        }
        Ok(loaded)
    }

    /// Reads the apps folders again if anything in them changed: `Ok(true)` when the new
    /// manifests replaced the old, `Ok(false)` when nothing changed, and the reason when they do
    /// not load (the running apps stay as they were; the same change is not reported twice).
    pub fn reload(&self) -> Result<bool, String> {
        let now = fingerprint(&self.dirs);
        {
            let mut seen = self.fingerprint.lock().expect("fingerprint lock");
            if *seen == now {
                return Ok(false);
            }
            *seen = now;
        }
        let loaded = self.read_dirs()?;
        *self.loaded.write().expect("apps lock") = loaded;
        Ok(true)
    }

    /// Reloads the folders every `every` until the returned task is aborted, logging what
    /// changed and what was refused.
    pub fn watch(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let apps = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(apps) = apps.upgrade() else { return };
                let result = tokio::task::spawn_blocking(move || apps.reload()).await;
                match result {
                    Ok(Ok(true)) => tracing::info!("reloaded the apps folders"),
                    Ok(Ok(false)) => {}
                    Ok(Err(why)) => {
                        tracing::warn!(%why, "kept the running apps: the changed manifests do not load")
                    }
                    Err(e) => tracing::warn!(error = %e, "reloading the apps failed"),
                }
            }
        })
    }

    fn lookup(&self, app: &AppId) -> Option<HostedApp> {
        self.loaded
            .read()
            .expect("apps lock")
            .get(app)
            .cloned()
            .or_else(|| self.fixed.get(app).cloned())
    }

    /// The agents of an app (empty for a native app or one not hosted).
    pub fn agents_of(&self, app: &AppId) -> Vec<AgentId> {
        self.lookup(app)
            .map(|a| a.agents.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The agents of an app with their specs, in name order (empty for a native app or one not
    /// hosted).
    pub fn agent_specs(&self, app: &AppId) -> Vec<Arc<AgentSpec>> {
        self.lookup(app)
            .map(|a| a.agents.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Every app-wide schedule the hosted manifests declare, with its app.
    pub fn schedules(&self) -> Vec<(AppId, turnpike_schemas::schedule::ScheduleSpec)> {
        let loaded = self.loaded.read().expect("apps lock");
        let mut out = Vec::new();
        // As `lookup`: a loaded manifest wins over a fixed app of the same id.
        let fixed = self
            .fixed
            .iter()
            .filter(|(app, _)| !loaded.contains_key(*app));
        for (app, hosted) in loaded.iter().chain(fixed) {
            out.extend(hosted.schedules.values().map(|s| (app.clone(), s.clone())));
        }
        out.sort_by(|a, b| (&a.0, &a.1.name).cmp(&(&b.0, &b.1.name)));
        out
    }

    /// The inbound hook `name` of `app`, if its manifest declares one.
    pub fn hook(&self, app: &AppId, name: &str) -> Option<turnpike_schemas::HookSpec> {
        self.lookup(app).and_then(|a| a.hooks.get(name).cloned())
    }

    /// The app-wide outbound webhooks `app`'s manifest declares, in name order.
    pub fn webhooks(&self, app: &AppId) -> Vec<turnpike_schemas::webhook::WebhookSpec> {
        self.lookup(app)
            .map(|a| a.webhooks.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether `app` is hosted here (by a manifest, natively, or by the fallback).
    pub fn hosts(&self, app: &AppId) -> bool {
        self.fallback.is_some() || self.lookup(app).is_some()
    }

    /// How long conversations of `app` may be idle before they are closed as idle (`default`:
    /// the deployment's, for apps that set none; `None`: never).
    pub fn idle_timeout(&self, app: &AppId, default: Option<Duration>) -> Option<Duration> {
        match self.lookup(app) {
            Some(hosted) => hosted.idle_timeout.or(default),
            None => default,
        }
    }

    /// The shortest idle timeout of any app (with `default` for those that set none): the idle
    /// sweep looks at nothing younger. `None`: no app's conversations are ever closed as idle.
    pub fn shortest_idle_timeout(&self, default: Option<Duration>) -> Option<Duration> {
        let loaded = self.loaded.read().expect("apps lock");
        let mut any_default = self.fallback.is_some();
        let mut shortest: Option<Duration> = None;
        for hosted in loaded.values().chain(self.fixed.values()) {
            match hosted.idle_timeout {
                IdleTimeout::Default => any_default = true,
                IdleTimeout::Never => {}
                IdleTimeout::After(d) => shortest = Some(shortest.map_or(d, |s| s.min(d))),
            }
        }
        match (shortest, any_default.then_some(default).flatten()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The app ids hosted (not counting the fallback).
    pub fn ids(&self) -> Vec<AppId> {
        let mut ids: Vec<AppId> = self
            .loaded
            .read()
            .expect("apps lock")
            .keys()
            .chain(self.fixed.keys())
            .cloned()
            .collect();
        ids.sort();
        ids
    }

    /// The tenants `app` is offered to (empty: every tenant, or no such app).
    pub fn tenants(&self, app: &AppId) -> Vec<TenantId> {
        self.lookup(app)
            .map(|h| h.tenants.clone())
            .unwrap_or_default()
    }

    /// The callbacks and agent for a turn of (tenant, app, agent), or why there are none.
    pub fn route(&self, tenant: &TenantId, app: &AppId, agent: &AgentId) -> Result<Route, String> {
        match self.lookup(app) {
            Some(hosted) => {
                if !hosted.tenants.is_empty() && !hosted.tenants.contains(tenant) {
                    return Err(format!("app {app} is not offered to tenant {tenant}"));
                }
                if hosted.agents.is_empty() {
                    return Ok(Route {
                        callbacks: hosted.callbacks.clone(),
                        agent: None,
                    });
                }
                match hosted.agents.get(agent) {
                    Some(spec) => Ok(Route {
                        callbacks: hosted.callbacks.clone(),
                        agent: Some(spec.clone()),
                    }),
                    None => Err(format!(
                        "app {app} has no agent {agent} (it has: {})",
                        hosted
                            .agents
                            .keys()
                            .map(|a| a.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                }
            }
            None => match &self.fallback {
                Some(callbacks) => Ok(Route {
                    callbacks: callbacks.clone(),
                    agent: None,
                }),
                None => Err(format!("no app {app} is hosted on this worker")),
            },
        }
    }
}

fn hosted(manifest: Manifest, callbacks: Option<Arc<dyn App>>) -> HostedApp {
    HostedApp {
        hooks: manifest.hooks,
        webhooks: manifest.webhooks,
        schedules: manifest.schedules,
        tenants: manifest.tenants,
        idle_timeout: manifest.idle_timeout,
        agents: manifest.agents,
        callbacks: callbacks.unwrap_or_else(|| Arc::new(AgentLoopApp)),
    }
}

fn is_manifest(path: &Path) -> bool {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    name.ends_with(".toml") && !name.ends_with(".script.toml")
}

/// What the folders hold, as far as a reload cares: every file's name, size and modification
/// time (manifests and what they name: scripts, tokenizers).
fn fingerprint(dirs: &[PathBuf]) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for dir in dirs {
        let mut entries: Vec<(PathBuf, u64, Option<std::time::SystemTime>)> =
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok())
                .filter_map(|e| {
                    // Through symlinks: a linked manifest changes when its target does.
                    let meta = std::fs::metadata(e.path()).ok()?;
                    Some((e.path(), meta.len(), meta.modified().ok()))
                })
                .collect();
        entries.sort();
        entries.hash(&mut hasher);
    }
    hasher.finish()
}

/// An agent's MCP servers, validated, their names distinct; the error starts with where
/// (`[i].field: …`).
fn mcp_servers(
    raw: Vec<crate::mcp::spec::RawServer>,
) -> Result<Vec<crate::mcp::ServerSpec>, String> {
    let mut out: Vec<crate::mcp::ServerSpec> = Vec::new();
    for (i, server) in raw.into_iter().enumerate() {
        let server = server.validate().map_err(|e| format!("[{i}].{e}"))?;
        if out.iter().any(|s| s.name == server.name) {
            return Err(format!("[{i}].name: {:?} is named twice", server.name));
        }
        out.push(server);
    }
    Ok(out)
}

fn policy_tools(policy: &Policy) -> Vec<String> {
    policy.tools()
}

/// How long an app's conversations may be idle before they are closed as idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleTimeout {
    /// The manifest says nothing: the deployment's default applies.
    Default,
    /// `idle_timeout = "0"` (or `"off"`): never, whatever the deployment's default.
    Never,
    After(Duration),
}

impl IdleTimeout {
    /// What applies, given the deployment's default.
    pub fn or(self, default: Option<Duration>) -> Option<Duration> {
        match self {
            IdleTimeout::Default => default,
            IdleTimeout::Never => None,
            IdleTimeout::After(d) => Some(d),
        }
    }
}

/// A validated manifest.
pub struct Manifest {
    pub app: AppId,
    pub tenants: Vec<TenantId>,
    pub idle_timeout: IdleTimeout,
    pub agents: BTreeMap<AgentId, Arc<AgentSpec>>,
    /// Inbound webhooks, by name.
    pub hooks: BTreeMap<String, turnpike_schemas::HookSpec>,
    /// App-wide outbound webhooks, by name.
    pub webhooks: BTreeMap<String, turnpike_schemas::webhook::WebhookSpec>,
    /// App-wide schedules, by name.
    pub schedules: BTreeMap<String, turnpike_schemas::schedule::ScheduleSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    app: String,
    #[serde(default)]
    tenants: Vec<String>,
    /// `"30m"`, `"24h"`, …; `"0"` or `"off"`: never closed as idle.
    #[serde(default)]
    idle_timeout: Option<String>,
    #[serde(default)]
    agents: BTreeMap<String, RawAgent>,
    #[serde(default)]
    hooks: BTreeMap<String, RawHook>,
    #[serde(default)]
    webhooks: BTreeMap<String, webhooks::RawWebhook>,
    #[serde(default)]
    schedules: BTreeMap<String, RawSchedule>,
}

/// `[schedules.<name>]`: an app-wide job.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSchedule {
    agent: String,
    #[serde(default)]
    tenant: Option<String>,
    /// The identity its messages come from (default `schedule:<app>:<name>`).
    #[serde(default)]
    owner: Option<String>,
    #[serde(default)]
    cron: Option<String>,
    #[serde(default)]
    zone: Option<String>,
    #[serde(default)]
    every_seconds: Option<u64>,
    text: String,
    /// `skip`, `latest` (default) or `all`.
    #[serde(default)]
    missed: Option<String>,
    #[serde(default)]
    catch_up: Option<u32>,
    /// `queue` (default), `skip` or `cancel`.
    #[serde(default)]
    overlap: Option<String>,
    #[serde(default)]
    jitter_seconds: Option<u64>,
    #[serde(default)]
    grace_seconds: Option<u64>,
    /// `new` (default: a new conversation per firing) or `same` (one standing conversation).
    #[serde(default)]
    conversation: Option<String>,
}

/// The longest interval, jitter or grace of a schedule, in seconds (a year).
const MAX_SCHEDULE_SECONDS: u64 = 366 * 24 * 3600;

fn schedule_spec(
    app: &AppId,
    tenants: &[TenantId],
    agents: &BTreeMap<AgentId, Arc<AgentSpec>>,
    name: &str,
    raw: RawSchedule,
) -> Result<turnpike_schemas::schedule::ScheduleSpec, String> {
    use turnpike_schemas::schedule::{Missed, Overlap, ScheduleSpec, Timing};
    let field = |f: &str| format!("schedules.{name}.{f}");
    let (agent, tenant, owner) = job_identity(
        &field,
        tenants,
        agents,
        &raw.agent,
        raw.tenant.as_deref(),
        raw.owner.as_deref(),
        &format!("schedule:{app}:{name}"),
    )?;
    let timing = match (raw.cron, raw.every_seconds) {
        (Some(cron), None) => {
            let zone = raw.zone.unwrap_or_else(|| "UTC".into());
            croner::parser::CronParser::builder()
                .seconds(croner::parser::Seconds::Optional)
                .build()
                .parse(&cron)
                .map_err(|e| format!("{}: {cron:?}: {e}", field("cron")))?;
            jiff::tz::TimeZone::get(&zone)
                .map_err(|e| format!("{}: {zone:?} is not known: {e}", field("zone")))?;
            Timing::Cron { cron, zone }
        }
        (None, Some(seconds)) if (1..=MAX_SCHEDULE_SECONDS).contains(&seconds) => {
            if raw.zone.is_some() {
                return Err(format!("{}: goes with cron", field("zone")));
            }
            Timing::Every {
                every_ms: seconds * 1_000,
            }
        }
        (None, Some(seconds)) => {
            return Err(format!(
                "{}: 1–{MAX_SCHEDULE_SECONDS}, not {seconds}",
                field("every_seconds")
            ))
        }
        _ => {
            return Err(format!(
                "schedules.{name}: exactly one of cron and every_seconds"
            ))
        }
    };
    if raw.text.trim().is_empty() || raw.text.len() > 16 * 1024 {
        return Err(format!("{}: 1 to 16384 bytes", field("text")));
    }
    let missed = match (raw.missed.as_deref(), raw.catch_up) {
        (None | Some("latest"), None) => Missed::Latest,
        (Some("skip"), None) => Missed::Skip,
        (Some("all"), cap) => {
            let cap = cap.unwrap_or(10);
            if !(1..=1_000).contains(&cap) {
                return Err(format!("{}: 1–1000, not {cap}", field("catch_up")));
            }
            Missed::All { cap }
        }
        (_, Some(_)) => return Err(format!("{}: goes with missed = \"all\"", field("catch_up"))),
        (Some(other), None) => {
            return Err(format!(
                "{}: `skip`, `latest` or `all`, not {other:?}",
                field("missed")
            ))
        }
    };
    let overlap = match raw.overlap.as_deref() {
        None | Some("queue") => Overlap::Queue,
        Some("skip") => Overlap::Skip,
        Some("cancel") => Overlap::Cancel,
        Some(other) => {
            return Err(format!(
                "{}: `queue`, `skip` or `cancel`, not {other:?}",
                field("overlap")
            ))
        }
    };
    let seconds = |f: &str, v: Option<u64>, default: u64| {
        let v = v.unwrap_or(default);
        if v > MAX_SCHEDULE_SECONDS {
            return Err(format!("{}: at most a year, not {v}", field(f)));
        }
        Ok(v * 1_000)
    };
    let same = match raw.conversation.as_deref() {
        None | Some("new") => false,
        Some("same") => true,
        Some(other) => {
            return Err(format!(
                "{}: `new` or `same`, not {other:?}",
                field("conversation")
            ))
        }
    };
    Ok(ScheduleSpec {
        name: name.to_owned(),
        agent,
        tenant,
        owner,
        timing,
        text: raw.text,
        missed,
        overlap,
        jitter_ms: seconds("jitter_seconds", raw.jitter_seconds, 0)?,
        grace_ms: seconds("grace_seconds", raw.grace_seconds, 60)?,
        same,
    })
}

/// `[hooks.<name>]`: an inbound webhook.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHook {
    agent: String,
    /// The tenant its conversations belong to (default: the app's only tenant).
    #[serde(default)]
    tenant: Option<String>,
    /// The identity its messages come from (default `hook:<app>:<name>`).
    #[serde(default)]
    owner: Option<String>,
    /// `standard` (Standard Webhooks) or `github`.
    signature: String,
    /// The environment variable holding the secret.
    secret_env: String,
    /// `new` (default), or a JSON pointer into the payload naming the conversation's key.
    #[serde(default)]
    conversation: Option<String>,
    #[serde(default)]
    max_bytes: Option<usize>,
    #[serde(default)]
    tolerance_secs: Option<u64>,
    /// `text` (default: the message's text) or `attachment`.
    #[serde(default)]
    payload: Option<String>,
}

/// A manifest job's agent (one of the app's), tenant (given, or the app's only one; one of
/// the app's when it names them) and owner identity (given, or `default_owner`), each checked
/// with `field` naming where it is.
fn job_identity(
    field: &dyn Fn(&str) -> String,
    tenants: &[TenantId],
    agents: &BTreeMap<AgentId, Arc<AgentSpec>>,
    agent: &str,
    tenant: Option<&str>,
    owner: Option<&str>,
    default_owner: &str,
) -> Result<(AgentId, TenantId, turnpike_schemas::Identity), String> {
    let agent: AgentId = agent
        .parse()
        .map_err(|e| format!("{}: {e}", field("agent")))?;
    if !agents.contains_key(&agent) {
        return Err(format!("{}: the app has no agent {agent}", field("agent")));
    }
    let tenant = jobs::job_tenant(field, tenants, tenant)?;
    let owner: turnpike_schemas::Identity = owner
        .unwrap_or(default_owner)
        .parse()
        .map_err(|e| format!("{}: {e}", field("owner")))?;
    Ok((agent, tenant, owner))
}

/// The most a hook may take in one body: what a message may hold.
pub const MAX_HOOK_BYTES: usize = turnpike_schemas::event::MAX_TEXT_BYTES;
/// The most a hook whose payload is an attachment may take: what an attachment may hold.
pub const MAX_HOOK_ATTACHMENT_BYTES: usize = turnpike_schemas::event::MAX_ATTACHMENT_BYTES as usize;

fn hook_spec(
    app: &AppId,
    tenants: &[TenantId],
    agents: &BTreeMap<AgentId, Arc<AgentSpec>>,
    name: &str,
    raw: RawHook,
) -> Result<turnpike_schemas::HookSpec, String> {
    use turnpike_schemas::{HookConversation, HookSignature};
    let field = |f: &str| format!("hooks.{name}.{f}");
    jobs::job_name("hooks", "a hook's", name)?;
    let (agent, tenant, owner) = job_identity(
        &field,
        tenants,
        agents,
        &raw.agent,
        raw.tenant.as_deref(),
        raw.owner.as_deref(),
        &format!("hook:{app}:{name}"),
    )?;
    let signature = match raw.signature.as_str() {
        "standard" => HookSignature::Standard,
        "github" => HookSignature::Github,
        other => {
            return Err(format!(
                "{}: `standard` or `github`, not {other:?}",
                field("signature")
            ))
        }
    };
    if raw.secret_env.trim().is_empty() {
        return Err(format!(
            "{}: name an environment variable",
            field("secret_env")
        ));
    }
    let conversation = match raw.conversation.as_deref() {
        None | Some("new") => HookConversation::New,
        Some(pointer) if pointer.starts_with('/') => HookConversation::Field(pointer.to_owned()),
        Some(other) => {
            return Err(format!(
                "{}: `new` or a JSON pointer (`/issue/number`), not {other:?}",
                field("conversation")
            ))
        }
    };
    let (payload, most) = match raw.payload.as_deref() {
        None | Some("text") => (turnpike_schemas::HookPayload::Text, MAX_HOOK_BYTES),
        Some("attachment") => (
            turnpike_schemas::HookPayload::Attachment,
            MAX_HOOK_ATTACHMENT_BYTES,
        ),
        Some(other) => {
            return Err(format!(
                "{}: `text` or `attachment`, not {other:?}",
                field("payload")
            ))
        }
    };
    let max_bytes = raw.max_bytes.unwrap_or(64 << 10);
    if max_bytes == 0 || max_bytes > most {
        return Err(format!("{}: 1–{most}, not {max_bytes}", field("max_bytes")));
    }
    Ok(turnpike_schemas::HookSpec {
        name: name.to_owned(),
        agent,
        tenant,
        owner,
        signature,
        secret_env: raw.secret_env,
        conversation,
        max_bytes,
        tolerance_secs: raw.tolerance_secs.unwrap_or(300),
        payload,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    provider: String,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    base_url: Option<String>,
    #[serde(default)]
    api_key_env: Option<String>,
    #[serde(default)]
    script: Option<PathBuf>,
    #[serde(default)]
    system_prompt: String,
    #[serde(default)]
    tools: Vec<String>,
    #[serde(default)]
    max_rounds: Option<u32>,
    #[serde(default)]
    context_length: Option<u32>,
    #[serde(default)]
    reply_reserve: Option<u32>,
    #[serde(default)]
    stall_timeout_secs: Option<u64>,
    #[serde(default)]
    deadline_secs: Option<u64>,
    #[serde(default)]
    tokenizer: Option<PathBuf>,
    #[serde(default)]
    approval: Vec<Gate>,
    #[serde(default)]
    compaction_prompt: Option<String>,
    #[serde(default)]
    on_new_message: OnNewMessage,
    #[serde(default)]
    headless: crate::spec::Headless,
    #[serde(default)]
    tool_choice: Option<String>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    recall: Option<crate::recall::RecallSpec>,
    #[serde(default)]
    remote: Option<crate::remote::RawRemote>,
    #[serde(default)]
    mcp: Vec<crate::mcp::spec::RawServer>,
    #[serde(default)]
    a2a: Vec<crate::a2a::RawRemoteAgent>,
    #[serde(default = "yes")]
    index: bool,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    skills: Vec<crate::spec::Skill>,
}

fn yes() -> bool {
    true
}

/// An agent's remote agents (`[[agents.X.a2a]]`), each a tool whose name no other tool of the
/// agent has.
fn remote_agents(
    raw: Vec<crate::a2a::RawRemoteAgent>,
    tools: &dyn ToolCatalog,
    allowed: &[String],
) -> Result<Vec<crate::a2a::RemoteAgent>, String> {
    let mut agents: Vec<crate::a2a::RemoteAgent> = Vec::new();
    for (i, raw) in raw.into_iter().enumerate() {
        let agent = raw.validate().map_err(|e| format!("[{i}]{e}"))?;
        if agents.iter().any(|a| a.name == agent.name) {
            return Err(format!("[{i}].name: {:?} is named twice", agent.name));
        }
        if tools.describe(&agent.name).is_some() || allowed.contains(&agent.name) {
            return Err(format!(
                "[{i}].name: {:?} is a built-in tool's name",
                agent.name
            ));
        }
        agents.push(agent);
    }
    Ok(agents)
}

/// An agent's skills, each with an id unique within the agent and a name.
fn checked_skills(skills: Vec<crate::spec::Skill>) -> Result<Vec<crate::spec::Skill>, String> {
    let mut seen = std::collections::HashSet::new();
    for (i, skill) in skills.iter().enumerate() {
        if skill.id.trim().is_empty() || skill.name.trim().is_empty() {
            return Err(format!("[{i}]: a skill needs an id and a name"));
        }
        if !seen.insert(skill.id.as_str()) {
            return Err(format!("[{i}].id: {:?} is used twice", skill.id));
        }
    }
    Ok(skills)
}

impl Manifest {
    /// Reads and validates a manifest file.
    pub fn load(path: &Path, tools: &dyn ToolCatalog) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the manifest {}: {e}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, base, tools).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses and validates manifest text; files it names are relative to `base`. The error
    /// names the field and the reason.
    pub fn parse(text: &str, base: &Path, tools: &dyn ToolCatalog) -> Result<Self, String> {
        let raw: RawManifest = toml::from_str(text).map_err(|e| e.to_string())?;
        let app: AppId = raw.app.parse().map_err(|e| format!("app: {e}"))?;
        let tenants = raw
            .tenants
            .iter()
            .enumerate()
            .map(|(i, t)| t.parse().map_err(|e| format!("tenants[{i}]: {e}")))
            .collect::<Result<Vec<TenantId>, String>>()?;
        if raw.agents.is_empty() {
            return Err("agents: an app needs at least one agent".into());
        }
        let mut agents = BTreeMap::new();
        for (name, agent) in raw.agents {
            let field = |f: &str| format!("agents.{name}.{f}");
            let id: AgentId = name.parse().map_err(|e| format!("agents.{name}: {e}"))?;
            let toolset = Toolset::allow(tools, &agent.tools)
                .map_err(|e| format!("{}: {e}", field("tools")))?;
            let mcp = mcp_servers(agent.mcp).map_err(|e| format!("{}{e}", field("mcp")))?;
            let remote_agents = remote_agents(agent.a2a, tools, &agent.tools)
                .map_err(|e| format!("{}{e}", field("a2a")))?;
            let toolset = toolset.with(remote_agents.iter().map(|a| a.tool()));
            let is_mcp_tool = |tool: &str| {
                mcp.iter()
                    .any(|s| s.own_name(tool).is_some_and(|own| s.allows(own)))
                    || remote_agents.iter().any(|a| a.name == tool)
            };
            let max_rounds = agent.max_rounds.unwrap_or(DEFAULT_MAX_ROUNDS);
            if max_rounds == 0 || max_rounds > DEFAULT_MAX_ROUNDS {
                return Err(format!(
                    "{}: must be 1–{DEFAULT_MAX_ROUNDS}, not {max_rounds}",
                    field("max_rounds")
                ));
            }
            let context_length = agent.context_length.unwrap_or(128_000);
            let reply_reserve = agent.reply_reserve.unwrap_or(4_096);
            if reply_reserve >= context_length {
                return Err(format!(
                    "{}: {reply_reserve} leaves nothing of a context of {context_length}",
                    field("reply_reserve")
                ));
            }
            let (provider, model): (Arc<dyn ModelProvider>, String) = match agent.provider.as_str()
            {
                "script" => {
                    let Some(script) = agent.script else {
                        return Err(format!(
                            "{}: the script provider needs a script file",
                            field("script")
                        ));
                    };
                    let script = Script::load(&base.join(script))
                        .map_err(|e| format!("{}: {e}", field("script")))?;
                    (
                        Arc::new(ScriptModel::new(script)),
                        agent.model.unwrap_or_else(|| "script".into()),
                    )
                }
                "echo" => (
                    Arc::new(crate::model::echo::EchoModel),
                    agent.model.unwrap_or_else(|| "echo".into()),
                ),
                "openai" => {
                    let Some(model) = agent.model else {
                        return Err(format!(
                            "{}: the openai provider needs a model",
                            field("model")
                        ));
                    };
                    let mut config = OpenAiConfig::default();
                    if let Some(url) = agent.base_url {
                        url::Url::parse(&url).map_err(|e| {
                            format!("{}: {url:?} is not a URL: {e}", field("base_url"))
                        })?;
                        config.base_url = url;
                    }
                    if let Some(var) = agent.api_key_env {
                        // An empty name: send no key (a local server).
                        config.api_key_env = (!var.is_empty()).then_some(var);
                    }
                    if let Some(s) = agent.stall_timeout_secs {
                        config.stall_timeout = Duration::from_secs(s.max(1));
                    }
                    if let Some(s) = agent.deadline_secs {
                        config.deadline = Duration::from_secs(s.max(1));
                    }
                    if let Some(stream) = agent.stream {
                        config.stream = stream;
                    }
                    let provider =
                        OpenAi::new(config).map_err(|e| format!("{}: {e}", field("provider")))?;
                    (Arc::new(provider), model)
                }
                other => {
                    return Err(format!(
                        "{}: unknown provider {other:?} (known: openai, script, echo)",
                        field("provider")
                    ))
                }
            };
            let tokens = match &agent.tokenizer {
                Some(path) => TokenCounter::load(&base.join(path))
                    .map_err(|e| format!("{}: {e}", field("tokenizer")))?,
                None => TokenCounter::Estimate,
            };
            let tool_choice = ToolChoice::parse(agent.tool_choice.as_deref().unwrap_or("auto"));
            match &tool_choice {
                ToolChoice::Required
                    if agent.tools.is_empty() && mcp.is_empty() && remote_agents.is_empty() =>
                {
                    return Err(format!(
                        "{}: \"required\" needs the agent to have tools",
                        field("tool_choice")
                    ))
                }
                ToolChoice::Tool(tool) if !agent.tools.contains(tool) && !is_mcp_tool(tool) => {
                    return Err(format!(
                    "{}: {tool:?} is not one of the agent's tools ({}), nor auto, required or none",
                    field("tool_choice"),
                    agent.tools.join(", ")
                ))
                }
                _ => {}
            }
            if let Some(t) = agent.temperature {
                if !(0.0..=2.0).contains(&t) {
                    return Err(format!("{}: must be 0–2, not {t}", field("temperature")));
                }
            }
            if let Some(recall) = &agent.recall {
                recall
                    .validate()
                    .map_err(|e| format!("{}.{e}", field("recall")))?;
            }
            if let Some(m) = agent.max_tokens {
                if m == 0 || m > reply_reserve {
                    return Err(format!(
                        "{}: must be 1–{reply_reserve} (the reply reserve), not {m}",
                        field("max_tokens")
                    ));
                }
            }
            let remote = match agent.remote {
                Some(raw) => Some(Arc::new(
                    raw.validate()
                        .map_err(|e| format!("{}.{e}", field("remote")))?,
                )),
                None => None,
            };
            let skills =
                checked_skills(agent.skills).map_err(|e| format!("{}{e}", field("skills")))?;
            let policy = Policy::new(agent.approval).map_err(|e| format!("agents.{name}.{e}"))?;
            for gate in policy_tools(&policy) {
                if tools.describe(&gate).is_none() && !is_mcp_tool(&gate) {
                    return Err(format!("agents.{name}.approval: unknown tool {gate:?}"));
                }
            }
            agents.insert(
                id.clone(),
                Arc::new(AgentSpec {
                    name: id,
                    provider,
                    provider_kind: agent.provider,
                    model,
                    system_prompt: agent.system_prompt,
                    tools: toolset,
                    max_rounds,
                    context_length,
                    reply_reserve,
                    tokens,
                    policy,
                    compaction_prompt: agent
                        .compaction_prompt
                        .unwrap_or_else(|| DEFAULT_COMPACTION_PROMPT.into()),
                    on_new_message: agent.on_new_message,
                    headless: agent.headless,
                    tool_choice,
                    temperature: agent.temperature,
                    max_tokens: agent.max_tokens,
                    recall: agent.recall,
                    remote,
                    mcp,
                    a2a: remote_agents,
                    index: agent.index,
                    description: agent.description.unwrap_or_default(),
                    skills,
                }),
            );
        }
        let idle_timeout = match raw.idle_timeout.as_deref() {
            None => IdleTimeout::Default,
            Some(text) => match crate::duration::parse_idle_timeout(text)
                .map_err(|e| format!("idle_timeout: {e}"))?
            {
                None => IdleTimeout::Never,
                Some(d) => IdleTimeout::After(d),
            },
        };
        let mut hooks = BTreeMap::new();
        for (name, raw) in raw.hooks {
            let spec = hook_spec(&app, &tenants, &agents, &name, raw)?;
            hooks.insert(name, spec);
        }
        let mut webhooks = BTreeMap::new();
        for (name, raw) in raw.webhooks {
            let spec = webhooks::webhook_spec(&tenants, &agents, &name, raw)?;
            webhooks.insert(name, spec);
        }
        let mut schedules = BTreeMap::new();
        for (name, raw) in raw.schedules {
            let spec = schedule_spec(&app, &tenants, &agents, &name, raw)?;
            schedules.insert(name, spec);
        }
        Ok(Manifest {
            app,
            tenants,
            idle_timeout,
            agents,
            hooks,
            webhooks,
            schedules,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolSpec;
    use crate::tools::ToolDescription;

    /// The worker's built-in tools, by name (the harness runs none of them).
    #[derive(Clone)]
    struct Builtins;

    const BUILTINS: [&str; 10] = [
        "ask_user",
        "checkout",
        "exec",
        "list_files",
        "publish",
        "pull",
        "read_file",
        "search",
        "system__switch_to_agent",
        "write_file",
    ];

    impl ToolCatalog for Builtins {
        fn describe(&self, name: &str) -> Option<ToolDescription> {
            BUILTINS.contains(&name).then(|| ToolDescription {
                spec: ToolSpec {
                    name: name.into(),
                    description: String::new(),
                    parameters: serde_json::json!({"type": "object"}),
                },
                side_effects: name == "publish",
            })
        }

        fn names(&self) -> Vec<String> {
            BUILTINS.iter().map(|n| n.to_string()).collect()
        }
    }

    fn parse(text: &str) -> Result<Manifest, String> {
        Manifest::parse(text, Path::new("."), &Builtins)
    }

    #[test]
    fn bad_manifests_name_the_field_and_the_reason() {
        let cases = [
            ("app = \"x\"\n", "agents"),
            ("app = \"Bad App\"\n[agents.a]\nprovider = \"openai\"\nmodel = \"m\"\n", "app:"),
            ("app = \"x\"\n[agents.a]\nprovider = \"nope\"\n", "agents.a.provider: unknown provider \"nope\""),
            ("app = \"x\"\n[agents.a]\nprovider = \"openai\"\n", "agents.a.model"),
            ("app = \"x\"\n[agents.a]\nprovider = \"openai\"\nmodel = \"m\"\ntools = [\"rm\"]\n", "agents.a.tools: unknown tool \"rm\""),
            ("app = \"x\"\n[agents.a]\nprovider = \"openai\"\nmodel = \"m\"\nmax_rounds = 20\n", "agents.a.max_rounds"),
            ("app = \"x\"\n[agents.a]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"not a url\"\n", "agents.a.base_url"),
            ("app = \"x\"\n[agents.a]\nprovider = \"script\"\nscript = \"missing.toml\"\n", "agents.a.script"),
            ("app = \"x\"\n[agents.a]\nprovider = \"openai\"\nmodel = \"m\"\ncolour = 1\n", "colour"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\ntokenizer = \"nope.json\"\n", "agents.a.tokenizer: cannot load"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\ntools = [\"read_file\"]\ntool_choice = \"write_file\"\n", "agents.a.tool_choice: \"write_file\" is not one of the agent's tools"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\ntool_choice = \"required\"\n", "agents.a.tool_choice: \"required\" needs the agent to have tools"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\ntemperature = 3.5\n", "agents.a.temperature: must be 0–2"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\nreply_reserve = 100\nmax_tokens = 200\n", "agents.a.max_tokens: must be 1–100"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\nremote = { url = \"nope\" }\n", "agents.a.remote.url: \"nope\" is not a URL"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\n[schedules.s]\nagent = \"a\"\ntenant = \"t\"\ncron = \"61 * * * *\"\ntext = \"go\"\n", "schedules.s.cron"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\n[schedules.s]\nagent = \"a\"\ntenant = \"t\"\ncron = \"@daily\"\nzone = \"Mars/Base\"\ntext = \"go\"\n", "schedules.s.zone"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\n[schedules.s]\nagent = \"a\"\ntenant = \"t\"\nevery_seconds = 0\ntext = \"go\"\n", "schedules.s.every_seconds"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\n[schedules.s]\nagent = \"a\"\ntenant = \"t\"\ntext = \"go\"\n", "exactly one of cron and every_seconds"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\n[schedules.s]\nagent = \"a\"\ntenant = \"t\"\nevery_seconds = 60\ntext = \"go\"\nmissed = \"sometimes\"\n", "schedules.s.missed"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\n[schedules.s]\nagent = \"a\"\ntenant = \"t\"\nevery_seconds = 60\ntext = \"go\"\nconversation = \"mine\"\n", "schedules.s.conversation"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\n[hooks.h]\nagent = \"b\"\ntenant = \"t\"\nsignature = \"standard\"\nsecret_env = \"S\"\n", "hooks.h.agent: the app has no agent b"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\n[hooks.h]\nagent = \"a\"\nsignature = \"standard\"\nsecret_env = \"S\"\n", "hooks.h.tenant"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\n[hooks.h]\nagent = \"a\"\ntenant = \"t\"\nsignature = \"hmac\"\nsecret_env = \"S\"\n", "hooks.h.signature"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\n[hooks.h]\nagent = \"a\"\ntenant = \"t\"\nsignature = \"github\"\nsecret_env = \"S\"\nconversation = \"issue\"\n", "hooks.h.conversation"),
            ("app = \"x\"\ntenants = [\"u\"]\n[agents.a]\nprovider = \"echo\"\n[hooks.h]\nagent = \"a\"\ntenant = \"t\"\nsignature = \"github\"\nsecret_env = \"S\"\n", "hooks.h.tenant: t is not one of the app's tenants"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\n[hooks.h]\nagent = \"a\"\ntenant = \"t\"\nsignature = \"github\"\nsecret_env = \"S\"\nmax_bytes = 999999\n", "hooks.h.max_bytes"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\n[hooks.h]\nagent = \"a\"\ntenant = \"t\"\nsignature = \"github\"\nsecret_env = \"S\"\npayload = \"file\"\n", "hooks.h.payload"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\n[hooks.h]\nagent = \"a\"\ntenant = \"t\"\nsignature = \"github\"\nsecret_env = \"S\"\npayload = \"attachment\"\nmax_bytes = 9999999\n", "hooks.h.max_bytes"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\n[webhooks.w]\nurl = \"ftp://x/\"\ntenant = \"t\"\nsecret_env = \"S\"\n", "webhooks.w.url"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\n[webhooks.w]\nurl = \"https://x/\"\ntenant = \"t\"\nevents = [\"turn.done\"]\nsecret_env = \"S\"\n", "webhooks.w.events"),
            ("app = \"x\"\n[agents.a]\nprovider = \"echo\"\n[webhooks.w]\nurl = \"https://x/\"\ntenant = \"t\"\nagent = \"b\"\nsecret_env = \"S\"\n", "webhooks.w.agent"),
        ];
        for (text, expected) in cases {
            match parse(text) {
                Ok(_) => panic!("accepted {text:?}"),
                Err(e) => assert!(e.contains(expected), "{text:?}: {e}"),
            }
        }
    }

    #[test]
    fn routes_by_app_tenant_and_agent() {
        let manifest = parse(
            "app = \"x\"\ntenants = [\"acme\"]\n[agents.a]\nprovider = \"openai\"\nmodel = \"m\"\n",
        )
        .unwrap();
        let apps = Apps::new().with_manifest(manifest, None);
        let acme: TenantId = "acme".parse().unwrap();
        let x: AppId = "x".parse().unwrap();
        assert!(apps
            .route(&acme, &x, &"a".parse().unwrap())
            .unwrap()
            .agent
            .is_some());
        let e = apps.route(&acme, &x, &"b".parse().unwrap()).err().unwrap();
        assert!(e.contains("no agent b"), "{e}");
        let e = apps
            .route(&"other".parse().unwrap(), &x, &"a".parse().unwrap())
            .err()
            .unwrap();
        assert!(e.contains("not offered"), "{e}");
        let e = apps
            .route(&acme, &"y".parse().unwrap(), &"a".parse().unwrap())
            .err()
            .unwrap();
        assert!(e.contains("no app y"), "{e}");
    }
}
