//! The conversation record: one signed, append-only partition per conversation.
//!
//! Each committed batch is one object, `record/{batch:020}`, written only if absent — the
//! store's create-if-absent is the compare-and-set. Every entry is a leaf of a Merkle Mountain
//! Range and every batch ends with a `signed_root` entry: an ed25519 signature over the
//! partition id, the leaf count and the root of all leaves before it. The `signed_root` entry is
//! itself a leaf, so the next batch's root covers it.
//!
//! # Contract
//! - [`Record::append`] writes a batch at exactly the [`Head`] the caller observed. If another
//!   appender got there first it fails with [`ErrorKind::HeadMoved`] and writes nothing.
//! - A [`Head`] can only come from reading the record (or from a successful append), so an
//!   appender cannot invent a position.
//! - Appending costs one put (and, every eighth batch, a background put of the head hint),
//!   whatever the record's length. Reading the head costs a few point reads, whatever the record's length: the hint
//!   names a recent batch, probes find the last one after it, and that batch's signed root
//!   carries everything needed to continue (MMR peaks, lane position, turn state). The hint is
//!   never ahead of the record (it is written after the batch), so probing forward from it
//!   always finds the true head; without a hint the record is listed.

mod format;
mod page;
mod repair;
pub mod state;
mod transcript;
mod verify;

use std::sync::Arc;

use futures::{StreamExt as _, TryStreamExt as _};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _, PutMode, PutOptions, PutPayload};
use turnpike_schemas::entry::{RecordState, SignedRoot};
use turnpike_schemas::{EntryBody, EntryKind, TurnId};

pub use format::{StoredBatch, StoredEntry, BATCH_FORMAT};
pub use page::EntryPage;
pub use repair::{Removed, RepairReport};
pub use transcript::{Transcript, TurnView};
pub use verify::{Checkpoint, Problem, Verdict, VerifyFailure, VerifyReport};

use crate::error::{Error, ErrorKind, Result};
use crate::keys::{RecordSigner, SignatureCheck, TrustedKeys};
use crate::layout::ConversationPrefix;
use crate::mmr::Mmr;

/// How many batch objects are fetched at once when reading a record.
const READ_CONCURRENCY: usize = 16;
/// The head hint is rewritten every this many batches: often enough that finding the head
/// takes a handful of probes, rarely enough that appends do not pay for a second write each
/// (on a local filesystem every overwrite allocates and frees an inode).
const HINT_EVERY: u64 = 8;
/// The most entries one batch may hold.
pub const MAX_BATCH_ENTRIES: usize = 4096;

/// A decoded record entry.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordEntry {
    pub position: u64,
    pub body: EntryBody,
}

/// The end of a record as observed by a reader: where the next batch goes.
#[derive(Debug, Clone)]
pub struct Head {
    batches: u64,
    mmr: Mmr,
    state: RecordState,
    /// The store's e-tag of the last batch, when this head was written here (see
    /// [`Record::head_from_known`]). Not part of what a head is: two heads of the same batches
    /// are equal whoever observed them.
    last_etag: Option<String>,
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        (self.batches, &self.mmr, &self.state) == (other.batches, &other.mmr, &other.state)
    }
}

impl Eq for Head {}

impl Head {
    /// The head of a record that holds nothing yet (what `Record::head` returns for one).
    pub fn empty() -> Self {
        Head {
            batches: 0,
            mmr: Mmr::new(),
            state: RecordState::default(),
            last_etag: None,
        }
    }

    /// What the committed entries add up to: lane position and turn state.
    pub fn state(&self) -> &RecordState {
        &self.state
    }

    /// How many batches are committed; the next batch gets this number.
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// How many entries are committed; the next entry gets this position.
    pub fn leaves(&self) -> u64 {
        self.mmr.leaves()
    }

    /// The MMR root over every committed entry (hex): what the last batch's signature
    /// covers.
    pub fn root_hex(&self) -> String {
        hex::encode(self.mmr.root())
    }

    /// Whether the record has no batch yet.
    pub fn is_empty(&self) -> bool {
        self.batches == 0
    }
}

/// One conversation's record in an object store.
#[derive(Debug, Clone)]
pub struct Record {
    store: Arc<dyn ObjectStore>,
    prefix: ConversationPrefix,
    /// When set, [`Record::head`] trusts the last batch only if its root is signed by one of
    /// these keys (over the state it carries, for format 2 batches).
    keys: Option<Arc<TrustedKeys>>,
}

impl Record {
    /// The record of the conversation at `prefix`.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: ConversationPrefix) -> Self {
        Self {
            store,
            prefix,
            keys: None,
        }
    }

    /// Checks the last root's signature with `keys` whenever the head is read: a reader that
    /// acts on the state (a worker skipping lane events it thinks committed) must not trust a
    /// state nobody trusted signed.
    pub fn trusting(mut self, keys: Arc<TrustedKeys>) -> Self {
        self.keys = Some(keys);
        self
    }

    /// The conversation's prefix.
    pub fn prefix(&self) -> &ConversationPrefix {
        &self.prefix
    }

    /// Reads the current head: one list and one get.
    ///
    /// Fails with [`ErrorKind::Corrupt`] when the last batch cannot be read; `repair` fixes that.
    pub async fn head(&self) -> Result<Head> {
        self.head_after(None).await
    }

    /// Reads the current head, starting from `known` (a head observed earlier) instead of the
    /// hint; returns `known` itself after one probe when nothing was appended since.
    pub async fn head_after(&self, known: Option<&Head>) -> Result<Head> {
        let guess = match known {
            Some(h) if h.batches > 0 => Some(h.batches - 1),
            _ => self.read_hint().await,
        };
        let Some(last) = self.locate_last(guess).await? else {
            return Ok(Head::empty());
        };
        if let Some(h) = known {
            if h.batches == last + 1 {
                return Ok(h.clone());
            }
        }
        let batch = self.read_stored(last).await?;
        let corrupt = |why: &str| {
            Error::new(
                ErrorKind::Corrupt,
                format!(
                    "the last batch ({last}) of {} {why}; run `turnpike conversation repair`",
                    self.prefix.partition()
                ),
            )
        };
        let closing = batch.entries.last().ok_or_else(|| corrupt("is empty"))?;
        let root = closing
            .signed_root()
            .ok_or_else(|| corrupt("does not end with a signed root"))?;
        let peaks =
            format::decode_hashes(&root.peaks).ok_or_else(|| corrupt("has malformed peaks"))?;
        let mut mmr = Mmr::from_peaks(root.leaf_count, peaks)
            .ok_or_else(|| corrupt("has peaks that do not fit its leaf count"))?;
        if hex::encode(mmr.root()) != root.root || closing.position != root.leaf_count {
            return Err(corrupt("has a root that does not match its peaks"));
        }
        if let Some(keys) = &self.keys {
            let check =
                keys.verify_root(&self.prefix.partition(), &root, &mmr.root(), batch.format);
            if check != SignatureCheck::Valid {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "the last batch ({last}) of {} is not signed by a trusted key ({check:?}); its state is not trusted: run `turnpike conversation verify`",
                        self.prefix.partition()
                    ),
                ));
            }
        }
        mmr.push(closing.computed_hash());
        Ok(Head {
            batches: last + 1,
            mmr,
            state: root.state,
            last_etag: None,
        })
    }

    /// The current head, from `known`: a head this process wrote (with its last batch's
    /// e-tag). When that batch is still there unchanged and none follows it, `known` itself,
    /// for two metadata probes — no read, no parse, no signature check (it was signed here).
    /// Anything else — a batch after it (another owner appended), the batch rewritten (a
    /// repair), no e-tag — reads the head afresh as [`Record::head`] does.
    pub async fn head_from_known(&self, known: &Head) -> Result<Head> {
        let (Some(etag), Some(last)) = (&known.last_etag, known.batches.checked_sub(1)) else {
            return self.head().await;
        };
        let what = format!("probing {}", self.prefix.partition());
        match self.store.head(&self.prefix.record_batch(last)).await {
            Ok(meta) if meta.e_tag.as_deref() == Some(etag.as_str()) => {}
            Ok(_) | Err(object_store::Error::NotFound { .. }) => return self.head().await,
            Err(e) => return Err(Error::store(&what, e)),
        }
        if self.exists(known.batches).await? {
            return self.head_after(Some(known)).await;
        }
        Ok(known.clone())
    }

    /// Appends one atomic batch at `head`, closed by a signed root. Returns the new head.
    ///
    /// The first batch of a record must start with `conversation_opened`, and no other may hold
    /// one. `signed_root` entries are added here, never by callers.
    pub async fn append(
        &self,
        signer: &RecordSigner,
        head: &Head,
        bodies: &[EntryBody],
    ) -> Result<Head> {
        self.check_bodies(head, bodies)?;
        let (batch, new_head) = self.seal(BATCH_FORMAT, signer, head, bodies);
        self.put_batch(head, batch, new_head).await
    }

    /// Writes `source`'s entries into this record batch by batch — every entry unchanged, at
    /// the same position — re-signed with `signer`, then `trailer` as one last batch (an
    /// import's provenance). Idempotent: a batch already here with the same bytes is kept (so
    /// an import cut short runs again), and a last batch holding the trailer's kind ends it;
    /// anything else already here is an error.
    pub(crate) async fn reseal_from(
        &self,
        source: &Record,
        signer: &RecordSigner,
        trailer: &[EntryBody],
    ) -> Result<Head> {
        let mut head = Head::empty();
        for seq in source.list_batches(0).await? {
            let stored = source.read_stored(seq).await?;
            let bodies = stored
                .entries
                .iter()
                .filter(|e| e.kind != EntryKind::SignedRoot.as_str())
                .map(StoredEntry::decode)
                .collect::<Result<Vec<_>>>()?;
            self.check_bodies(&head, &bodies)?;
            let (batch, next) = self.seal(BATCH_FORMAT, signer, &head, &bodies);
            let bytes = batch.to_bytes();
            head = match self.put_batch(&head, batch, next.clone()).await {
                Ok(next) => next,
                Err(e) if e.kind() == ErrorKind::HeadMoved => {
                    if self.read_bytes(head.batches).await? != bytes {
                        return Err(Error::new(
                            ErrorKind::AlreadyExists,
                            format!("{} holds another record already", self.prefix.partition()),
                        ));
                    }
                    next
                }
                Err(e) => return Err(e),
            };
        }
        if trailer.is_empty() {
            return Ok(head);
        }
        match self.append(signer, &head, trailer).await {
            Ok(head) => Ok(head),
            Err(e) if e.kind() == ErrorKind::HeadMoved => {
                let done = self.read_stored(head.batches).await?;
                let kind = trailer[0].kind().as_str();
                if done.entries.first().map(|e| e.kind.as_str()) != Some(kind) {
                    return Err(Error::new(
                        ErrorKind::AlreadyExists,
                        format!("{} holds another record already", self.prefix.partition()),
                    ));
                }
                self.head().await
            }
            Err(e) => Err(e),
        }
    }

    /// Writes a sealed batch at `head` (create-only), then the hint now and then.
    async fn put_batch(&self, head: &Head, batch: StoredBatch, mut new_head: Head) -> Result<Head> {
        let path = self.prefix.record_batch(head.batches);
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(&path, PutPayload::from(batch.to_bytes()), opts)
            .await
        {
            Ok(put) => {
                if head.batches.is_multiple_of(HINT_EVERY) {
                    self.write_hint(head.batches);
                }
                new_head.last_etag = put.e_tag;
                Ok(new_head)
            }
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => Err(Error::new(
                ErrorKind::HeadMoved,
                format!(
                    "the head of {} moved: batch {} exists already; nothing was written",
                    self.prefix.partition(),
                    head.batches
                ),
            )),
            Err(e) => Err(Error::store(
                &format!("appending to {}", self.prefix.partition()),
                e,
            )),
        }
    }

    fn check_bodies(&self, head: &Head, bodies: &[EntryBody]) -> Result<()> {
        let invalid = |why: String| Err(Error::new(ErrorKind::InvalidInput, why));
        if bodies.is_empty() {
            return invalid("a batch needs at least one entry".into());
        }
        if bodies.len() > MAX_BATCH_ENTRIES {
            return invalid(format!("a batch holds at most {MAX_BATCH_ENTRIES} entries"));
        }
        for (i, body) in bodies.iter().enumerate() {
            let first = head.is_empty() && i == 0;
            match body.kind() {
                EntryKind::SignedRoot => {
                    return invalid("signed roots are added by the record, not by callers".into())
                }
                EntryKind::ConversationOpened if !first => {
                    return invalid(
                        "only the first entry of a record may open the conversation".into(),
                    )
                }
                kind if first && kind != EntryKind::ConversationOpened => {
                    return invalid(
                        "the first entry of a record must be conversation_opened".into(),
                    )
                }
                _ => {}
            }
        }
        let mut state = head.state.clone();
        for body in bodies {
            state::apply(&mut state, body).map_err(|why| {
                Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "refused by the record of {}: {why}",
                        self.prefix.partition()
                    ),
                )
            })?;
        }
        Ok(())
    }

    /// Builds the stored batch (in `format`: [`BATCH_FORMAT`] but in tests of older records)
    /// and the head after it, signing the root.
    fn seal(
        &self,
        format: u16,
        signer: &RecordSigner,
        head: &Head,
        bodies: &[EntryBody],
    ) -> (StoredBatch, Head) {
        let mut mmr = head.mmr.clone();
        let mut state = head.state.clone();
        let mut entries = Vec::with_capacity(bodies.len() + 1);
        for body in bodies {
            // Callers check the rules first (`check_bodies`); repair seals what it checked.
            let _ = state::apply(&mut state, body);
            let (entry, hash) = StoredEntry::encode_hashed(mmr.leaves(), body);
            mmr.push(hash);
            entries.push(entry);
        }
        if format < 3 {
            // Writers before format 3 had no `active_ms`: they carried what they resumed from.
            state.active_ms = head.state.active_ms;
        }
        let root = mmr.root();
        let partition = self.prefix.partition();
        let signed = EntryBody::SignedRoot(SignedRoot {
            leaf_count: mmr.leaves(),
            root: hex::encode(root),
            peaks: mmr.peaks().iter().map(hex::encode).collect(),
            state: state.clone(),
            key_id: signer.key_id().to_owned(),
            signature: hex::encode(signer.sign(
                &partition,
                mmr.leaves(),
                &root,
                Some(&crate::keys::state_digest(&state)),
            )),
        });
        let (closing, hash) = StoredEntry::encode_hashed(mmr.leaves(), &signed);
        mmr.push(hash);
        entries.push(closing);
        let batch = StoredBatch {
            format,
            partition,
            batch: head.batches,
            first_position: head.leaves(),
            entries,
        };
        (
            batch,
            Head {
                batches: head.batches + 1,
                mmr,
                state,
                last_etag: None,
            },
        )
    }

    /// The last batch number, probing forward from `guess` (a batch known or hinted to exist),
    /// or listing when there is no usable guess.
    async fn locate_last(&self, guess: Option<u64>) -> Result<Option<u64>> {
        /// Past this many probes, listing from the guess is cheaper (the hint lags by fewer).
        const MAX_PROBES: usize = 2 * HINT_EVERY as usize;
        if let Some(mut last) = guess {
            if self.exists(last).await? {
                for _ in 0..MAX_PROBES {
                    if !self.exists(last + 1).await? {
                        return Ok(Some(last));
                    }
                    last += 1;
                }
                return Ok(self
                    .list_batches(last)
                    .await?
                    .last()
                    .copied()
                    .or(Some(last)));
            }
        }
        Ok(self.list_batches(0).await?.last().copied())
    }

    async fn exists(&self, seq: u64) -> Result<bool> {
        crate::store::exists(
            self.store.as_ref(),
            &self.prefix.record_batch(seq),
            &format!("probing {}", self.prefix.partition()),
        )
        .await
    }

    /// The head hint, if present and readable (it is only ever a hint).
    async fn read_hint(&self) -> Option<u64> {
        let bytes = self
            .store
            .get(&self.prefix.record_hint())
            .await
            .ok()?
            .bytes()
            .await
            .ok()?;
        std::str::from_utf8(&bytes).ok()?.trim().parse().ok()
    }

    /// Writes the head hint in the background: it is never needed for correctness.
    fn write_hint(&self, seq: u64) {
        let store = self.store.clone();
        let path = self.prefix.record_hint();
        tokio::spawn(async move {
            let _ = store
                .put(&path, PutPayload::from(seq.to_string().into_bytes()))
                .await;
        });
    }

    /// The batch numbers present from `from` on, in order.
    pub(crate) async fn list_batches(&self, from: u64) -> Result<Vec<u64>> {
        let dir = self.prefix.record_dir();
        let listing = if from == 0 {
            self.store.list(Some(&dir))
        } else {
            let offset = self.prefix.record_batch(from - 1);
            self.store.list_with_offset(Some(&dir), &offset)
        };
        let metas: Vec<_> = listing
            .try_collect()
            .await
            .map_err(|e| Error::store(&format!("listing {}", self.prefix.partition()), e))?;
        let mut seqs: Vec<u64> = metas
            .iter()
            .filter_map(|m| self.prefix.batch_seq(&m.location))
            .filter(|s| *s >= from)
            .collect();
        seqs.sort_unstable();
        Ok(seqs)
    }

    pub(crate) async fn read_bytes(&self, seq: u64) -> Result<bytes::Bytes> {
        let path: Path = self.prefix.record_batch(seq);
        let what = format!("reading batch {seq} of {}", self.prefix.partition());
        self.store
            .get(&path)
            .await
            .map_err(|e| Error::store(&what, e))?
            .bytes()
            .await
            .map_err(|e| Error::store(&what, e))
    }

    async fn read_stored(&self, seq: u64) -> Result<StoredBatch> {
        let bytes = self.read_bytes(seq).await?;
        StoredBatch::parse(&bytes).map_err(|e| {
            Error::new(
                ErrorKind::Corrupt,
                format!("batch {seq} of {}: {e}", self.prefix.partition()),
            )
        })
    }

    /// Reads and decodes every entry from batch `from` on, without verifying signatures.
    ///
    /// Use [`Record::verify`] to check integrity; this is the fast path for rebuilding state.
    pub async fn entries_from(&self, from: u64) -> Result<Vec<RecordEntry>> {
        let seqs = self.list_batches(from).await?;
        let batches: Vec<StoredBatch> = futures::stream::iter(seqs)
            .map(|seq| self.read_stored(seq))
            .buffered(READ_CONCURRENCY)
            .try_collect()
            .await?;
        let mut out = Vec::new();
        for batch in batches {
            for entry in batch.entries {
                let body = entry.decode()?;
                out.push(RecordEntry {
                    position: entry.position,
                    body,
                });
            }
        }
        Ok(out)
    }

    /// The entries of the open turn — its batch one (inputs and `turn_dispatched`) and
    /// everything after — read backwards from the head, so the cost is the turn's length, not
    /// the record's. `None` when no turn is open. A batch one committed with the batch two of
    /// the turn before (see [`Record::opened_with_close`]) starts after that turn's close:
    /// nothing of that turn is the open one's.
    pub async fn open_turn(&self, head: &Head) -> Result<Option<(TurnId, Vec<RecordEntry>)>> {
        Ok(self
            .open_turn_batch(head)
            .await?
            .map(|(turn, entries, _)| (turn, entries)))
    }

    /// Whether the open turn's batch one was committed in one batch with the batch two of the
    /// turn before it (its owner opened it with that commit). `false` when no turn is open.
    pub async fn opened_with_close(&self, head: &Head) -> Result<bool> {
        Ok(self
            .open_turn_batch(head)
            .await?
            .is_some_and(|(_, _, with_close)| with_close))
    }

    /// [`Record::open_turn`], and whether its batch one shares a batch with a turn's close.
    async fn open_turn_batch(
        &self,
        head: &Head,
    ) -> Result<Option<(TurnId, Vec<RecordEntry>, bool)>> {
        if !head.state.turn_open {
            return Ok(None);
        }
        let turn = TurnId::new(head.state.last_turn)
            .ok_or_else(|| Error::new(ErrorKind::Corrupt, "an open turn with number 0"))?;
        let mut collected: Vec<RecordEntry> = Vec::new();
        for seq in (0..head.batches).rev() {
            let batch = self.read_stored(seq).await?;
            let mut entries = Vec::with_capacity(batch.entries.len());
            let mut dispatched = false;
            // Where the turn's own entries start in this batch: after any turn's close before
            // its dispatch.
            let mut starts = 0;
            for entry in batch.entries {
                let body = entry.decode()?;
                let closes = matches!(
                    &body,
                    EntryBody::TurnComplete(_) | EntryBody::TurnAmbiguous(_)
                );
                if closes && !dispatched {
                    starts = entries.len() + 1;
                }
                dispatched |= matches!(&body, EntryBody::TurnDispatched(d) if d.turn == turn);
                entries.push(RecordEntry {
                    position: entry.position,
                    body,
                });
            }
            if !dispatched {
                entries.append(&mut collected);
                collected = entries;
                continue;
            }
            let mut own = entries.split_off(starts);
            own.append(&mut collected);
            return Ok(Some((turn, own, starts > 0)));
        }
        Err(Error::new(
            ErrorKind::Corrupt,
            format!(
                "{} says {turn} is open but holds no dispatch for it",
                self.prefix.partition()
            ),
        ))
    }

    /// The `turn_complete` of `turn`, read backwards from the head (the cost is the batches
    /// since that turn was dispatched, not the record's length). `None` if the turn is not
    /// complete (open, quarantined or never dispatched).
    pub async fn completion(
        &self,
        head: &Head,
        turn: TurnId,
    ) -> Result<Option<turnpike_schemas::entry::TurnComplete>> {
        for seq in (0..head.batches).rev() {
            let batch = self.read_stored(seq).await?;
            for entry in batch.entries.iter().rev() {
                match entry.decode()? {
                    EntryBody::TurnComplete(c) if c.turn == turn => return Ok(Some(c)),
                    EntryBody::TurnDispatched(d) if d.turn <= turn => return Ok(None),
                    _ => {}
                }
            }
        }
        Ok(None)
    }

    /// How `turn` ended, as its `turn_complete`, its first input and its `error` entry's text
    /// (if it failed): read backwards from the head to the batch that dispatched it. `None`
    /// if the turn is not complete.
    pub async fn turn_end(&self, head: &Head, turn: TurnId) -> Result<Option<TurnEnd>> {
        let mut complete = None;
        let mut error = None;
        let mut first_input = None;
        for seq in (0..head.batches).rev() {
            let batch = self.read_stored(seq).await?;
            let mut dispatched = false;
            for entry in batch.entries.iter().rev() {
                let body = entry.decode()?;
                if let Some(input) = body.as_input() {
                    if complete.is_some() {
                        first_input = Some(input.event.clone());
                    }
                    continue;
                }
                match body {
                    EntryBody::TurnComplete(c) if c.turn == turn => complete = Some(c),
                    EntryBody::Error(e) if complete.is_some() && e.turn == Some(turn) => {
                        error = Some(e.message)
                    }
                    EntryBody::TurnDispatched(d) if d.turn == turn => dispatched = true,
                    EntryBody::TurnDispatched(d) if d.turn < turn => return Ok(None),
                    _ => {}
                }
            }
            // A turn's inputs are committed in the batch that dispatches it (and folded in
            // while it runs, after): nothing before that batch is its own.
            if dispatched {
                break;
            }
        }
        Ok(complete.map(|complete| TurnEnd {
            complete,
            first_input,
            error,
        }))
    }

    /// Reads and decodes every entry.
    pub async fn entries(&self) -> Result<Vec<RecordEntry>> {
        self.entries_from(0).await
    }
}

/// How a turn ended (see [`Record::turn_end`]).
#[derive(Debug, Clone)]
pub struct TurnEnd {
    pub complete: turnpike_schemas::entry::TurnComplete,
    /// The earliest of its inputs.
    pub first_input: Option<turnpike_schemas::Event>,
    /// Its `error` entry's text, when it failed.
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use turnpike_schemas::entry::{
        ConversationOpened, IdleClosed, TurnComplete, TurnDispatched, TurnOutcome,
    };
    use turnpike_schemas::{ConversationId, EntryBody, TurnId, WorkerId};

    use super::*;
    use crate::keys::TrustedKeys;

    fn opened(at_ms: u64) -> EntryBody {
        EntryBody::ConversationOpened(ConversationOpened {
            tenant: "t".parse().unwrap(),
            owner: "x:y".parse().unwrap(),
            app: "a".parse().unwrap(),
            agent: "g".parse().unwrap(),
            at_ms,
        })
    }

    fn turn(n: u64, at_ms: u64) -> [EntryBody; 2] {
        let turn = TurnId::new(n).unwrap();
        [
            EntryBody::TurnDispatched(TurnDispatched {
                turn,
                worker: WorkerId::new(),
                agent: "g".parse().unwrap(),
                epoch: turnpike_schemas::Epoch(0),
                at_ms,
            }),
            EntryBody::TurnComplete(TurnComplete {
                turn,
                outcome: TurnOutcome::Replied,
                log: None,
                log_sha256: None,
                version: None,
                attempt: None,
                at_ms: at_ms + 1,
            }),
        ]
    }

    /// A record written by a format-2 writer (no `active_ms`), then continued by this one,
    /// verifies; the carried last activity follows the new batches.
    #[tokio::test]
    async fn a_record_begun_before_format_3_verifies_after_this_build_continues_it() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let record = Record::new(
            store,
            ConversationPrefix::new("t".parse().unwrap(), ConversationId::new()),
        );
        let signer = RecordSigner::from_seed([7; 32]);
        let keys = TrustedKeys::new([signer.verifying_key()]);
        let mut head = Head::empty();
        for bodies in [vec![opened(100)], turn(1, 200).to_vec()] {
            let (batch, next) = record.seal(2, &signer, &head, &bodies);
            head = record.put_batch(&head, batch, next).await.unwrap();
        }
        assert_eq!(record.head().await.unwrap().state().active_ms, 0);
        // A batch that changes no activity, then one that does.
        let head = record
            .append(
                &signer,
                &head,
                &[EntryBody::IdleClosed(IdleClosed {
                    idle_since_ms: 0,
                    after_ms: 1,
                    at_ms: 300,
                })],
            )
            .await
            .unwrap();
        assert_eq!(head.state().active_ms, 0);
        let head = record
            .append(
                &signer,
                &head,
                &[EntryBody::Reopened(turnpike_schemas::entry::Reopened {
                    at_ms: 400,
                })],
            )
            .await
            .unwrap();
        let head = record.append(&signer, &head, &turn(2, 500)).await.unwrap();
        assert_eq!(head.state().active_ms, 501);
        let report = record.verify(&keys, None).await.unwrap().unwrap();
        assert_eq!(report.checkpoint.state, *head.state());
    }

    async fn head_from_known_sees_what_changed(store: Arc<dyn ObjectStore>) {
        let prefix = ConversationPrefix::new("t".parse().unwrap(), ConversationId::new());
        let record = Record::new(store.clone(), prefix.clone());
        let signer = RecordSigner::from_seed([7; 32]);
        let head = record
            .append(&signer, &Head::empty(), &[opened(100)])
            .await
            .unwrap();
        let known = record.append(&signer, &head, &turn(1, 200)).await.unwrap();
        // Nothing since: the known head itself, equal to a fresh read.
        let again = record.head_from_known(&known).await.unwrap();
        assert_eq!(again, known);
        assert_eq!(again, record.head().await.unwrap());
        // Another owner appended: the head it left.
        let other = record.head().await.unwrap();
        let moved = record.append(&signer, &other, &turn(2, 300)).await.unwrap();
        assert_eq!(record.head_from_known(&known).await.unwrap(), moved);
        // The last batch rewritten in place (as a repair stages it): read afresh, never the
        // cached head. Here batch 2 gives way to batch 1's bytes (a record one batch shorter
        // in its state: a head that differs from `moved`).
        let bytes = record.read_bytes(1).await.unwrap();
        store
            .put(&prefix.record_batch(2), PutPayload::from(bytes))
            .await
            .unwrap();
        let read = record.head_from_known(&moved).await;
        assert!(read.map_or(true, |h| h != moved));
        // A head without an e-tag (read, not written here) is read afresh.
        let fresh = record.head().await.unwrap();
        assert!(fresh.last_etag.is_none());
    }

    #[tokio::test]
    async fn head_from_known_in_memory() {
        head_from_known_sees_what_changed(Arc::new(object_store::memory::InMemory::new())).await;
    }

    #[tokio::test]
    async fn head_from_known_on_the_local_stores() {
        let dir = tempfile::tempdir().unwrap();
        let files = object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap();
        head_from_known_sees_what_changed(Arc::new(files)).await;
        let dir = tempfile::tempdir().unwrap();
        let sqlite = crate::sqlite_store::SqliteStore::open(dir.path(), false).unwrap();
        head_from_known_sees_what_changed(Arc::new(sqlite)).await;
    }
}
