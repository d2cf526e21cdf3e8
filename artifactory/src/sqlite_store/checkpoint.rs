//! Checkpoints of a [`super::SqliteStore`]'s write-ahead log, on a thread of their own.
//!
//! SQLite checkpoints by default inside the commit that makes the log long enough, on the
//! committing connection: the writer would then stop every few thousand writes to copy pages
//! into the database and (with or without `fsync`) flush it, and every write queued behind it
//! would wait. Here the writer never checkpoints; this thread does, a little after writes
//! happened, in `PASSIVE` mode: it copies what no reader still needs and never waits for the
//! writer or a reader. The thread ends when the store is dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use rusqlite::Connection;

/// How often the log is checkpointed while writes come in.
const INTERVAL: Duration = Duration::from_millis(200);

/// Runs until `stop` is closed (its sender dropped with the store).
pub(super) fn run(conn: Connection, stop: Receiver<()>, commits: Arc<AtomicU64>) {
    let mut seen = commits.load(Ordering::Relaxed);
    loop {
        match stop.recv_timeout(INTERVAL) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        let now = commits.load(Ordering::Relaxed);
        if now == seen {
            continue;
        }
        seen = now;
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::warn!(error = %e, "a checkpoint of the local store's log failed (retried later)");
        }
    }
}
