//! What the index remembers of the caller — their memory across conversations — and forgetting
//! it. Forgetting leaves the record as it is (it is the evidence); a durable marker under the
//! conversation is written first, so neither the indexer nor a rebuild brings a forgotten row
//! back. Only the owner of a conversation lists or forgets what is remembered of it: the rows
//! are in the owner's scope.

use axum::extract::{Path, State};
use axum::Json;
use turnpike_index::{Filters, RowId, Scope};
use turnpike_schemas::{ConversationId, Reference};

use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{Caller, Params};
use crate::model::{ForgetQuery, ForgottenView, MemoryList, MemoryQuery, MemoryRowView};
use crate::state::Edge;

const DEFAULT_LIMIT: u32 = 100;
const MAX_LIMIT: u32 = 500;
const MAX_OFFSET: u32 = 100_000;

fn index(edge: &Edge) -> ApiResult<&turnpike_index::Index> {
    edge.inner
        .search
        .as_ref()
        .ok_or_else(|| ApiError::unavailable("search is off on this deployment (no index)"))
}

fn conversation(name: &str, text: &str) -> ApiResult<ConversationId> {
    text.parse()
        .map_err(|_| ApiError::invalid(format!("{name}: {text:?} is not a conversation id")))
}

/// Lists what the index remembers of the caller, newest first.
#[utoipa::path(get, path = "/v1/memory", tag = "services", params(MemoryQuery),
    responses((status = 200, body = MemoryList), (status = 422, body = ErrorBody),
              (status = 503, body = ErrorBody)))]
pub async fn list(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Params(query): Params<MemoryQuery>,
) -> ApiResult<Json<MemoryList>> {
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    let offset = query.offset.unwrap_or(0);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::invalid(format!("limit: must be 1–{MAX_LIMIT}")));
    }
    if offset > MAX_OFFSET {
        return Err(ApiError::invalid(format!("offset: must be 0–{MAX_OFFSET}")));
    }
    let filters = Filters {
        conversation: query
            .conversation
            .as_deref()
            .map(|c| conversation("conversation", c))
            .transpose()?,
        ..Default::default()
    };
    let index = index(&edge)?;
    let scope = Scope::new(caller.tenant.clone(), caller.identity.clone());
    // One more than asked: whether there is a next page.
    let mut rows = index
        .backend()
        .list(&scope, &filters, offset as usize, limit as usize + 1)
        .await
        .map_err(|e| ApiError::unavailable(e.to_string()))?;
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    Ok(Json(MemoryList {
        rows: rows
            .into_iter()
            .map(|r| MemoryRowView {
                id: r.id.to_string(),
                conversation: r.conversation.to_string(),
                turn: r.turn.to_string(),
                kind: r.kind.as_str().to_owned(),
                reference: r.reference,
                app: r.app.to_string(),
                agent: r.agent.to_string(),
                at_ms: r.at_ms,
            })
            .collect(),
        next_offset: more.then_some(offset + limit),
    }))
}

/// Forgets one remembered row of the caller's (its id percent-encoded). The record keeps it.
#[utoipa::path(delete, path = "/v1/memory/{row}", tag = "services",
    params(("row" = String, Path, description = "a row id from GET /v1/memory")),
    responses((status = 200, body = ForgottenView), (status = 404, body = ErrorBody),
              (status = 503, body = ErrorBody)))]
pub async fn forget_row(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(row): Path<String>,
) -> ApiResult<Json<ForgottenView>> {
    let not_found = || ApiError::not_found(format!("no remembered row {row:?}"));
    // Row ids are references to what the row came from: its conversation is in it.
    let reference: Reference = row.parse().map_err(|_| not_found())?;
    // The canonical spelling is the row's id (a reference may be written more than one way).
    let row = reference.to_string();
    let entry = edge
        .inner
        .conversations
        .directory()
        .lookup_owned(reference.conversation(), &caller.tenant, &caller.identity)
        .await
        .map_err(|_| not_found())?;
    let index = index(&edge)?;
    edge.inner
        .conversations
        .forgotten()
        .forget_row(&entry.prefix(), &row)
        .await?;
    let scope = Scope::new(caller.tenant.clone(), caller.identity.clone());
    let forgotten = index
        .backend()
        .delete(
            &scope,
            &Filters::default(),
            Some(&[RowId::new(row.clone())]),
        )
        .await
        .map_err(|e| ApiError::unavailable(e.to_string()))?;
    Ok(Json(ForgottenView { forgotten }))
}

/// Forgets everything remembered of one of the caller's conversations so far (its later turns
/// are remembered again). The record keeps it.
#[utoipa::path(delete, path = "/v1/memory", tag = "services", params(ForgetQuery),
    responses((status = 200, body = ForgottenView), (status = 404, body = ErrorBody),
              (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn forget_conversation(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Params(query): Params<ForgetQuery>,
) -> ApiResult<Json<ForgottenView>> {
    let id = conversation("conversation", &query.conversation)?;
    let entry = edge
        .inner
        .conversations
        .directory()
        .lookup_owned(id, &caller.tenant, &caller.identity)
        .await?;
    let index = index(&edge)?;
    let head = edge
        .inner
        .conversations
        .record(entry.prefix())
        .head()
        .await?;
    let state = head.state();
    // Every turn so far, the one running too: its rows are written when it completes.
    if let Some(through) = turnpike_schemas::TurnId::new(state.last_turn) {
        edge.inner
            .conversations
            .forgotten()
            .forget_through(&entry.prefix(), through)
            .await?;
    }
    let scope = Scope::new(caller.tenant.clone(), caller.identity.clone());
    let filters = Filters {
        conversation: Some(id),
        ..Default::default()
    };
    let forgotten = index
        .backend()
        .delete(&scope, &filters, None)
        .await
        .map_err(|e| ApiError::unavailable(e.to_string()))?;
    Ok(Json(ForgottenView { forgotten }))
}
