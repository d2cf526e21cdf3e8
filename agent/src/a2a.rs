//! Remote agents as tools: an agent's manifest names agents reachable over A2A
//! (`[[agents.X.a2a]]`), and the model calls each as one tool that sends it a message and
//! returns its reply. Two Turnpike agents talk this way, on one deployment or across two.
//!
//! ```toml
//! [[agents.helper.a2a]]
//! name = "researcher"          # the tool's name: 1–32 of [a-z0-9_-], not a built-in tool's
//! url = "https://other.example/a2a/research/researcher"   # the agent's JSON-RPC endpoint
//! token_env = "RESEARCHER_TOKEN"   # optional: the variable holding the bearer token it takes
//! description = "Finds papers"     # optional: what the model is told the tool is for
//! timeout_secs = 300               # optional: how long a call may take (default 300, ≤ 3600)
//! ```
//!
//! # Contract
//! - A call is side-effecting: its intent is committed before the request leaves, a crash
//!   during it quarantines the turn (`turn_ambiguous`), and replay answers it from the record
//!   without the remote agent.
//! - The message id is the call's idempotency key (stable across retries of the turn), so a
//!   remote that deduplicates by message id (Turnpike's edge does) takes one message.
//! - The request goes only to addresses the deployment's outbound rules allow, checked at each
//!   call; redirects are not followed.
//! - The result is `{"state", "task", "context", "reply"}`; a task that waits for input is a
//!   result too (its question in `reply`): the model may answer it by calling the tool again
//!   with the `task`.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::tools::ToolDescription;

/// How long a call may take by default, and at most.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
const MAX_TIMEOUT_SECS: u64 = 3600;
/// The most reply text a result carries.
const MAX_REPLY_BYTES: usize = 32 * 1024;
/// The largest answer read from a remote agent.
const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// `[[agents.X.a2a]]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRemoteAgent {
    name: String,
    url: String,
    #[serde(default)]
    token_env: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    timeout_secs: Option<u64>,
}

/// A remote agent the model may call, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteAgent {
    pub name: String,
    pub url: url::Url,
    pub token_env: Option<String>,
    pub description: String,
    pub timeout: Duration,
}

impl RawRemoteAgent {
    /// Checks the entry; the error names the field.
    pub fn validate(self) -> Result<RemoteAgent, String> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 32
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if !name_ok {
            return Err(format!(
                ".name: {:?} must be 1–32 of a-z, 0-9, _ and -",
                self.name
            ));
        }
        let url = url::Url::parse(&self.url)
            .map_err(|e| format!(".url: {:?} is not a URL: {e}", self.url))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(format!(".url: {} must be http(s) with a host", self.url));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(".url: credentials go in token_env, not in the URL".into());
        }
        if let Some(var) = &self.token_env {
            if var.is_empty() || !var.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(format!(".token_env: {var:?} is not a variable name"));
            }
        }
        let timeout = match self.timeout_secs {
            None => DEFAULT_TIMEOUT,
            Some(s) if (1..=MAX_TIMEOUT_SECS).contains(&s) => Duration::from_secs(s),
            Some(s) => {
                return Err(format!(
                    ".timeout_secs: must be 1–{MAX_TIMEOUT_SECS}, not {s}"
                ))
            }
        };
        Ok(RemoteAgent {
            description: self.description.unwrap_or_else(|| {
                format!("Sends a message to the agent at {url} (over A2A) and returns its reply.")
            }),
            name: self.name,
            url,
            token_env: self.token_env,
            timeout,
        })
    }
}

impl RemoteAgent {
    /// The tool the model sees.
    pub fn tool(&self) -> ToolDescription {
        ToolDescription {
            spec: crate::model::ToolSpec {
                name: self.name.clone(),
                description: format!(
                    "{} Pass `context` (from an earlier result) to go on in the same conversation, and `task` to answer a task that waits for input.",
                    self.description
                ),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "text": {"type": "string", "description": "the message"},
                        "context": {"type": "string", "description": "the remote conversation to go on in"},
                        "task": {"type": "string", "description": "the remote task that waits for this answer"},
                    },
                    "required": ["text"],
                }),
            },
            side_effects: true,
        }
    }

    /// Sends `arguments` (`text`, `context`, `task`) as message `message_id`, with `bearer`,
    /// to the addresses in `pinned` only (none: as DNS says). `Ok` is the tool's result; `Err`
    /// says why no answer came.
    pub async fn call(
        &self,
        arguments: &Value,
        message_id: &str,
        bearer: Option<&str>,
        pinned: &[std::net::SocketAddr],
    ) -> Result<Value, String> {
        let text = arguments
            .get("text")
            .and_then(Value::as_str)
            .filter(|t| !t.trim().is_empty())
            .ok_or("text is required")?;
        let mut message = json!({
            "messageId": message_id,
            "role": "ROLE_USER",
            "parts": [{"text": text}],
        });
        for (arg, field) in [("context", "contextId"), ("task", "taskId")] {
            match arguments.get(arg) {
                None | Some(Value::Null) => {}
                Some(Value::String(s)) if !s.is_empty() => message[field] = json!(s),
                Some(_) => return Err(format!("{arg} is a string")),
            }
        }
        let body = json!({
            "jsonrpc": "2.0",
            "id": message_id,
            "method": "SendMessage",
            "params": {"message": message, "configuration": {}},
        });
        let mut builder = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10))
            .timeout(self.timeout);
        if let (Some(host), false) = (self.url.host_str(), pinned.is_empty()) {
            builder = builder.resolve_to_addrs(host, pinned);
        }
        let client = builder
            .build()
            .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
        let mut request = client
            .post(self.url.clone())
            .header("A2A-Version", "1.0")
            .json(&body);
        if let Some(token) = bearer {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|e| e.to_string())?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("the agent answered HTTP {status}"));
        }
        if response
            .content_length()
            .is_some_and(|n| n > MAX_ANSWER_BYTES as u64)
        {
            return Err(format!(
                "the agent's answer is larger than {MAX_ANSWER_BYTES} bytes"
            ));
        }
        // Read up to the limit, whatever the headers said.
        let mut body = Vec::new();
        let mut chunks = response.bytes_stream();
        while let Some(chunk) = futures::StreamExt::next(&mut chunks).await {
            let chunk = chunk.map_err(|e| e.to_string())?;
            if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(format!(
                    "the agent's answer is larger than {MAX_ANSWER_BYTES} bytes"
                ));
            }
            body.extend_from_slice(&chunk);
        }
        let answer: Value = serde_json::from_slice(&body)
            .map_err(|e| format!("the agent's answer is not JSON: {e}"))?;
        result_of(&answer)
    }
}

/// The tool's result from a `SendMessage` answer.
fn result_of(answer: &Value) -> Result<Value, String> {
    if let Some(error) = answer.get("error") {
        return Err(bounded(format!(
            "the agent refused the message ({}): {}",
            error["code"],
            error["message"].as_str().unwrap_or("no reason given")
        )));
    }
    let result = answer.get("result").ok_or("the answer has no result")?;
    let texts = |parts: &Value| -> Vec<String> {
        parts
            .as_array()
            .map(|parts| {
                parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str).map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    if let Some(message) = result.get("message") {
        return Ok(json!({
            "state": "completed",
            "context": message.get("contextId"),
            "reply": bounded(texts(&message["parts"]).join("\n")),
        }));
    }
    let task = result
        .get("task")
        .ok_or("the answer is neither a task nor a message")?;
    let state = task["status"]["state"]
        .as_str()
        .unwrap_or("TASK_STATE_UNSPECIFIED")
        .trim_start_matches("TASK_STATE_")
        .to_ascii_lowercase()
        .replace('_', "-");
    let mut reply: Vec<String> = Vec::new();
    for artifact in task["artifacts"].as_array().into_iter().flatten() {
        reply.extend(texts(&artifact["parts"]));
    }
    let status = texts(&task["status"]["message"]["parts"]);
    if reply.is_empty() || state != "completed" {
        reply.extend(status);
    }
    Ok(json!({
        "state": state,
        "task": task.get("id"),
        "context": task.get("contextId"),
        "reply": bounded(reply.join("\n")),
    }))
}

fn bounded(mut text: String) -> String {
    if text.len() > MAX_REPLY_BYTES {
        let mut end = MAX_REPLY_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(name: &str, url: &str) -> RawRemoteAgent {
        RawRemoteAgent {
            name: name.into(),
            url: url.into(),
            token_env: None,
            description: None,
            timeout_secs: None,
        }
    }

    #[test]
    fn entries_are_checked_field_by_field() {
        assert!(raw("b", "http://127.0.0.1:8787/a2a/app/agent")
            .validate()
            .is_ok());
        for (name, url, why) in [
            ("", "http://x/a2a", ".name"),
            ("Bad Name", "http://x/a2a", ".name"),
            ("b", "ftp://x/a2a", ".url"),
            ("b", "not a url", ".url"),
            ("b", "http://user:pw@x/a2a", ".url"),
        ] {
            let e = raw(name, url).validate().unwrap_err();
            assert!(e.starts_with(why), "{name} {url}: {e}");
        }
    }

    #[test]
    fn answers_become_results_and_refusals_errors() {
        let task = json!({"jsonrpc": "2.0", "id": "1", "result": {"task": {
            "id": "conv_x-3", "contextId": "conv_x",
            "status": {"state": "TASK_STATE_COMPLETED"},
            "artifacts": [{"artifactId": "reply", "parts": [{"text": "hello back"}]}]}}});
        let r = result_of(&task).unwrap();
        assert_eq!(r["state"], "completed");
        assert_eq!(r["reply"], "hello back");
        assert_eq!(r["context"], "conv_x");
        let waiting = json!({"result": {"task": {"id": "t", "contextId": "c",
            "status": {"state": "TASK_STATE_INPUT_REQUIRED",
                       "message": {"parts": [{"text": "Which colour?"}, {"data": {}}]}}}}});
        let r = result_of(&waiting).unwrap();
        assert_eq!(r["state"], "input-required");
        assert_eq!(r["reply"], "Which colour?");
        let refused = json!({"error": {"code": -32001, "message": "task not found"}});
        assert!(result_of(&refused).unwrap_err().contains("task not found"));
    }
}
