//! The embedded backend for `turnpike serve`: tantivy (BM25) for words and an on-disk vector
//! store (redb) for meaning, in one directory.
//!
//! The vector store is partitioned by scope: a row's key starts with its tenant and identity, so
//! a vector search reads only the caller's own rows and ranks them exactly (cosine). That is the
//! isolation wall here — a query cannot reach another identity's partition — and it makes search
//! cost grow with one user's rows, not the whole index's. (An approximate graph index would pay
//! off only for single users with hundreds of thousands of rows; see the closing note's numbers.)
//!
//! Text is indexed with the analyzer of [`crate::analysis`] (the Postgres backend's too) and
//! never stored. (Indexes made before it, in `text/`, are dropped at open and their rows
//! written again: their conversations' marks go, so the indexer's catch-up rewrites them.)

use std::ops::Bound;
use std::path::Path;
use std::sync::{Arc, Mutex};

mod stats;

use async_trait::async_trait;
use redb::{Database, ReadableDatabase as _, ReadableTable as _, TableDefinition};
use tantivy::collector::TopDocs;
use tantivy::query::{
    BooleanQuery, BoostQuery, ConstScoreQuery, Occur, Query, RangeQuery, TermQuery,
};
use tantivy::schema::{
    Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions, Value as _, FAST, INDEXED,
    STORED, STRING,
};
use tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, TantivyDocument, Term};

use crate::backend::Backend;
use crate::error::{Error, ErrorKind, Result};
use turnpike_schemas::{ConversationId, TurnId};

use crate::types::{Candidate, Filters, IndexRow, RowId, RowInfo, Scope};

/// The vector store's page cache.
const VECTOR_CACHE_BYTES: usize = 64 << 20;
const VECTORS: TableDefinition<&str, &[u8]> = TableDefinition::new("vectors");
const MARKS: TableDefinition<&str, u64> = TableDefinition::new("marks");

/// The embedded index in a directory (created if missing).
pub struct EmbeddedIndex {
    inner: Arc<Inner>,
}

struct Inner {
    reader: IndexReader,
    writer: Mutex<IndexWriter>,
    fields: Fields,
    vectors: Database,
}

#[derive(Clone, Copy)]
struct Fields {
    id: Field,
    scope: Field,
    app: Field,
    agent: Field,
    conversation: Field,
    kind: Field,
    reference: Field,
    turn: Field,
    at_ms: Field,
    text: Field,
}

fn schema() -> (Schema, Fields) {
    let mut b = Schema::builder();
    let tokenized = |tokenizer: &str| {
        TextOptions::default().set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer(tokenizer)
                .set_index_option(IndexRecordOption::WithFreqsAndPositions),
        )
    };
    let fields = Fields {
        id: b.add_text_field("id", STRING | STORED),
        scope: b.add_text_field("scope", STRING),
        app: b.add_text_field("app", STRING | STORED),
        agent: b.add_text_field("agent", STRING | STORED),
        conversation: b.add_text_field("conversation", STRING | STORED),
        kind: b.add_text_field("kind", STRING | STORED),
        reference: b.add_text_field("reference", STORED),
        turn: b.add_u64_field("turn", STORED),
        at_ms: b.add_i64_field("at_ms", INDEXED | STORED | FAST),
        text: b.add_text_field("text", tokenized(crate::analysis::TOKENIZER)),
    };
    (b.build(), fields)
}

/// A row's key in the vector store: the scope first, so one scope's rows are one key range.
fn scope_key(scope: &Scope) -> String {
    format!("{}\u{1f}{}", scope.tenant, scope.identity)
}

/// One scope's keys in the vector store and the marks: everything after `scope_key` and `\0`.
fn scope_range(scope: &Scope) -> std::ops::Range<String> {
    let key = scope_key(scope);
    format!("{key}\u{0}")..format!("{key}\u{1}")
}

fn vector_key(scope: &Scope, id: &RowId) -> String {
    format!("{}\u{0}{id}", scope_key(scope))
}

fn encode(row: &IndexRow) -> Vec<u8> {
    // What the vector store keeps beside each embedding: the row's info.
    let meta = serde_json::to_vec(&row.info).expect("row info serialises");
    let mut out = Vec::with_capacity(4 + meta.len() + 4 * row.embedding.len());
    out.extend_from_slice(&(meta.len() as u32).to_le_bytes());
    out.extend_from_slice(&meta);
    for x in &row.embedding {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

fn decode_meta(bytes: &[u8]) -> Result<(RowInfo, &[u8])> {
    let corrupt = || Error::new(ErrorKind::Corrupt, "a vector-store entry is unreadable");
    let len = bytes
        .get(..4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
        .ok_or_else(corrupt)?;
    let meta = bytes.get(4..4 + len).ok_or_else(corrupt)?;
    let meta: RowInfo = serde_json::from_slice(meta).map_err(|_| corrupt())?;
    Ok((meta, &bytes[4 + len..]))
}

/// Cosine similarity of `query` (unit length) with the little-endian f32s in `stored`; `None`
/// if the dimensions differ (a row from another embedder).
fn cosine(query: &[f32], stored: &[u8]) -> Option<f64> {
    if stored.len() != 4 * query.len() {
        return None;
    }
    let (mut dot, mut norm) = (0f32, 0f32);
    for (q, chunk) in query.iter().zip(stored.chunks_exact(4)) {
        let x = f32::from_le_bytes(chunk.try_into().expect("4 bytes"));
        dot += q * x;
        norm += x * x;
    }
    (norm > 0.0).then(|| f64::from(dot / norm.sqrt()))
}

fn tantivy_error(what: &str) -> impl Fn(tantivy::TantivyError) -> Error + '_ {
    move |e| Error::unavailable(what, e)
}

fn db<E: Into<redb::Error>>(what: &str) -> impl Fn(E) -> Error + '_ {
    move |e| Error::unavailable(what, e.into())
}

impl EmbeddedIndex {
    /// Opens (or creates) the index under `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        let text_dir = dir.join("text2");
        // The index from before one analyzer: its rows are written again (see the module's doc).
        let before = dir.join("text");
        // Until the old directory is gone the rewrite is not done: an open that failed after
        // creating the new one (a lock held, a crash) clears the marks again next time.
        let rewrite = before.is_dir();
        std::fs::create_dir_all(&text_dir)
            .map_err(|e| Error::unavailable(&format!("creating {}", text_dir.display()), e))?;
        let (schema, fields) = schema();
        let directory = tantivy::directory::MmapDirectory::open(&text_dir)
            .map_err(|e| Error::unavailable("opening the text index", e))?;
        let index = Index::open_or_create(directory, schema)
            .map_err(tantivy_error("opening the text index"))?;
        index
            .tokenizers()
            .register(crate::analysis::TOKENIZER, crate::analysis::analyzer());
        let writer = index
            .writer_with_num_threads(1, 64_000_000)
            .map_err(tantivy_error("opening the text index for writing"))?;
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()
            .map_err(tantivy_error("reading the text index"))?;
        // redb's default page cache (1 GiB) keeps every page written in memory until full:
        // memory that grew with every indexed row. Past this bound, pages are read from the
        // file (the kernel's page cache, which it can reclaim).
        let vectors = redb::Builder::new()
            .set_cache_size(VECTOR_CACHE_BYTES)
            .create(dir.join("vectors.redb"))
            .map_err(db("opening the vector store"))?;
        let txn = vectors
            .begin_write()
            .map_err(db("opening the vector store"))?;
        txn.open_table(VECTORS)
            .map_err(db("opening the vector store"))?;
        {
            let mut marks = txn
                .open_table(MARKS)
                .map_err(db("opening the vector store"))?;
            if rewrite {
                marks
                    .retain(|_, _| false)
                    .map_err(db("forgetting the marks"))?;
            }
        }
        txn.commit().map_err(db("opening the vector store"))?;
        if rewrite {
            std::fs::remove_dir_all(&before)
                .map_err(|e| Error::unavailable(&format!("removing {}", before.display()), e))?;
        }
        Ok(Self {
            inner: Arc::new(Inner {
                reader,
                writer: Mutex::new(writer),
                fields,
                vectors,
            }),
        })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| Error::new(ErrorKind::Unavailable, format!("an index task failed: {e}")))?
    }
}

impl Inner {
    /// Calls `each` with the info and stored vector of every row of `scope` that `filters`
    /// admit, in key order, from one read of the vector store (`what` names it in errors).
    fn each_admitted(
        &self,
        scope: &Scope,
        filters: &Filters,
        what: &str,
        mut each: impl FnMut(RowInfo, &[u8]),
    ) -> Result<()> {
        let txn = self.vectors.begin_read().map_err(db(what))?;
        let table = txn.open_table(VECTORS).map_err(db(what))?;
        let range = scope_range(scope);
        for entry in table
            .range(range.start.as_str()..range.end.as_str())
            .map_err(db(what))?
        {
            let (_, value) = entry.map_err(db(what))?;
            let (meta, vector) = decode_meta(value.value())?;
            if filters.admits(&meta) {
                each(meta, vector);
            }
        }
        Ok(())
    }

    fn filter_queries(&self, scope: &Scope, filters: &Filters) -> Vec<(Occur, Box<dyn Query>)> {
        let f = self.fields;
        let term = |field: Field, value: &str| -> Box<dyn Query> {
            Box::new(TermQuery::new(
                Term::from_field_text(field, value),
                IndexRecordOption::Basic,
            ))
        };
        let mut clauses = vec![(Occur::Must, term(f.scope, &scope_key(scope)))];
        for (field, value) in [
            (f.app, filters.app.as_ref().map(ToString::to_string)),
            (f.agent, filters.agent.as_ref().map(ToString::to_string)),
            (f.conversation, filters.conversation.map(|c| c.to_string())),
        ] {
            if let Some(value) = value {
                clauses.push((Occur::Must, term(field, &value)));
            }
        }
        if !filters.kinds.is_empty() {
            let any: Vec<(Occur, Box<dyn Query>)> = filters
                .kinds
                .iter()
                .map(|k| (Occur::Should, term(f.kind, k.as_str())))
                .collect();
            clauses.push((Occur::Must, Box::new(BooleanQuery::new(any))));
        }
        if filters.since_ms.is_some() || filters.until_ms.is_some() {
            let lower = filters.since_ms.map_or(Bound::Unbounded, |s| {
                Bound::Included(Term::from_field_i64(f.at_ms, s))
            });
            let upper = filters.until_ms.map_or(Bound::Unbounded, |u| {
                Bound::Excluded(Term::from_field_i64(f.at_ms, u))
            });
            clauses.push((Occur::Must, Box::new(RangeQuery::new(lower, upper))));
        }
        clauses
    }

    fn candidate(&self, doc: &TantivyDocument, score: f64) -> Result<Candidate> {
        let f = self.fields;
        let corrupt = || Error::new(ErrorKind::Corrupt, "a text-index document is unreadable");
        let text = |field: Field| {
            doc.get_first(field)
                .and_then(|v| v.as_str())
                .map(str::to_owned)
                .ok_or_else(corrupt)
        };
        Ok(Candidate {
            info: RowInfo {
                id: RowId::new(text(f.id)?),
                app: text(f.app)?.parse().map_err(|_| corrupt())?,
                agent: text(f.agent)?.parse().map_err(|_| corrupt())?,
                conversation: text(f.conversation)?.parse().map_err(|_| corrupt())?,
                turn: doc
                    .get_first(f.turn)
                    .and_then(|v| v.as_u64())
                    .and_then(TurnId::new)
                    .ok_or_else(corrupt)?,
                kind: text(f.kind)?.parse()?,
                reference: text(f.reference)?,
                at_ms: doc
                    .get_first(f.at_ms)
                    .and_then(|v| v.as_i64())
                    .ok_or_else(corrupt)?,
            },
            score,
        })
    }
}

#[async_trait]
impl Backend for EmbeddedIndex {
    fn name(&self) -> &'static str {
        "embedded"
    }

    async fn upsert(&self, rows: &[IndexRow]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let rows = rows.to_vec();
        self.blocking(move |inner| {
            let f = inner.fields;
            // Vectors first: a crash between the two leaves a row findable by meaning only,
            // and the retry (same ids) completes it.
            let txn = inner.vectors.begin_write().map_err(db("writing vectors"))?;
            {
                let mut table = txn.open_table(VECTORS).map_err(db("writing vectors"))?;
                for row in &rows {
                    table
                        .insert(
                            vector_key(&row.scope, &row.info.id).as_str(),
                            encode(row).as_slice(),
                        )
                        .map_err(db("writing vectors"))?;
                }
            }
            txn.commit().map_err(db("writing vectors"))?;
            let mut writer = inner.writer.lock().expect("index writer lock");
            for row in &rows {
                let info = &row.info;
                writer.delete_term(Term::from_field_text(f.id, info.id.as_str()));
                let mut doc = TantivyDocument::default();
                doc.add_text(f.id, info.id.as_str());
                doc.add_text(f.scope, scope_key(&row.scope));
                doc.add_text(f.app, info.app.as_str());
                doc.add_text(f.agent, info.agent.as_str());
                doc.add_text(f.conversation, info.conversation.to_string());
                doc.add_text(f.kind, info.kind.as_str());
                doc.add_text(f.reference, &info.reference);
                doc.add_u64(f.turn, info.turn.number());
                doc.add_i64(f.at_ms, info.at_ms);
                doc.add_text(f.text, crate::analysis::truncated(&row.text));
                writer
                    .add_document(doc)
                    .map_err(tantivy_error("indexing text"))?;
            }
            writer.commit().map_err(tantivy_error("committing text"))?;
            drop(writer);
            inner
                .reader
                .reload()
                .map_err(tantivy_error("reloading the text index"))?;
            Ok(())
        })
        .await
    }

    async fn lexical(
        &self,
        scope: &Scope,
        filters: &Filters,
        text: &str,
        k: usize,
    ) -> Result<Vec<Candidate>> {
        let query = crate::analysis::Query::parse(text);
        if query.is_empty() {
            return Ok(Vec::new());
        }
        let (scope, filters) = (scope.clone(), filters.clone());
        self.blocking(move |inner| {
            let f = inner.fields;
            let term = |t: &str| Term::from_field_text(f.text, t);
            // The ranked terms, any of them, each weighted by how often the query says it.
            let words: Vec<(Occur, Box<dyn Query>)> = query
                .ranked
                .iter()
                .map(|(t, n)| {
                    let scored = TermQuery::new(term(t), IndexRecordOption::WithFreqs);
                    (
                        Occur::Should,
                        Box::new(BoostQuery::new(Box::new(scored), *n as f32)) as Box<dyn Query>,
                    )
                })
                .collect();
            // Filters and required terms admit, excluded terms refuse: none adds to a score.
            let unscored =
                |q: Box<dyn Query>| Box::new(ConstScoreQuery::new(q, 0.0)) as Box<dyn Query>;
            let mut clauses: Vec<(Occur, Box<dyn Query>)> = inner
                .filter_queries(&scope, &filters)
                .into_iter()
                .map(|(occur, q)| (occur, unscored(q)))
                .collect();
            clauses.push((Occur::Must, Box::new(BooleanQuery::new(words))));
            for t in &query.required {
                let q = Box::new(TermQuery::new(term(t), IndexRecordOption::Basic));
                clauses.push((Occur::Must, unscored(q)));
            }
            for t in &query.excluded {
                let q = Box::new(TermQuery::new(term(t), IndexRecordOption::Basic));
                clauses.push((Occur::MustNot, q));
            }
            let query = BooleanQuery::new(clauses);
            let searcher = inner.reader.searcher();
            let stats = stats::ScopeStats::new(
                &searcher,
                Term::from_field_text(f.scope, &scope_key(&scope)),
            )
            .map_err(tantivy_error("counting the scope's statistics"))?;
            let top = searcher
                .search_with_statistics_provider(&query, &TopDocs::with_limit(k.max(1)), &stats)
                .map_err(tantivy_error("searching text"))?;
            let mut found = top
                .into_iter()
                .map(|(score, address)| {
                    let doc: TantivyDocument = searcher
                        .doc(address)
                        .map_err(tantivy_error("reading a text hit"))?;
                    inner.candidate(&doc, f64::from(score))
                })
                .collect::<Result<Vec<_>>>()?;
            // Ties in id order, as the Postgres backend breaks them.
            found.sort_by(|a, b| {
                b.score
                    .total_cmp(&a.score)
                    .then_with(|| a.info.id.cmp(&b.info.id))
            });
            Ok(found)
        })
        .await
    }

    async fn vector(
        &self,
        scope: &Scope,
        filters: &Filters,
        embedding: &[f32],
        k: usize,
    ) -> Result<Vec<Candidate>> {
        let (scope, filters) = (scope.clone(), filters.clone());
        let query = crate::embed::normalized(embedding.to_vec());
        self.blocking(move |inner| {
            let mut scored: Vec<(f64, RowInfo)> = Vec::new();
            inner.each_admitted(&scope, &filters, "reading vectors", |meta, vector| {
                if let Some(score) = cosine(&query, vector) {
                    scored.push((score, meta));
                }
            })?;
            let k = k.max(1);
            let order = |a: &(f64, RowInfo), b: &(f64, RowInfo)| {
                b.0.total_cmp(&a.0).then_with(|| a.1.id.cmp(&b.1.id))
            };
            if scored.len() > k {
                scored.select_nth_unstable_by(k - 1, order);
                scored.truncate(k);
            }
            scored.sort_by(order);
            Ok(scored
                .into_iter()
                .map(|(score, info)| Candidate { info, score })
                .collect())
        })
        .await
    }

    async fn mark(&self, scope: &Scope, conversation: ConversationId) -> Result<Option<TurnId>> {
        let key = format!("{}\u{0}{conversation}", scope_key(scope));
        self.blocking(move |inner| {
            let txn = inner.vectors.begin_read().map_err(db("reading marks"))?;
            let table = txn.open_table(MARKS).map_err(db("reading marks"))?;
            Ok(table
                .get(key.as_str())
                .map_err(db("reading marks"))?
                .and_then(|v| TurnId::new(v.value())))
        })
        .await
    }

    async fn set_mark(
        &self,
        scope: &Scope,
        conversation: ConversationId,
        turn: TurnId,
    ) -> Result<()> {
        let turn = turn.number();
        let key = format!("{}\u{0}{conversation}", scope_key(scope));
        self.blocking(move |inner| {
            let txn = inner.vectors.begin_write().map_err(db("writing marks"))?;
            {
                let mut table = txn.open_table(MARKS).map_err(db("writing marks"))?;
                let current = table
                    .get(key.as_str())
                    .map_err(db("writing marks"))?
                    .map(|v| v.value());
                if current.is_none_or(|c| c < turn) {
                    table
                        .insert(key.as_str(), turn)
                        .map_err(db("writing marks"))?;
                }
            }
            txn.commit().map_err(db("writing marks"))
        })
        .await
    }

    async fn count(&self, scope: &Scope) -> Result<u64> {
        let scope = scope.clone();
        self.blocking(move |inner| {
            let txn = inner.vectors.begin_read().map_err(db("reading vectors"))?;
            let table = txn.open_table(VECTORS).map_err(db("reading vectors"))?;
            let range = scope_range(&scope);
            let mut n = 0;
            for entry in table
                .range(range.start.as_str()..range.end.as_str())
                .map_err(db("reading vectors"))?
            {
                entry.map_err(db("reading vectors"))?;
                n += 1;
            }
            Ok(n)
        })
        .await
    }

    async fn forget(&self, scope: &Scope) -> Result<u64> {
        let scope = scope.clone();
        self.blocking(move |inner| {
            let range = scope_range(&scope);
            let (start, end) = (range.start.as_str(), range.end.as_str());
            let txn = inner.vectors.begin_write().map_err(db("forgetting rows"))?;
            let n = {
                let mut table = txn.open_table(VECTORS).map_err(db("forgetting rows"))?;
                let n = table
                    .extract_from_if(start..end, |_, _| true)
                    .map_err(db("forgetting rows"))?
                    .count() as u64;
                let mut marks = txn.open_table(MARKS).map_err(db("forgetting rows"))?;
                marks
                    .retain_in(start..end, |_, _| false)
                    .map_err(db("forgetting rows"))?;
                n
            };
            txn.commit().map_err(db("forgetting rows"))?;
            let mut writer = inner.writer.lock().expect("index writer lock");
            writer.delete_term(Term::from_field_text(
                inner.fields.scope,
                &scope_key(&scope),
            ));
            writer.commit().map_err(tantivy_error("forgetting text"))?;
            drop(writer);
            inner
                .reader
                .reload()
                .map_err(tantivy_error("reloading the text index"))?;
            Ok(n)
        })
        .await
    }

    async fn drop_mark(&self, scope: &Scope, conversation: ConversationId) -> Result<()> {
        let key = format!("{}\u{0}{conversation}", scope_key(scope));
        self.blocking(move |inner| {
            let txn = inner.vectors.begin_write().map_err(db("dropping a mark"))?;
            {
                let mut table = txn.open_table(MARKS).map_err(db("dropping a mark"))?;
                table.remove(key.as_str()).map_err(db("dropping a mark"))?;
            }
            txn.commit().map_err(db("dropping a mark"))
        })
        .await
    }

    async fn list(
        &self,
        scope: &Scope,
        filters: &Filters,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<RowInfo>> {
        let (scope, filters) = (scope.clone(), filters.clone());
        self.blocking(move |inner| {
            let mut rows = Vec::new();
            inner.each_admitted(&scope, &filters, "reading vectors", |meta, _| {
                rows.push(meta)
            })?;
            rows.sort_by(|a, b| b.at_ms.cmp(&a.at_ms).then_with(|| a.id.cmp(&b.id)));
            Ok(rows.into_iter().skip(offset).take(limit).collect())
        })
        .await
    }

    async fn delete(&self, scope: &Scope, filters: &Filters, ids: Option<&[RowId]>) -> Result<u64> {
        let (scope, filters) = (scope.clone(), filters.clone());
        let ids: Option<std::collections::HashSet<RowId>> =
            ids.map(|ids| ids.iter().cloned().collect());
        self.blocking(move |inner| {
            // The vector store says which rows are this scope's. Their text goes first, then
            // their vectors: a deletion cut short between the two is found again, whole, by
            // its retry (never text left behind that no vector points at).
            let mut gone: Vec<RowId> = Vec::new();
            inner.each_admitted(&scope, &filters, "deleting rows", |meta, _| {
                if ids.as_ref().is_none_or(|ids| ids.contains(&meta.id)) {
                    gone.push(meta.id);
                }
            })?;
            if gone.is_empty() {
                return Ok(0);
            }
            let mut writer = inner.writer.lock().expect("index writer lock");
            for id in &gone {
                writer.delete_term(Term::from_field_text(inner.fields.id, id.as_str()));
            }
            writer.commit().map_err(tantivy_error("deleting text"))?;
            drop(writer);
            inner
                .reader
                .reload()
                .map_err(tantivy_error("reloading the text index"))?;
            let txn = inner.vectors.begin_write().map_err(db("deleting rows"))?;
            {
                let mut table = txn.open_table(VECTORS).map_err(db("deleting rows"))?;
                for id in &gone {
                    table
                        .remove(vector_key(&scope, id).as_str())
                        .map_err(db("deleting rows"))?;
                }
            }
            txn.commit().map_err(db("deleting rows"))?;
            Ok(gone.len() as u64)
        })
        .await
    }
}
