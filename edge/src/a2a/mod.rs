//! Every hosted agent as an A2A agent (the Agent2Agent protocol, version 1.0, JSON-RPC binding).
//!
//! # Mapping
//! - An agent's card is at `/a2a/{app}/{agent}/.well-known/agent-card.json`; its JSON-RPC
//!   endpoint is `/a2a/{app}/{agent}`. `GET /v1/agent-cards` lists the cards of every agent the
//!   caller's tenant may use.
//! - An A2A **context is a conversation** (`contextId` = `conv_…`); a message without one opens a
//!   new conversation with the endpoint's agent, owned by the caller.
//! - A **task is a turn** — the turn the message opened, followed through the turns that answer
//!   what it parked on (`turnpike_artifactory::tasks`). Task ids are `<conversation>-<lane seq>`; nothing about a
//!   task is kept beside the record.
//! - A message on a task that is working is a follow-up; on one that waits (`input-required`),
//!   it is the answer: the text of a question's answer, or `approve` / `reject: <reason>` (or a
//!   data part `{"approve": bool, "reason"?, "requestId"?}`) for a gated call. What a task waits
//!   for travels in its status message: a text part saying what to do and a data part with the
//!   request (`kind`: `approval`, `question` or `connection_required`). A call that needs the
//!   caller's own connection to an MCP server makes the task `auth-required`.
//! - Files in are file parts with bytes (`raw`): each becomes an attachment of the message's
//!   turn (checked like uploads). Files out are the hosted files the reply names, as file parts
//!   by URL: signed links, valid for an hour, to this deployment.
//! - The message id is the submission's idempotency key: a retried `SendMessage` is one task.
//! - Authentication is the REST API's (bearer tokens, JWTs); a conversation or task the caller
//!   may not see is "task not found", exactly like one that does not exist; an app offered to
//!   other tenants only has no card for this one.
//! - Errors are JSON-RPC errors with A2A's codes ([`wire::Code`]), never a 500.

pub mod follow;
mod push;
pub mod wire;

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use futures::StreamExt as _;
use serde_json::{json, Value};
use turnpike_artifactory::DirectoryEntry;
use turnpike_schemas::{AgentId, AppId, EventBody};

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::events::IDEMPOTENCY_KEY;
use crate::extract::Caller;
use crate::model::AgentView;
use crate::state::Edge;
use follow::Update;
use turnpike_artifactory::tasks::{self, TaskRef, TaskState, TaskView, Waiting};
use wire::{Code, RpcError};

/// The largest JSON-RPC body: a message with file parts up to the attachment limit, in base64.
pub const MAX_RPC_BODY: usize = 12 * 1024 * 1024;
/// The most parts one message may have, and files among them.
const MAX_PARTS: usize = 32;
const MAX_FILES: usize = 4;
/// The most text one message may carry (the REST API's limit for a message).
const MAX_TEXT: usize = 64 * 1024;
/// How long a blocking `SendMessage` waits for its task to settle before answering with the
/// task as it is (the client then follows it with `GetTask` or `SubscribeToTask`).
const BLOCKING_LIMIT: Duration = Duration::from_secs(300);
/// How long `CancelTask` waits for the turn to end.
const CANCEL_LIMIT: Duration = Duration::from_secs(30);
/// How long links to files out work.
const LINK_TTL_S: u64 = 3600;
/// The most files a task shows (in and out).
const MAX_LINKS: usize = 32;

/// The agent an endpoint serves.
#[derive(Debug, Clone)]
struct Target {
    app: AppId,
    agent: AgentId,
    view: AgentView,
}

impl Edge {
    /// The agent at `/a2a/{app}/{agent}`, if this deployment hosts it for the caller's tenant.
    fn a2a_target(&self, caller: &Principal, app: &str, agent: &str) -> Option<Target> {
        let found = self
            .apps_for(&caller.tenant)
            .into_iter()
            .find(|a| a.id == app)?;
        let view = found.agents.into_iter().find(|a| a.id == agent)?;
        Some(Target {
            app: app.parse().ok()?,
            agent: agent.parse().ok()?,
            view,
        })
    }
}

/// Where this deployment is reached, as the request says (`X-Forwarded-Proto` and `Host`).
fn base_url(headers: &HeaderMap) -> String {
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".-:[]".contains(c))
        })
        .unwrap_or("localhost");
    let scheme = match headers
        .get("x-forwarded-proto")
        .and_then(|h| h.to_str().ok())
    {
        Some("https") => "https",
        _ => "http",
    };
    format!("{scheme}://{host}")
}

/// The agent's card.
fn card(base: &str, target: &Target) -> Value {
    let view = &target.view;
    let description = if view.description.is_empty() {
        format!("The {} agent of the {} app.", target.agent, target.app)
    } else {
        view.description.clone()
    };
    let skills: Vec<Value> = if view.skills.is_empty() {
        vec![json!({
            "id": target.agent.as_str(),
            "name": target.agent.as_str(),
            "description": description,
            "tags": ["conversation"],
        })]
    } else {
        view.skills
            .iter()
            .map(|s| {
                json!({"id": s.id, "name": s.name, "description": s.description,
                       "tags": s.tags, "examples": s.examples})
            })
            .collect()
    };
    json!({
        "name": format!("{}/{}", target.app, target.agent),
        "description": description,
        "supportedInterfaces": [{
            "url": format!("{base}/a2a/{}/{}", target.app, target.agent),
            "protocolBinding": "JSONRPC",
            "protocolVersion": wire::PROTOCOL_VERSION,
        }],
        "provider": {"organization": "Turnpike", "url": base},
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": {"streaming": true, "pushNotifications": true},
        "securitySchemes": {"bearer": {"httpAuthSecurityScheme": {
            "scheme": "Bearer",
            "bearerFormat": "the deployment's API token or JWT",
        }}},
        "securityRequirements": [{"schemes": {"bearer": {"list": []}}}],
        "defaultInputModes": ["text/plain", "application/json", "image/png", "image/jpeg",
                              "image/gif", "image/webp", "application/pdf"],
        "defaultOutputModes": ["text/plain"],
        "skills": skills,
    })
}

/// An agent's A2A card.
#[utoipa::path(get, path = "/a2a/{app}/{agent}/.well-known/agent-card.json", tag = "a2a",
    params(("app" = String, Path), ("agent" = String, Path)),
    responses((status = 200, description = "the agent's A2A card (protocol 1.0)", body = Object),
              (status = 404, body = crate::error::ErrorBody)))]
pub async fn agent_card(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path((app, agent)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    let target = edge
        .a2a_target(&caller, &app, &agent)
        .ok_or_else(|| ApiError::not_found(format!("no agent {app}/{agent} is hosted here")))?;
    Ok(Json(card(&base_url(&headers), &target)))
}

/// The cards of every agent the caller's tenant may use.
#[utoipa::path(get, path = "/v1/agent-cards", tag = "a2a",
    responses((status = 200, description = "`{\"cards\": [AgentCard…]}`", body = Object)))]
pub async fn agent_cards(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    headers: HeaderMap,
) -> Json<Value> {
    let base = base_url(&headers);
    let cards: Vec<Value> = edge
        .apps_for(&caller.tenant)
        .into_iter()
        .flat_map(|app| {
            let id = app.id.clone();
            app.agents.into_iter().filter_map(move |view| {
                Some(Target {
                    app: id.parse().ok()?,
                    agent: view.id.parse().ok()?,
                    view,
                })
            })
        })
        .map(|t| card(&base, &t))
        .collect();
    Json(json!({ "cards": cards }))
}

/// A JSON-RPC request, checked.
struct Call {
    id: Value,
    method: String,
    params: Value,
}

fn parse_call(body: &[u8]) -> Result<Call, (Value, RpcError)> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        (
            Value::Null,
            RpcError::new(Code::Parse, format!("the body is not JSON: {e}")),
        )
    })?;
    let Value::Object(mut object) = value else {
        return Err((
            Value::Null,
            RpcError::new(
                Code::InvalidRequest,
                "a request is one JSON-RPC object (batches are not served)",
            ),
        ));
    };
    let id = match object.remove("id") {
        Some(id @ (Value::String(_) | Value::Number(_))) => id,
        Some(Value::Null) | None => {
            return Err((
                Value::Null,
                RpcError::new(
                    Code::InvalidRequest,
                    "a request needs an id (notifications are not served)",
                ),
            ))
        }
        Some(_) => {
            return Err((
                Value::Null,
                RpcError::new(Code::InvalidRequest, "the id is a string or a number"),
            ))
        }
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err((
            id,
            RpcError::new(Code::InvalidRequest, "jsonrpc must be \"2.0\""),
        ));
    }
    let Some(Value::String(method)) = object.remove("method") else {
        return Err((
            id,
            RpcError::new(Code::InvalidRequest, "the method is a string"),
        ));
    };
    let params = match object.remove("params") {
        None | Some(Value::Null) => json!({}),
        Some(p @ Value::Object(_)) => p,
        Some(_) => return Err((id, RpcError::params("params is an object"))),
    };
    Ok(Call { id, method, params })
}

fn rpc_json(id: &Value, result: Result<Value, RpcError>) -> Response {
    if let Err(e) = &result {
        metrics::counter!("turnpike_a2a_errors_total", "code" => (e.code as i32).to_string())
            .increment(1);
    }
    Json(wire::response(id, result)).into_response()
}

/// The agent's JSON-RPC endpoint: `SendMessage`, `SendStreamingMessage`, `GetTask`,
/// `CancelTask`, `SubscribeToTask`.
#[utoipa::path(post, path = "/a2a/{app}/{agent}", tag = "a2a",
    params(("app" = String, Path), ("agent" = String, Path)),
    request_body(content = Object, description = "a JSON-RPC 2.0 request (A2A 1.0 methods)"),
    responses((status = 200, description = "a JSON-RPC response, or (streaming methods) an event stream of them", body = Object),
              (status = 404, body = crate::error::ErrorBody)))]
pub async fn rpc(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path((app, agent)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let target = edge
        .a2a_target(&caller, &app, &agent)
        .ok_or_else(|| ApiError::not_found(format!("no agent {app}/{agent} is hosted here")))?;
    let call = match parse_call(&body) {
        Ok(call) => call,
        Err((id, e)) => return Ok(rpc_json(&id, Err(e))),
    };
    let base = base_url(&headers);
    let a2a = A2a {
        edge: &edge,
        caller: &caller,
        target: &target,
        base: &base,
    };
    metrics::counter!("turnpike_a2a_calls_total", "method" => method_label(&call.method))
        .increment(1);
    let id = call.id;
    let result = match call.method.as_str() {
        "SendMessage" => a2a.send_message(&call.params).await,
        "GetTask" => a2a.get_task(&call.params).await,
        "CancelTask" => a2a.cancel_task(&call.params).await,
        "SendStreamingMessage" => {
            return Ok(match a2a.send_streaming(&call.params).await {
                Ok((view, after)) => a2a.stream(id, view, after).await,
                Err(e) => rpc_json(&id, Err(e)),
            })
        }
        "SubscribeToTask" => {
            return Ok(match a2a.subscribe(&call.params).await {
                Ok(view) => a2a.stream(id, view, 0).await,
                Err(e) => rpc_json(&id, Err(e)),
            })
        }
        "CreateTaskPushNotificationConfig" => a2a.create_push(&call.params).await,
        "GetTaskPushNotificationConfig" => a2a.get_push(&call.params).await,
        "ListTaskPushNotificationConfigs" => a2a.list_push(&call.params).await,
        "DeleteTaskPushNotificationConfig" => a2a.delete_push(&call.params).await,
        "ListTasks" | "GetExtendedAgentCard" => Err(RpcError::new(
            Code::Unsupported,
            format!(
                "{} is not served: list conversations with GET /v1/conversations",
                call.method
            ),
        )),
        other => Err(RpcError::new(
            Code::MethodNotFound,
            format!("unknown method {other:?}"),
        )),
    };
    Ok(rpc_json(&id, result))
}

fn method_label(method: &str) -> &'static str {
    match method {
        "SendMessage" => "SendMessage",
        "SendStreamingMessage" => "SendStreamingMessage",
        "GetTask" => "GetTask",
        "CancelTask" => "CancelTask",
        "SubscribeToTask" => "SubscribeToTask",
        _ => "other",
    }
}

/// One call's context.
struct A2a<'a> {
    edge: &'a Edge,
    caller: &'a Principal,
    target: &'a Target,
    base: &'a str,
}

/// What a client's message says, checked.
#[derive(Default)]
struct Incoming {
    message_id: String,
    context: Option<String>,
    task: Option<String>,
    text: String,
    files: Vec<(String, Option<String>, Vec<u8>)>,
    /// A data part's decision on a gated call: approve, the reason, the request.
    decision: Option<(bool, Option<String>, Option<String>)>,
}

fn string_field(v: &Value, name: &str) -> Result<Option<String>, RpcError> {
    match v.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(RpcError::params(format!("{name} is a string"))),
    }
}

fn incoming(params: &Value) -> Result<Incoming, RpcError> {
    let message = params
        .get("message")
        .filter(|m| m.is_object())
        .ok_or_else(|| RpcError::params("params.message is required (an object)"))?;
    let message_id = string_field(message, "messageId")?
        .ok_or_else(|| RpcError::params("message.messageId is required"))?;
    if message_id.len() > 512 {
        return Err(RpcError::params("message.messageId is at most 512 bytes"));
    }
    match message.get("role").and_then(Value::as_str) {
        Some("ROLE_USER") | Some("user") => {}
        _ => {
            return Err(RpcError::params(
                "message.role must be ROLE_USER: an agent's messages are not taken",
            ))
        }
    }
    let parts = message
        .get("parts")
        .and_then(Value::as_array)
        .ok_or_else(|| RpcError::params("message.parts is required (an array)"))?;
    if parts.is_empty() || parts.len() > MAX_PARTS {
        return Err(RpcError::params(format!(
            "a message has 1–{MAX_PARTS} parts, not {}",
            parts.len()
        )));
    }
    let mut incoming = Incoming {
        message_id,
        context: string_field(message, "contextId")?,
        task: string_field(message, "taskId")?,
        ..Default::default()
    };
    let mut texts: Vec<String> = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let filename = string_field(part, "filename").map_err(|e| at(i, e))?;
        let media_type = string_field(part, "mediaType").map_err(|e| at(i, e))?;
        if let Some(text) = part.get("text") {
            let text = text
                .as_str()
                .ok_or_else(|| at(i, RpcError::params("text is a string")))?;
            texts.push(text.to_owned());
        } else if let Some(raw) = part.get("raw") {
            let raw = raw
                .as_str()
                .ok_or_else(|| at(i, RpcError::params("raw is base64 text")))?;
            if incoming.files.len() == MAX_FILES {
                return Err(RpcError::params(format!(
                    "at most {MAX_FILES} files per message"
                )));
            }
            let limit = turnpike_schemas::event::MAX_ATTACHMENT_BYTES as usize;
            if raw.len() > limit / 3 * 4 + 8 {
                return Err(at(
                    i,
                    RpcError::params(format!(
                        "the file is larger than the limit of {limit} bytes"
                    )),
                ));
            }
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(raw)
                .map_err(|e| at(i, RpcError::params(format!("raw is not base64: {e}"))))?;
            incoming.files.push((
                filename.unwrap_or_else(|| format!("file-{}", i + 1)),
                media_type,
                bytes,
            ));
        } else if part.get("url").is_some() {
            return Err(at(
                i,
                RpcError::new(
                    Code::ContentTypeNotSupported,
                    "files by URL are not fetched (this deployment makes no requests for a client): send the bytes as a raw part",
                ),
            ));
        } else if let Some(data) = part.get("data") {
            match data.get("approve") {
                Some(Value::Bool(approve)) => {
                    let reason = string_field(data, "reason").map_err(|e| at(i, e))?;
                    let request = string_field(data, "requestId").map_err(|e| at(i, e))?;
                    incoming.decision = Some((*approve, reason, request));
                }
                Some(_) => return Err(at(i, RpcError::params("data.approve is true or false"))),
                None => texts.push(data.to_string()),
            }
        } else {
            return Err(at(i, RpcError::params("a part has text, raw, url or data")));
        }
    }
    incoming.text = texts.join("\n");
    if incoming.text.len() > MAX_TEXT {
        return Err(RpcError::params(format!(
            "the message's text is {} bytes, more than the limit of {MAX_TEXT}",
            incoming.text.len()
        )));
    }
    Ok(incoming)
}

fn at(i: usize, e: RpcError) -> RpcError {
    RpcError::new(e.code, format!("message.parts[{i}]: {}", e.message))
}

/// The idempotency key of what a message sends (`what` tells its events apart): the same
/// prefix for everything one message id sends, so the task finds the files sent with its
/// message ([`tasks::MESSAGE_KEY_SUFFIX`]).
fn key_of(message_id: &str, what: &str) -> HeaderMap {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(message_id.as_bytes());
    let mut headers = HeaderMap::new();
    headers.insert(
        IDEMPOTENCY_KEY,
        HeaderValue::from_str(&format!("a2a-{}-{what}", &hex::encode(digest)[..40]))
            .expect("hex and a word are a header value"),
    );
    headers
}

/// Links to files for one caller: reference → absolute signed URL, for the references the
/// caller can read now.
struct Links(HashMap<String, String>);

impl wire::Linker for Links {
    fn link(&self, reference: &str) -> Option<String> {
        self.0.get(reference).cloned()
    }
}

/// Shows tasks to one caller: files out as links they can follow.
struct Viewer<'a> {
    edge: &'a Edge,
    caller: &'a Principal,
    base: &'a str,
}

impl Viewer<'_> {
    async fn links(&self, view: &TaskView) -> Links {
        let mut references: Vec<String> = Vec::new();
        for said in &view.history {
            match said {
                tasks::Said::Agent { text, .. } => references.extend(wire::references(text)),
                tasks::Said::File { reference, .. } => references.push(reference.clone()),
                tasks::Said::User { .. } => {}
            }
        }
        references.sort();
        references.dedup();
        references.truncate(MAX_LINKS);
        let resolver = self.edge.inner.resolver.in_tenant(&self.caller.tenant);
        let mut links = HashMap::new();
        for reference in references {
            // Only whether the caller may read it (the conversation's access), not the bytes:
            // the link is checked again, and the file read, when it is followed.
            let Ok(parsed) = reference.parse::<turnpike_schemas::Reference>() else {
                continue;
            };
            if resolver
                .authorize(&self.caller.identity, &parsed)
                .await
                .is_ok()
            {
                let link = self
                    .edge
                    .signed_link(self.caller, reference.clone(), LINK_TTL_S);
                links.insert(reference, format!("{}{}", self.base, link.url));
            }
        }
        Links(links)
    }

    async fn task_json(&self, view: &TaskView, history: Option<usize>) -> Value {
        let links = self.links(view).await;
        wire::task(view, &links, history)
    }
}

impl A2a<'_> {
    fn viewer(&self) -> Viewer<'_> {
        Viewer {
            edge: self.edge,
            caller: self.caller,
            base: self.base,
        }
    }

    async fn task_json(&self, view: &TaskView, history: Option<usize>) -> Value {
        self.viewer().task_json(view, history).await
    }

    /// The conversation of task `id`, if the caller may see it at this endpoint.
    async fn task_entry(&self, id: &str) -> Result<(TaskRef, DirectoryEntry), RpcError> {
        let task: TaskRef = id.parse().map_err(|_| RpcError::task_not_found(id))?;
        let entry = self
            .edge
            .visible(self.caller, &task.conversation.to_string())
            .await
            .map_err(|_| RpcError::task_not_found(id))?;
        if entry.app != self.target.app {
            return Err(RpcError::task_not_found(id));
        }
        Ok((task, entry))
    }

    async fn read(&self, entry: &DirectoryEntry, task: TaskRef) -> Result<TaskView, RpcError> {
        follow::read(self.edge, &self.edge.record(entry), task)
            .await
            .map_err(|e| match e.body.code.as_str() {
                "not_found" => RpcError::task_not_found(&task.to_string()),
                _ => RpcError::from(e),
            })
    }

    /// Takes a message: a new task, a follow-up of a working one, or the answer to a waiting
    /// one. Returns the task, its conversation, and the lane sequence of what continued it (0
    /// for a new task).
    async fn accept(&self, params: &Value) -> Result<(TaskRef, DirectoryEntry, u64), RpcError> {
        let incoming = incoming(params)?;
        if let Some(task_id) = &incoming.task {
            return self.continue_task(task_id, &incoming).await;
        }
        if incoming.text.trim().is_empty() && incoming.decision.is_none() {
            return Err(RpcError::params(
                "the message has no text: a message needs a text (or data) part",
            ));
        }
        let entry = match &incoming.context {
            Some(context) => {
                let entry = self
                    .edge
                    .visible(self.caller, context)
                    .await
                    .map_err(|_| RpcError::params(format!("context {context:?} not found")))?;
                if entry.app != self.target.app {
                    return Err(RpcError::params(format!(
                        "context {context:?} belongs to another app's agent"
                    )));
                }
                entry
            }
            None => {
                let (entry, _) = self
                    .edge
                    .open_conversation(
                        self.caller,
                        self.target.app.clone(),
                        self.target.agent.clone(),
                        None,
                    )
                    .await?;
                entry
            }
        };
        let id = entry.conversation.to_string();
        // Files go ahead of the message (an attachment sent ahead of its message joins its
        // turn) unless a turn runs now: it would take them; behind the message, they join the
        // message's turn instead.
        let running = self
            .edge
            .record(&entry)
            .head()
            .await
            .map_err(ApiError::from)?
            .state()
            .turn_open;
        if !running {
            self.attach_all(&entry, &incoming).await?;
        }
        let text = if incoming.text.trim().is_empty() {
            "(see the data)".to_owned()
        } else {
            incoming.text.clone()
        };
        let (_, Json(accepted)) = self
            .edge
            .submit(
                self.caller,
                &id,
                &key_of(&incoming.message_id, tasks::MESSAGE_KEY_SUFFIX),
                EventBody::Message { text },
            )
            .await?;
        if running {
            self.attach_all(&entry, &incoming).await?;
        }
        Ok((
            TaskRef {
                conversation: entry.conversation,
                seq: accepted.lane_seq,
            },
            entry,
            0,
        ))
    }

    /// Attaches the message's files, each under its own idempotency key.
    async fn attach_all(
        &self,
        entry: &DirectoryEntry,
        incoming: &Incoming,
    ) -> Result<(), RpcError> {
        for (i, (name, media_type, bytes)) in incoming.files.iter().enumerate() {
            self.edge
                .attach(
                    self.caller,
                    entry,
                    &key_of(&incoming.message_id, &format!("file{i}")),
                    name.clone(),
                    media_type.as_deref(),
                    bytes.clone(),
                )
                .await?;
        }
        Ok(())
    }

    async fn continue_task(
        &self,
        task_id: &str,
        incoming: &Incoming,
    ) -> Result<(TaskRef, DirectoryEntry, u64), RpcError> {
        let (task, entry) = self.task_entry(task_id).await?;
        if let Some(context) = &incoming.context {
            if *context != task.conversation.to_string() {
                return Err(RpcError::params(format!(
                    "task {task_id:?} belongs to another context than {context:?}"
                )));
            }
        }
        if !incoming.files.is_empty() {
            return Err(RpcError::params(
                "files go with a new message, not into a running task",
            ));
        }
        let view = self.read(&entry, task).await?;
        let id = entry.conversation.to_string();
        let submit = |what: String, body: EventBody| {
            let headers = key_of(&incoming.message_id, &what);
            let id = id.clone();
            async move {
                self.edge
                    .submit(self.caller, &id, &headers, body)
                    .await
                    .map(|(_, Json(accepted))| accepted.lane_seq)
            }
        };
        match view.state {
            s if s.terminal() => Err(RpcError::new(
                Code::Unsupported,
                format!(
                    "task {task_id} is {} and takes no more messages: send a new message with contextId {}",
                    s.wire(),
                    task.conversation
                ),
            )),
            TaskState::Submitted | TaskState::Working => {
                if incoming.text.trim().is_empty() {
                    return Err(RpcError::params("the message has no text"));
                }
                let seq = submit(
                    "follow-up".to_owned(),
                    EventBody::FollowUp {
                        text: incoming.text.clone(),
                    },
                )
                .await?;
                Ok((task, entry, seq))
            }
            _ => match self.answer(&view, incoming, submit).await? {
                Some(seq) => Ok((task, entry, seq)),
                None => Err(RpcError::params(
                    "the task waits for an answer this message does not give (see its status message)",
                )),
            },
        }
    }

    /// Answers what a waiting task waits for: the lane sequence of the last answer, `None` if
    /// the message answers nothing.
    async fn answer<F, Fut>(
        &self,
        view: &TaskView,
        incoming: &Incoming,
        submit: F,
    ) -> Result<Option<u64>, RpcError>
    where
        F: Fn(String, EventBody) -> Fut,
        Fut: std::future::Future<Output = ApiResult<u64>>,
    {
        let text = incoming.text.trim();
        let decision = incoming.decision.clone().or_else(|| {
            let lower = text.to_ascii_lowercase();
            let (word, rest) = lower
                .split_once(':')
                .map_or((lower.as_str(), None), |(w, r)| (w, Some(r)));
            let reason = rest
                .and_then(|_| text.split_once(':').map(|(_, r)| r.trim().to_owned()))
                .filter(|r| !r.is_empty());
            match word.trim() {
                "approve" | "approved" | "yes" | "y" | "ok" => Some((true, None, None)),
                "reject" | "rejected" | "deny" | "no" | "n" => Some((false, reason, None)),
                _ => None,
            }
        });
        let mut answered: Option<u64> = None;
        for (i, waiting) in view.waiting.iter().enumerate() {
            let what = format!("answer{i}");
            match waiting {
                Waiting::Question { request, .. } if !text.is_empty() && answered.is_none() => {
                    let seq = submit(
                        what,
                        EventBody::QuestionResponse {
                            request_id: *request,
                            answer: incoming.text.clone(),
                        },
                    )
                    .await?;
                    answered = Some(seq);
                }
                Waiting::Approval { request, .. } => {
                    let Some((approve, reason, only)) = &decision else {
                        continue;
                    };
                    if only.as_ref().is_some_and(|r| *r != request.to_string()) {
                        continue;
                    }
                    let seq = submit(
                        what,
                        EventBody::ApprovalResponse {
                            request_id: *request,
                            approve: *approve,
                            reason: reason.clone(),
                            tool: None,
                            arguments: None,
                        },
                    )
                    .await?;
                    answered = Some(answered.map_or(seq, |a| a.max(seq)));
                }
                _ => {}
            }
        }
        Ok(answered)
    }

    /// The push config given with a message (`configuration.taskPushNotificationConfig`),
    /// checked before the message is sent.
    fn push_given(params: &Value) -> Result<Option<push::Parsed>, RpcError> {
        match params
            .get("configuration")
            .and_then(|c| c.get("taskPushNotificationConfig"))
        {
            None | Some(Value::Null) => Ok(None),
            Some(config) => push::parse(config).map(Some),
        }
    }

    async fn create_push(&self, params: &Value) -> Result<Value, RpcError> {
        let id = string_field(params, "taskId")?
            .ok_or_else(|| RpcError::params("taskId is required"))?;
        let config = push::parse(params)?;
        let (task, entry) = self.task_entry(&id).await?;
        push::create(self.edge, self.caller, task, &entry, config).await
    }

    async fn get_push(&self, params: &Value) -> Result<Value, RpcError> {
        let (task, id) = self.push_ids(params).await?;
        push::get(self.edge, self.caller, task, &id).await
    }

    async fn list_push(&self, params: &Value) -> Result<Value, RpcError> {
        let id = string_field(params, "taskId")?
            .ok_or_else(|| RpcError::params("taskId is required"))?;
        let (task, _) = self.task_entry(&id).await?;
        push::list(self.edge, self.caller, task).await
    }

    async fn delete_push(&self, params: &Value) -> Result<Value, RpcError> {
        let (task, id) = self.push_ids(params).await?;
        push::delete(self.edge, self.caller, task, &id).await
    }

    /// A push config's task (visible to the caller here) and id.
    async fn push_ids(&self, params: &Value) -> Result<(TaskRef, String), RpcError> {
        let task = string_field(params, "taskId")?
            .ok_or_else(|| RpcError::params("taskId is required"))?;
        let id = string_field(params, "id")?.ok_or_else(|| RpcError::params("id is required"))?;
        let (task, _) = self.task_entry(&task).await?;
        Ok((task, id))
    }

    async fn send_message(&self, params: &Value) -> Result<Value, RpcError> {
        let push = Self::push_given(params)?;
        let (task, entry, after) = self.accept(params).await?;
        if let Some(config) = push {
            push::create(self.edge, self.caller, task, &entry, config).await?;
        }
        let configuration = params.get("configuration");
        let immediately = configuration
            .and_then(|c| c.get("returnImmediately"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let history = history_length(configuration)?;
        let record = self.edge.record(&entry);
        let view = if immediately {
            follow::read(self.edge, &record, task).await?
        } else {
            follow::settle(self.edge, record, task, after, BLOCKING_LIMIT).await?
        };
        Ok(json!({ "task": self.task_json(&view, history).await }))
    }

    async fn get_task(&self, params: &Value) -> Result<Value, RpcError> {
        let id = string_field(params, "id")?.ok_or_else(|| RpcError::params("id is required"))?;
        let history = history_length(Some(params))?;
        let (task, entry) = self.task_entry(&id).await?;
        let view = self.read(&entry, task).await?;
        Ok(self.task_json(&view, history).await)
    }

    async fn cancel_task(&self, params: &Value) -> Result<Value, RpcError> {
        let id = string_field(params, "id")?.ok_or_else(|| RpcError::params("id is required"))?;
        let (task, entry) = self.task_entry(&id).await?;
        let view = self.read(&entry, task).await?;
        if view.state.terminal() {
            return Err(RpcError::new(
                Code::TaskNotCancelable,
                format!("task {id} is {} already", view.state.wire()),
            ));
        }
        if view.state.interrupted() {
            // A stop does not take back a pending approval (a person could still grant it):
            // the task ends by its answer.
            return Err(RpcError::new(
                Code::TaskNotCancelable,
                format!(
                    "task {id} waits for input: answer it (\"reject\" for a gated call) to end it"
                ),
            ));
        }
        let (_, Json(stopped)) = self
            .edge
            .submit(
                self.caller,
                &entry.conversation.to_string(),
                &key_of(&id, "cancel"),
                EventBody::Stop {
                    reason: Some("cancelled over A2A".into()),
                },
            )
            .await?;
        let record = self.edge.record(&entry);
        let mut updates = follow::follow(self.edge, record, task, stopped.lane_seq).await?;
        let deadline = tokio::time::Instant::now() + CANCEL_LIMIT;
        let mut last = view;
        while let Ok(Some(update)) = tokio::time::timeout_at(deadline, updates.next()).await {
            if let Update::Task(now) = update {
                let over = now.state.terminal();
                last = now;
                if over {
                    break;
                }
            }
        }
        Ok(self.task_json(&last, None).await)
    }

    /// Takes the message; the task, and the lane sequence of what continued it (0: a new task,
    /// whose stream starts with the task; a continued one's with a status update).
    async fn send_streaming(&self, params: &Value) -> Result<(TaskView, u64), RpcError> {
        let push = Self::push_given(params)?;
        let (task, entry, after) = self.accept(params).await?;
        if let Some(config) = push {
            push::create(self.edge, self.caller, task, &entry, config).await?;
        }
        let view = follow::read(self.edge, &self.edge.record(&entry), task).await?;
        Ok((view, after))
    }

    async fn subscribe(&self, params: &Value) -> Result<TaskView, RpcError> {
        let id = string_field(params, "id")?.ok_or_else(|| RpcError::params("id is required"))?;
        let (task, entry) = self.task_entry(&id).await?;
        let view = self.read(&entry, task).await?;
        if view.state.terminal() {
            return Err(RpcError::new(
                Code::Unsupported,
                format!(
                    "task {id} is {} already: nothing more will happen to it (GetTask reads it)",
                    view.state.wire()
                ),
            ));
        }
        Ok(view)
    }

    /// The task's events as server-sent events, each a JSON-RPC response to `id`: the task
    /// first (or, for a task continued at lane sequence `after`, a status update once the record
    /// has taken it), then streamed text as appends to the
    /// `reply` artifact, the whole reply as it is committed, status updates, and the end once
    /// the task is settled.
    async fn stream(&self, id: Value, view: TaskView, after: u64) -> Response {
        let record = match self
            .edge
            .visible(self.caller, &view.task.conversation.to_string())
            .await
        {
            Ok(entry) => self.edge.record(&entry),
            Err(e) => return rpc_json(&id, Err(e.into())),
        };
        let updates = match follow::follow(self.edge, record, view.task, after).await {
            Ok(u) => u,
            Err(e) => return rpc_json(&id, Err(e.into())),
        };
        let this = Streamer {
            edge: self.edge.clone(),
            caller: self.caller.clone(),
            base: self.base.to_owned(),
            id,
            first: true,
            task_first: after == 0,
            sent_reply: String::new(),
            streamed: false,
            last: view,
            files: None,
        };
        let events = futures::stream::unfold(
            (updates, this, Vec::<Value>::new().into_iter()),
            |(mut updates, mut this, mut queue)| async move {
                loop {
                    if let Some(event) = queue.next() {
                        let data = wire::response(&this.id, Ok(event)).to_string();
                        let sse: Result<SseEvent, Infallible> = Ok(SseEvent::default().data(data));
                        return Some((sse, (updates, this, queue)));
                    }
                    let update = updates.next().await?;
                    queue = this.events(update).await.into_iter();
                }
            },
        );
        // A router shutting down ends its streams after the drain grace, as it does WebSockets:
        // the client subscribes again (to another router) and misses nothing.
        let mut draining = self.edge.inner.draining.subscribe();
        let grace = self.edge.inner.limits.drain_grace;
        let events = events.take_until(async move {
            if draining.wait_for(|d| *d).await.is_err() {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(grace).await;
        });
        // The official client gives up after 5 s without a byte: a comment every 2 s.
        Sse::new(events)
            .keep_alive(KeepAlive::new().interval(Duration::from_secs(2)))
            .into_response()
    }
}

fn history_length(holder: Option<&Value>) -> Result<Option<usize>, RpcError> {
    match holder.and_then(|c| c.get("historyLength")) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(n as usize))
            .ok_or_else(|| RpcError::params("historyLength is a whole number")),
    }
}

/// Turns a task's updates into A2A stream events.
struct Streamer {
    edge: Edge,
    caller: Principal,
    base: String,
    id: Value,
    first: bool,
    task_first: bool,
    /// The reply text the client holds now (committed, or committed and streamed).
    sent_reply: String,
    /// Whether streamed text was appended since the last committed reply.
    streamed: bool,
    last: TaskView,
    files: Option<Value>,
}

impl Streamer {
    async fn events(&mut self, update: Update) -> Vec<Value> {
        let a2a = Viewer {
            edge: &self.edge,
            caller: &self.caller,
            base: &self.base,
        };
        let mut events = Vec::new();
        match update {
            Update::Text(text) => {
                let append = !self.sent_reply.is_empty() || self.streamed;
                let chunk = if append && !self.streamed {
                    format!("\n\n{text}")
                } else {
                    text
                };
                self.streamed = true;
                events.push(wire::reply_update(&self.last, &chunk, append, false));
            }
            Update::Task(view) => {
                if std::mem::take(&mut self.first) {
                    self.sent_reply = view.replies().collect::<Vec<_>>().join("\n\n");
                    if self.task_first {
                        events.push(json!({ "task": a2a.task_json(&view, None).await }));
                    } else {
                        events.push(wire::status_update(&view));
                    }
                } else {
                    let reply = view.replies().collect::<Vec<_>>().join("\n\n");
                    if reply != self.sent_reply || (self.streamed && view.state.terminal()) {
                        events.push(wire::reply_update(
                            &view,
                            &reply,
                            false,
                            follow::settled(view.state),
                        ));
                        self.sent_reply = reply;
                        self.streamed = false;
                    }
                    let links = a2a.links(&view).await;
                    if let Some(files) = wire::files_artifact(&view, &links) {
                        if self.files.as_ref() != Some(&files) {
                            events.push(wire::files_update(&view, files.clone()));
                            self.files = Some(files);
                        }
                    }
                    if view.state != self.last.state || view.waiting != self.last.waiting {
                        events.push(wire::status_update(&view));
                    }
                }
                self.last = view;
            }
        }
        events
    }
}
