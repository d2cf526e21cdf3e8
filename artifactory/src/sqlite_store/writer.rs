//! The one writer of a [`super::SqliteStore`]: a thread that owns the write connection and
//! commits every write waiting for it in one transaction (group commit).
//!
//! Contract: a job's reply is sent only after the transaction holding it committed (with the
//! store's durability: fsync of the write-ahead log, or the OS page cache); a job that failed
//! gets its error and changes nothing, and the others in its group still commit. A failed
//! commit, or a transaction the database itself gave up (disk full, I/O error), fails every job
//! of the group and writes none of them. When the store is dropped the channel closes, the
//! thread finishes what it was sent, and ends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{Error, Result};
use rusqlite::{params, Connection, ErrorCode};

/// The most jobs committed together.
const MAX_GROUP: usize = 256;

/// A write the writer applies.
pub(super) enum Op {
    /// Writes `data` at `path`: always (`Overwrite`), only where nothing is (`Create`), or only
    /// over the version whose e-tag is given (`Update`).
    Put {
        path: Path,
        data: Bytes,
        mode: PutMode,
    },
    /// Removes `path` (nothing there is not an error).
    Delete { path: Path },
    /// Copies `from` to `to` (only where nothing is, with `create`), and then removes `from`
    /// with `remove_source` (a rename), in one transaction.
    Copy {
        from: Path,
        to: Path,
        create: bool,
        remove_source: bool,
    },
}

pub(super) enum PutMode {
    Overwrite,
    Create,
    Update(String),
}

/// What a job answers: the e-tag written, if any.
pub(super) type Reply = Result<Option<String>>;

pub(super) struct Job {
    pub op: Op,
    /// Whether its commit must flush the log (with `fsync`); false for a write that may wait
    /// for the next commit that does ([`crate::SyncedWithNext`]).
    pub flush: bool,
    pub reply: tokio::sync::oneshot::Sender<Reply>,
}

/// What the writer counts: transactions committed, and those of them that flushed the log.
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub commits: AtomicU64,
    pub flushes: AtomicU64,
}

/// Runs the writer until every sender is gone. `reopen` gives a fresh connection when the one
/// in hand is left in an unknown state (a failed rollback, a panic). With `fsync`, `conn` and
/// every reopened connection flush the log at each commit (`synchronous = FULL`); a group
/// whose every job may wait for a later flush ([`Job::flush`]) commits without one
/// (`synchronous = NORMAL` for that commit). The log is one sequence, so whatever commits
/// next with a flush, or the next checkpoint, takes it to disk before itself.
pub(super) fn run(
    mut conn: Connection,
    reopen: impl Fn() -> rusqlite::Result<Connection>,
    jobs: Receiver<Job>,
    etags: Arc<Etags>,
    fsync: bool,
    counts: Arc<Counts>,
) {
    // Whether `conn` may commit without flushing now (it starts flushing, with `fsync`): true
    // also when that is unknown (a failed switch), so that a group needing a flush sets it.
    let mut unflushed = false;
    // Commits in the log not flushed yet (with `fsync`).
    let mut waiting = false;
    // Set when a flush failed with commits waiting for it: the kernel may have dropped their
    // frames, and a later flush would not say so (the pages count as written), leaving a hole
    // a power cut turns into lost acknowledged writes. Nothing more is written until the
    // process starts again (SQLite then recovers the log as it is on disk).
    let mut broken: Option<String> = None;
    while let Ok(first) = jobs.recv() {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match jobs.try_recv() {
                Ok(job) => group.push(job),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        if let Some(why) = &broken {
            for job in group {
                let _ = job.reply.send(Err(generic(format!("not written: {why}"))));
            }
            continue;
        }
        let flush = fsync && group.iter().any(|j| j.flush);
        let skip_flush = fsync && !flush;
        if unflushed != skip_flush {
            let mode = if flush { "FULL" } else { "NORMAL" };
            match conn.pragma_update(None, "synchronous", mode) {
                Ok(()) => unflushed = skip_flush,
                // This group may flush, which is only more than it asked; the mode is not
                // known now, so the next group that needs a flush sets it again.
                Err(_) if !flush => unflushed = true,
                // Not flushing, and cannot go back: a fresh connection flushes.
                Err(e) => match reopen() {
                    Ok(fresh) => {
                        conn = fresh;
                        unflushed = false;
                    }
                    Err(_) => {
                        tracing::error!(error = %e, "the local store's writer cannot flush its log again; this group is not written");
                        for job in group {
                            let _ = job
                                .reply
                                .send(Err(generic("not written: the store cannot flush its log")));
                        }
                        continue;
                    }
                },
            }
        }
        let changes = conn.total_changes();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            commit(&mut conn, &group, &etags)
        }));
        let applied = match outcome {
            Ok(applied) => applied,
            Err(_) => {
                tracing::error!("the local store's writer panicked; its group is not written");
                Applied {
                    replies: group
                        .iter()
                        .map(|_| Err(generic("not written: the store's writer failed")))
                        .collect(),
                    committed: false,
                    io_failed: false,
                }
            }
        };
        if applied.committed {
            // A commit that changed nothing writes no log, and flushes nothing.
            if skip_flush {
                waiting = true;
            } else if conn.total_changes() != changes {
                waiting = false;
            }
        } else if applied.io_failed && waiting {
            let why = "the store's log could not be flushed after writes that waited for that flush; restart the process";
            tracing::error!("{why}");
            broken = Some(why.to_owned());
        }
        // Never go on inside a transaction nobody will finish: roll it back, or start over
        // with a new connection.
        if !conn.is_autocommit() && conn.execute_batch("ROLLBACK").is_err() {
            match reopen() {
                Ok(fresh) => {
                    conn = fresh;
                    unflushed = false;
                }
                Err(e) => {
                    tracing::error!(error = %e, "the local store's writer cannot reopen its database");
                }
            }
        }
        counts.commits.fetch_add(1, Ordering::Relaxed);
        if flush && applied.committed {
            counts.flushes.fetch_add(1, Ordering::Relaxed);
        }
        for (job, reply) in group.into_iter().zip(applied.replies) {
            // The caller may have gone (a dropped future): the write stands anyway.
            let _ = job.reply.send(reply);
        }
    }
}

/// Applies `group` in one transaction; one reply per job. A job whose statement fails is undone
/// whole and the others go on: a job of one statement by SQLite's own rule (a failed statement
/// backs out its changes and leaves the transaction open), a job of two (a rename) inside a
/// savepoint, so it is never half done.
/// Where SQLite itself ended the transaction (a full disk, an I/O error), every job of the
/// group, those before included, is reported not written, and the rest are not run.
fn commit(conn: &mut Connection, group: &[Job], etags: &Etags) -> Applied {
    let not_written = |why: &str| -> Applied {
        Applied {
            replies: group
                .iter()
                .map(|_| Err(generic(format!("not written: {why}"))))
                .collect(),
            committed: false,
            io_failed: false,
        }
    };
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        return not_written(&e.to_string());
    }
    let mut replies = Vec::with_capacity(group.len());
    for job in group {
        let savepoint = matches!(
            job.op,
            Op::Copy {
                remove_source: true,
                ..
            }
        );
        if savepoint {
            if let Err(e) = conn.execute_batch("SAVEPOINT job") {
                return not_written(&format!("the transaction failed: {e}"));
            }
        }
        let reply = apply(conn, &job.op, etags);
        if conn.is_autocommit() {
            return not_written("the transaction was rolled back by the database");
        }
        if savepoint {
            let settled = if reply.is_ok() {
                conn.execute_batch("RELEASE job")
            } else {
                conn.execute_batch("ROLLBACK TO job; RELEASE job")
            };
            if let Err(e) = settled {
                return not_written(&format!("the transaction failed: {e}"));
            }
        }
        replies.push(reply);
    }
    if let Err(e) = conn.execute_batch("COMMIT") {
        let io_failed = matches!(&e, rusqlite::Error::SqliteFailure(f, _) if f.code == ErrorCode::SystemIoFailure);
        return Applied {
            io_failed,
            ..not_written(&format!("the commit failed: {e}"))
        };
    }
    Applied {
        replies,
        committed: true,
        io_failed: false,
    }
}

/// What [`commit`] did with a group.
struct Applied {
    /// One per job.
    replies: Vec<Reply>,
    /// Whether the transaction committed (its jobs' own failures aside).
    committed: bool,
    /// Whether its commit failed with an I/O error (writing or flushing the log).
    io_failed: bool,
}

fn apply(tx: &Connection, op: &Op, etags: &Etags) -> Reply {
    let now = now_ms();
    match op {
        Op::Put { path, data, mode } => {
            let etag = etags.next();
            let key = path.as_ref();
            let blob: &[u8] = data;
            let changed = match mode {
                PutMode::Overwrite => tx
                    .prepare_cached(
                        "INSERT INTO objects (path, data, etag, modified_ms, size)
                         VALUES (?1, ?2, ?3, ?4, length(?2))
                         ON CONFLICT (path) DO UPDATE SET data = excluded.data,
                           size = excluded.size, etag = excluded.etag,
                           modified_ms = excluded.modified_ms",
                    )
                    .and_then(|mut s| s.execute(params![key, blob, etag, now])),
                PutMode::Create => tx
                    .prepare_cached(
                        "INSERT INTO objects (path, data, etag, modified_ms, size)
                         VALUES (?1, ?2, ?3, ?4, length(?2))",
                    )
                    .and_then(|mut s| s.execute(params![key, blob, etag, now])),
                PutMode::Update(expected) => tx
                    .prepare_cached(
                        "UPDATE objects SET data = ?2, size = length(?2), etag = ?3, modified_ms = ?4
                         WHERE path = ?1 AND etag = ?5",
                    )
                    .and_then(|mut s| s.execute(params![key, blob, etag, now, expected])),
            };
            match changed {
                Ok(0) => Err(Error::Precondition {
                    path: key.to_string(),
                    source: "the object is gone or was changed since the version given".into(),
                }),
                Ok(_) => Ok(Some(etag)),
                Err(e) if is_unique_violation(&e) => Err(Error::AlreadyExists {
                    path: key.to_string(),
                    source: Box::new(e),
                }),
                Err(e) => Err(generic(e.to_string())),
            }
        }
        Op::Delete { path } => tx
            .prepare_cached("DELETE FROM objects WHERE path = ?1")
            .and_then(|mut s| s.execute(params![path.as_ref()]))
            .map(|_| None)
            .map_err(|e| generic(e.to_string())),
        Op::Copy {
            from,
            to,
            create,
            remove_source,
        } => {
            let etag = etags.next();
            // A rename onto another key moves the row: its key changes where it is, and its
            // bytes are not copied (a rename onto its own key is a copy).
            let rename = *remove_source && from != to;
            let sql = match (rename, *create) {
                (true, _) => {
                    "UPDATE objects SET path = ?2, etag = ?3, modified_ms = ?4 WHERE path = ?1"
                }
                (false, true) => {
                    "INSERT INTO objects (path, data, etag, modified_ms, size)
                     SELECT ?2, data, ?3, ?4, size FROM objects WHERE path = ?1"
                }
                (false, false) => {
                    "INSERT INTO objects (path, data, etag, modified_ms, size)
                     SELECT ?2, data, ?3, ?4, size FROM objects WHERE path = ?1
                     ON CONFLICT (path) DO UPDATE SET data = excluded.data,
                       size = excluded.size, etag = excluded.etag,
                       modified_ms = excluded.modified_ms"
                }
            };
            if rename && !*create {
                // Over what the key held.
                tx.prepare_cached("DELETE FROM objects WHERE path = ?1")
                    .and_then(|mut s| s.execute(params![to.as_ref()]))
                    .map_err(|e| generic(e.to_string()))?;
            }
            let done = tx
                .prepare_cached(sql)
                .and_then(|mut s| s.execute(params![from.as_ref(), to.as_ref(), etag, now]));
            match done {
                Ok(0) => Err(Error::NotFound {
                    path: from.to_string(),
                    source: if rename {
                        "no object to rename".into()
                    } else {
                        "no object to copy".into()
                    },
                }),
                Ok(_) => Ok(Some(etag)),
                Err(e) if is_unique_violation(&e) => Err(Error::AlreadyExists {
                    path: to.to_string(),
                    source: Box::new(e),
                }),
                Err(e) => Err(generic(e.to_string())),
            }
        }
    }
}

fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.code == ErrorCode::ConstraintViolation)
}

/// E-tags unique across processes sharing one store: a random prefix per opened store and a
/// counter.
pub(super) struct Etags {
    prefix: u64,
    next: AtomicU64,
}

impl Etags {
    pub fn new() -> Result<Self> {
        let mut seed = [0u8; 8];
        getrandom::getrandom(&mut seed).map_err(|e| generic(format!("no randomness: {e}")))?;
        Ok(Self {
            prefix: u64::from_le_bytes(seed),
            next: AtomicU64::new(0),
        })
    }

    fn next(&self) -> String {
        format!(
            "\"{:016x}-{:x}\"",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }
}

pub(super) fn generic(message: impl Into<String>) -> object_store::Error {
    object_store::Error::Generic {
        store: "Sqlite",
        source: message.into().into(),
    }
}

pub(super) fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
