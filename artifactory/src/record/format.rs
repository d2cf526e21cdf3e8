//! The stored form of a batch: one JSON object per committed batch.
//!
//! ```json
//! {"format":1,"partition":"conv-…","batch":3,"first_position":17,
//!  "entries":[{"position":17,"kind":"user_message","digest":"…","payload":{…}}, …,
//!             {"position":20,"kind":"signed_root","digest":"…","payload":{…}}]}
//! ```
//!
//! Payloads are kept as the exact bytes that were hashed (`RawValue`), so verification hashes
//! what is stored, not a re-serialisation of it.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use turnpike_schemas::entry::SignedRoot;
use turnpike_schemas::{EntryBody, EntryKind};

use crate::error::{Error, ErrorKind, Result};
use crate::mmr::{leaf_hash, Hash};

/// The batch format this build writes: 3, whose state carries the conversation's last activity
/// (`active_ms`). Format 2 roots sign the digest of the state they carry too; format 1 roots
/// signed no state. Both are still read and verified.
pub const BATCH_FORMAT: u16 = 3;
/// The oldest batch format this build reads.
pub const OLDEST_BATCH_FORMAT: u16 = 1;

/// A batch as stored.
#[derive(Debug, Serialize, Deserialize)]
pub struct StoredBatch {
    pub format: u16,
    pub partition: String,
    pub batch: u64,
    pub first_position: u64,
    pub entries: Vec<StoredEntry>,
}

/// An entry as stored.
#[derive(Debug, Serialize, Deserialize)]
pub struct StoredEntry {
    pub position: u64,
    pub kind: String,
    /// Hex SHA-256 leaf hash of (position, kind, payload).
    pub digest: String,
    pub payload: Box<RawValue>,
}

impl StoredEntry {
    /// Encodes a body at a position; returns it with its leaf hash (the one its digest holds,
    /// computed once).
    pub fn encode_hashed(position: u64, body: &EntryBody) -> (Self, Hash) {
        let kind = body.kind();
        let payload = String::from_utf8(body.encode()).expect("JSON is UTF-8");
        let hash = leaf_hash(position, kind.as_str(), payload.as_bytes());
        let entry = StoredEntry {
            position,
            kind: kind.as_str().to_owned(),
            digest: hex::encode(hash),
            payload: RawValue::from_string(payload).expect("encoded payloads are JSON"),
        };
        (entry, hash)
    }

    /// The leaf hash of what is stored (not the stored digest).
    pub fn computed_hash(&self) -> Hash {
        leaf_hash(self.position, &self.kind, self.payload.get().as_bytes())
    }

    /// Whether the stored digest matches the content.
    pub fn digest_matches(&self) -> bool {
        hex::encode(self.computed_hash()) == self.digest
    }

    /// The typed body, refusing an unknown kind or a payload that does not fit it.
    pub fn decode(&self) -> Result<EntryBody> {
        let kind: EntryKind = self.kind.parse().map_err(|e| {
            Error::with_source(
                ErrorKind::Corrupt,
                format!("entry {}: {e}", self.position),
                e,
            )
        })?;
        EntryBody::decode(kind, self.payload.get()).map_err(|e| {
            Error::with_source(
                ErrorKind::Corrupt,
                format!("entry {}: {e}", self.position),
                e,
            )
        })
    }

    /// The signed root, when this is one.
    pub fn signed_root(&self) -> Option<SignedRoot> {
        if self.kind != EntryKind::SignedRoot.as_str() {
            return None;
        }
        match self.decode() {
            Ok(EntryBody::SignedRoot(root)) => Some(root),
            _ => None,
        }
    }
}

impl StoredBatch {
    /// Parses stored bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let batch: StoredBatch = serde_json::from_slice(bytes).map_err(|e| {
            Error::with_source(ErrorKind::Corrupt, format!("unreadable batch: {e}"), e)
        })?;
        if !(OLDEST_BATCH_FORMAT..=BATCH_FORMAT).contains(&batch.format) {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "batch format {} is not supported (this build reads {BATCH_FORMAT})",
                    batch.format
                ),
            ));
        }
        Ok(batch)
    }

    /// The stored bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("batches serialise")
    }
}

/// Decodes a list of hex hashes.
pub fn decode_hashes(hexes: &[String]) -> Option<Vec<Hash>> {
    hexes
        .iter()
        .map(|h| hex::decode(h).ok().and_then(|b| b.try_into().ok()))
        .collect()
}
