//! A local object store in one SQLite database (write-ahead log), instead of one file per
//! object.
//!
//! Why: the filesystem store creates an inode for every write (a staged file renamed or linked
//! into place) and frees one for every overwrite or delete. A turn writes and deletes several
//! small objects, so on a busy worker much of the CPU can go to the filesystem's inode
//! allocation, directory creation and unlinks rather than to Turnpike (on an ext4 without a
//! journal, where every new inode is searched past the recently freed ones, most of it did). Here a write is a row in
//! a B-tree appended to one log, and every write waiting at the same moment shares one commit
//! (and, with `fsync`, one flush of the log): group commit.
//!
//! Contract (that of [`object_store::ObjectStore`], checked by `object_store`'s own suite):
//! - a write that returned is visible to every later read, from this process or another one
//!   opening the same directory;
//! - it survives the process being killed at any moment (the log is in the OS before the write
//!   returns); with `fsync` it survives a power cut too (the log is flushed before it returns),
//!   except a put that asks for [`crate::SyncedWithNext`]: that one is flushed with the next
//!   commit that writes to the log and flushes it, or a checkpoint that copies the log (the log
//!   is one sequence: a power cut keeps a prefix of it, never a later commit without an
//!   earlier one). A flush that fails while such writes wait for it stops the store's writes
//!   until the process starts again (the kernel may have dropped their pages, and a later
//!   flush would not say so);
//! - `PutMode::Create` and copy/rename to a `Create` target refuse, atomically, where an object
//!   is; `PutMode::Update` writes only over the e-tag given; a rename is one transaction;
//! - listings come in key order. Attributes and tags are not kept.
//!
//! Several processes may open the same directory (SQLite's locks order their writes).

mod checkpoint;
mod writer;

use std::ops::Range;
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::stream::{BoxStream, StreamExt as _};
use object_store::path::Path;
use object_store::{
    CopyMode, CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload,
    ObjectMeta, ObjectStore, PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult,
    RenameOptions, RenameTargetMode, Result, UploadPart,
};
use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension as _};

use writer::{generic, Etags, Job, Op};

/// The database's file name inside the store's directory.
pub const FILE_NAME: &str = "objects.sqlite";

/// Objects listed per query while a listing is streamed.
const LIST_PAGE: usize = 1000;

/// Read connections kept open for reuse.
const MAX_IDLE_READERS: usize = 8;
/// What SQLite may keep in memory, all its connections together (a process-wide soft limit:
/// past it, SQLite reuses its page caches' least recently used pages rather than growing
/// them). Each connection's own cache (2 MiB by default) fills page by page as the database
/// grows, so ten of them kept memory rising long after a server warmed up; pages past this
/// are read from the file (the kernel's page cache, which it can reclaim).
pub const HEAP_LIMIT_BYTES: i64 = 8 << 20;
/// Whole objects up to this size are read on the calling thread when a reader is free (see
/// [`SqliteStore::read_inline`]). Sized for a context snapshot of about a hundred turns (80 KiB):
/// from the page cache such a read takes tens of microseconds, less than the hand-off to a
/// blocking thread and back (measured: the cold rebuild of `bench context`'s turn 1,000 went
/// from 0.25 to 0.18 ms). The price: a read the page cache misses holds one async thread for
/// a disk read.
const INLINE_READ: i64 = 128 << 10;

/// How long a statement waits for another process's write lock before it fails.
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The SQLite-backed local store.
pub struct SqliteStore {
    shared: Arc<Shared>,
}

struct Shared {
    file: PathBuf,
    fsync: bool,
    readers: Mutex<Vec<Connection>>,
    writer: std::sync::mpsc::Sender<Job>,
    counts: Arc<writer::Counts>,
    /// Dropped with the store: the checkpointer then ends.
    _stop_checkpoints: std::sync::mpsc::Sender<()>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("file", &self.shared.file)
            .field("fsync", &self.shared.fsync)
            .finish()
    }
}

impl std::fmt::Display for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sqlite({})", self.shared.file.display())
    }
}

fn open_connection(file: &FsPath, fsync: bool) -> rusqlite::Result<Connection> {
    use rusqlite::OpenFlags;
    // No URI parsing: a directory named like `file:…?immutable=1` is a name, not options.
    let conn = Connection::open_with_flags(
        file,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // WAL: readers never wait for the writer, and a commit appends to one log. `NORMAL`
    // writes the log at commit (safe when the process dies) and flushes it at checkpoints;
    // `FULL` flushes it at every commit (safe when the power goes).
    let mode: String =
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(rusqlite::Error::InvalidParameterName(format!(
            "the database cannot keep a write-ahead log here (journal mode {mode})"
        )));
    }
    conn.pragma_update(None, "synchronous", if fsync { "FULL" } else { "NORMAL" })?;
    if fsync {
        // Where a plain fsync does not reach the platter (macOS), the full one.
        conn.pragma_update(None, "fullfsync", "ON")?;
        conn.pragma_update(None, "checkpoint_fullfsync", "ON")?;
    }
    // A log grown by a burst is cut back to this once checkpointed.
    conn.pragma_update(None, "journal_size_limit", 64i64 << 20)?;
    // Process-wide: the same value from every connection.
    conn.pragma_update(None, "soft_heap_limit", HEAP_LIMIT_BYTES)?;
    Ok(conn)
}

impl SqliteStore {
    /// Opens (creating if absent) the store in directory `dir`, which must exist. With `fsync`,
    /// a write returns only once it is on stable storage.
    pub fn open(dir: impl AsRef<FsPath>, fsync: bool) -> Result<Self> {
        Self::open_limited(dir, fsync, None)
    }

    /// [`Self::open`], with the writer's database bounded to `max_pages` pages (a full disk,
    /// for tests).
    fn open_limited(dir: impl AsRef<FsPath>, fsync: bool, max_pages: Option<i64>) -> Result<Self> {
        let file = dir.as_ref().join(FILE_NAME);
        let conn = open_connection(&file, fsync)
            .map_err(|e| generic(format!("cannot open {}: {e}", file.display())))?;
        conn.execute_batch(
            // The data last: a listing reads the rest of a row without touching its bytes.
            "CREATE TABLE IF NOT EXISTS objects (
                path TEXT PRIMARY KEY NOT NULL,
                size INTEGER NOT NULL,
                etag TEXT NOT NULL,
                modified_ms INTEGER NOT NULL,
                data BLOB NOT NULL
            )",
        )
        .map_err(|e| generic(format!("cannot prepare {}: {e}", file.display())))?;
        // The writer never checkpoints; the checkpointer below does, off its thread.
        conn.pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(|e| generic(format!("cannot prepare {}: {e}", file.display())))?;
        if let Some(pages) = max_pages {
            conn.pragma_update(None, "max_page_count", pages)
                .map_err(|e| generic(e.to_string()))?;
        }
        let checkpointer = open_connection(&file, fsync)
            .map_err(|e| generic(format!("cannot open {}: {e}", file.display())))?;
        let etags = Arc::new(Etags::new()?);
        let counts = Arc::new(writer::Counts::default());
        let (send, receive) = std::sync::mpsc::channel();
        {
            let counts = counts.clone();
            let reopen = {
                let file = file.clone();
                move || {
                    let conn = open_connection(&file, fsync)?;
                    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
                    Ok(conn)
                }
            };
            std::thread::Builder::new()
                .name("turnpike-store-writer".into())
                .spawn(move || writer::run(conn, reopen, receive, etags, fsync, counts))
                .map_err(|e| generic(format!("cannot start the store's writer: {e}")))?;
        }
        let (stop_checkpoints, checkpoints_stop) = std::sync::mpsc::channel();
        {
            let counts = counts.clone();
            std::thread::Builder::new()
                .name("turnpike-store-checkpoint".into())
                .spawn(move || checkpoint::run(checkpointer, checkpoints_stop, counts))
                .map_err(|e| generic(format!("cannot start the store's checkpointer: {e}")))?;
        }
        Ok(Self {
            shared: Arc::new(Shared {
                file,
                fsync,
                readers: Mutex::new(Vec::new()),
                writer: send,
                counts,
                _stop_checkpoints: stop_checkpoints,
            }),
        })
    }

    /// How many transactions the writer committed (each holds one or more writes).
    pub fn commits(&self) -> u64 {
        self.shared.counts.commits.load(Ordering::Relaxed)
    }

    /// How many of those flushed the log (none without `fsync`).
    pub fn flushed_commits(&self) -> u64 {
        self.shared.counts.flushes.load(Ordering::Relaxed)
    }

    /// Sends `op` to the writer and waits for its commit.
    async fn write(&self, op: Op) -> writer::Reply {
        self.write_flushing(op, true).await
    }

    /// [`Self::write`], its commit flushing the log only with `flush` (or with another job of
    /// its group that does).
    async fn write_flushing(&self, op: Op, flush: bool) -> writer::Reply {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.shared
            .writer
            .send(Job { op, flush, reply })
            .map_err(|_| generic("the store's writer has stopped"))?;
        answer
            .await
            .map_err(|_| generic("the store's writer stopped before it answered"))?
    }

    /// Copies `from` to `to` in one write (only if `to` is absent, with `create`), removing
    /// `from` in the same transaction with `remove_source` (a rename); its commit flushes the
    /// log with `flush` (see [`Self::write_flushing`]).
    async fn copy(
        &self,
        from: &Path,
        to: &Path,
        create: bool,
        remove_source: bool,
        flush: bool,
    ) -> Result<()> {
        let op = Op::Copy {
            from: from.clone(),
            to: to.clone(),
            create,
            remove_source,
        };
        self.write_flushing(op, flush).await.map(|_| ())
    }

    /// Runs `read` on a pooled read connection, off the async threads.
    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || {
            let pooled = shared.readers.lock().ok().and_then(|mut idle| idle.pop());
            let mut conn = match pooled {
                Some(conn) => conn,
                None => open_connection(&shared.file, shared.fsync)
                    .map_err(|e| generic(format!("cannot open a reader: {e}")))?,
            };
            let out = read(&mut conn);
            give_back(&shared, conn);
            out
        })
        .await
        .map_err(|e| generic(format!("a read task failed: {e}")))?
    }

    /// Runs `read` on the calling thread when a pooled read connection is free (`None`: none
    /// is, or `read` declined; the caller goes through [`Self::read`]). For point reads that
    /// answer from the page cache in microseconds — less than handing them to a blocking
    /// thread and back costs.
    fn read_inline<T>(
        &self,
        read: impl FnOnce(&mut Connection) -> Option<Result<T>>,
    ) -> Option<Result<T>> {
        let mut conn = self.shared.readers.lock().ok()?.pop()?;
        // A busy database fails at once here (the caller retries off the async threads)
        // instead of sleeping in SQLite's busy handler on an async thread.
        if conn.busy_timeout(std::time::Duration::ZERO).is_err() {
            return None;
        }
        let out = read(&mut conn);
        if conn.busy_timeout(BUSY_TIMEOUT).is_ok() {
            give_back(&self.shared, conn);
        }
        out
    }

    /// A whole object of at most [`INLINE_READ`] bytes (or its absence), read on the calling
    /// thread; `None` when it is larger or no reader is free.
    fn get_small(&self, path: &Path, options: &GetOptions) -> Option<Result<(ObjectMeta, Bytes)>> {
        self.read_inline(|conn| whole_object(conn, path, options, INLINE_READ).transpose())
    }

    /// [`ObjectStore::get_opts`] off the async threads: a whole object, a part of it, or its
    /// metadata.
    async fn get_whole_or_part(
        &self,
        path: Path,
        options: GetOptions,
    ) -> Result<(ObjectMeta, Range<u64>, Bytes)> {
        self.read(move |conn| {
            // A whole object (the common read): one statement, which is atomic by itself.
            if options.range.is_none() && !options.head {
                let (meta, data) = whole_object(conn, &path, &options, i64::MAX)?
                    .expect("no object is larger than the largest size");
                let range = 0..meta.size;
                return Ok((meta, range, data));
            }
            // A part of it, or its metadata: the size first, then the bytes, in one read
            // transaction.
            let tx = conn.transaction().map_err(|e| generic(e.to_string()))?;
            let meta = object_meta(&tx, &path, &options)?;
            let range =
                match &options.range {
                    Some(range) => range.as_range(meta.size).map_err(|source| {
                        object_store::Error::Generic {
                            store: "Sqlite",
                            source: Box::new(source),
                        }
                    })?,
                    None => 0..meta.size,
                };
            if options.head {
                return Ok((meta, range, Bytes::new()));
            }
            let data = read_range(&tx, &path, &range)?;
            Ok((meta, range, data))
        })
        .await
    }

    /// One page of the objects under `prefix` (as a directory) after `after`, in key order.
    async fn list_page(
        &self,
        prefix: Option<Path>,
        after: Option<String>,
    ) -> Result<Vec<ObjectMeta>> {
        self.read(move |conn| {
            let (low, high) = key_range(prefix.as_ref());
            let low = match after {
                Some(after) if after > low => after,
                _ => low,
            };
            // Two statements, so that each is a plain range scan of the key index.
            let mut statement = match &high {
                Some(_) => conn.prepare_cached(
                    "SELECT path, size, etag, modified_ms FROM objects
                     WHERE path > ?1 AND path < ?2 ORDER BY path LIMIT ?3",
                ),
                None => conn.prepare_cached(
                    "SELECT path, size, etag, modified_ms FROM objects
                     WHERE path > ?1 AND ?2 IS NULL ORDER BY path LIMIT ?3",
                ),
            }
            .map_err(|e| generic(e.to_string()))?;
            let rows = statement
                .query_map(params![low, high, LIST_PAGE as i64], |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, i64>(1)?,
                        row.get::<_, String>(2)?,
                        row.get::<_, i64>(3)?,
                    ))
                })
                .map_err(|e| generic(e.to_string()))?;
            let mut out = Vec::new();
            for row in rows {
                let (path, size, etag, modified) = row.map_err(|e| generic(e.to_string()))?;
                // Stored as written: already a valid path, to be taken as is (not encoded again).
                let location = Path::parse(&path)
                    .map_err(|e| generic(format!("a stored key is not a path: {e}")))?;
                out.push(meta(location, size, etag, modified));
            }
            Ok(out)
        })
        .await
    }

    /// Every object under `prefix` after `offset`, streamed a page at a time.
    fn list_after(
        &self,
        prefix: Option<&Path>,
        offset: Option<&Path>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let store = SqliteStore {
            shared: self.shared.clone(),
        };
        let prefix = prefix.cloned();
        let start = offset.map(|o| o.to_string());
        futures::stream::unfold(Some(start), move |cursor| {
            let store = SqliteStore {
                shared: store.shared.clone(),
            };
            let prefix = prefix.clone();
            async move {
                let after = cursor?;
                match store.list_page(prefix, after).await {
                    Err(e) => Some((vec![Err(e)], None)),
                    Ok(page) => {
                        let next = (page.len() == LIST_PAGE)
                            .then(|| page.last().map(|m| Some(m.location.to_string())))
                            .flatten();
                        Some((page.into_iter().map(Ok).collect::<Vec<_>>(), next))
                    }
                }
            }
        })
        .flat_map(futures::stream::iter)
        .boxed()
    }
}

/// Puts a read connection back in the pool: only one outside any transaction (else it would
/// read an old snapshot for good), and only up to [`MAX_IDLE_READERS`].
fn give_back(shared: &Shared, conn: Connection) {
    if let (true, Ok(mut idle)) = (conn.is_autocommit(), shared.readers.lock()) {
        if idle.len() < MAX_IDLE_READERS {
            idle.push(conn);
        }
    }
}

/// A whole object with its metadata, its preconditions checked, in one statement (atomic by
/// itself); `Ok(None)` when it is larger than `at_most` bytes (its bytes are not read then).
/// A read whose `if_none_match` names the object's ETag is answered `NotModified` without
/// loading its bytes (whatever its size): a reader that holds the object already pays for the
/// metadata only.
fn whole_object(
    conn: &Connection,
    path: &Path,
    options: &GetOptions,
    at_most: i64,
) -> Result<Option<(ObjectMeta, Bytes)>> {
    // One ETag, as a cache asks (`*` and lists are left to `check_preconditions`).
    let held = options
        .if_none_match
        .as_deref()
        .filter(|t| *t != "*" && !t.contains(','));
    let row = conn
        .prepare_cached(
            "SELECT size, etag, modified_ms, CASE WHEN size <= ?2 AND etag IS NOT ?3 THEN data END
             FROM objects WHERE path = ?1",
        )
        .and_then(|mut s| {
            s.query_row(params![path.as_ref(), at_most, held], |row| {
                let data = match row.get_ref(3)? {
                    ValueRef::Null => None,
                    value => Some(bytes_of(value)),
                };
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, i64>(2)?,
                    data,
                ))
            })
            .optional()
        })
        .map_err(|e| generic(e.to_string()))?;
    let Some((size, etag, modified, data)) = row else {
        return Err(not_found(path));
    };
    let meta = meta(path.clone(), size, etag, modified);
    options.check_preconditions(&meta)?;
    if size > at_most {
        return Ok(None);
    }
    let data = match data {
        Some(data) => data,
        None if size == 0 => Bytes::new(),
        // The statement left the bytes out for the ETag the read holds, yet the preconditions
        // did not say "not modified": never pass the missing bytes off as the content.
        None => {
            return Err(generic(format!(
                "{path}: the bytes were left out for a version the read holds, but the read \
                 asked for them"
            )))
        }
    };
    Ok(Some((meta, data)))
}

/// An object's metadata, its preconditions checked, in one statement (its bytes are not read).
fn object_meta(conn: &Connection, path: &Path, options: &GetOptions) -> Result<ObjectMeta> {
    let row = conn
        .prepare_cached("SELECT size, etag, modified_ms FROM objects WHERE path = ?1")
        .and_then(|mut s| {
            s.query_row(params![path.as_ref()], |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, i64>(2)?,
                ))
            })
            .optional()
        })
        .map_err(|e| generic(e.to_string()))?;
    let Some((size, etag, modified)) = row else {
        return Err(not_found(path));
    };
    let meta = meta(path.clone(), size, etag, modified);
    options.check_preconditions(&meta)?;
    Ok(meta)
}

/// The key range (exclusive at both ends) of the objects under `prefix` taken as a directory:
/// `prefix/` < key < `prefix0` (`0` follows `/`); everything for no prefix.
fn key_range(prefix: Option<&Path>) -> (String, Option<String>) {
    match prefix.map(|p| p.as_ref()).filter(|p| !p.is_empty()) {
        None => (String::new(), None),
        Some(p) => (format!("{p}/"), Some(format!("{p}0"))),
    }
}

fn meta(location: Path, size: i64, etag: String, modified_ms: i64) -> ObjectMeta {
    ObjectMeta {
        location,
        last_modified: DateTime::<Utc>::from_timestamp_millis(modified_ms).unwrap_or_default(),
        size: size.max(0) as u64,
        e_tag: Some(etag),
        version: None,
    }
}

fn not_found(location: &Path) -> object_store::Error {
    object_store::Error::NotFound {
        path: location.to_string(),
        source: "no such object".into(),
    }
}

#[async_trait]
impl ObjectStore for SqliteStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let mode = match opts.mode {
            PutMode::Overwrite => writer::PutMode::Overwrite,
            PutMode::Create => writer::PutMode::Create,
            PutMode::Update(version) => {
                writer::PutMode::Update(version.e_tag.ok_or_else(|| {
                    object_store::Error::Precondition {
                        path: location.to_string(),
                        source: "an update needs the e-tag of the version it replaces".into(),
                    }
                })?)
            }
        };
        let flush = opts.extensions.get::<crate::SyncedWithNext>().is_none();
        let e_tag = self
            .write_flushing(
                Op::Put {
                    path: location.clone(),
                    data: payload.into(),
                    mode,
                },
                flush,
            )
            .await?;
        Ok(PutResult {
            e_tag,
            version: None,
            extensions: Default::default(),
        })
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        _opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        Ok(Box::new(Upload {
            store: SqliteStore {
                shared: self.shared.clone(),
            },
            location: location.clone(),
            parts: Vec::new(),
        }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let path = location.clone();
        // Whole objects up to a size, and metadata, on the calling thread when a reader is free.
        let small = match (&options.range, options.head) {
            (None, false) => self.get_small(&path, &options),
            (None, true) => self.read_inline(|conn| {
                Some(object_meta(conn, &path, &options).map(|meta| (meta, Bytes::new())))
            }),
            (Some(_), _) => None,
        };
        let found = match small {
            Some(Ok((meta, data))) => {
                let range = 0..meta.size;
                (meta, range, data)
            }
            // An answer about the object (missing, a precondition) stands.
            Some(Err(e)) if !matches!(e, object_store::Error::Generic { .. }) => return Err(e),
            // Anything else on the calling thread (a busy database, which it does not wait
            // for there): again off the async threads, where waiting is allowed.
            _ => self.get_whole_or_part(path, options).await?,
        };
        let (meta, range, data) = found;
        Ok(GetResult {
            payload: GetResultPayload::Stream(
                futures::stream::once(futures::future::ready(Ok(data))).boxed(),
            ),
            meta,
            range,
            attributes: Default::default(),
            extensions: Default::default(),
        })
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let path = location.clone();
        let ranges = ranges.to_vec();
        self.read(move |conn| {
            let tx = conn.transaction().map_err(|e| generic(e.to_string()))?;
            let size = tx
                .prepare_cached("SELECT size FROM objects WHERE path = ?1")
                .and_then(|mut s| {
                    s.query_row(params![path.as_ref()], |r| r.get::<_, i64>(0))
                        .optional()
                })
                .map_err(|e| generic(e.to_string()))?
                .ok_or_else(|| not_found(&path))?;
            ranges
                .iter()
                .map(|r| {
                    let r = object_store::GetRange::Bounded(r.clone())
                        .as_range(size.max(0) as u64)
                        .map_err(|source| object_store::Error::Generic {
                            store: "Sqlite",
                            source: Box::new(source),
                        })?;
                    read_range(&tx, &path, &r)
                })
                .collect()
        })
        .await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let shared = self.shared.clone();
        // Many deletes in flight at once, so that they share commits.
        locations
            .map(move |location| {
                let store = SqliteStore {
                    shared: shared.clone(),
                };
                async move {
                    let location = location?;
                    store
                        .write(Op::Delete {
                            path: location.clone(),
                        })
                        .await?;
                    Ok(location)
                }
            })
            .buffered(64)
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.list_after(prefix, None)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.list_after(prefix, Some(offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let root = Path::default();
        let base = prefix.unwrap_or(&root);
        let mut common_prefixes = std::collections::BTreeSet::new();
        let mut objects = Vec::new();
        let mut all = self.list(prefix);
        while let Some(object) = all.next().await {
            let object = object?;
            let common = {
                let Some(mut parts) = object.location.prefix_match(base) else {
                    continue;
                };
                let Some(first) = parts.next() else {
                    continue;
                };
                parts.next().is_some().then(|| base.clone().join(first))
            };
            match common {
                Some(common) => {
                    common_prefixes.insert(common);
                }
                None => objects.push(object),
            }
        }
        Ok(ListResult {
            objects,
            common_prefixes: common_prefixes.into_iter().collect(),
            extensions: Default::default(),
        })
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        let create = matches!(options.mode, CopyMode::Create);
        self.copy(from, to, create, false, true).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        let create = matches!(options.target_mode, RenameTargetMode::Create);
        let flush = options.extensions.get::<crate::SyncedWithNext>().is_none();
        self.copy(from, to, create, true, flush).await
    }
}

/// The bytes of `range` of the object at `path` (which the caller found, in `tx`).
fn read_range(tx: &rusqlite::Transaction<'_>, path: &Path, range: &Range<u64>) -> Result<Bytes> {
    let len = range.end.saturating_sub(range.start);
    let mut statement = tx
        .prepare_cached("SELECT substr(data, ?2, ?3) FROM objects WHERE path = ?1")
        .map_err(|e| generic(e.to_string()))?;
    statement
        .query_row(
            params![path.as_ref(), range.start as i64 + 1, len as i64],
            |row| Ok(bytes_of(row.get_ref(0)?)),
        )
        .optional()
        .map_err(|e| generic(e.to_string()))?
        .ok_or_else(|| not_found(path))
}

/// The bytes of a stored value: `substr` of an empty blob is an empty text (or null), not a
/// blob.
fn bytes_of(value: ValueRef<'_>) -> Bytes {
    match value {
        ValueRef::Blob(bytes) | ValueRef::Text(bytes) => Bytes::copy_from_slice(bytes),
        _ => Bytes::new(),
    }
}

/// A multipart upload: parts are kept in memory and written as one object on completion.
struct Upload {
    store: SqliteStore,
    location: Path,
    parts: Vec<PutPayload>,
}

impl std::fmt::Debug for Upload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upload")
            .field("location", &self.location)
            .field("parts", &self.parts.len())
            .finish()
    }
}

#[async_trait]
impl MultipartUpload for Upload {
    fn put_part(&mut self, payload: PutPayload) -> UploadPart {
        self.parts.push(payload);
        Box::pin(futures::future::ready(Ok(())))
    }

    async fn complete(&mut self) -> Result<PutResult> {
        let size = self.parts.iter().map(|p| p.content_length()).sum();
        let mut data = Vec::with_capacity(size);
        for part in self.parts.drain(..) {
            for chunk in part.iter() {
                data.extend_from_slice(chunk);
            }
        }
        self.store
            .put_opts(
                &self.location,
                PutPayload::from(data),
                PutOptions::default(),
            )
            .await
    }

    async fn abort(&mut self) -> Result<()> {
        self.parts.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests;
