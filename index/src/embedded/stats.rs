//! BM25 statistics of one scope: a word's rarity and the rows' average length are counted
//! over the caller's own rows only, so nothing another identity indexed shapes a score (and
//! no ranking betrays what others wrote).

use std::collections::HashMap;
use std::sync::Mutex;

use tantivy::collector::{Count, DocSetCollector};
use tantivy::query::Bm25StatisticsProvider;
use tantivy::query::{BooleanQuery, Occur, Query, TermQuery};
use tantivy::schema::{Field, IndexRecordOption};
use tantivy::{Searcher, Term};

/// [`Bm25StatisticsProvider`] over the documents carrying one scope term.
pub(super) struct ScopeStats<'a> {
    searcher: &'a Searcher,
    scope: Term,
    /// The scope's documents, by segment (counted once, for the token totals).
    docs: HashMap<u32, Vec<u32>>,
    /// Token totals by field: asked for by every scored term, counted once.
    tokens: Mutex<HashMap<Field, u64>>,
}

impl<'a> ScopeStats<'a> {
    pub(super) fn new(searcher: &'a Searcher, scope: Term) -> tantivy::Result<Self> {
        let found = searcher.search(&Self::term_query(&scope), &DocSetCollector)?;
        let mut docs: HashMap<u32, Vec<u32>> = HashMap::new();
        for address in found {
            docs.entry(address.segment_ord)
                .or_default()
                .push(address.doc_id);
        }
        Ok(Self {
            searcher,
            scope,
            docs,
            tokens: Mutex::default(),
        })
    }

    fn term_query(term: &Term) -> Box<dyn Query> {
        Box::new(TermQuery::new(term.clone(), IndexRecordOption::Basic))
    }
}

impl Bm25StatisticsProvider for ScopeStats<'_> {
    fn total_num_tokens(&self, field: Field) -> tantivy::Result<u64> {
        if let Some(&known) = self.tokens.lock().ok().as_ref().and_then(|t| t.get(&field)) {
            return Ok(known);
        }
        let mut total = 0u64;
        for (&segment, docs) in &self.docs {
            let norms = self
                .searcher
                .segment_reader(segment)
                .get_fieldnorms_reader(field)?;
            total += docs
                .iter()
                .map(|&d| u64::from(norms.fieldnorm(d)))
                .sum::<u64>();
        }
        if let Ok(mut known) = self.tokens.lock() {
            known.insert(field, total);
        }
        Ok(total)
    }

    fn total_num_docs(&self) -> tantivy::Result<u64> {
        Ok(self.docs.values().map(|d| d.len() as u64).sum())
    }

    fn doc_freq(&self, term: &Term) -> tantivy::Result<u64> {
        let both = BooleanQuery::new(vec![
            (Occur::Must, Self::term_query(&self.scope)),
            (Occur::Must, Self::term_query(term)),
        ]);
        Ok(self.searcher.search(&both, &Count)? as u64)
    }
}
