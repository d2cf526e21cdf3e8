//! Watching the lane while a turn runs: what folds into it, and what stops it.

use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt as _, StreamExt as _};
use tokio::sync::watch;
use turnpike_router::bus::Bus;
use turnpike_router::LaneMessage;
use turnpike_schemas::{Event, EventBody, Identity};

use turnpike_agent::apps::OnNewMessage;

use super::{TurnEnv, LANE_READ};

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

/// Reads the lane after `after` as far as it concerns a turn of `identity`: the messages that
/// fold into it, then the first one that does not (if there is one; it ends the read). The
/// second value says whether the read saw the lane's end (an empty answer). One message is
/// asked for first, so a lane whose next message is not the turn's costs one message read, not
/// every message pending behind it.
pub(super) async fn read_folding(
    bus: &dyn Bus,
    conversation: turnpike_schemas::ConversationId,
    after: u64,
    identity: &Identity,
) -> turnpike_router::Result<(Vec<LaneMessage>, bool)> {
    let mut out: Vec<LaneMessage> = Vec::new();
    let mut limit = 1;
    loop {
        let cursor = out.last().map_or(after, |m| m.seq);
        let read = match bus.read_lane(conversation, cursor, None, limit).await {
            Ok(read) => read,
            // A message this binary cannot read ends what concerns the turn; it is the
            // caller's once it is the next one.
            Err(e) if !out.is_empty() && e.kind() == turnpike_router::ErrorKind::Unreadable => {
                return Ok((out, false))
            }
            Err(e) => return Err(e),
        };
        // Only an empty read proves the lane's end: a short one may have stopped before a
        // message this binary cannot read.
        let whole = read.is_empty();
        for m in read {
            let folds = folds_into(identity, &m.event);
            out.push(m);
            if !folds {
                return Ok((out, false));
            }
        }
        if whole {
            return Ok((out, true));
        }
        if out.len() >= LANE_READ {
            return Ok((out, false));
        }
        limit = LANE_READ - out.len();
    }
}

/// Watches the lane while a turn runs: counts arrivals and notices a stop.
///
/// Contract: the stop signal is raised only by a `stop` event (or, under the `interrupt`
/// policy, by a new message). The watch ending — a new message reached under the `queue`
/// policy, the turn finishing — is never a stop: receivers treat a closed channel as "nothing
/// more will come", not as an event.
///
/// It starts from the messages the owner already read past the turn's inputs
/// ([`super::LaneAhead::after_inputs`]) and reads only what follows them. What it learns of
/// the lane is kept in [`Seen`] for the turn and its owner.
pub(super) struct LaneWatch {
    pub(super) arrivals: watch::Receiver<u64>,
    pub(super) stop: watch::Receiver<Option<StopCause>>,
    seen: Arc<std::sync::Mutex<Seen>>,
    /// `None` when what the owner had read already ended the watch.
    task: Option<tokio::task::JoinHandle<()>>,
}

/// What a lane watch knows of the lane past the turn's inputs (each `None` when it does not).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Seen {
    /// Its last read saw the whole lane through this sequence, and nothing has been signalled
    /// since that read was sent. Advisory: a signal can be missed.
    pub(super) quiet_through: Option<u64>,
    /// The message right after this sequence does not fold into the turn (a new message or
    /// another participant's words), so nothing after it does: exact, since a lane never
    /// changes.
    pub(super) blocked_after: Option<u64>,
}

/// Takes what the watch sees, in lane order: counts the messages folded into the turn and
/// moves `cursor` past them, until one does not fold in (then nothing after it concerns this
/// turn) or is a stop (raised).
struct Folder {
    identity: Identity,
    policy: OnNewMessage,
    cursor: u64,
    count: u64,
    count_tx: watch::Sender<u64>,
    stop_tx: watch::Sender<Option<StopCause>>,
    seen: Arc<std::sync::Mutex<Seen>>,
}

impl Folder {
    fn set(&self, change: impl FnOnce(&mut Seen)) {
        change(&mut self.seen.lock().expect("seen lock"));
    }

    /// False once nothing after `messages` concerns this turn.
    fn fold(&mut self, messages: Vec<LaneMessage>) -> bool {
        for m in messages {
            let is_message = matches!(m.event.body, EventBody::Message { .. });
            // A new message belongs to the next turn: nothing after it concerns this one. It
            // waits its turn, unless the agent asked to be interrupted. Another participant's
            // words start a turn of their own, after this one.
            if is_message || !folds_into(&self.identity, &m.event) {
                if is_message && self.policy == OnNewMessage::Interrupt {
                    let _ = self.stop_tx.send(Some(StopCause::Superseded));
                }
                let at = self.cursor;
                self.set(|s| {
                    s.quiet_through = None;
                    s.blocked_after = Some(at);
                });
                return false;
            }
            self.cursor = m.seq;
            self.count += 1;
            let _ = self.count_tx.send(self.count);
            if matches!(m.event.body, EventBody::Stop { .. }) {
                let _ = self.stop_tx.send(Some(StopCause::Requested));
                self.set(|s| s.quiet_through = None);
                return false;
            }
        }
        true
    }
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
        let known: Vec<LaneMessage> = {
            let mut lane = env.lane.lock().expect("lane lock");
            lane.quiet_through = None;
            std::mem::take(&mut lane.after_inputs)
                .into_iter()
                .filter(|m| m.seq > after)
                .collect()
        };
        let (count_tx, arrivals) = watch::channel(0u64);
        let (stop_tx, stop) = watch::channel(None);
        let seen = Arc::new(std::sync::Mutex::new(Seen::default()));
        let mut folder = Folder {
            identity,
            policy,
            cursor: after,
            count: 0,
            count_tx,
            stop_tx,
            seen: seen.clone(),
        };
        // What the owner read past the inputs counts as read, before the turn starts (so its
        // first round already knows); the watch's first read follows it.
        let task = folder
            .fold(known)
            .then(|| tokio::spawn(watch(folder, bus, conversation, every)));
        Self {
            arrivals,
            stop,
            seen,
            task,
        }
    }

    /// Why the turn was asked to stop, if it was.
    pub(super) fn cause(&self) -> Option<StopCause> {
        *self.stop.borrow()
    }

    /// What the watch knows of the lane now.
    pub(super) fn seen(&self) -> Seen {
        *self.seen.lock().expect("seen lock")
    }
}

/// The watch itself: reads the lane when a publish signals it (or every `every`, for a
/// missed signal) and folds what it reads, until something ends what concerns the turn.
async fn watch(
    mut folder: Folder,
    bus: Arc<dyn Bus>,
    conversation: turnpike_schemas::ConversationId,
    every: Duration,
) {
    // Watching before the first read, so nothing slips between.
    let mut signals = Signals::open(bus.as_ref(), conversation).await;
    // Whether the next pass reads again shortly: a signal came, but the read did not yet show
    // the message (a signal can run ahead of what a read sees).
    let mut relook = false;
    // Whether the next pass reads at once: the first, or after a read that stopped at its limit.
    let mut at_once = true;
    // A signal taken while checking for quiet, not yet answered by a read.
    let mut waiting = false;
    loop {
        let mut signalled = std::mem::take(&mut waiting);
        if relook {
            relook = false;
            tokio::time::sleep(LOOK_AGAIN).await;
        } else if !at_once && !signalled {
            signalled = signals.wait(every, &folder).await;
        }
        at_once = false;
        let read = read_folding(bus.as_ref(), conversation, folder.cursor, &folder.identity);
        let (messages, whole) = match read.await {
            Ok(read) => read,
            // A message this binary cannot read: the owner parks it after the turn; nothing
            // behind it concerns this one.
            Err(e) if e.kind() == turnpike_router::ErrorKind::Unreadable => {
                folder.set(|s| s.quiet_through = None);
                return;
            }
            Err(_) => {
                folder.set(|s| s.quiet_through = None);
                continue;
            }
        };
        relook = signalled && messages.is_empty();
        if !folder.fold(messages) {
            return;
        }
        // Quiet: the read saw the lane's end and no signal has come since it was sent (one
        // already waiting is taken now, and answered by a read at once).
        if relook || !whole || !signals.live {
            folder.set(|s| s.quiet_through = None);
            at_once = !whole;
            continue;
        }
        waiting = signals.quiet(&folder);
    }
}

/// The lane's publish signals; where the bus gives none (or they end), the watch polls.
struct Signals {
    stream: futures::stream::BoxStream<'static, ()>,
    live: bool,
}

impl Signals {
    async fn open(bus: &dyn Bus, conversation: turnpike_schemas::ConversationId) -> Self {
        match bus.lane_signals(conversation).await {
            Ok(stream) => Signals { stream, live: true },
            Err(_) => Signals {
                stream: futures::stream::pending().boxed(),
                live: false,
            },
        }
    }

    fn end(&mut self) {
        self.stream = futures::stream::pending().boxed();
        self.live = false;
    }

    /// Waits for a signal, or `every`; true when a signal came.
    async fn wait(&mut self, every: Duration, folder: &Folder) -> bool {
        tokio::select! {
            signal = self.stream.next() => match signal {
                Some(()) => {
                    folder.set(|s| s.quiet_through = None);
                    true
                }
                // The signals ended: poll from here on.
                None => {
                    self.end();
                    false
                }
            },
            _ = tokio::time::sleep(every) => false,
        }
    }

    /// After a read that saw the lane's end: the lane is quiet through the cursor unless a
    /// signal is already waiting (true: it is answered by a read at once).
    fn quiet(&mut self, folder: &Folder) -> bool {
        match self.stream.next().now_or_never() {
            None => {
                let through = folder.cursor;
                folder.set(|s| s.quiet_through = Some(through));
                false
            }
            Some(Some(())) => {
                folder.set(|s| s.quiet_through = None);
                true
            }
            Some(None) => {
                folder.set(|s| s.quiet_through = None);
                self.end();
                false
            }
        }
    }
}

impl Drop for LaneWatch {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}
