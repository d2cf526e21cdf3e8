//! An object store that counts reads and logs writes, for tests of bounded cost. It forwards
//! everything to a real store.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

/// Counts object reads (gets and range gets) and listings, and keeps each listing's prefix and
/// every write.
#[derive(Debug)]
pub struct CountingStore {
    inner: Arc<dyn ObjectStore>,
    gets: AtomicUsize,
    lists: AtomicUsize,
    listed: Mutex<Vec<String>>,
    /// Every write since the last reset, in order: `put PATH`, `delete PATH`, `copy FROM TO`,
    /// `rename FROM TO`.
    written: Arc<Mutex<Vec<String>>>,
}

impl CountingStore {
    pub fn new(inner: Arc<dyn ObjectStore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            gets: AtomicUsize::new(0),
            lists: AtomicUsize::new(0),
            listed: Mutex::new(Vec::new()),
            written: Arc::default(),
        })
    }

    /// Objects read since the last reset.
    pub fn gets(&self) -> usize {
        self.gets.load(Ordering::SeqCst)
    }

    /// Listings since the last reset.
    pub fn lists(&self) -> usize {
        self.lists.load(Ordering::SeqCst)
    }

    /// The prefixes listed since the last reset, in order (`""` for the whole store). A
    /// process's background loops (webhook and schedule dispatch) list on their own clock; a
    /// test of one operation's cost counts the listings under that operation's prefixes.
    pub fn listed(&self) -> Vec<String> {
        self.listed.lock().expect("listing log").clone()
    }

    /// The writes since the last reset, in order (`put PATH`, `delete PATH`, `copy FROM TO`,
    /// `rename FROM TO`).
    pub fn written(&self) -> Vec<String> {
        self.written.lock().expect("write log").clone()
    }

    fn written_log(&self) -> Arc<Mutex<Vec<String>>> {
        self.written.clone()
    }

    fn wrote(&self, what: &str, path: &dyn std::fmt::Display) {
        self.written
            .lock()
            .expect("write log")
            .push(format!("{what} {path}"));
    }

    pub fn reset(&self) {
        self.written.lock().expect("write log").clear();
        self.gets.store(0, Ordering::SeqCst);
        self.lists.store(0, Ordering::SeqCst);
        self.listed.lock().expect("listing log").clear();
    }

    fn listing(&self, prefix: Option<&Path>) {
        self.lists.fetch_add(1, Ordering::SeqCst);
        self.listed
            .lock()
            .expect("listing log")
            .push(prefix.map(ToString::to_string).unwrap_or_default());
    }
}

impl std::fmt::Display for CountingStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Counting({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for CountingStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.wrote("put", &location);
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        use futures::StreamExt as _;
        let this = self.written_log();
        let locations = locations
            .inspect(move |p| {
                if let Ok(p) = p {
                    this.lock().expect("write log").push(format!("delete {p}"));
                }
            })
            .boxed();
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.listing(prefix);
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.listing(prefix);
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.listing(prefix);
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.wrote("copy", &format!("{from} {to}"));
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.wrote("rename", &format!("{from} {to}"));
        self.inner.rename_opts(from, to, options).await
    }
}
