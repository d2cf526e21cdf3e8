//! Verifying a record: full, or incremental from a trusted checkpoint.
//!
//! Verification re-hashes what is stored, re-derives every root and checks every signature. It
//! detects an edited, reordered, inserted or dropped entry, a dropped batch, truncation of
//! committed entries (against a checkpoint: a record alone cannot prove what it lost at its end),
//! and a root that was forged or signed by a key that is not trusted. It names the first
//! position that can no longer be trusted.
//!
//! Where an entry's stored digest still matches its content but the batch's root does not (the
//! attacker re-computed digests), the first bad position is the first entry of that batch: a
//! batch is signed as a whole, so nothing inside it can be trusted any more.

use std::fmt;

use futures::{StreamExt as _, TryStreamExt as _};
use serde::{Deserialize, Serialize};
use turnpike_schemas::{EntryBody, EntryKind};

use turnpike_schemas::entry::RecordState;

use super::format::{decode_hashes, StoredBatch};
use super::state;
use super::Record;
use crate::error::{ErrorKind, Result};
use crate::keys::{SignatureCheck, TrustedKeys};
use crate::mmr::{Hash, Mmr};

/// The verified state of a record prefix: trusted by whoever verified it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Batches covered.
    pub batches: u64,
    /// Entries covered.
    pub leaves: u64,
    /// The MMR peaks after those entries (hex).
    pub peaks: Vec<String>,
    /// The MMR root after those entries (hex).
    pub root: String,
    /// What the entries add up to.
    #[serde(default)]
    pub state: RecordState,
}

impl Checkpoint {
    fn of(batches: u64, mmr: &Mmr, state: RecordState) -> Self {
        Checkpoint {
            batches,
            leaves: mmr.leaves(),
            peaks: mmr.peaks().iter().map(hex::encode).collect(),
            root: hex::encode(mmr.root()),
            state,
        }
    }

    fn mmr(&self) -> Option<Mmr> {
        let mmr = Mmr::from_peaks(self.leaves, decode_hashes(&self.peaks)?)?;
        (hex::encode(mmr.root()) == self.root).then_some(mmr)
    }
}

/// What a successful verification covered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// Entries checked by this run (all of them for a full verify, the new ones otherwise).
    pub entries_checked: u64,
    /// Batches checked by this run.
    pub batches_checked: u64,
    /// The state after everything verified: keep it to verify incrementally next time.
    pub checkpoint: Checkpoint,
}

/// What is wrong at the first bad position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The batch object cannot be parsed.
    Unreadable(String),
    /// The batch object says it is another batch or belongs to another partition.
    Misplaced(String),
    /// A batch is missing: the next one present is `found`.
    MissingBatch { found: u64 },
    /// An entry stands where another position should be (reordered, inserted or dropped).
    OutOfOrder { found: u64 },
    /// An entry's content does not match its digest.
    Edited,
    /// An entry's kind is unknown or its payload does not fit its kind.
    Undecodable(String),
    /// The batch does not end with a signed root (entries after the last root were cut).
    MissingSignedRoot,
    /// A signed root in the middle of a batch.
    MisplacedSignedRoot,
    /// The signed root does not match the entries (forged, or entries re-hashed).
    RootMismatch,
    /// The signature is not valid for the key it names.
    BadSignature,
    /// Signed by a key that is not trusted.
    UnknownKey(String),
    /// The state a signed root carries is not what its entries add up to.
    ForgedState,
    /// The record is shorter than a trusted checkpoint: committed entries were dropped.
    Truncated { expected_leaves: u64 },
    /// The record's history differs from a trusted checkpoint.
    DivergesFromCheckpoint,
    /// The first entry is not `conversation_opened`, or one appears later.
    BadOpening,
    /// The checkpoint given is not self-consistent.
    BadCheckpoint,
    /// The entry breaks the record's rules (order of lane inputs, turn markers).
    BrokenRule(String),
}

/// The first position of a record that can no longer be trusted, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyFailure {
    pub position: u64,
    pub batch: u64,
    pub problem: Problem,
}

impl fmt::Display for VerifyFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "position {} (batch {}): ", self.position, self.batch)?;
        match &self.problem {
            Problem::Unreadable(why) => write!(f, "unreadable batch: {why}"),
            Problem::Misplaced(why) => write!(f, "misplaced batch: {why}"),
            Problem::MissingBatch { found } => write!(f, "batch missing (next present is {found})"),
            Problem::OutOfOrder { found } => {
                write!(
                    f,
                    "entry out of order (found position {found}): reordered, inserted or dropped"
                )
            }
            Problem::Edited => write!(f, "entry edited: its content does not match its digest"),
            Problem::Undecodable(why) => write!(f, "entry unreadable: {why}"),
            Problem::MissingSignedRoot => {
                write!(f, "batch does not end with a signed root: truncated")
            }
            Problem::MisplacedSignedRoot => write!(f, "signed root in the middle of a batch"),
            Problem::RootMismatch => write!(
                f,
                "signed root does not match the entries: forged or re-hashed"
            ),
            Problem::BadSignature => write!(f, "signature invalid for the key it names"),
            Problem::ForgedState => write!(
                f,
                "the state its signed root carries is not what the entries add up to"
            ),
            Problem::UnknownKey(id) => write!(f, "signed by untrusted key {id}"),
            Problem::Truncated { expected_leaves } => write!(
                f,
                "record truncated: a trusted checkpoint covers {expected_leaves} entries"
            ),
            Problem::DivergesFromCheckpoint => {
                write!(f, "history differs from the trusted checkpoint")
            }
            Problem::BadOpening => write!(
                f,
                "only the first entry may be conversation_opened, and it must be"
            ),
            Problem::BadCheckpoint => write!(f, "the checkpoint is not self-consistent"),
            Problem::BrokenRule(why) => write!(f, "entry breaks the record's rules: {why}"),
        }
    }
}

/// A verification's verdict: a report, or the first bad position.
pub type Verdict = std::result::Result<VerifyReport, VerifyFailure>;

impl Record {
    /// Verifies the whole record. With `known`, also checks that the record still contains
    /// that checkpoint's history unchanged (which is how truncation is caught).
    ///
    /// Store failures are errors; integrity failures are a [`VerifyFailure`] in the verdict.
    #[tracing::instrument(level = "debug", skip_all, fields(conversation = %self.prefix.conversation()))]
    pub async fn verify(&self, keys: &TrustedKeys, known: Option<&Checkpoint>) -> Result<Verdict> {
        let mut walk = Walk::new(self, keys, 0, Mmr::new());
        walk.known = known;
        walk.run().await
    }

    /// Verifies only what was appended after a trusted checkpoint: O(new entries).
    #[tracing::instrument(level = "debug", skip_all, fields(conversation = %self.prefix.conversation(), from = from.batches))]
    pub async fn verify_from(&self, keys: &TrustedKeys, from: &Checkpoint) -> Result<Verdict> {
        let Some(mmr) = from.mmr() else {
            return Ok(Err(VerifyFailure {
                position: from.leaves,
                batch: from.batches,
                problem: Problem::BadCheckpoint,
            }));
        };
        if from.batches > 0 {
            // Truncation check: the last batch the checkpoint covers must still be there.
            if let Err(e) = self.read_bytes(from.batches - 1).await {
                if e.kind() != ErrorKind::NotFound {
                    return Err(e);
                }
                return Ok(Err(VerifyFailure {
                    position: from.leaves,
                    batch: from.batches - 1,
                    problem: Problem::Truncated {
                        expected_leaves: from.leaves,
                    },
                }));
            }
        }
        let mut walk = Walk::new(self, keys, from.batches, mmr);
        walk.state = from.state.clone();
        walk.run().await
    }
}

/// One pass over a record from a starting state.
struct Walk<'a> {
    record: &'a Record,
    keys: &'a TrustedKeys,
    partition: String,
    next_batch: u64,
    mmr: Mmr,
    state: RecordState,
    known: Option<&'a Checkpoint>,
    entries_checked: u64,
    batches_checked: u64,
}

impl<'a> Walk<'a> {
    fn new(record: &'a Record, keys: &'a TrustedKeys, next_batch: u64, mmr: Mmr) -> Self {
        Walk {
            record,
            keys,
            partition: record.prefix.partition(),
            next_batch,
            mmr,
            state: RecordState::default(),
            known: None,
            entries_checked: 0,
            batches_checked: 0,
        }
    }

    fn failure(&self, position: u64, problem: Problem) -> VerifyFailure {
        VerifyFailure {
            position,
            batch: self.next_batch,
            problem,
        }
    }

    fn fail(&self, position: u64, problem: Problem) -> Verdict {
        Err(self.failure(position, problem))
    }

    async fn run(mut self) -> Result<Verdict> {
        let seqs = self.record.list_batches(self.next_batch).await?;
        let record = self.record;
        let mut fetched = futures::stream::iter(seqs.iter().copied())
            .map(|seq| async move { record.read_bytes(seq).await.map(|b| (seq, b)) })
            .buffered(super::READ_CONCURRENCY);
        while let Some((seq, bytes)) = fetched.try_next().await? {
            if seq != self.next_batch {
                return Ok(self.fail(self.mmr.leaves(), Problem::MissingBatch { found: seq }));
            }
            if let Err(failure) = self.check_batch(&bytes) {
                return Ok(Err(failure));
            }
            self.next_batch += 1;
            self.batches_checked += 1;
            if let Some(known) = self.known {
                if known.batches == self.next_batch && known.root != hex::encode(self.mmr.root()) {
                    return Ok(self.fail(0, Problem::DivergesFromCheckpoint));
                }
            }
        }
        if let Some(known) = self.known {
            if self.next_batch < known.batches || self.mmr.leaves() < known.leaves {
                return Ok(self.fail(
                    self.mmr.leaves(),
                    Problem::Truncated {
                        expected_leaves: known.leaves,
                    },
                ));
            }
        }
        Ok(Ok(VerifyReport {
            entries_checked: self.entries_checked,
            batches_checked: self.batches_checked,
            checkpoint: Checkpoint::of(self.next_batch, &self.mmr, self.state),
        }))
    }

    /// Checks one batch and advances the MMR over it.
    fn check_batch(&mut self, bytes: &[u8]) -> std::result::Result<(), VerifyFailure> {
        let start = self.mmr.leaves();
        let batch = match StoredBatch::parse(bytes) {
            Ok(b) => b,
            Err(e) => return Err(self.failure(start, Problem::Unreadable(e.to_string()))),
        };
        if batch.batch != self.next_batch || batch.partition != self.partition {
            return Err(self.failure(
                start,
                Problem::Misplaced(format!(
                    "it says batch {} of {}",
                    batch.batch, batch.partition
                )),
            ));
        }
        if batch.entries.is_empty() {
            return Err(self.failure(start, Problem::MissingSignedRoot));
        }
        if batch.first_position != start {
            return Err(self.failure(
                start,
                Problem::OutOfOrder {
                    found: batch.first_position,
                },
            ));
        }
        let last = batch.entries.len() - 1;
        for (i, entry) in batch.entries.iter().enumerate() {
            let position = self.mmr.leaves();
            if entry.position != position {
                return Err(self.failure(
                    position,
                    Problem::OutOfOrder {
                        found: entry.position,
                    },
                ));
            }
            let computed: Hash = entry.computed_hash();
            if hex::encode(computed) != entry.digest {
                return Err(self.failure(position, Problem::Edited));
            }
            let body = match entry.decode() {
                Ok(body) => body,
                Err(e) => return Err(self.failure(position, Problem::Undecodable(e.to_string()))),
            };
            if (position == 0) != (body.kind() == EntryKind::ConversationOpened) {
                return Err(self.failure(position, Problem::BadOpening));
            }
            if let Err(why) = state::apply(&mut self.state, &body) {
                return Err(self.failure(position, Problem::BrokenRule(why)));
            }
            match (&body, i == last) {
                (EntryBody::SignedRoot(root), true) => {
                    // `active_ms` came with format 3: before it, writers carried what they
                    // resumed from (nothing), so the carried value is the one to go on from.
                    if batch.format < 3 {
                        self.state.active_ms = root.state.active_ms;
                    }
                    if let Err(problem) = self.check_root(root, position, batch.format) {
                        let at = if problem == Problem::RootMismatch {
                            start
                        } else {
                            position
                        };
                        return Err(self.failure(at, problem));
                    }
                }
                (EntryBody::SignedRoot(_), false) => {
                    return Err(self.failure(position, Problem::MisplacedSignedRoot))
                }
                (_, true) => return Err(self.failure(position + 1, Problem::MissingSignedRoot)),
                (_, false) => {}
            }
            self.mmr.push(computed);
            self.entries_checked += 1;
        }
        Ok(())
    }

    fn check_root(
        &self,
        root: &turnpike_schemas::entry::SignedRoot,
        position: u64,
        format: u16,
    ) -> std::result::Result<(), Problem> {
        let expected = self.mmr.root();
        let peaks: Vec<String> = self.mmr.peaks().iter().map(hex::encode).collect();
        if root.leaf_count != position || root.root != hex::encode(expected) || root.peaks != peaks
        {
            return Err(Problem::RootMismatch);
        }
        // `root.leaf_count == position` was checked above.
        let check = self
            .keys
            .verify_root(&self.partition, root, &expected, format);
        // The state must be what the entries add up to. Format 1 roots are left alone: they
        // predate fields the state has gained since, so theirs may legitimately differ.
        if check == SignatureCheck::Valid && format >= 2 && root.state != self.state {
            return Err(Problem::ForgedState);
        }
        match check {
            SignatureCheck::Valid => Ok(()),
            SignatureCheck::UnknownKey => Err(Problem::UnknownKey(root.key_id.clone())),
            SignatureCheck::Invalid => Err(Problem::BadSignature),
        }
    }
}
