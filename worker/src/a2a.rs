//! Calls of an agent's remote agents (`[[agents.X.a2a]]`, see `turnpike_agent::a2a`): host-side,
//! after the call's intent is committed, to addresses the outbound rules allow.

use serde_json::{json, Value};
use turnpike_agent::a2a::RemoteAgent;
use turnpike_agent::outbound::Outbound;
use turnpike_agent::tools::ToolOutput;

use crate::tools::ToolContext;

/// Runs a call of `name` if it names one of `agents` (`None`: it is another kind of tool).
/// The message id is the call's idempotency key, the bearer token is read from the agent's
/// `token_env` at each call, and the address is checked at each call.
pub async fn call(
    cx: &ToolContext<'_>,
    agents: &[RemoteAgent],
    outbound: &Outbound,
    name: &str,
    arguments: &Value,
) -> Option<(bool, ToolOutput)> {
    let agent = agents.iter().find(|a| a.name == name)?;
    let refused = |why: String| Some((false, ToolOutput::from(json!({ "error": why }))));
    let pinned = match outbound.resolve(&agent.url).await {
        Ok(pinned) => pinned,
        Err(why) => return refused(format!("not called: {why}")),
    };
    let bearer = match &agent.token_env {
        Some(var) => match std::env::var(var) {
            Ok(token) => Some(token),
            Err(_) => {
                return refused(format!(
                    "not called: the variable {var} that holds the agent's token is not set on this worker"
                ))
            }
        },
        None => None,
    };
    let started = std::time::Instant::now();
    let result = agent
        .call(arguments, &cx.idempotency_key(), bearer.as_deref(), &pinned)
        .await;
    tracing::debug!(agent = %agent.name, elapsed_ms = started.elapsed().as_millis() as u64, ok = result.is_ok(), "a2a call");
    Some(match result {
        Ok(result) => (true, crate::tools::bound(cx, cx.call_id, result.into()).await),
        // No answer: the message may have been taken; the model is told so.
        Err(why) => (
            false,
            json!({ "error": format!("agent {:?}: {why}", agent.name),
                    "outcome": "unknown: the agent may have taken the message; check before sending it again" })
            .into(),
        ),
    })
}
