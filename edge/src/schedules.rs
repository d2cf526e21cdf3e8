//! The caller's schedules: messages fired into a conversation (a new one per firing, or one
//! of theirs) by a cron expression or an interval, with nobody typing.
//!
//! Contract: a schedule belongs to the identity that made it and fires as that identity (its
//! firings are that identity's messages, checked by ingress like theirs); nobody else lists,
//! reads, pauses or deletes it — another identity's schedule is `404` like one that does not
//! exist. Workers fire them (each firing once across the fleet); this module only writes the
//! definitions and reads the firings back.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use turnpike_artifactory::schedules::MAX_PER_OWNER;
use turnpike_artifactory::schedules::{Firing, Missed, Outcome, Overlap, Schedule, Target, Timing};
use turnpike_artifactory::Schedules;
use turnpike_router::bus::now_ms;
use turnpike_schemas::{AgentId, AppId, ConversationId, ScheduleId};
use utoipa::ToSchema;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{Body, Caller};
use crate::state::Edge;

/// How many of a schedule's latest firings a view shows.
const SHOWN_FIRINGS: usize = 10;

/// The default grace: a firing later than this (the fleet was down) is missed.
const DEFAULT_GRACE_SECONDS: u64 = 60;

/// What to do with firings missed while nothing could fire them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MissedPolicy {
    /// Fire none of them.
    Skip,
    /// Fire the latest of them only (the default).
    Latest,
    /// Fire each, oldest first, up to `catch_up` of them.
    All,
}

/// What to do when a firing comes due while the previous firing's turn still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OverlapPolicy {
    /// Do not fire.
    Skip,
    /// Fire anyway (the default): in the same conversation the message waits its turn.
    Queue,
    /// Stop the running turn, then fire.
    Cancel,
}

/// A new schedule. Exactly one of `cron` and `every_seconds`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleInput {
    /// The app and agent of the conversations it starts (with `conversation`, those of that
    /// conversation, and these may be left out).
    #[serde(default)]
    pub app: Option<String>,
    #[serde(default)]
    pub agent: Option<String>,
    /// A cron expression: 5 fields, or 6 with seconds first; `@hourly`, `@daily`, …
    #[serde(default)]
    pub cron: Option<String>,
    /// The IANA time zone the cron expression is read in (default `UTC`).
    #[serde(default)]
    pub zone: Option<String>,
    /// Fire every this many seconds (≥ 1), the first one interval after creation.
    #[serde(default)]
    pub every_seconds: Option<u64>,
    /// `new` (default): a new conversation per firing; or a conversation id of the caller's,
    /// which every firing goes into.
    #[serde(default)]
    pub conversation: Option<String>,
    /// The message each firing sends.
    pub text: String,
    #[serde(default)]
    pub missed: Option<MissedPolicy>,
    /// With `missed = all`: the most missed firings fired (1–1000, default 10).
    #[serde(default)]
    pub catch_up: Option<u32>,
    #[serde(default)]
    pub overlap: Option<OverlapPolicy>,
    /// Put each firing off by up to this many seconds (default 0).
    #[serde(default)]
    pub jitter_seconds: Option<u64>,
    /// A firing later than this many seconds is missed (default 60).
    #[serde(default)]
    pub grace_seconds: Option<u64>,
    /// Created paused (default false).
    #[serde(default)]
    pub paused: Option<bool>,
}

/// One firing of a schedule.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FiringView {
    /// When it was due (ms since the epoch, before jitter).
    pub fire_ms: u64,
    /// When it was decided.
    pub claimed_ms: u64,
    /// `fired`, `skipped` (the previous turn still ran) or `missed` (the fleet was down).
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Missed firings this one stands for.
    #[serde(skip_serializing_if = "is_zero")]
    pub missed: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A schedule as the API shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ScheduleView {
    pub id: String,
    pub app: String,
    pub agent: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub every_seconds: Option<f64>,
    /// `new`, or the conversation every firing goes into.
    pub conversation: String,
    pub text: String,
    pub missed: MissedPolicy,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub catch_up: Option<u32>,
    pub overlap: OverlapPolicy,
    pub jitter_seconds: f64,
    pub grace_seconds: f64,
    pub paused: bool,
    pub created_ms: u64,
    /// The next firing (ms since the epoch, jitter included); none while paused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_ms: Option<u64>,
    /// The latest firings, newest first.
    pub firings: Vec<FiringView>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ScheduleList {
    pub schedules: Vec<ScheduleView>,
}

fn store(edge: &Edge) -> Schedules {
    Schedules::new(edge.inner.conversations.store().clone())
}

fn schedule_id(text: &str) -> ApiResult<ScheduleId> {
    text.parse()
        .map_err(|_| ApiError::not_found(format!("schedule {text:?} not found")))
}

/// Creates a schedule owned by the caller.
#[utoipa::path(operation_id = "create_schedule", post, path = "/v1/schedules", tag = "schedules",
    request_body = ScheduleInput,
    responses((status = 201, body = ScheduleView), (status = 404, body = ErrorBody),
              (status = 422, body = ErrorBody)))]
pub async fn create(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Body(input): Body<ScheduleInput>,
) -> ApiResult<(StatusCode, Json<ScheduleView>)> {
    let schedule = edge.new_schedule(&caller, input).await?;
    let store = store(&edge);
    let owned = store.owned(&caller.tenant, &caller.identity).await?.len();
    if owned >= MAX_PER_OWNER {
        return Err(ApiError::conflict(format!(
            "you have {owned} schedules, the most one identity may have ({MAX_PER_OWNER}): delete some first"
        )));
    }
    store.put(&schedule).await?;
    Ok((StatusCode::CREATED, Json(view(&schedule, &[]))))
}

/// The caller's schedules, oldest first, each with its next firing and latest firings.
#[utoipa::path(operation_id = "list_schedules", get, path = "/v1/schedules", tag = "schedules",
    responses((status = 200, body = ScheduleList)))]
pub async fn list(
    State(edge): State<Edge>,
    Caller(caller): Caller,
) -> ApiResult<Json<ScheduleList>> {
    let store = store(&edge);
    let mut schedules = Vec::new();
    for id in store.owned(&caller.tenant, &caller.identity).await? {
        match store.get_owned(id, &caller.tenant, &caller.identity).await {
            Ok(s) => {
                let firings = store.recent(id, SHOWN_FIRINGS).await?;
                schedules.push(view(&s, &firings));
            }
            Err(e) if e.kind() == turnpike_artifactory::ErrorKind::NotFound => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Json(ScheduleList { schedules }))
}

/// One schedule of the caller's, with its next firing and latest firings.
#[utoipa::path(operation_id = "get_schedule", get, path = "/v1/schedules/{id}", tag = "schedules",
    params(("id" = String, Path, description = "sched_<ulid>")),
    responses((status = 200, body = ScheduleView), (status = 404, body = ErrorBody)))]
pub async fn get_one(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<ScheduleView>> {
    let store = store(&edge);
    let id = schedule_id(&id)?;
    let s = store
        .get_owned(id, &caller.tenant, &caller.identity)
        .await?;
    let firings = store.recent(id, SHOWN_FIRINGS).await?;
    Ok(Json(view(&s, &firings)))
}

/// Pauses a schedule: nothing fires until it is resumed (firings due meanwhile are then
/// missed, and follow its missed policy).
#[utoipa::path(operation_id = "pause_schedule", post, path = "/v1/schedules/{id}/pause", tag = "schedules",
    params(("id" = String, Path, description = "sched_<ulid>")),
    responses((status = 200, body = ScheduleView), (status = 404, body = ErrorBody)))]
pub async fn pause(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<ScheduleView>> {
    set_paused(&edge, &caller, &id, true).await
}

/// Resumes a paused schedule.
#[utoipa::path(operation_id = "resume_schedule", post, path = "/v1/schedules/{id}/resume", tag = "schedules",
    params(("id" = String, Path, description = "sched_<ulid>")),
    responses((status = 200, body = ScheduleView), (status = 404, body = ErrorBody)))]
pub async fn resume(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<ScheduleView>> {
    set_paused(&edge, &caller, &id, false).await
}

async fn set_paused(
    edge: &Edge,
    caller: &Principal,
    id: &str,
    paused: bool,
) -> ApiResult<Json<ScheduleView>> {
    let store = store(edge);
    let id = schedule_id(id)?;
    let mut s = store
        .get_owned(id, &caller.tenant, &caller.identity)
        .await?;
    s.paused = paused;
    s.updated_ms = now_ms();
    store.put(&s).await?;
    let firings = store.recent(id, SHOWN_FIRINGS).await?;
    Ok(Json(view(&s, &firings)))
}

/// Deletes a schedule and its history (a firing already decided still goes out).
#[utoipa::path(operation_id = "delete_schedule", delete, path = "/v1/schedules/{id}", tag = "schedules",
    params(("id" = String, Path, description = "sched_<ulid>")),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub async fn delete(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let store = store(&edge);
    let id = schedule_id(&id)?;
    let s = store
        .get_owned(id, &caller.tenant, &caller.identity)
        .await?;
    store.delete(&s).await?;
    Ok(StatusCode::NO_CONTENT)
}

impl Edge {
    /// The directory entry of conversation `text` when the caller owns it; `404` otherwise
    /// (one shared with them, another's, or none at all, alike).
    pub(crate) async fn owned_conversation(
        &self,
        caller: &Principal,
        text: &str,
    ) -> ApiResult<turnpike_artifactory::DirectoryEntry> {
        let not_found = || ApiError::not_found(format!("conversation {text:?} not found"));
        let conversation: ConversationId = text.parse().map_err(|_| not_found())?;
        let entry = self
            .inner
            .conversations
            .directory()
            .lookup(conversation, &caller.tenant, &caller.identity)
            .await?;
        if entry.owner != caller.identity {
            return Err(not_found());
        }
        Ok(entry)
    }

    /// A schedule from the caller's input: its agent hosted here, its conversation theirs.
    async fn new_schedule(&self, caller: &Principal, input: ScheduleInput) -> ApiResult<Schedule> {
        let timing = match (&input.cron, input.every_seconds) {
            (Some(cron), None) => Timing::Cron {
                cron: cron.clone(),
                zone: input.zone.clone().unwrap_or_else(|| "UTC".into()),
            },
            (None, Some(seconds)) => {
                if input.zone.is_some() {
                    return Err(ApiError::invalid("zone goes with cron, not every_seconds"));
                }
                Timing::Every {
                    every_ms: seconds.saturating_mul(1_000),
                }
            }
            _ => {
                return Err(ApiError::invalid(
                    "a schedule has exactly one of cron and every_seconds",
                ))
            }
        };
        let (target, app, agent) = match input.conversation.as_deref() {
            None | Some("new") => {
                let (Some(app), Some(agent)) = (&input.app, &input.agent) else {
                    return Err(ApiError::invalid(
                        "a schedule that starts new conversations names their app and agent",
                    ));
                };
                let app: AppId = app
                    .parse()
                    .map_err(|e| ApiError::invalid(format!("app: {e}")))?;
                let agent: AgentId = agent
                    .parse()
                    .map_err(|e| ApiError::invalid(format!("agent: {e}")))?;
                self.check_agent(&caller.tenant, &app, &agent)?;
                (Target::New, app, agent)
            }
            Some(text) => {
                // Only the owner's: a schedule fires as its maker, into what they own.
                let entry = self.owned_conversation(caller, text).await?;
                let conversation = entry.conversation;
                let mismatch = |what: &str, given: &Option<String>, is: &str| {
                    given.as_deref().is_some_and(|g| g != is).then(|| {
                        ApiError::invalid(format!(
                            "{what} {:?} is not the conversation's ({is})",
                            given.as_deref().unwrap_or_default()
                        ))
                    })
                };
                if let Some(e) = mismatch("app", &input.app, entry.app.as_str())
                    .or_else(|| mismatch("agent", &input.agent, entry.agent.as_str()))
                {
                    return Err(e);
                }
                (Target::Same { conversation }, entry.app, entry.agent)
            }
        };
        let missed = match input.missed.unwrap_or(MissedPolicy::Latest) {
            MissedPolicy::Skip => Missed::Skip,
            MissedPolicy::Latest => Missed::Latest,
            MissedPolicy::All => Missed::All {
                cap: input.catch_up.unwrap_or(10),
            },
        };
        if input.catch_up.is_some() && !matches!(missed, Missed::All { .. }) {
            return Err(ApiError::invalid("catch_up goes with missed = all"));
        }
        let overlap = match input.overlap.unwrap_or(OverlapPolicy::Queue) {
            OverlapPolicy::Skip => Overlap::Skip,
            OverlapPolicy::Queue => Overlap::Queue,
            OverlapPolicy::Cancel => Overlap::Cancel,
        };
        let seconds = |name: &str, value: Option<u64>, default: u64| -> ApiResult<u64> {
            let value = value.unwrap_or(default);
            if value > 7 * 24 * 3600 {
                return Err(ApiError::invalid(format!(
                    "{name} is at most a week (604800), not {value}"
                )));
            }
            Ok(value * 1_000)
        };
        let now = now_ms();
        let schedule = Schedule {
            id: ScheduleId::new(),
            tenant: caller.tenant.clone(),
            owner: caller.identity.clone(),
            app,
            agent,
            timing,
            target,
            text: input.text,
            missed,
            overlap,
            jitter_ms: seconds("jitter_seconds", input.jitter_seconds, 0)?,
            grace_ms: seconds("grace_seconds", input.grace_seconds, DEFAULT_GRACE_SECONDS)?,
            paused: input.paused.unwrap_or(false),
            created_ms: now,
            updated_ms: now,
        };
        schedule.validate()?;
        Ok(schedule)
    }
}

/// A schedule as the API shows it, with its latest firings (newest first).
fn view(s: &Schedule, firings: &[Firing]) -> ScheduleView {
    let (cron, zone, every_seconds) = match &s.timing {
        Timing::Cron { cron, zone } => (Some(cron.clone()), Some(zone.clone()), None),
        Timing::Every { every_ms } => (None, None, Some(*every_ms as f64 / 1000.0)),
    };
    let cursor = firings.first().map_or(0, |f| f.fire_ms).max(s.created_ms);
    let next_ms = (!s.paused)
        .then(|| s.next_after(cursor))
        .flatten()
        .map(|next| next + s.jitter_of(next));
    ScheduleView {
        id: s.id.to_string(),
        app: s.app.to_string(),
        agent: s.agent.to_string(),
        cron,
        zone,
        every_seconds,
        conversation: match s.target {
            Target::New => "new".into(),
            Target::Same { conversation } => conversation.to_string(),
        },
        text: s.text.clone(),
        missed: match s.missed {
            Missed::Skip => MissedPolicy::Skip,
            Missed::Latest => MissedPolicy::Latest,
            Missed::All { .. } => MissedPolicy::All,
        },
        catch_up: match s.missed {
            Missed::All { cap } => Some(cap),
            _ => None,
        },
        overlap: match s.overlap {
            Overlap::Skip => OverlapPolicy::Skip,
            Overlap::Queue => OverlapPolicy::Queue,
            Overlap::Cancel => OverlapPolicy::Cancel,
        },
        jitter_seconds: s.jitter_ms as f64 / 1000.0,
        grace_seconds: s.grace_ms as f64 / 1000.0,
        paused: s.paused,
        created_ms: s.created_ms,
        next_ms,
        firings: firings.iter().map(firing_view).collect(),
    }
}

fn firing_view(f: &Firing) -> FiringView {
    let mut v = FiringView {
        fire_ms: f.fire_ms,
        claimed_ms: f.claimed_ms,
        outcome: String::new(),
        conversation: None,
        event_id: None,
        reason: None,
        missed: 0,
    };
    match &f.outcome {
        Outcome::Fired {
            conversation,
            event,
            missed,
            ..
        } => {
            v.outcome = "fired".into();
            v.conversation = Some(conversation.to_string());
            v.event_id = Some(event.to_string());
            v.missed = *missed;
        }
        Outcome::Skipped { reason } => {
            v.outcome = "skipped".into();
            v.reason = Some(reason.clone());
        }
        Outcome::Missed { count } => {
            v.outcome = "missed".into();
            v.missed = *count;
        }
    }
    v
}
