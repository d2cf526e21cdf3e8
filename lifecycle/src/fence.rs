//! The owner's fence: what it knows of its own lease, so that work stops writing once the lease
//! may have lapsed — before another worker can take the conversation over.
//!
//! Contract: the renewal loop moves the deadline forward after each successful renewal. Every
//! write that must be fenced (record appends, the turn log, the context snapshot, hosted files,
//! project versions) calls [`Fence::check`] first, which fails with [`Fenced`] once the
//! lease expires within the margin. A process that was paused (SIGSTOP, a long GC-like stall)
//! past its TTL therefore finds its deadline behind it the moment it resumes, and writes
//! nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use turnpike_router::bus::now_ms;

/// The lease may lapse before a write could land: the holder stops writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fenced;

impl std::fmt::Display for Fenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the lease could not be renewed in time; this owner stops writing")
    }
}

impl std::error::Error for Fenced {}

/// A shared, cheap handle on the lease deadline.
#[derive(Debug, Clone)]
pub struct Fence {
    expires_ms: Arc<AtomicU64>,
    margin_ms: u64,
}

impl Fence {
    /// A fence for a lease expiring at `expires_ms`; writes stop `margin` before that.
    pub fn new(expires_ms: u64, margin: Duration) -> Self {
        Self {
            expires_ms: Arc::new(AtomicU64::new(expires_ms)),
            margin_ms: margin.as_millis() as u64,
        }
    }

    /// The lease was renewed (or taken again) until `expires_ms`.
    pub fn renewed(&self, expires_ms: u64) {
        self.expires_ms.store(expires_ms, Ordering::Release);
    }

    /// Whether the lease still holds for longer than the margin, at `now_ms`.
    pub fn holds_at(&self, now_ms: u64) -> bool {
        now_ms.saturating_add(self.margin_ms) < self.expires_ms.load(Ordering::Acquire)
    }

    /// Fails (fenced) when the lease may lapse before a write could land.
    pub fn check(&self) -> Result<(), Fenced> {
        if self.holds_at(now_ms()) {
            return Ok(());
        }
        Err(Fenced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_fence_lapses_on_the_paused_clock() {
        let fence = Fence::new(now_ms() + 60_000, Duration::from_secs(5));
        assert!(fence.check().is_ok());
        tokio::time::advance(Duration::from_secs(54)).await;
        assert!(fence.check().is_ok());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(fence.check(), Err(Fenced));
    }

    #[test]
    fn a_fence_holds_until_the_margin_before_expiry() {
        let fence = Fence::new(10_000, Duration::from_millis(1_000));
        assert!(fence.holds_at(0));
        assert!(fence.holds_at(8_999));
        assert!(!fence.holds_at(9_000));
        assert!(!fence.holds_at(20_000));
        fence.renewed(30_000);
        assert!(fence.holds_at(20_000));
        // A clone shares the deadline.
        let other = fence.clone();
        fence.renewed(0);
        assert!(!other.holds_at(0));
    }
}
