//! The built-in agent loop: model and tool rounds until the model replies.
//!
//! Contract:
//! - at the start of every round, what arrived on the lane (follow-ups, steers, stops) is
//!   committed and folded into the turn; a stop there ends the turn `cancelled`;
//! - a round is one model call plus the tool calls it asked for; at most `max_rounds` rounds;
//! - a stop while the model streams or a tool runs cancels it (the future is dropped) and the
//!   turn ends `cancelled`, with what it did so far;
//! - when the rounds run out without a reply, one closing call (no tools) asks for a reply that
//!   says what was tried; if that is empty too, the user gets [`FALLBACK_REPLY`];
//! - the history is trimmed, oldest first, to fit the agent's context length minus the reply
//!   reserve (tokens counted by the agent's tokenizer, or estimated; see [`crate::tokens`]).
//!
//! The loop is written against three small traits — [`Inbox`], [`ToolRunner`] and the
//! [`ModelProvider`] — so the same code runs live turns and replays recorded ones.

use async_trait::async_trait;
use serde_json::json;
use turnpike_schemas::entry::TurnOutcome;
use turnpike_schemas::Block;

use crate::error::{Error, Result};
use crate::message::{Message, Role, ToolCallRequest, ToolSpec};
use crate::model::{CallContext, ModelProvider, ModelReply, ModelRequest, ToolChoice};
use crate::timeline::messages;
use crate::tokens::TokenCounter;
use crate::tools::ToolOutput;

/// What the closing call asks for.
pub const CLOSING_PROMPT: &str = "You have used every tool round this turn allows. Do not call \
tools. Reply to the user now: say what you tried, what you found, and what is left to do.";

/// What the user gets when even the closing call says nothing.
pub const FALLBACK_REPLY: &str = "I could not finish this within the steps one turn allows, and \
I have nothing useful to report yet. Please retry, or rephrase the request in smaller steps.";

/// What a result says when a stop cancelled its tool.
pub const CANCELLED_RESULT: &str = "cancelled: the user stopped the turn";

/// The most tool calls one model reply may make. Every call and its result are recorded in
/// the turn's batch two, which holds at most `MAX_BATCH_ENTRIES`; a reply past this fails the
/// turn instead of making a batch that can never commit (and a turn retried forever).
pub const MAX_TOOL_CALLS_PER_REPLY: usize = 64;

/// One agent's settings for one turn.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The provider's kind and the model (metrics labels; the model also goes in requests).
    pub provider: String,
    pub model: String,
    pub system_prompt: String,
    pub max_rounds: u32,
    /// Tokens the history may take (context length minus the reply reserve).
    pub history_budget: u64,
    /// How tokens are counted.
    pub tokens: TokenCounter,
    /// Whether the first round must call a tool (later rounds choose freely).
    pub tool_choice: ToolChoice,
    pub temperature: Option<f32>,
    /// The most tokens one reply may take.
    pub max_tokens: Option<u32>,
}

/// Where a turn's arrivals come from.
#[async_trait]
pub trait Inbox: Send {
    /// The blocks of what arrived since the last call, committed before they are returned.
    async fn arrivals(&mut self) -> Result<Vec<Block>>;
    /// Resolves once a stop is waiting (cancel-safe; may never resolve).
    async fn stop_requested(&mut self);
}

/// Runs tool calls.
#[async_trait]
pub trait ToolRunner: Send + Sync {
    fn specs(&self) -> Vec<ToolSpec>;
    async fn run(&self, call: &ToolCallRequest) -> (bool, ToolOutput);
    /// Brings the files of the project's latest version into the workspace: an approved call
    /// runs in a later turn's fresh workspace, over what its parked turn left.
    async fn restore_workspace(&self) -> std::result::Result<(), String> {
        Ok(())
    }
    /// The approval request that parks the turn at this call, if it is gated.
    fn gate(&self, call: &ToolCallRequest) -> Option<Block> {
        let _ = call;
        None
    }
}

/// Runs the loop over `blocks` (the turn's blocks so far, its inputs first) after `history`
/// (the timeline's messages), appending what the turn does to `blocks`.
pub async fn run(
    settings: &Settings,
    history: &[Message],
    blocks: &mut Vec<Block>,
    model: &dyn ModelProvider,
    tools: &dyn ToolRunner,
    inbox: &mut dyn Inbox,
    cx: &mut CallContext,
) -> Result<TurnOutcome> {
    let history = fit(history, settings.history_budget, &settings.tokens);
    if blocks.iter().any(|b| matches!(b, Block::Stop { .. })) {
        return Ok(TurnOutcome::Cancelled);
    }
    let specs = tools.specs();
    let mut round = 0;
    loop {
        let arrived = inbox.arrivals().await?;
        let stopped = arrived.iter().any(|b| matches!(b, Block::Stop { .. }));
        blocks.extend(arrived);
        if stopped {
            return Ok(TurnOutcome::Cancelled);
        }
        if round >= settings.max_rounds {
            break;
        }
        round += 1;
        let mut request = request(settings, &history, blocks, &specs, false);
        request.tool_choice = match &settings.tool_choice {
            forced if forced.forces() && round > 1 => ToolChoice::Auto,
            choice => choice.clone(),
        };
        let reply = tokio::select! {
            biased;
            _ = inbox.stop_requested() => return cancel(inbox, blocks).await,
            reply = ask(model, &request, cx, settings) => reply?,
        };
        cx.account(&request, &reply);
        let ModelReply {
            text, tool_calls, ..
        } = reply;
        if tool_calls.len() > MAX_TOOL_CALLS_PER_REPLY {
            // Recording them all could not fit one batch; retrying would pay for the same
            // reply again. The turn fails, visibly, once.
            return Err(Error::refused(format!(
                "the model asked for {} tool calls in one reply; at most {MAX_TOOL_CALLS_PER_REPLY} are allowed",
                tool_calls.len()
            )));
        }
        if tool_calls.is_empty() {
            if text.trim().is_empty() {
                break;
            }
            blocks.push(Block::AssistantMessage { text });
            return Ok(TurnOutcome::Replied);
        }
        if let Some(outcome) = run_calls(tools, inbox, blocks, text, &tool_calls).await? {
            return Ok(outcome);
        }
    }
    // The rounds ran out (or the model said nothing): one closing call, without tools.
    close(settings, &history, blocks, model, inbox, cx).await
}

/// The tool calls of one model reply, in order: a gated call parks the turn (the calls before
/// it run, the round's text is withheld in its request, the calls after it are not run); a stop
/// cancels the running call. `Some(outcome)` ends the turn; `None` goes on to the next round.
async fn run_calls(
    tools: &dyn ToolRunner,
    inbox: &mut dyn Inbox,
    blocks: &mut Vec<Block>,
    text: String,
    tool_calls: &[ToolCallRequest],
) -> Result<Option<TurnOutcome>> {
    // A gated call parks the turn: the calls before it run, the round's text is withheld.
    let gated = tool_calls
        .iter()
        .enumerate()
        .find_map(|(i, c)| tools.gate(c).map(|request| (i, request)));
    if !text.trim().is_empty() && gated.is_none() {
        blocks.push(Block::AssistantMessage { text: text.clone() });
    }
    for call in tool_calls {
        blocks.push(Block::ToolCall {
            call_id: call.id.clone(),
            tool: call.name.clone(),
            arguments: call.arguments.clone(),
        });
    }
    for (i, call) in tool_calls.iter().enumerate() {
        if let Some((at, request)) = &gated {
            if i == *at {
                let mut request = request.clone();
                if let Block::ApprovalRequest { withheld, .. } = &mut request {
                    if !text.trim().is_empty() {
                        *withheld = text.clone();
                    }
                }
                blocks.push(request);
                continue;
            }
            if i > *at {
                blocks.push(Block::ToolResult {
                    call_id: call.id.clone(),
                    ok: false,
                    output: json!({ "error": "not run: the turn is waiting for an approval" }),
                });
                continue;
            }
        }
        let (ok, out) = tokio::select! {
            biased;
            _ = inbox.stop_requested() => {
                blocks.push(Block::ToolResult {
                    call_id: call.id.clone(),
                    ok: false,
                    output: json!({ "error": CANCELLED_RESULT }),
                });
                return cancel(inbox, blocks).await.map(Some);
            }
            result = tools.run(call) => result,
        };
        blocks.push(Block::ToolResult {
            call_id: call.id.clone(),
            ok,
            output: out.output,
        });
        let parks = out
            .blocks
            .iter()
            .any(|b| matches!(b, Block::QuestionRequest { .. }));
        blocks.extend(out.blocks);
        if parks {
            return Ok(Some(TurnOutcome::Parked));
        }
    }
    if gated.is_some() {
        return Ok(Some(TurnOutcome::Parked));
    }
    Ok(None)
}

/// The closing call, when the rounds ran out (or the model said nothing): no tools, a prompt
/// that asks for what was tried; an empty answer is [`FALLBACK_REPLY`].
async fn close(
    settings: &Settings,
    history: &[Message],
    blocks: &mut Vec<Block>,
    model: &dyn ModelProvider,
    inbox: &mut dyn Inbox,
    cx: &mut CallContext,
) -> Result<TurnOutcome> {
    let mut request = request(settings, history, blocks, &[], true);
    request
        .messages
        .push(Message::new(Role::System, CLOSING_PROMPT));
    let reply = tokio::select! {
        biased;
        _ = inbox.stop_requested() => return cancel(inbox, blocks).await,
        reply = ask(model, &request, cx, settings) => reply?,
    };
    cx.account(&request, &reply);
    let text = if reply.text.trim().is_empty() {
        FALLBACK_REPLY.to_owned()
    } else {
        reply.text
    };
    blocks.push(Block::AssistantMessage { text });
    Ok(TurnOutcome::Replied)
}

async fn cancel(inbox: &mut dyn Inbox, blocks: &mut Vec<Block>) -> Result<TurnOutcome> {
    blocks.extend(inbox.arrivals().await?);
    Ok(TurnOutcome::Cancelled)
}

/// The model request of a round: the system prompt, the history, the turn's blocks.
pub(crate) fn request(
    settings: &Settings,
    history: &[Message],
    blocks: &[Block],
    specs: &[ToolSpec],
    closing: bool,
) -> ModelRequest {
    let mut all = Vec::with_capacity(history.len() + blocks.len() + 1);
    if !settings.system_prompt.is_empty() {
        all.push(Message::new(Role::System, settings.system_prompt.clone()));
    }
    all.extend_from_slice(history);
    let turn_start = all.len();
    all.extend(messages(blocks.iter()));
    ModelRequest {
        model: settings.model.clone(),
        messages: all,
        tools: specs.to_vec(),
        turn_start,
        closing,
        compaction: false,
        max_tokens: settings.max_tokens,
        tool_choice: ToolChoice::Auto,
        temperature: settings.temperature,
    }
}

/// Keeps the newest messages that fit `budget` estimated tokens, never starting on a tool
/// result (whose call would be cut off).
/// The one copy of the history a turn makes: the timeline's messages are shared.
pub(crate) fn fit(history: &[Message], budget: u64, tokens: &TokenCounter) -> Vec<Message> {
    let mut total = 0;
    let mut start = history.len();
    for (i, m) in history.iter().enumerate().rev() {
        total += tokens.count(m);
        if total > budget {
            break;
        }
        start = i;
    }
    while start < history.len() && history[start].role == Role::Tool {
        start += 1;
    }
    history[start..].to_vec()
}

/// Asks the model once, counting and timing the request.
async fn ask(
    model: &dyn ModelProvider,
    request: &ModelRequest,
    cx: &mut CallContext,
    settings: &Settings,
) -> std::result::Result<ModelReply, crate::model::ModelError> {
    let started = std::time::Instant::now();
    // A model span after OpenTelemetry's GenAI conventions.
    let span = tracing::info_span!(
        "gen_ai.chat",
        otel.name = %format!("chat {}", settings.model),
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = %settings.provider,
        gen_ai.request.model = %settings.model,
        gen_ai.response.model = tracing::field::Empty,
        gen_ai.response.finish_reasons = tracing::field::Empty,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    cx.start_call();
    let reply = {
        use tracing::Instrument as _;
        model.complete(request, cx).instrument(span.clone()).await
    };
    if let (Ok(_), Some(first)) = (&reply, cx.first_delta_at()) {
        crate::metrics::time_to_first_token(
            &settings.provider,
            &settings.model,
            first.saturating_duration_since(started),
        );
    }
    match &reply {
        Ok(r) => {
            span.record(
                "gen_ai.response.model",
                r.model.as_deref().unwrap_or(&settings.model),
            );
            if let Some(reason) = &r.finish_reason {
                span.record("gen_ai.response.finish_reasons", reason.as_str());
            }
            if let Some(u) = r.usage {
                span.record("gen_ai.usage.input_tokens", u.prompt_tokens);
                span.record("gen_ai.usage.output_tokens", u.completion_tokens);
            }
        }
        Err(e) => {
            span.record("error.type", format!("{:?}", e.kind).as_str());
        }
    }
    let usage = reply
        .as_ref()
        .ok()
        .and_then(|r| r.usage)
        .map(|u| (u.prompt_tokens, u.completion_tokens));
    crate::metrics::model_request(
        &settings.provider,
        &settings.model,
        started.elapsed(),
        usage,
        reply.is_ok(),
    );
    reply
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A model that calls `read_file` while it may and says "done" once it was free to choose,
    /// recording the tool choice of every call.
    struct Choosy(Mutex<Vec<ToolChoice>>);

    #[async_trait]
    impl ModelProvider for Choosy {
        async fn complete(
            &self,
            request: &ModelRequest,
            _cx: &mut CallContext,
        ) -> std::result::Result<ModelReply, crate::model::ModelError> {
            self.0.lock().unwrap().push(request.tool_choice.clone());
            let n = self.0.lock().unwrap().len();
            Ok(if request.tool_choice.forces() {
                ModelReply {
                    tool_calls: vec![ToolCallRequest {
                        id: format!("c{n}"),
                        name: "read_file".into(),
                        arguments: json!({"path": "a"}),
                    }],
                    usage: Some(crate::model::Usage {
                        prompt_tokens: 10,
                        completion_tokens: 2,
                        ..Default::default()
                    }),
                    ..Default::default()
                }
            } else {
                ModelReply {
                    text: "done".into(),
                    usage: Some(crate::model::Usage {
                        prompt_tokens: 20,
                        completion_tokens: 1,
                        ..Default::default()
                    }),
                    ..Default::default()
                }
            })
        }
    }

    struct NoTools;

    #[async_trait]
    impl ToolRunner for NoTools {
        fn specs(&self) -> Vec<ToolSpec> {
            vec![ToolSpec {
                name: "read_file".into(),
                description: String::new(),
                parameters: json!({}),
            }]
        }
        async fn run(&self, _call: &ToolCallRequest) -> (bool, crate::tools::ToolOutput) {
            (true, json!("text").into())
        }
    }

    struct Quiet;

    #[async_trait]
    impl Inbox for Quiet {
        async fn arrivals(&mut self) -> Result<Vec<Block>> {
            Ok(Vec::new())
        }
        async fn stop_requested(&mut self) {
            std::future::pending::<()>().await
        }
    }

    #[tokio::test]
    async fn a_forced_tool_choice_holds_for_the_first_round_only_and_usage_adds_up() {
        for forced in [ToolChoice::Required, ToolChoice::Tool("read_file".into())] {
            let settings = Settings {
                provider: "test".into(),
                model: "m".into(),
                system_prompt: String::new(),
                max_rounds: 4,
                history_budget: 1_000,
                tokens: TokenCounter::Estimate,
                tool_choice: forced.clone(),
                temperature: None,
                max_tokens: None,
            };
            let model = Choosy(Mutex::new(Vec::new()));
            let mut blocks = vec![Block::UserMessage { text: "hi".into() }];
            let mut cx = CallContext::detached();
            let outcome = run(
                &settings,
                &[],
                &mut blocks,
                &model,
                &NoTools,
                &mut Quiet,
                &mut cx,
            )
            .await
            .unwrap();
            assert_eq!(outcome, TurnOutcome::Replied);
            assert_eq!(*model.0.lock().unwrap(), [forced, ToolChoice::Auto]);
            assert!(
                matches!(blocks.last(), Some(Block::AssistantMessage { text }) if text == "done")
            );
            let usage = cx.usage().unwrap();
            assert_eq!((usage.prompt_tokens, usage.completion_tokens), (30, 3));
        }
    }

    #[test]
    fn history_is_trimmed_oldest_first_by_the_agents_token_count() {
        let words = TokenCounter::from_json(
            r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
                "normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,
                "decoder":null,"model":{"type":"WordLevel","vocab":{"[UNK]":0},"unk_token":"[UNK]"}}"#,
        )
        .unwrap();
        let history: Vec<Message> = (0..10)
            .map(|i| Message::new(Role::User, format!("m{i} b c d")))
            .collect();
        // Four words + four of framing = 8 tokens each.
        let kept = fit(&history, 20, &words);
        assert_eq!(kept.len(), 2);
        assert_eq!(kept[1].content, "m9 b c d");
        // The estimate: 8 bytes → 2 tokens + 4 = 6 each.
        assert_eq!(fit(&history, 20, &TokenCounter::Estimate).len(), 3);
        // A window never starts on a tool result whose call was cut off.
        let mut with_tool = history;
        let mut result = Message::new(Role::Tool, "x");
        result.tool_call_id = Some("c".into());
        with_tool.insert(8, result);
        let kept = fit(&with_tool, 8 + 5, &words);
        assert!(kept.iter().all(|m| m.role != Role::Tool), "{kept:?}");
    }
}
