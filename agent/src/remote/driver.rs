//! The driver: one turn of a remote app, written against an [`Exchange`] (live HTTP, or the
//! recorded steps of a turn log for replay), the turn's tools, inbox and model.
//!
//! Contract:
//! - what waits on the lane when the turn starts is committed and folded in before the app is
//!   called; a stop there ends the turn `cancelled` without calling the app;
//! - every action is parsed and checked before anything runs: a malformed one, an id used
//!   twice, more than `max_actions` actions — or a stream that breaks, runs too long or goes
//!   quiet — and the app is sent `refused` (if it still listens) and the turn fails with that
//!   reason, recorded once; the user retries, nothing spins;
//! - `say` streams to the user at once; consecutive `say`s become one reply block, closed by
//!   the next other step;
//! - a tool call (`tool`, `ask_user`, `publish`) is one round, run exactly as the built-in loop
//!   runs it: the approval gate first (a gated call parks the turn: the app is sent `parked`
//!   and text said since the last block is withheld until the approval), a side-effecting
//!   call's intent committed before it runs; past `max_rounds` a call is answered with an
//!   error result and not run;
//! - events reaching the lane while the app works are taken only when the app asks for them
//!   (`next_events`, answered `events`): committed, added to the turn, sent to the app. What it
//!   has not taken when it sends `done` stays on the lane and starts the next turn — as with
//!   the built-in loop, which takes arrivals only at the start of a round. A stop cancels what
//!   runs (a tool, a model call, a wait for events), the app is sent `stop`, and the turn ends
//!   `cancelled`;
//! - every action and everything sent is kept in the exchange log, in order, so a replay can
//!   re-drive the turn without the app.

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use turnpike_schemas::entry::TurnOutcome;
use turnpike_schemas::turnlog::ExchangeStep;
use turnpike_schemas::Block;

use super::protocol::{Action, Limits, ToApp};
use crate::agent_loop::{Inbox, ToolRunner, CANCELLED_RESULT};
use crate::error::{Error, Result};
use crate::model::{CallContext, ModelProvider, ModelRequest};
use crate::timeline::messages;

/// What happens next in an exchange.
#[derive(Debug)]
pub enum Step {
    /// One line of the app's stream (not yet parsed).
    Line(Vec<u8>),
    /// Events reached the turn (committed; may be empty). Live exchanges give these only as
    /// the answer to [`Exchange::take`]; turns recorded before `next_events` hold them
    /// unasked, where they came.
    Arrived(Vec<Block>),
    /// A stop reached the turn (committed, with what came with it).
    Stopped(Vec<Block>),
    /// The app ended its stream.
    Closed,
}

/// Where a remote app's actions come from and where what it is sent goes.
#[async_trait]
pub trait Exchange: Send {
    /// Opens the exchange with the turn's context.
    async fn start(&mut self, context: &Value) -> Result<()>;
    /// The next step: a line from the app or a stop (cancel-safe). Arrivals wait on the lane
    /// until the app takes them.
    async fn next(&mut self, inbox: &mut dyn Inbox, cx: &mut CallContext) -> Result<Step>;
    /// The app's `next_events`: what waits on the lane, committed; when nothing waits, the
    /// first arrival within `wait`, or nothing. [`Step::Arrived`] (a stop among the blocks
    /// cancels the turn) or [`Step::Stopped`].
    async fn take(
        &mut self,
        inbox: &mut dyn Inbox,
        cx: &mut CallContext,
        wait: Duration,
    ) -> Result<Step>;
    /// Resolves once a stop is waiting (cancel-safe, writes nothing: it is raced against
    /// tools and model calls; may never resolve).
    async fn stop_signal(&mut self, inbox: &mut dyn Inbox);
    /// The stop's blocks, committed (after [`Self::stop_signal`] resolved).
    async fn stop_blocks(&mut self, inbox: &mut dyn Inbox) -> Result<Vec<Block>>;
    /// Sends the app a message.
    async fn send(&mut self, message: &ToApp) -> Result<()>;
    /// Sends the app the exchange's last message (a stop, a park, a refusal): it may take
    /// less time than the app's read timeout.
    async fn send_final(&mut self, message: &ToApp) -> Result<()> {
        self.send(message).await
    }
}

/// One turn's run: what the driver needs besides the exchange.
pub struct Run<'r> {
    /// The context sent to start the exchange (the driver adds `inputs`).
    pub context: serde_json::Map<String, Value>,
    /// A model request holding the system prompt and history (`turn_start` marks its end):
    /// the base of the app's `model` actions.
    pub base: ModelRequest,
    pub limits: Limits,
    /// The most tokens one model reply may take (an app asking for more gets this).
    pub max_reply_tokens: Option<u32>,
    pub model: &'r dyn ModelProvider,
    pub tools: &'r dyn ToolRunner,
}

/// What a driven turn leaves besides its blocks.
#[derive(Debug, Default)]
pub struct Trace {
    /// The turn's block count when the exchange started.
    pub lead: usize,
    pub steps: Vec<ExchangeStep>,
}

/// Drives one turn of a remote app, appending what it does to `blocks` and its exchange to
/// `trace`.
pub async fn drive(
    run: Run<'_>,
    exchange: &mut dyn Exchange,
    blocks: &mut Vec<Block>,
    inbox: &mut dyn Inbox,
    cx: &mut CallContext,
    trace: &mut Trace,
) -> Result<TurnOutcome> {
    let arrived = inbox.arrivals().await?;
    blocks.extend(arrived);
    trace.lead = blocks.len();
    if blocks.iter().any(|b| matches!(b, Block::Stop { .. })) {
        return Ok(TurnOutcome::Cancelled);
    }
    let mut context = run.context.clone();
    context.insert("inputs".into(), json!(blocks));
    exchange.start(&Value::Object(context)).await?;
    let mut d = Driver {
        run: &run,
        exchange,
        blocks,
        trace,
        said: String::new(),
        pending: None,
        ids: HashSet::new(),
        actions: 0,
        rounds: 0,
        model_calls: 0,
    };
    let result = d.steps(inbox, cx).await;
    d.flush();
    result
}

struct Driver<'d, 'r> {
    run: &'d Run<'r>,
    exchange: &'d mut dyn Exchange,
    blocks: &'d mut Vec<Block>,
    trace: &'d mut Trace,
    /// Text said since the last block.
    said: String,
    /// What the app sent while a take of its waited, read before the exchange's next step.
    pending: Option<Step>,
    ids: HashSet<String>,
    actions: u32,
    rounds: u32,
    model_calls: u32,
}

impl Driver<'_, '_> {
    async fn steps(&mut self, inbox: &mut dyn Inbox, cx: &mut CallContext) -> Result<TurnOutcome> {
        loop {
            let next = match self.pending.take() {
                Some(step) => Ok(step),
                None => self.exchange.next(inbox, cx).await,
            };
            let step = match next {
                Ok(step) => step,
                // The app broke the protocol or went quiet: it is told why, if it still hears.
                Err(e) if e.kind() == crate::error::ErrorKind::App => {
                    return self.refuse(e.to_string()).await
                }
                Err(e) => return Err(e),
            };
            match step {
                Step::Stopped(arrived) => return self.cancelled(arrived).await,
                Step::Arrived(arrived)
                    if arrived.iter().any(|b| matches!(b, Block::Stop { .. })) =>
                {
                    return self.cancelled(arrived).await
                }
                Step::Arrived(arrived) if arrived.is_empty() => {}
                // Only a recorded turn from before `next_events` has these unasked.
                Step::Arrived(arrived) => self.arrived(None, arrived).await?,
                Step::Closed => {
                    return Err(Error::app(
                        "the app ended its stream without a `done` action",
                    ))
                }
                Step::Line(line) => {
                    if let Some(outcome) = self.action(&line, inbox, cx).await? {
                        return Ok(outcome);
                    }
                }
            }
        }
    }

    /// Handles one line; `Some` ends the turn.
    async fn action(
        &mut self,
        line: &[u8],
        inbox: &mut dyn Inbox,
        cx: &mut CallContext,
    ) -> Result<Option<TurnOutcome>> {
        let action = match self.admit(line) {
            Ok(Some(action)) => action,
            Ok(None) => return Ok(None),
            Err(why) => return self.refuse(why).await,
        };
        match action {
            Action::Say { text } => {
                cx.delta(&text);
                self.said.push_str(&text);
                Ok(None)
            }
            Action::Done {} => Ok(Some(TurnOutcome::Replied)),
            Action::Error { message } => {
                let shown: String = message.chars().take(500).collect();
                Err(Error::app(format!("the app failed: {shown}")))
            }
            Action::Keepalive {} => Ok(None),
            Action::NextEvents { id, wait_ms } => {
                self.next_events(id, Duration::from_millis(wait_ms), inbox, cx)
                    .await
            }
            model @ Action::Model { .. } => self.model(model, inbox, cx).await,
            call_action => {
                let call = call_action.as_call().expect("the other actions are calls");
                self.call(call, inbox).await
            }
        }
    }

    /// Parses a line into an action, counted and traced (none: a keepalive); the error says
    /// why the app is refused (a malformed line, too many actions, an id used twice).
    fn admit(&mut self, line: &[u8]) -> std::result::Result<Option<Action>, String> {
        let action = match Action::parse(line)? {
            Action::Keepalive {} => return Ok(None),
            action => action,
        };
        self.actions += 1;
        if self.actions > self.run.limits.max_actions {
            let max = self.run.limits.max_actions;
            return Err(format!("the app sent more than {max} actions in one turn"));
        }
        self.trace.steps.push(ExchangeStep::Action {
            action: serde_json::to_value(&action).unwrap_or(Value::Null),
        });
        if let Some(id) = action.id() {
            if !self.ids.insert(id.to_owned()) {
                return Err(format!("the action id {id:?} was used twice in one turn"));
            }
        }
        Ok(Some(action))
    }

    /// The app asks for what arrived: it waits up to `wait` for it.
    async fn next_events(
        &mut self,
        id: String,
        wait: Duration,
        inbox: &mut dyn Inbox,
        cx: &mut CallContext,
    ) -> Result<Option<TurnOutcome>> {
        match self.exchange.take(inbox, cx, wait).await? {
            Step::Arrived(arrived) if !arrived.iter().any(|b| matches!(b, Block::Stop { .. })) => {
                self.arrived(Some(id), arrived).await?;
                Ok(None)
            }
            Step::Arrived(arrived) | Step::Stopped(arrived) => {
                self.cancelled(arrived).await.map(Some)
            }
            // The app spoke before anything arrived: it gave the wait up (a timeout of its own
            // around the take), so the take ends unanswered — nothing was taken — and what it
            // said is read next. A wait it gave up never holds the turn, and what arrives later
            // waits on the lane for the next take or turn.
            step @ (Step::Line(_) | Step::Closed) => {
                self.pending = Some(step);
                Ok(None)
            }
        }
    }

    /// The app asks the model (`action` is an [`Action::Model`]); the reply goes back to it.
    async fn model(
        &mut self,
        action: Action,
        inbox: &mut dyn Inbox,
        cx: &mut CallContext,
    ) -> Result<Option<TurnOutcome>> {
        let Action::Model {
            id,
            messages: asked,
            tools,
            say,
            temperature,
            max_tokens,
        } = action
        else {
            return Ok(None);
        };
        // As the built-in loop: a model call per round, and a closing one.
        self.model_calls += 1;
        let max = self.run.limits.max_rounds.saturating_add(1);
        if self.model_calls > max {
            return self
                .refuse(format!(
                    "the app asked the model more than {max} times in one turn"
                ))
                .await;
        }
        let mut request = self.run.base.clone();
        match asked {
            Some(asked) => {
                request.messages = asked;
                request.turn_start = 0;
            }
            None => {
                request.messages.truncate(request.turn_start);
                request.messages.extend(messages(self.blocks.iter()));
            }
        }
        if !tools {
            request.tools = Vec::new();
        }
        request.temperature = temperature.or(request.temperature);
        request.max_tokens = match (max_tokens, self.run.max_reply_tokens) {
            (Some(asked), Some(cap)) => Some(asked.min(cap)),
            (asked, cap) => asked.or(cap),
        };
        // The call sees the turn's arrivals on its own receiver: a model that waits for input
        // cannot take a wake meant for the exchange.
        let mut call_cx = if say { cx.fork() } else { cx.quiet() };
        let reply = tokio::select! {
            biased;
            _ = self.exchange.stop_signal(inbox) => {
                return self.cancel(inbox).await.map(Some);
            }
            reply = self.run.model.complete(&request, &mut call_cx) => reply,
        };
        let reply = reply?;
        cx.account(&request, &reply);
        if say {
            self.said.push_str(&reply.text);
        }
        self.send(ToApp::ModelResult {
            id,
            text: reply.text,
            tool_calls: reply.tool_calls,
            usage: reply.usage,
        })
        .await?;
        Ok(None)
    }

    /// One tool call of the app.
    async fn call(
        &mut self,
        call: crate::model::ToolCallRequest,
        inbox: &mut dyn Inbox,
    ) -> Result<Option<TurnOutcome>> {
        self.rounds += 1;
        if self.rounds > self.run.limits.max_rounds {
            let max = self.run.limits.max_rounds;
            let output =
                json!({ "error": format!("not run: this turn may make at most {max} tool calls") });
            self.send(ToApp::ToolResult {
                id: call.id,
                ok: false,
                output,
            })
            .await?;
            return Ok(None);
        }
        if let Some(mut request) = self.run.tools.gate(&call) {
            if let Block::ApprovalRequest { withheld, .. } = &mut request {
                *withheld = std::mem::take(&mut self.said);
            }
            self.blocks.push(Block::ToolCall {
                call_id: call.id.clone(),
                tool: call.name.clone(),
                arguments: call.arguments.clone(),
            });
            self.blocks.push(request);
            self.send_last(ToApp::Parked {
                id: call.id,
                reason: "the call waits for a person's approval".into(),
            })
            .await;
            return Ok(Some(TurnOutcome::Parked));
        }
        self.flush();
        self.blocks.push(Block::ToolCall {
            call_id: call.id.clone(),
            tool: call.name.clone(),
            arguments: call.arguments.clone(),
        });
        let (ok, out) = tokio::select! {
            biased;
            _ = self.exchange.stop_signal(inbox) => {
                self.blocks.push(Block::ToolResult {
                    call_id: call.id.clone(),
                    ok: false,
                    output: json!({ "error": CANCELLED_RESULT }),
                });
                return self.cancel(inbox).await.map(Some);
            }
            result = self.run.tools.run(&call) => result,
        };
        self.blocks.push(Block::ToolResult {
            call_id: call.id.clone(),
            ok,
            output: out.output.clone(),
        });
        let parks = out
            .blocks
            .iter()
            .any(|b| matches!(b, Block::QuestionRequest { .. }));
        self.blocks.extend(out.blocks);
        if parks {
            self.send_last(ToApp::Parked {
                id: call.id,
                reason: "the question waits for the user's answer".into(),
            })
            .await;
            return Ok(Some(TurnOutcome::Parked));
        }
        self.send(ToApp::ToolResult {
            id: call.id,
            ok,
            output: out.output,
        })
        .await?;
        Ok(None)
    }

    /// Events the turn took (committed): added to its blocks and sent to the app, in answer to
    /// its `next_events` with `id`.
    async fn arrived(&mut self, id: Option<String>, arrived: Vec<Block>) -> Result<()> {
        if !arrived.is_empty() {
            self.flush();
        }
        self.blocks.extend(arrived.iter().cloned());
        self.trace.steps.push(ExchangeStep::Arrived {
            blocks: arrived.clone(),
        });
        self.send(ToApp::Events {
            id,
            blocks: arrived,
        })
        .await
    }

    /// Closes the text said so far into a reply block.
    fn flush(&mut self) {
        if !self.said.trim().is_empty() {
            self.blocks.push(Block::AssistantMessage {
                text: std::mem::take(&mut self.said),
            });
        }
        self.said.clear();
    }

    /// A stop was signalled while something ran: its blocks are committed now.
    async fn cancel(&mut self, inbox: &mut dyn Inbox) -> Result<TurnOutcome> {
        let arrived = self.exchange.stop_blocks(inbox).await?;
        self.cancelled(arrived).await
    }

    async fn cancelled(&mut self, arrived: Vec<Block>) -> Result<TurnOutcome> {
        self.flush();
        self.trace.steps.push(ExchangeStep::Stopped {
            blocks: arrived.clone(),
        });
        self.blocks.extend(arrived);
        self.send_last(ToApp::Stop {}).await;
        Ok(TurnOutcome::Cancelled)
    }

    /// Refuses the app's last line: it is told why, and the turn fails with the reason.
    async fn refuse<T>(&mut self, why: String) -> Result<T> {
        self.send_last(ToApp::Refused {
            message: why.clone(),
        })
        .await;
        Err(Error::app(why))
    }

    async fn send(&mut self, message: ToApp) -> Result<()> {
        self.trace.steps.push(ExchangeStep::Sent {
            message: serde_json::to_value(&message).unwrap_or(Value::Null),
        });
        self.exchange.send(&message).await
    }

    /// Sends the exchange's last message: the turn ends whether or not the app hears it.
    async fn send_last(&mut self, message: ToApp) {
        self.trace.steps.push(ExchangeStep::Sent {
            message: serde_json::to_value(&message).unwrap_or(Value::Null),
        });
        if let Err(e) = self.exchange.send_final(&message).await {
            tracing::debug!(error = %e, "the app did not take the exchange's last message");
        }
    }
}
