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

use crate::cli::{DemoArgs, DemoModel, Global};
use crate::commands::conversation::{print_transcript, replay_report, verify};
use crate::commands::runtime::{indexing, open_bus, workers};
use crate::env::{now_ms, Env};

const NOTES: &str = "Launch sync, Monday.\n- The launch moves to Thursday.\n- Ana owns the checklist.\n- Ben checks the billing migration.\n";

/// Where the demo's `local` agent finds its model (see `apps/demo.toml`).
pub(crate) const LOCAL_MODEL_URL: &str = "http://127.0.0.1:8080/v1";

pub async fn run(global: &Global, args: DemoArgs) -> Result<ExitCode> {
    if global.nats_url.is_some() {
        bail!("the demo runs on the embedded default; drop --nats-url");
    }
    let (agent, _model_server) = match args.model {
        DemoModel::Script => ("assistant", None),
        DemoModel::Local => ("local", local_model().await?),
    };
    let env = Env::open(global)?;
    let apps = env.apps(true)?;
    let bus = open_bus(global, &env, Duration::from_secs(30)).await?;
    // The identity of `turnpike serve`'s first token: the console opened on this data directory
    // shows the demo's conversation to its first user.
    let owner: Identity = crate::commands::edge::LOCAL_IDENTITY.parse()?;
    println!("data directory: {}", global.data_dir.display());
    let (entry, record, _) = env
        .conversations
        .create(
            &env.signer,
            NewConversation {
                tenant: "default".parse()?,
                owner: owner.clone(),
                app: "demo".parse()?,
                agent: agent.parse()?,
                at_ms: now_ms(),
                instructions: None,
                started_by: None,
            },
        )
        .await?;
    let conversation = entry.conversation;
    match args.model {
        DemoModel::Script => println!(
            "created {conversation} for {owner} (app demo, agent assistant: a scripted model)"
        ),
        DemoModel::Local => println!(
            "created {conversation} for {owner} (app demo, agent local: SmolLM2-135M on {LOCAL_MODEL_URL})"
        ),
    }

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
    // The follow-up joins turn_1 while it runs (a quick model may have finished turn_1 first:
    // then it starts a turn of its own). Either way: wait until the lane is worked off.
    let follow_up = send(
        EventBody::FollowUp {
            text: "Also list the action items, please.".into(),
        },
        "demo-2",
    )
    .await?;
    wait(
        &record,
        |s| s.lane_through >= follow_up.seq && !s.turn_open,
        "turn_1 to finish",
    )
    .await?;
    let question = send(
        EventBody::Message {
            text: "What does the report from before say?".into(),
        },
        "demo-3",
    )
    .await?;
    wait(
        &record,
        |s| s.lane_through >= question.seq && !s.turn_open,
        "the last turn to finish",
    )
    .await?;
    let turns = record.head().await?.state().last_turn;
    pool.stop().await;
    deltas.abort();
    let streamed = streamed.load(std::sync::atomic::Ordering::Relaxed);

    println!();
    let transcript = Transcript::from_entries(&record.entries().await?);
    print_transcript(&entry, &transcript);
    println!();
    print_references(&env, &entry.prefix(), conversation, turns).await?;
    println!("live: {streamed} streamed deltas were published on tp.live.{conversation} while the turns ran");
    println!();
    search_report(&env, &entry, indexing.as_ref()).await?;
    println!();
    let replay_ok = replay_report(&env, conversation, &"default".parse()?, &owner, None).await?;
    println!();
    let code = verify(&env, conversation, &"default".parse()?, &owner, false).await?;
    println!("\ntry: turnpike conversation replay {conversation} --actor {owner} --what-if 'turn_1/output/4=a different reply'");
    println!("     turnpike serve   (the API and console on http://127.0.0.1:7700; its first token, in {}, is {owner}'s: the console and `turnpike chat --conversation {conversation}` show this conversation)", crate::commands::edge::default_tokens_path(global).display());
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
    // A scripted turn takes a second; a small local model's, on two cores, up to minutes.
    let deadline = Instant::now() + Duration::from_secs(300);
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

/// A model server this command started; stopped when dropped.
pub(crate) struct ModelServer(std::process::Child);

impl Drop for ModelServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether an OpenAI-compatible server answers at `url`.
async fn model_answers(url: &str) -> bool {
    let client = reqwest::Client::new();
    matches!(
        tokio::time::timeout(Duration::from_secs(2), client.get(format!("{url}/models")).send()).await,
        Ok(Ok(r)) if r.status().is_success()
    )
}

/// The local model for `--model local`: the one already serving on [`LOCAL_MODEL_URL`], or one
/// started here from what `scripts/services install llm` installed.
pub(crate) async fn local_model() -> Result<Option<ModelServer>> {
    if model_answers(LOCAL_MODEL_URL).await {
        println!("local model: using the server on {LOCAL_MODEL_URL}");
        return Ok(None);
    }
    let state = std::env::var("TURNPIKE_SERVICES_DIR")
        .unwrap_or_else(|_| "/var/tmp/turnpike-services".into());
    let python = format!("{state}/venv/bin/python");
    let gguf = format!("{state}/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !std::path::Path::new(&python).exists() || !std::path::Path::new(&gguf).exists() {
        bail!(
            "no model answers on {LOCAL_MODEL_URL} and none is installed: run `scripts/services install llm` (or start your own OpenAI-compatible server there)"
        );
    }
    println!("local model: starting llama.cpp's server with SmolLM2-135M on {LOCAL_MODEL_URL}");
    let child = std::process::Command::new(&python)
        .args([
            "-m",
            "llama_cpp.server",
            "--model",
            &gguf,
            "--model_alias",
            "smollm2",
            "--host",
            "127.0.0.1",
            "--port",
            "8080",
            "--n_ctx",
            "4096",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let server = ModelServer(child);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !model_answers(LOCAL_MODEL_URL).await {
        if Instant::now() > deadline {
            bail!("the model server did not come up on {LOCAL_MODEL_URL} within two minutes");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(Some(server))
}
