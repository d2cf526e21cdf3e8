//! Who else takes wakes: the workers whose heartbeats this worker heard lately.
//!
//! The intake spaces put-off wakes by the whole pool's slots and the scheduler splits its
//! shards by it, so a worker must know its fleet's size from its first turn, not after a
//! listening window. A worker therefore watches heartbeats for its whole life, and answers a
//! worker it has not heard before with a beat of its own at once: a worker that starts sends
//! its first beat once its watch is in place, and hears every running worker within a round
//! trip. A worker not heard for `forget_after` (two beats and a margin) is gone.
//!
//! Advisory, as heartbeats are: a wrong count makes put-offs too short or too long and shards
//! unevenly shared for a while, never a turn run twice or a wake lost.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use turnpike_schemas::WorkerId;

/// The workers heard lately, this one always among them.
#[derive(Debug)]
pub(crate) struct Roster {
    me: WorkerId,
    heard: HashMap<WorkerId, Instant>,
    forget_after: Duration,
}

impl Roster {
    /// A roster of `me` alone; another worker stays on it until it is silent for
    /// `forget_after`.
    pub(crate) fn new(me: WorkerId, forget_after: Duration) -> Self {
        Self {
            me,
            heard: HashMap::new(),
            forget_after,
        }
    }

    /// Notes a beat of `worker` heard at `now`. True when `worker` is another worker not on
    /// the roster: it has just started (or was silent too long), and does not know of this one
    /// yet, so this one beats at once.
    pub(crate) fn heard(&mut self, worker: WorkerId, now: Instant) -> bool {
        if worker == self.me {
            return false;
        }
        self.heard.insert(worker, now).is_none()
    }

    /// How many workers share the wakes at `now`, this one included (at least 1); forgets
    /// the ones silent for longer than `forget_after`.
    pub(crate) fn count(&mut self, now: Instant) -> usize {
        let forget_after = self.forget_after;
        self.heard
            .retain(|_, at| now.saturating_duration_since(*at) <= forget_after);
        1 + self.heard.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_worker_is_answered_once_and_forgotten_when_silent() {
        let (me, a, b) = (WorkerId::new(), WorkerId::new(), WorkerId::new());
        let t0 = Instant::now();
        let forget = Duration::from_secs(10);
        let mut roster = Roster::new(me, forget);
        assert_eq!(roster.count(t0), 1, "alone, it counts itself");
        assert!(!roster.heard(me, t0), "its own beat is not a newcomer's");
        assert_eq!(roster.count(t0), 1);
        assert!(roster.heard(a, t0), "a first beat is answered");
        assert!(
            !roster.heard(a, t0 + Duration::from_secs(5)),
            "a known one is not"
        );
        assert!(roster.heard(b, t0 + Duration::from_secs(6)));
        assert_eq!(roster.count(t0 + Duration::from_secs(6)), 3);
        // a last heard at 5 s, b at 6 s: at 15.5 s only a is silent for longer than 10 s.
        assert_eq!(roster.count(t0 + Duration::from_millis(15_500)), 2);
        assert!(
            roster.heard(a, t0 + Duration::from_secs(16)),
            "a worker forgotten and heard again is answered again"
        );
        assert_eq!(roster.count(t0 + Duration::from_secs(30)), 1, "both silent");
    }
}
