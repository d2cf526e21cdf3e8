//! Signatures this process already knows to be valid, so that one record root is not verified
//! twice: a worker reads back the head it just signed when its next drain starts, and a wake's
//! check of the record reads the same last batch again.
//!
//! Contract: an entry is the SHA-256 of a public key, a message and a signature, for a
//! signature that verified with that key — or that this process made with it. Whether a
//! signature is valid is a function of those three alone, so a remembered answer never goes
//! stale, and a signature copied onto another message, or claimed for another key, is another
//! entry (a miss, verified in full). Trust is not remembered here: the caller still decides
//! which keys it trusts. Bounded: at most [`CAPACITY`] entries, the least recently used out
//! first.

use std::num::NonZeroUsize;
use std::sync::{Mutex, OnceLock};

use ed25519_dalek::VerifyingKey;
use lru::LruCache;
use sha2::{Digest as _, Sha256};

/// The most signatures remembered (about 0.4 MiB). A hit saves one Ed25519 verification of a
/// record root this process signed or checked lately, and what is checked again is a
/// conversation's last batches: 4,096 is the bound of every other per-conversation cache of a
/// process (heads, leases, the directory memo). At 32,768 (about 3 MiB) a router's cache was
/// still filling 200,000 turns into a soak, a step in its memory that looked like growth.
pub const CAPACITY: usize = 4_096;

type Entry = [u8; 32];

fn known() -> &'static Mutex<LruCache<Entry, ()>> {
    static KNOWN: OnceLock<Mutex<LruCache<Entry, ()>>> = OnceLock::new();
    KNOWN.get_or_init(|| {
        Mutex::new(LruCache::new(
            NonZeroUsize::new(CAPACITY).expect("a non-zero capacity"),
        ))
    })
}

fn entry(key: &VerifyingKey, message: &[u8], signature: &[u8]) -> Entry {
    let mut h = Sha256::new();
    h.update(b"turnpike-verified-v1\0");
    h.update(key.as_bytes());
    h.update((message.len() as u64).to_be_bytes());
    h.update(message);
    h.update(signature);
    h.finalize().into()
}

/// Whether `signature` over `message` by `key` is known to be valid.
pub(crate) fn is_known(key: &VerifyingKey, message: &[u8], signature: &[u8]) -> bool {
    let entry = entry(key, message, signature);
    known().lock().is_ok_and(|mut k| k.get(&entry).is_some())
}

/// Remembers that `signature` over `message` by `key` is valid (it verified, or this process
/// made it with that key).
pub(crate) fn remember(key: &VerifyingKey, message: &[u8], signature: &[u8]) {
    let entry = entry(key, message, signature);
    if let Ok(mut k) = known().lock() {
        k.put(entry, ());
    }
}
