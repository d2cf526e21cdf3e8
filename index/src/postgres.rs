//! The Postgres backend: pgvector (HNSW, cosine) and full text (GIN over a tsvector built with
//! the `english` and `simple` configurations), with row-level security as a second wall.
//!
//! Every statement runs in a transaction bound to one scope: `SET LOCAL ROLE turnpike_scoped`
//! (neither the tables' owner nor a superuser, so the policies apply) and the session settings
//! `turnpike.tenant` / `turnpike.identity`, which the policies compare each row with. The
//! queries also name the scope in their `WHERE` clause — the first wall, and what lets the
//! planner use the scope index.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use pgvector::Vector;
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions as _, Postgres, QueryBuilder, Row as _, Transaction};

use crate::backend::Backend;
use crate::error::{Error, ErrorKind, Result};
use turnpike_schemas::{ConversationId, TurnId};

use crate::types::{Candidate, Filters, IndexRow, RowId, RowInfo, Scope};

/// The schema, in order; applied by [`PgIndex::connect`].
#[derive(Debug)]
struct Migrations;

impl MigrationSource<'static> for Migrations {
    fn resolve(self) -> BoxFuture<'static, Result<Vec<Migration>, sqlx::error::BoxDynError>> {
        Box::pin(async {
            Ok(vec![
                Migration::new(
                    1,
                    Cow::Borrowed("index"),
                    MigrationType::Simple,
                    Cow::Borrowed(include_str!("../migrations/0001_index.sql")),
                    false,
                ),
                Migration::new(
                    2,
                    Cow::Borrowed("scope statistics"),
                    MigrationType::Simple,
                    Cow::Borrowed(include_str!("../migrations/0002_scope_stats.sql")),
                    false,
                ),
                Migration::new(
                    3,
                    Cow::Borrowed("one analyzer"),
                    MigrationType::Simple,
                    Cow::Borrowed(include_str!("../migrations/0003_one_analyzer.sql")),
                    false,
                ),
            ])
        })
    }
}

use crate::analysis::{self, B, K1};

/// The index in Postgres.
#[derive(Clone)]
pub struct PgIndex {
    pool: PgPool,
    dimension: usize,
    /// Whether queries name the scope in `WHERE` (always, except in the test that proves the
    /// policies alone keep identities apart).
    scope_clause: bool,
    /// While a bulk load runs: the connection holding the vector index's lock (see
    /// [`Backend::begin_bulk`]).
    bulk: Arc<tokio::sync::Mutex<Option<PoolConnection<Postgres>>>>,
    /// `maintenance_work_mem` for building the vector index, in MiB (default: the server's).
    build_memory_mib: Option<u32>,
}

/// The advisory lock key under which the vector index is created or set aside: a worker
/// opening the index and a bulk load never do both at once.
const VECTOR_INDEX_LOCK: i64 = 7_370_726;

/// Batches of at least this many rows (a rebuild's) go in with `COPY` through a staging table;
/// smaller ones (a turn's rows) with one `INSERT`. Both write the same rows.
const COPY_ROWS: usize = 256;

fn pg(what: &str) -> impl Fn(sqlx::Error) -> Error + '_ {
    move |e| Error::unavailable(what, e)
}

impl PgIndex {
    /// Connects, applies the migrations, and makes sure the vector index for `dimension`
    /// exists.
    pub async fn connect(url: &str, dimension: usize) -> Result<Self> {
        if !(1..=16_000).contains(&dimension) {
            return Err(Error::invalid(format!(
                "embedding dimension {dimension} is out of range (1..=16000)"
            )));
        }
        let options: PgConnectOptions = url
            .parse()
            .map_err(|e| Error::invalid(format!("the database URL is not valid: {e}")))?;
        // Statements carry row texts and vectors: never log them.
        let options = options.disable_statement_logging();
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await
            .map_err(pg("connecting to Postgres"))?;
        let migrator = Migrator::new(Migrations)
            .await
            .map_err(|e| Error::unavailable("reading the index migrations", e))?;
        migrator
            .run(&pool)
            .await
            .map_err(|e| Error::unavailable("migrating the index schema", e))?;
        // One partial HNSW index per dimension in use; the expression and predicate match the
        // vector query's, so the planner can use it. Missing (a fresh database, a dimension new
        // here) or left invalid (a build that died), it is built without blocking writes: here
        // while the table is small, in the background when it is not, so a worker starting
        // next to a million rows is not held up.
        let valid = vector_index_state(&pool, dimension).await?;
        if valid != Some(true) {
            let small: bool =
                sqlx::query_scalar("SELECT pg_relation_size('index_rows') < 64 * 1024 * 1024")
                    .fetch_one(&pool)
                    .await
                    .map_err(pg("sizing the index"))?;
            if small {
                ensure_vector_index(&pool, dimension, None).await?;
            } else {
                let pool = pool.clone();
                tokio::spawn(async move {
                    if let Err(e) = ensure_vector_index(&pool, dimension, None).await {
                        tracing::warn!(error = %e, "building the vector index");
                    }
                });
            }
        }
        Ok(Self {
            pool,
            dimension,
            scope_clause: true,
            bulk: Arc::default(),
            build_memory_mib: None,
        })
    }

    /// The same index with the scope left out of every query's `WHERE` clause: only the
    /// row-level security policies keep identities apart. For the test that proves they do.
    #[doc(hidden)]
    pub fn without_scope_clause(&self) -> Self {
        Self {
            scope_clause: false,
            ..self.clone()
        }
    }

    /// `maintenance_work_mem` for building the vector index after a bulk load (default: the
    /// server's, which operators set with `ALTER ROLE … SET maintenance_work_mem`). The graph
    /// of a million 384-d rows takes about 2 GiB; a build that does not fit goes on, much
    /// slower, on disk. A parallel build reserves all of it in shared memory (`/dev/shm` must
    /// hold it); when that fails the build is retried without parallel workers.
    pub fn with_build_memory(self, mib: u32) -> Self {
        Self {
            build_memory_mib: Some(mib.max(64)),
            ..self
        }
    }

    /// Whether the vector index for this dimension is there and valid (`None`: not there; a
    /// bulk load has it set aside, or a build failed and the next open makes it again).
    pub async fn vector_index_valid(&self) -> Result<Option<bool>> {
        vector_index_state(&self.pool, self.dimension).await
    }

    /// The kept statistics of `scope`: (rows, total length in words as stored), what BM25
    /// reads.
    pub async fn scope_stats(&self, scope: &Scope) -> Result<(i64, i64)> {
        let mut tx = self.scoped(scope).await?;
        let mut q = QueryBuilder::<Postgres>::new(
            "SELECT coalesce(sum(rows), 0)::int8, coalesce(sum(words), 0)::int8 \
             FROM index_scope_stats",
        );
        self.push_scope(&mut q, scope);
        let found: (i64, i64) = q
            .build_query_as()
            .fetch_one(&mut *tx)
            .await
            .map_err(pg("reading index statistics"))?;
        tx.commit().await.map_err(pg("reading index statistics"))?;
        Ok(found)
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Refreshes the planner's statistics (autovacuum does this over time; after a bulk load
    /// the planner otherwise cannot tell a selective scope from a common word).
    pub async fn analyze(&self) -> Result<()> {
        sqlx::query("ANALYZE index_rows")
            .execute(&self.pool)
            .await
            .map_err(pg("analysing the index"))?;
        Ok(())
    }

    /// A transaction bound to `scope` (the policies see only its rows).
    async fn scoped(&self, scope: &Scope) -> Result<Transaction<'static, Postgres>> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(pg("starting a transaction"))?;
        sqlx::query("SET LOCAL ROLE turnpike_scoped")
            .execute(&mut *tx)
            .await
            .map_err(pg("binding the session"))?;
        rebind(&mut tx, scope).await?;
        Ok(tx)
    }

    fn push_scope(&self, q: &mut QueryBuilder<'_, Postgres>, scope: &Scope) {
        q.push(" WHERE TRUE");
        if self.scope_clause {
            q.push(" AND tenant = ")
                .push_bind(scope.tenant.to_string())
                .push(" AND owner = ")
                .push_bind(scope.identity.to_string());
        }
    }

    fn push_scope_and_filters(
        &self,
        q: &mut QueryBuilder<'_, Postgres>,
        scope: &Scope,
        filters: &Filters,
    ) {
        self.push_scope(q, scope);
        for (column, value) in [
            ("app", filters.app.as_ref().map(ToString::to_string)),
            ("agent", filters.agent.as_ref().map(ToString::to_string)),
            ("conversation", filters.conversation.map(|c| c.to_string())),
        ] {
            if let Some(value) = value {
                q.push(format!(" AND {column} = ")).push_bind(value);
            }
        }
        if !filters.kinds.is_empty() {
            let kinds: Vec<String> = filters.kinds.iter().map(|k| k.as_str().into()).collect();
            q.push(" AND kind = ANY(").push_bind(kinds).push(")");
        }
        if let Some(since) = filters.since_ms {
            q.push(" AND at_ms >= ").push_bind(since);
        }
        if let Some(until) = filters.until_ms {
            q.push(" AND at_ms < ").push_bind(until);
        }
    }
}

/// Binds the transaction to `scope` (from here on the policies see only its rows).
async fn rebind(tx: &mut Transaction<'static, Postgres>, scope: &Scope) -> Result<()> {
    sqlx::query(
        "SELECT set_config('turnpike.tenant', $1, true), set_config('turnpike.identity', $2, true)",
    )
    .bind(scope.tenant.as_str())
    .bind(scope.identity.to_string())
    .execute(&mut **tx)
    .await
    .map_err(pg("binding the session"))?;
    Ok(())
}

const COLUMNS: &str = "id, app, agent, conversation, turn, kind, reference, at_ms";

fn candidate(row: &sqlx::postgres::PgRow) -> Result<Candidate> {
    let get = |e: sqlx::Error| Error::with_source(ErrorKind::Corrupt, "reading an index row", e);
    let text = |column: &str| row.try_get::<String, _>(column).map_err(get);
    let corrupt = |column: &'static str| {
        move |e: turnpike_schemas::SchemaError| {
            Error::with_source(ErrorKind::Corrupt, format!("an index row's {column}"), e)
        }
    };
    let turn: i64 = row.try_get("turn").map_err(get)?;
    Ok(Candidate {
        info: RowInfo {
            id: RowId::new(text("id")?),
            app: text("app")?.parse().map_err(corrupt("app"))?,
            agent: text("agent")?.parse().map_err(corrupt("agent"))?,
            conversation: text("conversation")?
                .parse()
                .map_err(corrupt("conversation"))?,
            turn: u64::try_from(turn)
                .ok()
                .and_then(TurnId::new)
                .ok_or_else(|| Error::new(ErrorKind::Corrupt, "an index row's turn"))?,
            kind: text("kind")?.parse()?,
            reference: text("reference")?,
            at_ms: row.try_get("at_ms").map_err(get)?,
        },
        score: row.try_get::<f64, _>("score").map_err(get)?,
    })
}

/// Whether the vector index for `dimension` is there (`None`: not) and valid.
async fn vector_index_state(pool: &PgPool, dimension: usize) -> Result<Option<bool>> {
    sqlx::query_scalar("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)")
        .bind(vector_index(dimension))
        .fetch_optional(pool)
        .await
        .map_err(pg("reading the vector index's state"))
}

/// Makes sure the vector index for `dimension` is there and valid, under the advisory lock
/// (session-level, on a connection of its own). Someone else holding it is building the index
/// or has it set aside for a bulk load: then this leaves it to them.
async fn ensure_vector_index(
    pool: &PgPool,
    dimension: usize,
    memory_mib: Option<u32>,
) -> Result<()> {
    let mut conn = pool
        .acquire()
        .await
        .map_err(pg("building the vector index"))?;
    // Closed, not pooled, when dropped: a session that took the lock never outlives its use.
    conn.close_on_drop();
    let ours: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(VECTOR_INDEX_LOCK)
        .fetch_one(&mut *conn)
        .await
        .map_err(pg("building the vector index"))?;
    if !ours {
        return Ok(());
    }
    build_vector_index(conn, dimension, memory_mib).await
}

/// Builds the vector index if it is missing or invalid, concurrently (writes go on), on `conn`,
/// which holds the advisory lock and is closed when dropped (ending its session, and so the
/// lock, whatever happens here). A parallel build that fails (its shared memory could not be
/// had) is tried once more without parallel workers.
async fn build_vector_index(
    mut conn: PoolConnection<Postgres>,
    dimension: usize,
    memory_mib: Option<u32>,
) -> Result<()> {
    let name = vector_index(dimension);
    let mut settings = Vec::new();
    if let Some(mib) = memory_mib {
        settings.push(format!("SET maintenance_work_mem = '{mib}MB'"));
    }
    let mut result = Ok(());
    for attempt in 0..2 {
        if attempt == 1 {
            settings.push("SET max_parallel_maintenance_workers = 0".into());
        }
        let state: std::result::Result<Option<bool>, _> = sqlx::query_scalar(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)",
        )
        .bind(&name)
        .fetch_optional(&mut *conn)
        .await;
        let mut steps = settings.clone();
        match state {
            Ok(Some(true)) => break,
            // A build that failed leaves an invalid index behind, which `IF NOT EXISTS` would
            // take for the real one.
            Ok(Some(false)) => steps.push(format!("DROP INDEX CONCURRENTLY IF EXISTS {name}")),
            Ok(None) => {}
            Err(e) => {
                result = Err(e);
                break;
            }
        }
        steps.push(create_vector_index(dimension, "CONCURRENTLY IF NOT EXISTS"));
        result = run_all(&mut conn, &steps).await;
        if result.is_ok() {
            break;
        }
        tracing::warn!(attempt, error = ?result, "building the vector index failed");
    }
    if result.is_err() {
        // An invalid index is kept up on every write and never used: not left behind.
        let _ = run_all(
            &mut conn,
            &[format!("DROP INDEX CONCURRENTLY IF EXISTS {name}")],
        )
        .await;
    }
    let _ = run_all(&mut conn, &["SELECT pg_advisory_unlock_all()".into()]).await;
    result.map_err(|e| Error::unavailable("building the vector index", e))
}

/// Runs `statements` in order on `conn`, stopping at the first error.
async fn run_all(
    conn: &mut PoolConnection<Postgres>,
    statements: &[String],
) -> std::result::Result<(), sqlx::Error> {
    for statement in statements {
        sqlx::query(statement).execute(&mut **conn).await?;
    }
    Ok(())
}

/// The name of the vector index for `dimension`.
fn vector_index(dimension: usize) -> String {
    format!("index_rows_embedding_{dimension}")
}

/// `CREATE INDEX [how] …` for the vector index of `dimension`.
fn create_vector_index(dimension: usize, how: &str) -> String {
    format!(
        "CREATE INDEX {how} {} ON index_rows \
         USING hnsw ((embedding::vector({dimension})) vector_cosine_ops) \
         WHERE vector_dims(embedding) = {dimension}",
        vector_index(dimension)
    )
}

/// The last of each `(tenant, id)` among `rows`, grouped by scope: what one upsert writes (a
/// row twice in one batch is written as its later copy, as two upserts would leave it).
fn deduplicated(rows: &[IndexRow]) -> Vec<&IndexRow> {
    let mut last: HashMap<(&str, &str), usize> = HashMap::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        last.insert((row.scope.tenant.as_str(), row.info.id.as_str()), i);
    }
    let mut keep: Vec<usize> = last.into_values().collect();
    keep.sort_unstable();
    let mut out: Vec<&IndexRow> = keep.into_iter().map(|i| &rows[i]).collect();
    out.sort_by(|a, b| {
        (&a.scope.tenant, &a.scope.identity).cmp(&(&b.scope.tenant, &b.scope.identity))
    });
    out
}

/// Appends `text` to a `COPY … (FORMAT text)` line, escaped (NUL, which Postgres text cannot
/// hold, is dropped: [`Backend::upsert`] refuses it in keys, and cleans it from bodies).
fn copy_text(line: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '\\' => line.push_str("\\\\"),
            '\n' => line.push_str("\\n"),
            '\r' => line.push_str("\\r"),
            '\t' => line.push_str("\\t"),
            '\0' => {}
            c => line.push(c),
        }
    }
}

/// One staging row, in `COPY … (FORMAT text)`: the columns of [`STAGE`].
fn copy_line(out: &mut String, ord: usize, row: &IndexRow) {
    use std::fmt::Write as _;
    let info = &row.info;
    let _ = write!(out, "{ord}\t");
    for field in [
        row.scope.tenant.as_str(),
        &row.scope.identity.to_string(),
        info.id.as_str(),
        &info.app.to_string(),
        &info.agent.to_string(),
        &info.conversation.to_string(),
    ] {
        copy_text(out, field);
        out.push('\t');
    }
    let _ = write!(
        out,
        "{}\t{}\t",
        i64::try_from(info.turn.number()).unwrap_or(i64::MAX),
        info.kind.as_str()
    );
    copy_text(out, &info.reference);
    let _ = write!(out, "\t{}\t[", info.at_ms);
    for (i, x) in row.embedding.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{x}");
    }
    out.push_str("]\t");
    let analyzed = analysis::analyze(&row.text);
    // Array literals with every element quoted (a term may read `null`); terms are letters
    // and digits only, so nothing in them needs escaping.
    out.push('{');
    for (i, (term, _)) in analyzed.terms.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "\"{term}\"");
    }
    out.push_str("}\t{");
    for (i, (_, n)) in analyzed.terms.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{n}");
    }
    let _ = writeln!(out, "}}\t{}", analysis::stored_length(analyzed.length));
}

/// The staging table a large batch is copied into (per session, emptied at commit; nothing
/// but this transaction can see it).
const STAGE: &str = "CREATE TEMP TABLE IF NOT EXISTS index_stage (ord integer, tenant text, \
     owner text, id text, app text, agent text, conversation text, turn bigint, kind text, \
     reference text, at_ms bigint, embedding vector, terms text[], tfs int4[], dl int4) \
     ON COMMIT DELETE ROWS";

/// How an upsert settles a row whose id is already present: the new one replaces it.
const ON_CONFLICT: &str = " ON CONFLICT (tenant, id) DO UPDATE SET app = EXCLUDED.app, \
     agent = EXCLUDED.agent, conversation = EXCLUDED.conversation, \
     turn = EXCLUDED.turn, kind = EXCLUDED.kind, reference = EXCLUDED.reference, \
     at_ms = EXCLUDED.at_ms, embedding = EXCLUDED.embedding, \
     terms = EXCLUDED.terms, tfs = EXCLUDED.tfs, dl = EXCLUDED.dl";

impl PgIndex {
    /// Writes `sorted` (deduplicated, grouped by scope) with one `INSERT` per scope and
    /// thousand rows; `tx` is bound to the first row's scope.
    async fn insert_rows(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        sorted: &[&IndexRow],
    ) -> Result<()> {
        for (i, group) in sorted.chunk_by(|a, b| a.scope == b.scope).enumerate() {
            if i > 0 {
                rebind(tx, &group[0].scope).await?;
            }
            for chunk in group.chunks(1000) {
                let mut q = QueryBuilder::<Postgres>::new(
                    "INSERT INTO index_rows (tenant, owner, id, app, agent, conversation, turn, \
                     kind, reference, at_ms, embedding, terms, tfs, dl) ",
                );
                q.push_values(chunk, |mut b, row| {
                    let analyzed = analysis::analyze(&row.text);
                    let (terms, counts): (Vec<String>, Vec<i32>) = analyzed
                        .terms
                        .into_iter()
                        .map(|(t, n)| (t, i32::try_from(n).unwrap_or(i32::MAX)))
                        .unzip();
                    let length = analysis::stored_length(analyzed.length);
                    let info = &row.info;
                    b.push_bind(row.scope.tenant.to_string())
                        .push_bind(row.scope.identity.to_string())
                        .push_bind(info.id.to_string())
                        .push_bind(info.app.to_string())
                        .push_bind(info.agent.to_string())
                        .push_bind(info.conversation.to_string())
                        .push_bind(i64::try_from(info.turn.number()).unwrap_or(i64::MAX))
                        .push_bind(info.kind.as_str())
                        .push_bind(info.reference.clone())
                        .push_bind(info.at_ms)
                        .push_bind(Vector::from(row.embedding.clone()))
                        .push_bind(terms)
                        .push_bind(counts)
                        .push_bind(i32::try_from(length).unwrap_or(i32::MAX));
                });
                q.push(ON_CONFLICT);
                q.build()
                    .execute(&mut **tx)
                    .await
                    .map_err(pg("writing index rows"))?;
            }
        }
        Ok(())
    }

    /// Writes `sorted` (deduplicated, grouped by scope) by copying them all into the staging
    /// table, then one `INSERT … SELECT` per scope; `tx` is bound to the first row's scope.
    async fn copy_rows(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        sorted: &[&IndexRow],
    ) -> Result<()> {
        for statement in [
            "SET LOCAL client_min_messages = warning",
            STAGE,
            "CREATE INDEX IF NOT EXISTS index_stage_scope ON index_stage (tenant, owner)",
        ] {
            sqlx::query(statement)
                .execute(&mut **tx)
                .await
                .map_err(pg("staging index rows"))?;
        }
        let mut copy = tx
            .copy_in_raw(
                "COPY index_stage (ord, tenant, owner, id, app, agent, conversation, turn, kind, \
                 reference, at_ms, embedding, terms, tfs, dl) FROM STDIN (FORMAT text)",
            )
            .await
            .map_err(pg("staging index rows"))?;
        let mut buffer = String::with_capacity(1 << 20);
        for (ord, row) in sorted.iter().enumerate() {
            copy_line(&mut buffer, ord, row);
            if buffer.len() >= 1 << 20 {
                copy.send(buffer.as_bytes())
                    .await
                    .map_err(pg("staging index rows"))?;
                buffer.clear();
            }
        }
        if !buffer.is_empty() {
            copy.send(buffer.as_bytes())
                .await
                .map_err(pg("staging index rows"))?;
        }
        copy.finish().await.map_err(pg("staging index rows"))?;
        for (i, group) in sorted.chunk_by(|a, b| a.scope == b.scope).enumerate() {
            if i > 0 {
                rebind(tx, &group[0].scope).await?;
            }
            sqlx::query(&format!(
                "INSERT INTO index_rows (tenant, owner, id, app, agent, conversation, turn, \
                 kind, reference, at_ms, embedding, terms, tfs, dl) \
                 SELECT tenant, owner, id, app, agent, conversation, turn, kind, reference, \
                 at_ms, embedding, terms, tfs, dl \
                 FROM index_stage WHERE tenant = $1 AND owner = $2{ON_CONFLICT}"
            ))
            .bind(group[0].scope.tenant.as_str())
            .bind(group[0].scope.identity.to_string())
            .execute(&mut **tx)
            .await
            .map_err(pg("writing index rows"))?;
        }
        Ok(())
    }
}

#[async_trait]
impl Backend for PgIndex {
    fn name(&self) -> &'static str {
        "postgres"
    }

    async fn upsert(&self, rows: &[IndexRow]) -> Result<()> {
        for row in rows {
            // Postgres text holds no NUL; the text is cleaned, but a key must not change.
            if row.info.id.as_str().contains('\0') || row.info.reference.contains('\0') {
                return Err(Error::invalid(format!(
                    "row {:?} has a NUL in its id or reference",
                    row.info.id.as_str()
                )));
            }
            if row.embedding.len() != self.dimension {
                return Err(Error::invalid(format!(
                    "row {} has a {}-dimension embedding; the index is configured for {}",
                    row.info.id,
                    row.embedding.len(),
                    self.dimension
                )));
            }
        }
        // One transaction (all or nothing), rebound to each scope in turn: while bound to a
        // scope, the policies let it write only that identity's rows.
        let sorted = deduplicated(rows);
        let Some(first) = sorted.first() else {
            return Ok(());
        };
        let mut tx = self.scoped(&first.scope).await?;
        if sorted.len() >= COPY_ROWS {
            self.copy_rows(&mut tx, &sorted).await?;
        } else {
            self.insert_rows(&mut tx, &sorted).await?;
        }
        tx.commit().await.map_err(pg("committing index rows"))?;
        Ok(())
    }

    async fn lexical(
        &self,
        scope: &Scope,
        filters: &Filters,
        text: &str,
        k: usize,
    ) -> Result<Vec<Candidate>> {
        // The analyzer and BM25 of `analysis`, as the embedded backend ranks: the rows of the
        // caller holding any ranked term are the candidates; a term's weight is its inverse
        // document frequency among the caller's rows (times how often the query says it), its
        // count in a row saturates (k1), and the row's length (as stored, against the caller's
        // average from `index_scope_stats`, kept by triggers) normalises it (b). Statistics are
        // counted before filters, required and excluded terms, which change no score; nothing
        // of another identity shapes one.
        let query = analysis::Query::parse(text);
        if query.is_empty() {
            return Ok(Vec::new());
        }
        let (ranked, qtfs): (Vec<String>, Vec<i32>) = query
            .ranked
            .iter()
            .map(|(t, n)| (t.clone(), i32::try_from(*n).unwrap_or(i32::MAX)))
            .unzip();
        let mut q = QueryBuilder::<Postgres>::new(
            "WITH query AS MATERIALIZED (SELECT q.t, q.qtf FROM unnest(",
        );
        q.push_bind(ranked.clone())
            .push("::text[], ")
            .push_bind(qtfs)
            .push(
                "::int4[]) AS q(t, qtf)), \
                 scoped AS MATERIALIZED (SELECT tenant, owner, id, app, agent, conversation, \
                 turn, kind, reference, at_ms, terms, tfs, dl FROM index_rows",
            );
        self.push_scope(&mut q, scope);
        q.push(" AND terms && ").push_bind(ranked).push(
            "::text[]), \
                 kept AS (SELECT rows, words FROM index_scope_stats",
        );
        self.push_scope(&mut q, scope);
        q.push(
            "), stats AS MATERIALIZED (SELECT \
             greatest(coalesce((SELECT rows FROM kept), 0), m.n)::float8 AS n, \
             CASE WHEN coalesce((SELECT rows FROM kept), 0) > 0 \
             THEN (SELECT words::float8 / rows FROM kept) \
             ELSE coalesce(m.avgdl, 0)::float8 END AS avgdl \
             FROM (SELECT count(*) AS n, avg(dl) AS avgdl FROM scoped) AS m), ",
        );
        // Each row's terms are unnested once and joined with the query's terms (a hash join),
        // rather than searched term by term in every row's array.
        q.push(format!(
            "weights AS MATERIALIZED (SELECT query.t, query.qtf * \
             ln(1 + (stats.n - count(*) + 0.5) / (count(*) + 0.5)) * ({K1} + 1) AS w \
             FROM scoped, unnest(scoped.terms) AS u(t), query, stats WHERE u.t = query.t \
             GROUP BY query.t, query.qtf, stats.n), \
             scores AS MATERIALIZED (SELECT s.id, sum(weights.w * u.tf::float8 / \
             (u.tf::float8 + {K1} * (1 - {B} + {B} * s.dl / greatest(stats.avgdl, 1e-9)))) \
             AS score FROM scoped AS s, unnest(s.terms, s.tfs) AS u(t, tf), weights, stats \
             WHERE u.t = weights.t GROUP BY s.id) \
             SELECT {COLUMNS}, coalesce(scores.score, 0)::float8 AS score \
             FROM scoped LEFT JOIN scores USING (id)"
        ));
        self.push_scope_and_filters(&mut q, scope, filters);
        if !query.required.is_empty() {
            q.push(" AND terms @> ")
                .push_bind(query.required.clone())
                .push("::text[]");
        }
        if !query.excluded.is_empty() {
            q.push(" AND NOT terms && ")
                .push_bind(query.excluded.clone())
                .push("::text[]");
        }
        q.push(" ORDER BY score DESC, id LIMIT ")
            .push_bind(k.max(1) as i64);
        let mut tx = self.scoped(scope).await?;
        // Planned for these values, never from a cached generic plan: a plan made without
        // knowing the scope walks the whole graph (or every matching row) for a selective one.
        let rows = q
            .build()
            .persistent(false)
            .fetch_all(&mut *tx)
            .await
            .map_err(pg("searching text"))?;
        tx.commit().await.map_err(pg("searching text"))?;
        rows.iter().map(candidate).collect()
    }

    async fn vector(
        &self,
        scope: &Scope,
        filters: &Filters,
        embedding: &[f32],
        k: usize,
    ) -> Result<Vec<Candidate>> {
        if embedding.len() != self.dimension {
            return Err(Error::invalid(format!(
                "the query embedding has {} dimensions; the index is configured for {}",
                embedding.len(),
                self.dimension
            )));
        }
        let d = self.dimension;
        let query = Vector::from(embedding.to_vec());
        let mut q = QueryBuilder::<Postgres>::new(format!(
            "SELECT {COLUMNS}, (1 - (embedding::vector({d}) <=> "
        ));
        q.push_bind(query.clone())
            .push("))::float8 AS score FROM index_rows");
        self.push_scope_and_filters(&mut q, scope, filters);
        q.push(format!(
            " AND vector_dims(embedding) = {d} ORDER BY embedding::vector({d}) <=> "
        ))
        .push_bind(query)
        .push(", id LIMIT ")
        .push_bind(k.max(1) as i64);
        let mut tx = self.scoped(scope).await?;
        // The graph search keeps going until it has k rows that pass the filters.
        sqlx::query(&format!("SET LOCAL hnsw.ef_search = {}", k.clamp(40, 1000)))
            .execute(&mut *tx)
            .await
            .map_err(pg("searching vectors"))?;
        sqlx::query("SET LOCAL hnsw.iterative_scan = relaxed_order")
            .execute(&mut *tx)
            .await
            .map_err(pg("searching vectors"))?;
        // Planned for these values, never from a cached generic plan: a plan made without
        // knowing the scope walks the whole graph (or every matching row) for a selective one.
        let rows = q
            .build()
            .persistent(false)
            .fetch_all(&mut *tx)
            .await
            .map_err(pg("searching vectors"))?;
        tx.commit().await.map_err(pg("searching vectors"))?;
        let mut out: Vec<Candidate> = rows.iter().map(candidate).collect::<Result<_>>()?;
        // relaxed_order may return near-ties slightly out of order; the contract is best first.
        out.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then_with(|| a.info.id.cmp(&b.info.id))
        });
        Ok(out)
    }

    async fn mark(&self, scope: &Scope, conversation: ConversationId) -> Result<Option<TurnId>> {
        let mut tx = self.scoped(scope).await?;
        let mut q = QueryBuilder::<Postgres>::new("SELECT turn FROM index_marks");
        self.push_scope_and_filters(&mut q, scope, &Filters::default());
        q.push(" AND conversation = ")
            .push_bind(conversation.to_string());
        let turn: Option<i64> = q
            .build_query_scalar()
            .fetch_optional(&mut *tx)
            .await
            .map_err(pg("reading the index mark"))?;
        tx.commit().await.map_err(pg("reading the index mark"))?;
        Ok(turn
            .and_then(|t| u64::try_from(t).ok())
            .and_then(TurnId::new))
    }

    async fn set_mark(
        &self,
        scope: &Scope,
        conversation: ConversationId,
        turn: TurnId,
    ) -> Result<()> {
        let mut tx = self.scoped(scope).await?;
        sqlx::query(
            "INSERT INTO index_marks (tenant, owner, conversation, turn) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (tenant, conversation) \
             DO UPDATE SET turn = GREATEST(index_marks.turn, EXCLUDED.turn)",
        )
        .bind(scope.tenant.as_str())
        .bind(scope.identity.to_string())
        .bind(conversation.to_string())
        .bind(i64::try_from(turn.number()).unwrap_or(i64::MAX))
        .execute(&mut *tx)
        .await
        .map_err(pg("writing the index mark"))?;
        tx.commit().await.map_err(pg("writing the index mark"))
    }

    async fn count(&self, scope: &Scope) -> Result<u64> {
        let mut tx = self.scoped(scope).await?;
        let mut q = QueryBuilder::<Postgres>::new("SELECT count(*) FROM index_rows");
        self.push_scope_and_filters(&mut q, scope, &Filters::default());
        let n: i64 = q
            .build_query_scalar()
            .fetch_one(&mut *tx)
            .await
            .map_err(pg("counting index rows"))?;
        tx.commit().await.map_err(pg("counting index rows"))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
    async fn forget(&self, scope: &Scope) -> Result<u64> {
        let mut tx = self.scoped(scope).await?;
        let mut q = QueryBuilder::<Postgres>::new("DELETE FROM index_marks");
        self.push_scope_and_filters(&mut q, scope, &Filters::default());
        q.build()
            .execute(&mut *tx)
            .await
            .map_err(pg("forgetting index marks"))?;
        let mut q = QueryBuilder::<Postgres>::new("DELETE FROM index_rows");
        self.push_scope_and_filters(&mut q, scope, &Filters::default());
        let done = q
            .build()
            .execute(&mut *tx)
            .await
            .map_err(pg("forgetting index rows"))?;
        let mut q = QueryBuilder::<Postgres>::new("DELETE FROM index_scope_stats");
        self.push_scope(&mut q, scope);
        q.build()
            .execute(&mut *tx)
            .await
            .map_err(pg("forgetting index statistics"))?;
        tx.commit().await.map_err(pg("forgetting index rows"))?;
        Ok(done.rows_affected())
    }

    /// Sets the vector index aside (searches by meaning scan the scope's rows meanwhile:
    /// exact, and cheap for a scope of thousands of rows) and holds its lock, so no worker
    /// opening the index builds it again under the load. A second begin while one is running
    /// joins it.
    async fn begin_bulk(&self) -> Result<()> {
        let mut held = self.bulk.lock().await;
        if held.is_some() {
            return Ok(());
        }
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(pg("starting a bulk load"))?;
        // The session holding the lock never goes back to the pool: however this connection
        // is dropped (the load ends, the index is dropped mid-load), it is closed, and the
        // lock with it.
        conn.close_on_drop();
        // Waits for a build under way to end.
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(VECTOR_INDEX_LOCK)
            .execute(&mut *conn)
            .await
            .map_err(pg("starting a bulk load"))?;
        let dropped = sqlx::query(&format!(
            "DROP INDEX CONCURRENTLY IF EXISTS {}",
            vector_index(self.dimension)
        ))
        .execute(&mut *conn)
        .await;
        if let Err(e) = dropped {
            return Err(Error::unavailable("setting the vector index aside", e));
        }
        *held = Some(conn);
        Ok(())
    }

    /// Builds the vector index once over every row, in parallel and in memory, without
    /// blocking writes (`CREATE INDEX CONCURRENTLY`), then lets the lock go. Without a bulk
    /// load running, it makes sure the index is there (after a load whose process died).
    async fn end_bulk(&self) -> Result<()> {
        let held = self.bulk.lock().await.take();
        match held {
            Some(conn) => build_vector_index(conn, self.dimension, self.build_memory_mib).await,
            None => ensure_vector_index(&self.pool, self.dimension, self.build_memory_mib).await,
        }
    }

    async fn drop_mark(&self, scope: &Scope, conversation: ConversationId) -> Result<()> {
        let mut tx = self.scoped(scope).await?;
        let mut q = QueryBuilder::<Postgres>::new("DELETE FROM index_marks");
        self.push_scope(&mut q, scope);
        q.push(" AND conversation = ")
            .push_bind(conversation.to_string());
        q.build()
            .execute(&mut *tx)
            .await
            .map_err(pg("dropping an index mark"))?;
        tx.commit().await.map_err(pg("dropping an index mark"))?;
        Ok(())
    }

    async fn list(
        &self,
        scope: &Scope,
        filters: &Filters,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<RowInfo>> {
        let mut tx = self.scoped(scope).await?;
        let mut q = QueryBuilder::<Postgres>::new(format!(
            "SELECT {COLUMNS}, 0::float8 AS score FROM index_rows"
        ));
        self.push_scope_and_filters(&mut q, scope, filters);
        q.push(" ORDER BY at_ms DESC, id LIMIT ")
            .push_bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .push(" OFFSET ")
            .push_bind(i64::try_from(offset).unwrap_or(i64::MAX));
        let rows = q
            .build()
            .fetch_all(&mut *tx)
            .await
            .map_err(pg("listing index rows"))?;
        tx.commit().await.map_err(pg("listing index rows"))?;
        rows.iter().map(|r| candidate(r).map(|c| c.info)).collect()
    }

    async fn delete(&self, scope: &Scope, filters: &Filters, ids: Option<&[RowId]>) -> Result<u64> {
        let mut tx = self.scoped(scope).await?;
        let mut q = QueryBuilder::<Postgres>::new("DELETE FROM index_rows");
        self.push_scope_and_filters(&mut q, scope, filters);
        if let Some(ids) = ids {
            let ids: Vec<String> = ids.iter().map(|i| i.as_str().to_owned()).collect();
            q.push(" AND id = ANY(").push_bind(ids).push(")");
        }
        let done = q
            .build()
            .execute(&mut *tx)
            .await
            .map_err(pg("deleting index rows"))?;
        tx.commit().await.map_err(pg("deleting index rows"))?;
        Ok(done.rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The analyzed terms go into `COPY` as array literals with every element quoted: a term
    /// that reads `null` stays a word.
    #[test]
    fn copied_rows_carry_their_terms_counts_and_length() {
        let row = IndexRow {
            scope: Scope::new("acme".parse().unwrap(), "test:a".parse().unwrap()),
            info: RowInfo {
                id: RowId::new("r1"),
                app: "app".parse().unwrap(),
                agent: "agent".parse().unwrap(),
                conversation: ConversationId::new(),
                turn: TurnId::FIRST,
                kind: crate::types::Kind::Prompt,
                reference: "ref".into(),
                at_ms: 1,
            },
            text: "NULL null, x&y!".into(),
            embedding: vec![0.5],
        };
        let mut line = String::new();
        copy_line(&mut line, 7, &row);
        assert!(
            line.ends_with("[0.5]\t{\"null\",\"x\",\"y\"}\t{2,1,1}\t4\n"),
            "{line}"
        );
        let terms: Vec<String> = crate::analysis::Query::parse("x&y | c:* !d (e) 'f'")
            .ranked
            .into_iter()
            .map(|(t, _)| t)
            .collect();
        assert_eq!(terms, ["c", "d", "e", "f", "x", "y"]);
    }
}
