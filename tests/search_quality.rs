//! Search that does not depend on the backend (item 6 of the third adversarial look): on the
//! Cranfield collection (1,400 abstracts, 225 judged queries; `tests/data/cranfield`), the
//! embedded and Postgres backends rank the same words the same way — one analyzer, one BM25 —
//! and hybrid search never loses to the better of its two retrievers, on either backend.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use turnpike_index::embedded::EmbeddedIndex;
use turnpike_index::eval::{ndcg_at, Collection, Grades, QueryNumbering};
use turnpike_index::postgres::PgIndex;
use turnpike_index::{
    Backend, Candidate, Filters, Index, IndexRow, Kind, Mode, RowId, RowInfo, Scope, SearchRequest,
};
use turnpike_schemas::{ConversationId, TurnId};

fn cranfield() -> Collection {
    Collection::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/cranfield"),
        QueryNumbering::Position,
        Grades::LowerIsBetter,
    )
    .expect("the Cranfield collection")
}

fn scope() -> Scope {
    Scope::new(
        format!("t{}", ulid::Ulid::new().to_string().to_lowercase())
            .parse()
            .unwrap(),
        "test:reader".parse().unwrap(),
    )
}

fn rows(scope: &Scope, collection: &Collection, vectors: &[Vec<f32>]) -> Vec<IndexRow> {
    let conversation = ConversationId::new();
    collection
        .docs
        .iter()
        .zip(vectors)
        .enumerate()
        .map(|(n, ((id, text), v))| IndexRow {
            scope: scope.clone(),
            info: RowInfo {
                id: RowId::new(format!("d{n:05}")),
                app: "bench".parse().unwrap(),
                agent: "reader".parse().unwrap(),
                conversation,
                turn: TurnId::FIRST,
                kind: Kind::File,
                reference: id.clone(),
                at_ms: 0,
            },
            text: text.clone(),
            embedding: v.clone(),
        })
        .collect()
}

/// A unit vector along axis `i` (rows need one; the lexical test never reads it).
fn axis(i: usize) -> Vec<f32> {
    let mut v = vec![0.0; 384];
    v[i % 384] = 1.0;
    v
}

async fn backends() -> (Arc<dyn Backend>, Arc<dyn Backend>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let embedded: Arc<dyn Backend> = Arc::new(EmbeddedIndex::open(dir.path()).unwrap());
    let server = turnpike_tests::postgres::shared();
    let pg: Arc<dyn Backend> = Arc::new(PgIndex::connect(&server.url(), 384).await.unwrap());
    (embedded, pg, dir)
}

/// The two backends' lexical top 10s agree for every Cranfield query — the same documents
/// (ties at the tenth score count as agreement) with the same scores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_backends_rank_the_same_words_the_same_way_on_cranfield() {
    let collection = cranfield();
    let vectors: Vec<Vec<f32>> = (0..collection.docs.len()).map(axis).collect();
    let scope = scope();
    let (embedded, pg, _dir) = backends().await;
    for backend in [&embedded, &pg] {
        for chunk in rows(&scope, &collection, &vectors).chunks(500) {
            backend.upsert(chunk).await.unwrap();
        }
    }
    let (mut overlap, mut queries, mut compared) = (0.0, 0usize, 0usize);
    let mut worst = (0.0f64, String::new());
    for (_, text) in &collection.queries {
        let top = |c: Vec<Candidate>| -> Vec<(String, f64)> {
            c.into_iter()
                .map(|c| (c.info.id.to_string(), c.score))
                .collect()
        };
        let a = top(embedded
            .lexical(&scope, &Filters::default(), text, 10)
            .await
            .unwrap());
        let b = top(pg
            .lexical(&scope, &Filters::default(), text, 10)
            .await
            .unwrap());
        assert_eq!(a.is_empty(), b.is_empty(), "{text}: {a:?} / {b:?}");
        if a.is_empty() {
            continue;
        }
        queries += 1;
        // Documents of one list found in the other, or tied with the other's last score.
        let last_b = b.last().map_or(0.0, |x| x.1);
        let scores_b: HashMap<&str, f64> = b.iter().map(|(id, s)| (id.as_str(), *s)).collect();
        let agreed = a
            .iter()
            .filter(|(id, s)| {
                scores_b.contains_key(id.as_str()) || (s - last_b).abs() <= 1e-4 * s.max(1.0)
            })
            .count();
        overlap += agreed as f64 / a.len().max(b.len()) as f64;
        for (id, s) in &a {
            if let Some(t) = scores_b.get(id.as_str()) {
                compared += 1;
                let off = (s - t).abs() / s.abs().max(1.0);
                if off > worst.0 {
                    worst = (off, format!("{text:?}: {id} {s} vs {t}"));
                }
            }
        }
    }
    let mean = overlap / queries.max(1) as f64;
    eprintln!(
        "{queries} queries: mean top-10 agreement {mean:.4}; {compared} shared hits, largest relative score difference {:.2e} ({})",
        worst.0, worst.1
    );
    assert!(queries > 200, "{queries} queries ranked");
    assert!(mean >= 0.99, "top-10 agreement {mean}");
    assert!(worst.0 <= 1e-3, "scores differ: {}", worst.1);
}

/// A deterministic standard normal sample (splitmix64 and Box–Muller): the blur's noise.
fn normal(state: &mut u64) -> f32 {
    let mut next = || {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let (u, v) = (next().max(f64::MIN_POSITIVE), next());
    ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
}

/// `vectors` blurred: noise of `sigma` times a unit vector's typical spread added to each, then
/// renormalised — a weaker embedding of the same documents.
fn blurred(vectors: &[Vec<f32>], sigma: f32, seed: u64) -> Vec<Vec<f32>> {
    let mut state = seed;
    vectors
        .iter()
        .map(|v| {
            let scale = sigma / (v.len() as f32).sqrt();
            let mut w: Vec<f32> = v.iter().map(|x| x + scale * normal(&mut state)).collect();
            let norm = w.iter().map(|x| x * x).sum::<f32>().sqrt();
            w.iter_mut().for_each(|x| *x /= norm);
            w
        })
        .collect()
}

/// Hybrid search (fused) is at least as good as the better of lexical and vector search alone,
/// by nDCG@10 over Cranfield's judged queries, on each backend — with MiniLM's vectors, and
/// with the same vectors blurred until vector search alone is clearly the weaker retriever
/// (one weak retriever must not drag hybrid below the other). The two backends' lexical nDCG@10
/// are within 2% of each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_never_loses_to_the_better_retriever_on_cranfield() {
    let collection = cranfield();
    let embedder = turnpike_tests::index::embedder();
    let texts: Vec<String> = collection.docs.iter().map(|(_, t)| t.clone()).collect();
    let vectors = embedder.embed(&texts).await.unwrap();
    let judged: Vec<&(String, String)> = collection
        .queries
        .iter()
        .filter(|(key, _)| collection.judgments.contains_key(key))
        .collect();
    let query_texts: Vec<String> = judged.iter().map(|(_, t)| t.clone()).collect();
    let query_vectors = embedder.embed(&query_texts).await.unwrap();
    let (embedded, pg, _dir) = backends().await;
    let variants = [
        ("MiniLM", vectors.clone()),
        ("MiniLM blurred", blurred(&vectors, 1.6, 41)),
    ];
    let mut lexical = Vec::new();
    for (variant, vectors) in &variants {
        for backend in [&embedded, &pg] {
            let scope = scope();
            let index = Index::new(backend.clone(), embedder.clone());
            for chunk in rows(&scope, &collection, vectors).chunks(500) {
                backend.upsert(chunk).await.unwrap();
            }
            let mut ndcg = HashMap::new();
            for mode in [Mode::Lexical, Mode::Vector, Mode::Hybrid] {
                let mut sum = 0.0;
                for (k, (key, text)) in judged.iter().enumerate() {
                    let mut request = SearchRequest::new(text.clone());
                    request.mode = mode;
                    request.limit = 10;
                    let page = index
                        .search_embedded(&scope, &request, Some(&query_vectors[k]))
                        .await
                        .unwrap();
                    let ranking: Vec<String> =
                        page.hits.into_iter().map(|h| h.info.reference).collect();
                    sum += ndcg_at(&ranking, &collection.judgments[key], 10);
                }
                ndcg.insert(format!("{mode:?}"), sum / judged.len() as f64);
            }
            eprintln!("{} ({variant}): nDCG@10 {ndcg:?}", backend.name());
            let best = ndcg["Lexical"].max(ndcg["Vector"]);
            assert!(
                ndcg["Hybrid"] >= best,
                "{} ({variant}): hybrid {} below the better single retriever {best}",
                backend.name(),
                ndcg["Hybrid"]
            );
            lexical.push((backend.name(), ndcg["Lexical"]));
            backend.forget(&scope).await.unwrap();
        }
    }
    let (low, high) = lexical.iter().fold((f64::MAX, 0.0f64), |(lo, hi), (_, x)| {
        (lo.min(*x), hi.max(*x))
    });
    assert!(
        high - low <= 0.02 * high,
        "lexical nDCG@10 differs between backends: {lexical:?}"
    );
}
