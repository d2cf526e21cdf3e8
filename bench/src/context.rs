//! `turnpike bench context`: how long rebuilding a turn's context takes as a conversation grows.
//!
//! One conversation per scenario is written straight to a local-filesystem store (records and
//! turn logs as workers write them; each turn: a user message, a tool call and its result, a
//! reply). A rebuild is what a worker does before its agent runs: find the record's head, read
//! the latest summary and the turn logs after it, and assemble the model's messages. Scenarios:
//! turn 10, 100 and 1,000 with compaction off, and turn 1,000 with a summary at turn 900. Each
//! is measured both ways a worker can rebuild: from the snapshot the previous turn left (what
//! workers do), and from the summary plus one turn log per turn (the fallback). The baseline is
//! turn 10 from its snapshot, measured in the same run. The record's head is read once before
//! the timing (a worker knows it: it has just committed the turn's batch one).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use object_store::ObjectStore;
use serde_json::json;
use turnpike_artifactory::{ConversationPrefix, Record, RecordSigner, TurnLogs};
use turnpike_schemas::entry::{
    AssistantMessage, CompactionMarker, ConversationOpened, TurnComplete, TurnDispatched,
    TurnOutcome,
};
use turnpike_schemas::turnlog::TURN_LOG_VERSION;
use turnpike_schemas::{
    Address, Block, ConversationId, EntryBody, Event, EventBody, Identity, TurnId, TurnLog,
    WorkerId,
};
use turnpike_worker::timeline;

use crate::Series;

/// Writes a conversation whose next turn is `next`, with a summary in turn `summary_at`.
pub(crate) async fn build(
    store: &Arc<dyn ObjectStore>,
    signer: &RecordSigner,
    next: u64,
    summary_at: Option<u64>,
) -> Result<(ConversationPrefix, Record)> {
    let conversation = ConversationId::new();
    let prefix = ConversationPrefix::new("bench".parse()?, conversation);
    let record = Record::new(store.clone(), prefix.clone());
    let logs = TurnLogs::new(store.clone());
    let owner: Identity = "local:bench".parse()?;
    let mut running = timeline::Timeline::default();
    let mut head = record.head().await?;
    head = record
        .append(
            signer,
            &head,
            &[EntryBody::ConversationOpened(ConversationOpened {
                tenant: "bench".parse()?,
                owner: owner.clone(),
                app: "bench".parse()?,
                agent: "bench".parse()?,
                at_ms: 0,
            })],
        )
        .await?;
    let address = Address {
        tenant: "bench".parse()?,
        app: "bench".parse()?,
        agent: "bench".parse()?,
        conversation,
        identity: owner,
    };
    for n in 1..next {
        let turn = TurnId::new(n).expect("non-zero");
        let question = format!("Question {n}: could you look at the quarterly numbers in report-{n}.csv and tell me what changed since last time, in two or three sentences?");
        let answer = format!("Answer {n}: revenue grew four percent while costs stayed flat; the one outlier is the March refund batch, which the notes attribute to a billing migration. Nothing else moved by more than a percent. I kept the figures in report-{n}.csv as they were.");
        let event = Event::new(
            address.clone(),
            EventBody::Message {
                text: question.clone(),
            },
            0,
        );
        head = record
            .append(
                signer,
                &head,
                &[
                    EntryBody::input(event, Some(n)),
                    EntryBody::TurnDispatched(TurnDispatched {
                        turn,
                        worker: WorkerId::new(),
                        agent: "bench".parse()?,
                        epoch: turnpike_schemas::Epoch(1),
                        at_ms: 0,
                    }),
                ],
            )
            .await?;
        let mut blocks = vec![
            Block::UserMessage { text: question },
            Block::ToolCall {
                call_id: format!("call_{n}"),
                tool: "read_file".into(),
                arguments: json!({"path": format!("report-{n}.csv")}),
            },
            Block::ToolResult {
                call_id: format!("call_{n}"),
                ok: true,
                output: json!({"path": format!("report-{n}.csv"), "size": 180, "text": "month,revenue,costs\njan,100,80\nfeb,102,80\nmar,104,81\n"}),
            },
            Block::AssistantMessage {
                text: answer.clone(),
            },
        ];
        let mut two = Vec::new();
        if summary_at == Some(n) {
            let through = TurnId::new(n - 1).expect("a summary follows turns");
            let summary = "The user reviews quarterly reports turn by turn; revenue grew steadily, costs stayed flat, and the March refunds came from a billing migration.".to_owned();
            blocks.insert(
                0,
                Block::Summary {
                    through,
                    text: summary.clone(),
                },
            );
            two.push(EntryBody::CompactionMarker(CompactionMarker {
                turn,
                through,
                summary,
                model: "bench".into(),
                prompt: "summarise".into(),
            }));
        }
        // The snapshot the next turn reads (workers write one per turn; only the last is read).
        let snapshot = timeline::snapshot_after(&running, &prefix, turn, &blocks, 2 * 128_000);
        if n + 1 == next {
            logs.write_context(&prefix, &snapshot).await?;
        }
        running.rows = std::sync::Arc::new(snapshot.rows);
        logs.write(
            &prefix,
            &TurnLog {
                version: TURN_LOG_VERSION,
                conversation,
                turn,
                agent: "bench".parse()?,
                outcome: TurnOutcome::Replied,
                blocks,
                usage: None,
                exchange: None,
                unindexed: false,
            },
        )
        .await?;
        two.push(EntryBody::AssistantMessage(AssistantMessage {
            turn,
            text: answer,
        }));
        two.push(EntryBody::TurnComplete(TurnComplete {
            turn,
            outcome: TurnOutcome::Replied,
            log: None,
            log_sha256: None,
            version: None,
            attempt: None,
            at_ms: 0,
        }));
        head = record.append(signer, &head, &two).await?;
    }
    Ok((prefix, record))
}

/// How a rebuild finds the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Mode {
    /// The previous turn's snapshot, known to this process (the worker that promoted it, i.e.
    /// served the previous turn, or read it before).
    Warm,
    /// The previous turn's snapshot, never parsed here (any other worker).
    Cold,
    /// The summary and one turn log per turn after it (the fallback).
    Logs,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Warm => "snapshot, parsed before",
            Mode::Cold => "snapshot, cold",
            Mode::Logs => "turn logs",
        }
    }
}

/// Times `samples` rebuilds of the context of turn `next`.
async fn measure(
    store: &Arc<dyn ObjectStore>,
    prefix: &ConversationPrefix,
    record: &Record,
    next: u64,
    samples: usize,
    mode: Mode,
) -> Result<(Series, usize, usize)> {
    let from_logs = mode == Mode::Logs;
    let logs = TurnLogs::new(store.clone());
    let turn = TurnId::new(next).expect("non-zero");
    let mut times = Vec::with_capacity(samples);
    let mut rows = 0;
    let mut messages = 0;
    // A worker knows the head when its turn starts (it just committed batch one).
    let head = record.head().await?;
    if mode == Mode::Warm {
        timeline::rebuild(&logs, prefix, head.state(), turn).await?;
    }
    let start = Instant::now();
    for _ in 0..samples {
        if mode == Mode::Cold {
            logs.forget_parsed();
        }
        let t = Instant::now();
        let built = if from_logs {
            timeline::rebuild_from_logs(&logs, prefix, head.state(), turn).await?
        } else {
            timeline::rebuild(&logs, prefix, head.state(), turn).await?
        };
        anyhow::ensure!(
            built.from_snapshot != from_logs,
            "the snapshot was not used"
        );
        messages = built.messages().len();
        rows = built.rows.len();
        times.push(t.elapsed());
    }
    Ok((
        Series {
            samples: times,
            total: start.elapsed(),
        },
        rows,
        messages,
    ))
}

pub async fn run(
    samples: usize,
    dir: Option<std::path::PathBuf>,
    store_url: Option<String>,
) -> Result<ExitCode> {
    let (_tmp, store, place) = crate::bench_store(dir, store_url)?;
    let signer = RecordSigner::generate()?;
    println!("turnpike bench context: {place}, {samples} rebuilds per scenario");
    let scenarios: [(&str, u64, Option<u64>); 4] = [
        ("turn 10 (baseline)", 10, None),
        ("turn 100, no compaction", 100, None),
        ("turn 1000, no compaction", 1000, None),
        ("turn 1000, summary at turn 900", 1000, Some(900)),
    ];
    // Each way of rebuilding is compared with turn 10 rebuilt the same way, in this run.
    let mut baseline = std::collections::HashMap::new();
    for (name, next, summary) in scenarios {
        let (prefix, record) = build(&store, &signer, next, summary).await?;
        for mode in [Mode::Warm, Mode::Cold, Mode::Logs] {
            // Warm the page cache the way a busy store would be.
            measure(&store, &prefix, &record, next, 2, mode).await?;
            let (series, rows, messages) =
                measure(&store, &prefix, &record, next, samples, mode).await?;
            let p50 = series.percentile(0.5);
            let base = *baseline.entry(mode).or_insert(p50);
            let how = mode.name();
            println!(
                "{name:<32} {how:<23}  p50 {:>8.3} ms   p99 {:>8.3} ms   {rows:>5} rows {messages:>5} messages   {:>6.2}x turn 10",
                p50.as_secs_f64() * 1e3,
                series.percentile(0.99).as_secs_f64() * 1e3,
                p50.as_secs_f64() / base.as_secs_f64(),
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
