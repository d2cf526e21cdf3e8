//! Opening an object store from a location.
//!
//! - `memory://` — in-memory (tests);
//! - a path: the local store in that directory, created if absent, in the layout it already
//!   holds ([`LocalLayout::of`]): a new or empty directory gets one SQLite database, a directory
//!   of object files (written before the database existed) stays a directory of files;
//!   `sqlite://` and `file://` open only a directory of that layout (or a new one);
//! - `sqlite:///path` (or `sqlite://relative/path`) — one SQLite database in that directory: a
//!   row per object and group commit instead of a file per object; several processes may share
//!   it (see [`crate::sqlite_store`]);
//! - `file:///path` — a file per object in that directory;
//! - `s3://bucket[/prefix]` — any S3-compatible store, configured by the usual `AWS_*`
//!   environment variables (`AWS_ENDPOINT`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//!   `AWS_REGION`, `AWS_ALLOW_HTTP`). Create-if-absent uses `If-None-Match: *`.

use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreExt as _};

use crate::error::{Error, ErrorKind, Result};

/// A put's or a rename's option (in [`object_store::PutOptions::extensions`] or
/// [`object_store::RenameOptions::extensions`]): the write need not be on stable storage when
/// it returns, only no later than the next write of the same store that is. For a write that
/// matters after a power cut only once the write that follows it is there (the open-turn mark
/// before a drain's first batch one, a turn's log under its attempt before the batch two that
/// names it), or whose loss is mended like a crash's (a log's promotion, which the mark cleared
/// after it leads a sweep to finish; a context snapshot, a cache). The SQLite store commits
/// such a write without flushing its log when nothing else in the commit needs a flush: its
/// log is one sequence, so the next commit that writes to the log and flushes it (or a
/// checkpoint that copies the log) takes it to disk first. Other stores ignore it and write as
/// durably as ever; a killed process loses nothing either way (the write is in the OS).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncedWithNext;

/// [`object_store::PutOptions`] for `mode`, asking for [`SyncedWithNext`].
pub(crate) fn synced_with_next(mode: object_store::PutMode) -> object_store::PutOptions {
    let mut opts = object_store::PutOptions {
        mode,
        ..Default::default()
    };
    opts.extensions.insert(SyncedWithNext);
    opts
}

/// Whether an object exists at `path` (one HEAD request); `what` names the read in errors.
pub(crate) async fn exists(
    store: &dyn ObjectStore,
    path: &object_store::path::Path,
    what: &str,
) -> Result<bool> {
    match store.head(path).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(e) => Err(Error::store(what, e)),
    }
}

/// Opens the store at `location`, without fsync on the local filesystem (see
/// [`open_store_with`]).
/// Deletes every object under `dir` (gone already: fine), in bulk where the store can (S3
/// deletes up to 1,000 keys per request); returns how many there were. `what` names them in
/// an error.
pub(crate) async fn delete_under(
    store: &dyn ObjectStore,
    dir: &object_store::path::Path,
    what: &str,
) -> Result<usize> {
    use futures::{StreamExt as _, TryStreamExt as _};
    let paths: Vec<object_store::path::Path> = store
        .list(Some(dir))
        .map_ok(|m| m.location)
        .try_collect()
        .await
        .map_err(|e| Error::store(&format!("listing {what}"), e))?;
    let n = paths.len();
    let locations = futures::stream::iter(paths.into_iter().map(Ok)).boxed();
    let results: Vec<_> = store.delete_stream(locations).collect().await;
    for result in results {
        match result {
            Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(Error::store(&format!("deleting {what}"), e)),
        }
    }
    Ok(n)
}

pub fn open_store(location: &str) -> Result<Arc<dyn ObjectStore>> {
    open_store_with(location, false)
}

/// Opens the store at `location`. With `fsync`, a local filesystem store syncs every object and
/// its directory before a write returns (a committed batch survives a power cut); other
/// backends ignore it (their writes are durable when acknowledged).
pub fn open_store_with(location: &str, fsync: bool) -> Result<Arc<dyn ObjectStore>> {
    if location == "memory://" {
        return Ok(Arc::new(InMemory::new()));
    }
    if let Some(rest) = location.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("{location:?}: the bucket is missing (s3://bucket[/prefix])"),
            ));
        }
        let s3 = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .build()
            .map_err(|e| Error::store(&format!("configuring S3 for {location:?}"), e))?;
        let prefix = prefix.trim_matches('/');
        if prefix.is_empty() {
            return Ok(Arc::new(s3));
        }
        return Ok(Arc::new(PrefixStore::new(s3, prefix)));
    }
    if let Some(path) = location.strip_prefix("sqlite://") {
        return open_local(path, Some(LocalLayout::Sqlite), fsync);
    }
    if let Some(path) = location.strip_prefix("file://") {
        return open_local(path, Some(LocalLayout::Files), fsync);
    }
    if location.contains("://") {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("{location:?}: unsupported store (use a path, file://, sqlite://, s3:// or memory://)"),
        ));
    }
    open_local(location, None, fsync)
}

/// How a local store keeps its objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalLayout {
    /// A file per object, under directories named by the key's segments.
    Files,
    /// One SQLite database ([`crate::sqlite_store::FILE_NAME`]) in the directory.
    Sqlite,
}

/// An empty directory a store opened as files gets, so that the layout is known even before
/// the first object is written (a directory is never listed as an object).
pub const FILES_MARKER: &str = ".files-layout";

impl std::fmt::Display for LocalLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Files => "a file per object",
            Self::Sqlite => "one SQLite database",
        })
    }
}

impl LocalLayout {
    /// The layout the directory `dir` holds: `None` for a new or empty one. The database where
    /// its file is; files where the directory was opened as files ([`FILES_MARKER`]) or holds
    /// anything else (a store written before the database existed). A directory holding both
    /// the database and anything else is refused: one of them would be invisible.
    pub fn of(dir: &std::path::Path) -> Result<Option<Self>> {
        let unreadable = |e: std::io::Error| {
            Error::with_source(
                ErrorKind::Store,
                format!("cannot read the store directory {}: {e}", dir.display()),
                e,
            )
        };
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(unreadable(e)),
        };
        let (mut database, mut other) = (false, None);
        for entry in entries {
            let name = entry.map_err(unreadable)?.file_name();
            let name = name.to_string_lossy();
            match name.strip_prefix(crate::sqlite_store::FILE_NAME) {
                Some("") => database = true,
                // The database's log, shared memory and journal.
                Some("-wal" | "-shm" | "-journal") => {}
                _ => other = Some(name.into_owned()),
            }
        }
        match (database, other) {
            (true, None) => Ok(Some(Self::Sqlite)),
            (true, Some(other)) => Err(Error::new(
                ErrorKind::Store,
                format!(
                    "the store directory {} holds both a database and {other:?}: one of the two \
                     would be invisible, so it is not opened",
                    dir.display()
                ),
            )),
            (false, Some(_)) => Ok(Some(Self::Files)),
            (false, None) => Ok(None),
        }
    }
}

/// Holds an exclusive lock on a directory (released when dropped): the layout of a local
/// store is looked at and, for a new one, chosen under it, so that two processes opening one
/// new directory at once cannot choose two layouts.
struct DirectoryLock {
    _held: std::fs::File,
}

impl DirectoryLock {
    fn take(dir: &str) -> Result<Self> {
        use std::os::fd::AsRawFd as _;
        let failed = |e: std::io::Error| {
            Error::with_source(
                ErrorKind::Store,
                format!("cannot lock the store directory {dir:?}: {e}"),
                e,
            )
        };
        let file = std::fs::File::open(dir).map_err(failed)?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(failed(std::io::Error::last_os_error()));
        }
        Ok(Self { _held: file })
    }
}

/// Opens the local store in directory `path` (created if absent). With `wanted`, the
/// directory must hold that layout or nothing yet; without, it is opened in the layout it
/// holds, and a new one gets the database. With `fsync` a write returns only once it is on
/// stable storage.
pub fn open_local(
    path: &str,
    wanted: Option<LocalLayout>,
    fsync: bool,
) -> Result<Arc<dyn ObjectStore>> {
    create_dir(path)?;
    let _lock = DirectoryLock::take(path)?;
    let layout = match (LocalLayout::of(std::path::Path::new(path))?, wanted) {
        (Some(found), Some(wanted)) if found != wanted => {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("the store {path:?} holds {found}, not {wanted}: it is opened as it is or not at all"),
            ))
        }
        (Some(found), _) => found,
        (None, wanted) => wanted.unwrap_or(LocalLayout::Sqlite),
    };
    if layout == LocalLayout::Sqlite {
        let store = crate::sqlite_store::SqliteStore::open(path, fsync)
            .map_err(|e| Error::store(&format!("opening {path:?}"), e))?;
        return Ok(Arc::new(store));
    }
    create_dir(&format!("{path}/{FILES_MARKER}"))?;
    if fsync {
        let synced = crate::synced::SyncedLocalStore::new(path)
            .map_err(|e| Error::store(&format!("opening {path:?}"), e))?;
        return Ok(Arc::new(synced));
    }
    let local = LocalFileSystem::new_with_prefix(path)
        .map_err(|e| Error::store(&format!("opening {path:?}"), e))?;
    Ok(Arc::new(local))
}

fn create_dir(path: &str) -> Result<()> {
    std::fs::create_dir_all(path).map_err(|e| {
        Error::with_source(
            ErrorKind::Store,
            format!("cannot create the data directory {path:?}: {e}"),
            e,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::path::Path;

    #[tokio::test]
    async fn a_new_directory_gets_the_database_and_a_directory_of_files_stays_files() {
        let root = tempfile::tempdir().unwrap();
        let fresh = root.path().join("fresh");
        assert_eq!(LocalLayout::of(&fresh).unwrap(), None);
        std::fs::create_dir(&fresh).unwrap();
        assert_eq!(LocalLayout::of(&fresh).unwrap(), None);

        // A store written as files before the database existed is read as files, as it was.
        let old = root.path().join("old");
        let files = open_local(old.to_str().unwrap(), Some(LocalLayout::Files), false).unwrap();
        // Files from the start, before anything is written.
        assert_eq!(LocalLayout::of(&old).unwrap(), Some(LocalLayout::Files));
        files
            .put(&Path::from("tenants/t/x"), "before".into())
            .await
            .unwrap();
        assert_eq!(LocalLayout::of(&old).unwrap(), Some(LocalLayout::Files));
        let reopened = open_store(old.to_str().unwrap()).unwrap();
        let got = reopened.get(&Path::from("tenants/t/x")).await.unwrap();
        assert_eq!(&got.bytes().await.unwrap()[..], b"before");
        assert!(!old.join(crate::sqlite_store::FILE_NAME).exists());
        // A store of files from before the marker existed stays files too.
        std::fs::remove_dir(old.join(FILES_MARKER)).unwrap();
        assert_eq!(LocalLayout::of(&old).unwrap(), Some(LocalLayout::Files));

        // A path opens the database in a new directory, and again once it holds objects.
        let db = open_store(fresh.to_str().unwrap()).unwrap();
        db.put(&Path::from("a/b"), "in the database".into())
            .await
            .unwrap();
        assert!(fresh.join(crate::sqlite_store::FILE_NAME).is_file());
        assert!(!fresh.join("a").exists());
        assert_eq!(LocalLayout::of(&fresh).unwrap(), Some(LocalLayout::Sqlite));
        let again = open_store(fresh.to_str().unwrap()).unwrap();
        let got = again.get(&Path::from("a/b")).await.unwrap();
        assert_eq!(&got.bytes().await.unwrap()[..], b"in the database");
    }

    #[tokio::test]
    async fn a_store_is_never_opened_in_a_layout_it_does_not_hold() {
        let root = tempfile::tempdir().unwrap();
        let files = root.path().join("files");
        let files = files.to_str().unwrap();
        open_local(files, Some(LocalLayout::Files), false).unwrap();
        let refused = open_store(&format!("sqlite://{files}")).err().unwrap();
        assert_eq!(refused.kind(), ErrorKind::InvalidInput, "{refused}");
        assert!(!std::path::Path::new(files)
            .join(crate::sqlite_store::FILE_NAME)
            .exists());

        let db = root.path().join("db");
        let db = db.to_str().unwrap();
        open_local(db, None, false)
            .unwrap()
            .put(&Path::from("x"), "y".into())
            .await
            .unwrap();
        let refused = open_store(&format!("file://{db}")).err().unwrap();
        assert_eq!(refused.kind(), ErrorKind::InvalidInput, "{refused}");
        assert!(!std::path::Path::new(db).join(FILES_MARKER).exists());

        // A directory holding both is opened as neither.
        std::fs::create_dir(std::path::Path::new(db).join("tenants")).unwrap();
        let mixed = open_store(db).err().unwrap();
        assert_eq!(mixed.kind(), ErrorKind::Store, "{mixed}");
        assert!(mixed.to_string().contains("both"), "{mixed}");
    }

    #[test]
    fn processes_opening_one_new_directory_at_once_choose_one_layout() {
        // Threads stand for processes: the lock is a flock on the directory, which two
        // descriptors of one process contend for just as two processes do.
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("new");
        let dir = dir.to_str().unwrap().to_owned();
        let opened: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|i| {
                    let dir = dir.clone();
                    scope.spawn(move || {
                        let wanted = (i % 2 == 0).then_some(LocalLayout::Files);
                        open_local(&dir, wanted, false).is_ok()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let layout = LocalLayout::of(std::path::Path::new(&dir))
            .unwrap()
            .unwrap();
        // Whatever came first decided; every open that succeeded agrees with it, and the
        // directory never holds both.
        assert!(opened.iter().any(|ok| *ok));
        for (i, ok) in opened.iter().enumerate() {
            let wanted_files = i % 2 == 0;
            if layout == LocalLayout::Sqlite && wanted_files {
                assert!(
                    !ok,
                    "open {i} asked for files in a database directory and got them"
                );
            }
        }
    }

    #[test]
    fn an_unknown_scheme_is_refused() {
        let err = open_store("ftp://somewhere").err().unwrap();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }
}
