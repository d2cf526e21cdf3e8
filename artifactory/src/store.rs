//! Opening an object store from a location.
//!
//! - `memory://` — in-memory (tests);
//! - a path or `file:///path` — the local filesystem (the embedded default), created if absent;
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
    let path = match location.strip_prefix("file://") {
        Some(path) => path,
        None if location.contains("://") => {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "{location:?}: unsupported store (use a path, file://, s3:// or memory://)"
                ),
            ))
        }
        None => location,
    };
    std::fs::create_dir_all(path).map_err(|e| {
        Error::with_source(
            ErrorKind::Store,
            format!("cannot create the data directory {path:?}: {e}"),
            e,
        )
    })?;
    if fsync {
        let synced = crate::synced::SyncedLocalStore::new(path)
            .map_err(|e| Error::store(&format!("opening {path:?}"), e))?;
        return Ok(Arc::new(synced));
    }
    let local = LocalFileSystem::new_with_prefix(path)
        .map_err(|e| Error::store(&format!("opening {path:?}"), e))?;
    Ok(Arc::new(local))
}
