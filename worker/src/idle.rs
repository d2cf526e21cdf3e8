//! Idle close (DESIGN, "Operating it"): a conversation in which nothing happened for its app's
//! `idle_timeout` is closed as idle — an `idle_closed` entry in its record, status
//! `idle_closed` — and the next event reopens it (a `reopened` entry ahead of that event's
//! input, which starts the timer again). An explicit close is the directory's and never reopens.
//!
//! No scheduler process runs the timer. An owner that lets go of a conversation leaves an idle
//! watch in the directory (one small write; its write time is about the last activity), and any
//! worker's sweep closes the watched conversations that are due, each under the conversation's
//! lease. The record's state is the authority — its `active_ms` says when the conversation last
//! did something, and its state machine refuses a second close — so two sweeps racing close a
//! conversation once, and a watch older than the last activity closes nothing.
//!
//! A worker keeps nothing of a conversation between turns (workspaces end with their turn), so
//! closing releases no worker-side resources beyond the watch itself.

use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};
use turnpike_artifactory::{ErrorKind as StoreErrorKind, Head};
use turnpike_router::bus::Lease;
use turnpike_schemas::entry::IdleClosed;
use turnpike_schemas::{ConversationId, EntryBody};

use crate::owners::Inner;
use crate::turn::TurnEnv;
use turnpike_lifecycle::fence::Fence;

/// Leaves an idle watch for the sweep when an owner lets go of a conversation that can go idle
/// (some app closes idle conversations, the record has no open turn and is not closed as idle).
/// Failures are logged: the next drain writes the watch again.
pub(crate) async fn watch(env: &TurnEnv, head: &Head) {
    if env
        .apps
        .shortest_idle_timeout(env.config.idle_timeout)
        .is_none()
    {
        return;
    }
    let state = head.state();
    if head.is_empty() || state.turn_open || state.idle_closed || env.fence.check().is_err() {
        return;
    }
    let conversation = env.record.prefix().conversation();
    if let Err(e) = env.directory.watch_idle(conversation).await {
        warn!(%conversation, error = %e, "cannot leave an idle watch; the next drain retries");
    }
}

/// What the sweep found for one watched conversation.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Closed as idle now.
    Closed,
    /// Not due yet, or busy: look again later.
    Keep,
    /// Nothing to watch any more (closed as idle already, closed explicitly, deleted, or its
    /// app never closes idle conversations).
    Drop,
}

/// Closes the watched conversations that are due; returns how many it closed. Costs one
/// listing when nothing is due; a watched conversation past the shortest timeout costs a claim
/// and a head read.
pub(crate) async fn sweep(inner: &Arc<Inner>) -> usize {
    let Some(shortest) = inner.apps.shortest_idle_timeout(inner.config.idle_timeout) else {
        return 0;
    };
    let directory = inner.conversations.directory();
    let watches = match directory.idle_watches().await {
        Ok(watches) => watches,
        Err(e) => {
            warn!(worker = %inner.worker, error = %e, "sweep: cannot list idle watches");
            return 0;
        }
    };
    let now = turnpike_router::clock::now_ms();
    let (mut closed, mut claims) = (0, 0);
    for (conversation, watched_ms) in watches {
        if inner.is_stopping() {
            break;
        }
        if now.saturating_sub(watched_ms) < shortest.as_millis() as u64 || inner.owns(conversation)
        {
            continue;
        }
        // Held: its owner is at work (or a lease has not lapsed), so it is not idle now.
        let Some((lease, _holder)) = inner.claim_free(conversation).await else {
            continue;
        };
        claims += 1;
        let verdict = close_if_due(inner, conversation, &lease, watched_ms).await;
        // The watch goes while the lease is held: an owner that comes next writes its own.
        match verdict {
            Ok(Verdict::Keep) => {}
            Ok(verdict) => {
                if verdict == Verdict::Closed {
                    closed += 1;
                    info!(%conversation, "sweep: closed an idle conversation");
                }
                if let Err(e) = directory.unwatch_idle(conversation).await {
                    debug!(%conversation, error = %e, "idle sweep: cannot drop a watch");
                }
            }
            Err(e) => warn!(%conversation, error = %e, "idle sweep: cannot close"),
        }
        let _ = inner.bus.release(&lease).await;
        if claims >= IDLE_CLAIMS_PER_SWEEP {
            break;
        }
    }
    closed
}

/// The most leases one sweep takes to look at idle conversations (the rest wait for the next
/// sweep), so that a backlog neither delays real wakes much nor keeps other sweeps waiting.
const IDLE_CLAIMS_PER_SWEEP: usize = 100;

/// Under `lease`: closes `conversation` as idle when its record says nothing happened in it for
/// its app's idle timeout.
async fn close_if_due(
    inner: &Arc<Inner>,
    conversation: ConversationId,
    lease: &Lease,
    watched_ms: u64,
) -> crate::error::Result<Verdict> {
    let directory = inner.conversations.directory();
    let entry = match directory.lookup_unchecked(conversation).await {
        Ok(entry) => entry,
        Err(e) if e.kind() == StoreErrorKind::NotFound => return Ok(Verdict::Drop),
        Err(e) => return Err(e.into()),
    };
    if directory.closed_at(conversation).await?.is_some() {
        return Ok(Verdict::Drop);
    }
    // Manifests are per worker: one that does not host the app cannot say its timeout.
    if !inner.apps.hosts(&entry.app) {
        return Ok(Verdict::Keep);
    }
    let Some(timeout) = inner
        .apps
        .idle_timeout(&entry.app, inner.config.idle_timeout)
    else {
        return Ok(Verdict::Drop);
    };
    let env = TurnEnv {
        shared: inner.shared.clone(),
        record: inner.conversations.record(entry.prefix()),
        resolver: inner.resolver.in_tenant(&entry.tenant),
        marked: Default::default(),
        dispatched_ms: Default::default(),
        lane: Default::default(),
        fence: Fence::new(lease.expires_ms, inner.config.renew_every),
        turn_slot: crate::dispatch::TurnSlot::none(),
    };
    env.record.finish_repair().await?;
    let head = env.record.head().await?;
    let state = head.state();
    if state.idle_closed {
        return Ok(Verdict::Drop);
    }
    // A turn running, or events on the lane not taken yet: not idle.
    if state.turn_open || inner.bus.lane_last(conversation).await? > state.lane_through {
        return Ok(Verdict::Keep);
    }
    // Records from before `active_ms` (batch format 3) say nothing: the watch's time stands in.
    let since = if state.active_ms > 0 {
        state.active_ms
    } else {
        watched_ms
    };
    let now = turnpike_router::clock::now_ms();
    if now.saturating_sub(since) < millis(timeout) {
        return Ok(Verdict::Keep);
    }
    let close = EntryBody::IdleClosed(IdleClosed {
        idle_since_ms: since,
        after_ms: millis(timeout),
        at_ms: now,
    });
    env.append(&head, &[close]).await?;
    Ok(Verdict::Closed)
}

/// The `reopened` entry an owner appends before the first input it takes into a conversation
/// closed as idle.
pub(crate) fn reopening() -> EntryBody {
    EntryBody::Reopened(turnpike_schemas::entry::Reopened {
        at_ms: turnpike_router::clock::now_ms(),
    })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
