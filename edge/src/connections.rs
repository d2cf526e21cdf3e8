//! The caller's connections: their own credential for an MCP server of an app (a bearer token,
//! or an OAuth token they obtained), used host-side for their calls to that server only.
//!
//! Contract: a credential goes in (`PUT`) and never comes out — the API lists which servers
//! the caller connected and when, not what with. Connecting resumes the caller's turns parked
//! on a `connection_required` card for that server (each gets an approval of its card as the
//! caller, keyed so a second `PUT` posts nothing twice). Everything is the caller's own: no
//! identity lists, uses or deletes another's connections.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::Json;
use serde::{Deserialize, Serialize};
use turnpike_artifactory::connections::Scope;
use turnpike_artifactory::{Connections, Secret};
use turnpike_schemas::EventBody;
use utoipa::ToSchema;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{Body, Caller};
use crate::state::Edge;

/// A credential for one server. Its `Debug` shows nothing of it.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConnectionInput {
    /// The credential as the server takes it after `Bearer ` (1–8192 visible ASCII
    /// characters). It is sealed at rest and never shown again.
    #[schema(pattern = "^[!-~]{1,8192}$", min_length = 1, max_length = 8192)]
    pub token: String,
}

impl std::fmt::Debug for ConnectionInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnectionInput { token: (redacted) }")
    }
}

/// One connection of the caller (never its credential).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ConnectionView {
    pub app: String,
    pub server: String,
    /// When it was made (ms since the epoch).
    pub connected_ms: u64,
    /// The caller's parked turns this connection resumed (conversation ids).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resumed: Vec<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ConnectionList {
    pub connections: Vec<ConnectionView>,
}

fn store(edge: &Edge) -> ApiResult<&Connections> {
    edge.inner.conversations.connections().ok_or_else(|| {
        ApiError::unavailable(
            "this deployment keeps no connections: its operator sets TURNPIKE_CONNECTION_KEY (64 hex characters) on every process",
        )
    })
}

fn scope<'a>(caller: &'a Principal, app: &'a str, server: &'a str) -> ApiResult<Scope<'a>> {
    let part = |s: &str| {
        !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    // No app or server has another name: there is nothing of that name to connect.
    if !part(app) || !part(server) {
        return Err(ApiError::not_found(format!(
            "no connection to {app:?}/{server:?} (an app and a server are 1–64 of a-z, A-Z, 0-9, '-' and '_')"
        )));
    }
    Ok(Scope {
        tenant: &caller.tenant,
        identity: &caller.identity,
        app,
        server,
    })
}

fn failed(e: turnpike_artifactory::Error) -> ApiError {
    match e.kind() {
        turnpike_artifactory::ErrorKind::InvalidInput => ApiError::invalid(e.to_string()),
        _ => ApiError::unavailable(e.to_string()),
    }
}

/// Lists the caller's connections (which servers, since when; never a credential).
#[utoipa::path(get, path = "/v1/connections", tag = "connections",
    responses((status = 200, body = ConnectionList), (status = 503, body = ErrorBody)))]
pub async fn list(
    State(edge): State<Edge>,
    Caller(caller): Caller,
) -> ApiResult<Json<ConnectionList>> {
    let connections = store(&edge)?
        .list(&caller.tenant, &caller.identity)
        .await
        .map_err(failed)?;
    Ok(Json(ConnectionList {
        connections: connections
            .into_iter()
            .map(|c| ConnectionView {
                app: c.app,
                server: c.server,
                connected_ms: c.connected_ms,
                resumed: Vec::new(),
            })
            .collect(),
    }))
}

/// Whether the caller has connected the app's server (and since when).
#[utoipa::path(get, path = "/v1/connections/{app}/{server}", tag = "connections",
    params(("app" = String, Path, description = "the app's id"),
           ("server" = String, Path, description = "the MCP server's name in the app's manifest")),
    responses((status = 200, body = ConnectionView), (status = 404, body = ErrorBody),
              (status = 503, body = ErrorBody)))]
pub async fn get_one(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path((app, server)): Path<(String, String)>,
) -> ApiResult<Json<ConnectionView>> {
    scope(&caller, &app, &server)?;
    let found = store(&edge)?
        .list(&caller.tenant, &caller.identity)
        .await
        .map_err(failed)?
        .into_iter()
        .find(|c| c.app == app && c.server == server)
        .ok_or_else(|| ApiError::not_found(format!("no connection to {app}/{server}")))?;
    Ok(Json(ConnectionView {
        app: found.app,
        server: found.server,
        connected_ms: found.connected_ms,
        resumed: Vec::new(),
    }))
}

/// Connects the caller to the app's server with their credential (replacing any earlier
/// one), and resumes their turns parked for it.
#[utoipa::path(put, path = "/v1/connections/{app}/{server}", tag = "connections",
    params(("app" = String, Path, description = "the app's id"),
           ("server" = String, Path, description = "the MCP server's name in the app's manifest")),
    request_body = ConnectionInput,
    responses((status = 200, body = ConnectionView), (status = 404, body = ErrorBody),
              (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn put(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path((app, server)): Path<(String, String)>,
    Body(input): Body<ConnectionInput>,
) -> ApiResult<Json<ConnectionView>> {
    let scope = scope(&caller, &app, &server)?;
    // Only a server some agent of the app names as needing a connection takes one: nothing
    // is kept under a name no call would ever use.
    let takes = edge
        .inner
        .apps
        .apps()
        .iter()
        .any(|a| a.id == app && a.agents.iter().any(|g| g.connections.contains(&server)));
    if !takes {
        return Err(ApiError::not_found(format!(
            "app {app:?} has no MCP server {server:?} that takes a user's connection"
        )));
    }
    let connections = store(&edge)?;
    let secret = Secret::new(input.token).map_err(|e| ApiError::invalid(format!("token: {e}")))?;
    let made = connections.put(&scope, &secret).await.map_err(failed)?;
    drop(secret);
    let mut resumed = Vec::new();
    for waiting in connections.take_waiting(&scope).await.map_err(failed)? {
        // The card's approval, as the caller (its approver), keyed by the card: posted once.
        let mut headers = HeaderMap::new();
        let key = format!("connected-{}", waiting.request_id);
        if let Ok(v) = HeaderValue::from_str(&key) {
            headers.insert(crate::events::IDEMPOTENCY_KEY, v);
        }
        let id = waiting.conversation.to_string();
        let body = EventBody::ApprovalResponse {
            request_id: waiting.request_id,
            approve: true,
            reason: Some(format!("connected {app}/{server}")),
            tool: None,
            arguments: None,
        };
        match edge.submit(&caller, &id, &headers, body).await {
            Ok(_) => resumed.push(id),
            // Deleted, closed or no longer theirs: nothing to resume there.
            Err(e) => tracing::info!(conversation = %id, error = %e.body.message,
                "a turn waiting for a connection was not resumed"),
        }
    }
    Ok(Json(ConnectionView {
        app: made.app,
        server: made.server,
        connected_ms: made.connected_ms,
        resumed,
    }))
}

/// Disconnects the caller from the app's server: their credential is deleted.
#[utoipa::path(delete, path = "/v1/connections/{app}/{server}", tag = "connections",
    params(("app" = String, Path, description = "the app's id"),
           ("server" = String, Path, description = "the MCP server's name in the app's manifest")),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn delete(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path((app, server)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let scope = scope(&caller, &app, &server)?;
    if store(&edge)?.delete(&scope).await.map_err(failed)? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!(
            "no connection to {app}/{server}"
        )))
    }
}
