//! The clock the bus, leases and owners read: the wall clock, read afresh every time, plus the
//! virtual offset of a paused tokio runtime. Outside such a runtime that offset is zero, so this
//! is exactly the wall clock — NTP corrections and a host resuming from suspend show at once,
//! which is what lease expiries compared between machines need. Under a paused runtime
//! (`#[tokio::test(start_paused = true)]`, `tokio::time::advance`) it advances with tokio's
//! clock, so a test can let a ten-minute lease lapse at once.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, on the clock described above.
pub fn now_ms() -> u64 {
    let wall_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i128)
        .unwrap_or(0);
    // tokio's now minus the real now: how far a paused clock was advanced beyond real time
    // (zero, to the microsecond, when time is not paused).
    let (virtual_now, real_now) = (tokio::time::Instant::now().into_std(), Instant::now());
    let offset_us = if virtual_now >= real_now {
        virtual_now.duration_since(real_now).as_micros() as i128
    } else {
        -(real_now.duration_since(virtual_now).as_micros() as i128)
    };
    ((wall_us + offset_us).max(0) / 1000) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn outside_a_paused_runtime_it_is_the_wall_clock() {
        let wall = || {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64
        };
        let before = wall();
        let now = now_ms();
        let after = wall();
        assert!(before <= now && now <= after, "{before} ≤ {now} ≤ {after}");
    }

    #[tokio::test(start_paused = true)]
    async fn it_advances_with_a_paused_tokio_clock() {
        let before = now_ms();
        tokio::time::advance(Duration::from_secs(600)).await;
        let after = now_ms();
        // Paused, the clock moves only by what was advanced (give or take a rounding).
        assert!(
            (599_999..=600_001).contains(&(after - before)),
            "{before} → {after}"
        );
    }
}
