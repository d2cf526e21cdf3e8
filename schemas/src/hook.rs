//! Inbound webhooks an app declares (`[hooks.<name>]` in its manifest): a signed POST to
//! `/v1/hooks/{app}/{hook}` becomes a message in a conversation.

use serde::{Deserialize, Serialize};

use crate::{AgentId, Identity, TenantId};

/// How a hook's deliveries are signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookSignature {
    /// Standard Webhooks: `webhook-id`, `webhook-timestamp` and `webhook-signature`
    /// (`v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`), a `whsec_` secret.
    Standard,
    /// GitHub's: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`, the delivery id in
    /// `X-GitHub-Delivery`.
    Github,
}

/// Which conversation a delivery goes into.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookConversation {
    /// A new conversation per delivery.
    New,
    /// The conversation of a field of the JSON payload (a JSON pointer, e.g. `/issue/number`):
    /// deliveries with the same value go into the same conversation.
    Field(String),
}

/// What a delivery becomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookPayload {
    /// A message whose text is the payload (at most a message's size).
    #[default]
    Text,
    /// An attachment holding the payload (`text/plain`, up to an attachment's size), which
    /// opens the turn on its own; the agent reads it as it reads any attachment.
    Attachment,
}

/// An inbound hook, validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookSpec {
    pub name: String,
    pub agent: AgentId,
    /// The tenant its conversations belong to.
    pub tenant: TenantId,
    /// The identity its messages come from (and its conversations belong to).
    pub owner: Identity,
    pub signature: HookSignature,
    /// The environment variable that holds the secret (the secret itself is never in a
    /// manifest, the record, a log or an error).
    pub secret_env: String,
    pub conversation: HookConversation,
    /// The largest body taken, in bytes.
    pub max_bytes: usize,
    /// How far a Standard Webhooks timestamp may be from now, in seconds.
    pub tolerance_secs: u64,
    #[serde(default)]
    pub payload: HookPayload,
}
