//! Conversation phases for operators, in the words of `kubectl get`: a phase (Idle, Running,
//! Waiting, IdleClosed, Closed) and conditions — Ready, Progressing, Degraded — each with a reason.
//!
//! Degraded means an operator should look: the record's head does not verify (unreadable, or
//! not signed by a trusted key), the last turn was quarantined (a side-effecting call was
//! interrupted and not run again: someone must decide whether it took effect), or the index
//! is behind the record (when an index is given).
//!
//! Reading one conversation's phase costs its head, its closed marker, and the record back to
//! where its last turn ended (the last batch, or a few more when batches without a turn — an
//! idle close — followed it).

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

/// The quarantine of the last turn to end, if it ended quarantined: the record is read
/// backwards, a page at a time, to the last `turn_complete` or `turn_ambiguous` — past batches
/// that end no turn (an idle close, a reopening), which must not hide a quarantine.
async fn last_quarantine(
    record: &turnpike_artifactory::Record,
    head: &turnpike_artifactory::Head,
) -> turnpike_artifactory::Result<Option<turnpike_schemas::entry::TurnAmbiguous>> {
    const PAGE: usize = 32;
    let mut before = head.leaves();
    while before > 0 {
        let page = record.page_before(before, PAGE).await?;
        let Some(first) = page.entries.first() else {
            break;
        };
        for entry in page.entries.iter().rev() {
            match &entry.body {
                EntryBody::TurnAmbiguous(a) => return Ok(Some(a.clone())),
                EntryBody::TurnComplete(_) => return Ok(None),
                _ => {}
            }
        }
        before = first.position;
    }
    Ok(None)
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
    match last_quarantine(&record, &head).await {
        Ok(Some(a)) => degraded.push(format!(
            "{} is quarantined: {} was interrupted ({})",
            a.turn, a.tool, a.reason
        )),
        Ok(None) => {}
        Err(e) => degraded.push(format!("the record does not read: {e}")),
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::memory::InMemory;
    use turnpike_artifactory::{Conversations, RecordSigner};
    use turnpike_schemas::entry::{
        ConversationOpened, IdleClosed, Reopened, TurnAmbiguous, TurnComplete, TurnDispatched,
        TurnOutcome,
    };
    use turnpike_schemas::{ConversationId, Epoch, TurnId, WorkerId};

    use super::*;

    /// Item 5 of the third adversarial look: a quarantined turn stays Degraded after later
    /// batches that end no turn (an idle close, a reopening), until a later turn completes.
    #[tokio::test]
    async fn a_quarantine_is_not_forgotten_when_an_idle_close_follows() {
        let conversations = Conversations::new(Arc::new(InMemory::new()));
        let entry = DirectoryEntry {
            conversation: ConversationId::new(),
            tenant: "t".parse().unwrap(),
            owner: "local:a".parse().unwrap(),
            app: "app".parse().unwrap(),
            agent: "agent".parse().unwrap(),
            created_ms: 1,
            instructions: None,
            started_by: None,
        };
        let record = conversations.record(entry.prefix());
        let signer = RecordSigner::from_seed([7; 32]);
        let turn = |n| TurnId::new(n).unwrap();
        let dispatched = |n| {
            EntryBody::TurnDispatched(TurnDispatched {
                turn: turn(n),
                worker: WorkerId::new(),
                agent: "agent".parse().unwrap(),
                epoch: Epoch(1),
                at_ms: 2,
            })
        };
        let mut head = record.head().await.unwrap();
        let batches = vec![
            vec![EntryBody::ConversationOpened(ConversationOpened {
                tenant: entry.tenant.clone(),
                owner: entry.owner.clone(),
                app: entry.app.clone(),
                agent: entry.agent.clone(),
                at_ms: 1,
            })],
            vec![dispatched(1)],
            vec![EntryBody::TurnAmbiguous(TurnAmbiguous {
                turn: turn(1),
                tool: "exec".into(),
                call_id: "c1".into(),
                reason: "the worker died during the call".into(),
            })],
        ];
        for bodies in batches {
            head = record.append(&signer, &head, &bodies).await.unwrap();
        }
        let degraded = |p: &Phase| {
            p.conditions
                .iter()
                .find(|c| c.kind == "Degraded")
                .cloned()
                .unwrap()
        };
        let p = phase(&conversations, &entry, None).await;
        assert!(degraded(&p).status, "{p:?}");
        // Closed as idle, then reopened: both later batches end no turn.
        for body in [
            EntryBody::IdleClosed(IdleClosed {
                idle_since_ms: 2,
                after_ms: 1,
                at_ms: 3,
            }),
            EntryBody::Reopened(Reopened { at_ms: 4 }),
        ] {
            head = record.append(&signer, &head, &[body]).await.unwrap();
            let p = phase(&conversations, &entry, None).await;
            let d = degraded(&p);
            assert!(d.status, "{p:?}");
            assert!(d.reason.contains("turn_1 is quarantined"), "{d:?}");
            assert!(!p.ready);
        }
        // A later turn that completes ends the quarantine's reign over the phase.
        head = record
            .append(&signer, &head, &[dispatched(2)])
            .await
            .unwrap();
        let complete = EntryBody::TurnComplete(TurnComplete {
            turn: turn(2),
            outcome: TurnOutcome::Replied,
            log: None,
            log_sha256: None,
            version: None,
            attempt: None,
            at_ms: 5,
        });
        record.append(&signer, &head, &[complete]).await.unwrap();
        let p = phase(&conversations, &entry, None).await;
        assert!(!degraded(&p).status, "{p:?}");
    }
}
