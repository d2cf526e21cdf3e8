//! Dead letters: lane messages a worker could not take (bytes this binary cannot read, e.g. a
//! newer event kind during a rolling upgrade, or input the record refuses), kept so that an
//! operator can inspect and requeue them, instead of an owner retrying them forever.
//!
//! # Contract
//! - A worker parks a message **before** it commits the `lane_parked` entry that moves the
//!   record past it, create-only: a second owner parking the same sequence after the first died
//!   finds it there ([`DeadLetters::park`] is idempotent for the same sequence) — nothing is
//!   lost and nothing is parked twice.
//! - Requeueing republishes the kept bytes on the lane (a new sequence) and then marks the
//!   letter requeued; the letter stays as the evidence of what happened.
//!
//! Layout: `tenants/{tenant}/conversations/{conversation}/dead-letters/{lane_seq:020}`, one JSON
//! object each, so deleting a conversation deletes its letters.

use std::sync::Arc;

use base64::Engine as _;
use futures::TryStreamExt as _;
use object_store::{ObjectStore, ObjectStoreExt as _, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};
use crate::layout::ConversationPrefix;

/// One parked lane message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// Its sequence on the conversation's lane.
    pub lane_seq: u64,
    /// Why it was not taken.
    pub reason: String,
    /// When it was parked, in milliseconds since the Unix epoch.
    pub parked_ms: u64,
    /// The message's bytes, base64: as they were on the lane for an unreadable message, the
    /// event re-serialised for input the record refused.
    pub payload: String,
    /// When an operator requeued it (and the new lane sequence), if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeued: Option<Requeued>,
}

/// An operator's requeue of a dead letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requeued {
    pub by: String,
    pub at_ms: u64,
    pub lane_seq: u64,
}

impl DeadLetter {
    /// A letter for `bytes` from the lane at `lane_seq`.
    pub fn new(lane_seq: u64, reason: impl Into<String>, parked_ms: u64, bytes: &[u8]) -> Self {
        Self {
            lane_seq,
            reason: reason.into(),
            parked_ms,
            payload: base64::engine::general_purpose::STANDARD.encode(bytes),
            requeued: None,
        }
    }

    /// The message's bytes (see [`DeadLetter::payload`]).
    pub fn bytes(&self) -> Result<Vec<u8>> {
        base64::engine::general_purpose::STANDARD
            .decode(&self.payload)
            .map_err(|e| Error::with_source(ErrorKind::Corrupt, "a dead letter's payload", e))
    }
}

/// The dead letters in one object store.
#[derive(Debug, Clone)]
pub struct DeadLetters {
    store: Arc<dyn ObjectStore>,
}

impl DeadLetters {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self { store }
    }

    /// Keeps `letter` for the conversation; returns the key it is kept under. A letter for the
    /// same sequence kept already (by an owner that died before it committed the parking) is
    /// left as it is.
    pub async fn park(&self, prefix: &ConversationPrefix, letter: &DeadLetter) -> Result<String> {
        let path = prefix.dead_letter(letter.lane_seq);
        let bytes = serde_json::to_vec(letter).expect("dead letters serialise");
        let create = PutOptions::from(PutMode::Create);
        match self
            .store
            .put_opts(&path, PutPayload::from(bytes), create)
            .await
        {
            Ok(_)
            | Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => Ok(path.to_string()),
            Err(e) => Err(Error::store(
                &format!(
                    "parking lane message {} of {}",
                    letter.lane_seq,
                    prefix.partition()
                ),
                e,
            )),
        }
    }

    /// The letter parked at `lane_seq`.
    pub async fn get(&self, prefix: &ConversationPrefix, lane_seq: u64) -> Result<DeadLetter> {
        let what = format!("dead letter {lane_seq} of {}", prefix.partition());
        let bytes = self
            .store
            .get(&prefix.dead_letter(lane_seq))
            .await
            .map_err(|e| Error::store(&what, e))?
            .bytes()
            .await
            .map_err(|e| Error::store(&what, e))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| Error::with_source(ErrorKind::Corrupt, format!("{what} is unreadable"), e))
    }

    /// Every letter of the conversation, by lane sequence.
    pub async fn list(&self, prefix: &ConversationPrefix) -> Result<Vec<DeadLetter>> {
        let metas: Vec<_> = self
            .store
            .list(Some(&prefix.dead_letter_dir()))
            .try_collect()
            .await
            .map_err(|e| Error::store("listing dead letters", e))?;
        let mut seqs: Vec<u64> = metas
            .iter()
            .filter_map(|m| m.location.filename()?.parse().ok())
            .collect();
        seqs.sort_unstable();
        let mut out = Vec::with_capacity(seqs.len());
        for seq in seqs {
            out.push(self.get(prefix, seq).await?);
        }
        Ok(out)
    }

    /// Notes that the letter was requeued (overwrites the letter with the note added).
    pub async fn mark_requeued(
        &self,
        prefix: &ConversationPrefix,
        lane_seq: u64,
        requeued: Requeued,
    ) -> Result<()> {
        let mut letter = self.get(prefix, lane_seq).await?;
        letter.requeued = Some(requeued);
        let bytes = serde_json::to_vec(&letter).expect("dead letters serialise");
        self.store
            .put(&prefix.dead_letter(lane_seq), PutPayload::from(bytes))
            .await
            .map_err(|e| Error::store("noting a requeue", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnpike_schemas::ConversationId;

    #[tokio::test]
    async fn a_letter_is_parked_once_and_listed_in_lane_order() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let letters = DeadLetters::new(store);
        let prefix = ConversationPrefix::new("acme".parse().unwrap(), ConversationId::new());
        let raw = b"{\"body\":{\"kind\":\"from_the_future\"}}\xff";
        letters
            .park(&prefix, &DeadLetter::new(12, "unreadable", 1, raw))
            .await
            .unwrap();
        // A second owner parks the same sequence with other words: the first letter stays.
        letters
            .park(&prefix, &DeadLetter::new(12, "again", 2, b"x"))
            .await
            .unwrap();
        letters
            .park(&prefix, &DeadLetter::new(3, "refused", 3, b"y"))
            .await
            .unwrap();
        let listed = letters.list(&prefix).await.unwrap();
        assert_eq!(
            listed.iter().map(|l| l.lane_seq).collect::<Vec<_>>(),
            [3, 12]
        );
        assert_eq!(listed[1].reason, "unreadable");
        assert_eq!(listed[1].bytes().unwrap(), raw);
        letters
            .mark_requeued(
                &prefix,
                12,
                Requeued {
                    by: "op".into(),
                    at_ms: 9,
                    lane_seq: 40,
                },
            )
            .await
            .unwrap();
        assert_eq!(
            letters
                .get(&prefix, 12)
                .await
                .unwrap()
                .requeued
                .unwrap()
                .lane_seq,
            40
        );
    }
}
