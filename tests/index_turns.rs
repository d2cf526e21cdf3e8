//! Finished turns reach the hybrid index: through the worker, for the `search` tool, across a
//! Postgres outage, and again from the records by a rebuild.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use turnpike_index::embedded::EmbeddedIndex;
use turnpike_index::indexer::Indexer;
use turnpike_index::postgres::PgIndex;
use turnpike_index::{Backend, Index, Kind, Mode, Scope, SearchRequest};
use turnpike_schemas::Block;
use turnpike_tests::fixtures::{owner, tenant};
use turnpike_tests::index::embedder;
use turnpike_tests::postgres::Postgres;
use turnpike_tests::turns::{replies, Rig, RigOptions};

const SCRIPT: &str = r#"
[[turn]]
when = "search my history"
[[turn.step]]
tool_calls = [{ name = "search", arguments = { query = "fractured engine components" } }]
[[turn.step]]
text = "Found: {last_tool}"

[[turn]]
[[turn.step]]
text = "Noted: {last_user}"
"#;

fn scope() -> Scope {
    Scope::new(tenant(), owner())
}

/// Waits until the index has every turn of the conversation through `turn`.
async fn wait_indexed(backend: &Arc<dyn Backend>, conv: &str, turn: u64, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(mark)) = backend.mark(&scope(), conv.parse().unwrap()).await {
            if mark.number() >= turn {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "turn {turn} was not indexed within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn all_of(text: &str) -> SearchRequest {
    let mut r = SearchRequest::new(text);
    r.mode = Mode::Vector;
    r.limit = 100;
    r
}

/// Every row of the scope, as (reference, kind, turn).
async fn rows(index: &Index) -> BTreeSet<(String, String, u64)> {
    let page = index
        .search(&scope(), &all_of("anything at all"))
        .await
        .unwrap();
    page.hits
        .into_iter()
        .map(|h| {
            (
                h.info.reference,
                h.info.kind.as_str().to_owned(),
                h.info.turn.number(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_turns_are_indexed_and_the_search_tool_finds_them_by_meaning() {
    let dir = tempfile::tempdir().unwrap();
    let index = Index::new(
        Arc::new(EmbeddedIndex::open(dir.path()).unwrap()),
        embedder(),
    );
    let mut options = RigOptions::new(SCRIPT);
    options.tools.push("search".into());
    options.index = Some(index.clone());
    let rig = Rig::with(options).await;
    let conv = rig.conv.to_string();

    rig.say("The turbine blade inspection found a hairline crack near the root.")
        .await;
    rig.wait_turns(1).await;
    wait_indexed(index.backend(), &conv, 1, Duration::from_secs(30)).await;
    let indexed = rows(&index).await;
    let kinds: Vec<&str> = indexed.iter().map(|(_, k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["prompt", "completion"], "{indexed:?}");

    // The model searches by meaning: no word of its query is in the message.
    rig.say("search my history please").await;
    rig.wait_turns(2).await;
    let log = rig.log(2).await;
    let result = log
        .blocks
        .iter()
        .find_map(|b| match b {
            Block::ToolResult {
                ok: true, output, ..
            } => Some(output.clone()),
            _ => None,
        })
        .expect("the search tool answered");
    let hits = result["hits"].as_array().unwrap();
    let first = &hits[0];
    assert_eq!(
        first["reference"],
        format!("conv:tl:{conv}/turn_1/blocks/0"),
        "{result}"
    );
    assert_eq!(first["kind"], "prompt");
    assert!(
        first["snippet"]
            .as_str()
            .unwrap()
            .contains("hairline crack"),
        "{result}"
    );
    assert!(replies(&log)[0].starts_with("Found: "));

    // Only the owner's scope holds the rows.
    let stranger = Scope::new(tenant(), "test:someone-else".parse().unwrap());
    let page = index
        .search(&stranger, &all_of("turbine crack"))
        .await
        .unwrap();
    assert!(page.hits.is_empty());

    // Catching up again, or rebuilding everything, changes nothing.
    wait_indexed(index.backend(), &conv, 2, Duration::from_secs(30)).await;
    let before = rows(&index).await;
    let indexer = Indexer::new(index.clone(), rig.conversations.store().clone());
    assert_eq!(
        indexer.catch_up(rig.conv).await.unwrap(),
        0,
        "nothing after the mark"
    );
    assert_eq!(indexer.rebuild(true).await.unwrap(), (1, 2));
    assert_eq!(rows(&index).await, before);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_down_while_indexing_then_rows_arrive_when_it_returns_and_a_rebuild_matches() {
    let mut pg = Postgres::start().unwrap();
    let backend = PgIndex::connect(&pg.url(), 384).await.unwrap();
    let index = Index::new(Arc::new(backend.clone()), embedder());
    let mut options = RigOptions::new(SCRIPT);
    options.index = Some(index.clone());
    let rig = Rig::with(options).await;
    let conv = rig.conv.to_string();
    let queue = rig.indexing.clone().unwrap();

    rig.say("Please order new turbine blades for the north plant.")
        .await;
    rig.wait_turns(1).await;
    wait_indexed(index.backend(), &conv, 1, Duration::from_secs(30)).await;

    pg.stop().unwrap();
    rig.say("Also send a reminder about the overdue invoice.")
        .await;
    rig.wait_turns(2).await;
    // The turn completed without the index; its indexing failed and waits for a retry.
    let deadline = Instant::now() + Duration::from_secs(60);
    while queue.pending() == 0 {
        assert!(
            Instant::now() < deadline,
            "the failed indexing was never queued for retry"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(index.search(&scope(), &all_of("invoice")).await.is_err());

    pg.restart().unwrap();
    wait_indexed(index.backend(), &conv, 2, Duration::from_secs(120)).await;
    let mut lexical = SearchRequest::new("overdue invoice reminder");
    lexical.mode = Mode::Lexical;
    let page = index.search(&scope(), &lexical).await.unwrap();
    assert_eq!(
        page.hits[0].info.reference,
        format!("conv:tl:{conv}/turn_2/blocks/0")
    );
    assert_eq!(page.hits[0].info.kind, Kind::Prompt);
    let live = rows(&index).await;
    assert_eq!(live.len(), 4, "two prompts, two completions: {live:?}");

    // Lose the index, rebuild it from the records: the same rows.
    assert_eq!(index.backend().forget(&scope()).await.unwrap(), 4);
    assert!(rows(&index).await.is_empty());
    let indexer = Indexer::new(index.clone(), rig.conversations.store().clone());
    assert_eq!(indexer.rebuild(false).await.unwrap(), (1, 2));
    assert_eq!(rows(&index).await, live);
    assert_eq!(
        index.search(&scope(), &lexical).await.unwrap().hits,
        page.hits
    );
    // A full rebuild (Postgres in bulk mode: the vector index set aside, then built again):
    // the same rows, the same hits, and the index back.
    assert_eq!(indexer.rebuild(true).await.unwrap(), (1, 2));
    assert_eq!(rows(&index).await, live);
    assert_eq!(
        index.search(&scope(), &lexical).await.unwrap().hits,
        page.hits
    );
    assert_eq!(backend.vector_index_valid().await.unwrap(), Some(true));
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catching_up_one_turn_reads_the_records_tail_not_the_whole_record() {
    let rig = Rig::with(RigOptions::new(SCRIPT)).await;
    for i in 1..=30u64 {
        rig.say(&format!("message number {i} about turbine blades"))
            .await;
        rig.wait_turns(i).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let index = Index::new(
        Arc::new(EmbeddedIndex::open(dir.path()).unwrap()),
        embedder(),
    );
    let indexer = Indexer::new(index.clone(), rig.conversations.store().clone());
    assert_eq!(indexer.rebuild(false).await.unwrap(), (1, 30));
    let batches = rig.record().head().await.unwrap().batches();
    assert!(batches >= 60, "two batches per turn at least: {batches}");

    rig.say("message number 31").await;
    rig.wait_turns(31).await;
    rig.counting.reset();
    assert_eq!(indexer.catch_up(rig.conv).await.unwrap(), 1);
    // The head, a window of the last batches, one turn log, the directory entry: a count that
    // does not grow with the record (a full read would be one per batch, 60+).
    // The count is store-wide: the worker's own tail work after turn 31 (promotion, head
    // hints) may land in it on a loaded machine (20 alone, 33 seen under a parallel build), so
    // the bound is the record's size, which a full read alone would reach.
    let reads = rig.counting.gets();
    assert!(
        reads < batches as usize,
        "{reads} reads to index one turn of a {batches}-batch record"
    );
    // The window's listing, and the conversation's forget markers before and after writing
    // (so that a row forgotten meanwhile is not written back). The worker's background loops
    // (webhook and schedule dispatch) list their own shards meanwhile: not counted.
    let listed = rig.counting.listed();
    let conv = rig.conv.to_string();
    let ours = listed.iter().filter(|p| p.contains(&conv)).count();
    assert!(ours <= 3, "{ours} listings of the conversation: {listed:?}");
    rig.counting.reset();
    assert_eq!(indexer.catch_up(rig.conv).await.unwrap(), 0);
    let idle = rig.counting.gets();
    assert!(
        idle < reads,
        "nothing to do reads no window and no log ({idle} reads)"
    );
    assert_eq!(rows(&index).await.len(), 62);
    rig.stop().await;
}
