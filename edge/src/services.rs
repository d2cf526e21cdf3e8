//! Search (the hybrid index, hits hydrated as the caller), and the admin endpoints: verify (the
//! record) and replay (the agent loop's replay of the recorded turns).

use axum::extract::{Path, State};
use axum::Json;
use turnpike_artifactory::DirectoryEntry;
use turnpike_schemas::ConversationId;

use super::error::{ApiError, ApiResult, ErrorBody};
use super::model::{ReplayTurn, ReplayView, SearchHitView, SearchQuery, SearchResults, VerifyView};
use crate::auth::Principal;
use crate::extract::{conversation_id, Caller, Params};
use crate::state::Edge;
use turnpike_index::{Filters, Kind, Scope, SearchRequest};

/// Searches every conversation the caller owns, by meaning and by words.
#[utoipa::path(get, path = "/v1/search", tag = "search",
    params(SearchQuery),
    responses((status = 200, body = SearchResults), (status = 422, body = ErrorBody),
              (status = 503, body = ErrorBody)))]
pub async fn search(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Params(query): Params<SearchQuery>,
) -> ApiResult<Json<SearchResults>> {
    check_search(&query)?;
    let index = edge
        .inner
        .search
        .as_ref()
        .ok_or_else(|| ApiError::unavailable("search is off on this deployment (no index)"))?;
    let mut request = SearchRequest::new(query.q);
    if let Some(mode) = &query.mode {
        request.mode = mode
            .parse()
            .map_err(|e: turnpike_index::Error| ApiError::invalid(format!("mode: {e}")))?;
    }
    request.filters = Filters {
        app: parse_id("app", query.app)?,
        agent: parse_id("agent", query.agent)?,
        conversation: parse_id("conversation", query.conversation)?,
        kinds: match &query.kinds {
            Some(list) => list
                .split(',')
                .map(|k| k.parse::<Kind>())
                .collect::<Result<_, _>>()
                .map_err(|e| ApiError::invalid(format!("kinds: {e}")))?,
            None => Vec::new(),
        },
        since_ms: None,
        until_ms: None,
    };
    request.limit = query.limit.unwrap_or(10) as usize;
    request.offset = query.offset.unwrap_or(0) as usize;
    request.validate().map_err(index_error)?;
    let scope = Scope::new(caller.tenant.clone(), caller.identity.clone());
    let page = turnpike_index::hydrate::search(
        index,
        &edge.inner.resolver.in_tenant(&caller.tenant),
        &caller.identity,
        &scope,
        &request,
    )
    .await
    .map_err(index_error)?;
    Ok(Json(SearchResults {
        hits: page
            .hits
            .into_iter()
            .map(|h| SearchHitView {
                conversation: h.info.conversation.to_string(),
                turn: h.info.turn.to_string(),
                kind: h.info.kind.as_str().to_owned(),
                reference: h.info.reference,
                app: h.info.app.to_string(),
                agent: h.info.agent.to_string(),
                at_ms: h.info.at_ms,
                score: h.score,
                snippet: h.snippet.unwrap_or_default(),
            })
            .collect(),
        next_offset: page.next_offset.map(|o| o as u32),
    }))
}

/// `403` for anyone but an admin, saying `why`.
pub(crate) fn admin_only(caller: &Principal, why: &str) -> ApiResult<()> {
    if caller.admin {
        return Ok(());
    }
    Err(ApiError::new(crate::error::ErrorCode::Forbidden, why))
}

/// A filter's id, parsed (`422` naming the parameter when it is not one).
pub(crate) fn parse_id<T: std::str::FromStr>(
    name: &str,
    value: Option<String>,
) -> ApiResult<Option<T>> {
    value
        .map(|v| {
            v.parse()
                .map_err(|_| ApiError::invalid(format!("{name}: {v:?} is not an id")))
        })
        .transpose()
}

fn index_error(e: turnpike_index::Error) -> ApiError {
    match e.kind() {
        turnpike_index::ErrorKind::Invalid => ApiError::invalid(e.to_string()),
        _ => ApiError::unavailable(e.to_string()),
    }
}

/// The longest query, in characters.
const MAX_QUERY_CHARS: usize = 1024;
/// The furthest a search pages.
const MAX_OFFSET: u32 = 10_000;

/// Refuses what the OpenAPI document says a search may not be, before any index is asked.
fn check_search(query: &SearchQuery) -> ApiResult<()> {
    let invalid = |what: String| Err(ApiError::invalid(what));
    if query.q.chars().any(char::is_control) {
        return invalid("q: control characters are not searched for".into());
    }
    if super::model::blank(&query.q) {
        return invalid("q: the query is empty".into());
    }
    if query.q.chars().count() > MAX_QUERY_CHARS {
        return invalid(format!("q: longer than {MAX_QUERY_CHARS} characters"));
    }
    if let Some(mode) = &query.mode {
        if !["hybrid", "lexical", "vector"].contains(&mode.as_str()) {
            return invalid(format!(
                "mode: unknown mode {mode:?} (hybrid, lexical, vector)"
            ));
        }
    }
    if let Some(kinds) = &query.kinds {
        const KINDS: [&str; 5] = ["prompt", "completion", "summary", "attachment", "file"];
        if let Some(bad) = kinds.split(',').find(|k| !KINDS.contains(k)) {
            return invalid(format!(
                "kinds: {bad:?} is not a kind ({})",
                KINDS.join(", ")
            ));
        }
    }
    if let Some(limit) = query.limit {
        if !(1..=100).contains(&limit) {
            return invalid(format!("limit must be 1–100, not {limit}"));
        }
    }
    if query.offset.is_some_and(|o| o > MAX_OFFSET) {
        return invalid(format!("offset must be at most {MAX_OFFSET}"));
    }
    Ok(())
}

impl Edge {
    /// Any conversation of the admin's own tenant, for an admin (another tenant's is `404`, as
    /// for a missing one); `403` for anyone else.
    pub(crate) async fn administered(
        &self,
        caller: &Principal,
        id: &str,
    ) -> ApiResult<DirectoryEntry> {
        admin_only(caller, "admin endpoints need an admin identity")?;
        let conversation: ConversationId = conversation_id(id)?;
        Ok(self
            .inner
            .conversations
            .directory()
            .lookup_in_tenant(conversation, &caller.tenant)
            .await?)
    }
}

/// The tenant's conversations with their phases and conditions (admins): what needs an
/// operator shows as Degraded, with the reason.
#[utoipa::path(get, path = "/v1/admin/conversations", tag = "admin", params(crate::model::PhaseQuery),
    responses((status = 200, body = crate::model::PhaseList), (status = 403, body = ErrorBody),
              (status = 422, body = ErrorBody)))]
pub async fn phases(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    crate::extract::Params(query): crate::extract::Params<crate::model::PhaseQuery>,
) -> ApiResult<Json<crate::model::PhaseList>> {
    admin_only(&caller, "admin endpoints need an admin identity")?;
    let app: Option<turnpike_schemas::AppId> = parse_id("app", query.app)?;
    if let Some(s) = &query.status {
        if !turnpike_lifecycle::phases::PHASES.contains(&s.as_str()) {
            return Err(ApiError::invalid(format!(
                "status: {s:?} is not idle, running, waiting, idle_closed or closed"
            )));
        }
    }
    let phases = turnpike_lifecycle::phases::list(
        &edge.inner.conversations,
        &caller.tenant,
        app.as_ref(),
        query.status.as_deref(),
        edge.inner.search.as_ref(),
    )
    .await?;
    let mut out = Vec::new();
    for p in phases {
        out.push(crate::model::PhaseView {
            conversation: p.conversation,
            app: p.app,
            agent: p.agent,
            phase: p.phase.to_owned(),
            ready: p.ready,
            conditions: p
                .conditions
                .into_iter()
                .map(|c| crate::model::ConditionView {
                    kind: c.kind.to_owned(),
                    status: c.status,
                    reason: c.reason,
                })
                .collect(),
            created_ms: p.created_ms,
            turns: p.turns,
        });
    }
    Ok(Json(crate::model::PhaseList { conversations: out }))
}

/// Verifies a conversation's record: every entry, every signature, against the trusted keys.
#[utoipa::path(post, path = "/v1/admin/conversations/{id}/verify", tag = "admin",
    params(("id" = String, Path, description = "conv_<ulid>")),
    responses((status = 200, body = VerifyView), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody)))]
pub async fn verify(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<VerifyView>> {
    let entry = edge.administered(&caller, &id).await?;
    let verdict = edge
        .record(&entry)
        .verify(&edge.inner.trusted, None)
        .await?;
    Ok(Json(match verdict {
        Ok(report) => VerifyView {
            conversation: id,
            intact: true,
            entries_checked: report.entries_checked,
            batches_checked: report.batches_checked,
            root: Some(report.checkpoint.root.to_string()),
            failure: None,
        },
        Err(failure) => VerifyView {
            conversation: id,
            intact: false,
            entries_checked: failure.position,
            batches_checked: failure.batch,
            root: None,
            failure: Some(failure.to_string()),
        },
    }))
}

/// Replays a conversation from its recorded outputs (no model or tool is called) and says
/// where each turn matches or diverges.
#[utoipa::path(post, path = "/v1/admin/conversations/{id}/replay", tag = "admin",
    params(("id" = String, Path, description = "conv_<ulid>")),
    responses((status = 200, body = ReplayView), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn replay(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<ReplayView>> {
    let entry = edge.administered(&caller, &id).await?;
    let logs = edge.inner.conversations.recorded_logs(&entry).await?;
    let replays = edge.inner.replayer.replay(&logs).await;
    let turns: Vec<ReplayTurn> = replays
        .into_iter()
        .map(|r| ReplayTurn {
            turn: r.turn.to_string(),
            reproduced: r.divergence.is_none(),
            divergence: r.divergence,
        })
        .collect();
    Ok(Json(ReplayView {
        conversation: entry.conversation.to_string(),
        reproduced: turns.iter().all(|t| t.reproduced),
        turns,
    }))
}
