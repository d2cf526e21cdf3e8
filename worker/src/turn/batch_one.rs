//! Batch one: a new turn's inputs and `turn_dispatched`, committed before anything runs; and
//! a turn left open by a dead owner, run again under its id as a new attempt.

use tracing::{info, warn, Instrument as _};
use turnpike_artifactory::Head;
use turnpike_router::bus::LaneMessage;
use turnpike_schemas::entry::TurnAmbiguous;
use turnpike_schemas::{AgentId, EntryBody, Event, TurnId};

use crate::error::Result;

use super::batch_two::finish_turn;
use super::opening::{NoUpcoming, Opening, Upcoming};
use super::TurnEnv;

/// Opens a new turn over `inputs` (batch one), then runs it to completion. Returns the head,
/// and the next turn when its batch one was committed with this one's batch two (see
/// [`Upcoming`]): [`run_opened`] runs it.
pub async fn run_new_turn(
    env: &TurnEnv,
    head: Head,
    inputs: Vec<LaneMessage>,
    epoch: turnpike_schemas::Epoch,
    upcoming: &mut dyn Upcoming,
) -> Result<(Head, Option<Opening>)> {
    let opening = Opening::new(env, head.state(), inputs, epoch);
    // The mark goes first: a record that ends in an open turn always has one for the sweep.
    env.ensure_marked().await?;
    let head = match env.append(&head, &opening.bodies).await {
        Ok(head) => head,
        // Inputs the record refuses can never be taken: set them aside, visibly, once.
        Err(e) if e.kind() == crate::error::ErrorKind::Refused => {
            let head = crate::parking::park_refused(env, &head, &opening.inputs, &e).await?;
            return Ok((head, None));
        }
        Err(e) => return Err(e),
    };
    run_opened(env, head, opening, upcoming).await
}

/// Runs a turn whose batch one `head` holds to completion (see [`run_new_turn`]).
pub async fn run_opened(
    env: &TurnEnv,
    head: Head,
    opening: Opening,
    upcoming: &mut dyn Upcoming,
) -> Result<(Head, Option<Opening>)> {
    let Opening {
        turn,
        agent,
        inputs,
        bodies,
        waiting_since,
        ..
    } = opening;
    // An answer to a parked turn's approval request: how long the people took (from the
    // parked turn's end, the record's last activity, to the answer's acceptance).
    if let Some(since) = waiting_since {
        for m in &inputs {
            if matches!(
                m.event.body,
                turnpike_schemas::EventBody::ApprovalResponse { .. }
            ) {
                crate::metrics::approval_wait(m.event.accepted_at_ms.saturating_sub(since));
            }
        }
    }
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
    let directive = bodies.into_iter().find_map(|b| match b {
        EntryBody::IngressDirective(d) => Some(d),
        _ => None,
    });
    finish_turn(
        env,
        head,
        turn,
        agent,
        events,
        directive,
        new_attempt(),
        upcoming,
    )
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
            if c.turn == turn
                && c.side_effects
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
    let (head, _) = finish_turn(
        env,
        head,
        turn,
        agent,
        events,
        directive,
        new_attempt(),
        &mut NoUpcoming,
    )
    .instrument(span)
    .await?;
    Ok(head)
}
