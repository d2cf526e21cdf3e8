//! What an agent's manifest asks recall for (`recall = { … }`), and what the harness asks the
//! host to recall for a turn. The host (the worker) runs the query against its index as the
//! turn's identity; the harness only places the block it gets back (see the worker's `recall`).

use std::collections::HashSet;

use serde::Deserialize;
use turnpike_schemas::Block;

use crate::tokens::TokenCounter;

/// Which of the user's rows recall may bring in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecallScope {
    /// Every conversation of the turn's identity.
    #[default]
    Identity,
    /// Only the running conversation (rows compaction took out of the timeline).
    Conversation,
    /// The identity's conversations with this app.
    App,
}

/// An agent's `recall = { … }`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecallSpec {
    /// Hits at most (1–20).
    #[serde(default = "default_k")]
    pub k: usize,
    #[serde(default)]
    pub scope: RecallScope,
    /// Index kinds to recall (`prompt`, `completion`, `summary`, `attachment`, `file`); empty:
    /// what the user and the agent said (`prompt`, `completion`, `summary`) — files and
    /// attachments only when named.
    #[serde(default)]
    pub kinds: Vec<String>,
    /// Hits whose fused score is below this are dropped. The score is the index's
    /// distribution-based fusion: each retriever adds 0 (the bottom of what it found for the
    /// query) to about 1 (the top of it), so about 0.5 is an average candidate of one
    /// retriever and about 2 a row both ranked at the top.
    #[serde(default)]
    pub min_score: f64,
    /// The most tokens recalled rows may take.
    #[serde(default = "default_budget")]
    pub budget_tokens: u64,
}

fn default_k() -> usize {
    5
}

fn default_budget() -> u64 {
    1_000
}

impl RecallSpec {
    /// Checks the values; says which is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=20).contains(&self.k) {
            return Err(format!("k: must be 1–20, not {}", self.k));
        }
        const KINDS: [&str; 5] = ["prompt", "completion", "summary", "attachment", "file"];
        if let Some(bad) = self.kinds.iter().find(|k| !KINDS.contains(&k.as_str())) {
            return Err(format!(
                "kinds: unknown kind {bad:?} ({})",
                KINDS.join(", ")
            ));
        }
        if !self.min_score.is_finite() || !(0.0..=2.0).contains(&self.min_score) {
            return Err(format!(
                "min_score: must be 0–2 (a fused score: each retriever adds 0 to about 1), not {}",
                self.min_score
            ));
        }
        Ok(())
    }
}

/// What the harness asks the host to recall for a turn.
pub struct RecallRequest<'a> {
    pub spec: &'a RecallSpec,
    /// The turn's blocks so far (its inputs).
    pub blocks: &'a [Block],
    /// References of the rows the timeline holds.
    pub in_timeline: &'a HashSet<String>,
    /// Tokens the history, the system prompt and the turn's own input leave of the budget.
    pub available_tokens: u64,
    pub tokens: &'a TokenCounter,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_specs_say_which_field() {
        let spec = |text: &str| -> RecallSpec { toml::from_str(text).unwrap() };
        assert!(spec("k = 5").validate().is_ok());
        assert!(spec("k = 0").validate().unwrap_err().starts_with("k:"));
        assert!(spec("kinds = [\"email\"]")
            .validate()
            .unwrap_err()
            .starts_with("kinds:"));
        assert!(spec("min_score = -1.0")
            .validate()
            .unwrap_err()
            .starts_with("min_score:"));
        assert!(
            spec("min_score = 2.5").validate().is_err(),
            "off the fused scale"
        );
        assert!(toml::from_str::<RecallSpec>("colour = 1").is_err());
        assert_eq!(spec("scope = \"app\"").scope, RecallScope::App);
    }
}
