//! A turn's batch one before it is committed ([`Opening`]), and where a turn about to commit
//! its batch two finds the next turn's, to commit both at once ([`Upcoming`]).

use turnpike_router::bus::{now_ms, LaneMessage};
use turnpike_schemas::entry::{RecordState, TurnDispatched};
use turnpike_schemas::{AgentId, EntryBody, TurnId};

use super::TurnEnv;

/// A new turn's batch one, not committed yet: its inputs, and the entries that open it.
pub struct Opening {
    pub turn: TurnId,
    pub agent: AgentId,
    pub inputs: Vec<LaneMessage>,
    pub bodies: Vec<EntryBody>,
    /// The record's lane sequence before its inputs: every wake up to here was taken by a turn
    /// that is complete once this batch one commits.
    pub through: u64,
    /// When the parked turn it may answer ended (ms), if the record was waiting on people.
    pub(super) waiting_since: Option<u64>,
}

impl Opening {
    /// Batch one over `inputs` on a record in `state` (no turn open): the inputs, any ingress
    /// directive, and `turn_dispatched` for the next turn, under `epoch`.
    pub fn new(
        env: &TurnEnv,
        state: &RecordState,
        inputs: Vec<LaneMessage>,
        epoch: turnpike_schemas::Epoch,
    ) -> Opening {
        let turn = TurnId::new(state.last_turn + 1).expect("turn numbers start at 1");
        // The agent the conversation was last switched to, else the one it was opened with.
        let agent: AgentId = state.active_agent.clone().unwrap_or_else(|| {
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
        Opening {
            turn,
            agent,
            inputs,
            bodies,
            through: state.lane_through,
            waiting_since: state.waiting.then_some(state.active_ms),
        }
    }
}

/// Where a turn may find the next one's inputs, to commit that turn's batch one with its own
/// batch two: one commit, one signature and one write fewer for a lane with messages waiting.
/// The owner's drain answers, by the same rules it starts a turn by.
pub trait Upcoming: Send {
    /// The next turn's batch one on a record in `after` (the state once this turn's batch two
    /// is in), or `None`: the next turn, if any, starts on its own.
    fn take(&mut self, env: &TurnEnv, after: &RecordState) -> Option<Opening>;
    /// A batch one that was not committed (the record refused it with the batch two): its
    /// inputs go back, first in line.
    fn give_back(&mut self, opening: Opening);
}

/// No next turn: each starts on its own.
pub struct NoUpcoming;

impl Upcoming for NoUpcoming {
    fn take(&mut self, _: &TurnEnv, _: &RecordState) -> Option<Opening> {
        None
    }
    fn give_back(&mut self, _: Opening) {}
}
