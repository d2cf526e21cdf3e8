//! The clock the bus, leases and owners read: wall time at the first reading, advanced by
//! tokio's monotonic clock since. Two consequences:
//! - a wall-clock step after start (NTP, an operator) does not move lease expiries within a
//!   process;
//! - under a paused tokio runtime (`#[tokio::test(start_paused = true)]`, `tokio::time::advance`)
//!   this clock advances with tokio's, so a test can let a ten-minute lease expire at once.
//!
//! Across processes, lease expiries compare this clock between machines, as they always have
//! compared wall clocks: the lease TTL must exceed the expected clock skew.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Wall time and the monotonic instant of the first reading.
static ORIGIN: OnceLock<(u64, Instant)> = OnceLock::new();

/// Milliseconds since the Unix epoch, on the clock described above.
pub fn now_ms() -> u64 {
    let (wall_ms, origin) = *ORIGIN.get_or_init(|| {
        let wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        (wall_ms, Instant::now())
    });
    let now = tokio::time::Instant::now().into_std();
    wall_ms + now.saturating_duration_since(origin).as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn it_reads_close_to_the_wall_clock_and_never_goes_back() {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let a = now_ms();
        assert!(a.abs_diff(wall) < 60_000, "{a} vs {wall}");
        let b = now_ms();
        assert!(b >= a);
    }

    #[tokio::test(start_paused = true)]
    async fn it_advances_with_a_paused_tokio_clock() {
        let before = now_ms();
        tokio::time::advance(Duration::from_secs(600)).await;
        let after = now_ms();
        assert!(after >= before + 600_000, "{before} → {after}");
    }
}
