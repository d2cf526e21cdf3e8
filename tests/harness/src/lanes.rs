//! Helpers for lane tests: conversations, concurrent publishing, and the checks that every
//! conversation's events were committed in lane order, none lost, none twice.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use turnpike_artifactory::{
    ConversationPrefix, Conversations, NewConversation, Record, RecordSigner, Transcript,
};
use turnpike_router::{Bus, Ingress};
use turnpike_schemas::{ConversationId, EntryBody, EventBody, Identity};

use crate::fixtures;

/// Creates `n` conversations owned by the fixture owner.
pub async fn create_conversations(
    conversations: &Conversations,
    signer: &RecordSigner,
    n: usize,
) -> Vec<ConversationId> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let (entry, _, _) = conversations
            .create(
                signer,
                NewConversation {
                    tenant: fixtures::tenant(),
                    owner: fixtures::owner(),
                    app: "support".parse().unwrap(),
                    agent: "helper".parse().unwrap(),
                    at_ms: 1,
                    instructions: None,
                    started_by: None,
                },
            )
            .await
            .expect("creating a conversation");
        out.push(entry.conversation);
    }
    out
}

/// The text of event `j` of conversation number `i`.
pub fn text(i: usize, j: usize) -> String {
    format!("c{i}-e{j}")
}

/// Publishes events `from..to` of every conversation: conversations concurrently, each one's
/// events in order. Every event carries an idempotency key, and a publish that fails (the bus
/// is away) is retried with the same key until `deadline`.
pub async fn publish(
    bus: Arc<dyn Bus>,
    conversations: &Conversations,
    convs: &[ConversationId],
    from: usize,
    to: usize,
    deadline: Duration,
) -> Result<()> {
    let ingress = Ingress::new(bus, conversations.clone());
    let owner: Identity = fixtures::owner();
    let mut tasks = Vec::new();
    for (i, conv) in convs.iter().copied().enumerate() {
        let ingress = ingress.clone();
        let owner = owner.clone();
        tasks.push(tokio::spawn(async move {
            let until = Instant::now() + deadline;
            for j in from..to {
                loop {
                    let body = EventBody::Message { text: text(i, j) };
                    match ingress
                        .submit(
                            &fixtures::tenant(),
                            &owner,
                            conv,
                            body,
                            Some(format!("k{j}")),
                        )
                        .await
                    {
                        Ok(_) => break,
                        Err(e) if Instant::now() < until => {
                            let _ = e;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(e) => bail!("publishing {} failed: {e}", text(i, j)),
                    }
                }
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// The record of a fixture-tenant conversation.
pub fn record(conversations: &Conversations, conv: ConversationId) -> Record {
    Record::new(
        conversations.store().clone(),
        ConversationPrefix::new(fixtures::tenant(), conv),
    )
}

/// Waits until every conversation has `turns` closed turns.
pub async fn wait_for_turns(
    conversations: &Conversations,
    convs: &[ConversationId],
    turns: u64,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut pending: Vec<ConversationId> = convs.to_vec();
    while !pending.is_empty() {
        let mut still = Vec::new();
        for conv in pending {
            let head = record(conversations, conv).head().await?;
            if head.state().last_turn < turns || head.state().turn_open {
                still.push(conv);
            }
        }
        pending = still;
        if pending.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            let head = record(conversations, pending[0]).head().await?;
            bail!(
                "{} conversations unfinished after {timeout:?}; e.g. {} at {:?}",
                pending.len(),
                pending[0],
                head.state()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Checks conversation number `i`: its `n` events committed in lane order, none lost, none
/// twice, each answered in its own committed turn, and the record verifies.
pub async fn check_conversation(
    conversations: &Conversations,
    signer: &RecordSigner,
    conv: ConversationId,
    i: usize,
    n: usize,
) -> Result<()> {
    let record = record(conversations, conv);
    let entries = record.entries().await?;
    let inputs: Vec<_> = entries.iter().filter_map(|e| e.body.as_input()).collect();
    let texts: Vec<String> = inputs
        .iter()
        .map(|input| match &input.event.body {
            EventBody::Message { text } => text.clone(),
            other => other.kind_name().to_owned(),
        })
        .collect();
    let expected: Vec<String> = (0..n).map(|j| text(i, j)).collect();
    ensure!(
        texts == expected,
        "{conv}: inputs {texts:?}, expected {expected:?}"
    );
    let seqs: Vec<u64> = inputs.iter().map(|i| i.lane_seq.unwrap_or(0)).collect();
    ensure!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "{conv}: lane sequences out of order: {seqs:?}"
    );
    let transcript = Transcript::from_entries(&entries);
    ensure!(
        transcript.committed.len() == n,
        "{conv}: {} committed turns, expected {n}",
        transcript.committed.len()
    );
    ensure!(
        transcript.incomplete.is_empty() && transcript.quarantined.is_empty(),
        "{conv}: unfinished turns"
    );
    for (j, view) in transcript.committed.iter().enumerate() {
        let replies: Vec<&str> = view
            .entries
            .iter()
            .filter_map(|e| match &e.body {
                EntryBody::AssistantMessage(m) => Some(m.text.as_str()),
                _ => None,
            })
            .collect();
        let want = format!("echo: {}", text(i, j));
        ensure!(
            replies == [want.as_str()],
            "{conv} {}: replies {replies:?}",
            view.turn
        );
        let dispatches = crate::fixtures::dispatched_turns(&view.entries).len();
        ensure!(
            dispatches == 1,
            "{conv} {}: {dispatches} dispatches",
            view.turn
        );
    }
    let keys = turnpike_artifactory::TrustedKeys::new([signer.verifying_key()]);
    if let Err(failure) = record.verify(&keys, None).await? {
        bail!("{conv}: {failure}");
    }
    Ok(())
}
