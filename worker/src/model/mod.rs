//! Model providers behind one trait: `openai` (any OpenAI-compatible chat-completions
//! endpoint), `script` (a deterministic model read from a file), `replay` (the outputs
//! recorded in a conversation's record) and `echo` (repeats the user, for smoke tests).
//!
//! A provider turns a [`ModelRequest`] into one [`ModelReply`], streaming text deltas to the
//! call's [`CallContext`] as they come. Cancelling is dropping the future: providers hold no
//! state across calls that a drop could corrupt.

pub mod echo;
pub mod openai;
pub use crate::replay::ReplayModel;
pub mod script;

use std::fmt;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{mpsc, watch};

/// Who says a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// A tool call the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRequest {
    /// The provider's id for the call, echoed with its result.
    pub id: String,
    pub name: String,
    /// The arguments, as JSON. Arguments that were not valid JSON arrive as a JSON string.
    pub arguments: Value,
}

/// One message of a model request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// For assistant messages: the tool calls it made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallRequest>,
    /// For tool messages: the call this answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: Value,
}

/// One call to a model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRequest {
    pub model: String,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    /// Index of the first message of the running turn (history before it).
    pub turn_start: usize,
    /// The closing call of a turn whose rounds ran out: no tools, a reply is wanted.
    pub closing: bool,
    /// A compaction: a summary of the messages is wanted, not a reply.
    pub compaction: bool,
    pub max_tokens: Option<u32>,
}

/// Token counts a provider reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// What the model answered.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelReply {
    pub text: String,
    pub tool_calls: Vec<ToolCallRequest>,
    pub usage: Option<Usage>,
    pub finish_reason: Option<String>,
}

/// What a call can use besides its request.
pub struct CallContext {
    deltas: Option<mpsc::UnboundedSender<String>>,
    arrivals: watch::Receiver<u64>,
}

impl CallContext {
    /// A context streaming deltas to `deltas`, with `arrivals` counting events that reached the
    /// conversation's lane during the turn.
    pub fn new(
        deltas: Option<mpsc::UnboundedSender<String>>,
        arrivals: watch::Receiver<u64>,
    ) -> Self {
        Self { deltas, arrivals }
    }

    /// A context that streams nowhere and never sees arrivals.
    pub fn detached() -> Self {
        let (tx, rx) = watch::channel(0);
        // Keep the sender alive so waiting on arrivals waits, not errors.
        std::mem::forget(tx);
        Self {
            deltas: None,
            arrivals: rx,
        }
    }

    /// Publishes a streamed text delta (advisory; the durable reply is in the turn log).
    pub fn delta(&self, text: &str) {
        if let Some(tx) = &self.deltas {
            let _ = tx.send(text.to_owned());
        }
    }

    /// Waits until an event arrives on the lane after the call started. Once the lane watch
    /// has ended nothing more will arrive: this then never resolves (a closed channel is not
    /// an arrival).
    pub async fn next_arrival(&mut self) {
        if self.arrivals.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Why a model call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelErrorKind {
    /// The endpoint refused the request (a 4xx other than 408/429): retrying will not help.
    Rejected,
    /// The endpoint could not be reached or kept failing after retries.
    Unavailable,
    /// The stream stalled or the call ran past its deadline.
    Timeout,
    /// The endpoint answered something that is not the protocol.
    Protocol,
    /// The provider's configuration is wrong (a missing key, an unreadable script).
    Config,
    /// A replayed call differs from the recorded one.
    Diverged,
}

/// A model call's error: a kind and a message that says what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelError {
    pub kind: ModelErrorKind,
    pub message: String,
}

impl ModelError {
    pub fn new(kind: ModelErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "model {:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for ModelError {}

/// A model endpoint.
#[async_trait]
pub trait ModelProvider: Send + Sync + 'static {
    /// Answers one request, streaming text deltas to `cx` as they come.
    async fn complete(
        &self,
        request: &ModelRequest,
        cx: &mut CallContext,
    ) -> Result<ModelReply, ModelError>;
}
