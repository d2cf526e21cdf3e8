//! The context timeline: what an agent is fed, rebuilt for every turn from durable state.
//!
//! Contract: [`rebuild`] reads the context snapshot the previous turn left (one fetch). Where
//! there is none (a quarantined turn, a native app that never built a timeline), it falls back
//! to [`rebuild_from_logs`]: the log of the turn holding the latest compaction summary (the
//! record's signed state names it) and the logs of the turns after the summary — one fetch per
//! turn, never a scan of the record. Both give the same rows, and neither grows with the
//! conversation's total length.
//! Rows keep their order and carry stable references (`conv:tl:<conv>/turn_<n>/blocks/<i>`);
//! file rows say where a file is, never its bytes.
//!
//! A snapshot is trimmed by the estimate of [`turnpike_agent::timeline::estimate_tokens`].

use std::sync::Arc;

use futures::{StreamExt as _, TryStreamExt as _};
use turnpike_artifactory::{ConversationPrefix, ErrorKind, TurnLogs};
use turnpike_schemas::entry::RecordState;
use turnpike_schemas::timeline::{ContextSnapshot, CONTEXT_VERSION};
use turnpike_schemas::{Block, Row, TurnId};

pub use turnpike_agent::timeline::Timeline;
use turnpike_agent::timeline::{estimate_tokens, messages};

use crate::error::Result;

/// How many turn logs are fetched at once.
const FETCH_CONCURRENCY: usize = 16;

/// Rebuilds the timeline of the turns before `before`: the previous turn's snapshot, or else
/// the latest summary and the turn logs after it.
pub async fn rebuild(
    logs: &TurnLogs,
    prefix: &ConversationPrefix,
    state: &RecordState,
    before: TurnId,
) -> Result<Timeline> {
    if let Some(previous) = before.number().checked_sub(1).and_then(TurnId::new) {
        if let Some(snapshot) = logs.read_context(prefix, previous).await? {
            return Ok(Timeline {
                rows: snapshot,
                logs_read: 1,
                from_snapshot: true,
            });
        }
    }
    rebuild_from_logs(logs, prefix, state, before).await
}

/// Rebuilds the timeline of the turns before `before` from the latest summary and the turn
/// logs after it.
pub async fn rebuild_from_logs(
    logs: &TurnLogs,
    prefix: &ConversationPrefix,
    state: &RecordState,
    before: TurnId,
) -> Result<Timeline> {
    let mut first = 1;
    let mut summary_log = None;
    if state.summary_turn > 0 && state.summary_turn < before.number() {
        let turn = TurnId::new(state.summary_turn).expect("non-zero");
        if let Some(log) = read_optional(logs, prefix, turn).await? {
            if let Some(through) = log.blocks.iter().find_map(|b| match b {
                Block::Summary { through, .. } => Some(*through),
                _ => None,
            }) {
                // The summary replaces the turns through `through`; its own turn follows.
                first = through.number() + 1;
                summary_log = Some(log);
            }
        }
    }
    let summary_turn = summary_log.as_ref().map(|l| l.turn);
    let turns: Vec<TurnId> = (first..before.number())
        .filter_map(TurnId::new)
        .filter(|t| Some(*t) != summary_turn)
        .collect();
    let fetched: Vec<_> = futures::stream::iter(turns)
        .map(|turn| async move { read_optional(logs, prefix, turn).await })
        .buffered(FETCH_CONCURRENCY)
        .try_collect()
        .await?;
    let mut all: Vec<_> = fetched.into_iter().flatten().chain(summary_log).collect();
    all.sort_by_key(|l| l.turn);
    let logs_read = all.len();
    let mut rows = Vec::new();
    for log in all {
        for (i, block) in log.blocks.into_iter().enumerate() {
            // What a turn recalled was for that turn only.
            if !matches!(block, Block::Recall { .. }) {
                rows.push(Row::new(prefix.conversation(), log.turn, i, block));
            }
        }
    }
    Ok(Timeline {
        rows: Arc::new(rows),
        logs_read,
        from_snapshot: false,
    })
}

/// The snapshot after `turn`: the timeline it was built on plus its own blocks — less the turns
/// a summary in its log replaces — trimmed from the oldest end
/// to at most `budget` estimated tokens (whole rows; the newest rows always stay).
pub fn snapshot_after(
    before: &Timeline,
    prefix: &ConversationPrefix,
    turn: TurnId,
    blocks: &[Block],
    budget: u64,
) -> ContextSnapshot {
    let own: Vec<Row> = blocks
        .iter()
        .enumerate()
        .filter(|(_, b)| !matches!(b, Block::Recall { .. }))
        .map(|(i, b)| Row::new(prefix.conversation(), turn, i, b.clone()))
        .collect();
    // A summary in this turn replaces the turns through its `through`.
    let through = blocks.iter().find_map(|b| match b {
        Block::Summary { through, .. } => Some(*through),
        _ => None,
    });
    let mut rows: Vec<Row> = before
        .rows
        .iter()
        .filter(|r| through.is_none_or(|t| r.turn() > t))
        .cloned()
        .chain(own)
        .collect();
    let mut total = 0u64;
    let mut keep_from = rows.len();
    for (i, row) in rows.iter().enumerate().rev() {
        total += messages([&row.block])
            .iter()
            .map(estimate_tokens)
            .sum::<u64>();
        if total > budget {
            break;
        }
        keep_from = i;
    }
    rows.drain(..keep_from);
    ContextSnapshot {
        version: CONTEXT_VERSION,
        conversation: prefix.conversation(),
        through: turn,
        rows,
    }
}

async fn read_optional(
    logs: &TurnLogs,
    prefix: &ConversationPrefix,
    turn: TurnId,
) -> Result<Option<turnpike_schemas::TurnLog>> {
    match logs.read(prefix, turn).await {
        Ok(log) => Ok(Some(log)),
        // A quarantined turn has no log.
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnpike_agent::message::Role;
    use turnpike_agent::timeline::RECALL_HEADER;

    #[test]
    fn what_a_turn_recalled_is_its_own_and_leaves_no_row_for_later_turns() {
        let conversation = turnpike_schemas::ConversationId::new();
        let prefix = ConversationPrefix::new("acme".parse().unwrap(), conversation);
        let hit = turnpike_schemas::RecallHit {
            reference: "conv:tl:conv_01ARZ3NDEKTSV4RRFFQ69G5FAV/turn_1/blocks/0".into(),
            conversation: "conv_01ARZ3NDEKTSV4RRFFQ69G5FAV".parse().unwrap(),
            turn: TurnId::FIRST,
            kind: "prompt".into(),
            score: 0.5,
            snippet: "the locker code is 4417".into(),
        };
        let blocks = vec![
            Block::UserMessage {
                text: "code?".into(),
            },
            Block::Recall {
                query: "code?".into(),
                hits: vec![hit],
                note: None,
            },
            Block::AssistantMessage {
                text: "4417".into(),
            },
        ];
        // The turn itself reads it …
        let own = messages(blocks.iter());
        assert!(own.iter().any(|m| m.role == Role::User
            && m.content.starts_with(RECALL_HEADER)
            && m.content.contains("4417")));
        // … the next turn's timeline does not, and the rows keep their log positions.
        let snapshot = snapshot_after(
            &Timeline::default(),
            &prefix,
            TurnId::FIRST,
            &blocks,
            10_000,
        );
        assert_eq!(snapshot.rows.len(), 2);
        assert!(snapshot.rows[1]
            .reference
            .to_string()
            .ends_with("/blocks/2"));
        assert!(snapshot
            .rows
            .iter()
            .all(|r| !matches!(r.block, Block::Recall { .. })));
    }
}
