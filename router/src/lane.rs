//! A conversation's lane: the messages on it, reading them (a message this binary cannot read
//! is handed over with its bytes, not skipped), the envelope a wake is routed by, and the id a
//! publish is deduplicated by. Subjects and streams are named in [`crate::subject`].

use serde::Deserialize;
use turnpike_schemas::{ConversationId, Event};

use crate::error::Result;

/// An event on a lane, with its sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneMessage {
    pub seq: u64,
    pub event: Event,
}

pub use crate::error::Unreadable;

/// Decodes a lane message, or says why it cannot be read.
pub fn decode_lane_message(seq: u64, bytes: &[u8]) -> std::result::Result<LaneMessage, Unreadable> {
    match serde_json::from_slice::<Event>(bytes) {
        Ok(event) => Ok(LaneMessage { seq, event }),
        Err(e) => Err(Unreadable {
            seq,
            bytes: bytes.to_vec(),
            reason: format!("this runtime cannot read it: {e}"),
        }),
    }
}

/// Just enough of a lane message to route its wake: its address. A message whose body this
/// binary cannot read still wakes its conversation's owner, who parks it.
#[derive(Debug, Deserialize)]
pub struct Envelope {
    pub address: turnpike_schemas::Address,
}

/// The envelope of bytes to republish on the lane of `conversation`: refused unless it names
/// that conversation.
pub fn republished_envelope(conversation: ConversationId, bytes: &[u8]) -> Result<Envelope> {
    let envelope: Envelope = serde_json::from_slice(bytes).map_err(|e| {
        crate::Error::with_source(
            crate::ErrorKind::Invalid,
            "the bytes to requeue carry no readable address",
            e,
        )
    })?;
    if envelope.address.conversation != conversation {
        return Err(crate::Error::new(
            crate::ErrorKind::Invalid,
            format!(
                "the bytes to requeue are addressed to {}, not {conversation}",
                envelope.address.conversation
            ),
        ));
    }
    Ok(envelope)
}

/// The message id a publish is deduplicated by: the idempotency key of one identity within its
/// conversation (the same key sent by two identities is two events; one identity cannot
/// swallow another's event by guessing its key), else the event id.
pub fn dedupe_id(event: &Event) -> String {
    match &event.idempotency_key {
        Some(key) => format!(
            "{}:{}:{key}",
            event.address.conversation,
            turnpike_artifactory::layout::identity_key(&event.address.identity)
        ),
        None => event.id.to_string(),
    }
}
