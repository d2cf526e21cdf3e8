//! Compaction: older turns summarised into one summary, so the context stays within the
//! agent's budget.
//!
//! Contract: the summary replaces every turn before the compacting one; it is the model's
//! summary (with the agent's compaction prompt) followed by what must never be paraphrased,
//! verbatim — the user's standing instructions and every approval decision. A standing
//! instruction is a steer, or a user message or follow-up that reads as one (it contains
//! "always", "never", "from now on", "remember", "don't", "do not" or "make sure"; a documented
//! heuristic that errs on keeping too much). The summary is the compacting turn's first row and
//! a `compaction_marker` (range, summary, model, prompt) is committed with the turn; the original
//! rows stay in the record and the turn logs.

use turnpike_schemas::entry::CompactionMarker;
use turnpike_schemas::{Block, TurnId};

use crate::error::{Error, Result};
use crate::model::{CallContext, Message, ModelRequest, Role};
use crate::spec::AgentSpec;
use crate::turn::Turn;

const MARKERS: [&str; 7] = [
    "always",
    "never",
    "from now on",
    "remember",
    "don't",
    "do not",
    "make sure",
];

/// Whether a user's text reads as a standing instruction.
pub fn is_standing_instruction(text: &str) -> bool {
    let lower = text.to_lowercase();
    MARKERS.iter().any(|m| lower.contains(m))
}

/// What a summary keeps verbatim from `history`.
pub fn verbatim(history: &[Block]) -> String {
    let mut instructions = Vec::new();
    let mut decisions = Vec::new();
    for block in history {
        match block {
            Block::Steer { text } => instructions.push(text.clone()),
            Block::UserMessage { text } | Block::FollowUp { text }
                if is_standing_instruction(text) =>
            {
                instructions.push(text.clone())
            }
            Block::Summary { text, .. } => {
                // An earlier summary's verbatim parts carry over.
                if let Some((_, kept)) = text.split_once(VERBATIM_HEADING) {
                    for line in kept.lines().filter_map(|l| l.strip_prefix("- ")) {
                        if let Some(rest) = line.strip_prefix("instruction: ") {
                            instructions.push(rest.to_owned());
                        } else if let Some(rest) = line.strip_prefix("approval: ") {
                            decisions.push(rest.to_owned());
                        }
                    }
                }
            }
            Block::ApprovalResponse {
                request_id,
                approved,
                by,
                reason,
                automatic,
                refused: None,
            } => {
                let call = history.iter().find_map(|b| match b {
                    Block::ApprovalRequest {
                        request_id: r,
                        tool,
                        arguments,
                        ..
                    } if r == request_id => Some(format!(
                        "{tool}({})",
                        crate::approvals::canonical_string(arguments)
                    )),
                    _ => None,
                });
                let who = match (automatic, by) {
                    (true, _) => "automatically".to_owned(),
                    (false, Some(by)) => format!("by {by}"),
                    (false, None) => String::new(),
                };
                decisions.push(format!(
                    "{request_id} {} {} {who}{}",
                    call.unwrap_or_default(),
                    if *approved { "approved" } else { "rejected" },
                    reason
                        .as_ref()
                        .map(|r| format!(": {r}"))
                        .unwrap_or_default()
                ));
            }
            _ => {}
        }
    }
    let mut out = String::new();
    for i in instructions {
        out.push_str(&format!("- instruction: {i}\n"));
    }
    for d in decisions {
        out.push_str(&format!("- approval: {d}\n"));
    }
    out
}

/// The heading before the verbatim part of a summary.
pub const VERBATIM_HEADING: &str = "\n\nKept verbatim (standing instructions and approvals):\n";

/// Summarises `history` (the rows before this turn) with the agent's model and prompt.
pub async fn compact(
    turn: &dyn Turn,
    spec: &AgentSpec,
    history_blocks: &[Block],
    history: &[Message],
    cx: &mut CallContext,
) -> Result<(Block, CompactionMarker)> {
    let through = TurnId::new(turn.turn().number() - 1)
        .ok_or_else(|| Error::route("nothing before the first turn to compact"))?;
    let mut messages = vec![Message::new(Role::System, spec.compaction_prompt.clone())];
    messages.extend_from_slice(history);
    messages.push(Message::new(
        Role::User,
        "Write the summary of the conversation above now.",
    ));
    let request = ModelRequest {
        model: spec.model.clone(),
        turn_start: messages.len(),
        messages,
        tools: Vec::new(),
        closing: false,
        compaction: true,
        max_tokens: None,
        tool_choice: Default::default(),
        temperature: spec.temperature,
    };
    let reply = spec.provider.complete(&request, cx).await?;
    cx.account(&request, &reply);
    let kept = verbatim(history_blocks);
    let text = if kept.is_empty() {
        reply.text.trim().to_owned()
    } else {
        format!("{}{VERBATIM_HEADING}{kept}", reply.text.trim())
    };
    let marker = CompactionMarker {
        turn: turn.turn(),
        through,
        summary: text.clone(),
        model: spec.model.clone(),
        prompt: spec.compaction_prompt.clone(),
    };
    Ok((Block::Summary { through, text }, marker))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standing_instructions_and_approvals_are_kept_verbatim_across_summaries() {
        let history = vec![
            Block::UserMessage {
                text: "From now on, always answer in French.".into(),
            },
            Block::UserMessage {
                text: "What is the weather?".into(),
            },
            Block::Steer {
                text: "use metric units".into(),
            },
        ];
        let kept = verbatim(&history);
        assert!(kept.contains("- instruction: From now on, always answer in French.\n"));
        assert!(kept.contains("- instruction: use metric units\n"));
        assert!(!kept.contains("weather"));
        // A later summary keeps what the earlier one kept.
        let later = vec![Block::Summary {
            through: TurnId::new(3).unwrap(),
            text: format!("they talked{VERBATIM_HEADING}{kept}"),
        }];
        assert_eq!(verbatim(&later), kept);
    }
}
