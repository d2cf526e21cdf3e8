//! A task as it goes: its snapshots from the record and the text its running turn streams.

use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt as _;
use turnpike_artifactory::Record;
use turnpike_schemas::live::LiveFrame;

use crate::error::ApiResult;
use crate::state::Edge;
use turnpike_artifactory::tasks::{self, TaskRef, TaskState, TaskView};

/// How often the record is read when no live message says it grew.
const POLL: Duration = Duration::from_secs(1);

/// One step of a task.
#[derive(Debug, Clone)]
pub enum Update {
    /// The task as the record now shows it (the first update always is one).
    Task(TaskView),
    /// Text the task's running turn streamed (advisory: the record's reply is the truth).
    Text(String),
}

/// Task `task` as `record` shows it; a task that is not there is `404` (a lane sequence past
/// the lane's end too: a made-up id is not a task still to come).
pub async fn read(edge: &Edge, record: &Record, task: TaskRef) -> ApiResult<TaskView> {
    let not_found = || crate::error::ApiError::not_found(format!("task {task} not found"));
    let view = tasks::read(record, task).await?.ok_or_else(not_found)?;
    if view.state == TaskState::Submitted
        && edge
            .inner
            .bus
            .lane_last(task.conversation)
            .await
            .map_err(crate::error::ApiError::from)?
            < task.seq
    {
        return Err(not_found());
    }
    Ok(view)
}

/// Whether a task in `state` waits for nothing more from the runtime: a stream of it ends.
pub fn settled(state: TaskState) -> bool {
    state.terminal() || state.interrupted()
}

/// The task's updates, from now until it is settled (terminal, or waiting for its client).
/// Snapshots start once the record has taken lane sequence `after` (an answer or follow-up
/// just sent: the task as it was before it is not news; 0 for none). Subscribes to the
/// conversation's live messages before reading, so nothing committed in between goes unseen; a
/// lost live message delays an update by at most a second.
pub async fn follow(
    edge: &Edge,
    record: Record,
    task: TaskRef,
    after: u64,
) -> ApiResult<BoxStream<'static, Update>> {
    let live = edge
        .inner
        .bus
        .subscribe_live(task.conversation)
        .await
        .map_err(crate::error::ApiError::from)?;
    let view = read(edge, &record, task).await?;
    struct State {
        live: BoxStream<'static, bytes::Bytes>,
        record: Record,
        view: TaskView,
        poll: tokio::time::Interval,
        done: bool,
        after: u64,
    }
    let current = view.lane_through >= after;
    let state = State {
        live,
        record,
        view: view.clone(),
        poll: tokio::time::interval(POLL),
        done: current && settled(view.state),
        after: if current { 0 } else { after },
    };
    let rest = futures::stream::unfold(state, |mut s| async move {
        loop {
            if s.done {
                return None;
            }
            enum Input {
                Live(Option<bytes::Bytes>),
                Poll,
            }
            let input = tokio::select! {
                m = s.live.next() => Input::Live(m),
                _ = s.poll.tick() => Input::Poll,
            };
            let reread = match input {
                Input::Live(None) => {
                    // The live subscription ended: go on by reading the record.
                    s.live = futures::stream::pending().boxed();
                    false
                }
                Input::Live(Some(bytes)) => match serde_json::from_slice::<LiveFrame>(&bytes) {
                    Ok(LiveFrame::Delta { turn, text })
                        if s.view.state == TaskState::Working && s.view.turn() == Some(turn) =>
                    {
                        return Some((Update::Text(text), s));
                    }
                    Ok(LiveFrame::Rows { through }) => through > s.view.through,
                    _ => false,
                },
                Input::Poll => true,
            };
            if !reread {
                continue;
            }
            match tasks::read(&s.record, s.view.task).await {
                Ok(Some(now)) if now.lane_through < s.after => s.view = now,
                Ok(Some(now)) if now.differs(&s.view) || std::mem::take(&mut s.after) > 0 => {
                    s.done = settled(now.state);
                    s.view = now.clone();
                    return Some((Update::Task(now), s));
                }
                Ok(Some(now)) => s.view = now,
                // Gone (the conversation erased): nothing more will come.
                Ok(None) => s.done = true,
                // A store that cannot answer now: try again on the next tick.
                Err(_) => {}
            }
        }
    });
    let first = current.then_some(Update::Task(view));
    Ok(futures::stream::iter(first).chain(rest).boxed())
}

/// Follows the task (from lane sequence `after`, as [`follow`]) until it is settled or `limit`
/// passes; the last snapshot.
pub async fn settle(
    edge: &Edge,
    record: Record,
    task: TaskRef,
    after: u64,
    limit: Duration,
) -> ApiResult<TaskView> {
    let mut updates = follow(edge, record.clone(), task, after).await?;
    let mut last = None;
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, updates.next()).await {
            Ok(Some(Update::Task(view))) => {
                let over = settled(view.state);
                last = Some(view);
                if over {
                    break;
                }
            }
            Ok(Some(Update::Text(_))) => {}
            Ok(None) | Err(_) => break,
        }
    }
    match last {
        Some(view) => Ok(view),
        None => read(edge, &record, task).await,
    }
}
