//! Snippets for hits: the content is read from where the hit's reference points (a turn-log
//! block, a hosted file, an attachment) through the resolver, as the caller — the index itself
//! holds no content.

use turnpike_resolver::Resolver;
use turnpike_schemas::{Block, Family, Identity, Reference};

use crate::types::Hit;

/// Characters of context in a snippet.
const SNIPPET_CHARS: usize = 240;

/// Fills each hit's snippet (hits whose content cannot be read keep none).
pub async fn hydrate(resolver: &Resolver, identity: &Identity, query: &str, hits: &mut [Hit]) {
    let reads = hits
        .iter()
        .map(|hit| resolver.resolve_str(identity, &hit.reference));
    let results = futures::future::join_all(reads).await;
    for (hit, result) in hits.iter_mut().zip(results) {
        let Ok(resolved) = result else { continue };
        let is_block = hit
            .reference
            .parse::<Reference>()
            .is_ok_and(|r| r.family() == &Family::turn_log());
        let text = if is_block {
            serde_json::from_slice::<Block>(&resolved.bytes)
                .ok()
                .and_then(|b| block_text(&b))
        } else {
            std::str::from_utf8(&resolved.bytes).ok().map(str::to_owned)
        };
        hit.snippet = text.map(|t| snippet(&t, query));
    }
}

fn block_text(block: &Block) -> Option<String> {
    match block {
        Block::UserMessage { text }
        | Block::FollowUp { text }
        | Block::Steer { text }
        | Block::AssistantMessage { text }
        | Block::Summary { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// A window of `text` around the first query word it contains (case-insensitive), or its
/// start; whitespace collapsed, `…` where it was cut.
pub fn snippet(text: &str, query: &str) -> String {
    let flat: Vec<char> = text
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .collect();
    let lower: Vec<char> = flat.iter().flat_map(|c| c.to_lowercase().take(1)).collect();
    let lower: String = lower.into_iter().collect();
    let found = query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 3)
        .filter_map(|w| {
            let w = w.to_lowercase();
            lower.find(&w).map(|byte| lower[..byte].chars().count())
        })
        .min();
    let start = found.map_or(0, |at| at.saturating_sub(SNIPPET_CHARS / 3));
    let end = (start + SNIPPET_CHARS).min(flat.len());
    let mut out = String::new();
    if start > 0 {
        out.push('…');
    }
    out.extend(&flat[start..end]);
    if end < flat.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snippet_centres_on_the_first_query_word_it_finds() {
        let text = format!(
            "{} the Turbine blade report {}",
            "x ".repeat(200),
            "y ".repeat(200)
        );
        let s = snippet(&text, "turbine blades");
        assert!(s.starts_with('…') && s.ends_with('…'), "{s}");
        assert!(s.contains("the Turbine blade report"), "{s}");
        assert!(s.chars().count() <= SNIPPET_CHARS + 2);
        assert_eq!(snippet("short text", "nothing"), "short text");
    }
}
