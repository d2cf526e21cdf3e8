//! `turnpike bench search` (quality on a real test collection) and `turnpike bench index`
//! (indexing rate and query latency at scale).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use serde_json::json;
use turnpike_index::embed::{Engine, MiniLm};
use turnpike_index::embedded::EmbeddedIndex;
use turnpike_index::eval::{average_precision, ndcg_at, Collection, Files, Grades, QueryNumbering};
use turnpike_index::postgres::PgIndex;
use turnpike_index::{
    Backend, Embedder, Index, IndexRow, Kind, Mode, RowId, RowInfo, Scope, SearchRequest,
};
use turnpike_schemas::{ConversationId, TenantId, TurnId};

use crate::Series;

/// Where the search benchmarks find their services.
#[derive(Debug, Clone)]
pub struct SearchConfig {
    /// Postgres with pgvector; without it, only the embedded backend is measured.
    pub database_url: Option<String>,
    /// The all-MiniLM-L6-v2 files.
    pub embedding_model: PathBuf,
    /// `maintenance_work_mem` for building Postgres's vector index after a bulk load, in MiB
    /// (default: the server's).
    pub build_memory_mib: Option<u32>,
}

/// Which backends a benchmark loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backends {
    Embedded,
    Postgres,
    Both,
}

/// The backends to measure: the embedded one in a temporary directory, and Postgres when a
/// database URL is configured. Each with a tenant of its own, forgotten afterwards.
async fn backends(
    config: &SearchConfig,
    which: Backends,
    dimension: usize,
    dir: &Path,
) -> Result<Vec<(Arc<dyn Backend>, Option<PgIndex>)>> {
    let mut out: Vec<(Arc<dyn Backend>, Option<PgIndex>)> = Vec::new();
    if which != Backends::Postgres {
        out.push((Arc::new(EmbeddedIndex::open(dir)?), None));
    }
    if which != Backends::Embedded {
        match &config.database_url {
            Some(url) => {
                let mut pg = PgIndex::connect(url, dimension)
                    .await
                    .with_context(|| format!("connecting to {url}"))?;
                if let Some(mib) = config.build_memory_mib {
                    pg = pg.with_build_memory(mib);
                }
                out.push((Arc::new(pg.clone()), Some(pg)));
            }
            None => eprintln!(
                "postgres: skipped (no --database-url; `scripts/services start postgres` and `eval \"$(scripts/services env)\"`)"
            ),
        }
    }
    Ok(out)
}

/// This run's tenant: its rows never mix with anyone's.
fn bench_tenant() -> TenantId {
    format!("bench{}", std::process::id())
        .parse()
        .expect("a valid tenant id")
}

fn bench_scope(tenant: &TenantId, user: usize) -> Scope {
    let identity = format!("bench:user{user}")
        .parse()
        .expect("a valid identity");
    Scope::new(tenant.clone(), identity)
}

/// The conversation a benchmark row belongs to: the `n`th.
fn bench_conversation(n: usize) -> ConversationId {
    ConversationId::from_ulid(ulid::Ulid::from(n as u128))
}

/// A benchmark row's info.
fn bench_info(id: String, conversation: usize, turn: u64, kind: Kind, at_ms: i64) -> RowInfo {
    RowInfo {
        reference: id.clone(),
        id: RowId::new(id),
        app: "bench".parse().expect("a valid app id"),
        agent: "bench".parse().expect("a valid agent id"),
        conversation: bench_conversation(conversation),
        turn: TurnId::new(turn).expect("turns start at 1"),
        kind,
        at_ms,
    }
}

/// `turnpike bench search --collection DIR`.
pub async fn quality(
    config: &SearchConfig,
    dir: &Path,
    files: &Files,
    json_out: bool,
    numbering: QueryNumbering,
    grades: Grades,
    work: Option<PathBuf>,
) -> Result<ExitCode> {
    let collection = Collection::load_files(dir, files, numbering, grades)?;
    let judged: Vec<usize> = (0..collection.queries.len())
        .filter(|&i| collection.judgments.contains_key(&collection.queries[i].0))
        .collect();
    eprintln!(
        "{}: {} documents, {} queries ({} judged)",
        dir.display(),
        collection.docs.len(),
        collection.queries.len(),
        judged.len()
    );
    let model = config.embedding_model.clone();
    let minilm = tokio::task::spawn_blocking(move || MiniLm::load(&model)).await??;
    // The engines agree to cosine 0.999, not bit for bit: each has its own cached vectors.
    let engine = format!("{:?}", minilm.engine());
    let embedder: Arc<dyn Embedder> = Arc::new(minilm);
    let started = Instant::now();
    let doc_texts: Vec<String> = collection.docs.iter().map(|(_, t)| t.clone()).collect();
    let (doc_vectors, cached) =
        cached_embeddings(embedder.as_ref(), &engine, &doc_texts, dir).await?;
    let embed_time = started.elapsed();
    let query_texts: Vec<String> = judged
        .iter()
        .map(|&i| collection.queries[i].1.clone())
        .collect();
    let query_vectors = embedder.embed(&query_texts).await?;
    if !cached {
        eprintln!(
            "embedded {} documents in {:.1} s ({:.1}/s, {})",
            doc_texts.len(),
            embed_time.as_secs_f64(),
            doc_texts.len() as f64 / embed_time.as_secs_f64(),
            embedder.model()
        );
    }
    let tmp = tempdir_in(work.as_deref())?;
    let scope = bench_scope(&bench_tenant(), 0);
    for (backend, pg) in backends(config, Backends::Both, embedder.dimension(), tmp.path()).await? {
        let index = Index::new(backend.clone(), embedder.clone());
        let rows: Vec<IndexRow> = collection
            .docs
            .iter()
            .zip(&doc_vectors)
            .enumerate()
            .map(|(n, ((id, text), v))| IndexRow {
                scope: scope.clone(),
                info: bench_info(id.clone(), n, 1, Kind::File, 0),
                text: text.clone(),
                embedding: v.clone(),
            })
            .collect();
        for chunk in rows.chunks(2000) {
            index.write(chunk.to_vec()).await?;
        }
        if let Some(pg) = &pg {
            pg.analyze().await?;
        }
        let mut report = serde_json::Map::new();
        report.insert("backend".into(), json!(backend.name()));
        for (name, mode) in [
            ("lexical", Mode::Lexical),
            ("vector", Mode::Vector),
            ("hybrid", Mode::Hybrid),
        ] {
            let (mut ndcg, mut map) = (0.0, 0.0);
            for (k, &i) in judged.iter().enumerate() {
                let (key, text) = &collection.queries[i];
                let mut request = SearchRequest::new(text.clone());
                request.mode = mode;
                request.limit = 100;
                let page = index
                    .search_embedded(&scope, &request, Some(&query_vectors[k]))
                    .await?;
                let ranking: Vec<String> =
                    page.hits.into_iter().map(|h| h.info.reference).collect();
                let judgments = &collection.judgments[key];
                ndcg += ndcg_at(&ranking, judgments, 10);
                map += average_precision(&ranking, judgments);
            }
            let n = judged.len().max(1) as f64;
            report.insert(
                name.into(),
                json!({"ndcg@10": round4(ndcg / n), "map": round4(map / n)}),
            );
        }
        // What recall (k = 5, hybrid) adds to a turn's context rebuild: the query embedded on
        // this CPU, then both retrievers and fusion; and the search alone.
        let (mut recall, mut search_only) = (Vec::new(), Vec::new());
        for (k, &i) in judged.iter().enumerate().take(100) {
            let mut request = SearchRequest::new(collection.queries[i].1.clone());
            request.limit = 5;
            let t = Instant::now();
            index.search(&scope, &request).await?;
            recall.push(t.elapsed());
            let t = Instant::now();
            index
                .search_embedded(&scope, &request, Some(&query_vectors[k]))
                .await?;
            search_only.push(t.elapsed());
        }
        let recall = Series {
            total: recall.iter().sum(),
            samples: recall,
        };
        let search_only = Series {
            total: search_only.iter().sum(),
            samples: search_only,
        };
        report.insert(
            "recall_k5_ms".into(),
            json!({
                "p50": round4(ms(recall.percentile(0.5))),
                "p99": round4(ms(recall.percentile(0.99))),
                "search_only_p50": round4(ms(search_only.percentile(0.5))),
                "search_only_p99": round4(ms(search_only.percentile(0.99))),
            }),
        );
        backend.forget(&scope).await?;
        let report = serde_json::Value::Object(report);
        if json_out {
            println!("{report}");
        } else {
            println!("{}", backend.name());
            for name in ["lexical", "vector", "hybrid"] {
                println!(
                    "  {name:<8} nDCG@10 {:.4}   MAP(100) {:.4}",
                    report[name]["ndcg@10"].as_f64().unwrap_or(0.0),
                    report[name]["map"].as_f64().unwrap_or(0.0)
                );
            }
            let r = &report["recall_k5_ms"];
            println!(
                "  recall k=5 (query embedded here, hybrid): p50 {:.2} ms  p99 {:.2} ms; the search alone p50 {:.2} ms  p99 {:.2} ms",
                r["p50"].as_f64().unwrap_or(0.0),
                r["p99"].as_f64().unwrap_or(0.0),
                r["search_only_p50"].as_f64().unwrap_or(0.0),
                r["search_only_p99"].as_f64().unwrap_or(0.0)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `turnpike bench embed --collection DIR`: documents embedded per second (the collection's
/// first `docs`, as a rebuild embeds them: in batches), and short queries one at a time (as a
/// search or a recall embeds them), p50/p99 — on the engine this machine runs by default, and
/// on the portable engine (candle, f32) as the floor, in the same run.
pub async fn embed(
    config: &SearchConfig,
    dir: &Path,
    files: &Files,
    docs: usize,
) -> Result<ExitCode> {
    let collection =
        Collection::load_files(dir, files, QueryNumbering::Position, Grades::LowerIsBetter)?;
    let texts: Vec<String> = collection
        .docs
        .iter()
        .take(docs.max(1))
        .map(|(_, t)| t.clone())
        .collect();
    let queries: Vec<String> = collection
        .queries
        .iter()
        .take(100)
        .map(|(_, q)| q.clone())
        .collect();
    let mut engines = vec![Engine::from_env()?];
    if engines[0] != Engine::Portable {
        engines.push(Engine::Portable);
    }
    let mut rates = Vec::new();
    let mut measured = Vec::new();
    for engine in engines {
        let model = config.embedding_model.clone();
        let embedder =
            Arc::new(tokio::task::spawn_blocking(move || MiniLm::load_on(&model, engine)).await??);
        // `auto` on a CPU without the fast engine is the portable one already: once is enough.
        if measured.contains(&embedder.engine()) {
            continue;
        }
        measured.push(embedder.engine());
        let name = match embedder.engine() {
            Engine::Fast => "the fast engine (AVX-512, bf16 products)",
            _ => "the portable engine (candle, f32)",
        };
        let m = measure_embedder(embedder.as_ref(), &texts, &queries).await?;
        println!("{} on {name}: {} documents", embedder.model(), texts.len());
        println!(
            "  32 per batch in collection order: {:.1} documents/s; batched by length: {:.1} documents/s (goal ≥ 40/s)",
            m.unsorted, m.sorted
        );
        println!(
            "  short queries, one at a time: p50 {:.2} ms  p99 {:.2} ms ({} queries)",
            ms(m.queries.percentile(0.5)),
            ms(m.queries.percentile(0.99)),
            m.queries.samples.len()
        );
        rates.push((m.sorted, m.queries.percentile(0.5)));
    }
    if let [(rate, query), (floor, floor_query)] = rates[..] {
        println!(
            "against the portable engine: ×{:.2} documents/s, ×{:.2} faster short queries (p50)",
            rate / floor,
            floor_query.as_secs_f64() / query.as_secs_f64()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// One engine's numbers for `bench embed`.
struct EmbedRates {
    /// Documents per second, 32 per batch in the collection's order.
    unsorted: f64,
    /// Documents per second, all at once (the embedder batches by length).
    sorted: f64,
    queries: Series,
}

async fn measure_embedder(
    embedder: &dyn Embedder,
    texts: &[String],
    queries: &[String],
) -> Result<EmbedRates> {
    // Warm the model (first-call allocations).
    embedder.embed(&texts[..1]).await?;
    let rate = |d: Duration| texts.len() as f64 / d.as_secs_f64();
    let t = Instant::now();
    for chunk in texts.chunks(32) {
        embedder.embed(chunk).await?;
    }
    let unsorted = rate(t.elapsed());
    let t = Instant::now();
    embedder.embed(texts).await?;
    let sorted = rate(t.elapsed());
    let mut times = Vec::new();
    for q in queries {
        let t = Instant::now();
        embedder.embed(std::slice::from_ref(q)).await?;
        times.push(t.elapsed());
    }
    Ok(EmbedRates {
        unsorted,
        sorted,
        queries: Series {
            total: times.iter().sum(),
            samples: times,
        },
    })
}

/// The documents' embeddings, from a cache file beside the system's temp dir when an earlier
/// run made them with the same model for the same texts (the model is slow on a small CPU;
/// the measured numbers do not depend on when the vectors were made).
async fn cached_embeddings(
    embedder: &dyn Embedder,
    engine: &str,
    texts: &[String],
    collection: &Path,
) -> Result<(Vec<Vec<f32>>, bool)> {
    use sha2::{Digest as _, Sha256};
    let mut hash = Sha256::new();
    hash.update(embedder.model());
    // Vectors of the portable engine keep the key they had before there were two.
    if engine != "Portable" {
        hash.update(engine);
    }
    for t in texts {
        hash.update(t.as_bytes());
        hash.update([0]);
    }
    let key = hex::encode(&hash.finalize()[..12]);
    let path = std::env::temp_dir().join(format!("turnpike-bench-embeddings-{key}.f32"));
    let d = embedder.dimension();
    if let Ok(bytes) = std::fs::read(&path) {
        if bytes.len() == texts.len() * d * 4 {
            eprintln!(
                "document embeddings of {} from the cache {}",
                collection.display(),
                path.display()
            );
            let vectors = bytes
                .chunks_exact(d * 4)
                .map(|row| {
                    row.chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect()
                })
                .collect();
            return Ok((vectors, true));
        }
    }
    let vectors = embedder.embed(texts).await?;
    let bytes: Vec<u8> = vectors
        .iter()
        .flat_map(|v| v.iter().flat_map(|x| x.to_le_bytes()))
        .collect();
    let _ = std::fs::write(&path, bytes);
    Ok((vectors, false))
}

fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

fn tempdir_in(dir: Option<&Path>) -> Result<tempfile::TempDir> {
    Ok(match dir {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir()?,
    })
}

/// A small deterministic generator for synthetic data (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Roughly Zipf-distributed over `n` (rank r with weight ~1/r).
    fn zipf(&mut self, n: usize) -> usize {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        ((n as f64).powf(u) as usize).saturating_sub(1).min(n - 1)
    }
}

const DIMENSION: usize = 384;
const TOPICS: usize = 2000;
const VOCABULARY: usize = 20_000;

/// Synthetic rows: each on one of `TOPICS` topics (a centroid plus noise, so vectors cluster
/// as real embeddings do), with 24 words drawn from a Zipf vocabulary plus topic words.
struct Synthetic {
    centroids: Vec<Vec<f32>>,
    rng: Rng,
}

fn word(i: usize) -> String {
    // Pronounceable, distinct pseudo-words.
    const SYL: [&str; 16] = [
        "ka", "lo", "mi", "ne", "ru", "sa", "te", "vo", "zi", "pa", "qu", "do", "fe", "gi", "ho",
        "ju",
    ];
    let mut s = String::new();
    let mut n = i + 16;
    while n > 0 {
        s.push_str(SYL[n % 16]);
        n /= 16;
    }
    s
}

impl Synthetic {
    fn new() -> Self {
        let mut rng = Rng(7);
        let centroids = (0..TOPICS)
            .map(|_| {
                turnpike_index::embed::normalized((0..DIMENSION).map(|_| rng.unit()).collect())
            })
            .collect();
        Self { centroids, rng }
    }

    fn vector_near(&mut self, topic: usize, noise: f32) -> Vec<f32> {
        let c = &self.centroids[topic];
        let v = c
            .iter()
            .map(|x| x + noise * self.rng.unit() / (DIMENSION as f32).sqrt())
            .collect();
        turnpike_index::embed::normalized(v)
    }

    /// Row `n` of `rows`: the users' rows come one user after another, as a rebuild writes
    /// them (conversation by conversation).
    fn row(&mut self, n: usize, rows: usize, users: usize, tenant: &TenantId) -> IndexRow {
        let topic = self.rng.below(TOPICS);
        let user = (n / rows.div_ceil(users).max(1)).min(users - 1);
        let mut words: Vec<String> = (0..24).map(|_| word(self.rng.zipf(VOCABULARY))).collect();
        words.push(word(VOCABULARY + topic));
        IndexRow {
            scope: bench_scope(tenant, user),
            info: bench_info(
                format!("row{n}"),
                n / 10,
                (n % 10) as u64 + 1,
                Kind::Prompt,
                n as i64,
            ),
            text: words.join(" "),
            embedding: self.vector_near(topic, 0.8),
        }
    }
}

/// What `turnpike bench index` measures.
pub struct Scale {
    pub rows: usize,
    pub users: usize,
    pub queries: usize,
    pub backend: Backends,
    pub dir: Option<PathBuf>,
    /// Leave the rows in place afterwards.
    pub keep: bool,
    /// Load nothing; query the rows an earlier run left under this tenant.
    pub reuse: Option<TenantId>,
}

/// `turnpike bench index`.
pub async fn scale(config: &SearchConfig, options: Scale) -> Result<ExitCode> {
    let Scale {
        rows,
        users,
        queries,
        backend: which,
        dir: work,
        keep,
        reuse,
    } = options;
    let loading = reuse.is_none();
    let tenant = reuse.unwrap_or_else(bench_tenant);
    let tmp = tempdir_in(work.as_deref())?;
    let model = config.embedding_model.clone();
    let embedder: Arc<dyn Embedder> =
        Arc::new(tokio::task::spawn_blocking(move || MiniLm::load(&model)).await??);
    // The query embedding's own cost (the local model, one short query at a time).
    let mut embed = Series {
        samples: Vec::new(),
        total: Duration::ZERO,
    };
    for i in 0..50 {
        let t = Instant::now();
        embedder
            .embed(&[format!("where did we discuss the turbine blade order {i}")])
            .await?;
        embed.samples.push(t.elapsed());
    }
    embed.total = embed.samples.iter().sum();
    println!(
        "query embedding (all-MiniLM-L6-v2, CPU): p50 {:.2} ms  p99 {:.2} ms",
        ms(embed.percentile(0.5)),
        ms(embed.percentile(0.99))
    );
    println!(
        "{rows} rows over {users} users ({} rows each), {DIMENSION}-d",
        rows / users
    );
    for (backend, pg) in backends(config, which, DIMENSION, tmp.path()).await? {
        let index = Index::new(backend.clone(), embedder.clone());
        let mut data = Synthetic::new();
        // As a full rebuild writes: one user's rows after another, batches three at a time,
        // with the backend in bulk mode (Postgres builds its vector index once, after the
        // load).
        let batch = 5000;
        let started = Instant::now();
        if loading {
            backend.begin_bulk().await?;
        }
        let mut written = if loading { 0 } else { rows };
        let mut last_report = Instant::now();
        let mut writes = futures::stream::FuturesUnordered::new();
        while written < rows || !writes.is_empty() {
            while written < rows && writes.len() < 3 {
                let n = batch.min(rows - written);
                let chunk: Vec<IndexRow> = (written..written + n)
                    .map(|i| data.row(i, rows, users, &tenant))
                    .collect();
                let backend = backend.clone();
                writes.push(async move { backend.upsert(&chunk).await.map(|()| n) });
                written += n;
            }
            if let Some(done) = futures::StreamExt::next(&mut writes).await {
                done?;
            }
            if last_report.elapsed() > Duration::from_secs(30) {
                eprintln!(
                    "  {}: {written} rows, {:.0} rows/s",
                    backend.name(),
                    written as f64 / started.elapsed().as_secs_f64()
                );
                last_report = Instant::now();
            }
        }
        let loaded = started.elapsed();
        if loading {
            backend.end_bulk().await?;
        }
        let elapsed = started.elapsed();
        if let Some(pg) = &pg {
            // What autovacuum does after a load this size.
            pg.analyze().await?;
        }
        let mut hybrid = Series {
            samples: Vec::new(),
            total: Duration::ZERO,
        };
        let mut qrng = Rng(99);
        for q in 0..queries {
            let user = qrng.below(users);
            let topic = qrng.below(TOPICS);
            let text = format!(
                "{} {} {}",
                word(VOCABULARY + topic),
                word(qrng.zipf(VOCABULARY)),
                word(qrng.zipf(VOCABULARY))
            );
            let vector = data.vector_near(topic, 0.8);
            let mut request = SearchRequest::new(text);
            request.limit = 10;
            let t = Instant::now();
            let page = index
                .search_embedded(&bench_scope(&tenant, user), &request, Some(&vector))
                .await?;
            hybrid.samples.push(t.elapsed());
            if q == 0 && page.hits.is_empty() {
                anyhow::bail!("a query found nothing: the benchmark data is wrong");
            }
        }
        hybrid.total = hybrid.samples.iter().sum();
        let indexing = if loading {
            format!(
                "indexing {:>8.0} rows/s ({:.0} s: rows in {:.0} s, then indexes {:.0} s)",
                rows as f64 / elapsed.as_secs_f64(),
                elapsed.as_secs_f64(),
                loaded.as_secs_f64(),
                (elapsed - loaded).as_secs_f64()
            )
        } else {
            format!("reusing tenant {tenant}")
        };
        println!(
            "{:<9} {indexing}   hybrid query p50 {:>7.2} ms  p99 {:>7.2} ms",
            backend.name(),
            ms(hybrid.percentile(0.5)),
            ms(hybrid.percentile(0.99)),
        );
        if keep {
            println!("  kept: tenant {tenant}");
            continue;
        }
        for user in 0..users {
            backend.forget(&bench_scope(&tenant, user)).await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
