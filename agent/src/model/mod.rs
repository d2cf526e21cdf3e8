//! Model providers behind one trait: `openai` (any OpenAI-compatible chat-completions
//! endpoint), `script` (a deterministic model read from a file), `replay` (the outputs
//! recorded in a conversation's record) and `echo` (repeats the user, for smoke tests).
//!
//! A provider turns a [`ModelRequest`] into one [`ModelReply`], streaming text deltas to the
//! call's [`CallContext`] as they come. Cancelling is dropping the future: providers hold no
//! state across calls that a drop could corrupt.

pub mod echo;
pub mod openai;
pub mod script;

use std::fmt;

use async_trait::async_trait;
use tokio::sync::{mpsc, watch};

pub use crate::message::{Message, Role, ToolCallRequest, ToolSpec};

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
    /// Whether (and which) tool the model must call; only sent with tools.
    pub tool_choice: ToolChoice,
    /// Sampling temperature; `None` leaves the endpoint's default.
    pub temperature: Option<f32>,
}

/// Whether the model must call a tool, in the protocol's terms. The agent loop applies a forced
/// choice (`required` or a named tool) to the first round of a turn only and lets the model
/// choose afterwards, so a forced tool cannot loop a turn through all of its rounds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// The model must call some tool.
    Required,
    /// The model may not call tools.
    None,
    /// The model must call this tool.
    Tool(String),
}

impl ToolChoice {
    /// Parses a manifest's `tool_choice`: `auto`, `required`, `none` or a tool's name.
    pub fn parse(s: &str) -> Self {
        match s {
            "auto" => Self::Auto,
            "required" => Self::Required,
            "none" => Self::None,
            name => Self::Tool(name.to_owned()),
        }
    }

    /// Whether the model is made to call a tool.
    pub fn forces(&self) -> bool {
        matches!(self, Self::Required | Self::Tool(_))
    }
}

pub use turnpike_schemas::turnlog::Usage;

/// What the model answered.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelReply {
    pub text: String,
    pub tool_calls: Vec<ToolCallRequest>,
    pub usage: Option<Usage>,
    pub finish_reason: Option<String>,
    /// The model that answered, as the endpoint named it (`None`: it did not say).
    pub model: Option<String>,
}

/// What one model call used, as the turn's record keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallUsage {
    /// The provider kind (`openai`, `script`, …).
    pub provider: String,
    /// The model that answered (else the one asked for).
    pub model: String,
    pub usage: Usage,
    /// The endpoint reported nothing: counted with the agent's token counter.
    pub estimated: bool,
}

/// Who a context's calls are counted for: the provider and how to count tokens it does not
/// report.
#[derive(Clone)]
struct Meter {
    provider: String,
    tokens: crate::tokens::TokenCounter,
}

/// What a call can use besides its request.
pub struct CallContext {
    deltas: Option<mpsc::UnboundedSender<String>>,
    arrivals: watch::Receiver<u64>,
    usage: Option<Usage>,
    meter: Option<Meter>,
    calls: Vec<CallUsage>,
    /// When the current call's first text delta came (reset by [`CallContext::start_call`]).
    first_delta: std::sync::OnceLock<std::time::Instant>,
}

impl CallContext {
    /// A context streaming deltas to `deltas`, with `arrivals` counting events that reached the
    /// conversation's lane during the turn.
    pub fn new(
        deltas: Option<mpsc::UnboundedSender<String>>,
        arrivals: watch::Receiver<u64>,
    ) -> Self {
        Self {
            deltas,
            arrivals,
            usage: None,
            meter: None,
            calls: Vec::new(),
            first_delta: std::sync::OnceLock::new(),
        }
    }

    /// Counts this context's calls as `provider`'s, estimating with `tokens` what the
    /// endpoint does not report.
    pub fn metered(mut self, provider: &str, tokens: crate::tokens::TokenCounter) -> Self {
        self.meter = Some(Meter {
            provider: provider.to_owned(),
            tokens,
        });
        self
    }

    /// A context that streams nowhere and never sees arrivals.
    pub fn detached() -> Self {
        let (tx, rx) = watch::channel(0);
        // Keep the sender alive so waiting on arrivals waits, not errors.
        std::mem::forget(tx);
        Self {
            deltas: None,
            arrivals: rx,
            usage: None,
            meter: None,
            calls: Vec::new(),
            first_delta: std::sync::OnceLock::new(),
        }
    }

    /// A context for a call whose text is not the user's: it sees the same arrivals but
    /// streams nowhere and counts its own usage.
    pub fn quiet(&self) -> Self {
        Self {
            deltas: None,
            arrivals: self.arrivals.clone(),
            usage: None,
            meter: None,
            calls: Vec::new(),
            first_delta: std::sync::OnceLock::new(),
        }
    }

    /// A context streaming to the same place, with its own view of the arrivals and its own
    /// usage.
    pub fn fork(&self) -> Self {
        Self {
            deltas: self.deltas.clone(),
            arrivals: self.arrivals.clone(),
            usage: None,
            meter: None,
            calls: Vec::new(),
            first_delta: std::sync::OnceLock::new(),
        }
    }

    /// Counts one call: its reported usage adds to the turn's; in a metered context it is
    /// kept as a [`CallUsage`] (estimated from the request and the reply when not reported).
    pub fn account(&mut self, request: &ModelRequest, reply: &ModelReply) {
        if let Some(u) = reply.usage {
            self.usage = Some(self.usage.unwrap_or_default().plus(u));
        }
        let Some(meter) = &self.meter else {
            return;
        };
        let (usage, estimated) = match reply.usage {
            Some(u) => (u, false),
            None => {
                let prompt = request.messages.iter().map(|m| meter.tokens.count(m)).sum();
                let mut answer = Message::new(Role::Assistant, reply.text.clone());
                answer.tool_calls = reply.tool_calls.clone();
                let usage = Usage {
                    prompt_tokens: prompt,
                    completion_tokens: meter.tokens.count(&answer),
                    ..Default::default()
                };
                (usage, true)
            }
        };
        self.calls.push(CallUsage {
            provider: meter.provider.clone(),
            model: reply.model.clone().unwrap_or_else(|| request.model.clone()),
            usage,
            estimated,
        });
    }

    /// The usage the turn's calls reported so far (`None`: none reported any).
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Every call counted in this context, in order (metered contexts only).
    pub fn calls(&self) -> &[CallUsage] {
        &self.calls
    }

    /// Marks the start of a call: the next delta is its first.
    pub fn start_call(&mut self) {
        self.first_delta = std::sync::OnceLock::new();
    }

    /// When the current call's first text delta came, if one did.
    pub fn first_delta_at(&self) -> Option<std::time::Instant> {
        self.first_delta.get().copied()
    }

    /// Publishes a streamed text delta (advisory; the durable reply is in the turn log).
    pub fn delta(&self, text: &str) {
        let _ = self.first_delta.get_or_init(std::time::Instant::now);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> ModelRequest {
        ModelRequest {
            model: "asked-for".into(),
            messages: vec![
                Message::new(Role::System, "x".repeat(40)),
                Message::new(Role::User, "y".repeat(80)),
            ],
            tools: Vec::new(),
            turn_start: 1,
            closing: false,
            compaction: false,
            max_tokens: None,
            tool_choice: ToolChoice::Auto,
            temperature: None,
        }
    }

    #[test]
    fn a_metered_context_keeps_each_call_reported_or_estimated() {
        let mut cx = CallContext::detached().metered("openai", Default::default());
        let reported = ModelReply {
            text: "hi".into(),
            usage: Some(Usage {
                prompt_tokens: 30,
                completion_tokens: 4,
                cached_tokens: 10,
                reasoning_tokens: 2,
            }),
            model: Some("served-model".into()),
            ..Default::default()
        };
        cx.account(&request(), &reported);
        // No usage reported: the estimate (4 bytes a token plus 4 a message), the asked model.
        let silent = ModelReply {
            text: "z".repeat(20),
            ..Default::default()
        };
        cx.account(&request(), &silent);
        let calls = cx.calls();
        assert_eq!(calls.len(), 2);
        assert_eq!(
            (calls[0].model.as_str(), calls[0].estimated, calls[0].usage),
            ("served-model", false, reported.usage.unwrap())
        );
        assert_eq!(calls[1].model, "asked-for");
        assert!(calls[1].estimated);
        assert_eq!(calls[1].usage.prompt_tokens, (10 + 4) + (20 + 4));
        assert_eq!(calls[1].usage.completion_tokens, 5 + 4);
        // The turn log's sum holds reported usage only.
        assert_eq!(cx.usage(), reported.usage);
        // An unmetered context keeps no calls.
        let mut plain = CallContext::detached();
        plain.account(&request(), &reported);
        assert!(plain.calls().is_empty());
        assert_eq!(plain.usage(), reported.usage);
    }
}
