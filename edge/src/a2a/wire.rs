//! A2A (protocol 1.0) on the wire: JSON-RPC envelopes and errors, and tasks, messages, parts and
//! stream events as JSON, built from a [`TaskView`].

use serde_json::{json, Value};

use turnpike_artifactory::tasks::{Said, TaskView, Waiting};

/// The protocol version served.
pub const PROTOCOL_VERSION: &str = "1.0";

/// JSON-RPC and A2A error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Parse = -32700,
    InvalidRequest = -32600,
    MethodNotFound = -32601,
    InvalidParams = -32602,
    Internal = -32603,
    TaskNotFound = -32001,
    TaskNotCancelable = -32002,
    PushNotSupported = -32003,
    Unsupported = -32004,
    ContentTypeNotSupported = -32005,
}

impl Code {
    /// The `reason` A2A puts in an error's `ErrorInfo`.
    fn reason(self) -> &'static str {
        match self {
            Code::Parse => "PARSE_ERROR",
            Code::InvalidRequest => "INVALID_REQUEST",
            Code::MethodNotFound => "METHOD_NOT_FOUND",
            Code::InvalidParams => "INVALID_PARAMS",
            Code::Internal => "INTERNAL_ERROR",
            Code::TaskNotFound => "TASK_NOT_FOUND",
            Code::TaskNotCancelable => "TASK_NOT_CANCELABLE",
            Code::PushNotSupported => "PUSH_NOTIFICATION_NOT_SUPPORTED",
            Code::Unsupported => "UNSUPPORTED_OPERATION",
            Code::ContentTypeNotSupported => "CONTENT_TYPE_NOT_SUPPORTED",
        }
    }
}

/// A JSON-RPC error: a code and a message the caller can act on.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: Code,
    pub message: String,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
        }
    }

    pub fn params(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidParams, message)
    }

    pub fn task_not_found(task: &str) -> Self {
        Self::new(Code::TaskNotFound, format!("task {task:?} not found"))
    }

    /// The error object of a response.
    pub fn body(&self) -> Value {
        json!({
            "code": self.code as i32,
            "message": self.message,
            "data": [{
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": self.code.reason(),
                "domain": "a2a-protocol.org",
                "metadata": {},
            }],
        })
    }
}

impl From<crate::error::ApiError> for RpcError {
    fn from(e: crate::error::ApiError) -> Self {
        use crate::error::ErrorCode;
        let code = match e.body.code.as_str() {
            c if c == ErrorCode::NotFound.as_str()
                || c == ErrorCode::Forbidden.as_str()
                || c == ErrorCode::CrossTenant.as_str() =>
            {
                Code::TaskNotFound
            }
            c if c == ErrorCode::Invalid.as_str()
                || c == ErrorCode::Malformed.as_str()
                || c == ErrorCode::PayloadTooLarge.as_str()
                || c == ErrorCode::Conflict.as_str() =>
            {
                Code::InvalidParams
            }
            c if c == ErrorCode::UnsupportedMediaType.as_str() => Code::ContentTypeNotSupported,
            _ => Code::Internal,
        };
        RpcError::new(code, e.body.message)
    }
}

/// A whole response: the result, or the error, for request `id`.
pub fn response(id: &Value, result: Result<Value, RpcError>) -> Value {
    match result {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(e) => json!({"jsonrpc": "2.0", "id": id, "error": e.body()}),
    }
}

/// How a task's files out are linked: reference → an absolute, signed, short-lived URL.
pub trait Linker {
    fn link(&self, reference: &str) -> Option<String>;
}

/// File references in text (`conv:fi:…`, `conv:at:…`), as the console finds them.
pub fn references(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("conv:") {
        let tail = &rest[at..];
        let kind = tail.get(5..8);
        let len = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || "._~%/-:".contains(c)))
            .unwrap_or(tail.len());
        let candidate = tail[..len].trim_end_matches(['.', '/']);
        if matches!(kind, Some("fi:") | Some("at:"))
            && candidate.contains("/turn_")
            && !found.iter().any(|f| f == candidate)
        {
            found.push(candidate.to_owned());
        }
        rest = &tail[len.max(1)..];
    }
    found
}

fn file_name(reference: &str) -> String {
    let last = reference.rsplit('/').next().unwrap_or("file");
    percent_decode(last)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Some(b) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// An ISO 8601 time from milliseconds since the epoch.
pub fn timestamp(ms: u64) -> String {
    jiff::Timestamp::from_millisecond(ms as i64)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn message_id(view: &TaskView, what: &str) -> String {
    format!("{}-{what}", view.task)
}

/// A message of the task's history.
fn said(view: &TaskView, said: &Said, linker: &dyn Linker) -> Value {
    let task = view.task.to_string();
    let context = view.task.conversation.to_string();
    match said {
        Said::User { text, seq } => json!({
            "messageId": format!("{task}-u{seq}"), "contextId": context, "taskId": task,
            "role": "ROLE_USER", "parts": [{"text": text}],
        }),
        Said::File {
            name,
            media_type,
            reference,
            seq,
        } => {
            let mut part = json!({"filename": name, "mediaType": media_type});
            if let Some(url) = linker.link(reference) {
                part["url"] = json!(url);
            }
            json!({
                "messageId": format!("{task}-u{seq}"), "contextId": context, "taskId": task,
                "role": "ROLE_USER", "parts": [part],
            })
        }
        Said::Agent { text, seq, .. } => json!({
            "messageId": format!("{task}-a{seq}"), "contextId": context, "taskId": task,
            "role": "ROLE_AGENT", "parts": [{"text": text}],
        }),
    }
}

/// What the task's status says in words (and, while it waits, what it waits for as data).
fn status_message(view: &TaskView) -> Option<Value> {
    let mut parts = Vec::new();
    if view.state.interrupted() {
        for w in &view.waiting {
            match w {
                Waiting::Approval {
                    request,
                    tool,
                    arguments,
                    connection: Some(server),
                } => {
                    parts.push(json!({"text": format!(
                        "The call {tool} needs your connection to {server}: connect (PUT /v1/connections/<app>/{server}) and reply \"approve\" on this task to retry it, or \"reject\"."
                    )}));
                    parts.push(json!({"data": {"kind": "connection_required", "requestId": request.to_string(), "tool": tool, "arguments": arguments, "server": server}}));
                }
                Waiting::Approval {
                    request,
                    tool,
                    arguments,
                    connection: None,
                } => {
                    parts.push(json!({"text": format!(
                        "The call {tool} needs your approval: reply \"approve\" or \"reject: <reason>\" on this task (or a data part {{\"approve\": true|false, \"reason\": \"…\"}})."
                    )}));
                    parts.push(json!({"data": {"kind": "approval", "requestId": request.to_string(), "tool": tool, "arguments": arguments}}));
                }
                Waiting::Question { request, question } => {
                    parts.push(json!({"text": question}));
                    parts.push(json!({"data": {"kind": "question", "requestId": request.to_string(), "question": question}}));
                }
            }
        }
    } else if let Some(reason) = &view.reason {
        if view.state.terminal() {
            parts.push(json!({"text": reason}));
        }
    }
    (!parts.is_empty()).then(|| {
        json!({
            "messageId": message_id(view, &format!("s{}", view.through)),
            "contextId": view.task.conversation.to_string(),
            "taskId": view.task.to_string(),
            "role": "ROLE_AGENT",
            "parts": parts,
        })
    })
}

/// The task's status.
pub fn status(view: &TaskView) -> Value {
    let mut status = json!({"state": view.state.wire()});
    if let Some(message) = status_message(view) {
        status["message"] = message;
    }
    if view.at_ms > 0 {
        status["timestamp"] = json!(timestamp(view.at_ms));
    }
    status
}

/// The task's reply so far, as one artifact (`reply`), or none before the agent said anything.
pub fn reply_artifact(view: &TaskView) -> Option<Value> {
    let text: Vec<&str> = view.replies().collect();
    (!text.is_empty()).then(
        || json!({"artifactId": "reply", "name": "reply", "parts": [{"text": text.join("\n\n")}]}),
    )
}

/// The files the agent's replies name, as file parts by signed link (`files`).
pub fn files_artifact(view: &TaskView, linker: &dyn Linker) -> Option<Value> {
    let mut parts = Vec::new();
    for text in view.replies() {
        for reference in references(text) {
            if let Some(url) = linker.link(&reference) {
                parts.push(json!({"url": url, "filename": file_name(&reference), "metadata": {"reference": reference}}));
            }
        }
    }
    (!parts.is_empty()).then(|| json!({"artifactId": "files", "name": "files", "parts": parts}))
}

/// The whole task; `history` keeps the last `history_length` messages (all when `None`).
pub fn task(view: &TaskView, linker: &dyn Linker, history_length: Option<usize>) -> Value {
    let mut task = json!({
        "id": view.task.to_string(),
        "contextId": view.task.conversation.to_string(),
        "status": status(view),
    });
    let artifacts: Vec<Value> = reply_artifact(view)
        .into_iter()
        .chain(files_artifact(view, linker))
        .collect();
    if !artifacts.is_empty() {
        task["artifacts"] = json!(artifacts);
    }
    let skip = history_length.map_or(0, |n| view.history.len().saturating_sub(n));
    let history: Vec<Value> = view
        .history
        .iter()
        .skip(skip)
        .map(|s| said(view, s, linker))
        .collect();
    if !history.is_empty() {
        task["history"] = json!(history);
    }
    let turns: Vec<String> = view.turns.iter().map(|t| t.to_string()).collect();
    task["metadata"] = json!({"turns": turns});
    task
}

/// A status update event.
pub fn status_update(view: &TaskView) -> Value {
    json!({"statusUpdate": {
        "taskId": view.task.to_string(),
        "contextId": view.task.conversation.to_string(),
        "status": status(view),
    }})
}

/// An artifact update event: `text` appended to the reply (streamed text), or the whole reply.
pub fn reply_update(view: &TaskView, text: &str, append: bool, last: bool) -> Value {
    let mut update = json!({
        "taskId": view.task.to_string(),
        "contextId": view.task.conversation.to_string(),
        "artifact": {"artifactId": "reply", "name": "reply", "parts": [{"text": text}]},
    });
    if append {
        update["append"] = json!(true);
    }
    if last {
        update["lastChunk"] = json!(true);
    }
    json!({ "artifactUpdate": update })
}

/// An artifact update event carrying the whole files artifact.
pub fn files_update(view: &TaskView, files: Value) -> Value {
    json!({"artifactUpdate": {
        "taskId": view.task.to_string(),
        "contextId": view.task.conversation.to_string(),
        "artifact": files,
        "lastChunk": true,
    }})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_found_in_text_once_each() {
        let conv = "conv_01JZ0000000000000000000000";
        let text = format!(
            "Here: conv:fi:{conv}/turn_2/report%20final.md. And conv:fi:{conv}/turn_2/report%20final.md again, not conv:gi:{conv}/turn_1/x nor conv:fi:nothing."
        );
        let found = references(&text);
        assert_eq!(
            found,
            vec![format!("conv:fi:{conv}/turn_2/report%20final.md")]
        );
        assert_eq!(file_name(&found[0]), "report final.md");
    }

    #[test]
    fn errors_carry_the_protocol_code_and_reason() {
        let e = RpcError::task_not_found("x").body();
        assert_eq!(e["code"], -32001);
        assert_eq!(e["data"][0]["reason"], "TASK_NOT_FOUND");
    }
}
