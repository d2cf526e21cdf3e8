//! The trait every index backend implements (Postgres + pgvector; embedded tantivy + redb).

use async_trait::async_trait;

use turnpike_schemas::{ConversationId, TurnId};

use crate::error::Result;
use crate::types::{Candidate, Filters, IndexRow, RowId, RowInfo, Scope};

/// Where index rows live and how each retriever finds candidates.
///
/// Contracts (the shared suite in `tests/index_suite.rs` checks them on every backend):
/// - `upsert` writes every row or fails; a row with an id already present replaces it, so
///   writing the same rows twice leaves the index as it was after the first write.
/// - `lexical` and `vector` return at most `k` candidates, best first, only rows of `scope`
///   that pass `filters`. `vector` ignores rows of another dimension.
/// - `mark`/`set_mark`: how far a conversation is indexed; `set_mark` never moves it back.
/// - `list` and `delete` see only `scope`: a user lists and forgets only their own rows.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    fn name(&self) -> &'static str;

    async fn upsert(&self, rows: &[IndexRow]) -> Result<()>;

    async fn lexical(
        &self,
        scope: &Scope,
        filters: &Filters,
        text: &str,
        k: usize,
    ) -> Result<Vec<Candidate>>;

    async fn vector(
        &self,
        scope: &Scope,
        filters: &Filters,
        embedding: &[f32],
        k: usize,
    ) -> Result<Vec<Candidate>>;

    /// The last turn of `conversation` whose rows are all written, if any.
    async fn mark(&self, scope: &Scope, conversation: ConversationId) -> Result<Option<TurnId>>;

    async fn set_mark(
        &self,
        scope: &Scope,
        conversation: ConversationId,
        turn: TurnId,
    ) -> Result<()>;

    /// How many rows `scope` has.
    async fn count(&self, scope: &Scope) -> Result<u64>;

    /// Deletes every row and mark of `scope` (a user's data leaving); returns the rows deleted.
    async fn forget(&self, scope: &Scope) -> Result<u64>;

    /// The rows of `scope` that pass `filters`, newest first (then by id), skipping `offset`,
    /// at most `limit`: what the index remembers of a user.
    async fn list(
        &self,
        scope: &Scope,
        filters: &Filters,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<RowInfo>>;

    /// Deletes the rows of `scope` that pass `filters` and, if given, have one of `ids`;
    /// marks stay (the record is not re-indexed for it). Returns the rows deleted. Rows of
    /// another scope are never touched, whatever the ids.
    async fn delete(&self, scope: &Scope, filters: &Filters, ids: Option<&[RowId]>) -> Result<u64>;

    /// Deletes a conversation's mark (the conversation is gone; its rows are deleted with
    /// [`Backend::delete`]).
    async fn drop_mark(&self, scope: &Scope, conversation: ConversationId) -> Result<()>;

    /// Many rows are about to be written (a full rebuild): the backend may set aside what is
    /// cheaper to build once after the load than to keep up row by row. Every contract above
    /// still holds meanwhile — searches stay correct, if slower, and live writes go on — and
    /// [`Backend::end_bulk`] restores it. A process that dies between the two leaves the index
    /// correct; what was set aside comes back with the next `end_bulk` or open. A second
    /// `begin_bulk` while one is running joins it. The default sets nothing aside.
    async fn begin_bulk(&self) -> Result<()> {
        Ok(())
    }

    /// Ends what [`Backend::begin_bulk`] began: rebuilds what it set aside. Without a
    /// `begin_bulk` before it, it restores whatever a load that died left set aside (and
    /// otherwise does nothing).
    async fn end_bulk(&self) -> Result<()> {
        Ok(())
    }
}
