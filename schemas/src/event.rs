//! The versioned, addressed event envelope: every input to a conversation.

use serde::{Deserialize, Serialize};

use crate::error::{SchemaError, SchemaErrorKind};
use crate::identity::Identity;
use crate::ids::{AgentId, AppId, ConversationId, EventId, RequestId, TenantId};
use crate::reference::Reference;

/// The envelope version this build writes and accepts.
pub const EVENT_VERSION: u16 = 1;
/// The longest text of a message, follow-up, steer or answer, in bytes.
pub const MAX_TEXT_BYTES: usize = 64 * 1024;
/// The largest attachment, in bytes.
pub const MAX_ATTACHMENT_BYTES: u64 = 8 * 1024 * 1024;
/// The longest attachment preview, in bytes.
pub const MAX_PREVIEW_BYTES: usize = 1024;
/// The longest idempotency key, in bytes.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 128;
/// Media types an attachment may have.
pub const ATTACHMENT_MEDIA_TYPES: [&str; 6] = [
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
    "application/pdf",
    "text/plain",
];

/// Where an event goes and on whose behalf.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Address {
    pub tenant: TenantId,
    pub app: AppId,
    pub agent: AgentId,
    pub conversation: ConversationId,
    /// The authenticated caller, bound by the edge — never taken from model output.
    pub identity: Identity,
}

/// An addressed input event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Envelope version; see [`EVENT_VERSION`].
    pub version: u16,
    pub id: EventId,
    pub address: Address,
    /// The client's key: a retried request with the same key is accepted once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// When the edge accepted it, in milliseconds since the Unix epoch.
    pub accepted_at_ms: u64,
    /// Limits the edge places on the turn this event opens (set by ingress, never by a client);
    /// recorded as an `ingress_directive` entry in batch one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directive: Option<IngressDirective>,
    pub body: EventBody,
    /// What sent it when no person did (a schedule's firing, an inbound webhook): its turn is
    /// a session's, run headless (set by the edge or the scheduler, never by a client).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
    /// The W3C `traceparent` of the span that accepted it, carried beside the event (a lane
    /// message header), never in it: not part of the record, advisory, absent without tracing.
    #[serde(skip)]
    pub traceparent: Option<String>,
}

/// What sent an event when no person did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Origin {
    /// A schedule's firing at `fire_ms`.
    Schedule {
        schedule: crate::ScheduleId,
        fire_ms: u64,
    },
    /// A delivery to an app's inbound hook.
    Hook { app: AppId, hook: String },
}

/// What the event asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum EventBody {
    /// A new user message: starts a turn.
    Message { text: String },
    /// More input for the running turn, folded in between rounds.
    FollowUp { text: String },
    /// Redirects the next round of the running turn.
    Steer { text: String },
    /// Cancels the running turn.
    Stop {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Answers an approval request. A client that shows the call may echo its tool and
    /// arguments: the answer then applies only if they are the pending call's.
    ApprovalResponse {
        request_id: RequestId,
        approve: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        arguments: Option<serde_json::Value>,
    },
    /// Answers a question the agent asked.
    QuestionResponse {
        request_id: RequestId,
        answer: String,
    },
    /// A file the user attached, already stored in the artifactory.
    Attachment {
        name: String,
        media_type: String,
        size: u64,
        reference: Reference,
        /// A bounded description of the content (at most [`MAX_PREVIEW_BYTES`]): dimensions,
        /// pages, the first lines of a text.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        preview: Option<String>,
    },
    /// Hands the conversation to another agent of the app.
    SwitchAgent { agent: AgentId },
    /// Asks for a manual compaction.
    Compact {},
}

impl EventBody {
    /// The kind name as it appears on the wire.
    pub fn kind_name(&self) -> &'static str {
        match self {
            EventBody::Message { .. } => "message",
            EventBody::FollowUp { .. } => "follow_up",
            EventBody::Steer { .. } => "steer",
            EventBody::Stop { .. } => "stop",
            EventBody::ApprovalResponse { .. } => "approval_response",
            EventBody::QuestionResponse { .. } => "question_response",
            EventBody::Attachment { .. } => "attachment",
            EventBody::SwitchAgent { .. } => "switch_agent",
            EventBody::Compact {} => "compact",
        }
    }
}

impl Event {
    /// A fresh event of the current version.
    pub fn new(address: Address, body: EventBody, accepted_at_ms: u64) -> Self {
        Event {
            version: EVENT_VERSION,
            id: EventId::new(),
            address,
            idempotency_key: None,
            accepted_at_ms,
            directive: None,
            body,
            origin: None,
            traceparent: None,
        }
    }

    /// Checks everything the types cannot: version, sizes, keys, media types.
    pub fn validate(&self) -> Result<(), SchemaError> {
        let fail = |why: String| {
            Err(SchemaError::new(
                SchemaErrorKind::InvalidEvent,
                format!("invalid {} event: {why}", self.body.kind_name()),
            ))
        };
        if self.version != EVENT_VERSION {
            return fail(format!(
                "unsupported envelope version {} (this build speaks {EVENT_VERSION})",
                self.version
            ));
        }
        if let Some(key) = &self.idempotency_key {
            if key.is_empty()
                || key.len() > MAX_IDEMPOTENCY_KEY_LEN
                || !key.bytes().all(|b| b.is_ascii_graphic())
            {
                return fail(
                    "the idempotency key must be 1–128 printable ASCII characters".to_owned(),
                );
            }
        }
        let text = match &self.body {
            EventBody::Message { text }
            | EventBody::FollowUp { text }
            | EventBody::Steer { text }
            | EventBody::QuestionResponse { answer: text, .. } => Some(text),
            EventBody::Stop { reason } | EventBody::ApprovalResponse { reason, .. } => {
                reason.as_ref()
            }
            _ => None,
        };
        if let Some(text) = text {
            if text.len() > MAX_TEXT_BYTES {
                return fail(format!(
                    "the text is {} bytes, more than the limit of {MAX_TEXT_BYTES}",
                    text.len()
                ));
            }
        }
        if matches!(&self.body, EventBody::Message { text } if text.trim().is_empty()) {
            return fail("the message is empty".to_owned());
        }
        if let EventBody::Attachment {
            name,
            media_type,
            size,
            reference,
            preview,
        } = &self.body
        {
            if preview
                .as_ref()
                .is_some_and(|p| p.len() > MAX_PREVIEW_BYTES)
            {
                return fail(format!(
                    "the preview is longer than {MAX_PREVIEW_BYTES} bytes"
                ));
            }
            if *size > MAX_ATTACHMENT_BYTES {
                return fail(format!(
                    "the attachment is {size} bytes, more than the limit of {MAX_ATTACHMENT_BYTES}"
                ));
            }
            if !ATTACHMENT_MEDIA_TYPES.contains(&media_type.as_str()) {
                return fail(format!(
                    "media type {media_type:?} is not accepted (accepted: {})",
                    ATTACHMENT_MEDIA_TYPES.join(", ")
                ));
            }
            if name.is_empty() || name.len() > 255 || name.contains(['/', '\\']) {
                return fail("the attachment name must be 1–255 bytes without slashes".to_owned());
            }
            if reference.conversation() != self.address.conversation {
                return fail("the attachment belongs to another conversation".to_owned());
            }
        }
        Ok(())
    }
}

/// Limits placed on a turn by ingress. Each field can only tighten what the agent allows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngressDirective {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rounds: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_approver: Option<Identity>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address() -> Address {
        Address {
            tenant: "acme".parse().unwrap(),
            app: "support".parse().unwrap(),
            agent: "helper".parse().unwrap(),
            conversation: ConversationId::new(),
            identity: "oidc:acme:u-17".parse().unwrap(),
        }
    }

    #[test]
    fn round_trips_through_json() {
        let mut event = Event::new(
            address(),
            EventBody::Message {
                text: "hello".into(),
            },
            1_700_000_000_000,
        );
        event.idempotency_key = Some("k-1".into());
        let json = serde_json::to_string(&event).unwrap();
        assert!(json.contains(r#""kind":"message""#), "{json}");
        assert_eq!(serde_json::from_str::<Event>(&json).unwrap(), event);
        event.validate().unwrap();
    }

    #[test]
    fn validation_names_the_problem() {
        let mut event = Event::new(
            address(),
            EventBody::Message {
                text: "x".repeat(MAX_TEXT_BYTES + 1),
            },
            0,
        );
        assert!(event.validate().unwrap_err().to_string().contains("limit"));
        event.body = EventBody::Message { text: "  ".into() };
        assert!(event.validate().unwrap_err().to_string().contains("empty"));
        event.body = EventBody::Message { text: "hi".into() };
        event.version = 2;
        assert!(event
            .validate()
            .unwrap_err()
            .to_string()
            .contains("version"));
        event.version = EVENT_VERSION;
        event.idempotency_key = Some("has space".into());
        assert!(event
            .validate()
            .unwrap_err()
            .to_string()
            .contains("idempotency"));
    }

    #[test]
    fn unknown_kinds_and_fields_are_refused() {
        let bad = r#"{"kind":"message","text":"hi","extra":1}"#;
        assert!(serde_json::from_str::<EventBody>(bad).is_err());
        assert!(serde_json::from_str::<EventBody>(r#"{"kind":"launch"}"#).is_err());
    }
}
