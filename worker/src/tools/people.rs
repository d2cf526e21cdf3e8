//! Tools that involve the people and agents of a conversation: `ask_user` (a question that parks
//! the turn until the user answers) and `system__switch_to_agent` (hands the conversation to
//! another agent of the app from the next turn on).

use async_trait::async_trait;
use serde_json::{json, Value};
use turnpike_schemas::{AgentId, Block, RequestId};

use super::{str_arg, Tool, ToolContext, ToolOutput};
use turnpike_agent::model::ToolSpec;

/// `ask_user {question}`.
pub struct AskUser;

#[async_trait]
impl Tool for AskUser {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "ask_user".into(),
            description: "Ask the user a question; the turn pauses until they answer.".into(),
            parameters: json!({"type": "object", "properties": {"question": {"type": "string"}},
                "required": ["question"]}),
        }
    }

    async fn call(&self, cx: &ToolContext<'_>, args: Value) -> Result<ToolOutput, String> {
        let question = str_arg(&args, "question")?.trim().to_owned();
        if question.is_empty() {
            return Err("the question is empty".into());
        }
        let request_id = RequestId::new();
        Ok(ToolOutput {
            output: json!({"status": "asked", "request_id": request_id}),
            blocks: vec![Block::QuestionRequest {
                request_id,
                call_id: cx.call_id.to_owned(),
                question,
            }],
        })
    }
}

/// `system__switch_to_agent {agent}`.
pub struct SwitchAgent;

#[async_trait]
impl Tool for SwitchAgent {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "system__switch_to_agent".into(),
            description:
                "Hand the conversation to another agent of this app from the next turn on.".into(),
            parameters: json!({"type": "object", "properties": {"agent": {"type": "string"}},
                "required": ["agent"]}),
        }
    }

    async fn call(&self, cx: &ToolContext<'_>, args: Value) -> Result<ToolOutput, String> {
        let name = str_arg(&args, "agent")?;
        let to: AgentId = name.parse().map_err(|e| format!("agent {name:?}: {e}"))?;
        if !cx.app_agents.contains(&to) {
            return Err(format!(
                "this app has no agent {to} (it has: {})",
                cx.app_agents
                    .iter()
                    .map(|a| a.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if &to == cx.agent {
            return Ok(json!({"status": "already the current agent"}).into());
        }
        Ok(ToolOutput {
            output: json!({"status": "switched", "from_next_turn": to}),
            blocks: vec![Block::AgentSwitched {
                from: cx.agent.clone(),
                to,
            }],
        })
    }
}
