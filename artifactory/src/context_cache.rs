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
//! write a snapshot once per key (create-only), so this needs a replacement no worker makes; the
//! SQLite store and S3 give every write a new ETag. Nothing here is needed for correctness: a miss reads
//! and parses as before, and the memory is bounded: one snapshot per conversation (only the
//! latest is ever read again), at most [`CAPACITY`] snapshots and [`MAX_ROWS`] rows in all, least
//! recently used first out — a snapshot grows with its conversation, so a count alone bounded
//! nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use object_store::{ObjectMeta, PutResult};
use turnpike_schemas::Row;

/// The most snapshots remembered.
pub const CAPACITY: usize = 64;
/// The most rows remembered in all (a row is a few hundred bytes parsed); a snapshot with more
/// is not remembered.
pub const MAX_ROWS: usize = 50_000;

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
    /// The rows of every entry.
    rows: usize,
}

/// The conversation an object belongs to: its key up to its turns.
fn conversation_of(path: &str) -> &str {
    path.split_once("/turns/").map_or(path, |(c, _)| c)
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
        // The same key with other bytes, or an earlier turn of the same conversation: the old
        // parse is of no use any more (the next turn reads this one).
        let conversation = conversation_of(&version.path).to_owned();
        lru.entries
            .retain(|v, _| conversation_of(&v.path) != conversation);
        lru.rows = lru.entries.values().map(|(_, s)| s.len()).sum();
        if snapshot.len() > MAX_ROWS {
            return;
        }
        while lru.entries.len() >= CAPACITY || lru.rows + snapshot.len() > MAX_ROWS {
            let Some(oldest) = lru
                .entries
                .iter()
                .min_by_key(|(_, (used, _))| *used)
                .map(|(v, _)| v.clone())
            else {
                break;
            };
            if let Some((_, gone)) = lru.entries.remove(&oldest) {
                lru.rows -= gone.len();
            }
        }
        lru.rows += snapshot.len();
        lru.entries.insert(version, (now, snapshot));
    }

    /// Forgets what is remembered of the object at `path` (it was deleted).
    pub(crate) fn forget(&self, path: &str) {
        if let Ok(mut lru) = self.inner.lock() {
            lru.entries.retain(|v, _| v.path != path);
            lru.rows = lru.entries.values().map(|(_, s)| s.len()).sum();
        }
    }

    /// Forgets everything (a cold rebuild, for measurements).
    pub(crate) fn clear(&self) {
        if let Ok(mut lru) = self.inner.lock() {
            lru.entries.clear();
            lru.rows = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnpike_schemas::{Block, ConversationId, TurnId};

    fn snapshot(conversation: ConversationId, rows: usize) -> Arc<Vec<Row>> {
        let turn = TurnId::new(1).unwrap();
        Arc::new(
            (0..rows)
                .map(|i| {
                    Row::new(
                        conversation,
                        turn,
                        i,
                        Block::UserMessage { text: "x".into() },
                    )
                })
                .collect(),
        )
    }

    fn version(conversation: ConversationId, turn: u64) -> ObjectVersion {
        ObjectVersion {
            path: format!("tenants/t/conversations/{conversation}/turns/turn_{turn}/context.json"),
            e_tag: format!("e{turn}"),
            version: None,
        }
    }

    #[test]
    fn one_snapshot_per_conversation_and_a_bound_on_rows() {
        let cache = ContextCache::default();
        let (a, b) = (ConversationId::new(), ConversationId::new());
        cache.put(version(a, 1), snapshot(a, 10));
        cache.put(version(a, 2), snapshot(a, 12));
        // The earlier turn's parse went: only the latest is read again.
        assert!(cache.get(&version(a, 1)).is_none());
        assert_eq!(cache.get(&version(a, 2)).unwrap().len(), 12);
        // Rows beyond the bound push out the least recently used.
        cache.put(version(b, 1), snapshot(b, MAX_ROWS - 5));
        assert!(cache.get(&version(a, 2)).is_none(), "over the row bound");
        assert!(cache.get(&version(b, 1)).is_some());
        // A snapshot larger than the bound is not remembered (and pushes nothing out).
        cache.put(version(a, 3), snapshot(a, MAX_ROWS + 1));
        assert!(cache.get(&version(a, 3)).is_none());
        assert!(cache.get(&version(b, 1)).is_some());
        cache.forget(&version(b, 1).path);
        assert!(cache.get(&version(b, 1)).is_none());
        assert_eq!(cache.inner.lock().unwrap().rows, 0);
    }
}
