//! Watching the lane while a turn runs: what folds into it, and what stops it.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use tokio::sync::watch;
use turnpike_router::bus::Bus;
use turnpike_schemas::{Event, EventBody, Identity};

use crate::apps::OnNewMessage;

use super::TurnEnv;

/// Whether `event`, arriving while a turn of `identity` runs, is folded into it: follow-ups,
/// steers, answers and attachments of the same identity, and a stop from anyone. A new message
/// starts the next turn, and so do another participant's words: one participant never drives a
/// turn (and its tools) that runs as another.
pub fn folds_into(identity: &Identity, event: &Event) -> bool {
    match event.body {
        EventBody::Message { .. } => false,
        EventBody::Stop { .. } => true,
        _ => &event.address.identity == identity,
    }
}

/// How soon a lane is read again when a signal ran ahead of the read.
const LOOK_AGAIN: Duration = Duration::from_millis(20);

/// Why a running turn is asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopCause {
    /// A `stop` event on the lane (a user or client pressed stop).
    Requested,
    /// A new message arrived and the agent's policy is `on_new_message = "interrupt"`.
    Superseded,
}

impl StopCause {
    /// The reason recorded on the cancelled turn, when there is one to show.
    pub(super) fn reason(self) -> Option<String> {
        match self {
            StopCause::Requested => None,
            StopCause::Superseded => Some("superseded by a new message".into()),
        }
    }
}

/// Watches the lane while a turn runs: counts arrivals and notices a stop.
///
/// Contract: the stop signal is raised only by a `stop` event (or, under the `interrupt`
/// policy, by a new message). The watch ending — a new message reached under the `queue`
/// policy, the turn finishing — is never a stop: receivers treat a closed channel as "nothing
/// more will come", not as an event.
pub(super) struct LaneWatch {
    pub(super) arrivals: watch::Receiver<u64>,
    pub(super) stop: watch::Receiver<Option<StopCause>>,
    task: tokio::task::JoinHandle<()>,
}

impl LaneWatch {
    pub(super) fn start(
        bus: Arc<dyn Bus>,
        env: &TurnEnv,
        after: u64,
        policy: OnNewMessage,
        identity: Identity,
    ) -> Self {
        let conversation = env.record.prefix().conversation();
        let every = env.config.lane_poll;
        let (count_tx, arrivals) = watch::channel(0u64);
        let (stop_tx, stop) = watch::channel(None);
        let task = tokio::spawn(async move {
            let mut cursor = after;
            let mut count = 0;
            // Signalled on every publish to the lane (watching before the first read, so
            // nothing slips between); `every` is the fallback for a missed signal.
            let mut signals = match bus.lane_signals(conversation).await {
                Ok(s) => s,
                Err(_) => futures::stream::pending().boxed(),
            };
            // Whether the next pass reads again shortly: a signal came, but the read did not
            // yet show the message (a signal can run ahead of what a read sees).
            let mut relook = false;
            let mut first = true;
            loop {
                let mut signalled = false;
                if relook {
                    relook = false;
                    tokio::time::sleep(LOOK_AGAIN).await;
                } else if !first {
                    tokio::select! {
                        signal = signals.next() => match signal {
                            Some(()) => signalled = true,
                            // The signals ended: poll from here on.
                            None => signals = futures::stream::pending().boxed(),
                        },
                        _ = tokio::time::sleep(every) => {}
                    }
                }
                first = false;
                let messages = match bus.read_lane(conversation, cursor, None, 64).await {
                    Ok(messages) => {
                        relook = signalled && messages.is_empty();
                        messages
                    }
                    // A message this binary cannot read: the owner parks it after the turn;
                    // nothing behind it concerns this one.
                    Err(e) if e.kind() == turnpike_router::ErrorKind::Unreadable => return,
                    Err(_) => continue,
                };
                for m in messages {
                    // A new message belongs to the next turn: nothing after it concerns this
                    // one. It waits its turn, unless the agent asked to be interrupted.
                    if matches!(m.event.body, EventBody::Message { .. }) {
                        if policy == OnNewMessage::Interrupt {
                            let _ = stop_tx.send(Some(StopCause::Superseded));
                        }
                        return;
                    }
                    // Another participant's words start a turn of their own, after this one.
                    if !folds_into(&identity, &m.event) {
                        return;
                    }
                    cursor = m.seq;
                    count += 1;
                    let _ = count_tx.send(count);
                    if matches!(m.event.body, EventBody::Stop { .. }) {
                        let _ = stop_tx.send(Some(StopCause::Requested));
                        return;
                    }
                }
            }
        });
        Self {
            arrivals,
            stop,
            task,
        }
    }

    /// Why the turn was asked to stop, if it was.
    pub(super) fn cause(&self) -> Option<StopCause> {
        *self.stop.borrow()
    }
}

impl Drop for LaneWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}
