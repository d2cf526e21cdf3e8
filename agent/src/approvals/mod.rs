//! Approvals and questions: which calls are gated, the canonical form an approval binds to,
//! what is still pending in a conversation, and a turn's prelude — the answers, automatic
//! rejections and agent switches applied before the model runs.
//!
//! Binding: an approval applies to exactly one call — its request id, tool name and canonical
//! arguments. The canonical form sorts object keys and normalises numbers (an integral float is
//! an integer: `1.0` → `1`; other floats keep their shortest round-trip form), so two spellings
//! of the same call are one call, and any other call needs another approval.
//!
//! # Layout
//! - [`mod@canonical`]: the canonical form of a call's arguments
//! - [`policy`]: an agent's gates
//! - [`mod@pending`]: what is still waiting for an answer
//! - here: a turn's prelude

pub mod canonical;
pub mod pending;
pub mod policy;

pub use canonical::{canonical, canonical_string};
pub use pending::{pending, PendingApproval, PendingQuestion};
pub use policy::{Gate, Policy};

use serde_json::json;
use turnpike_schemas::{Block, Event, EventBody};

use crate::agent_loop::ToolRunner;
use crate::error::{Error, Result};
use crate::message::ToolCallRequest;
use crate::turn::Turn;

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
    turn: &dyn Turn,
    tools: &dyn ToolRunner,
    history: &[Block],
    blocks: &mut Vec<Block>,
    asks: &Asks,
) -> Result<bool> {
    let (mut approvals, mut questions) = pending(history.iter().chain(blocks.iter()));
    let mut applied = false;
    let mut restored: Option<std::result::Result<(), String>> = None;
    if asks.supersedes {
        supersede(&mut approvals, &mut questions, blocks);
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
                let answer = Answer {
                    request_id: *request_id,
                    approve: *approve,
                    reason: reason.as_deref(),
                    tool: tool.as_deref(),
                    arguments: arguments.as_ref(),
                    by,
                };
                let Some(p) = accept(turn, &answer, &mut approvals, blocks).await else {
                    continue;
                };
                applied = true;
                run_answered(tools, &p, &answer, &mut restored, blocks).await;
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

/// An answer to an approval request, as its event carries it.
struct Answer<'e> {
    request_id: turnpike_schemas::RequestId,
    approve: bool,
    reason: Option<&'e str>,
    /// The call the answer is for, when the client says (it must be the pending one).
    tool: Option<&'e str>,
    arguments: Option<&'e serde_json::Value>,
    by: &'e turnpike_schemas::Identity,
}

/// Rejects every pending request: a new message or an agent switch supersedes them.
fn supersede(
    approvals: &mut Vec<PendingApproval>,
    questions: &mut Vec<PendingQuestion>,
    blocks: &mut Vec<Block>,
) {
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

/// The pending request an answer applies to, taken off `approvals` and answered in `blocks`;
/// `None` (and the refusal recorded) when there is none, the answerer may not answer it, or the
/// answer names another call.
async fn accept(
    turn: &dyn Turn,
    answer: &Answer<'_>,
    approvals: &mut Vec<PendingApproval>,
    blocks: &mut Vec<Block>,
) -> Option<PendingApproval> {
    let response = |refused: Option<String>| Block::ApprovalResponse {
        request_id: answer.request_id,
        approved: answer.approve,
        by: Some(answer.by.clone()),
        reason: answer.reason.map(str::to_owned),
        automatic: false,
        refused,
    };
    let request_id = answer.request_id;
    let Some(at) = approvals.iter().position(|p| p.request_id == request_id) else {
        blocks.push(response(Some(format!(
            "no approval request {request_id} is pending (unknown, or already answered)"
        ))));
        return None;
    };
    let p = approvals[at].clone();
    if !turn.may_answer(answer.by, &p.approvers).await {
        blocks.push(response(Some(format!(
            "{} may not answer this request",
            answer.by
        ))));
        return None;
    }
    if answer.tool.is_some_and(|t| t != p.tool)
        || answer
            .arguments
            .is_some_and(|a| canonical(a) != p.arguments)
    {
        blocks.push(response(Some(format!(
            "the answer is for another call than {}({})",
            p.tool,
            canonical_string(&p.arguments)
        ))));
        return None;
    }
    approvals.remove(at);
    blocks.push(response(None));
    Some(p)
}

/// Records the answered call and its result: an approved call runs (over the restored
/// workspace), a denied one gets its denial as its result.
async fn run_answered(
    tools: &dyn ToolRunner,
    p: &PendingApproval,
    answer: &Answer<'_>,
    restored: &mut Option<std::result::Result<(), String>>,
    blocks: &mut Vec<Block>,
) {
    let call = ToolCallRequest {
        id: format!(
            "{}-{}",
            p.call_id,
            if answer.approve { "approved" } else { "denied" }
        ),
        name: p.tool.clone(),
        arguments: p.arguments.clone(),
    };
    blocks.push(Block::ToolCall {
        call_id: call.id.clone(),
        tool: call.name.clone(),
        arguments: call.arguments.clone(),
    });
    // The call was asked for in a workspace that is gone: bring back the files the parked turn
    // left (the project's latest version: the parked turn published it, and nothing ran since)
    // before it runs. Without them it does not run.
    if answer.approve && restored.is_none() {
        *restored = Some(tools.restore_workspace().await);
    }
    let (ok, out) = if let (true, Some(Err(e))) = (answer.approve, &*restored) {
        (
            false,
            json!({ "error": format!("not run: the workspace could not be restored: {e}") }).into(),
        )
    } else if answer.approve {
        tools.run(&call).await
    } else {
        let why = answer.reason.unwrap_or("no reason given");
        (
            false,
            json!({ "error": format!("denied by {}: {why}", answer.by) }).into(),
        )
    };
    blocks.push(Block::ToolResult {
        call_id: call.id.clone(),
        ok,
        output: out.output,
    });
    blocks.extend(out.blocks);
}

#[cfg(test)]
mod tests {
    use super::policy::glob;
    use super::*;
    use serde_json::json;
    use serde_json::Value;

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
