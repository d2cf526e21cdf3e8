//! Turning finished turns into index rows, idempotently, and keeping at it until the backend
//! takes them.
//!
//! Each conversation has a mark in the index: the last turn whose rows are all written. Catching
//! a conversation up indexes every completed turn after its mark, then moves the mark. Row ids are
//! the references of the blocks they came from, so writing a turn twice changes nothing; a
//! failure before the mark moves is simply done again. The record is the source: rows lost with
//! the index are rebuilt from it (`turnpike index rebuild`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};
use turnpike_artifactory::{Conversations, DirectoryEntry, Record};
use turnpike_schemas::{
    Block, ConversationId, EntryBody, Identity, Reference, Row, TurnId, TurnLog,
};

use crate::error::{Error, ErrorKind, Result};
use crate::types::{IndexRow, Kind, RowId, RowInfo, Scope};
use crate::Index;

/// Text files up to this size are indexed by content as well as by name.
const MAX_FILE_TEXT: u64 = 256 * 1024;

/// The scope a conversation's rows belong to: its owner's.
pub fn scope_of(entry: &DirectoryEntry) -> Scope {
    Scope::new(entry.tenant.clone(), entry.owner.clone())
}

/// Indexes conversations from their records and turn logs.
#[derive(Clone)]
pub struct Indexer {
    index: Index,
    conversations: Conversations,
    resolver: turnpike_resolver::Resolver,
}

impl Indexer {
    pub fn new(index: Index, store: Arc<dyn ObjectStore>) -> Self {
        let conversations = Conversations::new(store.clone());
        let resolver =
            turnpike_resolver::Resolver::standard(conversations.directory().clone(), store);
        Self {
            index,
            conversations,
            resolver,
        }
    }

    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Indexes every completed turn of `conversation` after its mark; returns how many turns
    /// it wrote.
    pub async fn catch_up(&self, conversation: ConversationId) -> Result<usize> {
        self.index_conversation(conversation, false).await
    }

    /// Indexes the completed turns of `conversation` after its mark, or all of them (`full`).
    pub async fn index_conversation(
        &self,
        conversation: ConversationId,
        full: bool,
    ) -> Result<usize> {
        let entry = match self
            .conversations
            .directory()
            .lookup_unchecked(conversation)
            .await
        {
            Ok(entry) => entry,
            // Deleted (or never finished being created): nothing to index, nothing to retry.
            Err(e) if e.kind() == turnpike_artifactory::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(Error::new(ErrorKind::Unavailable, e.to_string())),
        };
        let scope = scope_of(&entry);
        let mark = if full {
            None
        } else {
            self.index.backend().mark(&scope, conversation).await?
        };
        let record = Record::new(self.conversations.store().clone(), entry.prefix());
        let unavailable =
            |e: turnpike_artifactory::Error| Error::new(ErrorKind::Unavailable, e.to_string());
        let head = record.head().await.map_err(unavailable)?;
        let state = head.state();
        let last_complete = state.last_turn.saturating_sub(u64::from(state.turn_open));
        let after = mark.map_or(0, |t| t.number());
        if last_complete <= after {
            return Ok(0);
        }
        // The `turn_complete` entries of the turns after the mark sit in the record's last
        // batches: read a window back from the head (bounded by how far behind the index is,
        // not by the record's length), and the whole record only if the window misses one.
        let wanted = (last_complete - after) as usize;
        let window = 3 * wanted as u64 + 4;
        let completed_after =
            |entries: &[turnpike_artifactory::RecordEntry]| -> BTreeMap<TurnId, u64> {
                entries
                    .iter()
                    .filter_map(|e| match &e.body {
                        EntryBody::TurnComplete(c) => Some((c.turn, c.at_ms)),
                        _ => None,
                    })
                    .filter(|(turn, _)| turn.number() > after)
                    .collect()
            };
        let entries = record
            .entries_from(head.batches().saturating_sub(window))
            .await
            .map_err(unavailable)?;
        let mut completed = completed_after(&entries);
        if completed.len() < wanted && head.batches() > window {
            completed = completed_after(&record.entries().await.map_err(unavailable)?);
        }
        // What the owner asked to forget stays forgotten, however often this runs.
        let forgotten = self
            .conversations
            .forgotten()
            .list(&entry.prefix())
            .await
            .map_err(unavailable)?;
        let mut written = 0;
        for (turn, at_ms) in completed {
            let log = self
                .conversations
                .turn_logs()
                .read(&entry.prefix(), turn)
                .await
                .map_err(|e| Error::new(ErrorKind::Unavailable, e.to_string()))?;
            let mut rows = if log.unindexed {
                // The agent opted out of indexing: the turn is marked done with no rows.
                Vec::new()
            } else {
                self.rows_of(&entry, &log, at_ms as i64).await
            };
            rows.retain(|r| !forgotten.forgets(r.info.id.as_str(), r.info.turn));
            let ids: Vec<RowId> = rows.iter().map(|r| r.info.id.clone()).collect();
            self.index.write(rows).await?;
            // What was deleted or forgotten while these rows were made goes again now: the
            // tombstone and the forget markers are written before their deletions, so one
            // that this check misses deletes the rows written here itself.
            if self.undo_if_gone(&entry, &scope).await? {
                return Ok(written);
            }
            let forgotten_now = self
                .conversations
                .forgotten()
                .list(&entry.prefix())
                .await
                .map_err(unavailable)?;
            if forgotten_now != forgotten {
                let undone: Vec<RowId> = ids
                    .into_iter()
                    .filter(|id| forgotten_now.forgets(id.as_str(), turn))
                    .collect();
                self.index
                    .backend()
                    .delete(&scope, &Default::default(), Some(&undone))
                    .await?;
            }
            self.index
                .backend()
                .set_mark(&scope, conversation, turn)
                .await?;
            written += 1;
        }
        Ok(written)
    }

    /// Whether the conversation was deleted (a tombstone exists) — then its rows and mark,
    /// written by this indexer after the deletion removed them, are removed again.
    async fn undo_if_gone(&self, entry: &DirectoryEntry, scope: &Scope) -> Result<bool> {
        let tombstone = self
            .conversations
            .tombstones()
            .get(&entry.tenant, entry.conversation)
            .await
            .map_err(|e| Error::new(ErrorKind::Unavailable, e.to_string()))?;
        if tombstone.is_none() {
            return Ok(false);
        }
        let filters = crate::types::Filters {
            conversation: Some(entry.conversation),
            ..Default::default()
        };
        self.index.backend().delete(scope, &filters, None).await?;
        self.index
            .backend()
            .drop_mark(scope, entry.conversation)
            .await?;
        Ok(true)
    }

    /// Catches up every conversation in the store (the rebuild; `full`: every turn again,
    /// with the backend in bulk mode): returns (conversations, turns) indexed.
    pub async fn rebuild(&self, full: bool) -> Result<(usize, usize)> {
        let list = self
            .conversations
            .directory()
            .list()
            .await
            .map_err(|e| Error::new(ErrorKind::Unavailable, e.to_string()))?;
        let backend = self.index.backend();
        if full {
            backend.begin_bulk().await?;
        }
        let mut indexed = Ok(0);
        for entry in &list {
            match self.index_conversation(entry.conversation, full).await {
                Ok(turns) => indexed = indexed.map(|n| n + turns),
                Err(e) => {
                    indexed = Err(e);
                    break;
                }
            }
        }
        // What bulk mode set aside comes back even when the rebuild failed (whose error is
        // the one reported).
        if full {
            let ended = backend.end_bulk().await;
            let turns = indexed?;
            ended?;
            return Ok((list.len(), turns));
        }
        Ok((list.len(), indexed?))
    }

    /// The rows of one turn log.
    pub async fn rows_of(
        &self,
        entry: &DirectoryEntry,
        log: &TurnLog,
        at_ms: i64,
    ) -> Vec<IndexRow> {
        let scope = scope_of(entry);
        let mut rows = Vec::new();
        for (i, block) in log.blocks.iter().enumerate() {
            let row_ref = Row::new(log.conversation, log.turn, i, block.clone()).reference;
            let (kind, text, reference) = match block {
                Block::UserMessage { text } | Block::FollowUp { text } | Block::Steer { text } => {
                    (Kind::Prompt, text.clone(), row_ref.clone())
                }
                Block::AssistantMessage { text } => {
                    (Kind::Completion, text.clone(), row_ref.clone())
                }
                Block::Summary { text, .. } => (Kind::Summary, text.clone(), row_ref.clone()),
                Block::Attachment {
                    name,
                    media_type,
                    reference,
                } => (
                    Kind::Attachment,
                    self.file_text(&entry.owner, name, media_type, reference)
                        .await,
                    reference.clone(),
                ),
                Block::File {
                    path,
                    reference,
                    media_type,
                    size,
                } => {
                    let text = if *size <= MAX_FILE_TEXT {
                        self.file_text(&entry.owner, path, media_type, reference)
                            .await
                    } else {
                        path.clone()
                    };
                    (Kind::File, text, reference.clone())
                }
                _ => continue,
            };
            if text.trim().is_empty() {
                continue;
            }
            rows.push(IndexRow {
                scope: scope.clone(),
                info: RowInfo {
                    id: RowId::new(row_ref.to_string()),
                    app: entry.app.clone(),
                    agent: log.agent.clone(),
                    conversation: log.conversation,
                    turn: log.turn,
                    kind,
                    reference: reference.to_string(),
                    at_ms,
                },
                text,
                embedding: Vec::new(),
            });
        }
        rows
    }

    /// A file's name, and its content when it is text.
    async fn file_text(
        &self,
        owner: &Identity,
        name: &str,
        media_type: &str,
        reference: &Reference,
    ) -> String {
        let texty = media_type.starts_with("text/")
            || matches!(
                media_type,
                "application/json" | "application/xml" | "application/x-yaml" | "application/toml"
            );
        if !texty {
            return name.to_owned();
        }
        match self.resolver.resolve(owner, reference).await {
            Ok(resolved) if resolved.bytes.len() as u64 <= MAX_FILE_TEXT => {
                match std::str::from_utf8(&resolved.bytes) {
                    Ok(content) => format!("{name}\n{content}"),
                    Err(_) => name.to_owned(),
                }
            }
            Ok(_) => name.to_owned(),
            Err(e) => {
                debug!(%reference, error = %e, "indexing a file by name only");
                name.to_owned()
            }
        }
    }
}

/// Keeps indexing conversations in the background: a conversation handed to it is caught up,
/// and retried with backoff (up to a minute apart) while the backend fails — nothing handed to
/// it is dropped while the process lives; what a dead process had pending is caught up with the
/// conversation's next turn, or by a rebuild.
#[derive(Clone)]
pub struct IndexQueue {
    index: Index,
    tx: mpsc::UnboundedSender<ConversationId>,
    pending: watch::Receiver<usize>,
}

impl IndexQueue {
    /// Starts the queue's task on the current runtime.
    pub fn start(indexer: Indexer) -> Self {
        let index = indexer.index().clone();
        let (tx, mut rx) = mpsc::unbounded_channel::<ConversationId>();
        let (pending_tx, pending) = watch::channel(0usize);
        tokio::spawn(async move {
            let mut waiting: std::collections::BTreeSet<ConversationId> = Default::default();
            let mut backoff = Duration::from_millis(200);
            loop {
                if waiting.is_empty() {
                    match rx.recv().await {
                        Some(c) => {
                            waiting.insert(c);
                        }
                        None => return,
                    }
                }
                while let Ok(c) = rx.try_recv() {
                    waiting.insert(c);
                }
                pending_tx.send_replace(waiting.len());
                metrics::gauge!("turnpike_index_queue_depth").set(waiting.len() as f64);
                let mut failed = false;
                for conversation in std::mem::take(&mut waiting) {
                    match indexer.catch_up(conversation).await {
                        Ok(n) => debug!(%conversation, turns = n, "indexed"),
                        Err(e) => {
                            warn!(%conversation, error = %e, "indexing failed; will retry");
                            metrics::counter!("turnpike_index_failures_total").increment(1);
                            waiting.insert(conversation);
                            failed = true;
                        }
                    }
                }
                pending_tx.send_replace(waiting.len());
                metrics::gauge!("turnpike_index_queue_depth").set(waiting.len() as f64);
                if failed {
                    // Wait out the backoff, still taking new conversations.
                    let sleep = tokio::time::sleep(backoff);
                    tokio::pin!(sleep);
                    loop {
                        tokio::select! {
                            _ = &mut sleep => break,
                            c = rx.recv() => match c {
                                Some(c) => { waiting.insert(c); }
                                None => return,
                            },
                        }
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(60));
                } else {
                    backoff = Duration::from_millis(200);
                }
            }
        });
        Self { index, tx, pending }
    }

    /// The index the queue writes to.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Asks for `conversation` to be caught up.
    pub fn push(&self, conversation: ConversationId) {
        let _ = self.tx.send(conversation);
    }

    /// How many conversations are waiting for a retry.
    pub fn pending(&self) -> usize {
        *self.pending.borrow()
    }
}
