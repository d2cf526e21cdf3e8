//! A memory of what was used lately, for per-conversation hints a process keeps (directory
//! entries, heads, how far a lane was drained).
//!
//! Contract: [`Recent`] holds at most its capacity, and nothing that went unused (neither put
//! nor got) for longer than its idle time — such an entry is never returned, and is dropped at
//! the next put or get. So what it keeps follows the keys in use, not every key ever seen: a
//! server that has served a million conversations holds only those of the last minutes. The
//! values are hints; a caller that finds nothing reads the truth again.

use std::hash::Hash;
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use lru::LruCache;

/// At most `capacity` values, none unused for longer than `idle`.
pub struct Recent<K: Hash + Eq, V> {
    lru: LruCache<K, (V, Instant)>,
    idle: Duration,
}

impl<K: Hash + Eq, V> Recent<K, V> {
    /// A capacity of 0 is taken as 1.
    pub fn new(capacity: usize, idle: Duration) -> Self {
        Self {
            lru: LruCache::new(NonZeroUsize::new(capacity.max(1)).expect("not zero")),
            idle,
        }
    }

    /// Remembers `value` for `key` (as used now).
    pub fn put(&mut self, key: K, value: V) {
        self.put_at(key, value, Instant::now());
    }

    /// The value for `key`, unless it went unused too long; a value returned counts as used.
    pub fn get(&mut self, key: &K) -> Option<&V> {
        self.get_at(key, Instant::now())
    }

    fn put_at(&mut self, key: K, value: V, now: Instant) {
        self.expire(now);
        self.lru.put(key, (value, now));
    }

    fn get_at(&mut self, key: &K, now: Instant) -> Option<&V> {
        self.expire(now);
        let (value, used) = self.lru.get_mut(key)?;
        *used = now;
        Some(value)
    }

    /// Forgets `key`, returning its value (unless it went unused too long).
    pub fn pop(&mut self, key: &K) -> Option<V> {
        self.expire(Instant::now());
        self.lru.pop(key).map(|(value, _)| value)
    }

    /// How many values are held (unused ones included until the next put or get).
    pub fn len(&self) -> usize {
        self.lru.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lru.is_empty()
    }

    /// Drops the values unused for longer than `idle` (the least recently used come first).
    fn expire(&mut self, now: Instant) {
        while let Some((_, (_, used))) = self.lru.peek_lru() {
            if now.saturating_duration_since(*used) <= self.idle {
                break;
            }
            self.lru.pop_lru();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_at_most_its_capacity_the_least_recently_used_out_first() {
        let mut r = Recent::new(2, Duration::from_secs(3600));
        r.put(1, "a");
        r.put(2, "b");
        assert_eq!(r.get(&1), Some(&"a"));
        r.put(3, "c");
        assert_eq!(r.len(), 2);
        assert_eq!(r.get(&2), None, "the least recently used went");
        assert_eq!(r.get(&1), Some(&"a"));
        assert_eq!(r.get(&3), Some(&"c"));
    }

    #[test]
    fn what_went_unused_longer_than_its_idle_time_is_dropped_and_never_returned() {
        let idle = Duration::from_secs(60);
        let t0 = Instant::now();
        let mut r = Recent::new(100, idle);
        for k in 0..50 {
            r.put_at(k, k, t0);
        }
        r.put_at(1000, 1000, t0 + idle * 2);
        // The 50 idle ones were dropped by that put: memory follows the keys in use.
        assert_eq!(r.len(), 1);
        assert_eq!(r.get_at(&7, t0 + idle * 2), None);
        assert_eq!(r.get_at(&1000, t0 + idle * 2), Some(&1000));
    }

    #[test]
    fn a_get_counts_as_use() {
        let idle = Duration::from_secs(60);
        let t0 = Instant::now();
        let mut r = Recent::new(100, idle);
        r.put_at("kept", 1, t0);
        r.put_at("left", 2, t0);
        // Touched more often than the idle time, for longer than it: still there.
        for step in 1..=4u32 {
            assert_eq!(r.get_at(&"kept", t0 + idle / 2 * step), Some(&1));
        }
        assert_eq!(r.get_at(&"left", t0 + idle * 2), None);
        assert_eq!(r.len(), 1);
    }
}
