//! The record's state machine: what a sequence of entries adds up to, and which entries may
//! follow. A pure function of the entries, so `verify` can recompute it and `append` can refuse
//! an entry that would break an invariant before anything is written.
//!
//! Rules:
//! - inputs from a lane, and lane messages parked as dead letters, carry strictly increasing
//!   lane sequences (none applied twice, in order);
//! - `turn_dispatched` opens a turn numbered above every earlier one (workers use
//!   `last_turn + 1`; a repaired record may have gaps), and only when no turn is open;
//! - `turn_complete` and `turn_ambiguous` close the open turn, with its id (exactly once);
//! - entries of a turn (`assistant_message`, `tool_call`, …) name the open turn;
//! - `idle_closed` closes a conversation with no open turn, once; until a `reopened` entry
//!   follows it, no input is taken and no turn is dispatched;
//! - `imported` (no turn open) starts the lane anew: the lane sequences before it were the
//!   exporting deployment's;
//! - `active_ms` follows the opening, every dispatch and completion, and every reopening (never
//!   backwards: workers' clocks differ a little).

use turnpike_schemas::entry::RecordState;
use turnpike_schemas::EntryBody;

/// Applies one entry, or says why it may not follow.
pub fn apply(state: &mut RecordState, body: &EntryBody) -> Result<(), String> {
    if state.idle_closed
        && (body.as_input().is_some() || matches!(body, EntryBody::TurnDispatched(_)))
    {
        return Err(format!(
            "the conversation is closed as idle: a {} entry needs a reopened entry first",
            body.kind()
        ));
    }
    if let Some(input) = body.as_input() {
        return apply_input(state, input);
    }
    match body {
        EntryBody::LaneParked(p) => {
            if p.lane_seq <= state.lane_through {
                return Err(format!(
                    "parked lane sequence {} is not after {}",
                    p.lane_seq, state.lane_through
                ));
            }
            state.lane_through = p.lane_seq;
        }
        EntryBody::TurnDispatched(d) => {
            if state.turn_open {
                return Err(format!(
                    "turn_{} is still open; {} cannot be dispatched",
                    state.last_turn, d.turn
                ));
            }
            if d.turn.number() <= state.last_turn {
                return Err(format!("{} is not after turn_{}", d.turn, state.last_turn));
            }
            state.last_turn = d.turn.number();
            state.turn_open = true;
            state.waiting = false;
            state.active_ms = state.active_ms.max(d.at_ms);
        }
        EntryBody::ConversationOpened(o) => state.active_ms = state.active_ms.max(o.at_ms),
        EntryBody::IdleClosed(_) | EntryBody::Imported(_) | EntryBody::Reopened(_) => {
            apply_between_turns(state, body)?
        }
        EntryBody::TurnComplete(_) | EntryBody::TurnAmbiguous(_) => apply_close(state, body)?,
        other => apply_within_turn(state, other)?,
    }
    Ok(())
}

/// An input: its lane sequence after every one applied before; messages counted.
fn apply_input(
    state: &mut RecordState,
    input: &turnpike_schemas::entry::InputEntry,
) -> Result<(), String> {
    if let Some(seq) = input.lane_seq {
        if seq <= state.lane_through {
            return Err(format!(
                "lane sequence {seq} is not after {} (out of order or applied twice)",
                state.lane_through
            ));
        }
        state.lane_through = seq;
    }
    if matches!(
        input.event.body,
        turnpike_schemas::EventBody::Message { .. } | turnpike_schemas::EventBody::FollowUp { .. }
    ) {
        state.messages += 1;
    }
    Ok(())
}

/// An idle close, an import or a reopening: only between turns, and each only where it applies.
fn apply_between_turns(state: &mut RecordState, body: &EntryBody) -> Result<(), String> {
    match body {
        EntryBody::IdleClosed(_) => {
            if state.turn_open {
                return Err(format!(
                    "turn_{} is open: the conversation is not idle",
                    state.last_turn
                ));
            }
            if state.idle_closed {
                return Err("the conversation is closed as idle already".into());
            }
            state.idle_closed = true;
        }
        EntryBody::Imported(_) => {
            if state.turn_open {
                return Err(format!(
                    "turn_{} is open: a conversation is imported between turns",
                    state.last_turn
                ));
            }
            state.lane_through = 0;
        }
        EntryBody::Reopened(r) => {
            if !state.idle_closed {
                return Err("only a conversation closed as idle can be reopened".into());
            }
            state.idle_closed = false;
            state.active_ms = state.active_ms.max(r.at_ms);
        }
        _ => {}
    }
    Ok(())
}

/// A turn's closing entry (complete or ambiguous): only for the open turn.
fn apply_close(state: &mut RecordState, body: &EntryBody) -> Result<(), String> {
    let Some(turn) = body.turn() else {
        return Err(format!("a {} entry names no turn", body.kind()));
    };
    if !state.turn_open || turn.number() != state.last_turn {
        return Err(format!("{turn} is not open; it cannot be closed"));
    }
    state.turn_open = false;
    if let EntryBody::TurnComplete(c) = body {
        state.active_ms = state.active_ms.max(c.at_ms);
        state.waiting = c.outcome == turnpike_schemas::entry::TurnOutcome::Parked;
        if c.version.is_some() {
            state.version = c.version;
        }
    }
    Ok(())
}

/// Any other entry: one that names a turn only while that turn is open; a compaction marker
/// summarises earlier turns only; an agent switch names the agent from here on.
fn apply_within_turn(state: &mut RecordState, body: &EntryBody) -> Result<(), String> {
    if let EntryBody::CompactionMarker(marker) = body {
        if marker.through >= marker.turn {
            return Err(format!(
                "a compaction in {} cannot summarise {} (only earlier turns)",
                marker.turn, marker.through
            ));
        }
        state.summary_turn = marker.turn.number();
    }
    if let EntryBody::AgentSwitched(switch) = body {
        state.active_agent = Some(switch.to.clone());
    }
    if let Some(turn) = body.turn() {
        if !state.turn_open || turn.number() != state.last_turn {
            return Err(format!(
                "{turn} is not open; its {} entry cannot be appended",
                body.kind()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnpike_schemas::entry::{AssistantMessage, TurnComplete, TurnDispatched, TurnOutcome};
    use turnpike_schemas::{TurnId, WorkerId};

    fn dispatch(n: u64) -> EntryBody {
        EntryBody::TurnDispatched(TurnDispatched {
            turn: TurnId::new(n).unwrap(),
            worker: WorkerId::new(),
            agent: "a".parse().unwrap(),
            epoch: turnpike_schemas::Epoch(0),
            at_ms: 0,
        })
    }

    fn complete(n: u64) -> EntryBody {
        EntryBody::TurnComplete(TurnComplete {
            turn: TurnId::new(n).unwrap(),
            outcome: TurnOutcome::Replied,
            log: None,
            log_sha256: None,
            version: None,
            attempt: None,
            at_ms: 0,
        })
    }

    fn say(n: u64) -> EntryBody {
        EntryBody::AssistantMessage(AssistantMessage {
            turn: TurnId::new(n).unwrap(),
            text: "x".into(),
        })
    }

    #[test]
    fn turns_open_and_close_once_in_order() {
        let mut s = RecordState::default();
        apply(&mut s, &dispatch(1)).unwrap();
        assert!(
            apply(&mut s.clone(), &dispatch(2)).is_err(),
            "one open turn at a time"
        );
        apply(&mut s, &say(1)).unwrap();
        assert!(apply(&mut s.clone(), &say(2)).is_err());
        apply(&mut s, &complete(1)).unwrap();
        assert!(
            apply(&mut s.clone(), &complete(1)).is_err(),
            "exactly one completion"
        );
        assert!(apply(&mut s.clone(), &say(1)).is_err());
        assert!(
            apply(&mut s.clone(), &dispatch(1)).is_err(),
            "no reused turn numbers"
        );
        apply(&mut s, &dispatch(2)).unwrap();
        assert_eq!(
            s,
            RecordState {
                lane_through: 0,
                last_turn: 2,
                turn_open: true,
                summary_turn: 0,
                active_agent: None,
                version: None,
                messages: 0,
                waiting: false,
                active_ms: 0,
                idle_closed: false,
            }
        );
    }

    fn idle(since: u64) -> EntryBody {
        EntryBody::IdleClosed(turnpike_schemas::entry::IdleClosed {
            idle_since_ms: since,
            after_ms: 1_000,
            at_ms: since + 1_000,
        })
    }

    fn reopen(at_ms: u64) -> EntryBody {
        EntryBody::Reopened(turnpike_schemas::entry::Reopened { at_ms })
    }

    fn message(seq: u64) -> EntryBody {
        use turnpike_schemas::{Address, Event, EventBody};
        let address = Address {
            tenant: "t".parse().unwrap(),
            app: "a".parse().unwrap(),
            agent: "g".parse().unwrap(),
            conversation: turnpike_schemas::ConversationId::new(),
            identity: "x:y".parse().unwrap(),
        };
        EntryBody::input(
            Event::new(address, EventBody::Message { text: "hi".into() }, 0),
            Some(seq),
        )
    }

    #[test]
    fn idle_close_happens_once_and_only_a_reopening_takes_input_again() {
        let mut s = RecordState::default();
        let mut dispatched = dispatch(1);
        if let EntryBody::TurnDispatched(d) = &mut dispatched {
            d.at_ms = 500;
        }
        apply(&mut s, &dispatched).unwrap();
        assert_eq!(s.active_ms, 500);
        assert!(apply(&mut s.clone(), &idle(500)).is_err(), "a turn is open");
        apply(&mut s, &complete(1)).unwrap();
        assert_eq!(s.active_ms, 500, "a completion's clock behind is ignored");
        apply(&mut s, &idle(500)).unwrap();
        assert!(s.idle_closed);
        assert!(apply(&mut s.clone(), &idle(500)).is_err(), "exactly once");
        assert!(apply(&mut s.clone(), &message(1)).is_err(), "reopen first");
        assert!(apply(&mut s.clone(), &dispatch(2)).is_err(), "reopen first");
        apply(&mut s, &reopen(9_000)).unwrap();
        assert!(!s.idle_closed);
        assert_eq!(s.active_ms, 9_000, "the timer starts again");
        assert!(apply(&mut s.clone(), &reopen(9_500)).is_err(), "not closed");
        apply(&mut s, &message(1)).unwrap();
        apply(&mut s, &dispatch(2)).unwrap();
    }
}
