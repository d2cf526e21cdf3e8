//! Turn logs: one object per turn, so reading a turn is one fetch.

use std::sync::Arc;

use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload, RenameOptions, RenameTargetMode};
use turnpike_schemas::timeline::{ContextSnapshot, CONTEXT_VERSION};
use turnpike_schemas::turnlog::TURN_LOG_VERSION;
use turnpike_schemas::{TurnId, TurnLog};

use crate::error::{Error, ErrorKind, Result};
use crate::layout::ConversationPrefix;

/// Reads and writes turn logs.
#[derive(Debug, Clone)]
pub struct TurnLogs {
    store: Arc<dyn ObjectStore>,
    /// Context snapshots parsed before, shared by clones (see `crate::context_cache`).
    contexts: Arc<crate::context_cache::ContextCache>,
}

impl TurnLogs {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self {
            store,
            contexts: Arc::default(),
        }
    }

    /// Forgets the context snapshots parsed before: the next reads parse again.
    pub fn forget_parsed(&self) {
        self.contexts.clear();
    }

    /// Writes a turn's log at its canonical key (for fixtures and imports; a worker writes
    /// through [`Self::write_attempt`]). Returns the SHA-256 (hex) of the bytes written.
    pub async fn write(&self, prefix: &ConversationPrefix, log: &TurnLog) -> Result<String> {
        let (bytes, digest) = Self::encode_log(prefix, log)?;
        self.store
            .put(&prefix.turn_log(log.turn), PutPayload::from(bytes))
            .await
            .map_err(|e| Error::store(&format!("writing the log of {}", log.turn), e))?;
        Ok(digest)
    }

    /// Writes a turn's log as attempt `attempt` wrote it: created only if absent, under a key
    /// no other attempt uses (see [`crate::attempts`]). Returns the SHA-256 (hex) of the bytes.
    pub async fn write_attempt(
        &self,
        prefix: &ConversationPrefix,
        log: &TurnLog,
        attempt: u64,
    ) -> Result<String> {
        let (bytes, digest) = Self::encode_log(prefix, log)?;
        let path = prefix.in_attempt(&prefix.turn_log(log.turn), log.turn, attempt);
        let what = format!("writing the log of {} (attempt {attempt})", log.turn);
        crate::attempts::create_before_commit(self.store.as_ref(), &path, bytes.into(), &what)
            .await?;
        Ok(digest)
    }

    /// Promotes a committed attempt's log to its canonical key. Call only once the record's
    /// `turn_complete` names the attempt. Where the store renames create-only, the attempt's
    /// object is moved there: one write, and no copy left to clear. Otherwise (a store that
    /// cannot, or the key filled already by whoever else finished the promotion) the log is
    /// written create-only from the value its owner still holds — the same bytes the attempt
    /// wrote, not read back — and the same bytes already there are success. Returns whether
    /// the attempt's copy is gone.
    pub async fn promote(
        &self,
        prefix: &ConversationPrefix,
        log: &TurnLog,
        attempt: u64,
    ) -> Result<bool> {
        let canonical = prefix.turn_log(log.turn);
        let written = prefix.in_attempt(&canonical, log.turn, attempt);
        // Synced with the next write: after a power cut that lost it, the promotion is
        // unfinished, as after a crash before it, and the open-turn mark (cleared only after
        // it, so never lost without it) leads the next owner or a sweep to finish it.
        let mut options = RenameOptions::new().with_target_mode(RenameTargetMode::Create);
        options.extensions.insert(crate::SyncedWithNext);
        let moved = self.store.rename_opts(&written, &canonical, options).await;
        if moved.is_ok() {
            return Ok(true);
        }
        let (bytes, _) = Self::encode_log(prefix, log)?;
        let what = format!("promoting the log of {}", log.turn);
        crate::attempts::create(self.store.as_ref(), &canonical, bytes.into(), &what).await?;
        Ok(false)
    }

    /// Writes the context snapshot a committed turn leaves at its canonical key, created only
    /// if absent. Unlike the log it goes under no attempt: it is a cache (a missing one means a
    /// rebuild from the logs), written once the record's `turn_complete` names the turn's
    /// attempt, by that attempt's owner — a superseded owner never commits, so never writes
    /// it. That saves a turn an attempt copy and its removal, and its commit waits for one
    /// write fewer.
    pub async fn put_context(
        &self,
        prefix: &ConversationPrefix,
        snapshot: &ContextSnapshot,
    ) -> Result<()> {
        let bytes = Self::encode_context(prefix, snapshot)?;
        let path = prefix.context_snapshot(snapshot.through);
        let what = format!("writing the context after {}", snapshot.through);
        // A cache: one a power cut lost means a rebuild from the logs.
        let opts = crate::store::synced_with_next(object_store::PutMode::Create);
        let put = crate::attempts::create_reporting(
            self.store.as_ref(),
            &path,
            bytes.into(),
            &what,
            opts,
        )
        .await?;
        // The next turn's rebuild — most often on this worker — needs no parse.
        if let Some(written) =
            put.and_then(|p| crate::context_cache::ObjectVersion::written(&path, &p))
        {
            self.contexts.put(written, Arc::new(snapshot.rows.clone()));
        }
        Ok(())
    }

    fn encode_log(prefix: &ConversationPrefix, log: &TurnLog) -> Result<(Vec<u8>, String)> {
        if log.conversation != prefix.conversation() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "the turn log belongs to another conversation",
            ));
        }
        let bytes = serde_json::to_vec(log).expect("turn logs serialise");
        let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
        Ok((bytes, digest))
    }

    /// Reads a turn's log: one fetch.
    pub async fn read(&self, prefix: &ConversationPrefix, turn: TurnId) -> Result<TurnLog> {
        self.read_checked(prefix, turn, None).await
    }

    /// Reads a turn's log and, when `sha256` (hex) is given — from the signed record's
    /// `turn_complete` — refuses a log whose bytes do not match it.
    pub async fn read_checked(
        &self,
        prefix: &ConversationPrefix,
        turn: TurnId,
        sha256: Option<&str>,
    ) -> Result<TurnLog> {
        let what = format!("reading the log of {turn} of {}", prefix.conversation());
        let bytes =
            crate::attempts::get_committed(&self.store, prefix, turn, &prefix.turn_log(turn))
                .await?
                .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("{what}: there is none")))?;
        if let Some(expected) = sha256 {
            let actual = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
            if actual != expected {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("{what}: its bytes do not match the digest the record signed"),
                ));
            }
        }
        let log: TurnLog = serde_json::from_slice(&bytes)
            .map_err(|e| Error::with_source(ErrorKind::Corrupt, format!("{what}: {e}"), e))?;
        if log.version != TURN_LOG_VERSION {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("{what}: unsupported version {}", log.version),
            ));
        }
        Ok(log)
    }

    /// Writes the context snapshot after a turn at its canonical key, replacing what is there
    /// (for fixtures; a worker writes through [`Self::put_context`]).
    pub async fn write_context(
        &self,
        prefix: &ConversationPrefix,
        snapshot: &ContextSnapshot,
    ) -> Result<()> {
        let bytes = Self::encode_context(prefix, snapshot)?;
        self.store
            .put(
                &prefix.context_snapshot(snapshot.through),
                PutPayload::from(bytes),
            )
            .await
            .map_err(|e| {
                Error::store(
                    &format!("writing the context after {}", snapshot.through),
                    e,
                )
            })?;
        Ok(())
    }

    /// Deletes the context snapshot after `turn` (gone already: fine). Only the latest turn's
    /// snapshot is ever read (the next turn's context starts from it); an older one is what
    /// made a conversation's storage grow with the square of its length.
    pub async fn forget_context(&self, prefix: &ConversationPrefix, turn: TurnId) -> Result<()> {
        let path = prefix.context_snapshot(turn);
        self.contexts.forget(path.as_ref());
        match self.store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Error::store(
                &format!("deleting the context after {turn}"),
                e,
            )),
        }
    }

    fn encode_context(prefix: &ConversationPrefix, snapshot: &ContextSnapshot) -> Result<Vec<u8>> {
        if snapshot.conversation != prefix.conversation() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "the context snapshot belongs to another conversation",
            ));
        }
        Ok(serde_json::to_vec(snapshot).expect("snapshots serialise"))
    }

    /// The rows of the context snapshot the previous turn left after `turn` (its canonical
    /// key), if there is one of this version for this conversation. The same stored object
    /// read again gives the same shared rows without parsing (see `crate::context_cache`).
    pub async fn read_context(
        &self,
        prefix: &ConversationPrefix,
        turn: TurnId,
    ) -> Result<Option<Arc<Vec<turnpike_schemas::Row>>>> {
        let what = format!(
            "reading the context after {turn} of {}",
            prefix.conversation()
        );
        // Canonical only: an owner finishes the previous turn's promotion before it starts a
        // turn, and a missing snapshot only means a rebuild from the logs.
        let path = prefix.context_snapshot(turn);
        // A version parsed (or written) here before: asked for only if it changed, so the
        // store sends no bytes when it did not.
        let known = self.contexts.known(path.as_ref());
        let options = object_store::GetOptions {
            if_none_match: known.as_ref().map(|v| v.e_tag().to_owned()),
            ..Default::default()
        };
        let found = match self.store.get_opts(&path, options).await {
            Ok(r) => r,
            Err(object_store::Error::NotModified { .. }) => {
                if let Some(rows) = known.as_ref().and_then(|v| self.contexts.get(v)) {
                    return Ok(Some(rows));
                }
                // Forgotten meanwhile: read it whole.
                match self.store.get(&path).await {
                    Ok(r) => r,
                    Err(object_store::Error::NotFound { .. }) => return Ok(None),
                    Err(e) => return Err(Error::store(&what, e)),
                }
            }
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(Error::store(&what, e)),
        };
        // The same object parsed (or written) before: its bytes need not even be read.
        let version = crate::context_cache::ObjectVersion::read(&found.meta);
        if let Some(rows) = version.as_ref().and_then(|v| self.contexts.get(v)) {
            return Ok(Some(rows));
        }
        let bytes = found.bytes().await.map_err(|e| Error::store(&what, e))?;
        let Some(snapshot) = serde_json::from_slice::<ContextSnapshot>(&bytes)
            .ok()
            .filter(|s| {
                s.version == CONTEXT_VERSION
                    && s.conversation == prefix.conversation()
                    && s.through == turn
            })
        else {
            return Ok(None);
        };
        let rows = Arc::new(snapshot.rows);
        if let Some(version) = version {
            self.contexts.put(version, rows.clone());
        }
        Ok(Some(rows))
    }

    /// Removes what an attempt at `turn` left behind (its log and context snapshot), for a turn
    /// that will never complete.
    pub async fn discard(&self, prefix: &ConversationPrefix, turn: TurnId) -> Result<()> {
        for path in [prefix.turn_log(turn), prefix.context_snapshot(turn)] {
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::store(&format!("discarding {path}"), e)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnpike_schemas::timeline::Row;
    use turnpike_schemas::{Block, ConversationId};

    fn snapshot(conversation: ConversationId, text: &str) -> ContextSnapshot {
        let turn = TurnId::new(3).unwrap();
        ContextSnapshot {
            version: CONTEXT_VERSION,
            conversation,
            through: turn,
            rows: vec![Row::new(
                conversation,
                turn,
                0,
                Block::UserMessage { text: text.into() },
            )],
        }
    }

    #[tokio::test]
    async fn a_parsed_snapshot_is_reused_only_for_the_same_object() {
        let dir = tempfile::tempdir().unwrap();
        let database = tempfile::tempdir().unwrap();
        // Each store answers a read that names the remembered version (`if_none_match`) its
        // own way: not modified, or the new object.
        for store in [
            Arc::new(object_store::memory::InMemory::new()) as Arc<dyn ObjectStore>,
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap()),
            Arc::new(crate::sqlite_store::SqliteStore::open(database.path(), false).unwrap()),
        ] {
            let logs = TurnLogs::new(store);
            let conversation = ConversationId::new();
            let prefix = ConversationPrefix::new("t".parse().unwrap(), conversation);
            let turn = TurnId::new(3).unwrap();
            logs.write_context(&prefix, &snapshot(conversation, "first"))
                .await
                .unwrap();
            let read = logs.read_context(&prefix, turn).await.unwrap().unwrap();
            assert_eq!(*read, snapshot(conversation, "first").rows);
            // Again: the same object, the same parsed rows (shared, not parsed again).
            let again = logs.read_context(&prefix, turn).await.unwrap().unwrap();
            assert!(Arc::ptr_eq(&again, &read));
            // The object replaced at the same key: the new bytes, never the remembered parse.
            logs.write_context(&prefix, &snapshot(conversation, "second, longer"))
                .await
                .unwrap();
            let replaced = logs.read_context(&prefix, turn).await.unwrap().unwrap();
            assert_eq!(*replaced, snapshot(conversation, "second, longer").rows);
            // Replaced by bytes of the same length: still the new bytes.
            logs.write_context(&prefix, &snapshot(conversation, "second, lender"))
                .await
                .unwrap();
            let same_size = logs.read_context(&prefix, turn).await.unwrap().unwrap();
            assert_eq!(*same_size, snapshot(conversation, "second, lender").rows);
            // Deleted: none, whatever was remembered.
            logs.discard(&prefix, turn).await.unwrap();
            assert!(logs.read_context(&prefix, turn).await.unwrap().is_none());

            // Written by this process: the next read shares the written rows, unparsed; a
            // fresh reader parses the same rows from the bytes.
            let log = TurnLog {
                version: TURN_LOG_VERSION,
                conversation,
                turn,
                agent: "a".parse().unwrap(),
                outcome: turnpike_schemas::entry::TurnOutcome::Replied,
                blocks: Vec::new(),
                usage: None,
                exchange: None,
                unindexed: false,
            };
            let promoted = snapshot(conversation, "promoted");
            logs.promote(&prefix, &log, 1).await.unwrap();
            logs.put_context(&prefix, &promoted).await.unwrap();
            let first = logs.read_context(&prefix, turn).await.unwrap().unwrap();
            let second = logs.read_context(&prefix, turn).await.unwrap().unwrap();
            assert!(Arc::ptr_eq(&first, &second), "promotion filled the memory");
            assert_eq!(*first, promoted.rows);
            let fresh = TurnLogs::new(logs.store.clone());
            assert_eq!(
                *fresh.read_context(&prefix, turn).await.unwrap().unwrap(),
                promoted.rows
            );
        }
    }
}
