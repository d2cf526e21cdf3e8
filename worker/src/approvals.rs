//! Approvals and questions: which calls are gated, the canonical form an approval binds to,
//! what is still pending in a conversation, and a turn's prelude — the answers, automatic
//! rejections and agent switches applied before the model runs.
//!
//! Binding: an approval applies to exactly one call — its request id, tool name and canonical
//! arguments. The canonical form sorts object keys and normalises numbers (an integral float is
//! an integer: `1.0` → `1`; other floats keep their shortest round-trip form), so two spellings
//! of the same call are one call, and any other call needs another approval.

use serde::Deserialize;
use serde_json::json;
use serde_json::{Map, Number, Value};
use turnpike_schemas::{Block, Event, EventBody, Identity, RequestId};

use crate::agent_loop::ToolRunner;
use crate::error::{Error, Result};
use crate::model::ToolCallRequest;
use crate::turn::TurnContext;

/// The canonical form of a JSON value (see the module docs).
pub fn canonical(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let mut out = Map::new();
            for k in keys {
                out.insert(k.clone(), canonical(&map[k]));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        Value::Number(n) => Value::Number(canonical_number(n)),
        other => other.clone(),
    }
}

fn canonical_number(n: &Number) -> Number {
    if n.is_i64() || n.is_u64() {
        return n.clone();
    }
    match n.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15 => Number::from(f as i64),
        Some(f) => Number::from_f64(f).unwrap_or_else(|| n.clone()),
        None => n.clone(),
    }
}

/// The canonical text of a value: keys sorted at every level, whatever the map type.
pub fn canonical_string(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(&canonical(value), &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// One rule of an agent's approval policy (manifest: `approval = [{ tool = "publish" }, …]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gate {
    pub tool: String,
    /// `always` (default) or `never`.
    #[serde(default = "always")]
    pub when: String,
    /// With `matches`: gate only calls whose string argument `arg` matches the pattern.
    #[serde(default)]
    pub arg: Option<String>,
    /// A pattern with `*` wildcards, e.g. `deploy/*`.
    #[serde(default)]
    pub matches: Option<String>,
}

fn always() -> String {
    "always".into()
}

/// Which tool calls need a person's approval.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    gates: Vec<Gate>,
}

impl Policy {
    /// Checks the rules; the error names what is wrong.
    pub fn new(gates: Vec<Gate>) -> Result<Self, String> {
        for (i, g) in gates.iter().enumerate() {
            if g.when != "always" && g.when != "never" {
                return Err(format!(
                    "approval[{i}].when: {:?} is not \"always\" or \"never\"",
                    g.when
                ));
            }
            if g.arg.is_some() != g.matches.is_some() {
                return Err(format!("approval[{i}]: `arg` and `matches` go together"));
            }
        }
        Ok(Self { gates })
    }

    /// The tools the rules name.
    pub fn tools(&self) -> Vec<String> {
        self.gates.iter().map(|g| g.tool.clone()).collect()
    }

    /// Whether a call needs approval: the first rule for its tool decides.
    pub fn gated(&self, tool: &str, arguments: &Value) -> bool {
        for gate in self.gates.iter().filter(|g| g.tool == tool) {
            if gate.when == "never" {
                return false;
            }
            match (&gate.arg, &gate.matches) {
                (Some(arg), Some(pattern)) => {
                    // Match what the tool will act on, not how the model spelled it: the
                    // argument as given and as the path it names once decoded and
                    // normalised (`d%65ploy/x`, `./deploy/x`, `a/../deploy/x` are all
                    // `deploy/x`). Any spelling that matches gates the call.
                    if arguments
                        .get(arg)
                        .and_then(Value::as_str)
                        .is_some_and(|v| spellings(v).iter().any(|s| glob(pattern, s)))
                    {
                        return true;
                    }
                }
                _ => return true,
            }
        }
        false
    }
}

/// The spellings of an argument a gate is matched against: as given, and — read as a path
/// the way the file tools read it — percent-decoded, with `.` segments dropped and `..`
/// segments applied (lexically), and empty segments ignored.
fn spellings(value: &str) -> Vec<String> {
    let mut out = vec![value.to_owned()];
    let mut segments: Vec<String> = Vec::new();
    for raw in value.split('/') {
        let decoded = percent_decoded(raw);
        // An encoded `/` inside a segment separates segments once decoded.
        for segment in decoded.split('/') {
            match segment {
                "" | "." => {}
                ".." => {
                    segments.pop();
                }
                other => segments.push(other.to_owned()),
            }
        }
    }
    let normalised = segments.join("/");
    if normalised != value {
        out.push(normalised);
    }
    out
}

/// `%XX` sequences decoded (lossily, as UTF-8); anything else kept as it is.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = |b: u8| (b as char).to_digit(16);
            if let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((hi * 16 + lo) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `*` matches any run of characters; everything else matches itself.
fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(i) => rest = &rest[i + middle.len()..],
            None => return false,
        }
    }
    true
}

/// An approval request still waiting for an answer.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingApproval {
    pub request_id: RequestId,
    pub call_id: String,
    pub tool: String,
    pub arguments: Value,
    pub approvers: Vec<Identity>,
}

/// A question still waiting for an answer.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingQuestion {
    pub request_id: RequestId,
    pub question: String,
}

/// What is pending after `blocks` (the history, then the turn so far): requests with no
/// answer that applied (a refused answer leaves a request pending).
pub fn pending<'b>(
    blocks: impl IntoIterator<Item = &'b Block>,
) -> (Vec<PendingApproval>, Vec<PendingQuestion>) {
    let mut approvals: Vec<PendingApproval> = Vec::new();
    let mut questions: Vec<PendingQuestion> = Vec::new();
    for block in blocks {
        match block {
            Block::ApprovalRequest {
                request_id,
                call_id,
                tool,
                arguments,
                approvers,
                ..
            } => approvals.push(PendingApproval {
                request_id: *request_id,
                call_id: call_id.clone(),
                tool: tool.clone(),
                arguments: arguments.clone(),
                approvers: approvers.clone(),
            }),
            Block::ApprovalResponse {
                request_id,
                refused: None,
                ..
            } => approvals.retain(|p| p.request_id != *request_id),
            Block::QuestionRequest {
                request_id,
                question,
                ..
            } => questions.push(PendingQuestion {
                request_id: *request_id,
                question: question.clone(),
            }),
            Block::QuestionResponse { request_id, .. } => {
                questions.retain(|q| q.request_id != *request_id)
            }
            _ => {}
        }
    }
    (approvals, questions)
}

// The turn's prelude: answers, automatic rejections and switches applied before the model runs.

/// What the turn's inputs ask for besides answers.
pub(crate) struct Asks {
    /// A message, follow-up, steer or attachment: the model has work.
    pub(crate) work: bool,
    /// A new user message or an agent switch: pending requests are rejected first.
    pub(crate) supersedes: bool,
    /// A manual compaction.
    pub(crate) compact: bool,
}

pub(crate) fn asks(inputs: &[Event]) -> Asks {
    let mut a = Asks {
        work: false,
        supersedes: false,
        compact: false,
    };
    for e in inputs {
        match &e.body {
            EventBody::Message { .. } => {
                a.work = true;
                a.supersedes = true;
            }
            EventBody::FollowUp { .. } | EventBody::Steer { .. } | EventBody::Attachment { .. } => {
                a.work = true
            }
            EventBody::SwitchAgent { .. } => a.supersedes = true,
            EventBody::Compact {} => a.compact = true,
            _ => {}
        }
    }
    a
}

/// Applies the turn's answers, automatic rejections and switches before the model runs:
/// approvals (checked against the pending call, its approvers and the echoed call), questions,
/// and `switch_agent`. Returns whether an answer applied (the model then continues).
pub(crate) async fn prelude(
    turn: &TurnContext<'_>,
    tools: &dyn ToolRunner,
    history: &[Block],
    blocks: &mut Vec<Block>,
    asks: &Asks,
) -> Result<bool> {
    let (mut approvals, mut questions) = pending(history.iter().chain(blocks.iter()));
    let mut applied = false;
    let mut restored: Option<std::result::Result<(), String>> = None;
    if asks.supersedes {
        for p in approvals.drain(..) {
            blocks.push(Block::ApprovalResponse {
                request_id: p.request_id,
                approved: false,
                by: None,
                reason: Some("superseded by a new message or an agent switch".into()),
                automatic: true,
                refused: None,
            });
        }
        for q in questions.drain(..) {
            blocks.push(Block::QuestionResponse {
                request_id: q.request_id,
                answer: "superseded by a new message or an agent switch".into(),
                automatic: true,
            });
        }
    }
    for event in turn.inputs() {
        let by = &event.address.identity;
        match &event.body {
            EventBody::ApprovalResponse {
                request_id,
                approve,
                reason,
                tool,
                arguments,
            } => {
                let refuse = |why: String| Block::ApprovalResponse {
                    request_id: *request_id,
                    approved: *approve,
                    by: Some(by.clone()),
                    reason: reason.clone(),
                    automatic: false,
                    refused: Some(why),
                };
                let Some(at) = approvals.iter().position(|p| p.request_id == *request_id) else {
                    blocks.push(refuse(format!(
                        "no approval request {request_id} is pending (unknown, or already answered)"
                    )));
                    continue;
                };
                let p = approvals[at].clone();
                if !turn.may_answer(by, &p.approvers).await {
                    blocks.push(refuse(format!("{by} may not answer this request")));
                    continue;
                }
                if tool.as_ref().is_some_and(|t| *t != p.tool)
                    || arguments
                        .as_ref()
                        .is_some_and(|a| canonical(a) != p.arguments)
                {
                    blocks.push(refuse(format!(
                        "the answer is for another call than {}({})",
                        p.tool,
                        canonical_string(&p.arguments)
                    )));
                    continue;
                }
                approvals.remove(at);
                applied = true;
                blocks.push(Block::ApprovalResponse {
                    request_id: p.request_id,
                    approved: *approve,
                    by: Some(by.clone()),
                    reason: reason.clone(),
                    automatic: false,
                    refused: None,
                });
                let call = ToolCallRequest {
                    id: format!(
                        "{}-{}",
                        p.call_id,
                        if *approve { "approved" } else { "denied" }
                    ),
                    name: p.tool.clone(),
                    arguments: p.arguments.clone(),
                };
                blocks.push(Block::ToolCall {
                    call_id: call.id.clone(),
                    tool: call.name.clone(),
                    arguments: call.arguments.clone(),
                });
                // The call was asked for in a workspace that is gone: bring back the files the
                // parked turn left (the project's latest version: the parked turn published it,
                // and nothing ran since) before it runs. Without them it does not run.
                if *approve && restored.is_none() {
                    restored = Some(tools.restore_workspace().await);
                }
                let (ok, out) = if let (true, Some(Err(e))) = (*approve, &restored) {
                    (
                        false,
                        json!({ "error": format!("not run: the workspace could not be restored: {e}") })
                            .into(),
                    )
                } else if *approve {
                    tools.run(&call).await
                } else {
                    let why = reason.as_deref().unwrap_or("no reason given");
                    (
                        false,
                        json!({ "error": format!("denied by {by}: {why}") }).into(),
                    )
                };
                blocks.push(Block::ToolResult {
                    call_id: call.id.clone(),
                    ok,
                    output: out.output,
                });
                blocks.extend(out.blocks);
            }
            EventBody::QuestionResponse { request_id, answer } => {
                if let Some(at) = questions.iter().position(|q| q.request_id == *request_id) {
                    questions.remove(at);
                    applied = true;
                    blocks.push(Block::QuestionResponse {
                        request_id: *request_id,
                        answer: answer.clone(),
                        automatic: false,
                    });
                } else {
                    // An answer to no pending question (an approval's id included) is not an
                    // approval and changes nothing; the record keeps it as an input.
                    tracing::warn!(%request_id, "an answer to no pending question was ignored");
                }
            }
            EventBody::SwitchAgent { agent } => {
                let current = turn.agent_id();
                if agent != current && turn.app_agents().contains(agent) {
                    blocks.push(Block::AgentSwitched {
                        from: current.clone(),
                        to: agent.clone(),
                    });
                } else if agent != current {
                    return Err(Error::route(format!(
                        "cannot switch to agent {agent}: app {} has no such agent",
                        turn.app()
                    )));
                }
            }
            _ => {}
        }
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_canonical_form_is_golden() {
        let cases = [
            (
                json!({"b": 1, "a": {"d": [2.0, 1.5], "c": null}}),
                r#"{"a":{"c":null,"d":[2,1.5]},"b":1}"#,
            ),
            (json!({"path": "x", "n": 10.0}), r#"{"n":10,"path":"x"}"#),
            (json!({"n": -0.0}), r#"{"n":0}"#),
            (json!({"n": 1e300}), r#"{"n":1e+300}"#),
            (json!({"n": 0.1}), r#"{"n":0.1}"#),
            (json!({"s": "é\n\"q\""}), r#"{"s":"é\n\"q\""}"#),
            (
                json!([3, {"z": true, "y": false}]),
                r#"[3,{"y":false,"z":true}]"#,
            ),
            (json!(18446744073709551615u64), "18446744073709551615"),
        ];
        for (value, golden) in cases {
            assert_eq!(canonical_string(&value), golden, "{value}");
        }
        // Two spellings of one call are one call.
        let a: Value = serde_json::from_str(r#"{"n": 2.0, "path": "a"}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"path":"a","n":2}"#).unwrap();
        assert_eq!(canonical(&a), canonical(&b));
        let c: Value = serde_json::from_str(r#"{"path":"b","n":2}"#).unwrap();
        assert_ne!(canonical(&a), canonical(&c));
    }

    #[test]
    fn the_first_rule_for_a_tool_decides() {
        let policy = Policy::new(vec![
            Gate {
                tool: "write_file".into(),
                when: "always".into(),
                arg: Some("path".into()),
                matches: Some("deploy/*".into()),
            },
            Gate {
                tool: "publish".into(),
                when: "always".into(),
                arg: None,
                matches: None,
            },
            Gate {
                tool: "read_file".into(),
                when: "never".into(),
                arg: None,
                matches: None,
            },
        ])
        .unwrap();
        assert!(policy.gated("publish", &json!({})));
        assert!(policy.gated("write_file", &json!({"path": "deploy/prod.yaml"})));
        assert!(!policy.gated("write_file", &json!({"path": "notes/deploy.txt"})));
        assert!(!policy.gated("read_file", &json!({})));
        assert!(!policy.gated("list_files", &json!({})));
        assert!(glob("a*b*c", "axxbyyc") && !glob("a*b*c", "axxc") && glob("*", ""));
    }

    #[test]
    fn every_spelling_of_a_gated_path_is_gated() {
        let policy = Policy::new(vec![Gate {
            tool: "write_file".into(),
            when: "always".into(),
            arg: Some("path".into()),
            matches: Some("deploy/*".into()),
        }])
        .unwrap();
        let gated = |path: &str| {
            policy.gated(
                "write_file",
                &serde_json::json!({ "path": path, "content": "x" }),
            )
        };
        for spelling in [
            "deploy/prod.yaml",
            "d%65ploy/prod.yaml",
            "%64%65%70%6C%6F%79/prod.yaml",
            "./deploy/prod.yaml",
            "a/../deploy/prod.yaml",
            "deploy//prod.yaml",
            "deploy%2Fprod.yaml",
            "x/./../deploy/./prod.yaml",
        ] {
            assert!(gated(spelling), "{spelling} escaped the gate");
            // And the tool reads each as the gated path (or refuses it outright).
            if let Ok(p) = turnpike_schemas::RefPath::parse(spelling) {
                assert_eq!(p.to_relative_path(), "deploy/prod.yaml", "{spelling}");
            }
        }
        for other in ["deployment/x", "src/deploy.rs", "%", "%é1", "deploy"] {
            assert!(!gated(other), "{other} was gated");
        }
        assert!(Policy::new(vec![Gate {
            tool: "x".into(),
            when: "sometimes".into(),
            arg: None,
            matches: None
        }])
        .is_err());
    }
}
