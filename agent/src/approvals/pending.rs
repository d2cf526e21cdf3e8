//! What is still pending in a conversation: approval requests and questions with no answer that
//! applied.

use serde_json::Value;
use turnpike_schemas::{Block, Identity, RequestId};

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
