//! A live turn of an agent with a manifest: the timeline, answers to what the turn was asked
//! (approvals, questions), compaction and recall, then the built-in loop (or the agent's remote
//! app) over the turn's lane and tools — each reached through the [`Turn`].

use async_trait::async_trait;
use serde_json::json;
use turnpike_schemas::entry::TurnOutcome;
use turnpike_schemas::{Block, RequestId};

use crate::agent_loop::{run, Inbox, Settings, ToolRunner};
use crate::approvals::{canonical, pending};
use crate::error::{Error, Result};
use crate::message::{Message, Role, ToolCallRequest, ToolSpec};
use crate::model::{CallContext, ToolChoice};
use crate::recall::RecallRequest;
use crate::spec::AgentSpec;
use crate::timeline::{is_input, messages};
use crate::tools::{ToolOutput, Toolset};
use crate::turn::Turn;

/// The live inbox: the conversation's lane, through the turn.
struct LaneInbox<'t> {
    turn: &'t dyn Turn,
}

#[async_trait]
impl Inbox for LaneInbox<'_> {
    async fn arrivals(&mut self) -> Result<Vec<Block>> {
        let events = self.turn.commit_arrivals().await?;
        Ok(events
            .iter()
            .filter_map(|e| Block::from_event(&e.body))
            .collect())
    }

    async fn stop_requested(&mut self) {
        self.turn.stop_requested().await
    }
}

/// The live tools: the turn's toolset, over the turn's workspace and bound identity.
struct LiveTools<'t> {
    turn: &'t dyn Turn,
    spec: &'t AgentSpec,
    tools: Toolset,
}

impl LiveTools<'_> {
    /// Whether `call` needs an approval nobody is there to give, and the agent says to deny
    /// it then: a session's turn (its first input came from a schedule or a hook, not a
    /// person) of an agent whose `headless` is `deny`.
    fn denied_headless(&self, call: &ToolCallRequest) -> bool {
        self.spec.headless == crate::spec::Headless::Deny
            && self
                .turn
                .inputs()
                .first()
                .is_some_and(|e| e.origin.is_some())
            && self.spec.policy.gated(&call.name, &call.arguments)
    }
}

#[async_trait]
impl ToolRunner for LiveTools<'_> {
    fn specs(&self) -> Vec<ToolSpec> {
        self.tools.specs()
    }

    async fn run(&self, call: &ToolCallRequest) -> (bool, ToolOutput) {
        if self.denied_headless(call) {
            crate::metrics::tool_call("headless", "denied");
            return (
                false,
                json!({ "error": crate::spec::HEADLESS_DENIED }).into(),
            );
        }
        // A name the model made up is not a label: labels stay as few as the agent's tools.
        // An MCP server's tools are labelled by their server: a server chooses its own names.
        let mcp_server = self
            .spec
            .mcp
            .iter()
            .find(|s| s.own_name(&call.name).is_some());
        let tool = match (self.tools.get(&call.name), mcp_server) {
            (Some(_), Some(server)) => format!("mcp:{}", server.name),
            (Some(_), None) => call.name.clone(),
            (None, _) => "unknown".to_owned(),
        };
        let tool = tool.as_str();
        let span = tracing::info_span!(
            "gen_ai.execute_tool",
            otel.name = %format!("execute_tool {tool}"),
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = tool,
            gen_ai.tool.call.id = %call.id,
        );
        let executed = {
            use tracing::Instrument as _;
            self.turn.run_tool(&self.tools, call).instrument(span).await
        };
        match executed {
            Ok(result) => {
                crate::metrics::tool_call(tool, if result.0 { "ok" } else { "error" });
                result
            }
            // The intent could not be committed (fenced, store down): the call does not run.
            Err(e) => {
                crate::metrics::tool_call(tool, "not_run");
                (false, json!({ "error": format!("not run: {e}") }).into())
            }
        }
    }

    async fn restore_workspace(&self) -> std::result::Result<(), String> {
        self.turn.restore_workspace().await
    }

    fn gate(&self, call: &ToolCallRequest) -> Option<Block> {
        if self.denied_headless(call) {
            // Not parked: `run` answers it with the reason, and the turn goes on.
            return None;
        }
        if !self.spec.policy.gated(&call.name, &call.arguments) {
            // A server the sender has not connected: the call waits for them to (a gated
            // call is approved first; run without a connection, it says what is missing).
            let server = self.tools.needs_connection(&call.name)?;
            return Some(Block::ApprovalRequest {
                request_id: RequestId::new(),
                call_id: call.id.clone(),
                tool: call.name.clone(),
                arguments: canonical(&call.arguments),
                approvers: vec![self.turn.identity().clone()],
                withheld: String::new(),
                connection: Some(server.to_owned()),
            });
        }
        // A call on a server that takes each user's own connection runs with the credential of
        // whoever's turn it runs in — the answerer's, once answered. So unless a directive names
        // the approver, only its sender may approve it: nobody else's credential serves a call
        // they did not ask for (empty approvers would let the owner answer a grantee's call).
        let personal = self
            .spec
            .mcp
            .iter()
            .any(|s| s.connection && s.own_name(&call.name).is_some());
        let approvers = match self
            .turn
            .directive()
            .and_then(|d| d.required_approver.clone())
        {
            Some(required) => vec![required],
            None if personal => vec![self.turn.identity().clone()],
            None => Vec::new(),
        };
        Some(Block::ApprovalRequest {
            request_id: RequestId::new(),
            call_id: call.id.clone(),
            tool: call.name.clone(),
            arguments: canonical(&call.arguments),
            approvers,
            withheld: String::new(),
            connection: None,
        })
    }
}

/// Runs a live turn of the turn's agent (see [`crate::AgentLoopApp`]).
pub async fn run_live(turn: &dyn Turn) -> Result<TurnOutcome> {
    let Some(spec) = turn.agent().cloned() else {
        return Err(Error::route(format!(
            "agent {} of app {} has no manifest: the agent loop needs one",
            turn.agent_id(),
            turn.app()
        )));
    };
    let timeline = turn.timeline().await?;
    let history_blocks = timeline.blocks();
    let asks = crate::approvals::asks(turn.inputs());
    let tools = LiveTools {
        turn,
        spec: &spec,
        tools: turn.toolset().await?,
    };
    let mut blocks = turn.blocks();
    let applied =
        crate::approvals::prelude(turn, &tools, &history_blocks, &mut blocks, &asks).await;
    let applied = match applied {
        Ok(a) => a,
        Err(e) => {
            turn.set_blocks(blocks);
            return Err(e);
        }
    };
    let mut cx = CallContext::new(Some(turn.deltas()), turn.arrivals())
        .metered(&spec.provider_kind, spec.tokens.clone());
    let history = compact_if_due(turn, &spec, &timeline, asks.compact, &mut blocks, &mut cx).await;
    // Recall, after the turn's inputs: what the history leaves of the budget, at most.
    if asks.work {
        recall_into(turn, &spec, &timeline, &history, &mut blocks).await;
    }
    let (still_pending, _) = pending(history_blocks.iter().chain(blocks.iter()));
    if !asks.work && !applied {
        turn.set_blocks(blocks);
        turn.set_usage(&cx);
        // Nothing for the model: a refused answer leaves the turn parked; a switch or a
        // compaction alone is done.
        return Ok(if still_pending.is_empty() {
            TurnOutcome::Replied
        } else {
            TurnOutcome::Parked
        });
    }
    let settings = settings(turn, &spec, asks.work).await;
    let mut inbox = LaneInbox { turn };
    let result = match &spec.remote {
        Some(remote) => {
            crate::remote::run_live(
                turn,
                remote,
                &settings,
                &history,
                &mut blocks,
                &spec,
                &tools,
                &mut inbox,
                &mut cx,
            )
            .await
        }
        None => {
            run(
                &settings,
                &history,
                &mut blocks,
                spec.provider.as_ref(),
                &tools,
                &mut inbox,
                &mut cx,
            )
            .await
        }
    };
    turn.set_blocks(blocks);
    turn.set_usage(&cx);
    result
}

/// The tokens the history may take: the agent's context length less its reply reserve.
fn budget(spec: &AgentSpec) -> u64 {
    u64::from(spec.context_length - spec.reply_reserve)
}

/// Compacts the history at the threshold (or when the turn asks for it): the summary becomes
/// the turn's first block and the history the model sees is empty. Returns that history; a
/// compaction that fails leaves it whole (trimmed later, oldest first).
async fn compact_if_due(
    turn: &dyn Turn,
    spec: &AgentSpec,
    timeline: &crate::timeline::Timeline,
    asked: bool,
    blocks: &mut Vec<Block>,
    cx: &mut CallContext,
) -> std::sync::Arc<Vec<Message>> {
    let history = timeline.messages();
    let history_blocks = timeline.blocks();
    let used: u64 = history.iter().map(|m| spec.tokens.count(m)).sum();
    let threshold = budget(spec) * COMPACT_AT_PERCENT / 100;
    if !(asked || used >= threshold) || history_blocks.is_empty() {
        return history;
    }
    match crate::compaction::compact(turn, spec, &history_blocks, &history, cx).await {
        Ok((summary, marker)) => {
            // From here on the context is the summary (this turn's first row) and this turn.
            blocks.insert(0, summary);
            turn.set_compaction(marker);
            Default::default()
        }
        Err(e) => {
            tracing::warn!(error = %e, "compaction failed; the context is trimmed instead");
            history
        }
    }
}

/// Places what recall finds after the turn's inputs, within what the history, the system
/// prompt and the input leave of the budget (an agent without `recall` recalls nothing).
async fn recall_into(
    turn: &dyn Turn,
    spec: &AgentSpec,
    timeline: &crate::timeline::Timeline,
    history: &[Message],
    blocks: &mut Vec<Block>,
) {
    let Some(recall) = &spec.recall else {
        return;
    };
    // What the request holds besides recall: the history, the system prompt, the turn's own
    // input.
    let used: u64 = history
        .iter()
        .chain(&messages(blocks.iter()))
        .chain(&[Message::new(Role::System, spec.system_prompt.clone())])
        .map(|m| spec.tokens.count(m))
        .sum();
    let in_timeline = timeline
        .rows
        .iter()
        .map(|r| r.reference.to_string())
        .collect();
    let found = turn
        .recall(RecallRequest {
            spec: recall,
            blocks,
            in_timeline: &in_timeline,
            available_tokens: budget(spec).saturating_sub(used),
            tokens: &spec.tokens,
        })
        .await;
    if let Some(block) = found {
        let at = blocks.iter().take_while(|b| is_input(b)).count();
        blocks.insert(at, block);
    }
}

/// The loop's settings for this turn of the agent: the conversation's instructions after the
/// agent's prompt (the owner's turns only), the turn's round limit, and a forced tool only for a
/// turn with new input (one that only applies an answer lets the model choose).
async fn settings(turn: &dyn Turn, spec: &AgentSpec, work: bool) -> Settings {
    Settings {
        provider: spec.provider_kind.clone(),
        model: spec.model.clone(),
        system_prompt: match turn.instructions().await {
            Some(extra) if spec.system_prompt.is_empty() => extra,
            Some(extra) => format!("{}\n\n{extra}", spec.system_prompt),
            None => spec.system_prompt.clone(),
        },
        max_rounds: turn.max_rounds(),
        history_budget: budget(spec),
        tokens: spec.tokens.clone(),
        tool_choice: if work {
            spec.tool_choice.clone()
        } else {
            ToolChoice::Auto
        },
        temperature: spec.temperature,
        max_tokens: spec.max_tokens,
    }
}

/// Compaction starts when the history reaches this share of the budget.
pub const COMPACT_AT_PERCENT: u64 = 90;
