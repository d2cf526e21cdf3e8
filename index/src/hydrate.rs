//! Snippets for hits: the content is read from where the hit's reference points (a turn-log
//! block, a hosted file, an attachment) through the resolver, as the caller — the index itself
//! holds no content.

use std::collections::HashMap;
use turnpike_resolver::Resolver;

use turnpike_schemas::{Block, Family, Identity, RefPath, Reference, TurnLog};

use crate::error::Result;
use crate::types::{Hit, Page, Scope, SearchRequest};
use crate::Index;

/// Characters of context in a snippet.
const SNIPPET_CHARS: usize = 240;

/// [`Index::search`] with every hit's snippet filled, read as `identity`: what callers show.
pub async fn search(
    index: &Index,
    resolver: &Resolver,
    identity: &Identity,
    scope: &Scope,
    request: &SearchRequest,
) -> Result<Page> {
    let mut page = index.search(scope, request).await?;
    hydrate(resolver, identity, &request.text, &mut page.hits).await;
    Ok(page)
}

/// Where a hit's text is read from: one block of a turn log (read as the whole log, once per
/// turn however many of its blocks hit), or the referenced object itself.
enum Source {
    Block { log: String, index: usize },
    Whole(String),
}

fn source(reference: &str) -> Source {
    if let Ok(r) = reference.parse::<Reference>() {
        if r.family() == &Family::turn_log() {
            if let [blocks, i] = r.path().segments() {
                if let (true, Ok(index)) = (blocks == "blocks", i.parse::<usize>()) {
                    let path = RefPath::parse("log.json").expect("a valid path");
                    let log = Reference::new(Family::turn_log(), r.conversation(), r.turn(), path);
                    return Source::Block {
                        log: log.to_string(),
                        index,
                    };
                }
            }
        }
    }
    Source::Whole(reference.to_owned())
}

/// Fills each hit's snippet (hits whose content cannot be read keep none). Each object is read
/// once, however many hits point into it.
pub async fn hydrate(resolver: &Resolver, identity: &Identity, query: &str, hits: &mut [Hit]) {
    let sources: Vec<Source> = hits.iter().map(|h| source(&h.info.reference)).collect();
    let mut keys: Vec<&str> = sources
        .iter()
        .map(|s| match s {
            Source::Block { log, .. } => log.as_str(),
            Source::Whole(r) => r.as_str(),
        })
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let reads = keys.iter().map(|k| resolver.resolve_str(identity, k));
    let results = futures::future::join_all(reads).await;
    let read: HashMap<&str, bytes::Bytes> = keys
        .iter()
        .zip(results)
        .filter_map(|(key, result)| Some((*key, result.ok()?.bytes)))
        .collect();
    // Each turn log parsed once.
    let block_logs: std::collections::HashSet<&str> = sources
        .iter()
        .filter_map(|s| match s {
            Source::Block { log, .. } => Some(log.as_str()),
            Source::Whole(_) => None,
        })
        .collect();
    let logs: HashMap<&str, TurnLog> = block_logs
        .into_iter()
        .filter_map(|key| Some((key, serde_json::from_slice(read.get(key)?).ok()?)))
        .collect();
    for (hit, source) in hits.iter_mut().zip(&sources) {
        let text = match source {
            Source::Block { log, index } => logs
                .get(log.as_str())
                .and_then(|l| l.blocks.get(*index))
                .and_then(block_text),
            Source::Whole(r) => read
                .get(r.as_str())
                .and_then(|b| std::str::from_utf8(b).ok())
                .map(str::to_owned),
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
