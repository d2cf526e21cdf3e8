//! Search, and the admin endpoints (verify, replay). Search and replay are provided by the
//! process that mounts the edge (they need the index and the agent loop, which sit above
//! this crate); verify needs only the record.

use std::sync::Arc;

use async_trait::async_trait;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use turnpike_artifactory::DirectoryEntry;
use turnpike_schemas::ConversationId;

use super::error::{ApiError, ApiResult, ErrorBody};
use super::model::{ReplayView, SearchQuery, SearchResults, VerifyView};
use super::{conversation_id, Caller, Edge, Params, Principal};

/// Searches the caller's conversations (the hybrid index), hydrating hits as the caller.
#[async_trait]
pub trait SearchService: Send + Sync {
    async fn search(&self, caller: &Principal, query: SearchQuery) -> ApiResult<SearchResults>;
}

/// Re-runs a conversation's committed turns from their recorded outputs.
#[async_trait]
pub trait ReplayService: Send + Sync {
    async fn replay(&self, entry: &DirectoryEntry) -> ApiResult<ReplayView>;
}

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
    let service: &Arc<dyn SearchService> = edge
        .inner
        .search
        .as_ref()
        .ok_or_else(|| ApiError::unavailable("search is off on this deployment (no index)"))?;
    Ok(Json(service.search(&caller, query).await?))
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
    for (name, value) in [("app", &query.app), ("agent", &query.agent)] {
        if let Some(value) = value {
            if value.parse::<turnpike_schemas::AppId>().is_err() {
                return invalid(format!("{name}: {value:?} is not an id"));
            }
        }
    }
    if let Some(value) = &query.conversation {
        if value.parse::<ConversationId>().is_err() {
            return invalid(format!("conversation: {value:?} is not a conversation id"));
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
    async fn administered(&self, caller: &Principal, id: &str) -> ApiResult<DirectoryEntry> {
        if !caller.admin {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "admin endpoints need an admin identity",
            ));
        }
        let conversation: ConversationId = conversation_id(id)?;
        Ok(self
            .inner
            .conversations
            .directory()
            .lookup_in_tenant(conversation, &caller.tenant)
            .await?)
    }
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
    let service = edge
        .inner
        .replay
        .as_ref()
        .ok_or_else(|| ApiError::unavailable("replay is not available on this process"))?;
    Ok(Json(service.replay(&entry).await?))
}
