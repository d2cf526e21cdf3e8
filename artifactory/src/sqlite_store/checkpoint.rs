//! Checkpoints of a [`super::SqliteStore`]'s write-ahead log, on a thread of their own.
//!
//! SQLite checkpoints by default inside the commit that makes the log long enough, on the
//! committing connection: the writer would then stop every few thousand writes to copy pages
//! into the database and (with or without `fsync`) flush it, and every write queued behind it
//! would wait. Here the writer never checkpoints; this thread does, a little after writes
//! happened, in `PASSIVE` mode: it copies what no reader still needs and never waits for the
//! writer or a reader. The thread ends when the store is dropped.
//!
//! A passive checkpoint cannot start the log over while readers keep reading it, and under a
//! steady load they always are: the log then grows without end (a long soak filled the disk
//! with it). Once the log passes [`RESTART_FRAMES`], this thread checkpoints in `TRUNCATE`
//! mode instead: it waits (up to the busy timeout) for the readers of the log to finish their
//! current reads, holding new writes back meanwhile, copies everything and cuts the log to
//! nothing. A rare short pause of writes, for a log whose size is bounded.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use rusqlite::Connection;

/// How often the log is checkpointed while writes come in.
const INTERVAL: Duration = Duration::from_millis(200);

/// The log's length (frames, a page each: 4 KiB by default, so 64 MiB) past which it is
/// started over.
const RESTART_FRAMES: i64 = 16_384;

/// Runs until `stop` is closed (its sender dropped with the store).
pub(super) fn run(conn: Connection, stop: Receiver<()>, counts: Arc<super::writer::Counts>) {
    let commits = &counts.commits;
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
        // (busy, frames in the log, frames copied)
        let passive = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, i64>(2)?,
            ))
        });
        match passive {
            Ok((_, log, _)) if log >= RESTART_FRAMES => {
                let cut = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
                    row.get::<_, i64>(0)
                });
                match cut {
                    Ok(0) => {
                        tracing::debug!(frames = log, "the local store's log was started over")
                    }
                    Ok(_) => tracing::debug!(
                        frames = log,
                        "readers kept the local store's log; retried later"
                    ),
                    Err(e) => {
                        tracing::warn!(error = %e, "a checkpoint of the local store's log failed (retried later)")
                    }
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "a checkpoint of the local store's log failed (retried later)")
            }
        }
    }
}
