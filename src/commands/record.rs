//! `turnpike record append`: one echo turn through both batches of the record.
//!
//! A stand-in for the agent loop until lanes and turns exist, so that `verify` and `replay` have
//! records to work on. It follows the life of a turn: batch one (input + `turn_dispatched`)
//! commits before anything runs; the turn log is written; batch two (reply + `turn_complete`)
//! closes the turn.

use std::process::ExitCode;

use anyhow::{Context as _, Result};
use turnpike_artifactory::{DirectoryEntry, Head, NewConversation, Record, Transcript};
use turnpike_schemas::entry::{AssistantMessage, TurnComplete, TurnDispatched, TurnOutcome};
use turnpike_schemas::{
    Address, Block, EntryBody, Event, EventBody, Family, Identity, RefPath, Reference, TurnId,
    TurnLog, WorkerId,
};

use crate::cli::RecordCommand;
use crate::env::{now_ms, Env};

pub async fn run(env: &Env, command: RecordCommand) -> Result<ExitCode> {
    let RecordCommand::Append {
        actor,
        conversation,
        message,
    } = command;
    let (entry, record) = match conversation {
        Some(id) => env.conversations.open(id, &actor.identity).await?,
        None => {
            let (entry, record, _) = create(env, actor.identity.clone()).await?;
            println!("created {}", entry.conversation);
            (entry, record)
        }
    };
    let head = record.head().await?;
    let next = Transcript::from_entries(&record.entries().await?).next_turn();
    let (turn, _) = echo_turn(env, &entry, &record, head, next, &message).await?;
    println!("{} {turn} committed", entry.conversation);
    Ok(ExitCode::SUCCESS)
}

/// Creates a conversation owned by `owner` in the demo tenant and app.
pub async fn create(env: &Env, owner: Identity) -> Result<(DirectoryEntry, Record, Head)> {
    let new = NewConversation {
        tenant: "default".parse()?,
        owner,
        app: "demo".parse()?,
        agent: "echo".parse()?,
        at_ms: now_ms(),
    };
    Ok(env.conversations.create(&env.signer, new).await?)
}

/// Runs turn `turn` answering `text` with an echo. Returns the turn and the new head.
pub async fn echo_turn(
    env: &Env,
    entry: &DirectoryEntry,
    record: &Record,
    head: Head,
    turn: TurnId,
    text: &str,
) -> Result<(TurnId, Head)> {
    let address = Address {
        tenant: entry.tenant.clone(),
        app: entry.app.clone(),
        agent: entry.agent.clone(),
        conversation: entry.conversation,
        identity: entry.owner.clone(),
    };
    let event = Event::new(
        address,
        EventBody::Message {
            text: text.to_owned(),
        },
        now_ms(),
    );
    event.validate()?;
    let batch_one = [
        EntryBody::input(event, None),
        EntryBody::TurnDispatched(TurnDispatched {
            turn,
            worker: WorkerId::new(),
            agent: entry.agent.clone(),
            epoch: 0,
            at_ms: now_ms(),
        }),
    ];
    let head = record.append(&env.signer, &head, &batch_one).await?;
    let reply = format!("echo: {text}");
    let log = TurnLog {
        version: turnpike_schemas::turnlog::TURN_LOG_VERSION,
        conversation: entry.conversation,
        turn,
        agent: entry.agent.clone(),
        outcome: TurnOutcome::Replied,
        blocks: vec![
            Block::UserMessage {
                text: text.to_owned(),
            },
            Block::AssistantMessage {
                text: reply.clone(),
            },
        ],
    };
    env.conversations
        .turn_logs()
        .write(&entry.prefix(), &log)
        .await?;
    let log_ref = Reference::new(
        Family::turn_log(),
        entry.conversation,
        turn,
        RefPath::parse("log.json").context("the turn log path")?,
    );
    let batch_two = [
        EntryBody::AssistantMessage(AssistantMessage { turn, text: reply }),
        EntryBody::TurnComplete(TurnComplete {
            turn,
            outcome: TurnOutcome::Replied,
            log: Some(log_ref),
            at_ms: now_ms(),
        }),
    ];
    let head = record.append(&env.signer, &head, &batch_two).await?;
    Ok((turn, head))
}
