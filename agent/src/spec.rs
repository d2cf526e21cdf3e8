//! One agent of an app, as its manifest makes it: ready to run.

use std::sync::Arc;

use serde::Deserialize;
use turnpike_schemas::AgentId;

use crate::approvals::policy::Policy;
use crate::model::{ModelProvider, ToolChoice};
use crate::tokens::TokenCounter;
use crate::tools::Toolset;

/// One agent, ready to run.
pub struct AgentSpec {
    pub name: AgentId,
    pub provider: Arc<dyn ModelProvider>,
    /// The manifest's provider (`openai`, `script`, `echo`): a metrics label.
    pub provider_kind: String,
    pub model: String,
    pub system_prompt: String,
    pub tools: Toolset,
    pub max_rounds: u32,
    pub context_length: u32,
    pub reply_reserve: u32,
    /// How the agent's tokens are counted.
    pub tokens: TokenCounter,
    /// Which calls need a person's approval.
    pub policy: Policy,
    /// The prompt a compaction summarises with.
    pub compaction_prompt: String,
    /// What a message arriving on the lane does to a running turn of this agent.
    pub on_new_message: OnNewMessage,
    /// What a gated call does in a session's turn, where nobody is there to approve it.
    pub headless: Headless,
    /// Whether the first round of a turn must call a tool.
    pub tool_choice: ToolChoice,
    /// Sampling temperature for every call; `None`: the endpoint's default.
    pub temperature: Option<f32>,
    /// The most tokens one reply may take; `None`: the endpoint's default.
    pub max_tokens: Option<u32>,
    /// What the context rebuild recalls from the index; `None`: nothing.
    pub recall: Option<crate::recall::RecallSpec>,
    /// The remote app that runs the agent's turns; `None`: the built-in agent loop. The
    /// provider then answers the app's `model` actions.
    pub remote: Option<Arc<crate::remote::spec::RemoteSpec>>,
    /// The MCP servers whose tools the agent may use, besides `tools`.
    pub mcp: Vec<crate::mcp::ServerSpec>,
    /// The remote agents it may call over A2A, each one of `tools`.
    pub a2a: Vec<crate::a2a::RemoteAgent>,
    /// Whether the agent's turns are indexed (remembered across the user's conversations).
    pub index: bool,
    /// What the agent is for, in a sentence or two: its A2A card's description.
    pub description: String,
    /// What it can do, as its A2A card lists it.
    pub skills: Vec<Skill>,
}

/// One thing an agent can do (`[[agents.X.skills]]`), as its A2A card lists it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Skill {
    /// A short id, unique within the agent.
    pub id: String,
    pub name: String,
    pub description: String,
    #[serde(default)]
    pub tags: Vec<String>,
    /// Prompts that show the skill in use.
    #[serde(default)]
    pub examples: Vec<String>,
}

/// What a new message does to a running turn (an agent's `on_new_message`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnNewMessage {
    /// It waits on the lane and starts its own turn once the running one ends.
    #[default]
    Queue,
    /// It cancels the running turn (recorded as superseded), then starts its own.
    Interrupt,
}

/// What a gated call does in a headless turn (a session's: a schedule or an inbound webhook
/// sent its input, not a person) — the agent's `headless`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Headless {
    /// The turn parks on the approval as in a chat; subscribers hear `turn.parked` and an
    /// approval through the API resumes it.
    #[default]
    Park,
    /// The call is not run: its result is an error that says why, recorded, and the turn goes
    /// on without it.
    Deny,
}

/// The reason a denied headless call's result gives (recorded with it).
pub const HEADLESS_DENIED: &str =
    "denied: this call needs a person's approval and nobody is there to give it (a session's turn; the agent's headless policy is \"deny\")";

/// The compaction prompt unless an agent sets its own.
pub const DEFAULT_COMPACTION_PROMPT: &str = "Summarise the conversation so far for your own later use: the user's goals, decisions made, facts learned, files made (with their references) and open questions. Be brief and concrete.";
