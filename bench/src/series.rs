//! A series of timed operations: percentiles and rate.

use std::time::Duration;

/// Latency percentiles and rate of a series of operations.
pub struct Series {
    pub samples: Vec<Duration>,
    pub total: Duration,
}

/// The `p` percentile of `samples` (sorted in place), in milliseconds; NaN with no samples.
pub fn percentile_ms(samples: &mut [Duration], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_unstable();
    nearest_rank(samples, p).as_secs_f64() * 1e3
}

/// The sample at rank `p` of sorted `samples` (the nearest rank, rounded).
fn nearest_rank(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

impl Series {
    pub fn percentile(&self, p: f64) -> Duration {
        let mut sorted = self.samples.clone();
        sorted.sort_unstable();
        nearest_rank(&sorted, p)
    }

    pub fn per_second(&self, units: u64) -> f64 {
        units as f64 / self.total.as_secs_f64()
    }

    pub fn line(&self, name: &str, ops: u64, unit: &str, units: u64) -> String {
        format!(
            "{name:<34} {:>10.0} ops/s {:>10.0} {unit}/s   p50 {:>8.3} ms   p99 {:>8.3} ms",
            self.per_second(ops),
            self.per_second(units),
            self.percentile(0.5).as_secs_f64() * 1e3,
            self.percentile(0.99).as_secs_f64() * 1e3,
        )
    }
}
