//! Small builders for conversations and records.

use std::sync::Arc;

use object_store::ObjectStore;
use turnpike_artifactory::{ConversationPrefix, Head, Record, RecordEntry, RecordSigner};
use turnpike_schemas::entry::{
    AssistantMessage, ConversationOpened, TurnComplete, TurnDispatched, TurnOutcome,
};
use turnpike_schemas::{
    Address, ConversationId, EntryBody, Event, EventBody, Identity, TurnId, WorkerId,
};

/// The tenant every fixture uses.
pub fn tenant() -> turnpike_schemas::TenantId {
    "acme".parse().unwrap()
}

/// The owner every fixture uses.
pub fn owner() -> Identity {
    "oidc:acme:u-17".parse().unwrap()
}

/// A fixed signing key, so tests can sign like the runtime does.
pub fn signer() -> RecordSigner {
    RecordSigner::from_seed([42; 32])
}

/// The turns `entries` dispatch, by number, in order (a turn dispatched twice shows twice).
pub fn dispatched_turns(entries: &[RecordEntry]) -> Vec<u64> {
    let mut turns: Vec<u64> = entries
        .iter()
        .filter_map(|e| match &e.body {
            EntryBody::TurnDispatched(d) => Some(d.turn.number()),
            _ => None,
        })
        .collect();
    turns.sort_unstable();
    turns
}

/// The opening entry of a fresh conversation.
pub fn opened() -> EntryBody {
    EntryBody::ConversationOpened(ConversationOpened {
        tenant: tenant(),
        owner: owner(),
        app: "support".parse().unwrap(),
        agent: "helper".parse().unwrap(),
        at_ms: 1,
    })
}

/// A user message on `conversation`.
pub fn message(conversation: ConversationId, text: &str) -> EntryBody {
    message_at(conversation, text, None)
}

/// A user message on `conversation`, taken from its lane at `lane_seq`.
pub fn message_at(conversation: ConversationId, text: &str, lane_seq: Option<u64>) -> EntryBody {
    let address = Address {
        tenant: tenant(),
        app: "support".parse().unwrap(),
        agent: "helper".parse().unwrap(),
        conversation,
        identity: owner(),
    };
    EntryBody::input(
        Event::new(address, EventBody::Message { text: text.into() }, 2),
        lane_seq,
    )
}

/// Batch one of turn `n`: the input and the dispatch marker.
pub fn batch_one(conversation: ConversationId, n: u64, text: &str) -> Vec<EntryBody> {
    vec![
        message(conversation, text),
        EntryBody::TurnDispatched(TurnDispatched {
            turn: TurnId::new(n).unwrap(),
            worker: WorkerId::new(),
            agent: "helper".parse().unwrap(),
            epoch: turnpike_schemas::Epoch(1),
            at_ms: 3,
        }),
    ]
}

/// Batch two of turn `n`: a reply and the completion marker.
pub fn batch_two(n: u64, reply: &str) -> Vec<EntryBody> {
    let turn = TurnId::new(n).unwrap();
    vec![
        EntryBody::AssistantMessage(AssistantMessage {
            turn,
            text: reply.into(),
        }),
        EntryBody::TurnComplete(TurnComplete {
            turn,
            outcome: TurnOutcome::Replied,
            log: None,
            log_sha256: None,
            version: None,
            attempt: None,
            at_ms: 4,
        }),
    ]
}

/// The log of `turn` (the `helper` agent, replied) in `conversation`, holding `blocks`.
pub fn turn_log(
    conversation: ConversationId,
    turn: TurnId,
    blocks: Vec<turnpike_schemas::Block>,
) -> turnpike_schemas::TurnLog {
    turnpike_schemas::TurnLog {
        version: turnpike_schemas::turnlog::TURN_LOG_VERSION,
        conversation,
        turn,
        agent: "helper".parse().unwrap(),
        outcome: TurnOutcome::Replied,
        usage: None,
        exchange: None,
        unindexed: false,
        blocks,
    }
}

/// A record with an opening batch and `turns` complete turns (2 batches each).
pub async fn record_with_turns(store: Arc<dyn ObjectStore>, turns: u64) -> (Record, Head) {
    let conversation = ConversationId::new();
    let record = Record::new(store, ConversationPrefix::new(tenant(), conversation));
    let signer = signer();
    let mut head = record.head().await.unwrap();
    head = record.append(&signer, &head, &[opened()]).await.unwrap();
    for n in 1..=turns {
        head = record
            .append(
                &signer,
                &head,
                &batch_one(conversation, n, &format!("question {n}")),
            )
            .await
            .unwrap();
        head = record
            .append(&signer, &head, &batch_two(n, &format!("answer {n}")))
            .await
            .unwrap();
    }
    (record, head)
}

/// A conversation of `owner` (the fixture tenant, app and agent) whose turn 1 hosted `name`
/// with `bytes`, promoted as a committed turn's would be; returns the file's reference.
/// A new conversation of `owner` in the fixture tenant, app `support`, agent `helper`.
pub async fn support_conversation(
    conversations: &turnpike_artifactory::Conversations,
    owner: Identity,
) -> turnpike_artifactory::DirectoryEntry {
    let (entry, _, _) = conversations
        .create(
            &signer(),
            turnpike_artifactory::NewConversation {
                tenant: tenant(),
                owner,
                app: "support".parse().unwrap(),
                agent: "helper".parse().unwrap(),
                at_ms: 1,
                instructions: None,
                started_by: None,
            },
        )
        .await
        .unwrap();
    entry
}

pub async fn conversation_with_file(
    conversations: &turnpike_artifactory::Conversations,
    owner: Identity,
    name: &str,
    bytes: &'static str,
) -> turnpike_schemas::Reference {
    let entry = support_conversation(conversations, owner).await;
    let prefix = entry.prefix();
    let files = turnpike_artifactory::Files::new(conversations.store().clone());
    let reference = files
        .host(
            &prefix,
            TurnId::FIRST,
            1,
            &turnpike_schemas::RefPath::parse(name).unwrap(),
            bytes.into(),
        )
        .await
        .unwrap();
    turnpike_artifactory::attempts::promote(files.store(), &prefix, TurnId::FIRST, 1)
        .await
        .unwrap();
    reference
}
