//! Recall: at the context rebuild, before the first model round, an agent that opts in
//! (`recall = { … }` in its manifest) gets rows of the user's other conversations that match the
//! turn's input, from the hybrid index — scoped exactly as a `search` by the turn's identity
//! would be, and in a shared conversation to what every participant may see.
//!
//! Contract:
//! - the hits become one [`Block::Recall`] after the turn's inputs: references and scores are
//!   pinned in the turn log (replay and `--what-if` use them, never the index); the snippets
//!   the model reads are fetched through the resolver at rebuild and are not kept;
//! - rows the timeline already holds, and the running conversation's own rows, are left out;
//! - recalled rows take what the history leaves of the budget, and at most `budget_tokens`:
//!   the lowest scores go first when it is tight;
//! - an index that fails (or takes longer than [`RECALL_TIMEOUT`]) makes a recall with no hits
//!   and a note saying why; the turn runs;
//! - recalled rows reach the model as quoted material in a user message, never with a system
//!   message's authority: they may hold text someone else wrote (a file, a web page).

use std::time::Duration;

use turnpike_agent::message::{Message, Role};
pub use turnpike_agent::recall::{RecallRequest, RecallScope, RecallSpec};
use turnpike_agent::tokens::TokenCounter;
use turnpike_schemas::{AppId, Block, ConversationId, RecallHit};

use crate::tools::SearchIndex;

/// What a recall query is narrowed to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecallFilter {
    pub k: usize,
    pub kinds: Vec<String>,
    pub conversation: Option<ConversationId>,
    pub app: Option<AppId>,
}

/// The longest query recall sends (the index takes 4 KiB): the most recent input is kept.
pub const MAX_QUERY_BYTES: usize = 4000;

/// How long recall may take before the turn goes on without it.
pub const RECALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The turn's input as a query: its messages, follow-ups and steers, in order — the last
/// [`MAX_QUERY_BYTES`] of it.
pub fn query_of(blocks: &[Block]) -> String {
    let all = blocks
        .iter()
        .filter_map(|b| match b {
            Block::UserMessage { text } | Block::FollowUp { text } | Block::Steer { text } => {
                Some(text.as_str())
            }
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n");
    if all.len() <= MAX_QUERY_BYTES {
        return all;
    }
    let mut start = all.len() - MAX_QUERY_BYTES;
    while !all.is_char_boundary(start) {
        start += 1;
    }
    all[start..].to_owned()
}

/// Everything [`recall`] needs to know about the turn.
pub struct RecallInput<'a> {
    pub spec: &'a RecallSpec,
    pub index: Option<&'a std::sync::Arc<dyn SearchIndex>>,
    pub tenant: &'a turnpike_schemas::TenantId,
    pub identity: &'a turnpike_schemas::Identity,
    pub conversation: ConversationId,
    pub app: &'a AppId,
    /// The turn's blocks so far (its inputs).
    pub blocks: &'a [Block],
    /// References of the rows the timeline holds.
    pub in_timeline: &'a std::collections::HashSet<String>,
    /// Tokens the history, the system prompt and the turn's own input leave of the budget.
    pub available_tokens: u64,
    pub tokens: &'a TokenCounter,
    pub reach: &'a crate::reach::Reach,
}

/// The recall block of the turn (`None` when its input has no words to search for).
pub async fn recall(input: RecallInput<'_>) -> Option<Block> {
    let query = query_of(input.blocks);
    if query.trim().is_empty() {
        return None;
    }
    let Some(index) = input.index else {
        return Some(Block::Recall {
            query,
            hits: Vec::new(),
            note: Some("recall skipped: this worker has no index configured".into()),
        });
    };
    let spec = input.spec;
    let filter = RecallFilter {
        // Room for what is filtered out below.
        k: (spec.k * 3).min(50),
        kinds: if spec.kinds.is_empty() {
            ["prompt", "completion", "summary"]
                .map(String::from)
                .to_vec()
        } else {
            spec.kinds.clone()
        },
        conversation: (spec.scope == RecallScope::Conversation).then_some(input.conversation),
        app: (spec.scope == RecallScope::App).then(|| input.app.clone()),
    };
    let asked = index.recall(input.tenant, input.identity, &query, &filter);
    // The note is for the user's record: what happened, not the index's internals (those go
    // to the log).
    let failed = match tokio::time::timeout(RECALL_TIMEOUT, asked).await {
        Ok(Ok(found)) => Ok(found),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "recall failed; the turn runs without it");
            Err("recall skipped: the index failed".to_owned())
        }
        Err(_) => Err(format!(
            "recall skipped: the index did not answer within {RECALL_TIMEOUT:?}"
        )),
    };
    let found = match failed {
        Ok(found) => found,
        Err(note) => {
            return Some(Block::Recall {
                query,
                hits: Vec::new(),
                note: Some(note),
            });
        }
    };
    let private = input.reach.private_to(input.identity).await;
    let mut hits: Vec<RecallHit> = Vec::new();
    for hit in found {
        if hit.score < spec.min_score || input.in_timeline.contains(&hit.reference) {
            continue;
        }
        // The running conversation's own rows are in the timeline or its summary, unless the
        // agent recalls exactly those.
        if hit.conversation == input.conversation && spec.scope != RecallScope::Conversation {
            continue;
        }
        if !private && !input.reach.allows(hit.conversation).await {
            continue;
        }
        hits.push(hit);
    }
    hits.sort_by(|a, b| b.score.total_cmp(&a.score));
    hits.truncate(spec.k);
    // The budget: best first while they fit; the rest (the lowest scores) are dropped.
    let budget = spec.budget_tokens.min(input.available_tokens);
    let mut kept: Vec<RecallHit> = Vec::new();
    for hit in hits {
        let mut trial = kept.clone();
        trial.push(hit);
        let message = Message::new(Role::User, turnpike_agent::timeline::recall_message(&trial));
        if input.tokens.count(&message) > budget {
            break;
        }
        kept = trial;
    }
    Some(Block::Recall {
        query,
        hits: kept,
        note: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_is_the_turns_words() {
        let blocks = vec![
            Block::UserMessage { text: "a".into() },
            Block::Stop { reason: None },
            Block::FollowUp { text: "b".into() },
        ];
        assert_eq!(query_of(&blocks), "a\nb");
        // A long input keeps its most recent words, cut on a character boundary.
        let long = vec![Block::UserMessage {
            text: format!("{}ünd the end", "é".repeat(3000)),
        }];
        let q = query_of(&long);
        assert!(
            q.len() <= MAX_QUERY_BYTES && q.ends_with("ünd the end"),
            "{}",
            q.len()
        );
    }
}
