//! The index suite: one set of cases, run against every backend (embedded tantivy + redb, and
//! Postgres + pgvector), with the real all-MiniLM-L6-v2 embedder.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use turnpike_index::embedded::EmbeddedIndex;
use turnpike_index::postgres::PgIndex;
use turnpike_index::Backend as _;
use turnpike_index::{
    ErrorKind, Filters, Index, IndexRow, Kind, Mode, RowId, RowInfo, Scope, SearchRequest,
};
use turnpike_schemas::{ConversationId, TenantId, TurnId};
use turnpike_tests::index::embedder;

/// A backend under test, with a tenant of its own.
struct Fixture {
    index: Index,
    tenant: TenantId,
    pg: Option<PgIndex>,
    _dir: Option<tempfile::TempDir>,
}

impl Fixture {
    fn scope(&self, user: &str) -> Scope {
        Scope::new(self.tenant.clone(), identity(user))
    }
}

fn identity(user: &str) -> turnpike_schemas::Identity {
    format!("test:{user}").parse().unwrap()
}

/// The corpus's conversation `c<n>`.
fn conv(name: &str) -> ConversationId {
    let n: u128 = name.trim_start_matches('c').parse().unwrap();
    ConversationId::from_ulid(ulid::Ulid::from(n))
}

async fn embedded() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(EmbeddedIndex::open(dir.path()).unwrap());
    Fixture {
        index: Index::new(backend, embedder()),
        tenant: "acme".parse().unwrap(),
        pg: None,
        _dir: Some(dir),
    }
}

async fn postgres() -> Fixture {
    let server = turnpike_tests::postgres::shared();
    let pg = PgIndex::connect(&server.url(), 384).await.unwrap();
    Fixture {
        index: Index::new(Arc::new(pg.clone()), embedder()),
        // Tests share the server: each gets its own tenant.
        tenant: format!("t{}", ulid::Ulid::new().to_string().to_lowercase())
            .parse()
            .unwrap(),
        pg: Some(pg),
        _dir: None,
    }
}

/// (user, conversation, app, agent, kind, at_ms, text)
const CORPUS: &[(&str, &str, &str, &str, Kind, i64, &str)] = &[
    (
        "alice",
        "c1",
        "shop",
        "clerk",
        Kind::Prompt,
        1_000,
        "Please check the order status for part number XJ-9000.",
    ),
    (
        "alice",
        "c1",
        "shop",
        "clerk",
        Kind::Completion,
        2_000,
        "Your turbine blade order has shipped and arrives on Friday.",
    ),
    (
        "alice",
        "c2",
        "shop",
        "clerk",
        Kind::Prompt,
        3_000,
        "The invoice payment is overdue by three weeks.",
    ),
    (
        "alice",
        "c2",
        "shop",
        "support",
        Kind::Completion,
        4_000,
        "I have sent a reminder to the accounts department.",
    ),
    (
        "alice",
        "c3",
        "notes",
        "scribe",
        Kind::Summary,
        5_000,
        "We discussed the garden: planting tomatoes and watering schedules.",
    ),
    (
        "alice",
        "c3",
        "notes",
        "scribe",
        Kind::File,
        6_000,
        "recipes.md\nA recipe for tomato soup with basil and garlic.",
    ),
    (
        "alice",
        "c4",
        "notes",
        "scribe",
        Kind::Attachment,
        7_000,
        "flight-plan.txt\nThe aircraft wing flutter analysis at high speed.",
    ),
    (
        "alice",
        "c4",
        "notes",
        "scribe",
        Kind::Prompt,
        8_000,
        "What causes flutter in aircraft wings at supersonic speeds?",
    ),
    (
        "alice",
        "c5",
        "shop",
        "clerk",
        Kind::Prompt,
        9_000,
        "Order status for XJ-9000 again, it is urgent.",
    ),
    (
        "alice",
        "c6",
        "shop",
        "clerk",
        Kind::Prompt,
        9_500,
        "Another question about order status and delivery dates.",
    ),
    (
        "bob",
        "c9",
        "shop",
        "clerk",
        Kind::Prompt,
        1_500,
        "Bob's secret: part XJ-9000 is also on my order, and my invoice is late.",
    ),
    (
        "bob",
        "c9",
        "shop",
        "clerk",
        Kind::Completion,
        2_500,
        "Your tomato garden order is confirmed.",
    ),
];

fn rows(f: &Fixture) -> Vec<IndexRow> {
    CORPUS
        .iter()
        .enumerate()
        .map(|(i, (user, c, app, agent, kind, at_ms, text))| IndexRow {
            scope: f.scope(user),
            info: RowInfo {
                id: RowId::new(format!("conv:tl:{c}/turn_1/blocks/{i}")),
                app: app.parse().unwrap(),
                agent: agent.parse().unwrap(),
                conversation: conv(c),
                turn: TurnId::FIRST,
                kind: *kind,
                reference: format!("conv:tl:{c}/turn_1/blocks/{i}"),
                at_ms: *at_ms,
            },
            text: (*text).into(),
            embedding: Vec::new(),
        })
        .collect()
}

async fn loaded(f: Fixture) -> Fixture {
    f.index.write(rows(&f)).await.unwrap();
    f
}

fn request(text: &str, mode: Mode) -> SearchRequest {
    let mut r = SearchRequest::new(text);
    r.mode = mode;
    r.limit = 50;
    r
}

async fn search(f: &Fixture, user: &str, r: &SearchRequest) -> Vec<String> {
    let page = f.index.search(&f.scope(user), r).await.unwrap();
    page.hits
        .into_iter()
        .map(|h| text_of(&h.info.reference))
        .collect()
}

/// The corpus text a reference stands for.
fn text_of(reference: &str) -> String {
    let i: usize = reference.rsplit('/').next().unwrap().parse().unwrap();
    CORPUS[i].6.to_owned()
}

async fn exact_term_hits(f: Fixture) {
    let f = loaded(f).await;
    let hits = search(&f, "alice", &request("XJ-9000", Mode::Lexical)).await;
    assert_eq!(
        hits.len(),
        2,
        "both of alice's rows naming the part: {hits:?}"
    );
    assert!(hits.iter().all(|h| h.contains("XJ-9000")), "{hits:?}");
    // A word that is nowhere finds nothing.
    assert!(search(&f, "alice", &request("zeppelin", Mode::Lexical))
        .await
        .is_empty());
    // Stemming: "shipping" finds "shipped".
    let hits = search(&f, "alice", &request("shipping", Mode::Lexical)).await;
    assert_eq!(hits.first().map(String::as_str), Some(CORPUS[1].6));
}

async fn paraphrase_hits(f: Fixture) {
    let f = loaded(f).await;
    // No word in common with "The invoice payment is overdue by three weeks."
    let query = "late bill settlement";
    assert!(
        search(&f, "alice", &request(query, Mode::Lexical))
            .await
            .is_empty(),
        "no shared words, so full text alone finds nothing"
    );
    let hits = search(&f, "alice", &request(query, Mode::Vector)).await;
    assert_eq!(
        hits.first().map(String::as_str),
        Some(CORPUS[2].6),
        "{hits:?}"
    );
    let hits = search(&f, "alice", &request(query, Mode::Hybrid)).await;
    assert_eq!(
        hits.first().map(String::as_str),
        Some(CORPUS[2].6),
        "{hits:?}"
    );
}

async fn fusion_order(f: Fixture) {
    let f = loaded(f).await;
    let query = "order status";
    let scope = f.scope("alice");
    let lexical = f
        .index
        .search(&scope, &request(query, Mode::Lexical))
        .await
        .unwrap();
    let vector = f
        .index
        .search(&scope, &request(query, Mode::Vector))
        .await
        .unwrap();
    let hybrid = f
        .index
        .search(&scope, &request(query, Mode::Hybrid))
        .await
        .unwrap();
    assert!(!lexical.hits.is_empty() && !vector.hits.is_empty());
    // Recompute the fusion from the two single-retriever lists: each list's raw scores put on
    // one scale by their mean and spread (mean − 3σ → 0, mean + 3σ → 1), then summed.
    let mut expected: HashMap<String, f64> = HashMap::new();
    for (page, lexical_list) in [(&lexical, true), (&vector, false)] {
        let raw: Vec<f64> = page
            .hits
            .iter()
            .map(|h| {
                let own = if lexical_list { h.lexical } else { h.vector };
                own.expect("a single retriever's hit carries its score")
                    .score
            })
            .collect();
        let n = raw.len() as f64;
        let mean = raw.iter().sum::<f64>() / n;
        let sd = (raw.iter().map(|s| (s - mean) * (s - mean)).sum::<f64>() / n).sqrt();
        for (h, s) in page.hits.iter().zip(&raw) {
            let scaled = if sd > 0.0 {
                ((s - (mean - 3.0 * sd)) / (6.0 * sd)).max(0.0)
            } else {
                1.0
            };
            *expected.entry(h.info.reference.clone()).or_default() += scaled;
        }
    }
    assert_eq!(hybrid.hits.len(), expected.len(), "the union of both lists");
    for h in &hybrid.hits {
        assert!(
            (h.score - expected[&h.info.reference]).abs() < 1e-9,
            "{}",
            h.info.reference
        );
        let lex_rank = lexical
            .hits
            .iter()
            .position(|l| l.info.reference == h.info.reference);
        assert_eq!(h.lexical.map(|s| s.rank), lex_rank.map(|r| r + 1));
    }
    for pair in hybrid.hits.windows(2) {
        assert!(pair[0].score >= pair[1].score, "fused scores descend");
    }
    // Rows both retrievers rank highly come first.
    let top = &hybrid.hits[0];
    assert!(top.lexical.is_some() && top.vector.is_some(), "{top:?}");
}

async fn filters(f: Fixture) {
    let f = loaded(f).await;
    let query = "order invoice garden flutter tomato status";
    let check = |name: &'static str, filters: Filters, want: &'static [usize]| {
        let f = &f;
        async move {
            let mut r = request(query, Mode::Hybrid);
            r.filters = filters;
            let page = f.index.search(&f.scope("alice"), &r).await.unwrap();
            let mut got: Vec<usize> = page
                .hits
                .iter()
                .map(|h| {
                    h.info
                        .reference
                        .rsplit('/')
                        .next()
                        .unwrap()
                        .parse()
                        .unwrap()
                })
                .collect();
            got.sort();
            assert_eq!(got, want, "filter {name}");
        }
    };
    let f0 = Filters::default;
    check(
        "app",
        Filters {
            app: Some("notes".parse().unwrap()),
            ..f0()
        },
        &[4, 5, 6, 7],
    )
    .await;
    check(
        "agent",
        Filters {
            agent: Some("support".parse().unwrap()),
            ..f0()
        },
        &[3],
    )
    .await;
    check(
        "conversation",
        Filters {
            conversation: Some(conv("c2")),
            ..f0()
        },
        &[2, 3],
    )
    .await;
    check(
        "kind",
        Filters {
            kinds: vec![Kind::File, Kind::Attachment],
            ..f0()
        },
        &[5, 6],
    )
    .await;
    check(
        "time",
        Filters {
            since_ms: Some(2_000),
            until_ms: Some(5_000),
            ..f0()
        },
        &[1, 2, 3],
    )
    .await;
    check(
        "combined",
        Filters {
            app: Some("shop".parse().unwrap()),
            kinds: vec![Kind::Prompt],
            since_ms: Some(2_500),
            ..f0()
        },
        &[2, 8, 9],
    )
    .await;
}

async fn pagination(f: Fixture) {
    let f = loaded(f).await;
    let whole = search(
        &f,
        "alice",
        &request("order status aircraft tomato", Mode::Hybrid),
    )
    .await;
    assert!(whole.len() >= 6, "{whole:?}");
    let mut r = request("order status aircraft tomato", Mode::Hybrid);
    r.limit = 2;
    let mut paged = Vec::new();
    loop {
        let page = f.index.search(&f.scope("alice"), &r).await.unwrap();
        assert!(page.hits.len() <= 2);
        paged.extend(page.hits.iter().map(|h| text_of(&h.info.reference)));
        match page.next_offset {
            Some(next) => r.offset = next,
            None => break,
        }
    }
    assert_eq!(
        paged, whole,
        "pages concatenate to the whole list, nothing twice"
    );
}

async fn per_conversation_cap(f: Fixture) {
    let f = loaded(f).await;
    let mut r = request("order status XJ-9000 invoice", Mode::Hybrid);
    let page = f.index.search(&f.scope("alice"), &r).await.unwrap();
    let per = |hits: &[turnpike_index::Hit]| {
        let mut n: HashMap<ConversationId, usize> = HashMap::new();
        for h in hits {
            *n.entry(h.info.conversation).or_default() += 1;
        }
        n
    };
    assert!(
        per(&page.hits).values().any(|&n| n > 1),
        "the uncapped list repeats a conversation"
    );
    r.per_conversation = Some(1);
    let capped = f.index.search(&f.scope("alice"), &r).await.unwrap();
    let counts = per(&capped.hits);
    assert!(counts.values().all(|&n| n == 1), "{counts:?}");
    assert_eq!(
        counts.keys().collect::<HashSet<_>>(),
        per(&page.hits).keys().collect::<HashSet<_>>(),
        "every conversation still appears once"
    );
}

async fn idempotent_reindexing(f: Fixture) {
    let f = loaded(f).await;
    let scope = f.scope("alice");
    let before_count = f.index.backend().count(&scope).await.unwrap();
    let before = f
        .index
        .search(&scope, &request("order status", Mode::Hybrid))
        .await
        .unwrap();
    f.index.write(rows(&f)).await.unwrap();
    f.index.write(rows(&f)).await.unwrap();
    assert_eq!(f.index.backend().count(&scope).await.unwrap(), before_count);
    assert_eq!(before_count, 10);
    let after = f
        .index
        .search(&scope, &request("order status", Mode::Hybrid))
        .await
        .unwrap();
    assert_eq!(before, after);
    // Marks only move forward.
    let backend = f.index.backend();
    let (c1, turn) = (conv("c1"), |n| TurnId::new(n).unwrap());
    backend.set_mark(&scope, c1, turn(3)).await.unwrap();
    backend.set_mark(&scope, c1, turn(2)).await.unwrap();
    assert_eq!(backend.mark(&scope, c1).await.unwrap(), Some(turn(3)));
    assert_eq!(backend.mark(&f.scope("bob"), c1).await.unwrap(), None);
}

async fn isolation(f: Fixture) {
    let f = loaded(f).await;
    for mode in [Mode::Lexical, Mode::Vector, Mode::Hybrid] {
        let bob = f
            .index
            .search(
                &f.scope("bob"),
                &request("XJ-9000 order status invoice", mode),
            )
            .await
            .unwrap();
        assert!(!bob.hits.is_empty());
        assert!(
            bob.hits.iter().all(|h| h.info.conversation == conv("c9")),
            "{mode:?}: {:?}",
            bob.hits
        );
        let alice = f
            .index
            .search(&f.scope("alice"), &request("Bob's secret", mode))
            .await
            .unwrap();
        assert!(
            alice.hits.iter().all(|h| h.info.conversation != conv("c9")),
            "{mode:?}"
        );
        // Another tenant with the same user name sees nothing.
        let other = Scope::new(format!("{}x", f.tenant).parse().unwrap(), identity("alice"));
        assert!(f
            .index
            .search(&other, &request("order", mode))
            .await
            .unwrap()
            .hits
            .is_empty());
    }
    // Row-level security alone: the queries leave the scope out of WHERE; the session is still
    // bound to alice, and the policies keep bob's matching rows out.
    if let Some(pg) = &f.pg {
        let unscoped = Index::new(Arc::new(pg.without_scope_clause()), embedder());
        for mode in [Mode::Lexical, Mode::Vector, Mode::Hybrid] {
            let page = unscoped
                .search(
                    &f.scope("alice"),
                    &request("Bob's secret XJ-9000 invoice late", mode),
                )
                .await
                .unwrap();
            assert!(
                !page.hits.is_empty(),
                "{mode:?}: alice's own rows still come back"
            );
            assert!(
                page.hits.iter().all(|h| h.info.conversation != conv("c9")),
                "{mode:?}: {:?}",
                page.hits
            );
        }
        // And the scope in the session is what decides: bound to bob, the same unscoped query
        // returns only bob's.
        let page = unscoped
            .search(&f.scope("bob"), &request("XJ-9000", Mode::Lexical))
            .await
            .unwrap();
        assert_eq!(page.hits.len(), 1);
        assert_eq!(page.hits[0].info.conversation, conv("c9"));
        assert_eq!(
            unscoped.backend().count(&f.scope("alice")).await.unwrap(),
            10
        );
    }
}

async fn forget_and_bad_input(f: Fixture) {
    let f = loaded(f).await;
    let e = f
        .index
        .search(&f.scope("alice"), &request("   ", Mode::Hybrid))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid);
    assert!(e.to_string().contains("empty"), "{e}");
    let mut r = request("order", Mode::Hybrid);
    r.limit = 0;
    assert_eq!(
        f.index
            .search(&f.scope("alice"), &r)
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::Invalid
    );
    // Query syntax characters are words, never errors.
    for q in [
        "a & | ! :* ( ) ' \"",
        "\"unterminated",
        "-",
        "OR",
        "c++ <-> x",
    ] {
        f.index
            .search(&f.scope("alice"), &request(q, Mode::Hybrid))
            .await
            .unwrap();
    }
    let backend = f.index.backend();
    assert_eq!(backend.forget(&f.scope("bob")).await.unwrap(), 2);
    assert_eq!(backend.count(&f.scope("bob")).await.unwrap(), 0);
    assert_eq!(
        backend.count(&f.scope("alice")).await.unwrap(),
        10,
        "others keep theirs"
    );
    let bob = f
        .index
        .search(&f.scope("bob"), &request("XJ-9000", Mode::Hybrid))
        .await
        .unwrap();
    assert!(bob.hits.is_empty());
}

async fn memory_lists_and_forgets_only_the_callers_rows(f: Fixture) {
    let f = loaded(f).await;
    let backend = f.index.backend();
    let alice = f.scope("alice");
    let all = backend
        .list(&alice, &Filters::default(), 0, 100)
        .await
        .unwrap();
    assert_eq!(all.len(), 10);
    // Newest first, then by id; pages follow on.
    assert!(all
        .windows(2)
        .all(|w| (w[1].at_ms, &w[0].id) <= (w[0].at_ms, &w[1].id)));
    let page = backend
        .list(&alice, &Filters::default(), 3, 4)
        .await
        .unwrap();
    assert_eq!(page, all[3..7]);
    let in_c1 = Filters {
        conversation: Some(conv("c1")),
        ..Default::default()
    };
    let c1 = backend.list(&alice, &in_c1, 0, 100).await.unwrap();
    assert!(!c1.is_empty() && c1.iter().all(|r| r.conversation == conv("c1")));

    // Bob's rows by id, asked for as alice: nothing happens to them.
    let bobs: Vec<RowId> = backend
        .list(&f.scope("bob"), &Filters::default(), 0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(bobs.len(), 2);
    let none = backend
        .delete(&alice, &Filters::default(), Some(&bobs))
        .await
        .unwrap();
    assert_eq!(none, 0);
    assert_eq!(backend.count(&f.scope("bob")).await.unwrap(), 2);

    // One row by id: gone from listing and from both retrievers.
    let first = all[0].clone();
    let gone = backend
        .delete(
            &alice,
            &Filters::default(),
            Some(std::slice::from_ref(&first.id)),
        )
        .await
        .unwrap();
    assert_eq!(gone, 1);
    let after = backend
        .list(&alice, &Filters::default(), 0, 100)
        .await
        .unwrap();
    assert_eq!(after.len(), 9);
    assert!(after.iter().all(|r| r.id != first.id));
    for mode in [Mode::Lexical, Mode::Vector, Mode::Hybrid] {
        let mut r = request("order status part XJ-9000 blue cardigan", mode);
        r.limit = 50;
        let page = f.index.search(&alice, &r).await.unwrap();
        assert!(page.hits.iter().all(|h| h.info.id != first.id), "{mode:?}");
    }
    // A whole conversation.
    let gone = backend.delete(&alice, &in_c1, None).await.unwrap();
    assert_eq!(
        gone as usize,
        c1.iter().filter(|r| r.id != first.id).count()
    );
    assert!(backend
        .list(&alice, &in_c1, 0, 100)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        backend.count(&f.scope("bob")).await.unwrap(),
        2,
        "others keep theirs"
    );
}

/// Whether a connection of its own gets the vector index's advisory lock (and lets it go).
async fn try_vector_lock() -> bool {
    use sqlx::Connection as _;
    let url = turnpike_tests::postgres::shared().url();
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(7370726)")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    // Let it go before the session ends: closing returns before the server has ended the
    // session, and a worker opening the index meanwhile would find the lock taken (by this
    // probe) and leave the index to its holder.
    if got {
        let released: bool = sqlx::query_scalar("SELECT pg_advisory_unlock(7370726)")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert!(released);
    }
    conn.close().await.unwrap();
    got
}

/// `scope`'s hits for `text` searched by words only, best first.
async fn word_hits(index: &Index, scope: &Scope, text: &str) -> Vec<turnpike_index::Hit> {
    let page = index
        .search(scope, &request(text, Mode::Lexical))
        .await
        .unwrap();
    page.hits
}

/// A unit vector along axis `i` (rows and queries of the bulk case).
fn axis(i: usize) -> Vec<f32> {
    let mut v = vec![0.0; 384];
    v[i % 384] = 1.0;
    v
}

/// A rebuild's load: in bulk mode, batches large enough for Postgres's `COPY` path, with a
/// row twice in one batch, rows replacing earlier ones, another identity's rows in the same
/// batch, and text that needs escaping. Searches stay correct during the load and after; the
/// vector index is back (and valid) after it.
async fn bulk_load(f: Fixture) {
    let f = loaded(f).await;
    let backend = f.index.backend().clone();
    let (carol, alice, bob) = (f.scope("carol"), f.scope("alice"), f.scope("bob"));
    backend.begin_bulk().await.unwrap();
    // Meanwhile, alice's searches by meaning and by words still find her rows, and only hers.
    for mode in [Mode::Vector, Mode::Lexical] {
        let hits = search(&f, "alice", &request("tomato soup with basil", mode)).await;
        assert_eq!(
            hits.first().map(String::as_str),
            Some("recipes.md\nA recipe for tomato soup with basil and garlic."),
            "{mode:?} during the load"
        );
        assert!(!hits.iter().any(|t| t.starts_with("Bob")), "{mode:?}");
    }
    let row = |scope: &Scope, n: usize, text: String| IndexRow {
        scope: scope.clone(),
        info: RowInfo {
            id: RowId::new(format!("conv:tl:c{}/turn_1/blocks/{n}", 100 + n / 50)),
            app: "shop".parse().unwrap(),
            agent: "clerk".parse().unwrap(),
            conversation: conv(&format!("c{}", 100 + n / 50)),
            turn: TurnId::FIRST,
            kind: Kind::Prompt,
            reference: format!("conv:tl:c{}/turn_1/blocks/{n}", 100 + n / 50),
            at_ms: n as i64,
        },
        text,
        embedding: axis(n),
    };
    let mut batch: Vec<IndexRow> = (0..300)
        .map(|n| row(&carol, n, format!("carol note {n} about topic{}", n % 7)))
        .collect();
    // The same id twice: the later copy is what stays.
    batch.push(row(&carol, 5, "rewritten note five".into()));
    // Text COPY must escape, and a NUL Postgres cannot hold.
    batch.push(row(
        &carol,
        301,
        "tab\there, new\nline, back\\slash, \r return, nul\0byte, ünïcödé zebra".into(),
    ));
    // Another identity in the same batch.
    batch.push(row(&bob, 302, "bob's bulk secret walrus".into()));
    backend.upsert(&batch).await.unwrap();
    // The same batch again changes nothing (upserts replace).
    backend.upsert(&batch).await.unwrap();
    if let Some(pg) = &f.pg {
        assert_eq!(
            pg.vector_index_valid().await.unwrap(),
            None,
            "the vector index is set aside during the load"
        );
        assert!(
            !try_vector_lock().await,
            "the load holds the vector index's lock: no worker opening the index builds it"
        );
    }
    // By meaning: the first of carol's rows along axis 5 (n = 5 only: 5 + 384 is past the
    // batch). By words: what a scope's word search returns, as row numbers.
    let nearest_axis5 = || {
        let index = f.index.clone();
        let carol = carol.clone();
        async move {
            let mut r = request("anything", Mode::Vector);
            r.limit = 3;
            let page = index
                .search_embedded(&carol, &r, Some(&axis(5)))
                .await
                .unwrap();
            page.hits.first().map(|h| h.info.at_ms)
        }
    };
    let lexical = |scope: Scope, text: &'static str| {
        let index = f.index.clone();
        async move {
            word_hits(&index, &scope, text)
                .await
                .iter()
                .map(|h| h.info.at_ms as u64)
                .collect::<Vec<_>>()
        }
    };
    // During the load, the loaded rows are found by meaning (an exact scan) and by words.
    assert_eq!(nearest_axis5().await, Some(5));
    assert_eq!(lexical(carol.clone(), "zebra").await, [301]);
    // A second begin joins the running load.
    backend.begin_bulk().await.unwrap();
    backend.end_bulk().await.unwrap();
    // Without a load running, an end makes sure the index is there.
    backend.end_bulk().await.unwrap();

    assert_eq!(backend.count(&carol).await.unwrap(), 301);
    assert_eq!(backend.count(&bob).await.unwrap(), 3);
    assert_eq!(backend.count(&alice).await.unwrap(), 10);
    assert_eq!(nearest_axis5().await, Some(5));
    // By words: the rewritten copy, the escaped text, and the isolation.
    assert_eq!(lexical(carol.clone(), "rewritten").await, [5]);
    assert_eq!(lexical(carol.clone(), "zebra").await, [301]);
    assert_eq!(lexical(carol.clone(), "slash").await, [301]);
    assert!(lexical(carol.clone(), "walrus").await.is_empty());
    assert_eq!(lexical(bob.clone(), "walrus").await, [302]);
    assert!(lexical(alice.clone(), "carol").await.is_empty());
    if let Some(pg) = &f.pg {
        assert_eq!(
            pg.vector_index_valid().await.unwrap(),
            Some(true),
            "the vector index is built again after the load"
        );
        assert!(try_vector_lock().await, "the load let its lock go");
        // The statistics BM25 reads are kept exact through upserts, deletes and forgetting.
        let rows = |scope: Scope| {
            let pg = pg.clone();
            async move { pg.scope_stats(&scope).await.unwrap().0 }
        };
        assert_eq!(rows(carol.clone()).await, 301);
        assert_eq!(rows(bob.clone()).await, 3);
        let in_c100 = Filters {
            conversation: Some(conv("c100")),
            ..Default::default()
        };
        let gone = backend.delete(&carol, &in_c100, None).await.unwrap();
        assert_eq!(gone, 50);
        assert_eq!(rows(carol.clone()).await, 251);
        assert_eq!(backend.forget(&carol).await.unwrap(), 251);
        assert_eq!(pg.scope_stats(&carol).await.unwrap(), (0, 0));
        assert_eq!(rows(bob.clone()).await, 3, "others keep theirs");

        // A load whose process dies (here: its index handle is dropped mid-load) leaves the
        // index set aside and lets the lock go with its session; the next worker opening the
        // index builds it again.
        let url = turnpike_tests::postgres::shared().url();
        let dying = PgIndex::connect(&url, 384).await.unwrap();
        dying.begin_bulk().await.unwrap();
        assert_eq!(pg.vector_index_valid().await.unwrap(), None);
        drop(dying);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !try_vector_lock().await {
            assert!(
                std::time::Instant::now() < deadline,
                "the lock outlived its session"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        // Tests share the server: another test's index, opened at this moment, may have taken
        // the lock to build it first (it is valid once that build ends); else this one did.
        let next = PgIndex::connect(&url, 384).await.unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while next.vector_index_valid().await.unwrap() != Some(true) {
            assert!(
                std::time::Instant::now() < deadline,
                "the vector index was never built again"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// Words ranked as BM25 ranks them, over the caller's own rows: a shorter row with the word
/// outranks a longer one (length normalisation), a rare word outweighs many repeats of a
/// common one (idf and saturation), and another identity's rows shape nothing.
async fn bm25_ranking(f: Fixture) {
    let filler = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima \
                  mike november oscar papa quebec romeo sierra tango uniform victor whiskey";
    let texts = [
        ("short", "turbine blade".to_owned()),
        ("long", format!("turbine blade {filler}")),
        ("repeats", "turbine ".repeat(12)),
        ("rare", "zebra crossing".to_owned()),
        ("common1", "turbine housing".to_owned()),
        ("common2", "turbine shaft".to_owned()),
        ("common3", "turbine inlet".to_owned()),
    ];
    let rows = |user: &str| -> Vec<IndexRow> {
        texts
            .iter()
            .enumerate()
            .map(|(i, (name, text))| IndexRow {
                scope: f.scope(user),
                info: RowInfo {
                    id: RowId::new(format!("{user}-{name}")),
                    app: "notes".parse().unwrap(),
                    agent: "scribe".parse().unwrap(),
                    conversation: conv(&format!("c{}", 200 + i)),
                    turn: TurnId::FIRST,
                    kind: Kind::Prompt,
                    reference: (*name).to_owned(),
                    at_ms: i as i64,
                },
                text: text.clone(),
                embedding: axis(i),
            })
            .collect()
    };
    f.index.backend().upsert(&rows("erin")).await.unwrap();
    let ranked = |text: &'static str| {
        let index = f.index.clone();
        let scope = f.scope("erin");
        async move {
            word_hits(&index, &scope, text)
                .await
                .into_iter()
                .map(|h| h.info.reference)
                .collect::<Vec<_>>()
        }
    };
    let position = |list: &[String], name: &str| list.iter().position(|r| r == name).unwrap();
    let blade = ranked("blade").await;
    assert_eq!(blade, ["short", "long"], "length normalises");
    let both = ranked("turbine zebra").await;
    assert_eq!(both[0], "rare", "{both:?}");
    assert!(position(&both, "repeats") > 0, "{both:?}");
    // Many rows of another identity full of "zebra" change nothing of erin's ranking.
    let mut others: Vec<IndexRow> = rows("frank");
    for (n, row) in others.iter_mut().enumerate() {
        row.text = format!("zebra zebra {n}");
    }
    f.index.backend().upsert(&others).await.unwrap();
    assert_eq!(ranked("turbine zebra").await, both);
}

macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        mod embedded_backend {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() { super::$case(super::embedded().await).await })*
        }
        mod postgres_backend {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() { super::$case(super::postgres().await).await })*
        }
    };
}

suite!(
    exact_term_hits,
    paraphrase_hits,
    fusion_order,
    filters,
    pagination,
    per_conversation_cap,
    idempotent_reindexing,
    isolation,
    forget_and_bad_input,
    memory_lists_and_forgets_only_the_callers_rows,
    bulk_load,
    bm25_ranking,
);
