//! People in the loop: approvals bound to one call, questions, compaction, switching agents, and
//! turns whose side effects are unknown.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use tokio::sync::Notify;
use turnpike_agent::model::ToolSpec;
use turnpike_schemas::entry::{IngressDirective, TurnOutcome};
use turnpike_schemas::{Block, EntryBody, EntryKind, EventBody, Identity, RequestId, TurnId};
use turnpike_tests::fixtures::{owner, signer};
use turnpike_tests::turns::{replies, Rig, RigOptions, LONG};
use turnpike_worker::tools::{Tool, ToolContext, ToolOutput};

/// `send {to, …}`: a side-effecting tool that records every call it starts (arguments and
/// idempotency key); while `hold` is set it never finishes.
#[derive(Default)]
struct Ledger {
    calls: Mutex<Vec<(Value, String)>>,
    hold: std::sync::atomic::AtomicBool,
    started: Notify,
}

struct Send(Arc<Ledger>);

#[async_trait]
impl Tool for Send {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "send".into(),
            description: "send a message to someone".into(),
            parameters: json!({"type": "object"}),
        }
    }

    fn side_effects(&self) -> bool {
        true
    }

    async fn call(&self, cx: &ToolContext<'_>, args: Value) -> Result<ToolOutput, String> {
        self.0
            .calls
            .lock()
            .unwrap()
            .push((args.clone(), cx.idempotency_key()));
        self.0.started.notify_waiters();
        if self.0.hold.load(std::sync::atomic::Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        Ok(json!({"sent": true}).into())
    }
}

const SCRIPT: &str = r#"
compaction = "SUMMARY of {messages} messages"

[[turn]]
when = "send"
[[turn.step]]
text = "Sending it now."
tool_calls = [{ name = "send", arguments = { to = "ana", n = 1.0 } }]
[[turn.step]]
text = "after send: {last_tool}"

[[turn]]
when = "ask"
[[turn.step]]
tool_calls = [{ name = "ask_user", arguments = { question = "Which colour?" } }]

[[turn]]
when = "hand over"
[[turn.step]]
tool_calls = [{ name = "system__switch_to_agent", arguments = { agent = "other" } }]
[[turn.step]]
text = "handed over"

[[turn]]
[[turn.step]]
text = "after the answer: {last_tool} / {last_user}"
"#;

fn options(ledger: &Arc<Ledger>) -> RigOptions {
    let mut o = RigOptions::new(SCRIPT);
    o.tools
        .extend(["send", "ask_user", "system__switch_to_agent"].map(String::from));
    o.native.push(Arc::new(Send(ledger.clone())));
    o.agent_extra = "approval = [{ tool = \"send\" }]".into();
    o.manifest_extra = "[agents.other]\nprovider = \"script\"\nscript = \"helper.script.toml\"\nsystem_prompt = \"You are the other one.\"\n".into();
    o
}

/// The pending approval request of a parked turn's log.
fn request_of(log: &turnpike_schemas::TurnLog) -> (RequestId, String, Value, String) {
    log.blocks
        .iter()
        .find_map(|b| match b {
            Block::ApprovalRequest {
                request_id,
                tool,
                arguments,
                withheld,
                ..
            } => Some((
                *request_id,
                tool.clone(),
                arguments.clone(),
                withheld.clone(),
            )),
            _ => None,
        })
        .expect("an approval request")
}

fn answers(log: &turnpike_schemas::TurnLog) -> Vec<Block> {
    log.blocks
        .iter()
        .filter(|b| matches!(b, Block::ApprovalResponse { .. }))
        .cloned()
        .collect()
}

fn approve(request_id: RequestId, arguments: Option<Value>) -> EventBody {
    EventBody::ApprovalResponse {
        request_id,
        approve: true,
        reason: None,
        tool: arguments.as_ref().map(|_| "send".into()),
        arguments,
    }
}

#[tokio::test]
async fn an_approved_call_runs_once_with_the_approved_arguments() {
    let ledger = Arc::new(Ledger::default());
    let rig = Rig::with(options(&ledger)).await;
    rig.say("send ana the note").await;
    rig.wait_turns(1).await;
    let parked = rig.log(1).await;
    assert_eq!(parked.outcome, TurnOutcome::Parked);
    assert!(
        ledger.calls.lock().unwrap().is_empty(),
        "nothing ran before approval"
    );
    let (request_id, tool, arguments, withheld) = request_of(&parked);
    assert_eq!(tool, "send");
    assert_eq!(
        arguments,
        json!({"n": 1, "to": "ana"}),
        "canonical arguments"
    );
    assert_eq!(withheld, "Sending it now.");
    assert!(
        replies(&parked).is_empty(),
        "the paused round's text is withheld"
    );
    let entries = rig.record().entries().await.unwrap();
    assert!(entries.iter().any(|e| matches!(&e.body,
        EntryBody::ApprovalRequest(r) if r.request_id == request_id && r.tool == "send")));

    // The client echoes the call it showed, in another spelling of the same arguments.
    rig.send(approve(request_id, Some(json!({"to": "ana", "n": 1}))))
        .await;
    rig.wait_turns(2).await;
    let resumed = rig.log(2).await;
    assert_eq!(resumed.outcome, TurnOutcome::Replied);
    let calls = ledger.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].0, json!({"n": 1, "to": "ana"}));
    assert_eq!(calls[0].1.len(), 64, "an idempotency key");
    // The model continues with the call's result (the script's catch-all answers a turn with no
    // new user message).
    assert_eq!(
        replies(&resumed),
        [r#"after the answer: {"sent":true} / send ana the note"#]
    );
    let entries = rig.record().entries().await.unwrap();
    assert!(entries.iter().any(|e| matches!(&e.body,
        EntryBody::ApprovalResolved(r) if r.request_id == request_id && r.approved
            && r.by.as_ref() == Some(&owner()) && r.refused.is_none())));

    // Answering again: refused, nothing runs again.
    rig.send(approve(request_id, None)).await;
    rig.wait_turns(3).await;
    let again = rig.log(3).await;
    assert!(
        matches!(&answers(&again)[0], Block::ApprovalResponse { refused: Some(why), .. }
        if why.contains("no approval request") && why.contains("already answered")),
        "{:?}",
        again.blocks
    );
    assert_eq!(ledger.calls.lock().unwrap().len(), 1);
    rig.stop().await;
}

#[tokio::test]
async fn an_answer_for_another_call_or_from_the_wrong_person_is_refused() {
    let ledger = Arc::new(Ledger::default());
    let boss: Identity = "oidc:acme:boss".parse().unwrap();
    let mut o = options(&ledger);
    o.directive = Some(IngressDirective {
        max_rounds: None,
        required_approver: Some(boss.clone()),
    });
    let rig = Rig::with(o).await;
    rig.say("send it").await;
    rig.wait_turns(1).await;
    let (request_id, ..) = request_of(&rig.log(1).await);
    let parked = rig.log(1).await;
    assert!(parked.blocks.iter().any(|b| matches!(b,
        Block::ApprovalRequest { approvers, .. } if approvers == &vec![boss.clone()])));

    // Changed arguments: another call.
    rig.send_as(
        &boss,
        approve(request_id, Some(json!({"to": "bob", "n": 1}))),
    )
    .await;
    rig.wait_turns(2).await;
    let log = rig.log(2).await;
    assert_eq!(log.outcome, TurnOutcome::Parked);
    assert!(
        matches!(&answers(&log)[0], Block::ApprovalResponse { refused: Some(why), .. }
        if why.contains("another call")),
        "{:?}",
        log.blocks
    );
    // The owner is not the required approver.
    rig.send(approve(request_id, None)).await;
    rig.wait_turns(3).await;
    let log = rig.log(3).await;
    assert!(
        matches!(&answers(&log)[0], Block::ApprovalResponse { refused: Some(why), .. }
        if why.contains("may not answer")),
        "{:?}",
        log.blocks
    );
    // An unknown request.
    rig.send_as(&boss, approve(RequestId::new(), None)).await;
    rig.wait_turns(4).await;
    assert!(matches!(
        &answers(&rig.log(4).await)[0],
        Block::ApprovalResponse {
            refused: Some(_),
            ..
        }
    ));
    assert!(ledger.calls.lock().unwrap().is_empty());
    // The required approver, for the right call.
    rig.send_as(&boss, approve(request_id, None)).await;
    rig.wait_turns(5).await;
    assert_eq!(ledger.calls.lock().unwrap().len(), 1);
    let entries = rig.record().entries().await.unwrap();
    let refused = entries
        .iter()
        .filter(|e| matches!(&e.body, EntryBody::ApprovalResolved(r) if r.refused.is_some()))
        .count();
    assert_eq!(refused, 3, "every refusal is recorded");
    rig.stop().await;
}

#[tokio::test]
async fn a_denial_reaches_the_agent_and_a_new_message_rejects_what_is_pending() {
    let ledger = Arc::new(Ledger::default());
    let rig = Rig::with(options(&ledger)).await;
    rig.say("send one").await;
    rig.wait_turns(1).await;
    let (first, ..) = request_of(&rig.log(1).await);
    rig.send(EventBody::ApprovalResponse {
        request_id: first,
        approve: false,
        reason: Some("not today".into()),
        tool: None,
        arguments: None,
    })
    .await;
    rig.wait_turns(2).await;
    let denied = rig.log(2).await;
    let reply = replies(&denied).join("");
    assert!(
        reply.contains("denied by oidc:acme:u-17: not today"),
        "{reply}"
    );

    rig.say("send another").await;
    rig.wait_turns(3).await;
    let (second, ..) = request_of(&rig.log(3).await);
    rig.say("never mind, tell me a joke").await;
    rig.wait_turns(4).await;
    let log = rig.log(4).await;
    assert!(
        matches!(&answers(&log)[0], Block::ApprovalResponse { request_id, automatic: true, approved: false, .. }
        if *request_id == second),
        "{:?}",
        log.blocks
    );
    let entries = rig.record().entries().await.unwrap();
    assert!(entries.iter().any(|e| matches!(&e.body,
        EntryBody::ApprovalResolved(r) if r.request_id == second && r.automatic)));
    // Approving it afterwards is refused.
    rig.send(approve(second, None)).await;
    rig.wait_turns(5).await;
    assert!(matches!(
        &answers(&rig.log(5).await)[0],
        Block::ApprovalResponse {
            refused: Some(_),
            ..
        }
    ));
    assert!(ledger.calls.lock().unwrap().is_empty());
    rig.stop().await;
}

#[tokio::test]
async fn a_question_parks_the_turn_and_its_answer_is_not_an_approval() {
    let ledger = Arc::new(Ledger::default());
    let rig = Rig::with(options(&ledger)).await;
    rig.say("ask me something").await;
    rig.wait_turns(1).await;
    let log = rig.log(1).await;
    assert_eq!(log.outcome, TurnOutcome::Parked);
    let question = log
        .blocks
        .iter()
        .find_map(|b| match b {
            Block::QuestionRequest {
                request_id,
                question,
                ..
            } => Some((*request_id, question.clone())),
            _ => None,
        })
        .unwrap();
    assert_eq!(question.1, "Which colour?");
    assert!(rig
        .record()
        .entries()
        .await
        .unwrap()
        .iter()
        .any(|e| e.body.kind() == EntryKind::QuestionRequest));
    // An approval with the question's id is refused: a question is not an approval request.
    rig.send(approve(question.0, None)).await;
    rig.wait_turns(2).await;
    assert!(matches!(
        &answers(&rig.log(2).await)[0],
        Block::ApprovalResponse {
            refused: Some(_),
            ..
        }
    ));
    rig.send(EventBody::QuestionResponse {
        request_id: question.0,
        answer: "blue".into(),
    })
    .await;
    rig.wait_turns(3).await;
    let answered = rig.log(3).await;
    assert!(
        replies(&answered)[0].ends_with(&format!("(answer to your question {}) blue", question.0)),
        "{:?}",
        replies(&answered)
    );
    rig.stop().await;
}

#[tokio::test]
async fn a_crash_while_parked_and_right_after_the_approval_still_runs_the_call_once() {
    let ledger = Arc::new(Ledger::default());
    let mut o = options(&ledger);
    o.lease_ttl = Duration::from_millis(900);
    let mut rig = Rig::with(o).await;
    rig.say("send it").await;
    rig.wait_turns(1).await;
    let (request_id, ..) = request_of(&rig.log(1).await);
    // Killed while parked.
    rig.crash().await;
    // The next worker dies right after committing the approval's batch one.
    rig.run_hanging_at("after-batch-one");
    rig.send(approve(request_id, None)).await;
    rig.wait_dispatched(2).await;
    rig.crash().await;
    assert!(ledger.calls.lock().unwrap().is_empty());
    // A third worker recovers turn 2 under the same id and runs the call, once.
    rig.run();
    rig.wait_turns(2).await;
    assert_eq!(ledger.calls.lock().unwrap().len(), 1);
    let log = rig.log(2).await;
    assert_eq!(log.outcome, TurnOutcome::Replied);
    let head = rig.record().head().await.unwrap();
    assert_eq!(
        head.state().last_turn,
        2,
        "recovered under the same turn id"
    );
    rig.stop().await;
}

#[tokio::test]
async fn a_side_effecting_call_interrupted_mid_way_is_quarantined_and_never_run_again() {
    let ledger = Arc::new(Ledger::default());
    ledger.hold.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut o = options(&ledger);
    o.agent_extra = String::new(); // no approval: the call runs at once
    o.lease_ttl = Duration::from_millis(900);
    let mut rig = Rig::with(o).await;
    let started = ledger.started.notified();
    rig.say("send it").await;
    tokio::time::timeout(LONG, started).await.unwrap();
    rig.crash().await;
    ledger
        .hold
        .store(false, std::sync::atomic::Ordering::SeqCst);
    rig.run();
    // The turn is closed as ambiguous, not completed.
    let ambiguous = rig.wait_ambiguous().await;
    assert_eq!(ambiguous.tool, "send");
    assert_eq!(ledger.calls.lock().unwrap().len(), 1, "never run again");
    let transcript =
        turnpike_artifactory::Transcript::from_entries(&rig.record().entries().await.unwrap());
    assert_eq!(transcript.quarantined.len(), 1);
    // The conversation goes on.
    rig.say("hello").await;
    rig.wait_turns(2).await;
    assert_eq!(rig.log(2).await.outcome, TurnOutcome::Replied);
    assert_eq!(ledger.calls.lock().unwrap().len(), 1);
    rig.stop().await;
}

#[tokio::test]
async fn switching_rejects_what_is_pending_and_the_next_turn_runs_as_the_new_agent() {
    let ledger = Arc::new(Ledger::default());
    let rig = Rig::with(options(&ledger)).await;
    rig.say("send it").await;
    rig.wait_turns(1).await;
    let (request_id, ..) = request_of(&rig.log(1).await);
    rig.send(EventBody::SwitchAgent {
        agent: "other".parse().unwrap(),
    })
    .await;
    rig.wait_turns(2).await;
    let log = rig.log(2).await;
    assert!(
        matches!(&answers(&log)[0], Block::ApprovalResponse { request_id: r, automatic: true, .. } if *r == request_id)
    );
    assert!(log
        .blocks
        .iter()
        .any(|b| matches!(b, Block::AgentSwitched { to, .. } if to.as_str() == "other")));
    rig.say("hello").await;
    rig.wait_turns(3).await;
    assert_eq!(rig.log(3).await.agent.as_str(), "other");
    let entries = rig.record().entries().await.unwrap();
    let switched = entries
        .iter()
        .filter(|e| e.body.kind() == EntryKind::AgentSwitched)
        .count();
    assert_eq!(switched, 1);
    // Switching to the current agent does nothing.
    rig.send(EventBody::SwitchAgent {
        agent: "other".parse().unwrap(),
    })
    .await;
    rig.wait_turns(4).await;
    let entries = rig.record().entries().await.unwrap();
    assert_eq!(
        entries
            .iter()
            .filter(|e| e.body.kind() == EntryKind::AgentSwitched)
            .count(),
        1
    );
    // The tool hands it back.
    rig.say("hand over to other please").await;
    rig.wait_turns(5).await;
    rig.say("hand over").await;
    rig.wait_turns(6).await;
    assert!(ledger.calls.lock().unwrap().is_empty());
    rig.stop().await;
}

#[tokio::test]
async fn compaction_keeps_instructions_verbatim_and_the_record_still_replays_and_verifies() {
    let ledger = Arc::new(Ledger::default());
    let mut o = options(&ledger);
    o.agent_extra = "context_length = 400\nreply_reserve = 100".into();
    let rig = Rig::with(o).await;
    rig.say("From now on, always answer in French.").await;
    rig.wait_turns(1).await;
    let filler =
        "Here is a long message about the quarterly report and its many numbers. ".repeat(3);
    let mut n = 1;
    let compacted_at = loop {
        n += 1;
        rig.say(&filler).await;
        rig.wait_turns(n).await;
        let log = rig.log(n).await;
        if matches!(log.blocks.first(), Some(Block::Summary { .. })) {
            break n;
        }
        assert!(n < 12, "no compaction after {n} turns");
    };
    let log = rig.log(compacted_at).await;
    let Some(Block::Summary { through, text }) = log.blocks.first() else {
        unreachable!()
    };
    assert_eq!(through.number(), compacted_at - 1);
    assert!(text.starts_with("SUMMARY of"), "{text}");
    assert!(
        text.contains("- instruction: From now on, always answer in French."),
        "{text}"
    );
    let head = rig.record().head().await.unwrap();
    assert_eq!(head.state().summary_turn, compacted_at);
    let entries = rig.record().entries().await.unwrap();
    assert!(entries.iter().any(|e| matches!(&e.body,
        EntryBody::CompactionMarker(m) if m.turn.number() == compacted_at && m.prompt.contains("Summarise"))));
    // The next turn's context: the summary and the turns after it.
    rig.say("and now?").await;
    rig.wait_turns(compacted_at + 1).await;
    let logs = rig.conversations.turn_logs();
    let head = rig.record().head().await.unwrap();
    let next = TurnId::new(compacted_at + 2).unwrap();
    for timeline in [
        turnpike_worker::timeline::rebuild(&logs, &rig.prefix(), head.state(), next)
            .await
            .unwrap(),
        turnpike_worker::timeline::rebuild_from_logs(&logs, &rig.prefix(), head.state(), next)
            .await
            .unwrap(),
    ] {
        assert!(matches!(timeline.rows[0].block, Block::Summary { .. }));
        assert!(timeline
            .rows
            .iter()
            .all(|r| r.turn().number() >= compacted_at));
    }
    // A manual compaction.
    rig.send(EventBody::Compact {}).await;
    rig.wait_turns(compacted_at + 2).await;
    let manual = rig.log(compacted_at + 2).await;
    let Some(Block::Summary { text, .. }) = manual.blocks.first() else {
        panic!("{:?}", manual.blocks)
    };
    assert!(
        text.contains("- instruction: From now on, always answer in French."),
        "{text}"
    );
    // The original rows stay: the full record verifies and every turn replays.
    let verdict = rig
        .record()
        .verify(
            &turnpike_artifactory::TrustedKeys::new([signer().verifying_key()]),
            None,
        )
        .await
        .unwrap();
    assert!(verdict.is_ok(), "{verdict:?}");
    let mut all = Vec::new();
    for t in 1..=compacted_at + 2 {
        all.push(rig.log(t).await);
    }
    for r in turnpike_agent::replay::replay(&all, None).await {
        assert_eq!(r.divergence, None, "{}", r.turn);
    }
    rig.stop().await;
}

const DEPUTY: &str = r#"
# Alice's slow turn: after its first round, whatever arrived is folded in, then it pulls the
# latest user text as a reference and reads it back.
[[turn]]
when = "slowly"
[[turn.step]]
tool_calls = [{ name = "list_files" }]
delay_ms = 1500
[[turn.step]]
tool_calls = [{ name = "pull", arguments = { reference = "{last_user}", path = "got.txt" } }]
[[turn.step]]
tool_calls = [{ name = "read_file", arguments = { path = "got.txt" } }]
[[turn.step]]
text = "read: {last_tool}"

# Any other turn pulls its text as a reference and reads it back.
[[turn]]
[[turn.step]]
tool_calls = [{ name = "pull", arguments = { reference = "{last_user}", path = "got.txt" } }]
[[turn.step]]
tool_calls = [{ name = "read_file", arguments = { path = "got.txt" } }]
[[turn.step]]
text = "read: {last_tool}"
"#;

#[tokio::test]
async fn in_a_shared_conversation_nobody_reaches_what_another_participant_may_not_see() {
    let rig = Rig::start(DEPUTY, 8).await;
    let bob: Identity = "oidc:acme:bob".parse().unwrap();
    let directory = rig.conversations.directory().clone();
    directory.grant(rig.conv, &bob).await.unwrap();
    // Alice has another conversation, hers alone, with a secret in it (words no digest, id or
    // timestamp in a record can spell by chance).
    let secret = turnpike_tests::fixtures::conversation_with_file(
        &rig.conversations,
        owner(),
        "secret.txt",
        "the vault code is zebra-quartz-sapphire",
    )
    .await;

    // 1. Bob's follow-up, sent while alice's turn runs, is not folded into it (it would run
    //    as alice): it waits for a turn of its own, which runs as bob.
    rig.say("slowly, please").await;
    rig.wait_dispatched(1).await;
    rig.send_as(
        &bob,
        EventBody::FollowUp {
            text: secret.to_string(),
        },
    )
    .await;
    rig.wait_turns(2).await;
    // 2. Alice herself asks for it in the shared conversation: bob would read it there.
    rig.say(&secret.to_string()).await;
    rig.wait_turns(3).await;

    let entries = rig.record().entries().await.unwrap();
    let record_text = format!("{entries:?}");
    assert!(
        !record_text.contains("zebra-quartz-sapphire"),
        "the secret reached the shared record: {entries:#?}"
    );
    for n in 1..=3 {
        let log = rig.log(n).await;
        assert!(
            !format!("{log:?}").contains("zebra-quartz-sapphire"),
            "turn {n}'s log"
        );
    }
    // The second turn was bob's own, and ran as bob.
    let dispatched_inputs: Vec<String> = entries
        .iter()
        .filter_map(|e| e.body.as_input())
        .map(|i| i.event.address.identity.to_string())
        .collect();
    assert_eq!(
        dispatched_inputs,
        [owner().to_string(), bob.to_string(), owner().to_string()]
    );
    // Alone in her own conversation, alice does reach it (the rule is about sharing).
    directory.revoke(rig.conv, &bob).await.unwrap();
    rig.say(&secret.to_string()).await;
    rig.wait_turns(4).await;
    assert!(format!("{:?}", rig.log(4).await).contains("zebra-quartz-sapphire"));
    rig.stop().await;
}
