//! Conversation phases for operators, in the words of `kubectl get`: a phase (Idle, Running,
//! Waiting, IdleClosed, Closed) and conditions — Ready, Progressing, Degraded — each with a reason.
//!
//! Degraded means an operator should look: the record's head does not verify (unreadable, or
//! not signed by a trusted key), the last turn was quarantined (a side-effecting call was
//! interrupted and not run again: someone must decide whether it took effect), or the index
//! is behind the record (when an index is given).
//!
//! Reading one conversation's phase costs its head, its closed marker, and its last batch.

use serde::Serialize;
use turnpike_artifactory::{Conversations, DirectoryEntry};
use turnpike_schemas::{AppId, EntryBody, TenantId};

/// The phases a listing can be narrowed to.
pub const PHASES: [&str; 5] = ["idle", "running", "waiting", "idle_closed", "closed"];

/// The phases of `tenant`'s conversations (of `app`, when given), newest first; with
/// `status` (one of [`PHASES`]), only those in that phase.
pub async fn list(
    conversations: &Conversations,
    tenant: &TenantId,
    app: Option<&AppId>,
    status: Option<&str>,
    index: Option<&turnpike_index::Index>,
) -> turnpike_artifactory::Result<Vec<Phase>> {
    let mut entries: Vec<DirectoryEntry> = conversations
        .directory()
        .list()
        .await?
        .into_iter()
        .filter(|e| e.tenant == *tenant && app.is_none_or(|a| *a == e.app))
        .collect();
    entries.sort_by_key(|e| std::cmp::Reverse(e.created_ms));
    let mut out = Vec::new();
    for entry in &entries {
        let p = phase(conversations, entry, index).await;
        if status.is_none_or(|s| p.phase.eq_ignore_ascii_case(&s.replace('_', ""))) {
            out.push(p);
        }
    }
    Ok(out)
}

/// One condition: whether it holds, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Condition {
    /// `Ready`, `Progressing` or `Degraded`.
    pub kind: &'static str,
    pub status: bool,
    pub reason: String,
}

/// A conversation as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Phase {
    pub conversation: String,
    pub tenant: String,
    pub app: String,
    /// The agent its turns run now (after any switch).
    pub agent: String,
    /// `Idle`, `Running`, `Waiting`, `IdleClosed`, `Closed`, or `Unknown` when the head cannot
    /// be read.
    pub phase: &'static str,
    pub ready: bool,
    pub conditions: Vec<Condition>,
    pub created_ms: u64,
    pub turns: u64,
}

/// The phase of the conversation of `entry`; `index`, when given, is checked for lag.
pub async fn phase(
    conversations: &Conversations,
    entry: &DirectoryEntry,
    index: Option<&turnpike_index::Index>,
) -> Phase {
    let record = conversations.record(entry.prefix());
    let mut out = Phase {
        conversation: entry.conversation.to_string(),
        tenant: entry.tenant.to_string(),
        app: entry.app.to_string(),
        agent: entry.agent.to_string(),
        phase: "Unknown",
        ready: false,
        conditions: Vec::new(),
        created_ms: entry.created_ms,
        turns: 0,
    };
    let head = match record.head().await {
        Ok(head) => head,
        Err(e) => {
            out.conditions.push(Condition {
                kind: "Degraded",
                status: true,
                reason: format!("the record's head does not verify: {e}"),
            });
            return out;
        }
    };
    let state = head.state().clone();
    out.turns = state.last_turn;
    if let Some(agent) = &state.active_agent {
        out.agent = agent.to_string();
    }
    let closed = conversations
        .directory()
        .closed_at(entry.conversation)
        .await
        .ok()
        .flatten();
    out.phase = match (closed, state.turn_open, state.waiting) {
        (Some(_), _, _) => "Closed",
        (None, true, _) => "Running",
        (None, false, _) if state.idle_closed => "IdleClosed",
        (None, false, true) => "Waiting",
        (None, false, false) => "Idle",
    };
    let mut degraded = Vec::new();
    if !head.is_empty() {
        match record.entries_from(head.batches() - 1).await {
            Ok(entries) => {
                if let Some(EntryBody::TurnAmbiguous(a)) =
                    entries.iter().rev().map(|e| &e.body).find(|b| {
                        matches!(b, EntryBody::TurnAmbiguous(_) | EntryBody::TurnComplete(_))
                    })
                {
                    degraded.push(format!(
                        "{} is quarantined: {} was interrupted ({})",
                        a.turn, a.tool, a.reason
                    ));
                }
            }
            Err(e) => degraded.push(format!("the last batch does not read: {e}")),
        }
    }
    if let Some(index) = index {
        let complete = state.last_turn.saturating_sub(u64::from(state.turn_open));
        let scope = turnpike_index::Scope::new(entry.tenant.clone(), entry.owner.clone());
        match index.backend().mark(&scope, entry.conversation).await {
            Ok(mark) if mark.map_or(0, |t| t.number()) < complete => degraded.push(format!(
                "the index is behind: through turn {}, the record through turn {complete}",
                mark.map_or(0, |t| t.number())
            )),
            Ok(_) => {}
            Err(e) => degraded.push(format!("the index cannot say how far it is: {e}")),
        }
    }
    let progressing = state.turn_open;
    out.conditions.push(Condition {
        kind: "Progressing",
        status: progressing,
        reason: if progressing {
            format!("turn_{} is running", state.last_turn)
        } else {
            "no turn is running".into()
        },
    });
    out.conditions.push(Condition {
        kind: "Degraded",
        status: !degraded.is_empty(),
        reason: if degraded.is_empty() {
            "nothing needs an operator".into()
        } else {
            degraded.join("; ")
        },
    });
    out.ready = degraded.is_empty() && closed.is_none();
    out.conditions.insert(
        0,
        Condition {
            kind: "Ready",
            status: out.ready,
            reason: match (closed.is_some(), degraded.is_empty()) {
                (true, _) => "closed: it takes no more messages".into(),
                (false, false) => "degraded".into(),
                (false, true) if state.idle_closed => {
                    "closed as idle: the next message reopens it".into()
                }
                (false, true) => "takes messages".into(),
            },
        },
    );
    out
}
