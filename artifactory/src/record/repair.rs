//! Repair: remove unreadable entries and re-sign, so that the rest replays.
//!
//! This is an operator's tool for a damaged record, not part of normal operation. It never
//! launders: a batch whose signed root is not signed by a trusted key, or whose entries do not
//! add up to that root (an edit with recomputed digests), is dropped whole. Of the batches that
//! stay it keeps every entry that still decodes and whose digest matches its content, drops
//! everything else, and
//! rewrites the record as freshly signed batches (one per surviving original batch). The
//! original objects are first copied under `record-repaired/{stamp}/` so nothing is lost, and
//! the report says exactly what was removed.
//!
//! # Crash safety
//! The rewritten batches are staged under `record-repair-staged/{stamp}/` first; then a journal
//! object (`record-repair-journal`) is created — the commit point — and only then are the
//! record's batches replaced, surplus ones deleted, and the journal removed. A crash before the
//! journal leaves the old record untouched; a crash after it is rolled forward by
//! [`Record::finish_repair`], which every owner runs before it reads the head and the next
//! repair runs first. Callers hold the conversation's lease while repairing, so no turn
//! appends meanwhile.

use object_store::{ObjectStoreExt as _, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use turnpike_schemas::{EntryBody, EntryKind};

use turnpike_schemas::entry::RecordState;

use super::format::StoredBatch;
use super::state;
use super::{Head, Record, BATCH_FORMAT};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::{RecordSigner, SignatureCheck, TrustedKeys};
use crate::mmr::Mmr;

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

/// What a repair under way replaces: the staged batches `0..batches_after` of `stamp_ms`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Journal {
    stamp_ms: u64,
    batches_after: u64,
}

impl Record {
    /// Whether a repair is under way (its journal exists): the record may be half old, half
    /// new until it is finished. Costs one read.
    pub async fn repair_pending(&self) -> Result<bool> {
        crate::store::exists(
            self.store.as_ref(),
            &self.prefix.repair_journal(),
            "reading a repair journal",
        )
        .await
    }

    /// Rolls a repair that stopped after its commit point forward; returns whether there was
    /// one. Costs one read when there is none.
    pub async fn finish_repair(&self) -> Result<bool> {
        let path = self.prefix.repair_journal();
        let bytes = match self.store.get(&path).await {
            Ok(r) => r
                .bytes()
                .await
                .map_err(|e| Error::store("reading a repair journal", e))?,
            Err(object_store::Error::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(Error::store("reading a repair journal", e)),
        };
        let journal: Journal = serde_json::from_slice(&bytes).map_err(|e| {
            Error::with_source(ErrorKind::Corrupt, "a repair journal is unreadable", e)
        })?;
        self.apply_repair(journal).await?;
        Ok(true)
    }

    /// Replaces the record's batches with the staged ones, deletes the surplus, resets the
    /// hint, and removes the journal. Idempotent: it may be cut short and run again.
    async fn apply_repair(&self, journal: Journal) -> Result<()> {
        for seq in 0..journal.batches_after {
            self.store
                .copy(
                    &self.prefix.repair_staged(journal.stamp_ms, seq),
                    &self.prefix.record_batch(seq),
                )
                .await
                .map_err(|e| Error::store("writing a repaired batch", e))?;
        }
        let seqs = self.list_batches(journal.batches_after).await?;
        // From the end, so that a cut-short run never leaves a gap below a surplus batch.
        for &seq in seqs.iter().rev() {
            match self.store.delete(&self.prefix.record_batch(seq)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::store("removing a surplus batch", e)),
            }
        }
        // The hint may now be ahead of the record: point it at the new last batch, or drop it.
        let hint = self.prefix.record_hint();
        let hinted = match journal.batches_after.checked_sub(1) {
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
        match self.store.delete(&self.prefix.repair_journal()).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(Error::store("removing a repair journal", e)),
        }
        // The staged copies are no longer needed (best effort: the originals are kept apart).
        for seq in 0..journal.batches_after {
            let _ = self
                .store
                .delete(&self.prefix.repair_staged(journal.stamp_ms, seq))
                .await;
        }
        Ok(())
    }

    /// Rewrites the record without its unreadable entries. See the module docs.
    pub async fn repair(
        &self,
        signer: &RecordSigner,
        keys: &TrustedKeys,
        stamp_ms: u64,
    ) -> Result<RepairReport> {
        // A repair cut short finishes first: this one repairs what that one wrote.
        self.finish_repair().await?;
        let seqs = self.list_batches(0).await?;
        // The MMR after the last batch that was checked whole, to tie the next one's entries to
        // its signed root; `None` once a batch was dropped (the next can then only be checked
        // by its own signature).
        let mut chained: Option<Mmr> = Some(Mmr::new());
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
                    chained = None;
                    continue;
                }
            };
            match self.authentic(&batch, keys, chained.take()) {
                Ok(after) => chained = Some(after),
                Err(reason) => {
                    removed.push(Removed {
                        batch: seq,
                        position: None,
                        reason,
                    });
                    continue;
                }
            }
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
            let (batch, next) = self.seal(BATCH_FORMAT, signer, &head, &group);
            self.store
                .put(
                    &self.prefix.repair_staged(stamp_ms, written),
                    PutPayload::from(batch.to_bytes()),
                )
                .await
                .map_err(|e| Error::store("staging a repaired batch", e))?;
            kept_entries += group.len() as u64;
            written += 1;
            head = next;
        }
        // Nothing may have been appended meanwhile (the caller holds the lease; this catches a
        // lease that lapsed): a batch this repair did not read would be deleted by it.
        if self.list_batches(0).await? != seqs {
            return Err(Error::new(
                ErrorKind::HeadMoved,
                format!(
                    "{} was appended to while it was being repaired; nothing was changed (repair it again)",
                    self.prefix.partition()
                ),
            ));
        }
        // The commit point: from here on the repair is rolled forward, never half-applied.
        let journal = Journal {
            stamp_ms,
            batches_after: written,
        };
        self.store
            .put_opts(
                &self.prefix.repair_journal(),
                PutPayload::from(serde_json::to_vec(&journal).expect("journals serialise")),
                PutOptions::from(PutMode::Create),
            )
            .await
            .map_err(|e| Error::store("committing a repair", e))?;
        self.apply_repair(journal).await?;
        Ok(RepairReport {
            removed,
            kept_entries,
            batches_before: seqs.len() as u64,
            batches_after: written,
            backup_stamp: stamp_ms,
        })
    }

    /// Whether a batch is what a trusted signer wrote: its closing root is signed by a trusted
    /// key (over its state too, for format 2), and — when the MMR before it is known — its
    /// entries' digests add up to that root. Returns the MMR after the batch, or why not.
    fn authentic(
        &self,
        batch: &StoredBatch,
        keys: &TrustedKeys,
        before: Option<Mmr>,
    ) -> std::result::Result<Mmr, String> {
        let closing = batch
            .entries
            .last()
            .ok_or_else(|| "the batch is empty".to_owned())?;
        let root = closing
            .signed_root()
            .ok_or_else(|| "the batch does not end with a signed root".to_owned())?;
        let root_hash: [u8; 32] = hex::decode(&root.root)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| "its root is malformed".to_owned())?;
        let check = keys.verify_root(&self.prefix.partition(), &root, &root_hash, batch.format);
        if check != SignatureCheck::Valid {
            return Err(format!(
                "its root is not signed by a trusted key ({check:?}); dropped, not re-signed"
            ));
        }
        let peaks = super::format::decode_hashes(&root.peaks)
            .and_then(|p| Mmr::from_peaks(root.leaf_count, p))
            .ok_or_else(|| "its peaks do not fit its leaf count".to_owned())?;
        if peaks.root() != root_hash {
            return Err("its root does not match its peaks".to_owned());
        }
        if let Some(mut mmr) = before {
            for entry in &batch.entries[..batch.entries.len() - 1] {
                let digest: [u8; 32] = hex::decode(&entry.digest)
                    .ok()
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(|| format!("entry {} has a malformed digest", entry.position))?;
                mmr.push(digest);
            }
            if mmr.leaves() != root.leaf_count || mmr.root() != root_hash {
                return Err(
                    "its entries do not add up to its signed root (edited and re-hashed)".into(),
                );
            }
        }
        let mut after = peaks;
        after.push(closing.computed_hash());
        Ok(after)
    }
}
