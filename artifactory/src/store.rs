//! Opening an object store from a location.
//!
//! - `memory://` — in-memory (tests);
//! - a path: the local store in that directory, created if absent, in the layout it already
//!   holds ([`LocalLayout::of`]): a new or empty directory gets one SQLite database, a directory
//!   of object files (written before the database existed) stays a directory of files;
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
        return open_local(path, LocalLayout::Sqlite, fsync);
    }
    if let Some(path) = location.strip_prefix("file://") {
        return open_local(path, LocalLayout::Files, fsync);
    }
    if location.contains("://") {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("{location:?}: unsupported store (use a path, file://, sqlite://, s3:// or memory://)"),
        ));
    }
    open_local(
        location,
        LocalLayout::of(std::path::Path::new(location))?,
        fsync,
    )
}

/// How a local store keeps its objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalLayout {
    /// A file per object, under directories named by the key's segments.
    Files,
    /// One SQLite database ([`crate::sqlite_store::FILE_NAME`]) in the directory.
    Sqlite,
}

impl LocalLayout {
    /// The layout the directory `dir` holds: the database where it is; files where the
    /// directory was opened as files ([`FILES_MARKER`]) or holds anything else (a store written
    /// before the database existed); the database for a new or empty directory.
    pub fn of(dir: &std::path::Path) -> Result<Self> {
        if dir.join(crate::sqlite_store::FILE_NAME).exists() {
            return Ok(Self::Sqlite);
        }
        if dir.join(FILES_MARKER).exists() {
            return Ok(Self::Files);
        }
        match std::fs::read_dir(dir) {
            Ok(mut entries) => Ok(if entries.next().is_some() {
                Self::Files
            } else {
                Self::Sqlite
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::Sqlite),
            Err(e) => Err(Error::with_source(
                ErrorKind::Store,
                format!("cannot read the store directory {}: {e}", dir.display()),
                e,
            )),
        }
    }
}

/// An empty directory a store opened as files gets, so that a later [`LocalLayout::of`] finds
/// files even before the first object is written (a directory is never listed as an object).
pub const FILES_MARKER: &str = ".files-layout";

/// Opens the local store in directory `path` (created if absent) with `layout`. With `fsync`
/// a write returns only once it is on stable storage.
pub fn open_local(path: &str, layout: LocalLayout, fsync: bool) -> Result<Arc<dyn ObjectStore>> {
    create_dir(path)?;
    if layout == LocalLayout::Files {
        create_dir(&format!("{path}/{FILES_MARKER}"))?;
    }
    if layout == LocalLayout::Sqlite {
        let store = crate::sqlite_store::SqliteStore::open(path, fsync)
            .map_err(|e| Error::store(&format!("opening {path:?}"), e))?;
        return Ok(Arc::new(store));
    }
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
        assert_eq!(LocalLayout::of(&fresh).unwrap(), LocalLayout::Sqlite);
        std::fs::create_dir(&fresh).unwrap();
        assert_eq!(LocalLayout::of(&fresh).unwrap(), LocalLayout::Sqlite);

        // A store written as files before the database existed is read as files, as it was.
        let old = root.path().join("old");
        let files = open_local(old.to_str().unwrap(), LocalLayout::Files, false).unwrap();
        // Files from the start, before anything is written.
        assert_eq!(LocalLayout::of(&old).unwrap(), LocalLayout::Files);
        files
            .put(&Path::from("tenants/t/x"), "before".into())
            .await
            .unwrap();
        assert_eq!(LocalLayout::of(&old).unwrap(), LocalLayout::Files);
        let reopened = open_store(old.to_str().unwrap()).unwrap();
        let got = reopened.get(&Path::from("tenants/t/x")).await.unwrap();
        assert_eq!(&got.bytes().await.unwrap()[..], b"before");
        assert!(!old.join(crate::sqlite_store::FILE_NAME).exists());
        // A store of files from before the marker existed stays files too.
        std::fs::remove_dir(old.join(FILES_MARKER)).unwrap();
        assert_eq!(LocalLayout::of(&old).unwrap(), LocalLayout::Files);

        // A path opens the database in a new directory, and again once it holds objects.
        let db = open_store(fresh.to_str().unwrap()).unwrap();
        db.put(&Path::from("a/b"), "in the database".into())
            .await
            .unwrap();
        assert!(fresh.join(crate::sqlite_store::FILE_NAME).is_file());
        assert!(!fresh.join("a").exists());
        assert_eq!(LocalLayout::of(&fresh).unwrap(), LocalLayout::Sqlite);
        let again = open_store(fresh.to_str().unwrap()).unwrap();
        let got = again.get(&Path::from("a/b")).await.unwrap();
        assert_eq!(&got.bytes().await.unwrap()[..], b"in the database");
    }

    #[test]
    fn an_unknown_scheme_is_refused() {
        let err = open_store("ftp://somewhere").err().unwrap();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }
}
