//! Attempts: every object a turn writes besides the record goes first under a key unique to
//! the attempt (`attempts/turn_{n}/a{attempt}/…`, created only if absent), and is promoted to
//! the canonical key (`turns/turn_{n}/…`, also created only if absent) only once the record
//! holds the turn's `turn_complete` naming that attempt.
//!
//! So a superseded owner (a zombie that lost its lease while paused or partitioned) can write
//! what it likes under its own attempt: nothing reads it. Readers read canonical keys, which
//! only the committed attempt ever fills — after its commit, by its owner, or by whoever finds
//! the promotion unfinished (the next owner of the conversation, or a sweep). Promotion is
//! idempotent: each object is copied create-only, so running it twice, or concurrently, writes
//! each canonical object once, with the committed attempt's bytes.
//!
//! A log is moved, not copied, where the store renames create-only (`TurnLogs::promote`): one
//! write, or a copy before the removal, so it is never at neither key, and a reader that looks
//! at the canonical key, then the attempt's, then the canonical key again cannot miss it.
//!
//! One object skips the attempt: the context snapshot, a cache (one missing means a rebuild
//! from the turn logs). Its owner writes it at its canonical key, create-only, only after the
//! commit — what only the committed attempt's owner ever reaches (see
//! `TurnLogs::put_context`).

use std::sync::Arc;

use futures::TryStreamExt as _;
use object_store::{ObjectStore, ObjectStoreExt as _, PutMode, PutOptions, PutPayload};
use turnpike_schemas::TurnId;

use crate::error::{Error, Result};
use crate::layout::ConversationPrefix;

/// Writes `bytes` at `path`, created only if absent. An object already there with the same
/// bytes is success (a repeated write of the same attempt); other bytes are an error.
pub(crate) async fn create(
    store: &dyn ObjectStore,
    path: &object_store::path::Path,
    bytes: bytes::Bytes,
    what: &str,
) -> Result<()> {
    create_reporting(store, path, bytes, what, PutMode::Create.into())
        .await
        .map(|_| ())
}

/// [`create`] for an object that only the record's next batch makes count (an attempt's,
/// before the batch two naming it): on stable storage no later than that batch
/// ([`crate::SyncedWithNext`]).
pub(crate) async fn create_before_commit(
    store: &dyn ObjectStore,
    path: &object_store::path::Path,
    bytes: bytes::Bytes,
    what: &str,
) -> Result<()> {
    let opts = crate::store::synced_with_next(PutMode::Create);
    create_reporting(store, path, bytes, what, opts)
        .await
        .map(|_| ())
}

/// [`create`] with `opts` (its mode `Create`), saying what the store said of the object when
/// this call wrote it (`None` when it was there already with the same bytes).
pub(crate) async fn create_reporting(
    store: &dyn ObjectStore,
    path: &object_store::path::Path,
    bytes: bytes::Bytes,
    what: &str,
    opts: PutOptions,
) -> Result<Option<object_store::PutResult>> {
    match store
        .put_opts(path, PutPayload::from(bytes.clone()), opts)
        .await
    {
        Ok(put) => Ok(Some(put)),
        Err(
            object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. },
        ) => {
            let there = store
                .get(path)
                .await
                .map_err(|e| Error::store(what, e))?
                .bytes()
                .await
                .map_err(|e| Error::store(what, e))?;
            if there == bytes {
                return Ok(None);
            }
            Err(Error::new(
                crate::ErrorKind::AlreadyExists,
                format!("{what}: {path} exists already with other bytes; it is never overwritten"),
            ))
        }
        Err(e) => Err(Error::store(what, e)),
    }
}

/// Promotes what attempt `attempt` at `turn` wrote to the canonical keys. Call only once the
/// record holds the turn's `turn_complete` naming this attempt.
pub async fn promote(
    store: &Arc<dyn ObjectStore>,
    prefix: &ConversationPrefix,
    turn: TurnId,
    attempt: u64,
) -> Result<usize> {
    let dir = prefix.attempt_dir(turn, attempt);
    let what = format!(
        "promoting attempt {attempt} of {turn} of {}",
        prefix.partition()
    );
    let written: Vec<_> = store
        .list(Some(&dir))
        .try_collect()
        .await
        .map_err(|e| Error::store(&what, e))?;
    let mut promoted = 0;
    for meta in written {
        let Some(canonical) = prefix.promoted(&meta.location, turn, attempt) else {
            continue;
        };
        let bytes = match store.get(&meta.location).await {
            Ok(got) => got.bytes().await.map_err(|e| Error::store(&what, e))?,
            // Cleared since the listing (see [`clear`]): only ever after its promotion.
            Err(object_store::Error::NotFound { .. }) if store.head(&canonical).await.is_ok() => {
                continue;
            }
            Err(e) => return Err(Error::store(&what, e)),
        };
        create(store.as_ref(), &canonical, bytes, &what).await?;
        promoted += 1;
    }
    Ok(promoted)
}

/// Deletes what attempt `attempt` at `turn` wrote, once its promotion is done: the canonical
/// keys hold the same bytes, and an attempt's own keys are read only while its promotion is
/// unfinished. Without this every turn would keep its log twice (and, as earlier versions wrote
/// it under the attempt too, its context snapshot: each the size of the conversation's context,
/// growing a conversation's storage with the square of its length). `written`: the canonical keys the attempt wrote,
/// when the caller knows them (no listing); `None` lists the attempt's folder. Gone already is
/// fine. Returns how many objects it deleted or found gone.
pub async fn clear(
    store: &Arc<dyn ObjectStore>,
    prefix: &ConversationPrefix,
    turn: TurnId,
    attempt: u64,
    written: Option<&[object_store::path::Path]>,
) -> Result<usize> {
    let what = format!(
        "clearing attempt {attempt} of {turn} of {}",
        prefix.partition()
    );
    let paths: Vec<object_store::path::Path> = match written {
        Some(canonical) => canonical
            .iter()
            .map(|c| prefix.in_attempt(c, turn, attempt))
            .collect(),
        None => store
            .list(Some(&prefix.attempt_dir(turn, attempt)))
            .map_ok(|meta| meta.location)
            .try_collect()
            .await
            .map_err(|e| Error::store(&what, e))?,
    };
    for path in &paths {
        match store.delete(path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(Error::store(&what, e)),
        }
    }
    Ok(paths.len())
}

/// Reads a turn's object at its canonical key — or, while the promotion of the committed
/// attempt is not done yet (it runs right after the commit), from that attempt's own key, the
/// one the record's `turn_complete` names (and promotes it on the way). `None`: there is no
/// such object for the turn, or the turn is not complete. Never reads an attempt the record
/// does not name.
pub async fn get_committed(
    store: &Arc<dyn ObjectStore>,
    prefix: &ConversationPrefix,
    turn: TurnId,
    canonical: &object_store::path::Path,
) -> Result<Option<bytes::Bytes>> {
    let what = format!("reading {canonical}");
    let Some(committed) = open_committed(store, prefix, turn, canonical).await? else {
        return Ok(None);
    };
    let bytes = committed
        .object
        .bytes()
        .await
        .map_err(|e| Error::store(&what, e))?;
    if committed.unpromoted {
        // Best effort: the committed attempt's owner (or the next one) promotes it anyway.
        let _ = create(store.as_ref(), canonical, bytes.clone(), &what).await;
    }
    Ok(Some(bytes))
}

/// A turn's object opened for reading (see [`open_committed`]).
pub struct Committed {
    /// The object, not read yet: stream it or read it whole.
    pub object: object_store::GetResult,
    /// It was read from the committed attempt's key: its promotion is not done yet.
    pub unpromoted: bool,
}

/// Opens what [`get_committed`] reads, without reading it: for streaming large objects.
pub async fn open_committed(
    store: &Arc<dyn ObjectStore>,
    prefix: &ConversationPrefix,
    turn: TurnId,
    canonical: &object_store::path::Path,
) -> Result<Option<Committed>> {
    let what = format!("reading {canonical}");
    match store.get(canonical).await {
        Ok(object) => {
            return Ok(Some(Committed {
                object,
                unpromoted: false,
            }))
        }
        Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => return Err(Error::store(&what, e)),
    }
    let record = crate::Record::new(store.clone(), prefix.clone());
    let head = record.head().await?;
    // Only the latest complete turn can still be waiting for its promotion (an owner finishes
    // it before it runs another turn, even one opened with its commit): any other miss is a
    // plain miss, at no extra cost.
    if latest_complete(&head) != Some(turn) {
        return Ok(None);
    }
    let Some(attempt) = record
        .completion(&head, turn)
        .await?
        .and_then(|c| c.attempt)
    else {
        return Ok(None);
    };
    let written = prefix.in_attempt(canonical, turn, attempt);
    match store.get(&written).await {
        Ok(object) => Ok(Some(Committed {
            object,
            unpromoted: true,
        })),
        // Promoted since the first read: a log is moved out of its attempt (see
        // `TurnLogs::promote`), other objects' attempt copies are cleared after theirs.
        Err(object_store::Error::NotFound { .. }) => match store.get(canonical).await {
            Ok(object) => Ok(Some(Committed {
                object,
                unpromoted: false,
            })),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Error::store(&what, e)),
        },
        Err(e) => Err(Error::store(&what, e)),
    }
}

/// The record's latest complete turn: its last, or the one before while the last is open
/// (opened with that one's batch two, or on its own). `None`: none is.
pub fn latest_complete(head: &crate::Head) -> Option<TurnId> {
    let state = head.state();
    let last = if state.turn_open {
        state.last_turn.saturating_sub(1)
    } else {
        state.last_turn
    };
    TurnId::new(last)
}

/// Finishes the promotion of the record's latest complete turn (its owner may have died
/// between the commit and the promotion — also with the next turn opened by the same commit):
/// the attempt's objects, and its project version as the turn's git ref. Nothing to do for a
/// quarantined or pre-attempt turn, or none.
pub async fn finish_latest(
    store: &Arc<dyn ObjectStore>,
    record: &crate::Record,
    head: &crate::Head,
) -> Result<()> {
    let Some(turn) = latest_complete(head) else {
        return Ok(());
    };
    let Some(complete) = record.completion(head, turn).await? else {
        return Ok(());
    };
    let Some(attempt) = complete.attempt else {
        // Written before attempts existed: the turn wrote its canonical keys itself.
        return Ok(());
    };
    let prefix = record.prefix();
    promote(store, prefix, turn, attempt).await?;
    if let Some(version) = complete.version {
        let lineage = crate::git::Lineage::new(store.clone(), prefix.clone());
        lineage.publish_ref_once(turn, version).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn promotes_what_the_attempt_wrote(store: Arc<dyn ObjectStore>) {
        let prefix = ConversationPrefix::new(
            "acme".parse().unwrap(),
            turnpike_schemas::ConversationId::new(),
        );
        let turn = TurnId::new(3).unwrap();
        let file = prefix.hosted_file(turn, &turnpike_schemas::RefPath::parse("a/b.txt").unwrap());
        for (canonical, bytes) in [(prefix.turn_log(turn), "log"), (file.clone(), "file")] {
            let written = prefix.in_attempt(&canonical, turn, 7);
            create(store.as_ref(), &written, bytes.into(), "test")
                .await
                .unwrap();
        }
        // Another attempt's object is never promoted.
        let zombie = prefix.in_attempt(&prefix.context_snapshot(turn), turn, 8);
        create(store.as_ref(), &zombie, "zombie".into(), "test")
            .await
            .unwrap();
        assert_eq!(promote(&store, &prefix, turn, 7).await.unwrap(), 2);
        // Twice is the same as once.
        assert_eq!(promote(&store, &prefix, turn, 7).await.unwrap(), 2);
        let read = |p: object_store::path::Path| {
            let store = store.clone();
            async move { store.get(&p).await.unwrap().bytes().await.unwrap() }
        };
        assert_eq!(&read(prefix.turn_log(turn)).await[..], b"log");
        assert_eq!(&read(file).await[..], b"file");
        assert!(store.head(&prefix.context_snapshot(turn)).await.is_err());
        // A create over other bytes is refused, never an overwrite.
        let err = create(
            store.as_ref(),
            &prefix.turn_log(turn),
            "other".into(),
            "test",
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::AlreadyExists);
        // Once promoted, the attempt's own copies go (listed, or named by the caller); the
        // canonical objects stay, and a promotion run again finds nothing left to do.
        assert_eq!(clear(&store, &prefix, turn, 7, None).await.unwrap(), 2);
        let left: Vec<_> = store
            .list(Some(&prefix.attempt_dir(turn, 7)))
            .try_collect()
            .await
            .unwrap();
        assert!(left.is_empty(), "{left:?}");
        assert_eq!(&read(prefix.turn_log(turn)).await[..], b"log");
        assert_eq!(promote(&store, &prefix, turn, 7).await.unwrap(), 0);
        // Another attempt's keys are not this one's to clear.
        assert!(store.head(&zombie).await.is_ok());
        let named = [prefix.context_snapshot(turn)];
        assert_eq!(
            clear(&store, &prefix, turn, 8, Some(&named)).await.unwrap(),
            1
        );
        assert!(store.head(&zombie).await.is_err());
        // Gone already is fine.
        assert_eq!(
            clear(&store, &prefix, turn, 8, Some(&named)).await.unwrap(),
            1
        );
    }

    #[tokio::test]
    async fn promotion_in_memory() {
        promotes_what_the_attempt_wrote(Arc::new(object_store::memory::InMemory::new())).await;
    }

    #[tokio::test]
    async fn promotion_on_the_local_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        promotes_what_the_attempt_wrote(store).await;
    }
}
