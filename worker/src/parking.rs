//! Poison, not endless retries (invariant 3): what an owner does with lane messages it can
//! never take, and with a conversation whose record was never opened.
//!
//! # Contract
//! - A lane message this binary cannot read, or inputs the record refuses, are kept as dead
//!   letters first, then a `lane_parked` entry per message moves the record past them. An owner
//!   that dies in between leaves letters that the next owner parks again (create-only, the
//!   first letter stays) before it commits the entries: no message is lost, none is run twice,
//!   and nobody pays for a model call on input that cannot be taken.
//! - An operator lists the letters and requeues one (`turnpike conversation dead-letters`,
//!   `… requeue`): its bytes go back on the lane as a new message.
//! - A record with no opening batch (its creation stopped between the directory entry and the
//!   first batch) is opened from the directory entry, which holds everything the opening says.
//!   A lane with no directory entry at all belongs to no conversation: refused.

use tracing::error;
use turnpike_artifactory::{DeadLetter, Head};
use turnpike_router::bus::{now_ms, Unreadable};
use turnpike_router::LaneMessage;
use turnpike_schemas::entry::{ConversationOpened, LaneParked};
use turnpike_schemas::EntryBody;

use crate::error::{Error, Result};
use crate::turn::TurnEnv;

/// A lane message to set aside.
pub(crate) struct Letter(DeadLetter);

impl Letter {
    /// A message this binary cannot read.
    pub(crate) fn of_unreadable(message: &Unreadable) -> Self {
        Self(DeadLetter::new(
            message.seq,
            message.reason.clone(),
            now_ms(),
            &message.bytes,
        ))
    }

    /// An input the record refused, for `why`.
    fn of_event(message: &LaneMessage, why: &str) -> Self {
        let bytes = serde_json::to_vec(&message.event).expect("events serialise");
        Self(DeadLetter::new(
            message.seq,
            format!("the record refused it: {why}"),
            now_ms(),
            &bytes,
        ))
    }
}

/// Keeps `letters` (in lane order) as dead letters, then commits one `lane_parked` entry each.
pub(crate) async fn park(env: &TurnEnv, head: &Head, letters: Vec<Letter>) -> Result<Head> {
    let prefix = env.record.prefix();
    let mut bodies = Vec::with_capacity(letters.len());
    for Letter(letter) in letters {
        env.fence.check()?;
        let key = env.dead_letters.park(prefix, &letter).await?;
        error!(conversation = %prefix.conversation(), lane_seq = letter.lane_seq, reason = %letter.reason,
               "a lane message cannot be taken; parked as a dead letter for an operator");
        bodies.push(EntryBody::LaneParked(LaneParked {
            lane_seq: letter.lane_seq,
            reason: letter.reason,
            dead_letter: key,
        }));
    }
    env.config
        .failpoints
        .hit("after-dead-letter", prefix.conversation())
        .await;
    env.append(head, &bodies).await
}

/// Sets aside `inputs` the record refused (with `refusal`'s reason), one letter each.
pub(crate) async fn park_refused(
    env: &TurnEnv,
    head: &Head,
    inputs: &[LaneMessage],
    refusal: &Error,
) -> Result<Head> {
    let why = refusal.to_string();
    let letters = inputs.iter().map(|m| Letter::of_event(m, &why)).collect();
    park(env, head, letters).await
}

/// Opens a record that has no batch yet from the conversation's directory entry (its creator
/// stopped between the two writes); refuses a lane that belongs to no conversation.
pub(crate) async fn open_missing_record(env: &TurnEnv, head: Head) -> Result<Head> {
    let prefix = env.record.prefix();
    let entry = match env
        .directory
        .lookup_in_tenant(prefix.conversation(), prefix.tenant())
        .await
    {
        Ok(entry) => entry,
        Err(e) if e.kind() == turnpike_artifactory::ErrorKind::NotFound => {
            return Err(Error::refused(format!(
                "{} has no record and no directory entry: its lane belongs to no conversation",
                prefix.partition()
            )))
        }
        Err(e) => return Err(e.into()),
    };
    tracing::warn!(conversation = %prefix.conversation(), "opening a record its creator left without an opening batch");
    let opened = EntryBody::ConversationOpened(ConversationOpened {
        tenant: entry.tenant,
        owner: entry.owner,
        app: entry.app,
        agent: entry.agent,
        at_ms: entry.created_ms,
    });
    match env.append(&head, &[opened]).await {
        Ok(head) => Ok(head),
        // Its creator finished meanwhile: go on from what it wrote.
        Err(e) if e.is_fenced() => Ok(env.record.head().await?),
        Err(e) => Err(e),
    }
}
