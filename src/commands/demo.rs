//! `turnpike demo`: the whole system on the embedded default, start to finish.
//!
//! It hosts the built-in demo app (a scripted assistant: the `script` model provider, real
//! tools), creates a conversation, attaches a file, and sends a message. Two workers on the
//! embedded bus run the turn: batch one commits, the agent pulls the attachment through the
//! resolver, a follow-up sent meanwhile is folded into the running turn, a report is written in
//! the turn's workspace and published as a hosted file, and batch two commits. A second turn
//! finds the report by its reference. Then it prints the transcript, the references, a replay
//! of the record, and the result of `verify`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use futures::StreamExt as _;
use turnpike_artifactory::{Files, NewConversation, Record, Transcript};
use turnpike_router::Ingress;
use turnpike_schemas::live::LiveFrame;
use turnpike_schemas::{Block, ConversationId, EventBody, Identity, TurnId};
use turnpike_worker::{WorkerConfig, WorkerPool};

use crate::cli::Global;
use crate::commands::conversation::{print_transcript, replay_report, verify};
use crate::commands::runtime::{indexing, open_bus, workers};
use crate::env::{now_ms, Env};

const NOTES: &str = "Launch sync, Monday.\n- The launch moves to Thursday.\n- Ana owns the checklist.\n- Ben checks the billing migration.\n";

pub async fn run(global: &Global) -> Result<ExitCode> {
    if global.nats_url.is_some() {
        bail!("the demo runs on the embedded default; drop --nats-url");
    }
    let env = Env::open(global)?;
    let apps = env.apps(true)?;
    let bus = open_bus(global, &env, Duration::from_secs(30)).await?;
    let owner: Identity = "local:demo-user".parse()?;
    println!("data directory: {}", global.data_dir.display());
    let (entry, record, _) = env
        .conversations
        .create(
            &env.signer,
            NewConversation {
                tenant: "default".parse()?,
                owner: owner.clone(),
                app: "demo".parse()?,
                agent: "assistant".parse()?,
                at_ms: now_ms(),
                instructions: None,
            },
        )
        .await?;
    let conversation = entry.conversation;
    println!("created {conversation} for {owner} (app demo, agent assistant: a scripted model)");

    let files = Files::new(env.conversations.store().clone());
    let attachment = files
        .attach(&entry.prefix(), TurnId::FIRST, "notes.txt", NOTES.into())
        .await?;
    println!("stored an attachment: {attachment}");

    let ingress = Ingress::new(bus.clone(), env.conversations.clone());
    let mut live = bus.subscribe_live(conversation).await?;
    let streamed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let deltas = {
        let streamed = streamed.clone();
        tokio::spawn(async move {
            while let Some(frame) = live.next().await {
                if let Ok(LiveFrame::Delta { .. }) = serde_json::from_slice(&frame) {
                    streamed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        })
    };
    let send = |body: EventBody, key: &str| {
        let (ingress, owner, key) = (ingress.clone(), owner.clone(), key.to_owned());
        async move {
            let kind = body.kind_name();
            let (event, published) = ingress
                .submit(&"default".parse()?, &owner, conversation, body, Some(key))
                .await?;
            println!(
                "sent {kind} {} (lane sequence {}{})",
                event.id,
                published.seq,
                if published.duplicate {
                    ", a duplicate"
                } else {
                    ""
                }
            );
            anyhow::Ok(published)
        }
    };
    send(
        EventBody::Attachment {
            name: "notes.txt".into(),
            media_type: "text/plain".into(),
            size: NOTES.len() as u64,
            reference: attachment.clone(),
            preview: None,
        },
        "demo-attach",
    )
    .await?;
    let message = EventBody::Message {
        text: "Please summarise the attached notes into a report.".into(),
    };
    send(message.clone(), "demo-1").await?;
    // A client retrying the same request: accepted once.
    send(message, "demo-1").await?;

    println!("starting two workers");
    let indexing = indexing(global, &env, false).await;
    let pool = WorkerPool::start(
        workers(
            &env,
            &bus,
            &apps,
            2,
            &WorkerConfig::default(),
            indexing.clone(),
        )
        .await,
    );
    wait(&record, |s| s.last_turn >= 1, "turn_1 to start").await?;
    send(
        EventBody::FollowUp {
            text: "Also list the action items, please.".into(),
        },
        "demo-2",
    )
    .await?;
    wait(
        &record,
        |s| s.last_turn >= 1 && !s.turn_open,
        "turn_1 to finish",
    )
    .await?;
    send(
        EventBody::Message {
            text: "What does the report from before say?".into(),
        },
        "demo-3",
    )
    .await?;
    wait(
        &record,
        |s| s.last_turn >= 2 && !s.turn_open,
        "turn_2 to finish",
    )
    .await?;
    pool.stop().await;
    deltas.abort();
    let streamed = streamed.load(std::sync::atomic::Ordering::Relaxed);

    println!();
    let transcript = Transcript::from_entries(&record.entries().await?);
    print_transcript(&entry, &transcript);
    println!();
    print_references(&env, &entry.prefix(), conversation, 2).await?;
    println!("live: {streamed} streamed deltas were published on tp.live.{conversation} while the turns ran");
    println!();
    search_report(&env, &entry, indexing.as_ref()).await?;
    println!();
    let replay_ok = replay_report(&env, conversation, &"default".parse()?, &owner, None).await?;
    println!();
    let code = verify(&env, conversation, &"default".parse()?, &owner, false).await?;
    println!("\ntry: turnpike conversation replay {conversation} --actor {owner} --what-if 'turn_1/output/4=a different reply'");
    println!("     turnpike serve   (the API on http://127.0.0.1:7700/v1), then in another terminal: turnpike chat");
    if !replay_ok {
        return Ok(ExitCode::from(1));
    }
    Ok(code)
}

/// Waits for both turns to reach the index, then searches the user's conversations by meaning
/// (no word of the query is in the notes) and prints the hits.
async fn search_report(
    env: &Env,
    entry: &turnpike_artifactory::DirectoryEntry,
    indexing: Option<&turnpike_index::indexer::IndexQueue>,
) -> Result<()> {
    let Some(queue) = indexing else {
        println!("search: off (see the warning above; `scripts/services install all` fetches the embedding model)");
        return Ok(());
    };
    let index = queue.index();
    let scope = turnpike_index::indexer::scope_of(entry);
    let deadline = Instant::now() + Duration::from_secs(60);
    while index
        .backend()
        .mark(&scope, entry.conversation)
        .await?
        .map_or(0, |t| t.number())
        < 2
    {
        if Instant::now() > deadline {
            bail!("the turns were not indexed within a minute");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let query = "who is responsible for the launch to-do list?";
    let mut request = turnpike_index::SearchRequest::new(query);
    request.limit = 3;
    let page =
        turnpike_index::hydrate::search(index, &env.resolver(), &entry.owner, &scope, &request)
            .await?;
    println!("search (hybrid: full text + all-MiniLM-L6-v2 vectors, fused): {query:?}");
    for (i, hit) in page.hits.iter().enumerate() {
        let rank = |s: Option<turnpike_index::RetrieverScore>| {
            s.map_or("-".to_owned(), |s| format!("#{}", s.rank))
        };
        println!(
            "  {}. {} {} (lexical {}, vector {})",
            i + 1,
            hit.info.kind.as_str(),
            hit.info.reference,
            rank(hit.lexical),
            rank(hit.vector)
        );
        if let Some(snippet) = &hit.snippet {
            println!("     {snippet}");
        }
    }
    Ok(())
}

/// Waits, polling the record's head, until `done` holds.
async fn wait(
    record: &Record,
    done: impl Fn(&turnpike_schemas::entry::RecordState) -> bool,
    what: &str,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let head = record.head().await?;
        if done(head.state()) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "gave up waiting for {what} (record state {:?})",
                head.state()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Prints every reference the turns made: hosted files (with their download path) and the
/// turn logs.
async fn print_references(
    env: &Env,
    prefix: &turnpike_artifactory::ConversationPrefix,
    conversation: ConversationId,
    turns: u64,
) -> Result<()> {
    println!("references:");
    let logs = env.conversations.turn_logs();
    for n in 1..=turns {
        let turn = TurnId::new(n).expect("non-zero");
        let log = logs.read(prefix, turn).await?;
        println!(
            "  conv:tl:{conversation}/{turn}/log.json  (the turn log, {} blocks)",
            log.blocks.len()
        );
        for block in &log.blocks {
            if let Block::File {
                reference,
                size,
                media_type,
                ..
            } = block
            {
                println!(
                    "  {reference}  ({size} bytes, {media_type}; download: /v1/files/{reference})"
                );
            }
        }
    }
    Ok(())
}
