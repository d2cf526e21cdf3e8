//! Turn logs: one object per turn with its ordered blocks, so reading a turn is one fetch.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::block_kinds::block_kinds;
use crate::entry::TurnOutcome;
use crate::identity::Identity;
use crate::ids::{AgentId, ConversationId, RequestId, TurnId};
use crate::reference::Reference;

/// The turn log format this build writes.
pub const TURN_LOG_VERSION: u16 = 1;
/// Artifacts up to this size are inlined in the log; larger ones are hosted files.
pub const MAX_INLINE_ARTIFACT_BYTES: usize = 16 * 1024;

/// Everything a turn did, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnLog {
    pub version: u16,
    pub conversation: ConversationId,
    pub turn: TurnId,
    pub agent: AgentId,
    pub outcome: TurnOutcome,
    pub blocks: Vec<Block>,
    /// The tokens the turn's model calls used, summed, as the endpoints reported them (absent
    /// when no endpoint reports usage: scripted and replayed models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// A remote app's turn: what the app asked for and what it was sent, in order (absent for
    /// the built-in agent loop and native apps). Replay re-drives the turn from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exchange: Option<Exchange>,
    /// The turn's agent opted out of indexing: nothing of it is remembered across
    /// conversations.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unindexed: bool,
}

/// The exchange between a worker and a remote app during one turn attempt.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Exchange {
    /// The idempotency key every attempt at the turn carries (`{conversation}/{turn}`).
    pub key: String,
    /// How many of the turn's blocks it had when the exchange started (its inputs, what the
    /// turn applied first: approvals, a summary, what was recalled).
    pub lead: usize,
    /// The turn's limits as the app was sent them (a replay keeps to them).
    #[serde(default)]
    pub limits: Value,
    pub steps: Vec<ExchangeStep>,
}

/// One step of an exchange with a remote app.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum ExchangeStep {
    /// An action the app sent, as it was sent (keepalives are not kept).
    Action { action: Value },
    /// What the worker sent the app: a result, an event, an error, the end.
    Sent { message: Value },
    /// Events that reached the turn (committed) while the app worked, as blocks.
    Arrived { blocks: Vec<Block> },
    /// A stop reached the turn while the app worked (committed with what came with it).
    Stopped { blocks: Vec<Block> },
}

/// Token counts a model endpoint reported (a count it left out reads as zero).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    /// Prompt tokens the provider served from its cache (part of `prompt_tokens`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_tokens: u64,
    /// Completion tokens spent reasoning (part of `completion_tokens`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reasoning_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Usage {
    /// The sum of two counts.
    pub fn plus(self, other: Usage) -> Usage {
        Usage {
            prompt_tokens: self.prompt_tokens.saturating_add(other.prompt_tokens),
            completion_tokens: self
                .completion_tokens
                .saturating_add(other.completion_tokens),
            cached_tokens: self.cached_tokens.saturating_add(other.cached_tokens),
            reasoning_tokens: self.reasoning_tokens.saturating_add(other.reasoning_tokens),
        }
    }
}

block_kinds! {
/// One step of a turn. Read with its `kind` first without buffering (see `crate::block_de`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Block {
    UserMessage {
        text: String,
    },
    FollowUp {
        text: String,
    },
    Steer {
        text: String,
    },
    /// A stop cancelled the turn here.
    Stop {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    AssistantMessage {
        text: String,
    },
    ToolCall {
        call_id: String,
        tool: String,
        arguments: Value,
    },
    ToolResult {
        call_id: String,
        ok: bool,
        output: Value,
    },
    /// A file the turn made or changed; the bytes stay in the store.
    File {
        path: String,
        reference: Reference,
        size: u64,
        media_type: String,
    },
    /// A small artifact, inlined (base64) so the log is self-contained.
    Artifact {
        name: String,
        media_type: String,
        data_base64: String,
    },
    /// A compaction summary of earlier turns.
    Summary {
        through: TurnId,
        text: String,
    },
    Attachment {
        name: String,
        media_type: String,
        reference: Reference,
    },
    /// A gated call parked the turn; it answers the call until a person does.
    ApprovalRequest {
        request_id: RequestId,
        call_id: String,
        tool: String,
        /// Canonical arguments: what an approval binds to.
        arguments: Value,
        /// Who may approve; empty: the conversation's owner.
        approvers: Vec<Identity>,
        /// The model's text of the paused round, withheld from the user.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        withheld: String,
        /// A `connection_required` card: the MCP server (of the conversation's app) whose
        /// connection the sender lacks; once they connect (or approve), the call is retried.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        connection: Option<String>,
    },
    /// How an approval request was answered (or refused, or rejected automatically).
    ApprovalResponse {
        request_id: RequestId,
        approved: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<Identity>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        #[serde(default)]
        automatic: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        refused: Option<String>,
    },
    /// The agent asked the user a question; it answers the call until the user does.
    QuestionRequest {
        request_id: RequestId,
        call_id: String,
        question: String,
    },
    /// The user's answer to a question (or its automatic withdrawal).
    QuestionResponse {
        request_id: RequestId,
        answer: String,
        #[serde(default)]
        automatic: bool,
    },
    /// The conversation moved to another agent from the next turn on.
    AgentSwitched {
        from: AgentId,
        to: AgentId,
    },
    /// What the context rebuild recalled from the hybrid index for this turn: references and
    /// scores, pinned (a replay uses these, never the index), for this turn only (later turns'
    /// timelines leave it out). `note` says why nothing was recalled when the index failed.
    Recall {
        query: String,
        #[serde(default)]
        hits: Vec<RecallHit>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
}
}

/// One recalled row: where it is and how well it matched. The snippet the model was shown is
/// read through the resolver at rebuild and is not kept in the log (the bytes stay where they
/// are, and leave with them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecallHit {
    pub reference: String,
    pub conversation: ConversationId,
    pub turn: TurnId,
    /// The index's kind of the row (`prompt`, `completion`, …).
    pub kind: String,
    /// The fused score.
    pub score: f64,
    #[serde(skip)]
    pub snippet: String,
}

impl Block {
    /// The block's kind name (as in the log's `kind` field).
    pub fn kind_name(&self) -> &'static str {
        match self {
            Block::UserMessage { .. } => "user_message",
            Block::FollowUp { .. } => "follow_up",
            Block::Steer { .. } => "steer",
            Block::Stop { .. } => "stop",
            Block::AssistantMessage { .. } => "assistant_message",
            Block::ToolCall { .. } => "tool_call",
            Block::ToolResult { .. } => "tool_result",
            Block::File { .. } => "file",
            Block::Artifact { .. } => "artifact",
            Block::Summary { .. } => "summary",
            Block::Attachment { .. } => "attachment",
            Block::ApprovalRequest { .. } => "approval_request",
            Block::ApprovalResponse { .. } => "approval_response",
            Block::QuestionRequest { .. } => "question_request",
            Block::QuestionResponse { .. } => "question_response",
            Block::AgentSwitched { .. } => "agent_switched",
            Block::Recall { .. } => "recall",
        }
    }
}

impl Block {
    /// The turn-log block of an input event (events that add nothing to the timeline, such as
    /// an approval's answer, have none).
    pub fn from_event(body: &crate::EventBody) -> Option<Block> {
        use crate::EventBody;
        match body {
            EventBody::Message { text } => Some(Block::UserMessage { text: text.clone() }),
            EventBody::FollowUp { text } => Some(Block::FollowUp { text: text.clone() }),
            EventBody::Steer { text } => Some(Block::Steer { text: text.clone() }),
            EventBody::Stop { reason } => Some(Block::Stop {
                reason: reason.clone(),
            }),
            EventBody::Attachment {
                name,
                media_type,
                reference,
                ..
            } => Some(Block::Attachment {
                name: name.clone(),
                media_type: media_type.clone(),
                reference: reference.clone(),
            }),
            _ => None,
        }
    }
}
