//! Replay: re-running committed turns from their recorded outputs, without calling live models
//! or tools, and what-ifs that change one recorded step and report where the replay diverges.
//!
//! Each turn runs through the same agent loop as a live turn, with three stand-ins built from
//! its log: [`ReplayModel`] answers the k-th model call with the k-th recorded output,
//! [`ReplayTools`] answers a call with its recorded result (only if the call is the recorded
//! one), and the inbox hands back arrivals (follow-ups, steers, stops) at the rounds where they
//! were folded in. The history of turn n is the replayed blocks of the turns before it, so a
//! what-if's change carries forward. The replayed blocks are compared with the recorded ones.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use async_trait::async_trait;
use serde_json::Value;
use turnpike_schemas::entry::TurnOutcome;
use turnpike_schemas::{Block, TurnId, TurnLog};

use crate::agent_loop::{self, Inbox, Settings, ToolRunner};
use crate::error::Result;
use crate::model::{
    CallContext, ModelError, ModelErrorKind, ModelProvider, ModelReply, ModelRequest,
    ToolCallRequest, ToolSpec,
};
use crate::timeline::is_input;
use crate::tools::ToolOutput;

/// One recorded model output: optional text and the calls it made.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    pub text: String,
    pub calls: Vec<ToolCallRequest>,
}

/// A recorded turn, taken apart for replay.
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    /// The blocks the turn started with (its inputs).
    pub inputs: Vec<Block>,
    pub outputs: Vec<Output>,
    /// Per call id: whether it succeeded, its output, and the blocks that followed it.
    pub results: HashMap<String, (bool, Value, Vec<Block>)>,
    /// Arrivals folded in before model call k (index k), and after the last (index len).
    pub arrivals: Vec<Vec<Block>>,
    /// The approval requests that parked calls, by call id.
    pub requests: HashMap<String, Block>,
}

impl Recorded {
    /// Takes a turn's blocks apart.
    pub fn from_blocks(blocks: &[Block]) -> Self {
        let lead = blocks.iter().take_while(|b| is_input(b)).count();
        let mut recorded = Recorded {
            inputs: blocks[..lead].to_vec(),
            arrivals: vec![Vec::new()],
            ..Default::default()
        };
        let mut last_call: Option<String> = None;
        // Whether the current output may still take tool calls.
        let mut open_output = false;
        for block in &blocks[lead..] {
            match block {
                Block::AssistantMessage { text } => {
                    recorded.outputs.push(Output {
                        text: text.clone(),
                        calls: Vec::new(),
                    });
                    recorded.arrivals.push(Vec::new());
                    open_output = true;
                    last_call = None;
                }
                Block::ToolCall {
                    call_id,
                    tool,
                    arguments,
                } => {
                    if !open_output {
                        recorded.outputs.push(Output {
                            text: String::new(),
                            calls: Vec::new(),
                        });
                        recorded.arrivals.push(Vec::new());
                        open_output = true;
                    }
                    recorded
                        .outputs
                        .last_mut()
                        .expect("an output is open")
                        .calls
                        .push(ToolCallRequest {
                            id: call_id.clone(),
                            name: tool.clone(),
                            arguments: arguments.clone(),
                        });
                }
                Block::ToolResult {
                    call_id,
                    ok,
                    output,
                } => {
                    open_output = false;
                    recorded
                        .results
                        .insert(call_id.clone(), (*ok, output.clone(), Vec::new()));
                    last_call = Some(call_id.clone());
                }
                Block::ApprovalRequest { call_id, .. } => {
                    recorded.requests.insert(call_id.clone(), block.clone());
                }
                Block::File { .. }
                | Block::Artifact { .. }
                | Block::QuestionRequest { .. }
                | Block::AgentSwitched { .. }
                    if last_call.is_some() =>
                {
                    let id = last_call.as_ref().expect("checked");
                    if let Some(r) = recorded.results.get_mut(id) {
                        r.2.push(block.clone());
                    }
                }
                other => {
                    open_output = false;
                    last_call = None;
                    recorded
                        .arrivals
                        .last_mut()
                        .expect("never empty")
                        .push(other.clone());
                }
            }
        }
        recorded
    }
}

/// Answers model calls with recorded outputs, in order.
pub struct ReplayModel {
    outputs: Vec<Output>,
    next: Mutex<usize>,
}

impl ReplayModel {
    pub fn new(outputs: Vec<Output>) -> Self {
        Self {
            outputs,
            next: Mutex::new(0),
        }
    }
}

#[async_trait]
impl ModelProvider for ReplayModel {
    async fn complete(
        &self,
        _request: &ModelRequest,
        cx: &mut CallContext,
    ) -> std::result::Result<ModelReply, ModelError> {
        let k = {
            let mut next = self.next.lock().expect("replay lock");
            let k = *next;
            *next += 1;
            k
        };
        let Some(output) = self.outputs.get(k) else {
            return Err(ModelError::new(
                ModelErrorKind::Diverged,
                format!("model call {} has no recorded output", k + 1),
            ));
        };
        cx.delta(&output.text);
        Ok(ModelReply {
            text: output.text.clone(),
            tool_calls: output.calls.clone(),
            usage: None,
            model: None,
            finish_reason: None,
        })
    }
}

/// Answers tool calls with recorded results — only for the recorded call.
pub struct ReplayTools {
    requests: HashMap<String, Block>,
    results: HashMap<String, (bool, Value, Vec<Block>)>,
    recorded_calls: HashMap<String, (String, Value)>,
    specs: Vec<ToolSpec>,
}

#[async_trait]
impl ToolRunner for ReplayTools {
    fn specs(&self) -> Vec<ToolSpec> {
        self.specs.clone()
    }

    fn gate(&self, call: &ToolCallRequest) -> Option<Block> {
        self.requests.get(&call.id).cloned()
    }

    async fn run(&self, call: &ToolCallRequest) -> (bool, ToolOutput) {
        let same = self
            .recorded_calls
            .get(&call.id)
            .is_some_and(|(name, args)| *name == call.name && *args == call.arguments);
        match self.results.get(&call.id) {
            Some((ok, output, blocks)) if same => (
                *ok,
                ToolOutput {
                    output: output.clone(),
                    blocks: blocks.clone(),
                },
            ),
            _ => (
                false,
                serde_json::json!({"error": format!(
                    "replay: no recorded result for {}({})", call.name, call.arguments)})
                .into(),
            ),
        }
    }
}

struct ReplayInbox {
    arrivals: Vec<Vec<Block>>,
    next: usize,
}

#[async_trait]
impl Inbox for ReplayInbox {
    async fn arrivals(&mut self) -> Result<Vec<Block>> {
        let out = self.arrivals.get(self.next).cloned().unwrap_or_default();
        self.next += 1;
        Ok(out)
    }

    async fn stop_requested(&mut self) {
        std::future::pending::<()>().await
    }
}

/// One change to a recorded step.
#[derive(Debug, Clone, PartialEq)]
pub enum WhatIf {
    /// The k-th (1-based) model output of a turn says `text` instead.
    OutputText {
        turn: TurnId,
        output: usize,
        text: String,
    },
    /// A tool call's recorded result is `output` instead.
    ToolResult {
        turn: TurnId,
        call_id: String,
        output: Value,
    },
}

impl std::str::FromStr for WhatIf {
    type Err = String;

    /// `turn_<n>/output/<k>=<text>` or `turn_<n>/result/<call_id>=<json>`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let usage = "expected turn_<n>/output/<k>=<text> or turn_<n>/result/<call_id>=<json>";
        let (step, value) = s.split_once('=').ok_or(usage)?;
        let mut parts = step.splitn(3, '/');
        let (Some(turn), Some(kind), Some(which)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(usage.into());
        };
        let turn: TurnId = turn.parse().map_err(|e| format!("{turn:?}: {e}"))?;
        match kind {
            "output" => Ok(WhatIf::OutputText {
                turn,
                output: which
                    .parse()
                    .ok()
                    .filter(|k| *k >= 1)
                    .ok_or_else(|| format!("output number {which:?} must be 1 or more"))?,
                text: value.to_owned(),
            }),
            "result" => Ok(WhatIf::ToolResult {
                turn,
                call_id: which.to_owned(),
                output: serde_json::from_str(value)
                    .unwrap_or_else(|_| Value::String(value.to_owned())),
            }),
            _ => Err(usage.into()),
        }
    }
}

/// Where a replayed turn first differs from its record: a block, or — with the same blocks —
/// how it ends.
#[derive(Debug, Clone, PartialEq)]
pub struct Divergence {
    pub turn: TurnId,
    /// The first block that differs (the block count when only the outcome differs).
    pub block: usize,
    pub recorded: Option<Block>,
    pub replayed: Option<Block>,
    /// The same blocks ended otherwise: the replayed outcome (or its error), when it is not
    /// the recorded one.
    pub outcome: Option<String>,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |b: &Option<Block>| match b {
            Some(b) => serde_json::to_string(b).unwrap_or_default(),
            None => "(nothing)".into(),
        };
        if let Some(outcome) = &self.outcome {
            return write!(f, "{} ends differently: {outcome}", self.turn);
        }
        write!(
            f,
            "{} diverges at block {}: recorded {}, replayed {}",
            self.turn,
            self.block,
            show(&self.recorded),
            show(&self.replayed)
        )
    }
}

/// The replay of one turn.
#[derive(Debug, Clone)]
pub struct TurnReplay {
    pub turn: TurnId,
    pub recorded_outcome: TurnOutcome,
    pub outcome: std::result::Result<TurnOutcome, String>,
    pub blocks: Vec<Block>,
    pub divergence: Option<Divergence>,
    /// An earlier turn diverged, so this one ran on a different history (its recorded outputs
    /// were replayed as they are: a replay cannot think).
    pub context_changed: bool,
}

/// Replays `logs` (a conversation's committed turns, in order), applying `what_if` if given.
pub async fn replay(logs: &[TurnLog], what_if: Option<&WhatIf>) -> Vec<TurnReplay> {
    let mut history: Vec<Block> = Vec::new();
    let mut out: Vec<TurnReplay> = Vec::new();
    for log in logs {
        let (recorded, tools) = recorded(log, what_if);
        let (outcome, blocks) = if let Some(exchange) = &log.exchange {
            // A remote app's turn: re-driven from its exchange, without the app.
            replay_remote(log, exchange, what_if, &tools).await
        } else if let Some(done) = without_model(&recorded, log, &history) {
            done
        } else {
            replay_loop(&recorded, &tools, &history).await
        };
        out.push(finish(log, outcome, blocks, &mut history, &out));
    }
    out
}

/// What one turn replays from: its recorded model outputs, arrivals and tool results (with the
/// what-if's change, when it is about this turn), and the tools that answer from them.
fn recorded(log: &TurnLog, what_if: Option<&WhatIf>) -> (Recorded, ReplayTools) {
    let mut recorded = Recorded::from_blocks(&log.blocks);
    let recorded_calls: HashMap<String, (String, Value)> = recorded
        .outputs
        .iter()
        .flat_map(|o| o.calls.iter())
        .map(|c| (c.id.clone(), (c.name.clone(), c.arguments.clone())))
        .collect();
    match what_if {
        Some(WhatIf::OutputText { turn, output, text }) if *turn == log.turn => {
            if let Some(o) = recorded.outputs.get_mut(output - 1) {
                o.text = text.clone();
            }
        }
        Some(WhatIf::ToolResult {
            turn,
            call_id,
            output,
        }) if *turn == log.turn => {
            if let Some(r) = recorded.results.get_mut(call_id) {
                r.1 = output.clone();
            }
        }
        _ => {}
    }
    let tools = ReplayTools {
        requests: recorded.requests.clone(),
        results: recorded.results.clone(),
        recorded_calls,
        specs: Vec::new(),
    };
    (recorded, tools)
}

/// A turn's outcome as replayed (the error as text) and the blocks it made.
type Replayed = (std::result::Result<TurnOutcome, String>, Vec<Block>);

/// A remote app's turn, re-driven from its exchange without the app. A what-if it cannot answer
/// (a model output: the app made none; a result the app had with its inputs) says so.
async fn replay_remote(
    log: &TurnLog,
    exchange: &turnpike_schemas::turnlog::Exchange,
    what_if: Option<&WhatIf>,
    tools: &ReplayTools,
) -> Replayed {
    match what_if {
        Some(WhatIf::OutputText { turn, .. }) if *turn == log.turn => (
            Err("a remote app's turn has no model outputs to change: change a tool result instead".to_owned()),
            Vec::new(),
        ),
        Some(WhatIf::ToolResult { turn, call_id, .. })
            if *turn == log.turn
                && log.blocks[..exchange.lead.min(log.blocks.len())].iter().any(
                    |b| matches!(b, Block::ToolResult { call_id: c, .. } if c == call_id),
                ) =>
        {
            (
                Err(format!("{call_id}'s result reached the app with the turn's inputs: what the app does with another is unknown to a replay")),
                Vec::new(),
            )
        }
        _ => crate::remote::replay_turn(log, exchange, tools).await,
    }
}

/// As live (`agent_loop::run_live`): a turn with nothing for the model — a compaction, an
/// agent switch, an answer that did not apply — ends without a model call, replied, or parked
/// while a request is still pending. Its blocks are its inputs and what the prelude wrote (a
/// switch, a refused answer). None: the turn had work for the model.
fn without_model(recorded: &Recorded, log: &TurnLog, history: &[Block]) -> Option<Replayed> {
    let work = recorded.inputs.iter().any(|b| {
        matches!(
            b,
            Block::UserMessage { .. }
                | Block::FollowUp { .. }
                | Block::Steer { .. }
                | Block::Attachment { .. }
        )
    });
    let applied = log
        .blocks
        .iter()
        .any(|b| matches!(b, Block::ToolCall { .. } | Block::ToolResult { .. }));
    if work || applied || !recorded.outputs.is_empty() {
        return None;
    }
    let mut blocks = recorded.inputs.clone();
    blocks.extend(recorded.arrivals.first().cloned().unwrap_or_default());
    let (still_pending, _) = crate::approvals::pending(history.iter().chain(blocks.iter()));
    let outcome = Ok(if still_pending.is_empty() {
        TurnOutcome::Replied
    } else {
        TurnOutcome::Parked
    });
    Some((outcome, blocks))
}

/// The very loop live turns run, with the recorded model outputs, arrivals and tool results.
async fn replay_loop(recorded: &Recorded, tools: &ReplayTools, history: &[Block]) -> Replayed {
    let model = ReplayModel::new(recorded.outputs.clone());
    let mut inbox = ReplayInbox {
        arrivals: recorded.arrivals.clone(),
        next: 0,
    };
    let settings = Settings {
        provider: "replay".into(),
        model: "replay".into(),
        system_prompt: String::new(),
        // Replay as many rounds as were recorded; never fewer.
        max_rounds: recorded.outputs.len().max(1) as u32,
        history_budget: u64::MAX,
        tokens: Default::default(),
        tool_choice: Default::default(),
        temperature: None,
        max_tokens: None,
    };
    let mut blocks = recorded.inputs.clone();
    let mut cx = CallContext::detached();
    let outcome = agent_loop::run(
        &settings,
        &crate::timeline::messages(history),
        &mut blocks,
        &model,
        tools,
        &mut inbox,
        &mut cx,
    )
    .await
    .map_err(|e| e.to_string());
    (outcome, blocks)
}

/// A turn's replay, compared with its record; its blocks join the history of the next.
fn finish(
    log: &TurnLog,
    outcome: std::result::Result<TurnOutcome, String>,
    blocks: Vec<Block>,
    history: &mut Vec<Block>,
    before: &[TurnReplay],
) -> TurnReplay {
    let divergence = first_difference(&log.blocks, &blocks)
        .map(|i| Divergence {
            turn: log.turn,
            block: i,
            recorded: log.blocks.get(i).cloned(),
            replayed: blocks.get(i).cloned(),
            outcome: None,
        })
        .or_else(|| {
            other_ending(log.outcome, &outcome).map(|why| Divergence {
                turn: log.turn,
                block: blocks.len(),
                recorded: None,
                replayed: None,
                outcome: Some(why),
            })
        });
    // As the live timeline: what a turn recalled was for that turn only.
    history.extend(
        blocks
            .iter()
            .filter(|b| !matches!(b, Block::Recall { .. }))
            .cloned(),
    );
    let context_changed = before
        .iter()
        .any(|r| r.divergence.is_some() || r.context_changed);
    TurnReplay {
        context_changed,
        turn: log.turn,
        recorded_outcome: log.outcome,
        outcome,
        blocks,
        divergence,
    }
}

/// How a replay's outcome differs from the recorded one, if it does. A recorded failure is
/// reproduced by a replay that fails (its error is the failure; the record holds the reason).
fn other_ending(
    recorded: TurnOutcome,
    replayed: &std::result::Result<TurnOutcome, String>,
) -> Option<String> {
    let name = |o: TurnOutcome| format!("{o:?}").to_lowercase();
    match replayed {
        Ok(o) if *o == recorded => None,
        Err(_) if recorded == TurnOutcome::Failed => None,
        Ok(o) => Some(format!(
            "recorded {}, replayed {}",
            name(recorded),
            name(*o)
        )),
        Err(e) => Some(format!("recorded {}, replay failed: {e}", name(recorded))),
    }
}

fn first_difference(a: &[Block], b: &[Block]) -> Option<usize> {
    let n = a.len().max(b.len());
    (0..n).find(|&i| a.get(i) != b.get(i))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use turnpike_schemas::ConversationId;

    fn log(turn: u64, blocks: Vec<Block>) -> TurnLog {
        TurnLog {
            version: 1,
            conversation: ConversationId::new(),
            turn: TurnId::new(turn).unwrap(),
            agent: "a".parse().unwrap(),
            outcome: TurnOutcome::Replied,
            blocks,
            usage: None,
            exchange: None,
            unindexed: false,
        }
    }

    fn turn_with_tool() -> Vec<Block> {
        vec![
            Block::UserMessage { text: "go".into() },
            Block::ToolCall {
                call_id: "c1".into(),
                tool: "read_file".into(),
                arguments: json!({"path": "a"}),
            },
            Block::ToolResult {
                call_id: "c1".into(),
                ok: true,
                output: json!({"text": "A"}),
            },
            Block::FollowUp {
                text: "also b".into(),
            },
            Block::AssistantMessage {
                text: "done".into(),
            },
        ]
    }

    #[tokio::test]
    async fn a_recorded_turn_replays_to_the_same_blocks() {
        let logs = vec![log(1, turn_with_tool())];
        let replays = replay(&logs, None).await;
        assert_eq!(replays[0].divergence, None, "{:?}", replays[0].blocks);
        assert_eq!(replays[0].blocks, logs[0].blocks);
    }

    #[tokio::test]
    async fn a_what_if_reports_the_first_divergent_block() {
        let logs = vec![log(1, turn_with_tool())];
        let what_if: WhatIf = "turn_1/output/2=not done".parse().unwrap();
        let replays = replay(&logs, Some(&what_if)).await;
        let d = replays[0].divergence.clone().unwrap();
        assert_eq!(d.block, 4);
        assert_eq!(
            d.replayed,
            Some(Block::AssistantMessage {
                text: "not done".into()
            })
        );
        let what_if: WhatIf = r#"turn_1/result/c1={"text":"B"}"#.parse().unwrap();
        let d = replay(&logs, Some(&what_if)).await[0]
            .divergence
            .clone()
            .unwrap();
        assert_eq!(d.block, 2);
        assert!("turn_1/outputs/1=x".parse::<WhatIf>().is_err());
        assert!("turn_1/output/0=x".parse::<WhatIf>().is_err());
    }

    /// Item 4 of the third adversarial look: the same blocks ending otherwise (a turn recorded
    /// as cancelled that a replay completes, or one whose replay fails) is a divergence, and
    /// says how; a recorded failure that replays as a failure is not.
    #[tokio::test]
    async fn the_same_blocks_with_another_outcome_diverge() {
        let mut cancelled = log(1, turn_with_tool());
        cancelled.outcome = TurnOutcome::Cancelled;
        let r = &replay(&[cancelled], None).await[0];
        assert_eq!(r.blocks.len(), 5, "{:?}", r.blocks);
        let d = r.divergence.clone().expect("another outcome diverges");
        assert_eq!(d.block, 5);
        assert_eq!(
            d.outcome.as_deref(),
            Some("recorded cancelled, replayed replied")
        );
        assert!(d.to_string().contains("ends differently"), "{d}");

        let mut failed = log(1, turn_with_tool());
        failed.outcome = TurnOutcome::Failed;
        let r = &replay(&[failed], None).await[0];
        assert!(r.divergence.is_some(), "a replied replay of a failed turn");
        assert_eq!(
            other_ending(TurnOutcome::Failed, &Err("model: gone".into())),
            None
        );
        assert_eq!(
            other_ending(TurnOutcome::Replied, &Err("model: gone".into())).as_deref(),
            Some("recorded replied, replay failed: model: gone")
        );
    }
}
