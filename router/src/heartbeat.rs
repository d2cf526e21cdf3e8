//! Heartbeats: every worker says, every few seconds, that it is alive and how many of its turn
//! slots are taken; `turnpike workers` lists who spoke within a window, and every worker
//! watches them to count its fleet (the worker crate's roster). Advisory only: nothing is
//! decided by them (leases and their epochs decide who owns a conversation).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use turnpike_schemas::WorkerId;

/// One worker's heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub worker: WorkerId,
    /// Conversations it owns right now.
    pub owned: usize,
    /// How many it may own at once (absent from older workers' beats: 0).
    #[serde(default)]
    pub slots: usize,
    /// When it was sent, in milliseconds since the epoch (the sender's clock).
    pub at_ms: u64,
    /// How often it beats, in milliseconds (absent from older workers' beats: 0, unknown).
    #[serde(default)]
    pub every_ms: u64,
}

/// The newest heartbeat of each worker among `beats`, ordered by worker id.
pub fn latest(beats: impl IntoIterator<Item = Heartbeat>) -> Vec<Heartbeat> {
    let mut by_worker: BTreeMap<WorkerId, Heartbeat> = BTreeMap::new();
    for beat in beats {
        match by_worker.get(&beat.worker) {
            Some(seen) if seen.at_ms >= beat.at_ms => {}
            _ => {
                by_worker.insert(beat.worker, beat);
            }
        }
    }
    by_worker.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_beat_of_each_worker_is_kept() {
        let (a, b) = (WorkerId::new(), WorkerId::new());
        let beat = |worker, owned, at_ms| Heartbeat {
            worker,
            owned,
            slots: 8,
            at_ms,
            every_ms: 5000,
        };
        let listed = latest([
            beat(a, 1, 10),
            beat(b, 5, 12),
            beat(a, 3, 30),
            beat(a, 2, 20),
        ]);
        let mut want = vec![beat(a, 3, 30), beat(b, 5, 12)];
        want.sort_by_key(|h| h.worker);
        assert_eq!(listed, want);
    }
}
