//! Waiting on a condition, with a timeout, never on a bare sleep.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` (every 50 ms) until it returns `Some`; panics after `timeout` saying `what`.
pub async fn until<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
