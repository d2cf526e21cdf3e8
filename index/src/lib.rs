//! The hybrid index: one row per prompt, completion, summary, attachment or file, searchable by
//! words and by meaning at once, only ever by the identity it belongs to.
//!
//! It must not decide what a turn sees: it answers queries scoped to an identity; recall and the
//! `search` tool (the worker) decide what to ask.
//!
//! # Layout
//! - [`types`]: rows, scopes, filters, requests, hits
//! - [`analysis`]: the one analyzer, query syntax and BM25 both backends rank by
//! - [`backend`]: the [`Backend`] trait; [`postgres`] (pgvector, row-level security) and
//!   [`embedded`] (tantivy + an on-disk vector store) implement it
//! - [`fusion`]: distribution-based score fusion, recency, the per-conversation cap, pages —
//!   shared by every backend
//! - [`embed`]: the [`Embedder`] trait; all-MiniLM-L6-v2 in Rust, OpenAI-compatible endpoints
//! - [`indexer`]: turning finished turns into rows, idempotently, with retries
//! - [`hydrate`]: snippets for hits, read through the resolver as the caller
//! - [`eval`]: SMART-format test collections and nDCG/MAP, for `turnpike bench search`
//!
//! The book: `book/src/guides/search.md` (and `book/src/SUMMARY.md` for the rest).

pub mod analysis;
pub mod backend;
pub mod embed;
pub mod embedded;
pub mod error;
pub mod eval;
pub mod fusion;
pub mod hydrate;
pub mod indexer;
pub mod postgres;
pub mod types;

use std::sync::Arc;

pub use backend::Backend;
pub use embed::Embedder;
pub use error::{Error, ErrorKind, Result};
pub use types::{
    Candidate, Filters, Hit, IndexRow, Kind, Mode, Page, Recency, RetrieverScore, RowId, RowInfo,
    Scope, SearchRequest,
};

/// How many candidates each retriever contributes to the fused list. Pages reach at most this
/// deep; a fixed depth keeps every page of a request cut from the same fused list.
pub const CANDIDATE_DEPTH: usize = 200;

/// A backend and the embedder that fills it: what callers search and index through.
#[derive(Clone)]
pub struct Index {
    backend: Arc<dyn Backend>,
    embedder: Arc<dyn Embedder>,
}

impl Index {
    pub fn new(backend: Arc<dyn Backend>, embedder: Arc<dyn Embedder>) -> Self {
        Self { backend, embedder }
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    pub fn embedder(&self) -> &Arc<dyn Embedder> {
        &self.embedder
    }

    /// Embeds the rows' texts (rows that already carry an embedding keep it) and writes them.
    pub async fn write(&self, mut rows: Vec<IndexRow>) -> Result<()> {
        let missing: Vec<usize> = (0..rows.len())
            .filter(|&i| rows[i].embedding.is_empty())
            .collect();
        if !missing.is_empty() {
            let texts: Vec<String> = missing.iter().map(|&i| rows[i].text.clone()).collect();
            let vectors = self.embedder.embed(&texts).await?;
            for (i, v) in missing.into_iter().zip(vectors) {
                rows[i].embedding = v;
            }
        }
        self.backend.upsert(&rows).await
    }

    /// One page of `scope`'s hits for `request` (not hydrated: see [`hydrate`]).
    pub async fn search(&self, scope: &Scope, request: &SearchRequest) -> Result<Page> {
        request.validate()?;
        let embedding = match request.mode {
            Mode::Lexical => None,
            _ => self
                .embedder
                .embed(std::slice::from_ref(&request.text))
                .await?
                .pop(),
        };
        self.search_embedded(scope, request, embedding.as_deref())
            .await
    }

    /// [`Index::search`] with the query's embedding already made (`None` for lexical-only
    /// requests): for callers that embed in batches, and the benchmarks.
    pub async fn search_embedded(
        &self,
        scope: &Scope,
        request: &SearchRequest,
        embedding: Option<&[f32]>,
    ) -> Result<Page> {
        request.validate()?;
        let depth = CANDIDATE_DEPTH;
        let lexical = async {
            match request.mode {
                Mode::Vector => Ok(Vec::new()),
                _ => {
                    self.backend
                        .lexical(scope, &request.filters, &request.text, depth)
                        .await
                }
            }
        };
        let vector = async {
            match (request.mode, embedding) {
                (Mode::Lexical, _) => Ok(Vec::new()),
                (_, Some(embedding)) => {
                    self.backend
                        .vector(scope, &request.filters, embedding, depth)
                        .await
                }
                (_, None) => Err(Error::invalid(
                    "a vector search needs the query's embedding",
                )),
            }
        };
        let (lexical, vector) = futures::try_join!(lexical, vector)?;
        Ok(fusion::fuse(lexical, vector, request))
    }
}
