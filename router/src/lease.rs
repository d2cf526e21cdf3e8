//! Leases: one owner per conversation at a time, fenced by an epoch.
//!
//! # Contract
//! - A lease is held by at most one worker at a time. [`may_claim`] decides when it can be
//!   taken: never held, released, or expired. A live lease is never claimed again, not even by
//!   its own holder (so one worker never ends up with two owners of one conversation).
//! - Its revision increases with every claim and renewal; [`Lease::epoch`] is the fencing
//!   epoch an owner writes under.

use serde::{Deserialize, Serialize};
use turnpike_schemas::{ConversationId, WorkerId};

/// A held lease on one conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub conversation: ConversationId,
    pub owner: WorkerId,
    /// The lease key's revision: increases with every claim and renewal (see [`Lease::epoch`]).
    pub revision: u64,
    pub expires_ms: u64,
}

impl Lease {
    /// The fencing epoch of this holding of the lease.
    pub fn epoch(&self) -> turnpike_schemas::Epoch {
        turnpike_schemas::Epoch(self.revision)
    }
}

/// What a lease key holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseValue {
    /// `None` once released.
    pub owner: Option<WorkerId>,
    pub expires_ms: u64,
}

/// Whether a lease whose current value is `current` may be taken at `now_ms`: when it was
/// never held, was released, or expired. A live lease is never taken again, not even by its own
/// holder, so one worker cannot end up with two owners of one conversation.
pub fn may_claim(current: Option<&LeaseValue>, now_ms: u64) -> bool {
    match current {
        None => true,
        Some(LeaseValue { owner: None, .. }) => true,
        Some(LeaseValue { expires_ms, .. }) => *expires_ms <= now_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_live_lease_is_never_claimable(expires in 0u64..10_000, now in 0u64..10_000) {
            let held = LeaseValue { owner: Some(WorkerId::new()), expires_ms: expires };
            prop_assert_eq!(may_claim(Some(&held), now), expires <= now);
            let released = LeaseValue { owner: None, expires_ms: expires };
            prop_assert!(may_claim(Some(&released), now));
            prop_assert!(may_claim(None, now));
        }
    }
}
