//! Turnpike's pure types: ids, identities, events, record entries, references and turn logs.
//!
//! No I/O and no async here: every other crate depends on this one, so it stays light.
//!
//! # Layout
//! - [`ids`]: typed ids (`conv_<ulid>`, `turn_<n>`, slugs for tenants, apps and agents)
//! - [`identity`]: `provider:scope:external_id` identities
//! - [`event`]: the versioned, addressed event envelope
//! - [`entry`]: record entry kinds and their payloads
//! - [`mod@reference`]: the reference grammar v1
//! - [`turnlog`]: the one-object-per-turn log format
//! - [`live`]: advisory frames on `tp.live.{conv}`
//! - [`schedule`], [`hook`], [`webhook`]: sessions' schedules, inbound hooks, outbound webhooks
//! - [`timeline`]: the rows an agent is fed, each with a stable reference
//! - [`error`]: the crate's error type
//! - [`failure`]: the one error shape of the crates that do I/O (`error_type!`)
//!
//! The book: `book/src/reference/entries.md` (and `book/src/SUMMARY.md` for the rest).

mod block_de;
mod block_kinds;
pub mod entry;
pub mod error;
pub mod event;
pub mod failure;
pub mod hook;
pub mod identity;
pub mod ids;
pub mod live;
pub mod reference;
pub mod schedule;
pub mod timeline;
pub mod turnlog;
pub mod webhook;

pub use entry::{EntryBody, EntryKind};
pub use error::{SchemaError, SchemaErrorKind};
pub use event::{Address, Event, EventBody, Origin};
pub use hook::{HookConversation, HookPayload, HookSignature, HookSpec};
pub use identity::Identity;
pub use ids::{
    AgentId, AppId, ConversationId, Epoch, EventId, ProjectVersion, RequestId, ScheduleId,
    TenantId, TurnId, WorkerId,
};
pub use reference::{Family, RefPath, Reference};
pub use timeline::Row;
pub use turnlog::{Block, RecallHit, TurnLog};
