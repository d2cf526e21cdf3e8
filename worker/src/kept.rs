//! Leases a lone worker keeps between drains (DESIGN step 9, one worker alone on the bus).
//!
//! When a drain ends cleanly and the worker counts itself alone on the bus, its owner keeps the
//! conversation's lease, with the head the drain left, for up to `keep_lease_for`, instead of
//! releasing it (it still reads the lane's end once it stops taking wakes, and drains again
//! under the lease when more came; that read is its drain's last, as the drain ends without
//! one of its own when nothing is ahead and no wake it holds is past the record). The next
//! wake of the conversation resumes it: no claim, no release, and none of a drain's opening
//! reads (tombstone, repair journal, head probe, unfinished promotion), because only a holder
//! of the lease writes those and this worker held it throughout. Under a steady stream of
//! messages that is a claim, a release and four store reads saved per drain.
//!
//! # Contract
//! - A kept lease is resumed as it is only while its next renewal is not due (the owner then
//!   renews it on the usual schedule, counted from its last renewal: the same fence as an owner
//!   between two renewals). Past that it is renewed first — a compare-and-set at its revision,
//!   which fails if anyone took it — or, failing that, forgotten for an ordinary claim.
//! - Kept leases are released after `keep_lease_for` unused, all of them as soon as the worker
//!   stops counting itself alone (a joining worker would otherwise find them held), and when the
//!   worker stops. A crash releases nothing: they lapse after their TTL, like an owner's.
//! - Nothing waits on a kept lease but other claimers: a message that came while the owner let
//!   go is found by its read of the lane's end, and every later one brings a wake that resumes
//!   the lease. A deletion waits for a
//!   held lease longer than `keep_lease_for`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use turnpike_artifactory::Head;
use turnpike_router::bus::{now_ms, Lease};
use turnpike_schemas::ConversationId;

/// A lease kept after a clean drain, with the head that drain left.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    pub(crate) lease: Lease,
    pub(crate) head: Head,
    since: Instant,
}

/// The leases this worker keeps (a plain mutex: held only to look up or change the map).
#[derive(Default)]
pub(crate) struct KeptLeases(Mutex<HashMap<ConversationId, Kept>>);

impl KeptLeases {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<ConversationId, Kept>> {
        self.0.lock().expect("kept leases lock")
    }

    /// Keeps `lease`, whose last drain left `head`.
    pub(crate) fn keep(&self, lease: Lease, head: Head) {
        let kept = Kept {
            lease,
            head,
            since: Instant::now(),
        };
        self.map().insert(kept.lease.conversation, kept);
    }

    /// Takes the kept lease of `conversation`, if any: it is the caller's to resume or release.
    pub(crate) fn take(&self, conversation: ConversationId) -> Option<Kept> {
        self.map().remove(&conversation)
    }

    /// Takes the leases kept longer than `unused` (all of them with `Duration::ZERO`): the
    /// caller releases them.
    pub(crate) fn take_unused(&self, unused: Duration, now: Instant) -> Vec<Lease> {
        let mut map = self.map();
        let due: Vec<ConversationId> = map
            .iter()
            .filter(|(_, k)| now.saturating_duration_since(k.since) >= unused)
            .map(|(c, _)| *c)
            .collect();
        due.into_iter()
            .filter_map(|c| map.remove(&c))
            .map(|k| k.lease)
            .collect()
    }

    /// Forgets every kept lease without releasing it (a simulated crash).
    pub(crate) fn forget(&self) {
        self.map().clear();
    }

    pub(crate) fn len(&self) -> usize {
        self.map().len()
    }
}

/// How long until `lease` must be renewed: `renew_every` after its last renewal (or claim),
/// which was `ttl` before it expires. Zero when that is past.
pub(crate) fn renewal_due_in(lease: &Lease, ttl: Duration, renew_every: Duration) -> Duration {
    let renewed_ms = lease
        .expires_ms
        .saturating_sub(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
    let due_ms = renewed_ms.saturating_add(u64::try_from(renew_every.as_millis()).unwrap_or(0));
    Duration::from_millis(due_ms.saturating_sub(now_ms()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnpike_schemas::WorkerId;

    fn lease(expires_ms: u64) -> Lease {
        Lease {
            conversation: ConversationId::new(),
            owner: WorkerId::new(),
            revision: 3,
            expires_ms,
        }
    }

    #[test]
    fn a_renewal_is_due_renew_every_after_the_last_one() {
        let ttl = Duration::from_secs(15);
        let every = Duration::from_secs(5);
        // Claimed just now: due in about `every`.
        let fresh = renewal_due_in(&lease(now_ms() + 15_000), ttl, every);
        assert!(
            fresh > Duration::from_secs(4) && fresh <= every,
            "{fresh:?}"
        );
        // Renewed 6 s ago: due already.
        assert_eq!(
            renewal_due_in(&lease(now_ms() + 9_000), ttl, every),
            Duration::ZERO
        );
        // Expired long ago, or a nonsensical expiry: due, never a panic.
        assert_eq!(renewal_due_in(&lease(0), ttl, every), Duration::ZERO);
        assert_eq!(
            renewal_due_in(&lease(u64::MAX), Duration::MAX, Duration::MAX),
            Duration::ZERO
        );
    }

    #[test]
    fn unused_leases_are_taken_once_and_a_taken_one_is_not_released() {
        let kept = KeptLeases::default();
        let (a, b) = (lease(1), lease(2));
        kept.keep(a.clone(), Head::empty());
        let start = Instant::now();
        kept.keep(b.clone(), Head::empty());
        assert!(kept
            .take_unused(Duration::from_secs(60), Instant::now())
            .is_empty());
        // Resumed: no longer kept, so never released behind its new owner's back.
        assert_eq!(kept.take(a.conversation).unwrap().lease, a);
        assert!(kept.take(a.conversation).is_none());
        let due = kept.take_unused(Duration::from_secs(1), start + Duration::from_secs(2));
        assert_eq!(due, vec![b]);
        assert_eq!(kept.len(), 0);
        kept.keep(a.clone(), Head::empty());
        assert_eq!(kept.take_unused(Duration::ZERO, Instant::now()), vec![a]);
    }
}
