//! Schedules' data: when one fires, where, and what it does with missed and overlapping
//! firings — shared by the store (`turnpike-artifactory`), the scheduler and app manifests
//! (`[schedules.<name>]`, app-wide jobs).

use serde::{Deserialize, Serialize};

use crate::{AgentId, ConversationId, Identity, TenantId};

/// When a schedule fires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Timing {
    /// A cron expression (5 fields, or 6 with seconds first; `@hourly` and friends) read in an
    /// IANA time zone (e.g. `Europe/Berlin`; `UTC` by default).
    Cron { cron: String, zone: String },
    /// Every `every_ms` milliseconds from the schedule's creation (the first firing one
    /// interval after it).
    Every { every_ms: u64 },
}

/// Which conversation a firing goes into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Target {
    /// A new conversation for every firing.
    New,
    /// Always the same conversation.
    Same { conversation: ConversationId },
}

/// What to do with firings that came due while nothing could fire them (the fleet was down)
/// and are later than the schedule's grace by the time one can.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Missed {
    /// Fire none of them (they are recorded as missed).
    Skip,
    /// Fire the latest of them only.
    Latest,
    /// Fire each, oldest first, up to `cap` (the newest `cap`; older ones are missed).
    All { cap: u32 },
}

/// What to do when a firing comes due while the previous firing's turn still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// Do not fire (recorded as skipped).
    Skip,
    /// Fire: the event waits on its lane behind the running turn (or, for a new conversation
    /// per firing, runs beside it).
    Queue,
    /// Stop the running turn, then fire.
    Cancel,
}

/// A schedule an app's manifest declares (`[schedules.<name>]`): an app-wide job, firing as
/// `owner` (an identity of the app) into a new conversation each time, or with `same` into
/// one standing conversation of the schedule's own (made by its first firing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleSpec {
    pub name: String,
    pub agent: AgentId,
    pub tenant: TenantId,
    pub owner: Identity,
    pub timing: Timing,
    pub text: String,
    pub missed: Missed,
    pub overlap: Overlap,
    pub jitter_ms: u64,
    pub grace_ms: u64,
    /// Every firing into the schedule's one standing conversation (`conversation = "same"`).
    #[serde(default)]
    pub same: bool,
}
