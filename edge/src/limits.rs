//! Limits at the edge: request rates per identity, and how many event submissions may be in
//! flight to the bus at once (backpressure when lanes are saturated).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock as _, DefaultClock};
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::ApiError;

/// The edge's limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Requests per second per identity (sustained); 0 turns rate limiting off.
    pub rate_per_second: u32,
    /// Requests an identity may make at once above the sustained rate.
    pub burst: u32,
    /// Event submissions in flight to the bus at once, across all callers; more wait up to
    /// `saturation_wait`, then get `503` with `Retry-After`.
    pub max_in_flight: usize,
    pub saturation_wait: Duration,
    /// The largest JSON body, in bytes.
    pub max_body_bytes: usize,
    /// How long open WebSocket streams go on once the router is shutting down, before they
    /// are closed with 1001 (going away) and their clients reconnect elsewhere.
    pub drain_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            rate_per_second: 50,
            burst: 100,
            max_in_flight: 1024,
            saturation_wait: Duration::from_millis(250),
            max_body_bytes: 256 * 1024,
            drain_grace: Duration::from_secs(5),
        }
    }
}

type Keyed = RateLimiter<String, DefaultKeyedStateStore<String>, DefaultClock>;

/// Rate limits per identity.
#[derive(Clone)]
pub struct RateLimits {
    limiter: Option<Arc<Keyed>>,
    clock: DefaultClock,
}

impl RateLimits {
    pub fn new(limits: &Limits) -> Self {
        let limiter = NonZeroU32::new(limits.rate_per_second).map(|rate| {
            let burst = NonZeroU32::new(limits.burst.max(limits.rate_per_second)).unwrap_or(rate);
            Arc::new(RateLimiter::keyed(
                Quota::per_second(rate).allow_burst(burst),
            ))
        });
        Self {
            limiter,
            clock: DefaultClock::default(),
        }
    }

    /// Lets one request of `identity` through, or says when to retry (`429`).
    pub fn check(&self, identity: &str) -> Result<(), ApiError> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        match limiter.check_key(&identity.to_owned()) {
            Ok(()) => Ok(()),
            Err(not_until) => {
                let wait = not_until.wait_time_from(self.clock.now());
                let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                Err(ApiError::new(
                    crate::error::ErrorCode::RateLimited,
                    format!("too many requests from {identity}; retry in {seconds} s"),
                )
                .retry_after(seconds))
            }
        }
    }

    /// Forgets identities that have been idle long enough to be back at full burst.
    pub fn shrink(&self) {
        if let Some(l) = &self.limiter {
            l.retain_recent();
            l.shrink_to_fit();
        }
    }
}

/// Bounds event submissions in flight.
#[derive(Clone)]
pub struct InFlight {
    permits: Arc<Semaphore>,
    wait: Duration,
}

impl InFlight {
    pub fn new(limits: &Limits) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(limits.max_in_flight.max(1))),
            wait: limits.saturation_wait,
        }
    }

    /// A slot for one submission, or `503` when the bus is saturated.
    pub async fn enter(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        let acquire = self.permits.clone().acquire_owned();
        match tokio::time::timeout(self.wait, acquire).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(ApiError::unavailable(
                "the lanes are saturated: too many events are waiting to be accepted; retry shortly",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_over_its_burst_is_told_when_to_retry_and_others_are_not_affected() {
        let limits = RateLimits::new(&Limits {
            rate_per_second: 1,
            burst: 3,
            ..Limits::default()
        });
        for _ in 0..3 {
            limits.check("local:a").unwrap();
        }
        let refused = limits.check("local:a").unwrap_err();
        assert_eq!(refused.status, axum::http::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.retry_after, Some(1));
        limits.check("local:b").unwrap();
        let off = RateLimits::new(&Limits {
            rate_per_second: 0,
            ..Limits::default()
        });
        for _ in 0..1000 {
            off.check("local:a").unwrap();
        }
    }

    #[tokio::test]
    async fn submissions_beyond_the_bound_get_503_with_retry_after() {
        let gate = InFlight::new(&Limits {
            max_in_flight: 1,
            saturation_wait: Duration::from_millis(10),
            ..Limits::default()
        });
        let held = gate.enter().await.unwrap();
        let refused = gate.enter().await.unwrap_err();
        assert_eq!(refused.status, axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(refused.retry_after.is_some());
        drop(held);
        let _again = gate.enter().await.unwrap();
    }
}
