//! A task, derived from the record: the turn a message opened, followed through the turns that
//! answer what it parked on — what an A2A client calls a task (the edge serves it; the workers'
//! push notifications follow it). Nothing about a task is stored apart from the record, so
//! whichever process reads it, and after any crash, a task reads the same.
//!
//! # Contract
//! - A task id is `<conversation>-<lane seq>`: the conversation and the lane sequence of the
//!   message that started it ([`TaskRef`]). Reading it costs the record's tail back to that
//!   input (inputs are committed in lane order, so the scan stops at the first older one) and the
//!   entries of its turns.
//! - States follow the turn: not yet committed — `submitted`; dispatched — `working`; replied —
//!   `completed`; cancelled by a stop — `canceled` (a stop while it is parked changes nothing:
//!   the runtime keeps what is pending); failed or quarantined
//!   (`turn_ambiguous`) — `failed`; a message the runtime refused (parked on the lane) —
//!   `rejected`; parked on an approval or a question — `input-required`, or `auth-required`
//!   when what it waits for is the caller's own connection to an MCP server.
//! - A parked task goes on in the next turn only when that turn's inputs answer one of its
//!   requests; a turn started by another message ends it `canceled` (the new message rejected
//!   what was pending).

use std::fmt;
use std::str::FromStr;

use crate::error::Result;
use crate::record::{Record, RecordEntry};
use turnpike_schemas::entry::TurnOutcome;
use turnpike_schemas::{ConversationId, EntryBody, EventBody, RequestId, TurnId};

/// How far back the input of a task is looked for (entries).
const MAX_BACK: usize = 8192;
/// How far before its message a task's files are looked for (entries).
const FILES_BACK: usize = 64;
/// The idempotency key of a task's message ends so; its files' keys start with what precedes
/// it (see `a2a::key_of`).
pub const MESSAGE_KEY_SUFFIX: &str = "message";
/// The most entries one task's turns are read for.
const MAX_FORWARD: usize = 50_000;

/// Which task: the conversation and the lane sequence of the message that started it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskRef {
    pub conversation: ConversationId,
    pub seq: u64,
}

impl fmt::Display for TaskRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.conversation, self.seq)
    }
}

impl FromStr for TaskRef {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        let (conversation, seq) = s.split_once('-').ok_or(())?;
        let seq: u64 = seq.parse().map_err(|_| ())?;
        if seq == 0 || seq.to_string() != seq_text(s) {
            return Err(());
        }
        Ok(TaskRef {
            conversation: conversation.parse().map_err(|_| ())?,
            seq,
        })
    }
}

fn seq_text(s: &str) -> &str {
    s.split_once('-').map_or("", |(_, seq)| seq)
}

/// Where a task stands (A2A's task states).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    Submitted,
    Working,
    InputRequired,
    AuthRequired,
    Completed,
    Canceled,
    Failed,
    Rejected,
}

impl TaskState {
    /// A2A's name for the state (protocol 1.0).
    pub fn wire(self) -> &'static str {
        match self {
            TaskState::Submitted => "TASK_STATE_SUBMITTED",
            TaskState::Working => "TASK_STATE_WORKING",
            TaskState::InputRequired => "TASK_STATE_INPUT_REQUIRED",
            TaskState::AuthRequired => "TASK_STATE_AUTH_REQUIRED",
            TaskState::Completed => "TASK_STATE_COMPLETED",
            TaskState::Canceled => "TASK_STATE_CANCELED",
            TaskState::Failed => "TASK_STATE_FAILED",
            TaskState::Rejected => "TASK_STATE_REJECTED",
        }
    }

    /// No more happens to the task.
    pub fn terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Canceled | TaskState::Failed | TaskState::Rejected
        )
    }

    /// The task waits for its client (an answer, or a connection).
    pub fn interrupted(self) -> bool {
        matches!(self, TaskState::InputRequired | TaskState::AuthRequired)
    }
}

/// What a parked task waits for.
#[derive(Debug, Clone, PartialEq)]
pub enum Waiting {
    Approval {
        request: RequestId,
        tool: String,
        arguments: serde_json::Value,
        /// The MCP server whose per-user connection the call lacks.
        connection: Option<String>,
    },
    Question {
        request: RequestId,
        question: String,
    },
}

/// One message of a task's history.
#[derive(Debug, Clone, PartialEq)]
pub enum Said {
    /// From the client: a message, follow-up, steer or answer.
    User { text: String, seq: u64 },
    /// An attachment the client sent.
    File {
        name: String,
        media_type: String,
        reference: String,
        seq: u64,
    },
    /// From the agent.
    Agent {
        text: String,
        turn: TurnId,
        seq: u64,
    },
}

/// A task as the record shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskView {
    pub task: TaskRef,
    pub state: TaskState,
    /// The turns the task ran in, in order.
    pub turns: Vec<TurnId>,
    pub history: Vec<Said>,
    /// What the task waits for, while it is interrupted.
    pub waiting: Vec<Waiting>,
    /// Why it failed, was cancelled or rejected.
    pub reason: Option<String>,
    /// When its state last changed (ms since the epoch; 0 before anything is committed).
    pub at_ms: u64,
    /// The record's entry count when it was read.
    pub through: u64,
    /// The highest lane sequence the record had taken then: an answer or a follow-up sent at
    /// lane sequence `n` shows in the task once this is `n` or more.
    pub lane_through: u64,
}

impl TaskView {
    fn submitted(task: TaskRef, through: u64, lane_through: u64) -> Self {
        TaskView {
            lane_through,
            task,
            state: TaskState::Submitted,
            turns: Vec::new(),
            history: Vec::new(),
            waiting: Vec::new(),
            reason: None,
            at_ms: 0,
            through,
        }
    }

    /// Whether `other` shows the task otherwise: its state, what it said or waits for (not
    /// merely a longer record).
    pub fn differs(&self, other: &TaskView) -> bool {
        self.state != other.state
            || self.turns != other.turns
            || self.history != other.history
            || self.waiting != other.waiting
            || self.reason != other.reason
    }

    /// The turn running now (or last), if any.
    pub fn turn(&self) -> Option<TurnId> {
        self.turns.last().copied()
    }

    /// The agent's words, in order.
    pub fn replies(&self) -> impl Iterator<Item = &str> {
        self.history.iter().filter_map(|s| match s {
            Said::Agent { text, .. } => Some(text.as_str()),
            _ => None,
        })
    }
}

/// Reads task `task` from `record`. A message still on the lane is `submitted`; `None`: the
/// record has no message at that lane sequence (it is past it), or it is older than a task is
/// looked for.
pub async fn read(record: &Record, task: TaskRef) -> Result<Option<TaskView>> {
    let head = record.head().await?;
    let through = head.leaves();
    let lane_through = head.state().lane_through;
    if lane_through < task.seq {
        return Ok(Some(TaskView::submitted(task, through, lane_through)));
    }
    // Back from the end to the task's input (inputs are in lane order).
    let mut before = through;
    let mut scanned = 0;
    let start = 'find: loop {
        if before == 0 || scanned >= MAX_BACK {
            break None;
        }
        let page = record.page_before(before, 128).await?;
        let Some(first) = page.entries.first() else {
            break None;
        };
        before = first.position;
        scanned += page.entries.len();
        for e in page.entries.iter().rev() {
            match &e.body {
                EntryBody::LaneParked(p) if p.lane_seq == task.seq => {
                    let mut view = TaskView::submitted(task, through, lane_through);
                    view.state = TaskState::Rejected;
                    view.reason = Some(p.reason.clone());
                    return Ok(Some(view));
                }
                // Only a message starts a task (a stop, an answer or a file is part of one).
                EntryBody::UserMessage(input) if input.lane_seq == Some(task.seq) => {
                    break 'find Some(e.position)
                }
                body => match body.as_input().and_then(|i| i.lane_seq) {
                    Some(seq) if seq == task.seq => break 'find None,
                    Some(seq) if seq < task.seq => break 'find None,
                    _ => {}
                },
            }
        }
    };
    let Some(start) = start else {
        // Not in the record although the lane is past it, or older than a task is looked for.
        return Ok(None);
    };
    // The files sent with the message went on the lane just ahead of it: they are the task's,
    // whether they joined its turn or a worker took them first.
    let mut files = Vec::new();
    let opening = record.page_from(start, 1).await?;
    let key = opening
        .entries
        .first()
        .and_then(|e| e.body.as_input())
        .and_then(|i| i.event.idempotency_key.clone());
    if let Some(prefix) = key
        .as_deref()
        .and_then(|k| k.strip_suffix(MESSAGE_KEY_SUFFIX))
    {
        let before = record.page_before(start, FILES_BACK).await?;
        for e in &before.entries {
            if let EntryBody::Attachment(input) = &e.body {
                let ours = input
                    .event
                    .idempotency_key
                    .as_deref()
                    .is_some_and(|k| k.starts_with(prefix));
                if let (
                    true,
                    EventBody::Attachment {
                        name,
                        media_type,
                        reference,
                        ..
                    },
                ) = (ours, &input.event.body)
                {
                    files.push(Said::File {
                        name: name.clone(),
                        media_type: media_type.clone(),
                        reference: reference.to_string(),
                        seq: e.position + 1,
                    });
                }
            }
        }
    }
    let mut view = TaskView::submitted(task, through, lane_through);
    view.history = files;
    let mut derive = Derive::new(view);
    let mut from = start;
    let mut read = 0;
    loop {
        let page = record.page_from(from, 256).await?;
        let Some(last) = page.entries.last() else {
            break;
        };
        from = last.position + 1;
        read += page.entries.len();
        if page.entries.iter().any(|e| derive.feed(e)) || read >= MAX_FORWARD {
            break;
        }
    }
    Ok(Some(derive.view))
}

/// The task's state machine over its entries, in record order from its input.
struct Derive {
    view: TaskView,
    /// Its first input is seen.
    started: bool,
    /// The last turn ended parked: the next dispatch continues the task only if its inputs
    /// answer one of these.
    parked: Option<Vec<RequestId>>,
    /// Inputs seen after a park, before the next dispatch: whether one answered the task.
    answered: bool,
}

impl Derive {
    fn new(view: TaskView) -> Self {
        Derive {
            view,
            started: false,
            parked: None,
            answered: false,
        }
    }

    /// Takes one entry; true once the task is over (nothing later changes it).
    fn feed(&mut self, e: &RecordEntry) -> bool {
        let seq = e.position + 1;
        let view = &mut self.view;
        if let Some(input) = e.body.as_input() {
            if !self.started {
                self.started = true;
            } else if view.turns.is_empty() {
                // Inputs of the same batch, after the task's message.
            } else if let Some(pending) = &self.parked {
                let answers = match &input.event.body {
                    EventBody::ApprovalResponse { request_id, .. }
                    | EventBody::QuestionResponse { request_id, .. } => {
                        pending.contains(request_id)
                    }
                    _ => false,
                };
                if !answers {
                    return false;
                }
                self.answered = true;
            } else if !matches!(
                input.event.body,
                EventBody::FollowUp { .. }
                    | EventBody::Steer { .. }
                    | EventBody::Stop { .. }
                    | EventBody::Attachment { .. }
            ) {
                // A message of the next turn: not this task's.
                return false;
            }
            match &input.event.body {
                EventBody::Message { text }
                | EventBody::FollowUp { text }
                | EventBody::Steer { text }
                | EventBody::QuestionResponse { answer: text, .. } => {
                    view.history.push(Said::User {
                        text: text.clone(),
                        seq,
                    })
                }
                EventBody::ApprovalResponse {
                    approve, reason, ..
                } => view.history.push(Said::User {
                    text: match (approve, reason) {
                        (true, _) => "approve".to_owned(),
                        (false, Some(r)) => format!("reject: {r}"),
                        (false, None) => "reject".to_owned(),
                    },
                    seq,
                }),
                EventBody::Attachment {
                    name,
                    media_type,
                    reference,
                    ..
                } => view.history.push(Said::File {
                    name: name.clone(),
                    media_type: media_type.clone(),
                    reference: reference.to_string(),
                    seq,
                }),
                _ => {}
            }
            return false;
        }
        match &e.body {
            EntryBody::TurnDispatched(d) => {
                if let Some(_pending) = self.parked.take() {
                    if !self.answered {
                        // Another message's turn: it rejected what this task waited for.
                        view.state = TaskState::Canceled;
                        view.waiting.clear();
                        view.reason =
                            Some("a new message in the conversation replaced this task".into());
                        return true;
                    }
                }
                self.answered = false;
                view.turns.push(d.turn);
                view.state = TaskState::Working;
                view.waiting.clear();
                view.at_ms = d.at_ms;
                false
            }
            body if body.turn().is_some() && body.turn() != view.turn() => false,
            EntryBody::AssistantMessage(m) => {
                view.history.push(Said::Agent {
                    text: m.text.clone(),
                    turn: m.turn,
                    seq,
                });
                false
            }
            EntryBody::ApprovalRequest(r) => {
                view.waiting.push(Waiting::Approval {
                    request: r.request_id,
                    tool: r.tool.clone(),
                    arguments: r.arguments.clone(),
                    connection: r.connection.clone(),
                });
                false
            }
            EntryBody::ApprovalResolved(r) if r.refused.is_none() => {
                view.waiting.retain(
                    |w| !matches!(w, Waiting::Approval { request, .. } if *request == r.request_id),
                );
                false
            }
            EntryBody::QuestionRequest(q) => {
                view.waiting.push(Waiting::Question {
                    request: q.request_id,
                    question: q.question.clone(),
                });
                false
            }
            EntryBody::Error(err) => {
                view.reason = Some(err.message.clone());
                false
            }
            EntryBody::Cancelled(c) => {
                view.reason = c.reason.clone().or(Some("cancelled".into()));
                false
            }
            EntryBody::TurnAmbiguous(a) => {
                view.state = TaskState::Failed;
                view.reason = Some(format!(
                    "quarantined: the side-effecting call {} ({}) may or may not have happened: {}",
                    a.tool, a.call_id, a.reason
                ));
                true
            }
            EntryBody::TurnComplete(c) => {
                view.at_ms = c.at_ms;
                match c.outcome {
                    TurnOutcome::Replied => {
                        view.state = TaskState::Completed;
                        view.reason = None;
                        true
                    }
                    TurnOutcome::Cancelled => {
                        view.state = TaskState::Canceled;
                        true
                    }
                    TurnOutcome::Failed => {
                        view.state = TaskState::Failed;
                        true
                    }
                    TurnOutcome::Parked => {
                        let auth = view.waiting.iter().any(|w| {
                            matches!(
                                w,
                                Waiting::Approval {
                                    connection: Some(_),
                                    ..
                                }
                            )
                        });
                        view.state = if auth {
                            TaskState::AuthRequired
                        } else {
                            TaskState::InputRequired
                        };
                        self.parked = Some(
                            view.waiting
                                .iter()
                                .map(|w| match w {
                                    Waiting::Approval { request, .. }
                                    | Waiting::Question { request, .. } => *request,
                                })
                                .collect(),
                        );
                        false
                    }
                }
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_round_trip_and_refuse_what_is_not_one() {
        let conversation = ConversationId::new();
        let task = TaskRef {
            conversation,
            seq: 42,
        };
        assert_eq!(task.to_string().parse::<TaskRef>(), Ok(task));
        for bad in [
            "",
            "42",
            &format!("{conversation}"),
            &format!("{conversation}-"),
            &format!("{conversation}-0"),
            &format!("{conversation}-042"),
            &format!("{conversation}-+42"),
            &format!("{conversation}-42-1"),
            "conv_x-42",
        ] {
            assert!(bad.parse::<TaskRef>().is_err(), "{bad:?}");
        }
    }
}
