//! Who else takes wakes: the workers whose heartbeats this worker heard lately.
//!
//! The intake spaces put-off wakes by the whole pool's slots and the scheduler splits its
//! shards by it, so a worker must know its fleet's size from its first turn, not after a
//! listening window. A worker therefore watches heartbeats for its whole life, and answers a
//! worker it has not heard before with a beat of its own at once: a worker that starts sends
//! its first beat once its watch is in place, and hears every running worker within a round
//! trip. A worker not heard for two of its beat periods and half a second is gone (its beats
//! say its period, taken within bounds; an older worker's do not, and this worker's own period
//! stands for it).
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

/// The most workers a roster holds: past it, a new sender is neither counted nor answered (a
/// flood of made-up ids on the subject cannot make every worker beat, or count thousands).
const MOST: usize = 1024;

/// The shortest beat period a sender is taken at: a sender that says less (a worker whose run
/// loop a slow bus holds up for a moment) is still not counted out between two beats.
const SHORTEST: Duration = Duration::from_millis(750);

/// The longest beat period a sender is taken at, when this worker's own is shorter: a dead
/// worker that said it beats once an hour, or a sender that made a period up, is counted out
/// within two minutes.
const LONGEST: Duration = Duration::from_secs(60);

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

    /// Notes a beat of `worker` (which says it beats every `every`; zero: unknown, this
    /// worker's own period stands for it; taken within 750 ms and the longer of a minute and
    /// this worker's own) heard at `now`. True when `worker` is another worker not on the
    /// roster: it has just started (or was silent too long), and does not know of this one yet,
    /// so this one beats at once.
    pub(crate) fn heard(&mut self, worker: WorkerId, every: Duration, now: Instant) -> bool {
        if worker == self.me {
            return false;
        }
        let every = if every.is_zero() { self.every } else { every };
        let kept = kept_for(every.clamp(SHORTEST, LONGEST.max(self.every)));
        let new = match self.heard.get(&worker) {
            Some((at, kept)) => now.saturating_duration_since(*at) > *kept,
            None if self.heard.len() >= MOST => return false,
            None => true,
        };
        self.heard.insert(worker, (now, kept));
        new
    }

    /// How many workers share the wakes at `now`, this one included (at least 1, at most
    /// 1 + 1,024); forgets the ones silent for longer than two of their beats and half a second.
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

    #[test]
    fn a_sender_is_taken_at_a_bounded_period_and_the_roster_at_a_bounded_size() {
        let me = WorkerId::new();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut roster = Roster::new(me, Duration::from_secs(5));
        let (forever, quick) = (WorkerId::new(), WorkerId::new());
        // A period of 584 million years is taken as a minute: counted out after 120.5 s.
        assert!(roster.heard(forever, Duration::from_millis(u64::MAX), t0));
        // One of 10 ms as 750 ms: kept 2 s.
        assert!(roster.heard(quick, Duration::from_millis(10), t0));
        assert_eq!(roster.count(at(2_000)), 3);
        assert_eq!(roster.count(at(2_001)), 2);
        assert_eq!(roster.count(at(120_500)), 2);
        assert_eq!(roster.count(at(120_501)), 1);
        // A worker whose entry lapsed but was not yet removed is answered again.
        assert!(roster.heard(quick, Duration::from_millis(10), at(200_000)));
        assert!(roster.heard(quick, Duration::from_millis(10), at(203_000)));
        // A flood of made-up ids: counted and answered up to the bound, then neither.
        let mut answered = 0;
        for _ in 0..2 * MOST {
            answered += usize::from(roster.heard(WorkerId::new(), Duration::ZERO, at(203_000)));
        }
        assert_eq!(answered, MOST - 1, "the quick one holds a place");
        assert_eq!(roster.count(at(203_000)), 1 + MOST);
        // Once they are silent, new senders are heard again.
        assert_eq!(roster.count(at(300_000)), 1);
        assert!(roster.heard(WorkerId::new(), Duration::ZERO, at(300_000)));
    }
}
