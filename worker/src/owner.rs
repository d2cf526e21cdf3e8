//! One conversation's owner: it holds the lease, keeps its wakes in progress, recovers a turn
//! left open, runs turns until the lane is drained, acks wakes once the record has committed
//! past them, then releases the lease and re-reads the lane head (DESIGN, steps 3–9).

use std::sync::Arc;
use std::time::Instant;

use tracing::warn;
use turnpike_artifactory::{ConversationPrefix, Head};
use turnpike_router::bus::{now_ms, Lease, Wake};
use turnpike_router::settle::Settlement;
use turnpike_router::{ErrorKind, LaneMessage};
use turnpike_schemas::entry::RecordState;
use turnpike_schemas::{ConversationId, EntryBody, EventBody, TenantId};

use crate::error::{Error, Result};
use crate::owners::{Inner, OwnerSlot};
use crate::turn::{
    finish_promotion, recover_turn, run_new_turn, run_opened, Opening, TurnEnv, Upcoming, LANE_READ,
};
use turnpike_lifecycle::fence::Fence;

/// Splits the pending lane messages into the next unit of work: a run of stops with no turn to
/// stop (recorded on their own), or a turn's inputs — the first message, any other events
/// before it (an attachment sent ahead of its message joins it), and the non-message events
/// after it, up to the next message. Events with no message behind them yet make a turn of
/// their own. A turn's inputs all come from one identity (the first event's; stops excepted):
/// another participant's event starts the next turn, so nobody's words run as someone else.
/// Returns whether they are stops only, and how many of the first messages they are.
fn next_inputs(pending: &[LaneMessage]) -> (bool, usize) {
    let stops_only = matches!(pending[0].event.body, EventBody::Stop { .. });
    let sender = &pending[0].event.address.identity;
    let mut taken = 0;
    let mut seen_message = false;
    for m in pending {
        let is_stop = matches!(m.event.body, EventBody::Stop { .. });
        let is_message = matches!(m.event.body, EventBody::Message { .. });
        if (stops_only && !is_stop) || (!stops_only && seen_message && is_message) {
            break;
        }
        if !stops_only && !is_stop && &m.event.address.identity != sender {
            break;
        }
        seen_message |= is_message;
        taken += 1;
    }
    (stops_only, taken)
}

/// Runs turns until the lane is drained; returns the final head. The first read stops at the
/// highest sequence known from the held wakes (or `known_last`), which saves a round trip before
/// the first turn starts; later reads go to the end of the lane. What is read past a turn's
/// inputs is kept for the turns after it (and handed to the turn's lane watch), and a turn whose
/// lane watch saw the lane end quiet ends the drain without another read.
async fn drain(
    env: &TurnEnv,
    slot: &OwnerSlot,
    epoch: turnpike_schemas::Epoch,
    known_last: u64,
    worker: &Inner,
    owned_since: Instant,
    resumed: Option<Head>,
) -> Result<Head> {
    let conversation = env.record.prefix().conversation();
    let mut head = match resumed {
        // A kept lease resumed: held throughout since this head, so nobody wrote a tombstone,
        // a repair or a batch meanwhile (see `crate::kept`).
        Some(head) => head,
        None => {
            let known = worker.heads.lock().expect("heads lock").pop(&conversation);
            open_drain(env, known).await?
        }
    };
    // Lane messages read past the record, in lane order (a lane message never changes): each is
    // read once per drain, not again for every turn ahead of it.
    let mut ahead: Vec<LaneMessage> = Vec::new();
    *env.lane.lock().expect("lane lock") = Default::default();
    let mut first = true;
    // A turn opened with the batch two of the one before it (see `Upcoming`).
    let mut opened: Option<Opening> = None;
    loop {
        if let Some(opening) = opened.take() {
            // The turns before it are complete: their wakes are done.
            slot.settle_through(opening.through).await;
            let mut next = Next {
                ahead: &mut ahead,
                worker,
                epoch,
            };
            (head, opened) = run_opened(env, head, opening, &mut next).await?;
            continue;
        }
        slot.settle(head.state()).await;
        if head.state().turn_open {
            head = recover_turn(env, head, epoch).await?;
            continue;
        }
        if worker.is_stopping() {
            // Shutting down: no new turn; what is left goes to the next owner.
            env.end_drain().await;
            return Ok(head);
        }
        let tenant = env.record.prefix().tenant();
        if env.turn_slot.given_up()
            || (!first && worker.dispatch.owes_slot(tenant, owned_since.elapsed()))
        {
            // Other wakes wait here for a slot and this owner had its share: this
            // conversation's next turn waits its turn among them (its wakes go back to the bus
            // as the owner lets go), instead of keeping the slot for as long as its sender keeps
            // writing.
            env.end_drain().await;
            return Ok(head);
        }
        let lane_through = head.state().lane_through;
        ahead.retain(|m| m.seq > lane_through);
        // Drained, without asking the bus once more, when nothing is ahead, no wake says more,
        // and either
        // - the last turn's lane watch saw the lane end right after what the record took, with
        //   nothing signalled since (its view is from before batch two, and a signal can be
        //   missed: the re-read after the release, step 9, takes the lane again then), or
        // - the owner will keep its lease: it reads the lane's end once more after it stops
        //   taking wakes (step 9), and drains again under the lease if more came, so a read
        //   here would only ask the same first.
        let quiet = env.lane.lock().expect("lane lock").quiet_through.take();
        if ahead.is_empty()
            && (quiet == Some(lane_through) || (!first && keeps(worker, env, &head)))
            && slot.max_seq().await.max(known_last) <= lane_through
        {
            env.end_drain().await;
            return Ok(head);
        }
        // Read (once a pass) when nothing is ahead, or when what is ahead may be only the start
        // of the next turn's inputs (events behind them would join it).
        if ahead.is_empty() || (ahead.len() < LANE_READ && next_inputs(&ahead).1 == ahead.len()) {
            let after = ahead.last().map_or(lane_through, |m| m.seq);
            // The first read stops at the highest sequence known from the held wakes (or
            // `known_last`), which saves a round trip before the first turn starts.
            let known = slot.max_seq().await.max(known_last);
            let until = (first && ahead.is_empty() && known > lane_through).then_some(known);
            first = false;
            let read = env
                .bus
                .read_lane(conversation, after, until, LANE_READ - ahead.len());
            // A wake past the record: a turn follows all but surely, and its batch one waits
            // for the open-turn mark. The mark is written while the lane is read, not after
            // (a mark with every turn closed is harmless, and cleared as the drain ends).
            let read = match until {
                Some(_) => {
                    let (marked, read) = tokio::join!(env.ensure_marked(), read);
                    marked?;
                    read
                }
                None => read.await,
            };
            match read {
                Ok(more) => ahead.extend(more),
                // A message this binary cannot read (a newer kind, mid-upgrade): set it aside
                // once it is the next one.
                Err(e) if e.kind() == ErrorKind::Unreadable && ahead.is_empty() => {
                    let unreadable = e.unreadable().expect("unreadable errors carry the message");
                    let letter = crate::parking::Letter::of_unreadable(unreadable);
                    head = crate::parking::park(env, &head, vec![letter]).await?;
                    continue;
                }
                Err(e) if e.kind() == ErrorKind::Unreadable => {}
                Err(e) => return Err(e.into()),
            }
        }
        if ahead.is_empty() {
            env.end_drain().await;
            return Ok(head);
        }
        if head.state().idle_closed {
            // Closed as idle: the next event reopens it (recorded), then is taken as usual.
            head = env.append(&head, &[crate::idle::reopening()]).await?;
        }
        let (stops_only, taken) = next_inputs(&ahead);
        let inputs: Vec<LaneMessage> = ahead.drain(..taken).collect();
        if stops_only {
            head = record_stops(env, head, &inputs).await?;
            continue;
        }
        env.lane.lock().expect("lane lock").after_inputs = ahead.clone();
        let mut next = Next {
            ahead: &mut ahead,
            worker,
            epoch,
        };
        (head, opened) = run_new_turn(env, head, inputs, epoch, &mut next).await?;
    }
}

/// The drain's answer to a turn about to commit its batch two: the next turn's batch one, when
/// the drain would start that turn right after (by the same rules: the worker is not stopping,
/// the owner keeps its slot, the lane read so far holds the next turn's inputs whole, and they
/// are not stops alone), so that both commit at once.
struct Next<'a> {
    ahead: &'a mut Vec<LaneMessage>,
    worker: &'a Inner,
    epoch: turnpike_schemas::Epoch,
}

impl Upcoming for Next<'_> {
    fn take(&mut self, env: &TurnEnv, after: &RecordState) -> Option<Opening> {
        // The slot by the rule its give-up after a commit applies (this commit opens the next
        // turn only if that would keep it).
        if after.turn_open || after.idle_closed || self.worker.is_stopping() || env.turn_slot.owes()
        {
            return None;
        }
        self.ahead.retain(|m| m.seq > after.lane_through);
        // What is read may be only the start of the next turn's inputs: the drain reads on.
        let (stops_only, taken) = match self.ahead.as_slice() {
            [] => return None,
            ahead => next_inputs(ahead),
        };
        if stops_only || (taken == self.ahead.len() && self.ahead.len() < LANE_READ) {
            return None;
        }
        let inputs: Vec<LaneMessage> = self.ahead.drain(..taken).collect();
        env.lane.lock().expect("lane lock").after_inputs = self.ahead.clone();
        Some(Opening::new(env, after, inputs, self.epoch))
    }

    fn give_back(&mut self, opening: Opening) {
        self.ahead.splice(0..0, opening.inputs);
    }
}

/// Owns a conversation from a claimed lease until its lane is drained and no one else holds it.
pub(crate) async fn own(
    worker: Arc<Inner>,
    tenant: TenantId,
    mut lease: Lease,
    // The head a kept lease's last drain left, when this owner resumes one (`crate::kept`).
    mut resumed: Option<Head>,
    slot: Arc<OwnerSlot>,
    // Its turn slot, and its count among its tenant's owners: held until the owner ends, or
    // given up after a turn's commit when the owner owes it (see `TurnSlot`).
    turn_slot: crate::dispatch::Slot,
    // Counted among the lease holders until the task ends (after its lease is released).
    _holder: crate::owners::LeaseHolder,
) {
    let conversation = lease.conversation;
    let env = TurnEnv {
        shared: worker.shared.clone(),
        record: worker
            .conversations
            .record(ConversationPrefix::new(tenant.clone(), conversation)),
        // Every reference the turn follows is resolved in the conversation's own tenant.
        resolver: worker.resolver.in_tenant(&tenant),
        marked: Default::default(),
        dispatched_ms: Default::default(),
        lane: Default::default(),
        fence: Fence::new(lease.expires_ms, worker.config.renew_every),
        turn_slot: crate::dispatch::TurnSlot::new(turn_slot),
    };
    // However the owner ends — a panic included — its slot is forgotten, so later wakes for
    // the conversation are not handed to an owner that is gone.
    let mut guard = ForgetOnDrop {
        worker: worker.clone(),
        conversation,
        slot,
    };
    worker
        .config
        .failpoints
        .hit("after-claim", conversation)
        .await;
    let mut known_last = 0;
    let owned_since = Instant::now();
    loop {
        let outcome = drain_renewing(
            &worker,
            &env,
            &mut lease,
            &guard.slot,
            known_last,
            owned_since,
            resumed.take(),
        )
        .await;
        let state = match &outcome {
            Ok(head) => Some(head.state().clone()),
            Err(e) if e.is_fenced() => {
                warn!(%conversation, worker = %worker.worker, why = %e, "fenced: another worker owns the conversation");
                None
            }
            Err(e) => {
                warn!(%conversation, worker = %worker.worker, error = %e, "owner stopped; the lane will be retried");
                None
            }
        };
        if let Ok(head) = &outcome {
            crate::idle::watch(&env, head).await;
            worker
                .heads
                .lock()
                .expect("heads lock")
                .put(conversation, head.clone());
        }
        // Step 9: stop taking wakes, give up the lease, then re-read the lane head.
        let lane_through = state.as_ref().map_or(0, |s| s.lane_through);
        let leftovers = guard.slot.close(state.as_ref()).await;
        worker.forget_owner(conversation, &guard.slot);
        worker
            .config
            .failpoints
            .hit("before-release", conversation)
            .await;
        settle_leftovers(&worker, leftovers, &outcome).await;
        if let Ok(head) = &outcome {
            if keeps(&worker, &env, head) {
                // Step 9 without the release: unless this owner owes its slot, read the lane's
                // end (a message whose wake found the lease held while this owner let go is
                // taken now, not when its wake comes back), and drain again under the lease
                // it still holds when more came; else keep it for the next wake.
                let more = if owes_slot(&worker, &env, owned_since) {
                    worker.drained(conversation, lane_through);
                    None
                } else {
                    lane_past(&worker, conversation, lane_through, state.as_ref()).await
                };
                let Some(last) = more else {
                    worker.kept.keep(lease, head.clone());
                    tracing::debug!(target: crate::dispatch::WAKES, %conversation, "lease kept");
                    return;
                };
                known_last = last;
                resumed = Some(head.clone());
                if !own_again(&worker, &mut guard, &lease).await {
                    return;
                }
                tracing::debug!(target: crate::dispatch::WAKES, %conversation, epoch = lease.revision, "drains again under the lease it kept");
                continue;
            }
        }
        let _ = worker.bus.release(&lease).await;
        tracing::debug!(target: crate::dispatch::WAKES, %conversation, given_up = env.turn_slot.given_up(), "lease released");
        if outcome.is_err() {
            return;
        }
        // Others wait for a slot here (or one took the slot this owner gave up): whatever
        // the lane holds now waits its turn among them (its wakes are on the bus or in the
        // intake; none was acked undone).
        if owes_slot(&worker, &env, owned_since) {
            return;
        }
        let Some(last) = lane_past(&worker, conversation, lane_through, state.as_ref()).await
        else {
            return;
        };
        known_last = last;
        match worker
            .bus
            .claim(conversation, worker.worker, worker.config.lease_ttl)
            .await
        {
            Ok(Some(again)) => {
                lease = again;
                tracing::debug!(target: crate::dispatch::WAKES, %conversation, epoch = lease.revision, "claimed again");
                env.fence.renewed(lease.expires_ms);
                if !own_again(&worker, &mut guard, &lease).await {
                    return;
                }
            }
            _ => return,
        }
    }
}

/// Whether the owner owes its turn slot now: it gave the slot up after a commit, or other
/// wakes wait for one here and it had its share.
fn owes_slot(worker: &Inner, env: &TurnEnv, owned_since: Instant) -> bool {
    env.turn_slot.given_up()
        || worker
            .dispatch
            .owes_slot(env.record.prefix().tenant(), owned_since.elapsed())
}

/// Takes the conversation's wakes again, in a fresh slot, under `lease` (still held, or
/// claimed again) for another drain. False, with the lease released, when another owner of
/// the conversation registered here meanwhile.
async fn own_again(worker: &Inner, guard: &mut ForgetOnDrop, lease: &Lease) -> bool {
    guard.slot = Arc::new(OwnerSlot::default());
    if worker.register_owner(guard.conversation, guard.slot.clone()) {
        return true;
    }
    let _ = worker.bus.release(lease).await;
    false
}

/// Whether an owner whose drain left `head` keeps its lease for the next message instead of
/// releasing it (see `crate::kept`): the worker is alone on the bus and not stopping, keeping
/// is on, the record has no turn open, and the lease holds beyond the fence's margin.
fn keeps(worker: &Inner, env: &TurnEnv, head: &Head) -> bool {
    !worker.config.keep_lease_for.is_zero()
        && worker.dispatch.is_lone()
        && !worker.is_stopping()
        && !head.state().turn_open
        && env.fence.check().is_ok()
}

/// Forgets the owner's current slot when the owner's task ends, however it ends (a slot that
/// was already forgotten, or replaced by another owner's, is left alone).
struct ForgetOnDrop {
    worker: Arc<Inner>,
    conversation: turnpike_schemas::ConversationId,
    slot: Arc<OwnerSlot>,
}

impl Drop for ForgetOnDrop {
    fn drop(&mut self) {
        self.worker.forget_owner(self.conversation, &self.slot);
    }
}

/// The head a drain starts from (DESIGN step 3): nothing for a deleted conversation; a repair
/// cut short after its commit point finished; a missing record opened; an earlier owner's
/// unfinished promotion finished.
/// `known`: the head this worker's last drain of the conversation left, if it remembers it.
async fn open_drain(env: &TurnEnv, known: Option<Head>) -> Result<Head> {
    let conversation = env.record.prefix().conversation();
    // A conversation being (or once) deleted runs nothing more: its wakes are dropped, and a
    // deletion cut short is the sweep's to finish.
    let tombstones = turnpike_artifactory::Tombstones::new(env.files.store().clone());
    if tombstones
        .get(env.record.prefix().tenant(), conversation)
        .await?
        .is_some()
    {
        return Err(Error::refused(format!(
            "{conversation} is deleted: nothing more runs in it"
        )));
    }
    // A repair cut short after its commit point is finished before anything reads the head.
    env.record.finish_repair().await?;
    let mut head = match &known {
        Some(known) => env.record.head_from_known(known).await?,
        None => env.record.head().await?,
    };
    if head.is_empty() {
        head = crate::parking::open_missing_record(env, head).await?;
    }
    // A previous owner may have died between a commit and its promotion. If that cannot be
    // finished (e.g. a turn from before attempts existed left other bytes at a canonical key),
    // say so and go on: the lane must not stall on it.
    match finish_promotion(env, &head).await {
        Ok(()) => {}
        Err(e)
            if e.store_error().map(|s| s.kind())
                == Some(turnpike_artifactory::ErrorKind::AlreadyExists) =>
        {
            warn!(%conversation, error = %e, "could not finish an earlier turn's promotion");
        }
        // Anything else (the store is away): not now; nothing new runs before it is done.
        Err(e) => return Err(e),
    }
    Ok(head)
}

/// Records a run of stops with no turn to stop, on their own (refused ones set aside).
async fn record_stops(env: &TurnEnv, head: Head, inputs: &[LaneMessage]) -> Result<Head> {
    let bodies: Vec<EntryBody> = inputs
        .iter()
        .map(|m| EntryBody::input(m.event.clone(), Some(m.seq)))
        .collect();
    match env.append(&head, &bodies).await {
        Ok(head) => Ok(head),
        // Refused by the record: set aside, like a turn's inputs (never retried).
        Err(e) if e.kind() == crate::error::ErrorKind::Refused => {
            crate::parking::park_refused(env, &head, inputs, &e).await
        }
        Err(e) => Err(e),
    }
}

/// After a clean drain and release: the lane's last sequence when messages came past what the
/// drain took (the owner claims again for them); `None` when nothing did, the worker is
/// stopping, the lane cannot be read, or the lane is behind the record (an operator's to mend:
/// nothing is skipped). A lane where the record says marks the drain for later wakes.
async fn lane_past(
    worker: &Inner,
    conversation: ConversationId,
    lane_through: u64,
    state: Option<&RecordState>,
) -> Option<u64> {
    let last = worker.bus.lane_last(conversation).await.ok()?;
    if last < lane_through {
        // The lane holds less than the record says was committed from it: the stream was
        // recreated or re-sharded. Acking or skipping would lose events: stop and alarm.
        tracing::error!(%conversation, lane_last = last, lane_through, "the lane is behind the record (a recreated or re-sharded lane stream); nothing is skipped, this conversation waits for an operator");
        return None;
    }
    // The lane is where the record says: wakes up to here that come later are done, once the
    // record (read again) says so (see `Worker::handle`).
    if state.is_some_and(|s| !s.turn_open) {
        worker.drained(conversation, lane_through);
    }
    (last != lane_through && !worker.is_stopping()).then_some(last)
}

/// Drains the lane (see [`drain`]) while renewing the lease at `renew_every`; a lease lost, or
/// one that can no longer be renewed before it lapses, fences the drain.
async fn drain_renewing(
    worker: &Inner,
    env: &TurnEnv,
    lease: &mut Lease,
    slot: &OwnerSlot,
    known_last: u64,
    owned_since: Instant,
    resumed: Option<Head>,
) -> Result<Head> {
    let conversation = lease.conversation;
    let work = drain(
        env,
        slot,
        lease.epoch(),
        known_last,
        worker,
        owned_since,
        resumed,
    );
    tokio::pin!(work);
    let every = worker.config.renew_every;
    // Every `renew_every` after the lease's last renewal (a kept lease resumed was renewed
    // before this drain began).
    let first = crate::kept::renewal_due_in(lease, worker.config.lease_ttl, every);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + first, every);
    loop {
        tokio::select! {
            biased;
            result = &mut work => return result,
            _ = tick.tick() => {
                // The turn is not polled while this runs, so nothing is written meanwhile; the
                // fence below decides once it returns. (No timeout of our own: dropping a
                // renewal mid-write would make it ambiguous, which the bus resolves only when
                // the call runs to its end.)
                match worker.bus.renew(lease, worker.config.lease_ttl).await {
                    Ok(renewed) => {
                        *lease = renewed;
                        env.fence.renewed(lease.expires_ms);
                    }
                    Err(e) if e.kind() == ErrorKind::LeaseLost => return Err(Error::fenced(e.to_string())),
                    Err(e) => warn!(%conversation, error = %e, "lease renewal failed; retrying"),
                }
                // Cut off from the bus but not from the store: stop before the lease can lapse,
                // so no write of ours lands after another owner's.
                if !env.fence.holds_at(now_ms()) {
                    return Err(Error::fenced("the lease could not be renewed before it expires"));
                }
                slot.progress().await;
            }
        }
    }
}

/// Gives back the wakes an owner still held when it stopped: after a clean drain the rest is
/// for whoever comes next, at once; after a failure, later, so that a persistent fault does not
/// spin; what no retry could mend (logged) is never redelivered.
async fn settle_leftovers(worker: &Inner, leftovers: Vec<Wake>, outcome: &Result<Head>) {
    let settlement = match outcome {
        Ok(_) => Settlement::Handover,
        Err(e) if e.kind() == crate::error::ErrorKind::Refused => Settlement::Poison,
        Err(_) => Settlement::Failed,
    };
    if let Err(e) = outcome {
        let reason = if e.is_fenced() {
            "fenced"
        } else if e.kind() == crate::error::ErrorKind::Refused {
            "refused"
        } else {
            "failed"
        };
        metrics::counter!("turnpike_turns_abandoned_total", "reason" => reason).increment(1);
    }
    for wake in leftovers {
        wake.settle(settlement, worker.config.busy_delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnpike_schemas::{Address, ConversationId, Event};

    fn lane(kinds: &[&str]) -> Vec<LaneMessage> {
        lane_of(kinds, &[])
    }

    /// A lane of events; `others` are the positions sent by another participant.
    fn lane_of(kinds: &[&str], others: &[usize]) -> Vec<LaneMessage> {
        let address = Address {
            tenant: "t".parse().unwrap(),
            app: "a".parse().unwrap(),
            agent: "g".parse().unwrap(),
            conversation: ConversationId::new(),
            identity: "x:y".parse().unwrap(),
        };
        kinds
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let body = match *k {
                    "m" => EventBody::Message { text: "m".into() },
                    "f" => EventBody::FollowUp { text: "f".into() },
                    _ => EventBody::Stop { reason: None },
                };
                let mut address = address.clone();
                if others.contains(&i) {
                    address.identity = "x:other".parse().unwrap();
                }
                LaneMessage {
                    seq: i as u64 + 1,
                    event: Event::new(address, body, 0),
                }
            })
            .collect()
    }

    fn split(kinds: &[&str]) -> (bool, Vec<u64>) {
        let pending = lane(kinds);
        let (stops, taken) = next_inputs(&pending);
        (stops, pending[..taken].iter().map(|m| m.seq).collect())
    }

    #[test]
    fn a_turn_takes_one_message_and_what_follows_it() {
        assert_eq!(split(&["m", "m"]), (false, vec![1]));
        assert_eq!(split(&["m", "f", "s", "m"]), (false, vec![1, 2, 3]));
        // Events ahead of a message (an attachment, a late follow-up) join its turn.
        assert_eq!(split(&["f", "m"]), (false, vec![1, 2]));
        assert_eq!(split(&["f", "m", "f", "m"]), (false, vec![1, 2, 3]));
        assert_eq!(split(&["f", "f"]), (false, vec![1, 2]));
        assert_eq!(split(&["s", "s", "m"]), (true, vec![1, 2]));
    }

    #[test]
    fn another_participants_events_start_their_own_turn() {
        let split = |kinds: &[&str], others: &[usize]| {
            let pending = lane_of(kinds, others);
            let (stops, taken) = next_inputs(&pending);
            (
                stops,
                pending[..taken].iter().map(|m| m.seq).collect::<Vec<_>>(),
            )
        };
        // A follow-up of someone else is not folded into the message's turn.
        assert_eq!(split(&["m", "f", "f"], &[1]), (false, vec![1]));
        // Someone else's follow-up ahead of a message is a turn of its own.
        assert_eq!(split(&["f", "m"], &[0]), (false, vec![1]));
        // Anyone's stop still stops the turn.
        assert_eq!(split(&["m", "s", "f"], &[1]), (false, vec![1, 2, 3]));
    }
}
