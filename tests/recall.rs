//! Recall: the context rebuild brings in rows of the user's other conversations from the
//! hybrid index — the user's own only, only what every participant of a shared conversation
//! may see, within the token budget, pinned in the turn log so replay needs no index, and a
//! turn that still runs when the index is down.

use std::sync::Arc;
use std::time::Duration;

use turnpike_index::embedded::EmbeddedIndex;
use turnpike_index::postgres::PgIndex;
use turnpike_index::Index;
use turnpike_schemas::{Block, ConversationId, EventBody, Identity, RecallHit, TurnLog};
use turnpike_tests::fixtures::{owner, support_conversation, tenant};
use turnpike_tests::index::embedder;
use turnpike_tests::lanes::wait_for_turns;
use turnpike_tests::postgres::Postgres;
use turnpike_tests::turns::{replies, Rig, RigOptions, LONG};

/// The helper echoes what it was given: the recall message, or "nothing recalled".
const SCRIPT: &str = r#"
[[turn]]
[[turn.step]]
text = "Context: {recalled}"
"#;

const FACT: &str = "The code for my bicycle locker at the station is 4417.";
const QUESTION: &str = "What is the code of the bicycle locker at the station?";

fn stranger() -> Identity {
    "oidc:acme:u-99".parse().unwrap()
}

async fn rig_with(index: Index, recall: &str) -> Rig {
    let mut options = RigOptions::new(SCRIPT);
    options.index = Some(index);
    options.agent_extra = format!("recall = {recall}");
    Rig::with(options).await
}

/// A conversation of `who` in the rig's app whose first turn says `text`, run and indexed.
async fn conversation_saying(
    rig: &Rig,
    index: &Index,
    who: &Identity,
    text: &str,
) -> ConversationId {
    let entry = support_conversation(&rig.conversations, who.clone()).await;
    rig.ingress
        .submit(
            &tenant(),
            who,
            entry.conversation,
            EventBody::Message { text: text.into() },
            None,
        )
        .await
        .unwrap();
    wait_for_turns(&rig.conversations, &[entry.conversation], 1, LONG)
        .await
        .unwrap();
    wait_indexed(index, who, entry.conversation).await;
    entry.conversation
}

async fn wait_indexed(index: &Index, who: &Identity, conversation: ConversationId) {
    let scope = turnpike_index::Scope::new(tenant(), who.clone());
    let deadline = std::time::Instant::now() + LONG;
    while index
        .backend()
        .mark(&scope, conversation)
        .await
        .ok()
        .flatten()
        .is_none()
    {
        assert!(std::time::Instant::now() < deadline, "never indexed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn recall_of(log: &TurnLog) -> (Vec<RecallHit>, Option<String>) {
    log.blocks
        .iter()
        .find_map(|b| match b {
            Block::Recall { hits, note, .. } => Some((hits.clone(), note.clone())),
            _ => None,
        })
        .expect("the turn has a recall block")
}

fn embedded_index() -> (Index, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let index = Index::new(
        Arc::new(EmbeddedIndex::open(dir.path()).unwrap()),
        embedder(),
    );
    (index, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fact_from_another_conversation_is_recalled_by_reference_and_replays_without_the_index() {
    let (index, _dir) = embedded_index();
    let rig = rig_with(index.clone(), "{ k = 3 }").await;
    let a = conversation_saying(&rig, &index, &owner(), FACT).await;
    // The same words from someone else: never recalled for this user.
    let c = conversation_saying(&rig, &index, &stranger(), FACT).await;

    rig.say(QUESTION).await;
    rig.wait_turns(1).await;
    let log = rig.log(1).await;
    let (hits, note) = recall_of(&log);
    assert_eq!(note, None);
    assert!(!hits.is_empty(), "nothing recalled: {log:#?}");
    assert!(hits.iter().all(|h| h.conversation != c), "{hits:#?}");
    assert!(hits.iter().all(|h| h.conversation != rig.conv), "{hits:#?}");
    let fact = hits
        .iter()
        .find(|h| h.conversation == a && h.kind == "prompt")
        .unwrap_or_else(|| panic!("A's message was not recalled: {hits:#?}"));
    assert_eq!(fact.reference, format!("conv:tl:{a}/turn_1/blocks/0"));
    // The model saw it, by reference and with its words.
    let reply = replies(&log).join("\n");
    assert!(reply.contains(&fact.reference), "{reply}");
    assert!(reply.contains("4417"), "{reply}");
    // The record says what was recalled; the turn log keeps no snippet bytes.
    let entries = rig.record().entries().await.unwrap();
    assert!(entries.iter().any(|e| matches!(&e.body,
        turnpike_schemas::EntryBody::Recall(r) if r.references.contains(&fact.reference))));
    let block = log
        .blocks
        .iter()
        .find(|b| matches!(b, Block::Recall { .. }))
        .unwrap();
    let raw = serde_json::to_string(block).unwrap();
    assert!(
        raw.contains(&fact.reference) && !raw.contains("4417"),
        "{raw}"
    );

    // Replay uses the pinned references: no index is involved, and the turn reproduces.
    let report = turnpike_agent::replay::replay(std::slice::from_ref(&log), None).await;
    assert_eq!(report.len(), 1);
    assert!(report[0].divergence.is_none(), "{report:#?}");
    assert_eq!(report[0].outcome, Ok(report[0].recorded_outcome));
    assert_eq!(report[0].blocks, log.blocks);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_shared_conversation_only_what_every_participant_may_see_is_recalled() {
    let (index, _dir) = embedded_index();
    let rig = rig_with(index.clone(), "{ k = 3 }").await;
    let _a = conversation_saying(&rig, &index, &owner(), FACT).await;
    // The rig's conversation is shared with the stranger, who may not see A.
    rig.conversations
        .directory()
        .grant(rig.conv, &stranger())
        .await
        .unwrap();
    rig.say(QUESTION).await;
    rig.wait_turns(1).await;
    let log = rig.log(1).await;
    let (hits, note) = recall_of(&log);
    assert_eq!(note, None);
    assert!(hits.is_empty(), "recalled past a participant: {hits:#?}");
    assert!(replies(&log).join("").contains("nothing recalled"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_budget_recalls_nothing_and_the_turn_runs() {
    let (index, _dir) = embedded_index();
    let rig = rig_with(index.clone(), "{ k = 3, budget_tokens = 5 }").await;
    conversation_saying(&rig, &index, &owner(), FACT).await;
    rig.say(QUESTION).await;
    rig.wait_turns(1).await;
    let log = rig.log(1).await;
    let (hits, note) = recall_of(&log);
    assert!(hits.is_empty() && note.is_none(), "{hits:#?} {note:?}");
    assert_eq!(replies(&log), ["Context: nothing recalled"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_index_down_the_turn_runs_without_recall_and_says_so() {
    let mut pg = Postgres::start().unwrap();
    let backend = PgIndex::connect(&pg.url(), 384).await.unwrap();
    let index = Index::new(Arc::new(backend), embedder());
    let rig = rig_with(index.clone(), "{ k = 3 }").await;
    conversation_saying(&rig, &index, &owner(), FACT).await;
    pg.stop().unwrap();
    rig.say(QUESTION).await;
    rig.wait_turns(1).await;
    let log = rig.log(1).await;
    let (hits, note) = recall_of(&log);
    assert!(hits.is_empty());
    let note = note.expect("a note says why nothing was recalled");
    assert!(note.starts_with("recall skipped: the index"), "{note}");
    assert_eq!(replies(&log), ["Context: nothing recalled"]);
    // The record shows it too.
    let entries = rig.record().entries().await.unwrap();
    assert!(entries.iter().any(|e| matches!(&e.body,
        turnpike_schemas::EntryBody::Recall(r) if r.note.is_some())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grantee_revoked_while_its_message_waited_brings_none_of_its_rows_into_the_owners_turn() {
    let (index, _dir) = embedded_index();
    let mut rig = rig_with(index.clone(), "{ k = 3 }").await;
    // The stranger's own conversation holds the fact.
    let d = conversation_saying(&rig, &index, &stranger(), FACT).await;
    rig.pause().await;
    rig.conversations
        .directory()
        .grant(rig.conv, &stranger())
        .await
        .unwrap();
    rig.send_as(
        &stranger(),
        EventBody::Message {
            text: QUESTION.into(),
        },
    )
    .await;
    // Revoked before any worker ran the turn: the owner is the only reader now.
    rig.conversations
        .directory()
        .revoke(rig.conv, &stranger())
        .await
        .unwrap();
    rig.run();
    rig.wait_turns(1).await;
    let log = rig.log(1).await;
    // The turn ran as the stranger, with recall — and nothing of the stranger's reached it.
    let (hits, note) = recall_of(&log);
    assert_eq!(note, None);
    assert!(hits.iter().all(|h| h.conversation != d), "{hits:#?}");
    assert!(!replies(&log).join("").contains("4417"), "{log:#?}");
}
