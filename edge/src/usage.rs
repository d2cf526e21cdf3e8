//! What model calls used: a conversation's, rolled up from its record's `usage` entries (the
//! authority), and a tenant's per UTC day from the usage ledger (admins).

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use turnpike_router::usage::{Day, UsageScope, UsageTotals};
use turnpike_schemas::entry::UsageEntry;
use turnpike_schemas::EntryBody;
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{Caller, Params};
use crate::state::Edge;

/// The most days one tenant usage request covers.
pub const MAX_DAYS: u32 = 92;

/// Counts of what model calls used.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageView {
    pub turns: u64,
    pub calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Input tokens served from the provider's cache (part of `input_tokens`).
    pub cached_tokens: u64,
    /// Output tokens spent reasoning (part of `output_tokens`).
    pub reasoning_tokens: u64,
    /// In millionths of a US dollar (calls of models the price table lacks add nothing).
    pub cost_micro_usd: u64,
}

impl From<UsageTotals> for UsageView {
    fn from(t: UsageTotals) -> Self {
        UsageView {
            turns: t.turns,
            calls: t.calls,
            input_tokens: t.input_tokens,
            output_tokens: t.output_tokens,
            cached_tokens: t.cached_tokens,
            reasoning_tokens: t.reasoning_tokens,
            cost_micro_usd: t.cost_micro_usd,
        }
    }
}

/// One model's share of a conversation's usage.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ModelUsageView {
    pub provider: String,
    pub model: String,
    #[serde(flatten)]
    pub usage: UsageView,
    /// Calls whose counts are the runtime's estimate (the provider reported none).
    pub estimated_calls: u64,
}

/// A conversation's usage, from its record.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ConversationUsage {
    pub conversation: String,
    pub total: UsageView,
    pub by_model: Vec<ModelUsageView>,
    /// Calls whose counts are estimates.
    pub estimated_calls: u64,
    /// The input tokens of the last call: how full the context was (a token meter's reading).
    pub last_input_tokens: Option<u64>,
    /// The price table versions the costs came from.
    pub prices: Vec<String>,
}

/// Which usage an admin asks for.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// One app (default: every app of the tenant).
    #[param(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$")]
    pub app: Option<String>,
    /// The first UTC day, `YYYY-MM-DD` (default: today; the range holds at most 92 days).
    #[param(pattern = "^[0-9]{4}-[0-9]{2}-[0-9]{2}$")]
    pub since: Option<String>,
    /// The last UTC day, `YYYY-MM-DD` (default: today).
    #[param(pattern = "^[0-9]{4}-[0-9]{2}-[0-9]{2}$")]
    pub until: Option<String>,
}

/// One UTC day of a tenant's usage.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DayUsage {
    pub day: String,
    #[serde(flatten)]
    pub usage: UsageView,
}

/// A tenant's usage per day.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TenantUsage {
    pub tenant: String,
    pub app: Option<String>,
    pub since: String,
    pub until: String,
    pub total: UsageView,
    /// Every day of the range, oldest first (days with nothing are zeros).
    pub days: Vec<DayUsage>,
}

/// What a conversation's model calls used, rolled up from its record (anyone who may read the
/// conversation).
#[utoipa::path(get, path = "/v1/conversations/{id}/usage", tag = "usage",
    params(("id" = String, Path, description = "conv_<ulid>")),
    responses((status = 200, body = ConversationUsage), (status = 404, body = ErrorBody)))]
pub async fn conversation(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<ConversationUsage>> {
    let entry = edge.visible(&caller, &id).await?;
    let entries = edge.record(&entry).entries().await?;
    let calls: Vec<&UsageEntry> = entries
        .iter()
        .filter_map(|e| match &e.body {
            EntryBody::Usage(u) => Some(u),
            _ => None,
        })
        .collect();
    let mut by_model: BTreeMap<(&str, &str), Vec<&UsageEntry>> = BTreeMap::new();
    for u in &calls {
        by_model
            .entry((u.provider.as_str(), u.model.as_str()))
            .or_default()
            .push(u);
    }
    let estimated = |us: &[&UsageEntry]| us.iter().filter(|u| u.estimated).count() as u64;
    let mut prices: Vec<String> = calls
        .iter()
        .filter_map(|u| u.cost.as_ref().map(|c| c.prices.clone()))
        .collect();
    prices.sort();
    prices.dedup();
    Ok(Json(ConversationUsage {
        conversation: id,
        total: turnpike_router::usage::UsageTotals::of_entries(calls.iter().copied()).into(),
        by_model: by_model
            .into_iter()
            .map(|((provider, model), us)| ModelUsageView {
                provider: provider.to_owned(),
                model: model.to_owned(),
                estimated_calls: estimated(&us),
                usage: turnpike_router::usage::UsageTotals::of_entries(us.iter().copied()).into(),
            })
            .collect(),
        estimated_calls: estimated(&calls),
        last_input_tokens: calls.last().map(|u| u.input_tokens),
        prices,
    }))
}

/// The caller's tenant's usage per UTC day, from the usage ledger (admins).
#[utoipa::path(get, path = "/v1/usage", tag = "usage", params(UsageQuery),
    responses((status = 200, body = TenantUsage), (status = 403, body = ErrorBody),
              (status = 422, body = ErrorBody)))]
pub async fn tenant(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Params(query): Params<UsageQuery>,
) -> ApiResult<Json<TenantUsage>> {
    crate::services::admin_only(
        &caller,
        "usage across conversations needs an admin identity",
    )?;
    let app: Option<turnpike_schemas::AppId> = crate::services::parse_id("app", query.app)?;
    let day = |name: &str, value: &Option<String>| -> ApiResult<Day> {
        match value {
            Some(v) => v
                .parse::<Day>()
                .map_err(|e| ApiError::invalid(format!("{name}: {e}"))),
            None => Ok(Day::today()),
        }
    };
    let (since, until) = (day("since", &query.since)?, day("until", &query.until)?);
    if since > until {
        return Err(ApiError::invalid(format!(
            "since ({since}) is after until ({until})"
        )));
    }
    if until.0 - since.0 >= MAX_DAYS {
        return Err(ApiError::invalid(format!(
            "at most {MAX_DAYS} days at once ({since} to {until} is {})",
            until.0 - since.0 + 1
        )));
    }
    let scope = match &app {
        Some(a) => UsageScope::App(caller.tenant.clone(), a.clone()),
        None => UsageScope::Tenant(caller.tenant.clone()),
    };
    let mut days = Vec::new();
    let mut total = UsageTotals::default();
    let mut d = since;
    while d <= until {
        let used = edge.inner.bus.usage(&scope, d).await?;
        total = total.plus(used);
        days.push(DayUsage {
            day: d.to_string(),
            usage: used.into(),
        });
        d = d.next();
    }
    Ok(Json(TenantUsage {
        tenant: caller.tenant.to_string(),
        app: app.map(|a| a.to_string()),
        since: since.to_string(),
        until: until.to_string(),
        total: total.into(),
        days,
    }))
}
