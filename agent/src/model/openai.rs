//! `openai`: any OpenAI-compatible `/v1/chat/completions` endpoint, streamed over SSE.
//!
//! Contract:
//! - requests stream (`stream: true`, usage included); text deltas go to the call context as
//!   they arrive; tool calls are assembled from their streamed fragments (parallel calls by
//!   `index`, the first id and name, arguments concatenated, then parsed as JSON); a server
//!   that streams no usage (llama-cpp-python) leaves the reply's usage empty;
//! - the API key comes from the environment variable the config names, read at each call, and
//!   is sent as a bearer token;
//! - connecting is bounded by `connect_timeout`; after the response starts, every gap between
//!   two chunks is bounded by `stall_timeout`, and the whole call by `deadline`;
//! - a call is retried, with exponential backoff (or the server's `Retry-After`), only while
//!   nothing of it has been streamed: connection failures, 408, 429 and 5xx. Any other 4xx is a
//!   `Rejected` error carrying the server's message; it is not retried.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use eventsource_stream::Eventsource as _;
use futures::StreamExt as _;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::{
    CallContext, Message, ModelError, ModelErrorKind, ModelProvider, ModelReply, ModelRequest,
    Role, ToolCallRequest, ToolChoice, Usage,
};

/// How to reach an endpoint.
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// The API base, e.g. `https://api.openai.com/v1`; `/chat/completions` is appended.
    pub base_url: String,
    /// The environment variable holding the API key; none sends no key.
    pub api_key_env: Option<String>,
    pub connect_timeout: Duration,
    /// The longest gap between two streamed chunks.
    pub stall_timeout: Duration,
    /// The longest a whole call may take, retries included.
    pub deadline: Duration,
    /// Retries after the first attempt, for failures that are safe to retry.
    pub max_retries: u32,
    /// The first backoff; doubled per retry.
    pub backoff: Duration,
    /// Stream the reply (the default). Off: one response per call, its text published as one
    /// delta — for endpoints that stream badly or report usage only unstreamed.
    pub stream: bool,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        Self {
            base_url: "https://api.openai.com/v1".into(),
            api_key_env: Some("OPENAI_API_KEY".into()),
            connect_timeout: Duration::from_secs(10),
            stall_timeout: Duration::from_secs(60),
            deadline: Duration::from_secs(600),
            max_retries: 3,
            backoff: Duration::from_millis(500),
            stream: true,
        }
    }
}

/// The provider.
pub struct OpenAi {
    config: OpenAiConfig,
    client: reqwest::Client,
}

impl OpenAi {
    pub fn new(config: OpenAiConfig) -> Result<Self, ModelError> {
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .build()
            .map_err(|e| ModelError::new(ModelErrorKind::Config, format!("http client: {e}")))?;
        Ok(Self { config, client })
    }

    fn url(&self) -> String {
        format!(
            "{}/chat/completions",
            self.config.base_url.trim_end_matches('/')
        )
    }

    fn body(&self, request: &ModelRequest) -> Value {
        let messages: Vec<Value> = request.messages.iter().map(message_json).collect();
        let mut body = json!({
            "model": request.model,
            "messages": messages,
            "stream": self.config.stream,
        });
        if self.config.stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        if !request.tools.is_empty() && !request.closing {
            body["tools"] = request
                .tools
                .iter()
                .map(|t| {
                    json!({"type": "function", "function": {
                        "name": t.name, "description": t.description, "parameters": t.parameters}})
                })
                .collect();
            body["tool_choice"] = match &request.tool_choice {
                ToolChoice::Auto => json!("auto"),
                ToolChoice::Required => json!("required"),
                ToolChoice::None => json!("none"),
                ToolChoice::Tool(name) => json!({"type": "function", "function": {"name": name}}),
            };
        }
        if let Some(t) = request.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(max) = request.max_tokens {
            body["max_tokens"] = json!(max);
        }
        body
    }
}

fn message_json(m: &Message) -> Value {
    let role = match m.role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let mut v = json!({"role": role, "content": m.content});
    if !m.tool_calls.is_empty() {
        v["tool_calls"] = m
            .tool_calls
            .iter()
            .map(|c| {
                let arguments = match &c.arguments {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                json!({"id": c.id, "type": "function",
                       "function": {"name": c.name, "arguments": arguments}})
            })
            .collect();
    }
    if let Some(id) = &m.tool_call_id {
        v["tool_call_id"] = json!(id);
    }
    v
}

/// Why one attempt failed, and whether another is safe.
struct Attempt {
    error: ModelError,
    retry: bool,
    retry_after: Option<Duration>,
}

impl Attempt {
    /// A failure another attempt would not mend.
    fn fails(kind: ModelErrorKind, message: String) -> Self {
        Attempt {
            error: ModelError::new(kind, message),
            retry: false,
            retry_after: None,
        }
    }

    /// The same failure, worth another attempt.
    fn retried(mut self) -> Self {
        self.retry = true;
        self
    }
}

#[async_trait]
impl ModelProvider for OpenAi {
    async fn complete(
        &self,
        request: &ModelRequest,
        cx: &mut CallContext,
    ) -> Result<ModelReply, ModelError> {
        let deadline = Instant::now() + self.config.deadline;
        let body = self.body(request);
        let mut attempt = 0;
        loop {
            let call = self.attempt(&body, cx);
            let result = match tokio::time::timeout_at(deadline, call).await {
                Ok(r) => r,
                Err(_) => {
                    return Err(ModelError::new(
                        ModelErrorKind::Timeout,
                        format!(
                            "the call ran past its deadline of {:?}",
                            self.config.deadline
                        ),
                    ))
                }
            };
            match result {
                Ok(reply) => return Ok(reply),
                Err(a) if a.retry && attempt < self.config.max_retries => {
                    let wait = a
                        .retry_after
                        .unwrap_or(self.config.backoff * 2u32.saturating_pow(attempt))
                        .min(Duration::from_secs(30));
                    tracing::warn!(error = %a.error, attempt, ?wait, "model call failed; retrying");
                    if Instant::now() + wait >= deadline {
                        return Err(a.error);
                    }
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                Err(a) => return Err(a.error),
            }
        }
    }
}

impl OpenAi {
    async fn attempt(&self, body: &Value, cx: &mut CallContext) -> Result<ModelReply, Attempt> {
        let response = self.send(body).await?;
        if !response.status().is_success() {
            return Err(self.refusal(response).await);
        }
        if self.config.stream {
            self.streamed(response, cx).await
        } else {
            self.whole(response, cx).await
        }
    }

    /// Sends the request and waits for the response's headers.
    async fn send(&self, body: &Value) -> Result<reqwest::Response, Attempt> {
        let mut req = self.client.post(self.url()).json(body);
        if let Some(var) = &self.config.api_key_env {
            let key = std::env::var(var).map_err(|_| {
                Attempt::fails(
                    ModelErrorKind::Config,
                    format!("the API key variable {var} is not set"),
                )
            })?;
            req = req.bearer_auth(key);
        }
        // Unstreamed, the headers come only once the whole reply is made: the call's deadline
        // bounds that wait, not the stall timeout.
        let wait = if self.config.stream {
            self.config.stall_timeout
        } else {
            self.config.deadline
        };
        tokio::time::timeout(wait, req.send())
            .await
            .map_err(|_| {
                Attempt::fails(
                    ModelErrorKind::Timeout,
                    format!("no response within {wait:?} from {}", self.url()),
                )
                .retried()
            })?
            .map_err(|e| {
                Attempt::fails(
                    ModelErrorKind::Unavailable,
                    format!("cannot reach {}: {e}", self.url()),
                )
                .retried()
            })
    }

    /// What an unsuccessful status means: retried when the endpoint may answer later (408,
    /// 429, 5xx, after the `Retry-After` it gives), with the endpoint's own message.
    async fn refusal(&self, response: reqwest::Response) -> Attempt {
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let text = tokio::time::timeout(self.config.stall_timeout, response.text())
            .await
            .ok()
            .and_then(|r| r.ok())
            .unwrap_or_default();
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| text.chars().take(500).collect());
        let retry = status.as_u16() == 408 || status.as_u16() == 429 || status.is_server_error();
        let kind = if retry {
            ModelErrorKind::Unavailable
        } else {
            ModelErrorKind::Rejected
        };
        Attempt {
            error: ModelError::new(kind, format!("the endpoint answered {status}: {message}")),
            retry,
            retry_after,
        }
    }

    /// Reads a streamed reply: server-sent chunks until `[DONE]` or the end, each within the
    /// stall timeout.
    async fn streamed(
        &self,
        response: reqwest::Response,
        cx: &mut CallContext,
    ) -> Result<ModelReply, Attempt> {
        let mut events = response.bytes_stream().eventsource();
        let mut assembly = Assembly::default();
        loop {
            let next = tokio::time::timeout(self.config.stall_timeout, events.next())
                .await
                .map_err(|_| {
                    Attempt::fails(
                        ModelErrorKind::Timeout,
                        format!("the stream stalled for {:?}", self.config.stall_timeout),
                    )
                })?;
            let Some(event) = next else { break };
            let event = event.map_err(|e| {
                Attempt::fails(
                    ModelErrorKind::Unavailable,
                    format!("the stream broke: {e}"),
                )
            })?;
            if event.data.trim() == "[DONE]" {
                break;
            }
            let chunk: Chunk = serde_json::from_str(&event.data).map_err(|e| {
                Attempt::fails(
                    ModelErrorKind::Protocol,
                    format!("a streamed chunk is not a chat-completion chunk: {e}"),
                )
            })?;
            assembly.add(chunk, cx);
        }
        assembly.finish().map_err(|error| Attempt {
            error,
            retry: false,
            retry_after: None,
        })
    }
}

/// `null` where a list is expected reads as empty (llama-cpp-python sends `"tool_calls": null`).
fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

impl OpenAi {
    /// An unstreamed response: the whole reply at once, its text published as one delta.
    async fn whole(
        &self,
        response: reqwest::Response,
        cx: &mut CallContext,
    ) -> Result<ModelReply, Attempt> {
        let failed = Attempt::fails;
        let text = tokio::time::timeout(self.config.stall_timeout, response.text())
            .await
            .map_err(|_| {
                failed(
                    ModelErrorKind::Timeout,
                    format!("no reply within {:?}", self.config.stall_timeout),
                )
            })?
            .map_err(|e| failed(ModelErrorKind::Unavailable, format!("the reply broke: {e}")))?;
        let whole: Whole = serde_json::from_str(&text).map_err(|e| {
            failed(
                ModelErrorKind::Protocol,
                format!("the reply is not a chat completion: {e}"),
            )
        })?;
        // The same assembly as a stream of one chunk.
        let mut assembly = Assembly {
            usage: whole.usage.map(Usage::from),
            model: served_model(&whole.model),
            ..Assembly::default()
        };
        for choice in whole.choices {
            let calls = choice
                .message
                .tool_calls
                .into_iter()
                .enumerate()
                .map(|(index, c)| ToolCallDelta {
                    index,
                    id: c.id,
                    function: c.function,
                })
                .collect();
            assembly.add(
                Chunk {
                    choices: vec![Choice {
                        delta: Delta {
                            content: choice.message.content,
                            tool_calls: calls,
                        },
                        finish_reason: choice.finish_reason,
                    }],
                    usage: None,
                    model: Value::Null,
                },
                cx,
            );
        }
        assembly
            .finish()
            .map_err(|error| failed(error.kind.clone(), error.message))
    }
}

/// An unstreamed chat completion.
#[derive(Deserialize)]
struct Whole {
    #[serde(default, deserialize_with = "null_as_empty")]
    choices: Vec<WholeChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    model: Value,
}

/// The model a response names, when it names one sensibly (a string of printable characters,
/// at most 200): it goes into signed usage entries and picks the price.
fn served_model(value: &Value) -> Option<String> {
    let name = value.as_str()?.trim();
    (!name.is_empty() && name.len() <= 200 && !name.chars().any(char::is_control))
        .then(|| name.to_owned())
}

/// Deserialises `T`, or its default when the value does not fit (or is null).
fn lenient<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned + Default,
{
    let value = Value::deserialize(d)?;
    Ok(serde_json::from_value(value).unwrap_or_default())
}

/// `usage` as the protocol nests it (cached and reasoning counts in their `…_details`).
#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default, deserialize_with = "lenient")]
    prompt_tokens_details: PromptDetails,
    #[serde(default, deserialize_with = "lenient")]
    completion_tokens_details: CompletionDetails,
}

/// Read leniently: a detail the runtime cannot read counts as absent, never fails the call.
#[derive(Deserialize, Default)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Value,
}

#[derive(Deserialize, Default)]
struct CompletionDetails {
    #[serde(default)]
    reasoning_tokens: Value,
}

impl From<WireUsage> for Usage {
    fn from(w: WireUsage) -> Usage {
        Usage {
            prompt_tokens: w.prompt_tokens,
            completion_tokens: w.completion_tokens,
            cached_tokens: w.prompt_tokens_details.cached_tokens.as_u64().unwrap_or(0),
            reasoning_tokens: w
                .completion_tokens_details
                .reasoning_tokens
                .as_u64()
                .unwrap_or(0),
        }
    }
}

#[derive(Deserialize)]
struct WholeChoice {
    #[serde(default, deserialize_with = "null_as_default")]
    message: WholeMessage,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct WholeMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default, deserialize_with = "null_as_empty")]
    tool_calls: Vec<WholeCall>,
}

#[derive(Deserialize)]
struct WholeCall {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default, deserialize_with = "null_as_empty")]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    model: Value,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Delta,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default, deserialize_with = "null_as_empty")]
    tool_calls: Vec<ToolCallDelta>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: usize,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    /// A JSON text (the protocol); some servers send the object itself.
    #[serde(default, deserialize_with = "text_or_json")]
    arguments: Option<String>,
}

/// A string as it is; any other JSON value as its text.
fn text_or_json<'de, D>(d: D) -> Result<Option<String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Ok(match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(other) => Some(other.to_string()),
    })
}

/// `null` reads as the default.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A reply being assembled from streamed chunks.
#[derive(Default)]
struct Assembly {
    text: String,
    calls: BTreeMap<usize, (String, String, String)>,
    usage: Option<Usage>,
    finish_reason: Option<String>,
    model: Option<String>,
}

impl Assembly {
    fn add(&mut self, chunk: Chunk, cx: &CallContext) {
        if let Some(usage) = chunk.usage {
            self.usage = Some(usage.into());
        }
        if let Some(model) = served_model(&chunk.model) {
            self.model.get_or_insert(model);
        }
        for choice in chunk.choices {
            if let Some(text) = choice.delta.content {
                if !text.is_empty() {
                    cx.delta(&text);
                    self.text.push_str(&text);
                }
            }
            for call in choice.delta.tool_calls {
                let entry = self.calls.entry(call.index).or_default();
                // The id and the name come whole in a call's first fragment; some servers
                // (llama-cpp-python) repeat them in every fragment: the first one counts.
                if let Some(id) = call.id {
                    if entry.0.is_empty() {
                        entry.0 = id;
                    }
                }
                if let Some(f) = call.function {
                    if let Some(name) = f.name {
                        if entry.1.is_empty() {
                            entry.1 = name;
                        }
                    }
                    if let Some(args) = f.arguments {
                        entry.2.push_str(&args);
                    }
                }
            }
            if choice.finish_reason.is_some() {
                self.finish_reason = choice.finish_reason;
            }
        }
    }

    fn finish(self) -> Result<ModelReply, ModelError> {
        let mut tool_calls = Vec::new();
        for (index, (id, name, args)) in self.calls {
            if name.is_empty() {
                return Err(ModelError::new(
                    ModelErrorKind::Protocol,
                    format!("streamed tool call {index} has no function name"),
                ));
            }
            let arguments = if args.trim().is_empty() {
                json!({})
            } else {
                serde_json::from_str(&args).unwrap_or(Value::String(args))
            };
            let id = if id.is_empty() {
                format!("call_{index}")
            } else {
                id
            };
            tool_calls.push(ToolCallRequest {
                id,
                name,
                arguments,
            });
        }
        Ok(ModelReply {
            text: self.text,
            tool_calls,
            usage: self.usage,
            finish_reason: self.finish_reason,
            model: self.model,
        })
    }
}

#[cfg(test)]
mod wire_tests {
    use super::*;

    #[test]
    fn odd_usage_details_and_models_never_fail_a_reply() {
        let chunk: Chunk = serde_json::from_value(json!({
            "choices": [],
            "model": 42,
            "usage": {"prompt_tokens": 7, "completion_tokens": 2,
                      "prompt_tokens_details": "n/a",
                      "completion_tokens_details": {"reasoning_tokens": "many"}}
        }))
        .unwrap();
        assert_eq!(served_model(&chunk.model), None);
        let usage: Usage = chunk.usage.unwrap().into();
        assert_eq!((usage.prompt_tokens, usage.completion_tokens), (7, 2));
        assert_eq!((usage.cached_tokens, usage.reasoning_tokens), (0, 0));
        assert_eq!(served_model(&json!(" gpt-x ")), Some("gpt-x".into()));
        assert_eq!(served_model(&json!("x".repeat(201))), None);
        assert_eq!(served_model(&json!("a\nb")), None);
        assert_eq!(served_model(&json!("")), None);
    }
}
