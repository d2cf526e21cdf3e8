//! The turn end to end on the embedded bus: the agent loop with the `script` provider, tools,
//! folding, steering, stopping, budgets, live deltas, the timeline's bounded reads, and replay.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt as _;
use object_store::memory::InMemory;
use object_store::ObjectStore;
use serde_json::{json, Value};
use tokio::sync::Notify;
use turnpike_agent::agent_loop::{CANCELLED_RESULT, CLOSING_PROMPT, FALLBACK_REPLY};
use turnpike_agent::model::ToolSpec;
use turnpike_artifactory::{ConversationPrefix, Files, Record, TurnLogs};
use turnpike_schemas::entry::{CompactionMarker, IngressDirective, TurnOutcome};
use turnpike_schemas::live::LiveFrame;
use turnpike_schemas::{Block, ConversationId, EntryBody, EntryKind, EventBody, TurnId};
use turnpike_tests::counting::CountingStore;
use turnpike_tests::fixtures::{
    batch_one, batch_two, dispatched_turns, opened, owner, signer, tenant,
};
use turnpike_tests::turns::{replies, tool_calls, Rig, RigOptions, LONG};
use turnpike_worker::tools::{Tool, ToolContext, ToolOutput};

/// What the blocking test tool saw.
#[derive(Default)]
struct Probe {
    started: Notify,
    running: AtomicBool,
    dropped: AtomicBool,
}

/// `block`: a tool that runs until it is cancelled.
struct Block_(Arc<Probe>);

struct DropFlag(Arc<Probe>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.dropped.store(true, Ordering::SeqCst);
    }
}

#[async_trait]
impl Tool for Block_ {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "block".into(),
            description: "runs until cancelled".into(),
            parameters: json!({"type": "object"}),
        }
    }

    async fn call(&self, _cx: &ToolContext<'_>, _args: Value) -> Result<ToolOutput, String> {
        let _flag = DropFlag(self.0.clone());
        self.0.running.store(true, Ordering::SeqCst);
        self.0.started.notify_waiters();
        std::future::pending::<()>().await;
        unreachable!()
    }
}

const LOOPING: &str = r#"
[[turn]]
closing = "I listed the workspace {last_user} and found nothing to report."
[[turn.step]]
tool_calls = [{ name = "list_files" }]
"#;

#[tokio::test]
async fn budget_exhaustion_ends_with_a_closing_reply() {
    let rig = Rig::start(LOOPING, 3).await;
    rig.say("again and again").await;
    rig.wait_turns(1).await;
    let log = rig.log(1).await;
    assert_eq!(log.outcome, TurnOutcome::Replied);
    assert_eq!(
        tool_calls(&log),
        ["list_files"; 3],
        "three rounds, then the closing call"
    );
    assert_eq!(
        replies(&log),
        ["I listed the workspace again and again and found nothing to report."]
    );
    rig.stop().await;
}

#[tokio::test]
async fn an_empty_closing_reply_becomes_the_fallback() {
    let rig = Rig::start(
        "[[turn]]\n[[turn.step]]\ntool_calls = [{ name = \"list_files\" }]\n",
        2,
    )
    .await;
    rig.say("loop").await;
    rig.wait_turns(1).await;
    let log = rig.log(1).await;
    assert_eq!(tool_calls(&log).len(), 2);
    assert_eq!(replies(&log), [FALLBACK_REPLY]);
    assert!(!CLOSING_PROMPT.is_empty());
    rig.stop().await;
}

#[tokio::test]
async fn an_ingress_directive_lowers_the_budget_and_never_raises_it() {
    let low = Rig::with(RigOptions {
        max_rounds: 3,
        directive: Some(IngressDirective {
            max_rounds: Some(1),
            required_approver: None,
        }),
        ..RigOptions::new(LOOPING)
    })
    .await;
    low.say("x").await;
    low.wait_turns(1).await;
    assert_eq!(tool_calls(&low.log(1).await).len(), 1);
    let entries = low.record().entries().await.unwrap();
    assert!(entries
        .iter()
        .any(|e| e.body.kind() == EntryKind::IngressDirective));
    low.stop().await;

    let high = Rig::with(RigOptions {
        max_rounds: 3,
        directive: Some(IngressDirective {
            max_rounds: Some(50),
            required_approver: None,
        }),
        ..RigOptions::new(LOOPING)
    })
    .await;
    high.say("x").await;
    high.wait_turns(1).await;
    assert_eq!(tool_calls(&high.log(1).await).len(), 3);
    high.stop().await;
}

const WAITING: &str = r#"
[[turn]]
[[turn.step]]
wait_for_input = true
tool_calls = [{ name = "list_files" }]
[[turn.step]]
text = "now answering: {last_user}"
"#;

#[tokio::test]
async fn a_follow_up_during_a_turn_is_folded_in_before_the_next_round() {
    let rig = Rig::start(WAITING, 8).await;
    rig.say("first question").await;
    rig.wait_dispatched(1).await;
    rig.send(EventBody::FollowUp {
        text: "and one more thing".into(),
    })
    .await;
    rig.wait_turns(1).await;
    let log = rig.log(1).await;
    assert_eq!(replies(&log), ["now answering: and one more thing"]);
    let kinds: Vec<&str> = log.blocks.iter().map(|b| b.kind_name()).collect();
    assert_eq!(
        kinds,
        [
            "user_message",
            "tool_call",
            "tool_result",
            "follow_up",
            "assistant_message"
        ]
    );
    // Committed to the record inside the turn, before the round that saw it.
    let kinds: Vec<EntryKind> = rig
        .record()
        .entries()
        .await
        .unwrap()
        .iter()
        .map(|e| e.body.kind())
        .filter(|k| *k != EntryKind::SignedRoot)
        .collect();
    let dispatched = kinds
        .iter()
        .position(|k| *k == EntryKind::TurnDispatched)
        .unwrap();
    let follow = kinds
        .iter()
        .position(|k| *k == EntryKind::FollowUp)
        .unwrap();
    let complete = kinds
        .iter()
        .position(|k| *k == EntryKind::TurnComplete)
        .unwrap();
    assert!(dispatched < follow && follow < complete, "{kinds:?}");
    rig.stop().await;
}

#[tokio::test]
async fn a_steer_redirects_the_next_round() {
    let rig = Rig::start(WAITING, 8).await;
    rig.say("write about cats").await;
    rig.wait_dispatched(1).await;
    rig.send(EventBody::Steer {
        text: "dogs instead".into(),
    })
    .await;
    rig.wait_turns(1).await;
    let log = rig.log(1).await;
    assert_eq!(
        replies(&log),
        ["now answering: [steer: change course] dogs instead"]
    );
    assert!(log
        .blocks
        .iter()
        .any(|b| matches!(b, Block::Steer { text } if text == "dogs instead")));
    rig.stop().await;
}

#[tokio::test]
async fn a_stop_cancels_the_model_stream_and_the_turn_is_committed_cancelled() {
    let rig = Rig::start(
        "[[turn]]\n[[turn.step]]\ndelay_ms = 600000\ntext = \"never\"\n",
        8,
    )
    .await;
    rig.say("take your time").await;
    rig.wait_dispatched(1).await;
    rig.send(EventBody::Stop {
        reason: Some("changed my mind".into()),
    })
    .await;
    rig.wait_turns(1).await;
    let log = rig.log(1).await;
    assert_eq!(log.outcome, TurnOutcome::Cancelled);
    assert!(replies(&log).is_empty());
    assert!(matches!(log.blocks.last(), Some(Block::Stop { .. })));
    let kinds: Vec<EntryKind> = rig
        .record()
        .entries()
        .await
        .unwrap()
        .iter()
        .map(|e| e.body.kind())
        .collect();
    assert!(kinds.contains(&EntryKind::Stop));
    assert!(kinds.contains(&EntryKind::Cancelled));
    // The conversation goes on.
    rig.say("hello again").await;
    rig.wait_dispatched(2).await;
    rig.send(EventBody::Stop { reason: None }).await;
    rig.wait_turns(2).await;
    rig.stop().await;
}

/// An owner writes the open-turn mark while it reads the lane for a wake past the record (a
/// turn's batch one waits for it). A drain that then opens no turn — a stop with no turn to
/// stop — clears it as it ends: no mark is left for the sweep, and the next message runs.
#[tokio::test]
async fn a_drain_that_opens_no_turn_leaves_no_open_turn_mark() {
    let rig = Rig::start(ANSWER, 3).await;
    rig.send(EventBody::Stop { reason: None }).await;
    turnpike_tests::wait::until(LONG, "the stop in the record", || async {
        let entries = rig.record().entries().await.unwrap();
        entries
            .iter()
            .any(|e| e.body.kind() == EntryKind::Stop)
            .then_some(())
    })
    .await;
    rig.wait_settled().await;
    let entries = rig.record().entries().await.unwrap();
    assert!(
        !entries
            .iter()
            .any(|e| e.body.kind() == EntryKind::TurnDispatched),
        "a stop alone opens no turn"
    );
    assert!(!rig
        .conversations
        .open_turns()
        .list()
        .await
        .unwrap()
        .contains(&rig.prefix()));
    rig.say("after the stop").await;
    rig.wait_turns(1).await;
    assert_eq!(replies(&rig.log(1).await), ["answer to after the stop"]);
    rig.wait_settled().await;
    rig.stop().await;
}

#[tokio::test]
async fn stops_and_steers_reach_a_running_turn_by_the_lanes_signal_without_polling() {
    // Polling once an hour: only the bus's signal can bring the steer and the stop in.
    let mut options = RigOptions::new(WAITING);
    options.lane_poll = Duration::from_secs(3600);
    let rig = Rig::with(options).await;
    rig.say("write about cats").await;
    rig.wait_dispatched(1).await;
    rig.send(EventBody::Steer {
        text: "dogs instead".into(),
    })
    .await;
    rig.wait_turns(1).await;
    assert_eq!(
        replies(&rig.log(1).await),
        ["now answering: [steer: change course] dogs instead"]
    );
    let mut options =
        RigOptions::new("[[turn]]\n[[turn.step]]\ndelay_ms = 600000\ntext = \"never\"\n");
    options.lane_poll = Duration::from_secs(3600);
    let rig = Rig::with(options).await;
    rig.say("take your time").await;
    rig.wait_dispatched(1).await;
    rig.send(EventBody::Stop { reason: None }).await;
    rig.wait_turns(1).await;
    assert_eq!(rig.log(1).await.outcome, TurnOutcome::Cancelled);
}

#[tokio::test]
async fn a_stop_while_a_tool_runs_cancels_the_tool() {
    let probe = Arc::new(Probe::default());
    let mut options =
        RigOptions::new("[[turn]]\n[[turn.step]]\ntool_calls = [{ name = \"block\" }]\n");
    options.tools.push("block".into());
    options.native.push(Arc::new(Block_(probe.clone())));
    let rig = Rig::with(options).await;
    let started = probe.started.notified();
    rig.say("run the long tool").await;
    tokio::time::timeout(LONG, started).await.unwrap();
    assert!(probe.running.load(Ordering::SeqCst));
    rig.send(EventBody::Stop { reason: None }).await;
    rig.wait_turns(1).await;
    assert!(
        probe.dropped.load(Ordering::SeqCst),
        "the tool was not cancelled"
    );
    let log = rig.log(1).await;
    assert_eq!(log.outcome, TurnOutcome::Cancelled);
    let kinds: Vec<&str> = log.blocks.iter().map(|b| b.kind_name()).collect();
    assert_eq!(kinds, ["user_message", "tool_call", "tool_result", "stop"]);
    assert!(
        matches!(&log.blocks[2], Block::ToolResult { ok: false, output, .. }
        if output["error"] == CANCELLED_RESULT)
    );
    rig.stop().await;
}

const FILES: &str = r##"
[[turn]]
when = "summarise"
[[turn.step]]
tool_calls = [{ name = "pull", arguments = { reference = "{attachment}", path = "notes.txt" } }]
[[turn.step]]
tool_calls = [{ name = "write_file", arguments = { path = "out/report.md", content = "# Report\nfrom the notes" } }]
[[turn.step]]
tool_calls = [{ name = "publish", arguments = { path = "out/report.md" } }]
[[turn.step]]
text = "Your report: {file:report.md}"

[[turn]]
when = "report again"
[[turn.step]]
tool_calls = [{ name = "pull", arguments = { reference = "{turn_file:report.md}" } }]
[[turn.step]]
tool_calls = [{ name = "read_file", arguments = { path = "report.md" } }]
[[turn.step]]
text = "It still says what it said."

[[turn]]
when = "conv:fi:"
[[turn.step]]
tool_calls = [{ name = "pull", arguments = { reference = "{last_user}" } }, { name = "read_file", arguments = { path = "../x" } }]
[[turn.step]]
text = "done"
"##;

#[tokio::test]
async fn files_flow_through_pull_write_publish_and_a_later_turn_by_reference() {
    let mut rig = Rig::with(RigOptions {
        paused: true,
        ..RigOptions::new(FILES)
    })
    .await;
    let files = Files::new(rig.conversations.store().clone());
    let attachment = files
        .attach(
            &rig.prefix(),
            TurnId::FIRST,
            "notes.txt",
            "meeting notes".into(),
        )
        .await
        .unwrap();
    let mut live = rig.bus.subscribe_live(rig.conv).await.unwrap();
    rig.send(EventBody::Attachment {
        name: "notes.txt".into(),
        media_type: "text/plain".into(),
        size: 13,
        reference: attachment.clone(),
        preview: None,
    })
    .await;
    rig.say("please summarise the attached notes").await;
    rig.run();
    rig.wait_turns(1).await;
    let log = rig.log(1).await;
    assert_eq!(tool_calls(&log), ["pull", "write_file", "publish"]);
    let results: Vec<&Value> = log
        .blocks
        .iter()
        .filter_map(|b| match b {
            Block::ToolResult {
                ok: true, output, ..
            } => Some(output),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 3, "{:?}", log.blocks);
    assert_eq!(results[0]["size"], 13);
    let published = results[2]["reference"].as_str().unwrap().to_owned();
    assert_eq!(
        published,
        format!("conv:fi:{}/turn_1/out/report.md", rig.conv)
    );
    assert_eq!(
        results[2]["download"],
        format!("/v1/files?reference={published}")
    );
    assert!(log
        .blocks
        .iter()
        .any(|b| matches!(b, Block::File { path, .. } if path == "out/report.md")));
    assert_eq!(replies(&log), [format!("Your report: {published}")]);

    // The streamed words of the reply arrived as advisory deltas, and "new rows" ticks up to the
    // turn's last row.
    let end = turnpike_artifactory::Record::new(rig.conversations.store().clone(), rig.prefix())
        .head()
        .await
        .unwrap()
        .leaves();
    let mut streamed = String::new();
    let deadline = Instant::now() + LONG;
    while Instant::now() < deadline {
        let frame = tokio::time::timeout(LONG, live.next())
            .await
            .unwrap()
            .unwrap();
        match serde_json::from_slice::<LiveFrame>(&frame).unwrap() {
            LiveFrame::Delta { text, .. } => streamed.push_str(&text),
            LiveFrame::Rows { through } if through >= end => break,
            LiveFrame::Rows { .. } | LiveFrame::Revoked { .. } => {}
        }
    }
    assert_eq!(streamed, format!("Your report: {published}"));

    // Turn two sees turn one's file by reference and pulls it.
    rig.say("show the report again").await;
    rig.wait_turns(2).await;
    let log = rig.log(2).await;
    let read = log
        .blocks
        .iter()
        .find_map(|b| match b {
            Block::ToolResult { output, .. } if output.get("text").is_some() => Some(output),
            _ => None,
        })
        .expect("read_file answered");
    assert_eq!(read["text"], "# Report\nfrom the notes");

    // Another user's reference is the same "not found" as a missing one; paths cannot escape.
    let stranger: turnpike_schemas::Identity = "oidc:acme:u-99".parse().unwrap();
    let secret = turnpike_tests::fixtures::conversation_with_file(
        &rig.conversations,
        stranger,
        "secret.txt",
        "secret",
    )
    .await;
    rig.say(&secret.to_string()).await;
    rig.wait_turns(3).await;
    let log = rig.log(3).await;
    let errors: Vec<String> = log
        .blocks
        .iter()
        .filter_map(|b| match b {
            Block::ToolResult {
                ok: false, output, ..
            } => Some(output["error"].to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(errors.len(), 2, "{:?}", log.blocks);
    assert!(errors[0].contains("not found"), "{}", errors[0]);
    assert!(
        !errors[0].contains("secret\""),
        "no bytes leak: {}",
        errors[0]
    );
    assert!(errors[1].contains("../x"), "{}", errors[1]);

    // Replay reproduces every turn without models or tools.
    let logs = vec![rig.log(1).await, rig.log(2).await, rig.log(3).await];
    let replays = turnpike_agent::replay::replay(&logs, None).await;
    for r in &replays {
        assert_eq!(r.divergence, None, "{}", r.turn);
    }
    rig.stop().await;
}

/// Writes `turns` committed turns straight to a record (no workers), with a compaction summary
/// in turn `summary_at` when given.
async fn build_conversation(
    store: Arc<dyn ObjectStore>,
    turns: u64,
    summary_at: Option<u64>,
) -> (ConversationPrefix, Record) {
    let conv = ConversationId::new();
    let prefix = ConversationPrefix::new(tenant(), conv);
    let record = Record::new(store.clone(), prefix.clone());
    let store_ref = store.clone();
    let logs = TurnLogs::new(store);
    let mut head = record.head().await.unwrap();
    head = record.append(&signer(), &head, &[opened()]).await.unwrap();
    for n in 1..=turns {
        head = record
            .append(
                &signer(),
                &head,
                &batch_one(conv, n, &format!("question {n}")),
            )
            .await
            .unwrap();
        let turn = TurnId::new(n).unwrap();
        let mut blocks = vec![Block::UserMessage {
            text: format!("question {n}"),
        }];
        let mut two = Vec::new();
        if summary_at == Some(n) {
            let through = TurnId::new(n - 1).unwrap();
            blocks.insert(
                0,
                Block::Summary {
                    through,
                    text: format!("turns 1..{} in short", n - 1),
                },
            );
            two.push(EntryBody::CompactionMarker(CompactionMarker {
                turn,
                through,
                summary: format!("turns 1..{} in short", n - 1),
                model: "script".into(),
                prompt: "summarise".into(),
            }));
        }
        blocks.push(Block::AssistantMessage {
            text: format!("answer {n}"),
        });
        logs.write(
            &prefix,
            &turnpike_tests::fixtures::turn_log(conv, turn, blocks),
        )
        .await
        .unwrap();
        two.extend(batch_two(n, &format!("answer {n}")));
        head = record.append(&signer(), &head, &two).await.unwrap();
    }
    // The head hint is written in the background; wait until it is there.
    let deadline = Instant::now() + LONG;
    let hint = object_store::path::Path::from(format!(
        "tenants/{}/conversations/{conv}/record-head",
        tenant()
    ));
    while object_store::ObjectStoreExt::get(store_ref.as_ref(), &hint)
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "the head hint was never written");
        tokio::task::yield_now().await;
    }
    (prefix, record)
}

#[tokio::test]
async fn the_context_at_turn_200_reads_a_bounded_number_of_objects() {
    let counting = CountingStore::new(Arc::new(InMemory::new()));
    let store: Arc<dyn ObjectStore> = counting.clone();
    let logs = TurnLogs::new(store.clone());
    let (prefix, record) = build_conversation(store.clone(), 199, Some(195)).await;

    counting.reset();
    let head = record.head().await.unwrap();
    let head_reads = counting.gets();
    let timeline =
        turnpike_worker::timeline::rebuild(&logs, &prefix, head.state(), TurnId::new(200).unwrap())
            .await
            .unwrap();
    let log_reads = counting.gets() - head_reads;
    assert_eq!(head.state().summary_turn, 195);
    let turns: Vec<u64> = timeline.rows.iter().map(|r| r.turn().number()).collect();
    assert_eq!(
        timeline.logs_read, 5,
        "the summary's turn and the four after it: {turns:?}"
    );
    assert!(!timeline.from_snapshot);
    assert_eq!(
        log_reads, 6,
        "a miss on turn 199's snapshot, then five logs"
    );
    assert_eq!(counting.lists(), 0, "no listing of the record");
    assert!(
        head_reads <= 10,
        "finding the head read {head_reads} objects"
    );
    assert!(
        matches!(&timeline.rows[0].block, Block::Summary { through, .. } if through.number() == 194)
    );
    assert_eq!(
        timeline.rows[0].reference.to_string(),
        format!("conv:tl:{}/turn_195/blocks/0", prefix.conversation())
    );
    let last = timeline.rows.last().unwrap();
    assert!(matches!(&last.block, Block::AssistantMessage { text } if text == "answer 199"));

    // With the snapshot turn 199 leaves (as workers do), the rebuild is one read.
    let snapshot = turnpike_worker::timeline::snapshot_after(
        &turnpike_worker::timeline::Timeline {
            rows: std::sync::Arc::new(timeline.rows[..timeline.rows.len() - 2].to_vec()),
            ..Default::default()
        },
        &prefix,
        TurnId::new(199).unwrap(),
        &[
            Block::UserMessage {
                text: "question 199".into(),
            },
            Block::AssistantMessage {
                text: "answer 199".into(),
            },
        ],
        u64::MAX,
    );
    logs.write_context(&prefix, &snapshot).await.unwrap();
    counting.reset();
    let fast =
        turnpike_worker::timeline::rebuild(&logs, &prefix, head.state(), TurnId::new(200).unwrap())
            .await
            .unwrap();
    assert!(fast.from_snapshot);
    assert_eq!(counting.gets(), 1);
    assert_eq!(fast.rows, timeline.rows);

    // Without a summary the same rebuild reads every turn: the counter does count.
    let (prefix, record) = build_conversation(store.clone(), 40, None).await;
    let head = record.head().await.unwrap();
    counting.reset();
    let timeline =
        turnpike_worker::timeline::rebuild(&logs, &prefix, head.state(), TurnId::new(41).unwrap())
            .await
            .unwrap();
    assert_eq!(
        counting.gets(),
        1 + 40,
        "a miss on the snapshot, then every log"
    );
    assert_eq!(timeline.rows.len(), 80);
}

#[tokio::test]
async fn each_turn_leaves_a_snapshot_that_rebuilds_the_next_context_in_one_read() {
    let rig = Rig::start(
        "[[turn]]\n[[turn.step]]\ntool_calls = [{ name = \"list_files\" }]\n[[turn.step]]\ntext = \"ok {last_user}\"\n",
        8,
    )
    .await;
    for (n, text) in ["one", "two", "three"].iter().enumerate() {
        rig.say(text).await;
        rig.wait_turns(n as u64 + 1).await;
    }
    let logs = TurnLogs::new(rig.conversations.store().clone());
    let head = rig.record().head().await.unwrap();
    let next = TurnId::new(4).unwrap();
    rig.counting.reset();
    let fast = turnpike_worker::timeline::rebuild(&logs, &rig.prefix(), head.state(), next)
        .await
        .unwrap();
    assert!(fast.from_snapshot);
    assert_eq!(
        rig.counting.gets(),
        1,
        "one object: the snapshot after turn 3"
    );
    let slow =
        turnpike_worker::timeline::rebuild_from_logs(&logs, &rig.prefix(), head.state(), next)
            .await
            .unwrap();
    assert!(!slow.from_snapshot);
    assert_eq!(slow.logs_read, 3);
    assert_eq!(
        fast.rows, slow.rows,
        "the snapshot and the logs give the same rows"
    );
    assert_eq!(fast.rows.len(), 3 * 4);
    assert!(matches!(&fast.rows.last().unwrap().block,
        Block::AssistantMessage { text } if text == "ok three"));
    // Only the latest snapshot is kept: the older ones go once the next is in place, so a
    // conversation's snapshots do not grow with the square of its length.
    let store = rig.conversations.store().clone();
    let exists = |turn: u64| {
        let (store, path) = (
            store.clone(),
            rig.prefix().context_snapshot(TurnId::new(turn).unwrap()),
        );
        async move {
            object_store::ObjectStoreExt::head(&store, &path)
                .await
                .is_ok()
        }
    };
    // Nor are a turn's attempt copies of its log and snapshot kept once they are promoted.
    let attempts = object_store::path::Path::from(format!(
        "tenants/{}/conversations/{}/attempts",
        rig.prefix().tenant(),
        rig.prefix().conversation()
    ));
    let attempt_objects = || {
        let (store, dir) = (store.clone(), attempts.clone());
        async move {
            use futures::TryStreamExt as _;
            let metas: Vec<_> = store.list(Some(&dir)).try_collect().await.unwrap();
            metas.len()
        }
    };
    let deadline = std::time::Instant::now() + LONG;
    while exists(1).await || exists(2).await || attempt_objects().await > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "older snapshots or attempt copies stay"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(exists(3).await, "the latest snapshot went");
    rig.stop().await;
}

#[tokio::test]
async fn a_large_tool_result_becomes_a_file_with_a_preview_and_a_reference() {
    let rig = Rig::start(
        "[[turn]]\n[[turn.step]]\ntool_calls = [{ name = \"write_file\", arguments = { path = \"big.txt\", content = \"{last_user}\" } }]\n\
         [[turn.step]]\ntool_calls = [{ name = \"read_file\", arguments = { path = \"big.txt\" } }]\n\
         [[turn.step]]\ntext = \"read it\"\n",
        8,
    )
    .await;
    let big = "lorem ipsum dolor ".repeat(1500);
    rig.say(&big).await;
    rig.wait_turns(1).await;
    let log = rig.log(1).await;
    let output = log
        .blocks
        .iter()
        .filter_map(|b| match b {
            Block::ToolResult { output, .. } => Some(output.clone()),
            _ => None,
        })
        .nth(1)
        .unwrap();
    assert_eq!(output["truncated"], true, "{output}");
    assert!(output["preview"].as_str().unwrap().len() <= 1024);
    let reference = output["reference"].as_str().unwrap();
    assert!(reference.contains("/turn_1/tool-output/"), "{reference}");
    assert!(log
        .blocks
        .iter()
        .any(|b| matches!(b, Block::File { path, .. } if path.starts_with("tool-output/"))));
    let resolver = turnpike_resolver::Resolver::standard(
        rig.conversations.directory().clone(),
        rig.conversations.store().clone(),
    );
    let full = resolver.resolve_str(&owner(), reference).await.unwrap();
    let full: Value = serde_json::from_slice(&full.bytes).unwrap();
    assert_eq!(full["text"], big.as_str());
    rig.stop().await;
}

#[tokio::test]
async fn a_reply_with_more_tool_calls_than_a_turn_may_record_fails_once_and_is_not_retried() {
    let calls: Vec<String> = (0..100)
        .map(|_| "{ name = \"list_files\" }".to_owned())
        .collect();
    let script = format!(
        "[[turn]]\nwhen = \"flood\"\n[[turn.step]]\ntool_calls = [{}]\n\n[[turn]]\n[[turn.step]]\ntext = \"fine: {{last_user}}\"\n",
        calls.join(", ")
    );
    let rig = Rig::start(&script, 8).await;
    rig.say("flood me").await;
    rig.wait_turns(1).await;
    let log = rig.log(1).await;
    assert_eq!(log.outcome, TurnOutcome::Failed);
    assert!(tool_calls(&log).is_empty(), "none of the calls ran");
    // The next message gets its turn: the failed one is not retried in front of it.
    rig.say("after").await;
    rig.wait_turns(2).await;
    assert_eq!(replies(&rig.log(2).await), ["fine: after"]);
    let entries = rig.record().entries().await.unwrap();
    assert_eq!(dispatched_turns(&entries).len(), 2, "turn 1 ran once");
    assert!(entries.iter().any(|e| matches!(&e.body,
        EntryBody::Error(err) if err.message.contains("100 tool calls"))));
    rig.stop().await;
}

const WRITER: &str = r##"
[[turn]]
[[turn.step]]
tool_calls = [{ name = "write_file", arguments = { path = "plan.md", content = "# Plan for {last_user}\n" } }]
[[turn.step]]
text = "Wrote the plan."
"##;

#[tokio::test]
async fn a_retried_turn_names_its_own_version_and_the_first_attempt_is_unreachable() {
    use turnpike_artifactory::git::Lineage;
    let mut options = RigOptions::new(WRITER);
    options.paused = true;
    options.lease_ttl = std::time::Duration::from_millis(600);
    let mut rig = Rig::with(options).await;
    rig.run_hanging_at("before-batch-two");
    rig.say("the launch").await;
    // The first attempt did all its work (log, snapshot, commit) and hangs before batch two.
    let store = rig.conversations.store().clone();
    let attempts_of_turn_1 = |store: Arc<dyn ObjectStore>, prefix: ConversationPrefix| async move {
        use futures::TryStreamExt as _;
        let dir = object_store::path::Path::from(format!(
            "tenants/{}/conversations/{}/attempts/turn_1",
            prefix.tenant(),
            prefix.conversation()
        ));
        let metas: Vec<_> = store.list(Some(&dir)).try_collect().await.unwrap();
        let mut attempts: Vec<String> = metas
            .iter()
            .filter_map(|m| m.location.parts().nth(6).map(|p| p.as_ref().to_owned()))
            .collect();
        attempts.sort();
        attempts.dedup();
        attempts
    };
    let deadline = Instant::now() + LONG;
    while attempts_of_turn_1(store.clone(), rig.prefix())
        .await
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the first attempt never wrote");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Give the hanging attempt the time to reach batch two's door: wait for its log.
    let first = attempts_of_turn_1(store.clone(), rig.prefix()).await;
    rig.crash().await;
    let lineage = Lineage::new(store.clone(), rig.prefix());
    // Nothing of the first attempt is reachable: no ref, no canonical log.
    assert_eq!(lineage.ref_of(TurnId::FIRST).await.unwrap(), None);
    assert!(TurnLogs::new(store.clone())
        .read(&rig.prefix(), TurnId::FIRST)
        .await
        .is_err());

    rig.run();
    rig.wait_turns(1).await;
    let record = rig.record();
    let head = record.head().await.unwrap();
    let complete = record
        .completion(&head, TurnId::FIRST)
        .await
        .unwrap()
        .expect("turn 1 is complete");
    let version = complete.version.expect("the retry made a version");
    // The ref is the retry's, named by the record; the retry was another attempt.
    rig.wait_settled().await;
    assert_eq!(lineage.ref_of(TurnId::FIRST).await.unwrap(), Some(version));
    // The retry was another attempt; once promoted, its own copies go, and what is left is
    // the first attempt's (dead objects, never read).
    let retry = format!("a{:020}", complete.attempt.unwrap());
    assert!(!first.contains(&retry), "{first:?} {retry}");
    let deadline = Instant::now() + LONG;
    loop {
        let all = attempts_of_turn_1(store.clone(), rig.prefix()).await;
        if all == first {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the retry's copies stay: {all:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // The log readers see is the retry's, and it matches the digest the record signed.
    TurnLogs::new(store)
        .read_checked(&rig.prefix(), TurnId::FIRST, complete.log_sha256.as_deref())
        .await
        .unwrap();
    rig.stop().await;
}

const PUBLISHER: &str = r##"
[[turn]]
[[turn.step]]
tool_calls = [{ name = "write_file", arguments = { path = "out.md", content = "# Out for {last_user}\n" } }]
[[turn.step]]
tool_calls = [{ name = "publish", arguments = { path = "out.md" } }]
[[turn.step]]
text = "Published {file:out.md}"
"##;

/// An export asked for between a turn's commit and its promotion waits for the promotion: the
/// archive's project holds the turn's version, not the one before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_between_a_commit_and_its_promotion_waits_for_the_turns_version() {
    use turnpike_artifactory::git::Lineage;
    use turnpike_lifecycle::failpoints::Action;
    let mut options = RigOptions::new(PUBLISHER);
    options.paused = true;
    let mut rig = Rig::with(options).await;
    rig.run_with(turnpike_worker::Failpoints::default().with(
        "before-promotion",
        Action::Pause(Duration::from_millis(1500)),
    ));
    rig.say("the launch").await;
    rig.wait_turns(1).await;
    let lineage = Lineage::new(rig.conversations.store().clone(), rig.prefix());
    assert_eq!(
        lineage.ref_of(TurnId::FIRST).await.unwrap(),
        None,
        "committed, not promoted yet"
    );
    let entry = rig
        .conversations
        .directory()
        .lookup(rig.conv, &tenant(), &owner())
        .await
        .unwrap();
    let work = tempfile::tempdir().unwrap();
    let archive = work.path().join("conversation.tar");
    turnpike_artifactory::archive::export(
        &rig.conversations,
        &entry,
        &turnpike_artifactory::TrustedKeys::new([signer().verifying_key()]),
        &signer(),
        None,
        "a test",
        std::fs::File::create(&archive).unwrap(),
    )
    .await
    .unwrap();
    assert!(lineage.ref_of(TurnId::FIRST).await.unwrap().is_some());
    let unpacked = work.path().join("unpacked");
    std::fs::create_dir(&unpacked).unwrap();
    let ok = |c: &mut std::process::Command| c.status().unwrap().success();
    assert!(ok(std::process::Command::new("tar")
        .arg("-xf")
        .arg(&archive)
        .arg("-C")
        .arg(&unpacked)));
    let clone = work.path().join("clone");
    assert!(ok(std::process::Command::new("git")
        .args(["clone", "--quiet"])
        .arg(unpacked.join("project.bundle"))
        .arg(&clone)));
    assert_eq!(
        std::fs::read_to_string(clone.join("out.md")).unwrap(),
        "# Out for the launch\n"
    );
    rig.stop().await;
}

#[tokio::test]
async fn a_worker_killed_between_the_commit_and_the_promotion_leaves_nothing_unreadable_or_unfinished(
) {
    use turnpike_artifactory::git::Lineage;
    let mut options = RigOptions::new(PUBLISHER);
    options.paused = true;
    options.lease_ttl = std::time::Duration::from_millis(600);
    let mut rig = Rig::with(options).await;
    rig.run_hanging_at("before-promotion");
    rig.say("the launch").await;
    // Turn 1 commits, then its worker dies before promoting anything; nothing else is sent.
    rig.wait_turns(1).await;
    rig.crash().await;
    let store = rig.conversations.store().clone();
    let marks = rig.conversations.open_turns();
    assert_eq!(marks.list().await.unwrap(), vec![rig.prefix()]);
    let lineage = Lineage::new(store.clone(), rig.prefix());
    assert_eq!(lineage.ref_of(TurnId::FIRST).await.unwrap(), None);
    // Readers already see the committed attempt: the log and the published file.
    let log = rig.log(1).await;
    let published = replies(&log)[0]
        .strip_prefix("Published ")
        .unwrap()
        .to_owned();
    let resolver =
        turnpike_resolver::Resolver::standard(rig.conversations.directory().clone(), store.clone());
    let bytes = resolver
        .resolve_str(&owner(), &published)
        .await
        .unwrap()
        .bytes;
    assert_eq!(&bytes[..], b"# Out for the launch\n");
    // Once the dead owner's lease lapses, a new worker's sweep finishes the promotion by
    // itself: canonical objects, the version's ref, and the mark gone.
    rig.wait_lease_free().await;
    rig.run();
    let deadline = Instant::now() + LONG;
    while !marks.list().await.unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the sweep never finished the promotion"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let head = rig.record().head().await.unwrap();
    let complete = rig
        .record()
        .completion(&head, TurnId::FIRST)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        lineage.ref_of(TurnId::FIRST).await.unwrap(),
        complete.version
    );
    let canonical = rig.prefix().hosted_file(
        TurnId::FIRST,
        &turnpike_schemas::RefPath::parse("out.md").unwrap(),
    );
    assert_eq!(
        &object_store::ObjectStoreExt::get(store.as_ref(), &canonical)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()[..],
        b"# Out for the launch\n"
    );
    // The turn's three model calls are in the record once, and in the usage ledger once: the
    // dead owner added them right after its commit, and finishing its promotion added nothing.
    let usage_entries = rig
        .record()
        .entries()
        .await
        .unwrap()
        .into_iter()
        .filter(|e| matches!(e.body, turnpike_schemas::EntryBody::Usage(_)))
        .count();
    assert_eq!(usage_entries, 3);
    use turnpike_router::usage::{Day, UsageScope};
    let scope = UsageScope::Tenant(rig.prefix().tenant().clone());
    let today = Day::today();
    let mut ledger = rig.bus.usage(&scope, today).await.unwrap();
    // (A run across midnight UTC counted it yesterday.)
    ledger = ledger.plus(rig.bus.usage(&scope, Day(today.0 - 1)).await.unwrap());
    assert_eq!((ledger.turns, ledger.calls), (1, 3), "{ledger:?}");
    rig.stop().await;
}

const ECHO_SCRIPT: &str = "[[turn]]\n[[turn.step]]\ntext = \"echo: {last_user}\"\n";

/// The address of the rig's conversation, as a JSON value (for hand-made lane bytes).
fn rig_address(rig: &Rig) -> Value {
    json!({
        "tenant": tenant().to_string(),
        "app": "support",
        "agent": "helper",
        "conversation": rig.conv.to_string(),
        "identity": owner().to_string(),
    })
}

#[tokio::test]
async fn a_lane_message_this_runtime_cannot_read_is_parked_once_and_the_lane_goes_on() {
    let mut options = RigOptions::new(ECHO_SCRIPT);
    options.paused = true;
    let mut rig = Rig::with(options).await;
    rig.say("before").await;
    // A newer event kind during a rolling upgrade: the address reads, the body does not.
    let raw = serde_json::to_vec(&json!({
        "version": 2,
        "id": turnpike_schemas::EventId::new().to_string(),
        "address": rig_address(&rig),
        "accepted_at_ms": 1,
        "body": { "kind": "poll", "question": "lunch?" },
    }))
    .unwrap();
    let parked = rig.bus.republish(rig.conv, &raw, "t1").await.unwrap().seq;
    rig.say("after").await;
    rig.run();
    rig.wait_turns(2).await;
    assert_eq!(replies(&rig.log(1).await), ["echo: before"]);
    assert_eq!(replies(&rig.log(2).await), ["echo: after"]);
    let entries = rig.record().entries().await.unwrap();
    let kinds: Vec<EntryKind> = entries
        .iter()
        .map(|e| e.body.kind())
        .filter(|k| k.is_input() || *k == EntryKind::LaneParked)
        .collect();
    assert_eq!(
        kinds,
        [
            EntryKind::UserMessage,
            EntryKind::LaneParked,
            EntryKind::UserMessage
        ],
        "parked once, in lane order"
    );
    let letter = entries
        .iter()
        .find_map(|e| match &e.body {
            EntryBody::LaneParked(p) => Some(p.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(letter.lane_seq, parked);
    assert!(letter.reason.contains("cannot read"), "{}", letter.reason);
    let kept = turnpike_artifactory::DeadLetters::new(rig.conversations.store().clone())
        .get(&rig.prefix(), parked)
        .await
        .unwrap();
    assert_eq!(
        kept.bytes().unwrap(),
        raw,
        "the bytes are kept as they were"
    );
    let keys = turnpike_artifactory::TrustedKeys::new([signer().verifying_key()]);
    rig.record()
        .verify(&keys, None)
        .await
        .unwrap()
        .expect("the record with a parked message verifies");
    rig.stop().await;
}

#[tokio::test]
async fn a_conversation_created_without_its_opening_batch_is_opened_from_its_directory_entry() {
    let mut options = RigOptions::new(ECHO_SCRIPT);
    options.paused = true;
    let mut rig = Rig::with(options).await;
    // A creation that stopped after the directory entry and before the first batch.
    let entry = turnpike_artifactory::DirectoryEntry {
        conversation: ConversationId::new(),
        tenant: tenant(),
        owner: owner(),
        app: "support".parse().unwrap(),
        agent: "helper".parse().unwrap(),
        created_ms: 5,
        instructions: None,
        started_by: None,
    };
    rig.conversations.directory().create(&entry).await.unwrap();
    rig.ingress
        .submit(
            &tenant(),
            &owner(),
            entry.conversation,
            EventBody::Message {
                text: "still here?".into(),
            },
            None,
        )
        .await
        .unwrap();
    rig.run();
    turnpike_tests::lanes::wait_for_turns(&rig.conversations, &[entry.conversation], 1, LONG)
        .await
        .unwrap();
    let record = Record::new(rig.conversations.store().clone(), entry.prefix());
    let entries = record.entries().await.unwrap();
    assert!(
        matches!(&entries[0].body, EntryBody::ConversationOpened(o) if o.owner == owner() && o.at_ms == 5),
        "{:?}",
        entries[0].body
    );
    let log = TurnLogs::new(rig.conversations.store().clone())
        .read(&entry.prefix(), TurnId::new(1).unwrap())
        .await
        .unwrap();
    assert_eq!(replies(&log), ["echo: still here?"]);
    rig.stop().await;
}

#[tokio::test]
async fn an_owner_killed_between_keeping_a_dead_letter_and_recording_it_is_finished_by_the_next() {
    let mut options = RigOptions::new(ECHO_SCRIPT);
    options.paused = true;
    // A crashed owner's wakes come back after twice the lease: keep it short.
    options.lease_ttl = std::time::Duration::from_secs(1);
    let mut rig = Rig::with(options).await;
    let raw = serde_json::to_vec(&json!({
        "version": 2,
        "id": turnpike_schemas::EventId::new().to_string(),
        "address": rig_address(&rig),
        "accepted_at_ms": 1,
        "body": { "kind": "poll", "question": "lunch?" },
    }))
    .unwrap();
    let parked = rig.bus.republish(rig.conv, &raw, "t2").await.unwrap().seq;
    rig.say("after").await;
    rig.run_hanging_at("after-dead-letter");
    // The letter is kept, then the owner dies before the record says so.
    let letters = turnpike_artifactory::DeadLetters::new(rig.conversations.store().clone());
    let deadline = Instant::now() + LONG;
    while letters.get(&rig.prefix(), parked).await.is_err() {
        assert!(Instant::now() < deadline, "the letter was never kept");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    rig.crash().await;
    assert_eq!(rig.record().head().await.unwrap().state().lane_through, 0);
    // Nothing else is sent: the wakes come back and the next owner finishes by itself.
    rig.run();
    rig.wait_turns(1).await;
    assert_eq!(replies(&rig.log(1).await), ["echo: after"]);
    let entries = rig.record().entries().await.unwrap();
    let parkings: Vec<u64> = entries
        .iter()
        .filter_map(|e| match &e.body {
            EntryBody::LaneParked(p) => Some(p.lane_seq),
            _ => None,
        })
        .collect();
    assert_eq!(parkings, [parked], "parked once");
    assert_eq!(letters.list(&rig.prefix()).await.unwrap().len(), 1);
    rig.stop().await;
}

const ANSWER: &str = "[[turn]]\n[[turn.step]]\ntext = \"answer to {last_user}\"\n";

/// Messages waiting on a lane are each read once by their owner, not again for every turn
/// ahead of them (and not again by each turn's lane watch or its rounds): the reads of a burst
/// grow with the burst, not with its square.
#[tokio::test]
async fn a_burst_of_messages_is_read_from_the_lane_once_each() {
    const BURST: usize = 12;
    let mut rig = Rig::with(RigOptions {
        paused: true,
        ..RigOptions::new(ANSWER)
    })
    .await;
    let words: Vec<String> = (1..=BURST).map(|i| format!("word {i:02}")).collect();
    for word in &words {
        rig.say(word).await;
    }
    rig.run();
    rig.wait_turns(BURST as u64).await;
    rig.wait_settled().await;
    for (n, word) in words.iter().enumerate() {
        let log = rig.log(n as u64 + 1).await;
        assert_eq!(replies(&log), [format!("answer to {word}")]);
    }
    let counted = rig.lane_reads.counted();
    eprintln!("lane reads for {BURST} messages: {counted:?}");
    // Every message is read by the drain once. A turn's watch and rounds read only what may
    // fold into it: here, the next message at most once, and only while the drain's first read
    // (bounded by the wakes it held) had not reached it. Reading the pending messages again
    // for each turn would return 12 × 13 / 2 = 78 of them, in a read per turn or more.
    assert!(
        counted.messages <= BURST + 2 && counted.reads <= BURST,
        "{counted:?} for {BURST} messages"
    );
    rig.stop().await;
}

/// A message that arrives after an owner's drain ended and before it let go of the lease is
/// taken by the owner's re-read of the lane after its release (DESIGN, step 9), not when its
/// wake — put off because the lease was still held — comes back ten minutes later.
#[tokio::test]
async fn a_message_sent_while_the_owner_lets_go_is_taken_by_its_re_read_after_the_release() {
    use turnpike_lifecycle::failpoints::Action;
    let mut rig = Rig::with(RigOptions {
        paused: true,
        busy_delay: Duration::from_secs(600),
        ..RigOptions::new(ANSWER)
    })
    .await;
    rig.run_with(
        turnpike_worker::Failpoints::default()
            .with("before-release", Action::Pause(Duration::from_millis(1500))),
    );
    rig.say("one").await;
    rig.wait_turns(1).await;
    // The owner's drain is over (it cleared its open-turn mark when it saw the lane quiet), and
    // it pauses before releasing the lease: this message's wake finds the lease held and is
    // put off. Turn 2 can only start after that release and its re-read of the lane head.
    rig.wait_settled().await;
    rig.say("two").await;
    rig.wait_turns(2).await;
    assert_eq!(replies(&rig.log(2).await), ["answer to two"]);
    let counted = rig.lane_reads.counted();
    assert!(counted.heads >= 1, "{counted:?}");
    rig.stop().await;
}

/// What one turn costs the store, in writes: the cost model `book/src/operating/capacity.md`
/// states. A turn in a conversation that has one turn behind it, the drain's only one. The log
/// is written under its attempt, then moved to its key (a store that renames create-only: one
/// write, no removal after).
#[tokio::test]
async fn a_turn_writes_its_batches_its_log_twice_and_one_snapshot() {
    let rig = Rig::start("[[turn]]\n[[turn.step]]\ntext = \"hi\"\n", 3).await;
    rig.say("one").await;
    rig.wait_turns(1).await;
    let (conv, tenant) = (rig.conv.to_string(), rig.prefix().tenant().to_string());
    let home = format!("tenants/{tenant}/conversations/{conv}");
    // A turn's clearing runs in the background: wait for a write that begins with `what`.
    let wait_for = |what: String| {
        let counting = rig.counting.clone();
        async move {
            turnpike_tests::wait::until(LONG, &format!("written: {what}"), || async {
                counting
                    .written()
                    .iter()
                    .any(|w| w.starts_with(&what))
                    .then_some(())
            })
            .await
        }
    };
    wait_for(format!("delete open-turns/{tenant}/{conv}")).await;
    rig.counting.reset();
    rig.say("two").await;
    rig.wait_turns(2).await;
    wait_for(format!("delete {home}/turns/turn_1/context.json")).await;
    wait_for(format!("delete open-turns/{tenant}/{conv}")).await;
    let mut written: Vec<String> = rig
        .counting
        .written()
        .iter()
        .map(|w| {
            // The attempt's id is random.
            w.replace(&home, "~")
                .split('/')
                .map(|part| match part.strip_prefix('a') {
                    Some(id) if id.len() > 8 && id.bytes().all(|b| b.is_ascii_digit()) => "A",
                    _ => part,
                })
                .collect::<Vec<_>>()
                .join("/")
        })
        .collect();
    written.sort();
    let mut expected = vec![
        format!("put open-turns/{tenant}/{conv}"),
        "put ~/record/00000000000000000003".to_string(),
        "put ~/attempts/turn_2/A/log.json".to_string(),
        "put ~/record/00000000000000000004".to_string(),
        "rename ~/attempts/turn_2/A/log.json ~/turns/turn_2/log.json".to_string(),
        "put ~/turns/turn_2/context.json".to_string(),
        format!("delete open-turns/{tenant}/{conv}"),
        "delete ~/turns/turn_1/context.json".to_string(),
    ];
    expected.sort();
    assert_eq!(written, expected);
    rig.stop().await;
}

/// The record's batches, each as the kinds of its entries (signed roots left out).
async fn batch_kinds(rig: &Rig) -> Vec<Vec<EntryKind>> {
    let entries = rig.record().entries().await.unwrap();
    let mut batches: Vec<Vec<EntryKind>> = vec![Vec::new()];
    for e in entries {
        match e.body.kind() {
            EntryKind::SignedRoot => batches.push(Vec::new()),
            kind => batches.last_mut().unwrap().push(kind),
        }
    }
    batches.pop();
    batches
}

/// Four messages wait on the lane when the worker starts: each turn whose successor's inputs
/// the drain holds whole commits that turn's batch one with its own batch two — one batch, one
/// signature and one write, not two. The last message may yet have events joining it (the
/// drain reads on before it starts that turn), so it is opened on its own. Each turn still
/// runs once, under its own id, and its log is promoted.
#[tokio::test]
async fn a_waiting_turns_batch_one_commits_with_the_batch_two_before_it() {
    let mut options = RigOptions::new("[[turn]]\n[[turn.step]]\ntext = \"ok {last_user}\"\n");
    options.paused = true;
    let mut rig = Rig::with(options).await;
    for text in ["one", "two", "three", "four"] {
        rig.say(text).await;
    }
    rig.run();
    rig.wait_turns(4).await;
    use EntryKind::{TurnComplete, TurnDispatched, UserMessage};
    let closing = |kinds: &[EntryKind]| kinds.ends_with(&[TurnComplete]);
    let batches = batch_kinds(&rig).await;
    // The opening, turn 1's batch one, then turns 1 and 2, 2 and 3 closed and opened at once,
    // turn 3 closed on its own, turn 4 opened and closed.
    assert_eq!(batches.len(), 7, "{batches:?}");
    for (i, opened_with) in [(2, true), (3, true), (4, false)] {
        let b = &batches[i];
        assert_eq!(
            b.ends_with(&[UserMessage, TurnDispatched]),
            opened_with,
            "{i}: {b:?}"
        );
        assert!(b.contains(&TurnComplete), "{i}: {b:?}");
    }
    assert!(closing(&batches[6]));
    for (n, text) in (1..=4).zip(["one", "two", "three", "four"]) {
        assert_eq!(replies(&rig.log(n).await), [format!("ok {text}")]);
    }
    let entries = rig.record().entries().await.unwrap();
    assert_eq!(dispatched_turns(&entries).len(), 4);
    rig.wait_settled().await;
    rig.stop().await;
}

/// A worker killed after a commit that closed turn 1 and opened turn 2, before turn 1's
/// promotion, with nothing else sent: once its lease lapses, the next worker finishes turn 1's
/// promotion (its version's ref, its hosted file) as well as recovering turn 2, then runs
/// turn 3; each turn is dispatched once and the sweep's mark goes.
#[tokio::test]
async fn a_worker_killed_after_a_commit_that_opened_the_next_turn_leaves_both_finished() {
    use turnpike_artifactory::git::Lineage;
    let mut options = RigOptions::new(PUBLISHER);
    options.paused = true;
    options.lease_ttl = std::time::Duration::from_millis(600);
    let mut rig = Rig::with(options).await;
    for text in ["one", "two", "three"] {
        rig.say(text).await;
    }
    rig.run_hanging_at("before-promotion");
    let record = rig.record();
    turnpike_tests::wait::until(LONG, "turn 2 opened with turn 1's commit", || async {
        let state = record.head().await.unwrap().state().clone();
        (state.last_turn == 2 && state.turn_open).then_some(())
    })
    .await;
    rig.crash().await;
    let store = rig.conversations.store().clone();
    let lineage = Lineage::new(store.clone(), rig.prefix());
    assert_eq!(lineage.ref_of(TurnId::FIRST).await.unwrap(), None);
    let marks = rig.conversations.open_turns();
    assert_eq!(marks.list().await.unwrap(), vec![rig.prefix()]);
    rig.wait_lease_free().await;
    rig.run();
    rig.wait_turns(3).await;
    turnpike_tests::wait::until(LONG, "the mark to go", || async {
        marks.list().await.unwrap().is_empty().then_some(())
    })
    .await;
    let head = record.head().await.unwrap();
    for n in 1..=3 {
        let turn = TurnId::new(n).unwrap();
        let complete = record.completion(&head, turn).await.unwrap().unwrap();
        assert!(complete.version.is_some(), "turn {n} published");
        assert_eq!(
            lineage.ref_of(turn).await.unwrap(),
            complete.version,
            "turn {n}"
        );
        let file = rig
            .prefix()
            .hosted_file(turn, &turnpike_schemas::RefPath::parse("out.md").unwrap());
        let there = object_store::ObjectStoreExt::get(store.as_ref(), &file)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let text = ["one", "two", "three"][n as usize - 1];
        assert_eq!(&there[..], format!("# Out for {text}\n").as_bytes());
    }
    let entries = record.entries().await.unwrap();
    assert_eq!(
        dispatched_turns(&entries),
        [1, 2, 3],
        "each turn dispatched once"
    );
    rig.stop().await;
}

/// `block_once`: its first call runs until its worker dies; later calls return at once.
struct BlockOnce(Arc<Probe>);

#[async_trait]
impl Tool for BlockOnce {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "block_once".into(),
            description: "blocks the first time".into(),
            parameters: json!({"type": "object"}),
        }
    }

    async fn call(&self, _cx: &ToolContext<'_>, _args: Value) -> Result<ToolOutput, String> {
        if !self.0.running.swap(true, Ordering::SeqCst) {
            self.0.started.notify_waiters();
            std::future::pending::<()>().await;
        }
        Ok(ToolOutput {
            output: json!("done"),
            blocks: Vec::new(),
        })
    }
}

/// A worker killed while it runs a turn opened with its predecessor's commit — after that
/// predecessor's promotion, before the turn's own batch two — with nothing sent afterwards:
/// the turn is neither acked away nor lost (only its predecessor's wake was acked when it
/// opened). Once the lease lapses, the next worker recovers it
/// under its id (by its mark and its unacked wakes), then runs the turn still waiting behind
/// it; each turn is dispatched once and the mark goes.
#[tokio::test]
async fn a_worker_killed_inside_a_turn_opened_with_the_commit_before_leaves_it_finished() {
    let probe = Arc::new(Probe::default());
    let mut options = RigOptions::new(
        "[[turn]]\nwhen = \"two\"\n[[turn.step]]\ntool_calls = [{ name = \"block_once\" }]\n\
         [[turn.step]]\ntext = \"ok {last_user}\"\n\
         [[turn]]\n[[turn.step]]\ntext = \"ok {last_user}\"\n",
    );
    options.tools.push("block_once".into());
    options.native.push(Arc::new(BlockOnce(probe.clone())));
    options.paused = true;
    options.lease_ttl = std::time::Duration::from_millis(600);
    let mut rig = Rig::with(options).await;
    for text in ["one", "two", "three"] {
        rig.say(text).await;
    }
    let started = probe.started.notified();
    rig.run();
    tokio::time::timeout(LONG, started).await.unwrap();
    let record = rig.record();
    let head = record.head().await.unwrap();
    assert_eq!((head.state().last_turn, head.state().turn_open), (2, true));
    assert!(
        record.opened_with_close(&head).await.unwrap(),
        "turn 2 was opened with turn 1's commit"
    );
    // Turn 1's wake is done; turn 2's and 3's are not (turn 2 may still die, as it will).
    assert_eq!(rig.bus.unsettled().await.unwrap(), Some(2));
    rig.crash().await;
    rig.wait_lease_free().await;
    rig.run();
    rig.wait_turns(3).await;
    rig.wait_settled().await;
    assert!(rig
        .conversations
        .open_turns()
        .list()
        .await
        .unwrap()
        .is_empty());
    for (n, text) in (1..=3).zip(["one", "two", "three"]) {
        assert_eq!(replies(&rig.log(n).await), [format!("ok {text}")]);
    }
    let entries = record.entries().await.unwrap();
    assert_eq!(
        dispatched_turns(&entries),
        [1, 2, 3],
        "each turn dispatched once"
    );
    rig.stop().await;
}
