//! Token accounting: a real tokenizer where an agent's manifest names one (a Hugging Face
//! `tokenizer.json` for the model family), else the documented estimate
//! ([`crate::timeline::estimate_tokens`]: four bytes per token plus four per message).

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use crate::message::Message;
use crate::timeline::estimate_tokens;

/// Counts the tokens of model messages.
#[derive(Clone, Default)]
pub enum TokenCounter {
    /// The estimate (no tokenizer configured).
    #[default]
    Estimate,
    /// A tokenizer for the model family.
    Tokenizer(Arc<tokenizers::Tokenizer>),
}

impl fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenCounter::Estimate => f.write_str("Estimate"),
            TokenCounter::Tokenizer(_) => f.write_str("Tokenizer"),
        }
    }
}

/// Tokens every message costs besides its text (role and framing), as in the estimate.
const PER_MESSAGE: u64 = 4;

impl TokenCounter {
    /// Loads a `tokenizer.json`.
    pub fn load(path: &Path) -> Result<Self, String> {
        let tokenizer = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| format!("cannot load the tokenizer {}: {e}", path.display()))?;
        Ok(TokenCounter::Tokenizer(Arc::new(tokenizer)))
    }

    /// Parses a tokenizer from its JSON.
    pub fn from_json(json: &str) -> Result<Self, String> {
        let tokenizer: tokenizers::Tokenizer =
            json.parse().map_err(|e| format!("not a tokenizer: {e}"))?;
        Ok(TokenCounter::Tokenizer(Arc::new(tokenizer)))
    }

    /// The tokens of one message.
    pub fn count(&self, message: &Message) -> u64 {
        let TokenCounter::Tokenizer(tokenizer) = self else {
            return estimate_tokens(message);
        };
        let mut text = message.content.clone();
        for call in &message.tool_calls {
            text.push(' ');
            text.push_str(&call.name);
            text.push(' ');
            text.push_str(&call.arguments.to_string());
        }
        match tokenizer.encode(text.as_str(), false) {
            Ok(encoding) => encoding.len() as u64 + PER_MESSAGE,
            // A tokenizer that fails on some text must not stop a turn: fall back.
            Err(_) => estimate_tokens(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Role;

    /// A word-level tokenizer: one token per whitespace-separated word.
    const WORDS: &str = r#"{
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "hello": 1}, "unk_token": "[UNK]"}
    }"#;

    #[test]
    fn a_configured_tokenizer_counts_its_own_tokens() {
        let counter = TokenCounter::from_json(WORDS).unwrap();
        let m = Message::new(Role::User, "hello there general kenobi");
        assert_eq!(counter.count(&m), 4 + PER_MESSAGE);
        // The estimate sees 26 bytes: 7 tokens.
        assert_eq!(TokenCounter::Estimate.count(&m), 7 + PER_MESSAGE);
        assert!(TokenCounter::from_json("{}").is_err());
    }
}
