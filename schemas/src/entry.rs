//! Record entries: the kinds of leaf in a conversation's signed, append-only record.
//!
//! On the wire an entry is a kind name plus a JSON payload; the kind decides the payload's type.
//! [`EntryBody::encode`] and [`EntryBody::decode`] are the only way between the two, so an entry
//! whose payload does not fit its kind is refused with a clear error, never guessed at.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{SchemaError, SchemaErrorKind};
pub use crate::event::IngressDirective;
use crate::event::{Event, EventBody};
use crate::identity::Identity;
use crate::ids::{AgentId, AppId, RequestId, TenantId, TurnId, WorkerId};
use crate::reference::Reference;

/// Declares the table of entry kinds: name on the wire, variant, payload type.
macro_rules! entry_kinds {
    ($($(#[doc = $doc:literal])* $variant:ident = $name:literal => $payload:ty,)*) => {
        /// The kind of a record entry.
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum EntryKind {
            $($(#[doc = $doc])* $variant,)*
        }

        impl EntryKind {
            /// Every kind, in table order.
            pub const ALL: &'static [EntryKind] = &[$(EntryKind::$variant,)*];

            /// The name on the wire.
            pub const fn as_str(&self) -> &'static str {
                match self {
                    $(EntryKind::$variant => $name,)*
                }
            }

            /// What an entry of this kind is, from its documentation (one line).
            pub fn describe(&self) -> String {
                let lines: &[&str] = match self {
                    $(EntryKind::$variant => &[$($doc),*],)*
                };
                lines.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ")
            }
        }

        impl FromStr for EntryKind {
            type Err = SchemaError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($name => Ok(EntryKind::$variant),)*
                    _ => Err(SchemaError::new(
                        SchemaErrorKind::InvalidEntry,
                        format!("unknown record entry kind {:?}", crate::error::truncate(s)),
                    )),
                }
            }
        }

        /// A record entry's typed content.
        #[derive(Debug, Clone, PartialEq)]
        pub enum EntryBody {
            $($(#[doc = $doc])* $variant($payload),)*
        }

        impl EntryBody {
            /// The entry's kind.
            pub fn kind(&self) -> EntryKind {
                match self {
                    $(EntryBody::$variant(_) => EntryKind::$variant,)*
                }
            }

            /// The payload as canonical JSON bytes (object keys sorted).
            pub fn encode(&self) -> Vec<u8> {
                let value = match self {
                    $(EntryBody::$variant(p) => serde_json::to_value(p),)*
                }
                .expect("entry payloads serialise to JSON");
                // `Value` keeps object keys sorted, so this is canonical.
                serde_json::to_vec(&value).expect("a JSON value serialises")
            }

            /// Decodes a payload of the given kind, refusing one that does not fit it.
            pub fn decode(kind: EntryKind, payload: &str) -> Result<EntryBody, SchemaError> {
                let fail = |e: serde_json::Error| {
                    SchemaError::new(
                        SchemaErrorKind::InvalidEntry,
                        format!("the payload of a {} entry does not fit its kind: {e}", kind.as_str()),
                    )
                };
                let body = match kind {
                    $(EntryKind::$variant => EntryBody::$variant(serde_json::from_str(payload).map_err(fail)?),)*
                };
                body.check()?;
                Ok(body)
            }
        }
    };
}

entry_kinds! {
    /// The first entry: who owns the conversation and where it belongs.
    ConversationOpened = "conversation_opened" => ConversationOpened,
    /// A user message that starts a turn.
    UserMessage = "user_message" => InputEntry,
    /// More input folded into the running turn.
    FollowUp = "follow_up" => InputEntry,
    /// A redirect of the running turn.
    Steer = "steer" => InputEntry,
    /// A request to cancel the running turn.
    Stop = "stop" => InputEntry,
    /// A file attached by the user.
    Attachment = "attachment" => InputEntry,
    /// An answer to an approval request, with who answered.
    ApprovalResponse = "approval_response" => InputEntry,
    /// An answer to a question.
    QuestionResponse = "question_response" => InputEntry,
    /// A request to switch agents.
    SwitchAgent = "switch_agent" => InputEntry,
    /// A request for a manual compaction.
    Compact = "compact" => InputEntry,
    /// Limits the ingress placed on a turn; it can only lower budgets or add an approver.
    IngressDirective = "ingress_directive" => IngressDirective,
    /// A turn was opened; nothing of it runs before this is committed.
    TurnDispatched = "turn_dispatched" => TurnDispatched,
    /// A turn finished; at most one per turn id.
    TurnComplete = "turn_complete" => TurnComplete,
    /// A side-effecting tool started and its result was never recorded: quarantined.
    TurnAmbiguous = "turn_ambiguous" => TurnAmbiguous,
    /// Text the agent said.
    AssistantMessage = "assistant_message" => AssistantMessage,
    /// A tool call the agent made.
    ToolCall = "tool_call" => ToolCall,
    /// A tool call's result.
    ToolResult = "tool_result" => ToolResult,
    /// A gated tool call waiting for approval.
    ApprovalRequest = "approval_request" => ApprovalRequest,
    /// How an approval request was answered: by whom, or automatically, and whether it applied.
    ApprovalResolved = "approval_resolved" => ApprovalResolved,
    /// A question the agent asked the user.
    QuestionRequest = "question_request" => QuestionRequest,
    /// Older turns were summarised.
    CompactionMarker = "compaction_marker" => CompactionMarker,
    /// The conversation moved to another agent.
    AgentSwitched = "agent_switched" => AgentSwitched,
    /// What a turn's context rebuild recalled from the index (references, not content).
    Recall = "recall" => RecallEntry,
    /// What one model call of a turn used: tokens (reported by the provider, or estimated)
    /// and their cost from the price table.
    Usage = "usage" => UsageEntry,
    /// A turn was cancelled.
    Cancelled = "cancelled" => Cancelled,
    /// Something went wrong in a turn.
    Error = "error" => ErrorEntry,
    /// A lane message this runtime could not take (unreadable, or refused by the record): set
    /// aside as a dead letter an operator can inspect and requeue; the lane moves past it.
    LaneParked = "lane_parked" => LaneParked,
    /// Nothing happened in the conversation for its app's idle timeout: it was closed as idle.
    /// The next event reopens it (an explicit close, in the directory, never reopens).
    IdleClosed = "idle_closed" => IdleClosed,
    /// An idle-closed conversation was reopened by the next event; the idle timer starts again.
    Reopened = "reopened" => Reopened,
    /// The conversation was imported from another deployment's archive: every entry before
    /// this one was re-signed here; the original root is kept as provenance. Its lane starts
    /// anew.
    Imported = "imported" => Imported,
    /// Closes every batch: an ed25519 signature over the MMR root of all entries before it.
    SignedRoot = "signed_root" => SignedRoot,
}

impl fmt::Display for EntryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for EntryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for EntryKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for EntryKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl EntryKind {
    /// The entry kind that records an input event of this body's kind.
    pub fn for_event(body: &EventBody) -> EntryKind {
        match body {
            EventBody::Message { .. } => EntryKind::UserMessage,
            EventBody::FollowUp { .. } => EntryKind::FollowUp,
            EventBody::Steer { .. } => EntryKind::Steer,
            EventBody::Stop { .. } => EntryKind::Stop,
            EventBody::ApprovalResponse { .. } => EntryKind::ApprovalResponse,
            EventBody::QuestionResponse { .. } => EntryKind::QuestionResponse,
            EventBody::Attachment { .. } => EntryKind::Attachment,
            EventBody::SwitchAgent { .. } => EntryKind::SwitchAgent,
            EventBody::Compact {} => EntryKind::Compact,
        }
    }

    /// Whether entries of this kind are input events taken from the lane.
    pub fn is_input(&self) -> bool {
        matches!(
            self,
            EntryKind::UserMessage
                | EntryKind::FollowUp
                | EntryKind::Steer
                | EntryKind::Stop
                | EntryKind::Attachment
                | EntryKind::ApprovalResponse
                | EntryKind::QuestionResponse
                | EntryKind::SwitchAgent
                | EntryKind::Compact
        )
    }
}

impl EntryBody {
    /// Records an input event (taken from the lane at `lane_seq`, when it came from one).
    pub fn input(event: Event, lane_seq: Option<u64>) -> EntryBody {
        let entry = InputEntry { lane_seq, event };
        match EntryKind::for_event(&entry.event.body) {
            EntryKind::UserMessage => EntryBody::UserMessage(entry),
            EntryKind::FollowUp => EntryBody::FollowUp(entry),
            EntryKind::Steer => EntryBody::Steer(entry),
            EntryKind::Stop => EntryBody::Stop(entry),
            EntryKind::ApprovalResponse => EntryBody::ApprovalResponse(entry),
            EntryKind::QuestionResponse => EntryBody::QuestionResponse(entry),
            EntryKind::Attachment => EntryBody::Attachment(entry),
            EntryKind::SwitchAgent => EntryBody::SwitchAgent(entry),
            _ => EntryBody::Compact(entry),
        }
    }

    /// The input event, for input entries.
    pub fn as_input(&self) -> Option<&InputEntry> {
        match self {
            EntryBody::UserMessage(e)
            | EntryBody::FollowUp(e)
            | EntryBody::Steer(e)
            | EntryBody::Stop(e)
            | EntryBody::Attachment(e)
            | EntryBody::ApprovalResponse(e)
            | EntryBody::QuestionResponse(e)
            | EntryBody::SwitchAgent(e)
            | EntryBody::Compact(e) => Some(e),
            _ => None,
        }
    }

    /// The turn the entry belongs to, when it belongs to one.
    pub fn turn(&self) -> Option<TurnId> {
        match self {
            EntryBody::TurnDispatched(e) => Some(e.turn),
            EntryBody::TurnComplete(e) => Some(e.turn),
            EntryBody::TurnAmbiguous(e) => Some(e.turn),
            EntryBody::AssistantMessage(e) => Some(e.turn),
            EntryBody::ToolCall(e) => Some(e.turn),
            EntryBody::ToolResult(e) => Some(e.turn),
            EntryBody::ApprovalRequest(e) => Some(e.turn),
            EntryBody::ApprovalResolved(e) => Some(e.turn),
            EntryBody::QuestionRequest(e) => Some(e.turn),
            EntryBody::CompactionMarker(e) => Some(e.turn),
            EntryBody::Cancelled(e) => Some(e.turn),
            EntryBody::Usage(e) => Some(e.turn),
            EntryBody::Error(e) => e.turn,
            _ => None,
        }
    }

    /// Cross-field rules the payload types cannot express.
    fn check(&self) -> Result<(), SchemaError> {
        if let Some(input) = self.as_input() {
            if EntryKind::for_event(&input.event.body) != self.kind() {
                return Err(SchemaError::new(
                    SchemaErrorKind::InvalidEntry,
                    format!(
                        "a {} entry holds a {} event",
                        self.kind(),
                        input.event.body.kind_name()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The first entry of every record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConversationOpened {
    pub tenant: TenantId,
    pub owner: Identity,
    pub app: AppId,
    pub agent: AgentId,
    pub at_ms: u64,
}

/// An input event as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputEntry {
    /// The event's sequence on the conversation's lane, when it came from one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane_seq: Option<u64>,
    pub event: Event,
}

/// A turn was opened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnDispatched {
    pub turn: TurnId,
    pub worker: WorkerId,
    /// The agent that runs the turn.
    pub agent: AgentId,
    /// The lease revision under which the turn was opened (the fencing epoch).
    #[serde(default)]
    pub epoch: crate::Epoch,
    pub at_ms: u64,
}

/// How a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnOutcome {
    /// The agent replied.
    Replied,
    /// A stop cancelled it.
    Cancelled,
    /// It failed; see the `error` entry.
    Failed,
    /// It waits for an approval or an answer.
    Parked,
}

/// A turn finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnComplete {
    pub turn: TurnId,
    pub outcome: TurnOutcome,
    /// Where the turn log is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<Reference>,
    /// SHA-256 (hex) of the turn log's bytes, so the signed record vouches for the log too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_sha256: Option<String>,
    /// The project version the turn published (a git commit id), if the conversation has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<crate::ProjectVersion>,
    /// The attempt that completed the turn: its side objects (log, snapshot, files) are the
    /// ones promoted to the turn's canonical keys. Absent in records written before attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u64>,
    pub at_ms: u64,
}

/// A turn whose side effects are unknown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnAmbiguous {
    pub turn: TurnId,
    pub tool: String,
    pub call_id: String,
    pub reason: String,
}

/// Text the agent said in a turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssistantMessage {
    pub turn: TurnId,
    pub text: String,
}

/// A tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    pub turn: TurnId,
    pub call_id: String,
    pub tool: String,
    pub arguments: Value,
    /// Whether the tool has side effects outside the workspace.
    #[serde(default)]
    pub side_effects: bool,
}

/// A tool call's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolResult {
    pub turn: TurnId,
    pub call_id: String,
    pub ok: bool,
    pub output: Value,
}

/// A gated call waiting for approval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRequest {
    pub turn: TurnId,
    pub request_id: RequestId,
    pub tool: String,
    /// The call's arguments in canonical form.
    pub arguments: Value,
    /// Who may approve; empty means the conversation's owner.
    #[serde(default)]
    pub approvers: Vec<Identity>,
    /// A `connection_required` card: the call needs its sender's connection to this MCP
    /// server of the app, which they lack; connecting (or approving) retries it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<String>,
}

/// What became of an approval request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalResolved {
    /// The turn that applied (or refused) the answer.
    pub turn: TurnId,
    pub request_id: RequestId,
    pub approved: bool,
    /// Who answered; none when the runtime rejected it automatically.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<Identity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Rejected by the runtime (a new message, an agent switch), not by a person.
    #[serde(default)]
    pub automatic: bool,
    /// The answer was refused (wrong approver, another call, not pending); the request is
    /// unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// A question for the user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuestionRequest {
    pub turn: TurnId,
    pub request_id: RequestId,
    pub question: String,
}

/// Turns up to `through` were summarised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactionMarker {
    pub turn: TurnId,
    pub through: TurnId,
    pub summary: String,
    pub model: String,
    pub prompt: String,
}

/// The conversation moved to another agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSwitched {
    pub from: AgentId,
    pub to: AgentId,
    pub by: Identity,
}

/// What a turn recalled: the query and the references, best first; a note when recall failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecallEntry {
    pub turn: TurnId,
    pub query: String,
    pub references: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A turn was cancelled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cancelled {
    pub turn: TurnId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Something went wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<TurnId>,
    pub message: String,
}

/// What one model call used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageEntry {
    pub turn: TurnId,
    /// The agent's provider kind (`openai`, `script`, …).
    pub provider: String,
    /// The model that answered, as the response named it (else the one asked for).
    pub model: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Input tokens served from the provider's cache (part of `input_tokens`).
    #[serde(default)]
    pub cached_tokens: u64,
    /// Output tokens spent reasoning (part of `output_tokens`).
    #[serde(default)]
    pub reasoning_tokens: u64,
    /// The provider reported no usage: the counts are the runtime's estimate.
    #[serde(default)]
    pub estimated: bool,
    /// The cost, when the price table has the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
}

/// A model call's cost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cost {
    /// In millionths of a US dollar.
    pub micro_usd: u64,
    /// The version of the price table it was computed from.
    pub prices: String,
}

/// A lane message set aside instead of taken: the record moves past its sequence, and the
/// message's bytes wait under `dead_letter` (a key in the conversation's store) for an operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaneParked {
    /// The lane sequence of the message.
    pub lane_seq: u64,
    /// Why it was not taken.
    pub reason: String,
    /// Where its bytes are kept.
    pub dead_letter: String,
}

/// The signature that closes a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedRoot {
    /// How many leaves the root covers (every entry before this one).
    pub leaf_count: u64,
    /// The MMR root, hex.
    pub root: String,
    /// The MMR peaks the root bags (hex, highest first), so an appender can resume from the
    /// last batch alone.
    pub peaks: Vec<String>,
    /// What the entries so far add up to, so a reader can resume from the last batch alone.
    pub state: RecordState,
    /// Which key signed: hex of the first 8 bytes of SHA-256 of the public key.
    pub key_id: String,
    /// The ed25519 signature, hex.
    pub signature: String,
}

/// A conversation closed for being idle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdleClosed {
    /// When it last did something (the state's `active_ms` at closing).
    pub idle_since_ms: u64,
    /// The idle timeout that applied, in milliseconds.
    pub after_ms: u64,
    pub at_ms: u64,
}

/// Where an imported conversation came from: what the exporting deployment had signed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Imported {
    /// The exporting deployment's last signed root over the entries before this one (hex).
    pub original_root: String,
    /// How many entries that root covers.
    pub original_leaves: u64,
    /// The key that signed it, and the public key itself (hex), so the original can still be
    /// checked against the archive.
    pub original_key_id: String,
    pub original_public_key: String,
    pub exported_ms: u64,
    /// Whether the archive was signed by a key the importer expected (false: it vouched for
    /// itself only).
    pub origin_verified: bool,
    /// Who imported it.
    pub by: String,
    pub at_ms: u64,
}

/// An idle-closed conversation reopened by the next event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reopened {
    pub at_ms: u64,
}

/// The state a record's entries add up to (a pure function of them; see the artifactory).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordState {
    /// The highest lane sequence of any committed input (0: none).
    pub lane_through: u64,
    /// The highest turn number dispatched (0: none).
    pub last_turn: u64,
    /// Whether the last turn is dispatched and neither completed nor marked ambiguous.
    pub turn_open: bool,
    /// The turn whose log holds the latest compaction summary (0: none), so a timeline can be
    /// rebuilt from that log and the turns after it without scanning the record.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub summary_turn: u64,
    /// The agent the conversation was switched to last (none: the one it was opened with).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_agent: Option<AgentId>,
    /// The latest project version a turn published (a git commit id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<crate::ProjectVersion>,
    /// How many user messages and follow-ups are committed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub messages: u64,
    /// Whether the last turn ended parked: it waits for an approval or an answer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub waiting: bool,
    /// When the conversation last did something (ms since the epoch): opened, a turn
    /// dispatched or completed, reopened. The idle timer runs from it. Batch format 3 on.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub active_ms: u64,
    /// Whether the conversation is closed as idle (the next event reopens it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idle_closed: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl EntryBody {
    /// The record entry of a block turn `turn` produced, for blocks that have one (inputs are
    /// recorded from their events, not from blocks). `identity` is who the turn runs as;
    /// `side_effects` says whether a tool has effects outside the turn.
    pub fn from_block(
        turn: TurnId,
        block: &crate::Block,
        identity: &crate::Identity,
        side_effects: &dyn Fn(&str) -> bool,
    ) -> Option<EntryBody> {
        use crate::Block;
        match block {
            Block::AssistantMessage { text } => {
                Some(EntryBody::AssistantMessage(AssistantMessage {
                    turn,
                    text: text.clone(),
                }))
            }
            Block::ToolCall {
                call_id,
                tool,
                arguments,
            } => Some(EntryBody::ToolCall(ToolCall {
                turn,
                call_id: call_id.clone(),
                tool: tool.clone(),
                arguments: arguments.clone(),
                side_effects: side_effects(tool),
            })),
            Block::ToolResult {
                call_id,
                ok,
                output,
            } => Some(EntryBody::ToolResult(ToolResult {
                turn,
                call_id: call_id.clone(),
                ok: *ok,
                output: output.clone(),
            })),
            Block::ApprovalRequest {
                request_id,
                tool,
                arguments,
                approvers,
                connection,
                ..
            } => Some(EntryBody::ApprovalRequest(ApprovalRequest {
                turn,
                request_id: *request_id,
                tool: tool.clone(),
                arguments: arguments.clone(),
                approvers: approvers.clone(),
                connection: connection.clone(),
            })),
            Block::ApprovalResponse {
                request_id,
                approved,
                by,
                reason,
                automatic,
                refused,
            } => Some(EntryBody::ApprovalResolved(ApprovalResolved {
                turn,
                request_id: *request_id,
                approved: *approved,
                by: by.clone(),
                reason: reason.clone(),
                automatic: *automatic,
                refused: refused.clone(),
            })),
            Block::QuestionRequest {
                request_id,
                question,
                ..
            } => Some(EntryBody::QuestionRequest(QuestionRequest {
                turn,
                request_id: *request_id,
                question: question.clone(),
            })),
            Block::AgentSwitched { from, to } => Some(EntryBody::AgentSwitched(AgentSwitched {
                from: from.clone(),
                to: to.clone(),
                by: identity.clone(),
            })),
            Block::Recall { query, hits, note } => Some(EntryBody::Recall(RecallEntry {
                turn,
                query: query.clone(),
                references: hits.iter().map(|h| h.reference.clone()).collect(),
                note: note.clone(),
            })),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Address;
    use crate::ids::ConversationId;

    #[test]
    fn every_kind_name_round_trips() {
        for kind in EntryKind::ALL {
            assert_eq!(kind.as_str().parse::<EntryKind>().unwrap(), *kind);
        }
        assert!("made_up".parse::<EntryKind>().is_err());
        for required in [
            "user_message",
            "follow_up",
            "steer",
            "stop",
            "attachment",
            "ingress_directive",
            "turn_dispatched",
            "turn_complete",
            "turn_ambiguous",
            "assistant_message",
            "tool_call",
            "tool_result",
            "approval_request",
            "approval_response",
            "approval_resolved",
            "question_request",
            "question_response",
            "compaction_marker",
            "agent_switched",
            "cancelled",
            "error",
            "signed_root",
        ] {
            assert!(required.parse::<EntryKind>().is_ok(), "{required} missing");
        }
    }

    #[test]
    fn payloads_encode_canonically_and_decode_by_kind() {
        let body = EntryBody::AssistantMessage(AssistantMessage {
            turn: TurnId::FIRST,
            text: "hi".into(),
        });
        let bytes = body.encode();
        assert_eq!(
            String::from_utf8(bytes.clone()).unwrap(),
            r#"{"text":"hi","turn":"turn_1"}"#
        );
        let back = EntryBody::decode(
            EntryKind::AssistantMessage,
            std::str::from_utf8(&bytes).unwrap(),
        )
        .unwrap();
        assert_eq!(back, body);
        let err = EntryBody::decode(
            EntryKind::TurnComplete,
            std::str::from_utf8(&bytes).unwrap(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("turn_complete"), "{err}");
    }

    #[test]
    fn an_input_entry_must_hold_an_event_of_its_kind() {
        let event = Event::new(
            Address {
                tenant: "acme".parse().unwrap(),
                app: "app".parse().unwrap(),
                agent: "agent".parse().unwrap(),
                conversation: ConversationId::new(),
                identity: "github:octocat".parse().unwrap(),
            },
            EventBody::Steer {
                text: "left".into(),
            },
            1,
        );
        let body = EntryBody::input(event, Some(7));
        assert_eq!(body.kind(), EntryKind::Steer);
        let payload = String::from_utf8(body.encode()).unwrap();
        assert!(EntryBody::decode(EntryKind::Steer, &payload).is_ok());
        let err = EntryBody::decode(EntryKind::UserMessage, &payload).unwrap_err();
        assert!(err.to_string().contains("holds a steer event"), "{err}");
    }
}
