//! A local-filesystem object store that makes every write durable before it reports success.
//!
//! `object_store`'s local backend writes to a temporary file and renames it into place, but
//! does not fsync: after a power cut a batch the caller saw committed can be gone, or the
//! rename can be lost. This wrapper fsyncs the object and then its directory (which holds the
//! rename) once the write returns, before the caller learns that it succeeded.
//!
//! Contract: a successful `put_opts`/`copy`/`rename` means the object's bytes and its name are
//! on stable storage. Reads and listings are passed through unchanged.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

/// The local filesystem store with fsync on write.
#[derive(Debug)]
pub struct SyncedLocalStore {
    inner: LocalFileSystem,
    root: PathBuf,
    syncs: Arc<AtomicU64>,
}

impl SyncedLocalStore {
    /// The store rooted at `root` (which must exist).
    pub fn new(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        Ok(Self {
            inner: LocalFileSystem::new_with_prefix(&root)?,
            root,
            syncs: Arc::new(AtomicU64::new(0)),
        })
    }

    /// How many fsync calls were made (objects and directories).
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Fsyncs the file at `location` and its directory.
    async fn sync(&self, location: &Path) -> Result<()> {
        let file = self.root.join(location.as_ref());
        let syncs = self.syncs.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::File::open(&file)?.sync_all()?;
            syncs.fetch_add(1, Ordering::Relaxed);
            if let Some(dir) = file.parent() {
                std::fs::File::open(dir)?.sync_all()?;
                syncs.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        })
        .await
        .map_err(|e| object_store::Error::Generic {
            store: "SyncedLocal",
            source: Box::new(e),
        })?
        .map_err(|e| object_store::Error::Generic {
            store: "SyncedLocal",
            source: Box::new(e),
        })
    }
}

impl std::fmt::Display for SyncedLocalStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SyncedLocal({})", self.root.display())
    }
}

#[async_trait]
impl ObjectStore for SyncedLocalStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let result = self.inner.put_opts(location, payload, opts).await?;
        self.sync(location).await?;
        Ok(result)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await?;
        self.sync(to).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.inner.rename_opts(from, to, options).await?;
        self.sync(to).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::{ObjectStoreExt as _, PutMode};

    #[tokio::test]
    async fn every_write_is_synced_with_its_directory_before_it_returns() {
        let dir = tempfile::tempdir().unwrap();
        let store = SyncedLocalStore::new(dir.path()).unwrap();
        let path = Path::from("tenants/t/conversations/c/record/00000000000000000000");
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        store
            .put_opts(&path, PutPayload::from_static(b"batch"), opts)
            .await
            .unwrap();
        // The object and its directory: two fsyncs, both done when put returns.
        assert_eq!(store.syncs(), 2);
        assert_eq!(
            std::fs::read(dir.path().join(path.as_ref())).unwrap(),
            b"batch"
        );
        // A refused create writes and syncs nothing.
        let again = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        assert!(store
            .put_opts(&path, PutPayload::from_static(b"other"), again)
            .await
            .is_err());
        assert_eq!(store.syncs(), 2);
        store
            .put(&Path::from("a/b"), PutPayload::from_static(b"x"))
            .await
            .unwrap();
        assert_eq!(store.syncs(), 4);
    }

    #[tokio::test]
    async fn a_record_append_is_synced_before_it_returns() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SyncedLocalStore::new(dir.path()).unwrap());
        let prefix = crate::ConversationPrefix::new(
            "acme".parse().unwrap(),
            turnpike_schemas::ConversationId::new(),
        );
        let record = crate::Record::new(store.clone(), prefix.clone());
        let signer = crate::RecordSigner::from_seed([3; 32]);
        let opened = turnpike_schemas::EntryBody::ConversationOpened(
            turnpike_schemas::entry::ConversationOpened {
                tenant: "acme".parse().unwrap(),
                owner: "local:me".parse().unwrap(),
                app: "a".parse().unwrap(),
                agent: "g".parse().unwrap(),
                at_ms: 1,
            },
        );
        let head = record.head().await.unwrap();
        let before = store.syncs();
        record.append(&signer, &head, &[opened]).await.unwrap();
        // The batch and its directory were synced by the time append returned.
        assert!(store.syncs() >= before + 2);
        assert!(dir.path().join(prefix.record_batch(0).as_ref()).is_file());
    }
}
