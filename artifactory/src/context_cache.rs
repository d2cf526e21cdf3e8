//! Parsed context snapshots, remembered per process: the worker that promoted a turn's
//! snapshot, or read it before, rebuilds the next turn's context without parsing (the bulk of a
//! rebuild: hundreds of rows of JSON).
//!
//! Contract: an entry is only ever used for the exact object it came from — the same key and
//! the same ETag (and version, where the store has versions), as the store reports them on the
//! write or the read. A store that reports no ETag is never cached. An object replaced at the
//! same key gets another ETag and misses — except on the plain file system, whose ETags are
//! made of inode, modification time and size: an object deleted and written again at the same
//! size within one tick of the file system's clock, on a reused inode, keeps its ETag. Workers
//! write snapshots once per key and attempt, so this needs a replacement no worker makes; the
//! SQLite store and S3 give every write a new ETag. Nothing here is needed for correctness: a miss reads
//! and parses as before, and the memory is bounded ([`CAPACITY`] snapshots, least recently used
//! first out).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use object_store::{ObjectMeta, PutResult};
use turnpike_schemas::Row;

/// The most snapshots remembered.
pub const CAPACITY: usize = 64;

/// What identifies one stored object: its key and the store's ETag (and version) for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ObjectVersion {
    path: String,
    e_tag: String,
    version: Option<String>,
}

impl ObjectVersion {
    /// The object a read found; `None` when the store gave no ETag.
    pub(crate) fn read(meta: &ObjectMeta) -> Option<Self> {
        Some(Self {
            path: meta.location.to_string(),
            e_tag: meta.e_tag.clone()?,
            version: meta.version.clone(),
        })
    }

    /// The ETag: what a read that holds this version sends as `if_none_match`.
    pub(crate) fn e_tag(&self) -> &str {
        &self.e_tag
    }

    /// The object a write made; `None` when the store gave no ETag.
    pub(crate) fn written(path: &object_store::path::Path, put: &PutResult) -> Option<Self> {
        Some(Self {
            path: path.to_string(),
            e_tag: put.e_tag.clone()?,
            version: put.version.clone(),
        })
    }
}

/// Parsed snapshots' rows by the object they came from.
#[derive(Default)]
pub(crate) struct ContextCache {
    inner: Mutex<Lru>,
}

#[derive(Default)]
struct Lru {
    entries: HashMap<ObjectVersion, (u64, Arc<Vec<Row>>)>,
    clock: u64,
}

impl std::fmt::Debug for ContextCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.inner.lock().map(|l| l.entries.len()).unwrap_or(0);
        f.debug_struct("ContextCache").field("entries", &n).finish()
    }
}

impl ContextCache {
    pub(crate) fn get(&self, version: &ObjectVersion) -> Option<Arc<Vec<Row>>> {
        let mut lru = self.inner.lock().ok()?;
        lru.clock += 1;
        let now = lru.clock;
        let (used, snapshot) = lru.entries.get_mut(version)?;
        *used = now;
        Some(snapshot.clone())
    }

    /// The version remembered for the object at `path` (at most one per key).
    pub(crate) fn known(&self, path: &str) -> Option<ObjectVersion> {
        let lru = self.inner.lock().ok()?;
        lru.entries.keys().find(|v| v.path == path).cloned()
    }

    pub(crate) fn put(&self, version: ObjectVersion, snapshot: Arc<Vec<Row>>) {
        let Ok(mut lru) = self.inner.lock() else {
            return;
        };
        lru.clock += 1;
        let now = lru.clock;
        // The same key with other bytes: the old parse is of no use any more.
        lru.entries.retain(|v, _| v.path != version.path);
        if lru.entries.len() >= CAPACITY {
            if let Some(oldest) = lru
                .entries
                .iter()
                .min_by_key(|(_, (used, _))| *used)
                .map(|(v, _)| v.clone())
            {
                lru.entries.remove(&oldest);
            }
        }
        lru.entries.insert(version, (now, snapshot));
    }

    /// Forgets everything (a cold rebuild, for measurements).
    pub(crate) fn clear(&self) {
        if let Ok(mut lru) = self.inner.lock() {
            lru.entries.clear();
        }
    }
}
