//! Outbound webhooks' data: which turn events a subscriber is told of, and the subscriptions an
//! app's manifest declares (`[webhooks.<name>]`, app-wide). Users' own subscriptions (to their
//! conversations, or to one of them) are made through the API and kept by the store.

use serde::{Deserialize, Serialize};

use crate::{AgentId, TenantId};

/// What happened, as a webhook's `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum EventKind {
    /// A turn ended with a reply.
    #[serde(rename = "turn.completed")]
    TurnCompleted,
    /// A turn ended in a recorded failure.
    #[serde(rename = "turn.failed")]
    TurnFailed,
    /// A turn was stopped.
    #[serde(rename = "turn.cancelled")]
    TurnCancelled,
    /// A turn parked on an approval, a question or a missing connection: someone must answer.
    #[serde(rename = "turn.parked")]
    TurnParked,
    /// A schedule's firing was decided: fired (with its conversation), skipped or missed.
    #[serde(rename = "schedule.firing")]
    ScheduleFiring,
}

impl EventKind {
    pub const ALL: [EventKind; 5] = [
        EventKind::TurnCompleted,
        EventKind::TurnFailed,
        EventKind::TurnCancelled,
        EventKind::TurnParked,
        EventKind::ScheduleFiring,
    ];

    /// The name on the wire (`turn.completed`, …).
    pub fn name(self) -> &'static str {
        match self {
            EventKind::TurnCompleted => "turn.completed",
            EventKind::TurnFailed => "turn.failed",
            EventKind::TurnCancelled => "turn.cancelled",
            EventKind::TurnParked => "turn.parked",
            EventKind::ScheduleFiring => "schedule.firing",
        }
    }

    /// The kind named `name`, if any.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// Which events a subscription wants: `kinds` empty means every kind.
pub fn wants(kinds: &[EventKind], kind: EventKind) -> bool {
    kinds.is_empty() || kinds.contains(&kind)
}

/// An app-wide subscription, validated: every turn event of the app's conversations in one
/// tenant (optionally one agent's) goes to `url`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookSpec {
    pub name: String,
    /// `http` or `https`, checked against the deployment's outbound rules at each delivery.
    pub url: String,
    /// The tenant whose turns it hears of (never another's).
    pub tenant: TenantId,
    /// Only this agent's turns, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentId>,
    /// The kinds it wants (empty: all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<EventKind>,
    /// The environment variable that holds its `whsec_…` signing secret (never the secret).
    pub secret_env: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_their_wire_names() {
        for kind in EventKind::ALL {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.name()));
            assert_eq!(EventKind::parse(kind.name()), Some(kind));
        }
        assert_eq!(EventKind::parse("turn.done"), None);
        assert!(wants(&[], EventKind::TurnFailed));
        assert!(!wants(&[EventKind::TurnParked], EventKind::TurnFailed));
    }
}
