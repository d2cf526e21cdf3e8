//! The deployment as an MCP server (streamable HTTP at `/mcp`), so that an assistant in an IDE
//! or on a desktop can use the hosted agents and the search API as tools.
//!
//! # Contract
//! - One endpoint, `POST /mcp`, one JSON-RPC request per POST, answered with one JSON body
//!   (never a stream); notifications are `202` with no body. The server is stateless: no
//!   session id is issued, so clients open no listening stream (`GET` and `DELETE` are `405`).
//! - The same authentication and limits as the REST API: every request carries the caller's
//!   bearer token, and every tool acts as that caller — what the caller may not see through the
//!   API, no tool shows.
//! - Protocol versions `2024-11-05`, `2025-03-26`, `2025-06-18` and `2025-11-25`: the client's
//!   is echoed when it is one of them, else `2025-06-18`.
//! - JSON-RPC errors are sent with HTTP 200 (unknown method `-32601`; an unknown tool or
//!   arguments that do not fit `-32602`); a tool that fails answers a result with `isError`
//!   and the reason as text.
//! - Tools: `list_agents`, `list_conversations`, `search`, `send_message` (starts a
//!   conversation or continues one, and waits for the turn's reply), `read_conversation`.

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use turnpike_schemas::EventBody;

use crate::a2a::follow;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::{Caller, Params};
use crate::model::{ListConversations, ListRows, SearchQuery};
use crate::state::Edge;
use turnpike_artifactory::tasks::TaskRef;

/// The versions served, oldest first.
const VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
/// The version answered to a client asking for one not served.
const FALLBACK_VERSION: &str = "2025-06-18";
/// How long `send_message` waits for the reply by default, and at most.
const DEFAULT_WAIT_S: u64 = 120;
const MAX_WAIT_S: u64 = 600;

fn error(id: &Value, code: i32, message: impl Into<String>) -> Response {
    metrics::counter!("turnpike_mcp_errors_total", "code" => code.to_string()).increment(1);
    Json(json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}}))
        .into_response()
}

fn result(id: &Value, result: Value) -> Response {
    Json(json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response()
}

/// One JSON-RPC message from an MCP client.
#[utoipa::path(post, path = "/mcp", tag = "mcp",
    request_body(content = Object, description = "a JSON-RPC 2.0 message (MCP, streamable HTTP)"),
    responses((status = 200, description = "the JSON-RPC response", body = Object),
              (status = 202, description = "a notification, taken")))]
pub async fn endpoint(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    body: axum::body::Bytes,
) -> Response {
    let message: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(&Value::Null, -32700, format!("the body is not JSON: {e}")),
    };
    let Value::Object(message) = message else {
        return error(
            &Value::Null,
            -32600,
            "one JSON-RPC object per request (batches are not served)",
        );
    };
    let id = match message.get("id") {
        // A notification, or a response to something we never asked: taken, nothing to say.
        None => return StatusCode::ACCEPTED.into_response(),
        Some(id @ (Value::String(_) | Value::Number(_))) => id.clone(),
        Some(_) => return error(&Value::Null, -32600, "the id is a string or a number"),
    };
    let Some(method) = message.get("method").and_then(Value::as_str) else {
        // A response from the client (to a request this server never sends).
        return StatusCode::ACCEPTED.into_response();
    };
    let params = match message.get("params") {
        None | Some(Value::Null) => json!({}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => return error(&id, -32602, "params is an object"),
    };
    metrics::counter!("turnpike_mcp_calls_total", "method" => method_label(method)).increment(1);
    match method {
        "initialize" => {
            let asked = params
                .get("protocolVersion")
                .and_then(Value::as_str)
                .unwrap_or("");
            let version = VERSIONS
                .iter()
                .find(|v| **v == asked)
                .copied()
                .unwrap_or(FALLBACK_VERSION);
            result(
                &id,
                json!({
                    "protocolVersion": version,
                    "capabilities": {"tools": {"listChanged": false}},
                    "serverInfo": {"name": "turnpike", "version": env!("CARGO_PKG_VERSION")},
                    "instructions": "Turnpike: the agents this deployment hosts and your conversations with them. list_agents shows whom you can talk to; send_message talks to one and returns its reply; search finds what was said in your conversations; list_conversations and read_conversation read them.",
                }),
            )
        }
        "ping" => result(&id, json!({})),
        "tools/list" => result(&id, json!({ "tools": tools() })),
        "tools/call" => {
            let Some(name) = params.get("name").and_then(Value::as_str) else {
                return error(&id, -32602, "tools/call needs a tool name");
            };
            let arguments = match params.get("arguments") {
                None | Some(Value::Null) => json!({}),
                Some(a @ Value::Object(_)) => a.clone(),
                Some(_) => return error(&id, -32602, "arguments is an object"),
            };
            match call(&edge, &caller, name, &arguments).await {
                Ok(Ok((text, structured))) => result(
                    &id,
                    json!({"content": [{"type": "text", "text": text}], "structuredContent": structured, "isError": false}),
                ),
                Ok(Err(e)) => result(
                    &id,
                    json!({"content": [{"type": "text", "text": format!("{}: {}", e.body.code, e.body.message)}], "isError": true}),
                ),
                Err(message) => error(&id, -32602, message),
            }
        }
        other => error(&id, -32601, format!("Method not found: {other}")),
    }
}

fn method_label(method: &str) -> &'static str {
    match method {
        "initialize" => "initialize",
        "tools/list" => "tools/list",
        "tools/call" => "tools/call",
        "ping" => "ping",
        _ => "other",
    }
}

/// The tools, with their argument schemas.
fn tools() -> Value {
    let conversation = json!({"type": "string", "pattern": "^conv_[0-7][0-9A-HJKMNP-TV-Z]{25}$", "description": "a conversation id (conv_…)"});
    json!([
        {
            "name": "list_agents",
            "title": "List agents",
            "description": "The agents you can talk to: each app's agents, with what they are for and their A2A card URL.",
            "inputSchema": {"type": "object", "properties": {}, "additionalProperties": false},
            "annotations": {"readOnlyHint": true},
        },
        {
            "name": "list_conversations",
            "title": "List conversations",
            "description": "Your conversations, newest first.",
            "inputSchema": {"type": "object", "properties": {
                "limit": {"type": "integer", "minimum": 1, "maximum": 100, "description": "at most this many (default 20)"},
                "before": {"type": "string", "description": "only conversations older than this id (paging)"},
            }, "additionalProperties": false},
            "annotations": {"readOnlyHint": true},
        },
        {
            "name": "search",
            "title": "Search conversations",
            "description": "Searches everything said in your conversations, by meaning and by words (hybrid search).",
            "inputSchema": {"type": "object", "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": 1024},
                "mode": {"type": "string", "enum": ["hybrid", "lexical", "vector"]},
                "conversation": conversation,
                "limit": {"type": "integer", "minimum": 1, "maximum": 100},
            }, "required": ["query"], "additionalProperties": false},
            "annotations": {"readOnlyHint": true},
        },
        {
            "name": "send_message",
            "title": "Send a message",
            "description": "Sends a message to an agent and returns its reply: in an existing conversation, or a new one with the named app and agent. Waits for the turn to end (or to ask for an approval or an answer).",
            "inputSchema": {"type": "object", "properties": {
                "text": {"type": "string", "minLength": 1, "maxLength": 65536},
                "conversation": conversation,
                "app": {"type": "string", "description": "for a new conversation: the app (see list_agents)"},
                "agent": {"type": "string", "description": "for a new conversation: the agent"},
                "wait_seconds": {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_S, "description": "how long to wait for the reply (default 120; 0: do not wait)"},
            }, "required": ["text"], "additionalProperties": false},
        },
        {
            "name": "read_conversation",
            "title": "Read a conversation",
            "description": "The committed rows of a conversation (messages, replies, tool calls, approvals), from a cursor.",
            "inputSchema": {"type": "object", "properties": {
                "conversation": conversation,
                "after": {"type": "integer", "minimum": 0, "description": "rows after this seq (default 0: from the start)"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 500},
            }, "required": ["conversation"], "additionalProperties": false},
            "annotations": {"readOnlyHint": true},
        },
    ])
}

/// Arguments that do not fit the tool's schema: `Err` (a protocol error).
type Args<T> = Result<T, String>;

fn text_arg(args: &Value, name: &str, required: bool) -> Args<Option<String>> {
    match args.get(name) {
        None | Some(Value::Null) if !required => Ok(None),
        None | Some(Value::Null) => Err(format!("{name} is required")),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{name} is a string")),
    }
}

fn number_arg(args: &Value, name: &str) -> Args<Option<u64>> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("{name} is a whole number")),
    }
}

fn only(args: &Value, known: &[&str]) -> Args<()> {
    let Value::Object(map) = args else {
        return Ok(());
    };
    match map.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(format!(
            "unknown argument {k:?} (known: {})",
            known.join(", ")
        )),
        None => Ok(()),
    }
}

fn to_u32(n: Option<u64>) -> Option<u32> {
    n.map(|n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// Runs tool `name`: `Err` when the call does not fit the tool, else the tool's own outcome.
async fn call(
    edge: &Edge,
    caller: &Principal,
    name: &str,
    args: &Value,
) -> Args<Result<(String, Value), ApiError>> {
    let as_caller = || Caller(caller.clone());
    Ok(match name {
        "list_agents" => {
            only(args, &[])?;
            let agents: Vec<Value> = edge
                .apps_for(&caller.tenant)
                .into_iter()
                .flat_map(|app| {
                    let id = app.id.clone();
                    app.agents.into_iter().map(move |a| {
                        json!({"app": id, "agent": a.id, "description": a.description,
                               "card": format!("/a2a/{id}/{}/.well-known/agent-card.json", a.id)})
                    })
                })
                .collect();
            let text = agents
                .iter()
                .map(|a| {
                    format!(
                        "{}/{}{}",
                        a["app"].as_str().unwrap_or_default(),
                        a["agent"].as_str().unwrap_or_default(),
                        match a["description"].as_str() {
                            Some(d) if !d.is_empty() => format!(": {d}"),
                            _ => String::new(),
                        }
                    )
                })
                .collect::<Vec<_>>()
                .join("\n");
            Ok((text, json!({ "agents": agents })))
        }
        "list_conversations" => {
            only(args, &["limit", "before"])?;
            let query = ListConversations {
                before: text_arg(args, "before", false)?,
                limit: to_u32(number_arg(args, "limit")?),
            };
            crate::conversations::list(State(edge.clone()), as_caller(), Params(query))
                .await
                .map(|Json(list)| {
                    let text = list
                        .conversations
                        .iter()
                        .map(|c| {
                            format!(
                                "{} — {}/{} — {} message(s), {:?}",
                                c.id, c.app, c.agent, c.messages, c.status
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("\n");
                    (text, serde_json::to_value(&list).unwrap_or_default())
                })
        }
        "search" => {
            only(args, &["query", "mode", "conversation", "limit"])?;
            let query = SearchQuery {
                q: text_arg(args, "query", true)?.unwrap_or_default(),
                mode: text_arg(args, "mode", false)?,
                app: None,
                agent: None,
                conversation: text_arg(args, "conversation", false)?,
                kinds: None,
                limit: to_u32(number_arg(args, "limit")?),
                offset: None,
            };
            crate::services::search(State(edge.clone()), as_caller(), Params(query))
                .await
                .map(|Json(found)| {
                    let value = serde_json::to_value(&found).unwrap_or_default();
                    let text = value["hits"]
                        .as_array()
                        .map(|hits| {
                            hits.iter()
                                .map(|h| {
                                    format!(
                                        "[{}] {}",
                                        h["conversation"].as_str().unwrap_or_default(),
                                        h["text"].as_str().unwrap_or_default()
                                    )
                                })
                                .collect::<Vec<_>>()
                                .join("\n")
                        })
                        .unwrap_or_default();
                    (text, value)
                })
        }
        "read_conversation" => {
            only(args, &["conversation", "after", "limit"])?;
            let id = text_arg(args, "conversation", true)?.unwrap_or_default();
            let query = ListRows {
                after: number_arg(args, "after")?,
                before: None,
                limit: to_u32(number_arg(args, "limit")?),
            };
            crate::events::list_rows(
                State(edge.clone()),
                as_caller(),
                axum::extract::Path(id),
                Params(query),
            )
            .await
            .map(|Json(page)| {
                let text = page
                    .rows
                    .iter()
                    .filter_map(|r| {
                        r.text
                            .as_ref()
                            .map(|t| format!("{} {}: {t}", r.seq, r.kind))
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                (text, serde_json::to_value(&page).unwrap_or_default())
            })
        }
        "send_message" => {
            only(
                args,
                &["text", "conversation", "app", "agent", "wait_seconds"],
            )?;
            let text = text_arg(args, "text", true)?.unwrap_or_default();
            let wait = number_arg(args, "wait_seconds")?.unwrap_or(DEFAULT_WAIT_S);
            if wait > MAX_WAIT_S {
                return Err(format!("wait_seconds is at most {MAX_WAIT_S}"));
            }
            let target = match text_arg(args, "conversation", false)? {
                Some(id) => Target::Existing(id),
                None => match (
                    text_arg(args, "app", false)?,
                    text_arg(args, "agent", false)?,
                ) {
                    (Some(app), Some(agent)) => Target::New(app, agent),
                    _ => {
                        return Err(
                            "name a conversation, or an app and an agent for a new one".into()
                        )
                    }
                },
            };
            send(edge, caller, target, text, Duration::from_secs(wait)).await
        }
        other => return Err(format!("Unknown tool: {other}")),
    })
}

enum Target {
    Existing(String),
    New(String, String),
}

/// Sends `text` and waits up to `wait` for the turn to settle.
async fn send(
    edge: &Edge,
    caller: &Principal,
    target: Target,
    text: String,
    wait: Duration,
) -> Result<(String, Value), ApiError> {
    if crate::model::blank(&text) {
        return Err(ApiError::invalid("the text is empty (only spaces)"));
    }
    let entry = match target {
        Target::Existing(id) => edge.visible(caller, &id).await?,
        Target::New(app, agent) => {
            let app = app
                .parse()
                .map_err(|e| ApiError::invalid(format!("app: {e}")))?;
            let agent = agent
                .parse()
                .map_err(|e| ApiError::invalid(format!("agent: {e}")))?;
            edge.check_agent(&caller.tenant, &app, &agent)?;
            edge.open_conversation(caller, app, agent, None).await?.0
        }
    };
    let (_, Json(accepted)) = edge
        .submit(
            caller,
            &entry.conversation.to_string(),
            &HeaderMap::new(),
            EventBody::Message { text },
        )
        .await?;
    let task = TaskRef {
        conversation: entry.conversation,
        seq: accepted.lane_seq,
    };
    let record = edge.record(&entry);
    let view = if wait.is_zero() {
        follow::read(edge, &record, task).await?
    } else {
        follow::settle(edge, record, task, 0, wait).await?
    };
    let reply = view.replies().collect::<Vec<_>>().join("\n\n");
    let state = view
        .state
        .wire()
        .trim_start_matches("TASK_STATE_")
        .to_ascii_lowercase()
        .replace('_', "-");
    let waiting: Vec<Value> = view
        .waiting
        .iter()
        .map(|w| match w {
            turnpike_artifactory::tasks::Waiting::Approval {
                request,
                tool,
                arguments,
                connection,
            } => json!({"kind": "approval", "request_id": request.to_string(), "tool": tool,
                        "arguments": arguments, "connection": connection}),
            turnpike_artifactory::tasks::Waiting::Question { request, question } => {
                json!({"kind": "question", "request_id": request.to_string(), "question": question})
            }
        })
        .collect();
    let text = match (reply.is_empty(), view.state.terminal()) {
        (false, _) => reply.clone(),
        (true, true) => format!(
            "The turn ended {state}{}",
            view.reason
                .as_ref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ),
        (true, false) => format!(
            "The turn is {state}; read the reply later with read_conversation ({}).",
            entry.conversation
        ),
    };
    Ok((
        text,
        json!({
            "conversation": entry.conversation.to_string(),
            "task": task.to_string(),
            "state": state,
            "reply": reply,
            "waiting": waiting,
        }),
    ))
}
