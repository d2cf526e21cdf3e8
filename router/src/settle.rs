//! What becomes of a wake: one pure rule for every place that lets go of one.
//!
//! # Contract
//! - A wake is acked only when the record is committed through its sequence with no turn open
//!   (DESIGN step 2): its event is in a complete turn, or was set aside (`lane_parked`).
//! - A wake nobody could take now comes back after a delay that grows with its deliveries
//!   (capped), so a busy fleet is not hammered — except one refused only for want of a free turn
//!   slot here, or one whose owner is between turns (it takes the event itself or lets go
//!   soon), which come back after one fixed delay; one its owner handed over after a clean drain
//!   comes back at once; one whose owner failed comes back later.
//! - A wake nothing could ever mend (its lane belongs to no conversation, or its owner stopped
//!   on a rule violation it could not set aside) is terminated: never redelivered (a backend
//!   without the distinction acks it).

use std::time::Duration;

/// Where a wake's handler leaves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// The record as its reader saw it: committed through `lane_through`, a turn open or not.
    Record { lane_through: u64, turn_open: bool },
    /// This worker's turn slots are all taken: the wake should find a worker with a free one
    /// soon, so it comes back after one `busy` delay however often it was delivered (a growing
    /// backoff here left wakes waiting seconds while other workers had free slots).
    Full,
    /// Not taken now: the lease or the record could not be read.
    Busy,
    /// Its owner drained the lane cleanly and let go: for whoever comes next, at once.
    Handover,
    /// Its owner stopped on a fault that may pass (the store or the bus away): later.
    Failed,
    /// Nothing a retry could mend.
    Poison,
    /// Put off for fairness: its tenant has as many wakes waiting at this worker as it may;
    /// it comes back after this delay (about when its turn would come).
    Deferred(Duration),
}

/// What the bus is told about a wake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done: never delivered again.
    Ack,
    /// Deliver again after this delay.
    Nak(Duration),
    /// Never deliver again, and it is not done.
    Term,
}

/// The outcome of the wake at lane sequence `seq`, delivered `deliveries` times, left in
/// `settlement`; `busy` is the base delay for a wake nobody could take.
pub fn outcome(seq: u64, deliveries: u64, settlement: Settlement, busy: Duration) -> Outcome {
    let later = busy * deliveries.clamp(1, MAX_BACKOFF_STEPS) as u32;
    match settlement {
        Settlement::Record {
            lane_through,
            turn_open,
        } if seq <= lane_through && !turn_open => Outcome::Ack,
        // Its owner is between turns: it takes this event itself or lets go very soon.
        Settlement::Record {
            turn_open: false, ..
        }
        | Settlement::Full => Outcome::Nak(busy),
        Settlement::Record { .. } | Settlement::Busy => Outcome::Nak(later),
        Settlement::Handover => Outcome::Nak(Duration::ZERO),
        Settlement::Failed => Outcome::Nak(busy * FAILED_STEPS),
        Settlement::Poison => Outcome::Term,
        Settlement::Deferred(delay) => Outcome::Nak(delay),
    }
}

/// The most a busy wake's delay grows (in multiples of the base delay).
const MAX_BACKOFF_STEPS: u64 = 8;
/// How much later a wake whose owner failed comes back (in multiples of the base delay).
const FAILED_STEPS: u32 = 4;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn settlement() -> impl Strategy<Value = Settlement> {
        prop_oneof![
            (0u64..100, any::<bool>()).prop_map(|(lane_through, turn_open)| Settlement::Record {
                lane_through,
                turn_open
            }),
            Just(Settlement::Busy),
            Just(Settlement::Full),
            Just(Settlement::Handover),
            Just(Settlement::Failed),
            Just(Settlement::Poison),
            (0u64..60_000).prop_map(|ms| Settlement::Deferred(Duration::from_millis(ms))),
        ]
    }

    proptest! {
        #[test]
        fn only_a_complete_turn_past_the_wake_acks_it(
            seq in 0u64..100, deliveries in 0u64..1000, s in settlement(), busy_ms in 1u64..1000,
        ) {
            let busy = Duration::from_millis(busy_ms);
            let out = outcome(seq, deliveries, s, busy);
            let complete = matches!(s, Settlement::Record { lane_through, turn_open }
                if seq <= lane_through && !turn_open);
            prop_assert_eq!(out == Outcome::Ack, complete);
            prop_assert_eq!(out == Outcome::Term, s == Settlement::Poison);
            if s == Settlement::Full {
                prop_assert_eq!(out, Outcome::Nak(busy), "no growing backoff for want of a slot");
            }
            if let Settlement::Record { lane_through, turn_open: false } = s {
                if seq > lane_through {
                    prop_assert_eq!(out, Outcome::Nak(busy), "an owner between turns");
                }
            }
            match (s, out) {
                (Settlement::Deferred(asked), out) => prop_assert_eq!(out, Outcome::Nak(asked)),
                (_, Outcome::Nak(delay)) => prop_assert!(delay <= busy * MAX_BACKOFF_STEPS as u32),
                _ => {}
            }
        }

        #[test]
        fn a_busy_wake_waits_longer_the_more_it_was_delivered(
            seq in 0u64..100, d in 1u64..20, busy_ms in 1u64..1000,
        ) {
            let busy = Duration::from_millis(busy_ms);
            let delay = |d| match outcome(seq, d, Settlement::Busy, busy) {
                Outcome::Nak(delay) => delay,
                other => panic!("{other:?}"),
            };
            prop_assert!(delay(d) <= delay(d + 1));
            prop_assert!(delay(d) >= busy);
        }
    }
}
