//! Batch one: a new turn's inputs and `turn_dispatched`, committed before anything runs; and
//! a turn left open by a dead owner, run again under its id as a new attempt.

use tracing::{info, warn, Instrument as _};
use turnpike_artifactory::Head;
use turnpike_router::bus::{now_ms, LaneMessage};
use turnpike_schemas::entry::{TurnAmbiguous, TurnDispatched};
use turnpike_schemas::{AgentId, EntryBody, Event, TurnId};

use crate::error::Result;

use super::batch_two::finish_turn;
use super::TurnEnv;

/// Opens a new turn over `inputs` (batch one), then runs it to completion.
pub async fn run_new_turn(
    env: &TurnEnv,
    head: Head,
    inputs: Vec<LaneMessage>,
    epoch: turnpike_schemas::Epoch,
) -> Result<Head> {
    let turn = TurnId::new(head.state().last_turn + 1).expect("turn numbers start at 1");
    // The agent the conversation was last switched to, else the one it was opened with.
    let agent: AgentId = head.state().active_agent.clone().unwrap_or_else(|| {
        inputs
            .first()
            .map(|m| m.event.address.agent.clone())
            .expect("a turn has at least one input")
    });
    let mut bodies: Vec<EntryBody> = inputs
        .iter()
        .map(|m| EntryBody::input(m.event.clone(), Some(m.seq)))
        .collect();
    if let Some(directive) = inputs.iter().find_map(|m| m.event.directive.clone()) {
        bodies.push(EntryBody::IngressDirective(directive));
    }
    bodies.push(EntryBody::TurnDispatched(TurnDispatched {
        turn,
        worker: env.worker,
        agent: agent.clone(),
        epoch,
        at_ms: now_ms(),
    }));
    // An answer to a parked turn's approval request: how long the people took (from the
    // parked turn's end, the record's last activity, to the answer's acceptance).
    if head.state().waiting {
        for m in &inputs {
            if matches!(
                m.event.body,
                turnpike_schemas::EventBody::ApprovalResponse { .. }
            ) {
                crate::metrics::approval_wait(
                    m.event
                        .accepted_at_ms
                        .saturating_sub(head.state().active_ms),
                );
            }
        }
    }
    // The mark goes first: a record that ends in an open turn always has one for the sweep.
    env.ensure_marked().await?;
    let head = match env.append(&head, &bodies).await {
        Ok(head) => head,
        // Inputs the record refuses can never be taken: set them aside, visibly, once.
        Err(e) if e.kind() == crate::error::ErrorKind::Refused => {
            return crate::parking::park_refused(env, &head, &inputs, &e).await;
        }
        Err(e) => return Err(e),
    };
    info!(conversation = %env.record.prefix().conversation(), %turn, worker = %env.worker, "turn dispatched");
    let place = format!("{} {turn}", env.record.prefix().conversation());
    env.config.failpoints.hit("after-batch-one", &place).await;
    let span = turn_span(env, turn, &agent);
    // The trace the first input was accepted in goes on through this turn.
    turnpike_router::trace::continue_from(
        &span,
        inputs.first().and_then(|m| m.event.traceparent.as_deref()),
    );
    let events = inputs.into_iter().map(|m| m.event).collect();
    let directive = bodies.iter().find_map(|b| match b {
        EntryBody::IngressDirective(d) => Some(d.clone()),
        _ => None,
    });
    finish_turn(env, head, turn, agent, events, directive, new_attempt())
        .instrument(span)
        .await
}

/// The span a turn's work runs in (its model calls, tools and cells are its children).
fn turn_span(env: &TurnEnv, turn: TurnId, agent: &AgentId) -> tracing::Span {
    tracing::info_span!(
        "turnpike.turn",
        otel.name = %format!("turn {turn}"),
        turnpike.conversation = %env.record.prefix().conversation(),
        turnpike.turn = %turn,
        gen_ai.agent.name = %agent,
    )
}

/// A fresh attempt id: unique across workers and restarts (the random part of a ULID), so no
/// two attempts at a turn ever share the keys their side objects are written under.
fn new_attempt() -> u64 {
    ulid::Ulid::new().0 as u64
}

/// Re-runs the open turn under the same turn id (its worker died between the batches), as a
/// new attempt.
pub async fn recover_turn(
    env: &TurnEnv,
    head: Head,
    epoch: turnpike_schemas::Epoch,
) -> Result<Head> {
    let Some((turn, entries)) = env.record.open_turn(&head).await? else {
        return Ok(head);
    };
    let agent = entries
        .iter()
        .find_map(|e| match &e.body {
            EntryBody::TurnDispatched(d) if d.turn == turn => Some(d.agent.clone()),
            _ => None,
        })
        .expect("open_turn returns the dispatch");
    let events: Vec<Event> = entries
        .iter()
        .filter_map(|e| e.body.as_input().map(|i| i.event.clone()))
        .collect();
    let directive = entries.iter().find_map(|e| match &e.body {
        EntryBody::IngressDirective(d) => Some(d.clone()),
        _ => None,
    });
    // A side-effecting call that started and has no committed result: its effect is unknown.
    // Quarantine the turn; never run the call again.
    let unanswered = entries.iter().find_map(|e| match &e.body {
        EntryBody::ToolCall(c)
            if c.side_effects
                && !entries.iter().any(
                    |r| matches!(&r.body, EntryBody::ToolResult(res) if res.call_id == c.call_id),
                ) =>
        {
            Some(c.clone())
        }
        _ => None,
    });
    if let Some(call) = unanswered {
        warn!(conversation = %env.record.prefix().conversation(), %turn, tool = %call.tool,
              "a side-effecting call was interrupted; quarantining the turn");
        // What the interrupted attempt may have left is not part of any committed turn.
        env.turn_logs.discard(env.record.prefix(), turn).await?;
        let body = EntryBody::TurnAmbiguous(TurnAmbiguous {
            turn,
            tool: call.tool.clone(),
            call_id: call.call_id.clone(),
            reason: format!(
                "the worker stopped after {} started and before its result was recorded; it is not run again: decide whether it took effect",
                call.tool
            ),
        });
        return env.append(&head, &[body]).await;
    }
    warn!(conversation = %env.record.prefix().conversation(), %turn, epoch = epoch.0, "recovering a turn left open");
    let span = turn_span(env, turn, &agent);
    finish_turn(env, head, turn, agent, events, directive, new_attempt())
        .instrument(span)
        .await
}
