//! Remote apps: an agent whose callbacks are a service in any language, reached over HTTP. The
//! worker stays the one writer of the record: the app asks (say, call a tool, ask the model,
//! ask the user, publish), the worker does it — through the same approval gate, cell, resolver
//! and limits as the built-in loop — commits it, and tells the app the result.
//!
//! ```toml
//! [agents.support]
//! provider = "script"            # the model the app's `model` actions ask
//! script = "support.script.toml"
//! tools = ["write_file", "publish", "ask_user"]
//!
//! [agents.support.remote]
//! url = "http://127.0.0.1:9000"  # the app's base URL
//! secret_env = "SUPPORT_SECRET"  # optional: sent as a bearer token
//! connect_timeout_ms = 5000
//! read_timeout_ms = 30000        # the longest the app may be silent (the SDK sends keepalives)
//! deadline_secs = 600            # the longest one turn's exchange may take
//! max_actions = 1000             # actions per turn
//! max_bytes = 4194304            # bytes of the app's stream per turn
//! max_line_bytes = 1048576       # bytes of one action
//! ```
//!
//! # Layout
//! - [`protocol`]: the actions an app sends and the messages it is sent
//! - [`driver`]: one turn, against an [`driver::Exchange`]
//! - [`http`]: the live exchange
//! - [`recorded`]: replaying a turn from its exchange log
//! - [`spec`]: the manifest's `remote` table, checked
//!
//! The protocol for app authors: `docs/remote-apps.md`; its schema:
//! `docs/remote-apps.schema.json`; a Python SDK: `sdk/python/`.

pub mod driver;
pub mod http;
pub mod protocol;
pub mod recorded;
pub mod spec;

pub use spec::{RawRemote, RemoteSpec};

use serde_json::{json, Value};
use turnpike_schemas::entry::TurnOutcome;
use turnpike_schemas::turnlog::Exchange;
use turnpike_schemas::{Block, TurnLog};

use crate::agent_loop::{Inbox, Settings, ToolRunner};
use crate::error::Result;
use crate::model::{CallContext, Message, ModelRequest, ToolChoice};
use crate::turn::Turn;
use driver::{drive, Run, Trace};
use protocol::{Limits, PROTOCOL_VERSION};

/// The idempotency key of a turn: the same for every attempt at it.
pub fn idempotency_key(turn: &dyn Turn) -> String {
    format!("{}/{}/{}", turn.tenant(), turn.conversation(), turn.turn())
}

/// Runs a live turn of a remote app (after the turn's prelude: approvals applied, a summary,
/// what was recalled are in `blocks`).
#[allow(clippy::too_many_arguments)]
pub async fn run_live(
    turn: &dyn Turn,
    remote: &RemoteSpec,
    settings: &Settings,
    history: &[Message],
    blocks: &mut Vec<Block>,
    spec: &crate::spec::AgentSpec,
    tools: &dyn ToolRunner,
    inbox: &mut dyn Inbox,
    cx: &mut CallContext,
) -> Result<TurnOutcome> {
    let key = idempotency_key(turn);
    let id = format!(
        "{}.{}.{:016x}",
        turn.conversation(),
        turn.turn(),
        turn.attempt()
    );
    let limits = Limits {
        max_rounds: settings.max_rounds,
        max_actions: remote.max_actions,
        max_bytes: remote.max_bytes,
        max_line_bytes: remote.max_line_bytes,
        read_timeout_ms: remote.read_timeout.as_millis() as u64,
        deadline_ms: remote.deadline.as_millis() as u64,
    };
    let history = crate::agent_loop::fit(history, settings.history_budget, &settings.tokens);
    let specs = tools.specs();
    let base = crate::agent_loop::request(settings, &history, &[], &specs, false);
    let context = json!({
        "protocol": PROTOCOL_VERSION,
        "exchange": id,
        "idempotency_key": key,
        "attempt": format!("{:016x}", turn.attempt()),
        "tenant": turn.tenant(),
        "conversation": turn.conversation(),
        "turn": turn.turn(),
        "app": turn.app(),
        "agent": turn.agent_id(),
        "identity": turn.identity(),
        "system_prompt": settings.system_prompt,
        "history": history,
        "tools": specs,
        "limits": limits,
    });
    let Value::Object(context) = context else {
        unreachable!("a JSON object literal")
    };
    let mut trace = Trace {
        lead: blocks.len(),
        ..Default::default()
    };
    let result = match http::HttpExchange::new(remote, id, key.clone(), limits) {
        Ok(mut exchange) => {
            let run = Run {
                context,
                base,
                limits,
                max_reply_tokens: Some(spec.max_tokens.unwrap_or(spec.reply_reserve)),
                model: spec.provider.as_ref(),
                tools,
            };
            drive(run, &mut exchange, blocks, inbox, cx, &mut trace).await
        }
        Err(e) => Err(e),
    };
    turn.set_exchange(Exchange {
        key,
        lead: trace.lead,
        limits: serde_json::to_value(limits).unwrap_or_default(),
        steps: trace.steps,
    });
    result
}

/// Replays a remote app's turn from its log (`tools` answer with the recorded results, a
/// what-if's change applied); the app is not called. Returns the outcome and the blocks.
pub async fn replay_turn(
    log: &TurnLog,
    exchange: &Exchange,
    tools: &dyn ToolRunner,
) -> (std::result::Result<TurnOutcome, String>, Vec<Block>) {
    let lead = exchange.lead.min(log.blocks.len());
    let mut blocks = log.blocks[..lead].to_vec();
    let model = recorded::RecordedModel::from_steps(&exchange.steps);
    let mut recorded = recorded::RecordedExchange::new(exchange.steps.clone());
    let run = Run {
        context: Default::default(),
        base: ModelRequest {
            model: "replay".into(),
            messages: Vec::new(),
            tools: Vec::new(),
            turn_start: 0,
            closing: false,
            compaction: false,
            max_tokens: None,
            tool_choice: ToolChoice::Auto,
            temperature: None,
        },
        // The live turn's limits (a call past its rounds was answered, not run).
        limits: serde_json::from_value(exchange.limits.clone()).unwrap_or(Limits {
            max_rounds: u32::MAX,
            max_actions: u32::MAX,
            max_bytes: u64::MAX,
            max_line_bytes: u64::MAX,
            read_timeout_ms: u64::MAX,
            deadline_ms: u64::MAX,
        }),
        max_reply_tokens: None,
        model: &model,
        tools,
    };
    let mut cx = CallContext::detached();
    let mut trace = Trace::default();
    let outcome = drive(
        run,
        &mut recorded,
        &mut blocks,
        &mut recorded::EmptyInbox,
        &mut cx,
        &mut trace,
    )
    .await
    .map_err(|e| e.to_string());
    (outcome, blocks)
}
