//! Reciprocal-rank fusion, the recency boost, the per-conversation cap and pagination: one
//! implementation for every backend, so both rank the same candidates the same way.

use std::collections::HashMap;

use turnpike_schemas::ConversationId;

use crate::types::{Candidate, Hit, Page, Recency, RetrieverScore, RowId, SearchRequest};

/// The RRF constant: a hit at rank r in one retriever contributes 1 / (K + r).
pub const RRF_K: f64 = 60.0;

/// Fuses the retrievers' ranked candidates into the page `request` asks for.
///
/// Contract: `lexical` and `vector` are each ranked best first (either may be empty). The fused
/// list is ordered by score, ties broken by the earlier best rank, then by id, so the order is
/// total and pages of the same request never overlap or skip.
pub fn fuse(lexical: Vec<Candidate>, vector: Vec<Candidate>, request: &SearchRequest) -> Page {
    let mut hits: HashMap<RowId, Hit> = HashMap::new();
    for (list, is_lexical) in [(lexical, true), (vector, false)] {
        for (i, c) in list.into_iter().enumerate() {
            let rank = i + 1;
            let retriever = RetrieverScore {
                rank,
                score: c.score,
            };
            let hit = hits.entry(c.info.id.clone()).or_insert_with(|| Hit {
                info: c.info,
                score: 0.0,
                lexical: None,
                vector: None,
                snippet: None,
            });
            hit.score += 1.0 / (RRF_K + rank as f64);
            if is_lexical {
                hit.lexical = Some(retriever);
            } else {
                hit.vector = Some(retriever);
            }
        }
    }
    let mut hits: Vec<Hit> = hits.into_values().collect();
    if let Some(recency) = request.recency {
        for hit in &mut hits {
            hit.score += boost(recency, hit.info.at_ms);
        }
    }
    let best_rank = |h: &Hit| {
        h.lexical
            .map(|s| s.rank)
            .into_iter()
            .chain(h.vector.map(|s| s.rank))
            .min()
            .unwrap_or(usize::MAX)
    };
    hits.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| best_rank(a).cmp(&best_rank(b)))
            .then_with(|| a.info.id.cmp(&b.info.id))
    });
    if let Some(cap) = request.per_conversation {
        let mut seen: HashMap<ConversationId, usize> = HashMap::new();
        hits.retain(|h| {
            let n = seen.entry(h.info.conversation).or_default();
            *n += 1;
            *n <= cap
        });
    }
    let total = hits.len();
    let page: Vec<Hit> = hits
        .into_iter()
        .skip(request.offset)
        .take(request.limit)
        .collect();
    let end = request.offset + page.len();
    Page {
        hits: page,
        next_offset: (end < total).then_some(end),
    }
}

/// The recency boost of a hit made at `at_ms`.
fn boost(recency: Recency, at_ms: i64) -> f64 {
    let age = (recency.now_ms - at_ms).max(0) as f64;
    let halves = age / recency.half_life_ms as f64;
    recency.weight * (0.5f64).powf(halves) / (RRF_K + 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Kind, RowInfo};
    use turnpike_schemas::TurnId;

    fn cand(id: &str, conversation: u8, at_ms: i64) -> Candidate {
        Candidate {
            info: RowInfo {
                id: RowId::new(id),
                app: "a".parse().unwrap(),
                agent: "g".parse().unwrap(),
                conversation: format!("conv_{conversation:026}").parse().unwrap(),
                turn: TurnId::FIRST,
                kind: Kind::Prompt,
                reference: format!("ref/{id}"),
                at_ms,
            },
            score: 1.0,
        }
    }

    fn ids(page: &Page) -> Vec<&str> {
        page.hits.iter().map(|h| h.info.id.as_str()).collect()
    }

    #[test]
    fn a_hit_both_retrievers_found_beats_hits_only_one_found() {
        let lexical = vec![cand("x", 1, 0), cand("both", 1, 0)];
        let vector = vec![cand("y", 1, 0), cand("both", 1, 0)];
        let page = fuse(lexical, vector, &SearchRequest::new("q"));
        // both: 1/62 + 1/62 > x: 1/61 = y: 1/61; x and y tie and fall back to id order.
        assert_eq!(ids(&page), ["both", "x", "y"]);
        let both = &page.hits[0];
        assert_eq!(both.lexical.unwrap().rank, 2);
        assert_eq!(both.vector.unwrap().rank, 2);
        assert!((both.score - 2.0 / 62.0).abs() < 1e-12);
    }

    #[test]
    fn pages_cover_the_list_once_and_the_cap_holds_per_conversation() {
        let lexical: Vec<Candidate> = (0..10)
            .map(|i| cand(&format!("r{i}"), (i % 2) as u8, 0))
            .collect();
        let mut request = SearchRequest::new("q");
        request.limit = 3;
        request.per_conversation = Some(4);
        let mut seen = Vec::new();
        loop {
            let page = fuse(lexical.clone(), vec![], &request);
            seen.extend(ids(&page).into_iter().map(String::from));
            match page.next_offset {
                Some(next) => request.offset = next,
                None => break,
            }
        }
        assert_eq!(
            seen,
            ["r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"],
            "four per conversation, in rank order, each once"
        );
    }

    #[test]
    fn recency_lifts_a_fresh_hit_over_a_slightly_better_old_one() {
        let lexical = vec![cand("old", 1, 0), cand("new", 1, 1_000_000)];
        let mut request = SearchRequest::new("q");
        assert_eq!(
            ids(&fuse(lexical.clone(), vec![], &request)),
            ["old", "new"]
        );
        request.recency = Some(Recency {
            half_life_ms: 10_000,
            weight: 1.0,
            now_ms: 1_000_000,
        });
        assert_eq!(ids(&fuse(lexical, vec![], &request)), ["new", "old"]);
    }
}
