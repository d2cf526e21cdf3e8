//! What goes over the wire: request and response bodies, with their OpenAPI schemas.

use serde::{Deserialize, Serialize};
use turnpike_artifactory::RecordEntry;
use turnpike_schemas::{EntryBody, EventBody};
use utoipa::{IntoParams, ToSchema};

/// The caller, as the API sees them.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MeView {
    pub identity: String,
    pub tenant: String,
    /// May use `/v1/admin/…` in its tenant.
    pub admin: bool,
}

/// An app this deployment hosts.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AppView {
    /// The app's id.
    pub id: String,
    pub agents: Vec<AgentView>,
    /// The tenants the app is offered to (empty: every tenant). Not shown: what one tenant
    /// may use says nothing to another.
    #[serde(skip)]
    pub tenants: Vec<String>,
}

impl AppView {
    /// Whether `tenant` may use the app.
    pub fn offered_to(&self, tenant: &str) -> bool {
        self.tenants.is_empty() || self.tenants.iter().any(|t| t == tenant)
    }
}

/// One thing an agent can do, from its manifest.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SkillView {
    pub id: String,
    pub name: String,
    pub description: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<String>,
}

/// One agent of an app.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AgentView {
    pub id: String,
    /// The model the agent runs (empty for scripted and native agents).
    pub model: String,
    /// The tools the agent may call.
    pub tools: Vec<String>,
    /// Tokens the model takes (0 when unknown).
    pub context_length: u32,
    /// Its MCP servers that need each user's own connection (`PUT /v1/connections/{app}/{server}`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connections: Vec<String>,
    /// What the agent is for (its manifest's `description`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// What it can do (its manifest's `skills`), as its A2A card lists them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<SkillView>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AppList {
    pub apps: Vec<AppView>,
}

/// A new conversation.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateConversation {
    /// An app this deployment hosts (see `GET /v1/apps`).
    #[schema(example = "demo", pattern = "^[a-z0-9][a-z0-9_-]{0,62}$")]
    pub app: String,
    /// One of the app's agents.
    #[schema(example = "assistant", pattern = "^[a-z0-9][a-z0-9_-]{0,62}$")]
    pub agent: String,
    /// Instructions for every turn, added to the agent's system prompt (at most 16 KiB).
    #[serde(default)]
    #[schema(max_length = 16384)]
    pub instructions: Option<String>,
}

/// Where a conversation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Nothing running; the next message starts a turn.
    Idle,
    /// A turn is running.
    Running,
    /// The last turn waits for an approval or an answer.
    Waiting,
    /// Closed as idle: nothing happened in it for its app's idle timeout; the next message
    /// reopens it.
    IdleClosed,
    /// Closed: readable, accepts no events.
    Closed,
}

/// A conversation as its owner (or someone it is shared with) sees it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ConversationView {
    pub id: String,
    pub tenant: String,
    pub owner: String,
    pub app: String,
    /// The active agent.
    pub agent: String,
    pub status: Status,
    /// User messages and follow-ups committed.
    pub messages: u64,
    /// Turns dispatched.
    pub turns: u64,
    /// Rows the record holds: the highest `seq` there is.
    pub through: u64,
    pub created_ms: u64,
    /// When it last did something: opened, a turn dispatched or completed, reopened.
    pub active_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub closed_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// What started it when no person did — `{"kind": "schedule", "schedule", "fire_ms"}` or
    /// `{"kind": "hook", "app", "hook"}`: a session's conversation.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub started_by: Option<serde_json::Value>,
}

/// A page of conversations, newest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ConversationList {
    pub conversations: Vec<ConversationView>,
    /// Pass as `before` for the next (older) page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_before: Option<String>,
}

#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListConversations {
    /// Only conversations older than this id.
    #[param(pattern = "^conv_[0-7][0-9A-HJKMNP-TV-Z]{25}$")]
    pub before: Option<String>,
    /// At most this many (1–100, default 20).
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
}

/// Text from the user: a message, a follow-up or a steer.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TextInput {
    /// 1 byte to 64 KiB, not all spaces.
    #[schema(min_length = 1, max_length = 65536, pattern = "[^\\s\\x1c-\\x1f]")]
    pub text: String,
}

/// Whether text is all spaces, as the OpenAPI document's patterns count them (Unicode white
/// space, and the four separators `\x1c`–`\x1f` Python's `\s` includes): such text says nothing.
pub fn blank(text: &str) -> bool {
    text.chars()
        .all(|c| c.is_whitespace() || ('\x1c'..='\x1f').contains(&c))
}

impl TextInput {
    /// The text, unless it is blank.
    pub fn checked(self) -> crate::error::ApiResult<String> {
        if blank(&self.text) {
            return Err(crate::error::ApiError::invalid(
                "the text is empty (only spaces)",
            ));
        }
        Ok(self.text)
    }
}

/// A stop, with an optional reason.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StopInput {
    #[serde(default)]
    #[schema(max_length = 65536)]
    pub reason: Option<String>,
}

/// An event the edge accepted: it is durable on the conversation's lane.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Accepted {
    pub conversation: String,
    pub event_id: String,
    pub kind: String,
    /// The event's sequence on the lane.
    pub lane_seq: u64,
    /// The same `Idempotency-Key` was accepted before: nothing new was stored.
    pub duplicate: bool,
}

/// One committed row of a conversation's record.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Row {
    /// The row's sequence (1, 2, …; gaps where the record holds signatures).
    pub seq: u64,
    /// The entry kind (`user_message`, `assistant_message`, `tool_call`, `approval_request`, …).
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn: Option<String>,
    /// The text, for messages, follow-ups, steers, answers and replies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The whole entry.
    #[schema(value_type = Object)]
    pub data: serde_json::Value,
}

impl Row {
    /// The client's view of a record entry; `None` for signatures (bookkeeping, not content).
    pub fn of(entry: &RecordEntry) -> Option<Row> {
        let body = &entry.body;
        if matches!(body, EntryBody::SignedRoot(_)) {
            return None;
        }
        let text = match body {
            EntryBody::AssistantMessage(m) => Some(m.text.clone()),
            EntryBody::QuestionRequest(q) => Some(q.question.clone()),
            other => other.as_input().and_then(|i| match &i.event.body {
                EventBody::Message { text }
                | EventBody::FollowUp { text }
                | EventBody::Steer { text }
                | EventBody::QuestionResponse { answer: text, .. } => Some(text.clone()),
                _ => None,
            }),
        };
        Some(Row {
            seq: entry.position + 1,
            kind: body.kind().as_str().to_owned(),
            turn: body.turn().map(|t| t.to_string()),
            text,
            data: serde_json::from_slice(&body.encode()).unwrap_or_default(),
        })
    }
}

/// A page of rows.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RowPage {
    pub rows: Vec<Row>,
    /// The record's highest `seq` when the page was read.
    pub through: u64,
    /// Pass as `after` to continue forwards (absent: nothing more yet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after: Option<u64>,
    /// Pass as `before` to page backwards (absent: this is the beginning).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prev_before: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListRows {
    /// Rows with `seq` above this (the replay cursor; 0 for the beginning).
    #[param(minimum = 0, maximum = 9007199254740991_u64)]
    pub after: Option<u64>,
    /// The rows just before this `seq`, in record order (paging backwards). With `after` too:
    /// the rows between the two, read forwards from `after`.
    #[param(minimum = 0, maximum = 9007199254740991_u64)]
    pub before: Option<u64>,
    /// At most this many entries read (1–500, default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

/// An approval request waiting for an answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ApprovalView {
    pub request_id: String,
    pub turn: String,
    pub tool: String,
    #[schema(value_type = Object)]
    pub arguments: serde_json::Value,
    /// Who may answer (empty: whoever may see the conversation).
    pub approvers: Vec<String>,
    /// A `connection_required` card: the MCP server of the conversation's app the call needs
    /// its sender's connection to. `PUT /v1/connections/{app}/{server}` resumes it (so does
    /// an approval, once connected); a rejection answers the call with the refusal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connection: Option<String>,
}

/// A question waiting for an answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct QuestionView {
    pub request_id: String,
    pub turn: String,
    pub question: String,
}

/// What waits for a person.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Pending {
    pub approvals: Vec<ApprovalView>,
    pub questions: Vec<QuestionView>,
}

/// An answer to an approval request. Echo the call's `tool` and `arguments` to make the answer
/// apply only to exactly the call you saw.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalInput {
    #[serde(default)]
    #[schema(max_length = 65536)]
    pub reason: Option<String>,
    #[serde(default)]
    pub tool: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub arguments: Option<serde_json::Value>,
}

/// An answer to a question.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AnswerInput {
    #[schema(max_length = 65536)]
    pub answer: String,
}

/// Hands the conversation to another agent of its app.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SwitchInput {
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$")]
    pub agent: String,
}

/// Shares a conversation with another identity, or takes that back.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantInput {
    /// `provider:external_id` or `provider:scope:external_id`.
    #[schema(
        example = "local:ana",
        pattern = "^[a-z][a-z0-9_-]{0,31}(:[^:\\s\\x00-\\x1f\\x7f-\\x9f]+){1,2}$",
        max_length = 256
    )]
    pub identity: String,
    /// The grantee's tenant; the owner's when absent. Grants never cross tenants: another
    /// tenant is refused.
    #[serde(default)]
    #[schema(example = "acme", pattern = "^[a-z0-9][a-z0-9_-]{0,62}$")]
    pub tenant: Option<String>,
}

/// Who a conversation is shared with.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct GrantView {
    pub conversation: String,
    pub identity: String,
    pub granted: bool,
}

/// An uploaded attachment: stored, and on the lane as an `attachment` event.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AttachmentView {
    /// Where the bytes are: `conv:at:<conversation>/turn_<n>/<id>/<name>`.
    pub reference: String,
    pub name: String,
    pub media_type: String,
    pub size: u64,
    /// A bounded description of the content (dimensions, pages, the first lines of text).
    pub preview: String,
    pub accepted: Accepted,
}

/// Asks for a short-lived link to a file.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LinkInput {
    /// A reference the caller may read (`conv:fi:…` or `conv:at:…`).
    #[schema(
        pattern = "^conv:[a-z]{2,16}:conv_[0-7][0-9A-HJKMNP-TV-Z]{25}/turn_[1-9][0-9]{0,17}/[A-Za-z0-9_~-][A-Za-z0-9._~-]{0,63}(/[A-Za-z0-9_~-][A-Za-z0-9._~-]{0,63}){0,7}$"
    )]
    pub reference: String,
    /// How long the link works, in seconds (1–3600, default 300).
    #[serde(default, deserialize_with = "whole_number")]
    #[schema(minimum = 1, maximum = 3600)]
    pub ttl_seconds: Option<u64>,
}

/// A JSON number that is a whole number of 0 or more (`176` or `176.0`, as JSON Schema's
/// `integer` allows), or null.
fn whole_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    if let Some(n) = n.as_u64() {
        return Ok(Some(n));
    }
    match n.as_f64() {
        Some(f) if f >= 0.0 && f.fract() == 0.0 && f < u64::MAX as f64 => Ok(Some(f as u64)),
        _ => Err(serde::de::Error::custom(format!(
            "{n} is not a whole number of 0 or more"
        ))),
    }
}

/// A short-lived credential for one conversation's stream: `…/stream?ticket=<ticket>` or
/// `…/events?ticket=<ticket>`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StreamTicket {
    pub ticket: String,
    /// After this (ms since the epoch) it opens nothing.
    pub expires_ms: u64,
}

/// A link that downloads a file without a token until it expires.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LinkView {
    /// A path on this server: `/v1/links/<signed token>`.
    pub url: String,
    pub expires_ms: u64,
}

#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FileQuery {
    /// The file's reference (`conv:fi:…` or `conv:at:…`).
    #[param(
        pattern = "^conv:[a-z]{2,16}:conv_[0-7][0-9A-HJKMNP-TV-Z]{25}/turn_[1-9][0-9]{0,17}/[A-Za-z0-9_~-][A-Za-z0-9._~-]{0,63}(/[A-Za-z0-9_~-][A-Za-z0-9._~-]{0,63}){0,7}$"
    )]
    pub reference: String,
}

#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SearchQuery {
    /// Words, or web-search syntax ("a phrase", -excluded, or): 1–1024 characters, not all
    /// spaces, no control characters.
    #[param(
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*[^\\s\\x00-\\x1f\\x7f-\\x9f][^\\x00-\\x1f\\x7f-\\x9f]*$",
        max_length = 1024
    )]
    pub q: String,
    /// `hybrid` (default), `lexical` or `vector`.
    #[param(pattern = "^(hybrid|lexical|vector)$")]
    pub mode: Option<String>,
    #[param(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$")]
    pub app: Option<String>,
    #[param(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$")]
    pub agent: Option<String>,
    #[param(pattern = "^conv_[0-7][0-9A-HJKMNP-TV-Z]{25}$")]
    pub conversation: Option<String>,
    /// Comma-separated kinds: prompt, completion, summary, attachment, file.
    #[param(
        pattern = "^(prompt|completion|summary|attachment|file)(,(prompt|completion|summary|attachment|file))*$"
    )]
    pub kinds: Option<String>,
    /// 1–100, default 10.
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
    /// 0–10000, default 0.
    #[param(minimum = 0, maximum = 10000)]
    pub offset: Option<u32>,
}

/// One search hit, hydrated through the resolver as the caller.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SearchHitView {
    pub conversation: String,
    pub turn: String,
    pub kind: String,
    pub reference: String,
    pub app: String,
    pub agent: String,
    pub at_ms: i64,
    pub score: f64,
    pub snippet: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SearchResults {
    pub hits: Vec<SearchHitView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u32>,
}

/// Which of the caller's memory to list: a conversation's, or all of it.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MemoryQuery {
    #[param(pattern = "^conv_[0-7][0-9A-HJKMNP-TV-Z]{25}$")]
    pub conversation: Option<String>,
    /// 1–500, default 100.
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    /// 0–100000, default 0.
    #[param(minimum = 0, maximum = 100000)]
    pub offset: Option<u32>,
}

/// Which conversation's memory to forget.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ForgetQuery {
    #[param(pattern = "^conv_[0-7][0-9A-HJKMNP-TV-Z]{25}$")]
    pub conversation: String,
}

/// One row the index remembers of the caller: what it points at (read it through the
/// resolver) and where it came from.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MemoryRowView {
    /// The row's id (a reference; percent-encode it in `DELETE /v1/memory/{row}`).
    pub id: String,
    pub conversation: String,
    pub turn: String,
    pub kind: String,
    pub reference: String,
    pub app: String,
    pub agent: String,
    pub at_ms: i64,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MemoryList {
    pub rows: Vec<MemoryRowView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u32>,
}

/// How many rows left the index.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ForgottenView {
    pub forgotten: u64,
}

/// The evidence of a deletion: who, when, why, and the record's final root.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TombstoneView {
    pub conversation: String,
    pub tenant: String,
    pub owner: String,
    pub deleted_by: String,
    pub reason: String,
    pub requested_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_root: Option<String>,
    pub final_leaves: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_ms: Option<u64>,
}

impl From<turnpike_artifactory::Tombstone> for TombstoneView {
    fn from(t: turnpike_artifactory::Tombstone) -> Self {
        Self {
            conversation: t.conversation.to_string(),
            tenant: t.tenant.to_string(),
            owner: t.owner.to_string(),
            deleted_by: t.deleted_by,
            reason: t.reason,
            requested_ms: t.requested_ms,
            final_root: t.final_root,
            final_leaves: t.final_leaves,
            finished_ms: t.finished_ms,
        }
    }
}

/// What `DELETE /v1/me` erased.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErasedView {
    /// The conversations deleted (each with its tombstone).
    pub conversations: Vec<TombstoneView>,
    /// Rows the index remembered of the caller, forgotten.
    pub forgotten: u64,
}

/// Which conversations an admin lists.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PhaseQuery {
    #[param(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$")]
    pub app: Option<String>,
    /// idle, running, waiting, idle_closed or closed.
    #[param(pattern = "^(idle|running|waiting|idle_closed|closed)$")]
    pub status: Option<String>,
}

/// One condition of a conversation: whether it holds, and why.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ConditionView {
    /// Ready, Progressing or Degraded.
    pub kind: String,
    pub status: bool,
    pub reason: String,
}

/// A conversation as an operator sees it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PhaseView {
    pub conversation: String,
    pub app: String,
    pub agent: String,
    /// Idle, Running, Waiting, IdleClosed, Closed, or Unknown.
    pub phase: String,
    pub ready: bool,
    pub conditions: Vec<ConditionView>,
    pub created_ms: u64,
    pub turns: u64,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PhaseList {
    pub conversations: Vec<PhaseView>,
}

/// What `verify` found.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct VerifyView {
    pub conversation: String,
    pub intact: bool,
    pub entries_checked: u64,
    pub batches_checked: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

/// One replayed turn.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReplayTurn {
    pub turn: String,
    pub reproduced: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub divergence: Option<String>,
}

/// What a replay from the recorded outputs found.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReplayView {
    pub conversation: String,
    pub reproduced: bool,
    pub turns: Vec<ReplayTurn>,
}

/// One frame on a conversation's stream (WebSocket text message, or SSE `data:`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Frame {
    /// First frame: the record holds rows up to `through`.
    Ready { through: u64 },
    /// The record now holds rows up to `through`: read them with
    /// `GET /v1/conversations/{id}/messages?after=<your cursor>`.
    Rows { through: u64 },
    /// Streamed text of a running turn (advisory: the committed row carries all of it).
    Delta { turn: String, text: String },
    /// The last frame: the caller may no longer see the conversation (its grant was revoked);
    /// the stream ends (a WebSocket closes with code 4403).
    Closed { reason: String },
}
