//! An object store that stops writing after a set number of writes, as a process killed in
//! the middle of a multi-object operation would: every write (put, copy, rename, delete) past
//! the budget fails and changes nothing. Reads always work.

use std::ops::Range;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt as _;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

/// Forwards to a real store until its write budget is spent.
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    /// Writes left.
    left: Arc<AtomicI64>,
}

impl FaultyStore {
    /// A store that allows `writes` writes, then fails every write.
    pub fn new(inner: Arc<dyn ObjectStore>, writes: u64) -> Arc<Self> {
        Arc::new(Self {
            inner,
            left: Arc::new(AtomicI64::new(writes as i64)),
        })
    }

    /// Whether the budget ran out (some write failed).
    pub fn cut(&self) -> bool {
        self.left.load(Ordering::SeqCst) < 0
    }

    fn write(&self) -> Result<()> {
        if self.left.fetch_sub(1, Ordering::SeqCst) <= 0 {
            return Err(killed());
        }
        Ok(())
    }
}

impl std::fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Faulty({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.write()?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.write()?;
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
        // Each deletion spends one write; past the budget it fails without reaching the store.
        let left = self.left.clone();
        let gated = locations
            .map(move |p| {
                p.and_then(|p| {
                    if left.fetch_sub(1, Ordering::SeqCst) <= 0 {
                        Err(killed())
                    } else {
                        Ok(p)
                    }
                })
            })
            .boxed();
        self.inner.delete_stream(gated)
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
        self.write()?;
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.write()?;
        self.inner.rename_opts(from, to, options).await
    }
}

fn killed() -> object_store::Error {
    object_store::Error::Generic {
        store: "faulty",
        source: "the process was killed here".into(),
    }
}
