//! Repair: remove unreadable entries and re-sign, so that the rest replays.
//!
//! This is an operator's tool for a damaged record, not part of normal operation. It keeps every
//! entry that still decodes and whose digest matches its content, drops everything else, and
//! rewrites the record as freshly signed batches (one per surviving original batch). The
//! original objects are first copied under `record-repaired/{stamp}/` so nothing is lost, and
//! the report says exactly what was removed.

use object_store::{ObjectStoreExt as _, PutPayload};
use turnpike_schemas::{EntryBody, EntryKind};

use turnpike_schemas::entry::RecordState;

use super::format::StoredBatch;
use super::state;
use super::{Head, Record};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::RecordSigner;

/// One thing repair removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removed {
    pub batch: u64,
    /// The entry's position, when the batch could be read at all.
    pub position: Option<u64>,
    pub reason: String,
}

/// What a repair did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairReport {
    pub removed: Vec<Removed>,
    pub kept_entries: u64,
    pub batches_before: u64,
    pub batches_after: u64,
    /// Where the original batches were kept.
    pub backup_stamp: u64,
}

impl Record {
    /// Rewrites the record without its unreadable entries. See the module docs.
    pub async fn repair(&self, signer: &RecordSigner, stamp_ms: u64) -> Result<RepairReport> {
        let seqs = self.list_batches(0).await?;
        let mut removed = Vec::new();
        let mut groups: Vec<Vec<EntryBody>> = Vec::new();
        let mut seen_opening = false;
        let mut rules = RecordState::default();
        for &seq in &seqs {
            let bytes = self.read_bytes(seq).await?;
            self.store
                .put(
                    &self.prefix.repaired_batch(stamp_ms, seq),
                    PutPayload::from(bytes.clone()),
                )
                .await
                .map_err(|e| Error::store("keeping the original batch", e))?;
            let batch = match StoredBatch::parse(&bytes) {
                Ok(b) => b,
                Err(e) => {
                    removed.push(Removed {
                        batch: seq,
                        position: None,
                        reason: e.to_string(),
                    });
                    continue;
                }
            };
            let mut kept = Vec::new();
            for entry in &batch.entries {
                if entry.kind == EntryKind::SignedRoot.as_str() {
                    continue;
                }
                let reason = if !entry.digest_matches() {
                    Some("content does not match its digest".to_owned())
                } else {
                    entry.decode().err().map(|e| e.to_string())
                };
                if let Some(reason) = reason {
                    removed.push(Removed {
                        batch: seq,
                        position: Some(entry.position),
                        reason,
                    });
                    continue;
                }
                let body = entry.decode()?;
                let opening = body.kind() == EntryKind::ConversationOpened;
                if opening && seen_opening {
                    removed.push(Removed {
                        batch: seq,
                        position: Some(entry.position),
                        reason: "a second conversation_opened entry".to_owned(),
                    });
                    continue;
                }
                if !opening && !seen_opening {
                    return Err(Error::new(
                        ErrorKind::Corrupt,
                        format!(
                            "the conversation_opened entry of {} is unreadable, so the record cannot be repaired; its batches are kept under record-repaired/{stamp_ms}/",
                            self.prefix.partition()
                        ),
                    ));
                }
                if let Err(why) = state::apply(&mut rules, &body) {
                    removed.push(Removed {
                        batch: seq,
                        position: Some(entry.position),
                        reason: format!(
                            "breaks the record's rules once earlier entries are gone: {why}"
                        ),
                    });
                    continue;
                }
                seen_opening |= opening;
                kept.push(body);
            }
            groups.push(kept);
        }
        let mut head = Head::empty();
        let mut kept_entries = 0;
        let mut written = 0u64;
        for group in groups {
            if group.is_empty() {
                continue;
            }
            let (batch, next) = self.seal(signer, &head, &group);
            self.store
                .put(
                    &self.prefix.record_batch(written),
                    PutPayload::from(batch.to_bytes()),
                )
                .await
                .map_err(|e| Error::store("writing a repaired batch", e))?;
            kept_entries += group.len() as u64;
            written += 1;
            head = next;
        }
        for &seq in seqs.iter().filter(|s| **s >= written) {
            self.store
                .delete(&self.prefix.record_batch(seq))
                .await
                .map_err(|e| Error::store("removing a surplus batch", e))?;
        }
        // The hint may now be ahead of the record: point it at the new last batch, or drop it.
        let hint = self.prefix.record_hint();
        let hinted = match written.checked_sub(1) {
            Some(last) => self
                .store
                .put(&hint, PutPayload::from(last.to_string().into_bytes()))
                .await
                .map(|_| ()),
            None => self.store.delete(&hint).await,
        };
        match hinted {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(Error::store("resetting the head hint", e)),
        }
        Ok(RepairReport {
            removed,
            kept_entries,
            batches_before: seqs.len() as u64,
            batches_after: written,
            backup_stamp: stamp_ms,
        })
    }
}
