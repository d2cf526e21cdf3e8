//! The HTTP and WebSocket edge: everything a client or an app integration does goes through
//! here. `turnpike serve` and `turnpike router` mount it.
//!
//! It must not depend on the worker or the harness (`turnpike-worker`, `turnpike-agent`): what
//! it needs of them comes through its own traits ([`Catalog`], [`Replayer`]), wired in the
//! binary; it publishes events and reads the record, and never runs a turn.
//!
//! # Contract
//! - Every `/v1` request except the OpenAPI document and signed links carries
//!   `Authorization: Bearer <token>`; the token is turned into one [`Principal`] and everything
//!   the request touches is seen as that identity.
//! - A conversation the caller may not see is `404`, exactly like one that does not exist, for
//!   every resource under it.
//! - Every error is `{"code", "message", "details"}` ([`ErrorBody`]) with the status that fits;
//!   `429` and `503` carry `Retry-After`.
//! - An accepted event (`202`) is durable on the conversation's lane. The same
//!   `Idempotency-Key` on a retry is accepted once (`duplicate: true`, the first `lane_seq`).
//! - Refused requests write nothing.
//!
//! # Layout
//! - [`auth`]: bearer tokens → principals (token file, JWT against a JWKS)
//! - [`error`]: the error shape
//! - [`limits`]: rates per identity, in-flight submissions
//! - [`model`]: bodies on the wire
//! - [`conversations`], [`events`], [`files`], [`stream`], [`services`]: the handlers
//! - [`memory`]: what the index remembers of the caller, and forgetting it
//! - [`versions`]: a conversation's project versions: files and diffs
//! - [`a2a`]: every hosted agent as an A2A agent (cards, JSON-RPC, tasks from the record)
//! - [`mcp`]: the deployment as an MCP server (`/mcp`): agents and search as tools
//! - [`hooks`]: inbound webhooks (signed deliveries become messages, each once)
//! - [`schedules`]: the caller's schedules (the workers fire them)
//! - [`webhooks`]: the caller's outbound webhooks and their dead letters (workers deliver)
//! - [`usage`]: what model calls used (a conversation's, from its record; a tenant's per day)
//! - [`tickets`]: short-lived stream tickets, so browsers keep bearer tokens out of URLs
//! - [`console`]: the web console at `/` (embedded assets)
//! - [`book`]: a built book, held in memory; `help` serves it at `/book/`, the console's help
//! - [`openapi`]: the document at `/v1/openapi.json`
//! - [`client`]: a client of the API (for `turnpike chat` and the tests)
//! - `state`: what the edge is built from, and the state every handler reaches
//! - [`extract`]: the caller, bodies, parameters and ids handlers take from a request
//! - `hosted`: what the edge needs of the harness (the apps catalogue, replay), as traits
//!
//! The book: `book/src/reference/api.md`, `book/src/guides/a2a-and-mcp.md` (and `book/src/SUMMARY.md` for the rest).

pub mod a2a;
pub mod auth;
pub mod book;
pub mod client;
pub mod connections;
pub mod console;
pub mod conversations;
pub mod error;
pub mod events;
pub mod extract;
pub mod files;
mod help;
pub mod hooks;
mod hosted;
pub mod limits;
pub mod mcp;
pub mod memory;
pub mod model;
pub mod openapi;
pub mod schedules;
pub mod services;
mod state;
pub mod stream;
pub mod tickets;
pub mod usage;
pub mod versions;
pub mod webhooks;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use turnpike_schemas::ConversationId;

pub use auth::{Authenticator, JwtConfig, JwtVerifier, Principal, TokenFile, Verifier};
pub use error::{ApiError, ApiResult, ErrorBody, ErrorCode};
pub use extract::{conversation_id, Body, Caller, Params};
pub use hosted::{Catalog, Replayed, Replayer};
pub use limits::Limits;
pub use state::{Edge, EdgeParts};

/// Times every routed request by its route (the pattern, never the path), method and status.
async fn metered(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method: &'static str = match request.method().as_str() {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        _ => "other",
    };
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    metrics::histogram!(
        "turnpike_http_request_duration_seconds",
        "route" => route,
        "method" => method,
        "status" => response.status().as_u16().to_string()
    )
    .record(started.elapsed().as_secs_f64());
    response
}

impl Edge {
    /// The HTTP application.
    pub fn router(&self) -> Router {
        let authed = Router::new()
            .route("/v1/apps", get(conversations::list_apps))
            .route(
                "/v1/conversations",
                get(conversations::list).post(conversations::create),
            )
            .route(
                "/v1/conversations/{id}",
                get(conversations::get_one).delete(conversations::delete),
            )
            .route("/v1/conversations/{id}/close", post(conversations::close))
            .route("/v1/conversations/{id}/export", get(conversations::export))
            .route("/v1/conversations/{id}/usage", get(usage::conversation))
            .route("/v1/usage", get(usage::tenant))
            .route(
                "/v1/conversations/{id}/versions",
                get(versions::list_versions),
            )
            .route(
                "/v1/conversations/{id}/versions/{turn}",
                get(versions::version_files),
            )
            .route(
                "/v1/conversations/{id}/versions/{turn}/diff",
                get(versions::version_diff),
            )
            .route(
                "/v1/conversations/{id}/grants",
                post(conversations::grant).delete(conversations::revoke),
            )
            .route(
                "/v1/conversations/{id}/messages",
                get(events::list_rows).post(events::message),
            )
            .route("/v1/conversations/{id}/follow-ups", post(events::follow_up))
            .route("/v1/conversations/{id}/steer", post(events::steer))
            .route("/v1/conversations/{id}/stop", post(events::stop))
            .route("/v1/conversations/{id}/pending", get(events::pending))
            .route(
                "/v1/conversations/{id}/approvals/{request}/approve",
                post(events::approve),
            )
            .route(
                "/v1/conversations/{id}/approvals/{request}/reject",
                post(events::reject),
            )
            .route(
                "/v1/conversations/{id}/questions/{request}/answer",
                post(events::answer),
            )
            .route("/v1/conversations/{id}/agent", post(events::switch_agent))
            .route("/v1/conversations/{id}/compact", post(events::compact))
            .route(
                "/v1/conversations/{id}/attachments",
                post(files::upload)
                    .layer(axum::extract::DefaultBodyLimit::max(files::MAX_UPLOAD_BODY)),
            )
            .route("/v1/conversations/{id}/stream", get(stream::websocket))
            .route(
                "/v1/conversations/{id}/stream-tickets",
                post(tickets::create),
            )
            .route("/v1/conversations/{id}/events", get(stream::sse))
            .route("/v1/files", get(files::download))
            .route("/v1/files/links", post(files::link))
            .route("/v1/search", get(services::search))
            .route(
                "/v1/me",
                get(conversations::me).delete(conversations::delete_me),
            )
            .route("/v1/connections", get(connections::list))
            .route(
                "/v1/connections/{app}/{server}",
                get(connections::get_one)
                    .put(connections::put)
                    .delete(connections::delete),
            )
            .route(
                "/v1/schedules",
                get(schedules::list).post(schedules::create),
            )
            .route(
                "/v1/schedules/{id}",
                get(schedules::get_one).delete(schedules::delete),
            )
            .route("/v1/schedules/{id}/pause", post(schedules::pause))
            .route("/v1/schedules/{id}/resume", post(schedules::resume))
            .route("/v1/webhooks", get(webhooks::list).post(webhooks::create))
            .route("/v1/webhooks/{id}", axum::routing::delete(webhooks::delete))
            .route("/v1/webhooks/dead-letters", get(webhooks::dead_letters))
            .route(
                "/v1/webhooks/dead-letters/{id}/redeliver",
                post(webhooks::redeliver),
            )
            .route("/v1/agent-cards", get(a2a::agent_cards))
            .route(
                "/a2a/{app}/{agent}/.well-known/agent-card.json",
                get(a2a::agent_card),
            )
            .route(
                "/a2a/{app}/{agent}",
                post(a2a::rpc).layer(axum::extract::DefaultBodyLimit::max(a2a::MAX_RPC_BODY)),
            )
            // POST only: no session is issued, so clients open no stream (GET) and end none
            // (DELETE); both are 405 with `Allow: POST`.
            .route("/mcp", post(mcp::endpoint))
            .route("/v1/admin/conversations", get(services::phases))
            .route(
                "/v1/memory",
                get(memory::list).delete(memory::forget_conversation),
            )
            .route(
                "/v1/memory/{row}",
                axum::routing::delete(memory::forget_row),
            )
            .route(
                "/v1/admin/conversations/{id}/verify",
                post(services::verify),
            )
            .route(
                "/v1/admin/conversations/{id}/replay",
                post(services::replay),
            )
            .route_layer(axum::middleware::from_fn_with_state(
                self.clone(),
                authenticate,
            ));
        Router::new()
            .route("/v1/openapi.json", get(openapi::document))
            .route("/v1/links/{token}", get(files::follow_link))
            // Each hook reads its body up to its own `max_bytes`.
            .route("/v1/hooks/{app}/{hook}", post(hooks::receive))
            .route("/healthz", get(|| async { "ok" }))
            .route("/", get(console::page))
            .route("/console/{name}", get(console::asset))
            .route("/book", get(help::root))
            .route("/book/", get(help::index))
            .route("/book/{*path}", get(help::page))
            .merge(authed)
            .route_layer(axum::middleware::from_fn(metered))
            .fallback(|| async { ApiError::not_found("no such endpoint") })
            .method_not_allowed_fallback(|| async {
                ApiError::new(
                    crate::error::ErrorCode::MethodNotAllowed,
                    "this endpoint does not take that method",
                )
            })
            .layer(axum::extract::DefaultBodyLimit::max(
                self.inner.limits.max_body_bytes,
            ))
            .with_state(self.clone())
    }

    /// Serves until `shutdown` resolves, then waits for open requests (an SSE stream lasts as
    /// long as its client: callers bound that wait).
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let rates = self.inner.rates.clone();
        let sweeper = tokio::spawn(async move {
            let mut every = tokio::time::interval(std::time::Duration::from_secs(60));
            loop {
                every.tick().await;
                rates.shrink();
            }
        });
        let app = self
            .router()
            .into_make_service_with_connect_info::<std::net::SocketAddr>();
        // Streams write small events one after another: without TCP_NODELAY, Nagle's algorithm
        // holds each behind the client's delayed ACK of the one before (~40 ms a piece).
        use axum::serve::ListenerExt as _;
        let listener = listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY on a connection");
            }
        });
        let result = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await;
        sweeper.abort();
        result
    }
}

/// Authenticates the request and applies the caller's rate limit.
async fn authenticate(State(edge): State<Edge>, mut request: Request, next: Next) -> Response {
    let bearer = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .map(str::to_owned);
    // Browsers cannot set headers on a WebSocket (or an EventSource): on the two streaming
    // endpoints only, the token may come as a query, or — preferred — a short-lived stream
    // ticket for that conversation. Everywhere else a token in a URL (which ends up in logs and
    // browser histories) is not accepted.
    let streamed = streamed_conversation(request.uri().path());
    let token =
        bearer.or_else(|| streamed.and_then(|_| query_param(request.uri(), "access_token")));
    let ticket = match (&token, streamed) {
        (None, Some(conversation)) => {
            query_param(request.uri(), "ticket").map(|t| (t, conversation))
        }
        _ => None,
    };
    let principal = match (token, ticket) {
        (_, Some((ticket, conversation))) => {
            match tickets::redeem(
                &edge.inner.link_key,
                &ticket,
                conversation,
                turnpike_router::bus::now_ms(),
            ) {
                Some(principal) => principal,
                None => return tickets::refused().into_response(),
            }
        }
        (Some(token), None) if !token.is_empty() => {
            match edge.inner.auth.authenticate(&token).await {
                Some(principal) => principal,
                None => {
                    return ApiError::unauthorized("the bearer token is not valid").into_response()
                }
            }
        }
        _ => {
            return ApiError::unauthorized("missing bearer token (Authorization: Bearer <token>)")
                .into_response()
        }
    };
    if let Err(e) = edge.inner.rates.check(&principal.identity.to_string()) {
        return e.into_response();
    }
    request.extensions_mut().insert(principal);
    next.run(request).await
}

/// The conversation of an endpoint a browser opens without being able to set headers
/// (`/v1/conversations/{id}/stream` or `…/events`); `None` for every other path.
fn streamed_conversation(path: &str) -> Option<ConversationId> {
    let rest = path.strip_prefix("/v1/conversations/")?;
    let (id, endpoint) = rest.split_once('/')?;
    matches!(endpoint, "stream" | "events")
        .then(|| id.parse().ok())
        .flatten()
}

fn query_param(uri: &axum::http::Uri, name: &str) -> Option<String> {
    let query =
        axum::extract::Query::<std::collections::HashMap<String, String>>::try_from_uri(uri)
            .ok()?;
    query.0.get(name).cloned()
}
