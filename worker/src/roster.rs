//! Who else takes wakes: the workers whose heartbeats this worker heard lately.
//!
//! The intake spaces put-off wakes by the whole pool's slots and the scheduler splits its
//! shards by it, so a worker must know its fleet's size from its first turn, not after a
//! listening window. A worker therefore watches heartbeats for its whole life, and answers a
//! worker it has not heard before with a beat of its own at once: a worker that starts sends
//! its first beat once its watch is in place, and hears every running worker within a round
//! trip. A worker not heard for two of its beat periods and half a second is gone (its beats
//! say its period; an older worker's do not, and this worker's own period stands for it).
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
    /// When each other worker was heard last, and how long it stays on the roster after.
    heard: HashMap<WorkerId, (Instant, Duration)>,
    /// This worker's own beat period: stands for a sender's that does not say its own.
    every: Duration,
}

/// How long a silent worker stays on the roster, for a beat period `every`: two beats missed,
/// and a margin for a busy sender.
fn kept_for(every: Duration) -> Duration {
    every * 2 + Duration::from_millis(500)
}

impl Roster {
    /// A roster of `me` alone, which beats every `every`.
    pub(crate) fn new(me: WorkerId, every: Duration) -> Self {
        Self {
            me,
            heard: HashMap::new(),
            every,
        }
    }

    /// Notes a beat of `worker` (which beats every `every`; zero: unknown) heard at `now`.
    /// True when `worker` is another worker not on the roster: it has just started (or was
    /// silent too long), and does not know of this one yet, so this one beats at once.
    pub(crate) fn heard(&mut self, worker: WorkerId, every: Duration, now: Instant) -> bool {
        if worker == self.me {
            return false;
        }
        let every = if every.is_zero() { self.every } else { every };
        self.heard.insert(worker, (now, kept_for(every))).is_none()
    }

    /// How many workers share the wakes at `now`, this one included (at least 1); forgets
    /// the ones silent for longer than two of their beats and half a second.
    pub(crate) fn count(&mut self, now: Instant) -> usize {
        self.heard
            .retain(|_, (at, kept)| now.saturating_duration_since(*at) <= *kept);
        1 + self.heard.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_worker_is_answered_once_and_forgotten_after_two_of_its_beats() {
        let (me, a, b, old) = (
            WorkerId::new(),
            WorkerId::new(),
            WorkerId::new(),
            WorkerId::new(),
        );
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let every = Duration::from_secs(5);
        let mut roster = Roster::new(me, every);
        assert_eq!(roster.count(t0), 1, "alone, it counts itself");
        assert!(
            !roster.heard(me, every, t0),
            "its own beat is not a newcomer's"
        );
        assert_eq!(roster.count(t0), 1);
        assert!(roster.heard(a, every, t0), "a first beat is answered");
        assert!(!roster.heard(a, every, at(5_000)), "a known one is not");
        // b beats every second; an older worker does not say, so this one's 5 s stands.
        assert!(roster.heard(b, Duration::from_secs(1), at(6_000)));
        assert!(roster.heard(old, Duration::ZERO, at(6_000)));
        assert_eq!(roster.count(at(6_000)), 4);
        // b is kept 2.5 s after its last beat, a and the old one 10.5 s.
        assert_eq!(roster.count(at(8_500)), 4);
        assert_eq!(roster.count(at(8_501)), 3, "b missed two beats");
        assert_eq!(roster.count(at(15_500)), 3);
        assert_eq!(roster.count(at(15_501)), 2, "a missed two beats");
        assert!(
            roster.heard(a, every, at(16_000)),
            "a worker forgotten and heard again is answered again"
        );
        assert_eq!(
            roster.count(at(16_500)),
            3,
            "the old one: until 10.5 s after 6 s"
        );
        assert_eq!(roster.count(at(16_501)), 2, "a and this one");
        assert_eq!(roster.count(at(30_000)), 1, "all silent");
    }
}
