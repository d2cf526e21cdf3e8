//! The HTTP and WebSocket edge: everything a client or an app integration does goes through
//! here. `turnpike serve` and `turnpike router` mount it.
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
//! - [`usage`]: what model calls used (a conversation's, from its record; a tenant's per day)
//! - [`tickets`]: short-lived stream tickets, so browsers keep bearer tokens out of URLs
//! - [`console`]: the web console at `/` (embedded assets)
//! - [`openapi`]: the document at `/v1/openapi.json`
//! - [`client`]: a client of the API (for `turnpike chat` and the tests)
//! - [`catalog`]: the apps and agents a deployment hosts, as the API lists them

pub mod auth;
pub mod client;
pub mod console;
pub mod conversations;
pub mod error;
pub mod events;
pub mod files;
pub mod limits;
pub mod memory;
pub mod model;
pub mod openapi;
pub mod services;
pub mod stream;
pub mod tickets;
pub mod usage;
pub mod versions;

use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::de::DeserializeOwned;
use turnpike_artifactory::{Conversations, Files, RecordSigner, TrustedKeys};
use turnpike_schemas::entry::IngressDirective;
use turnpike_schemas::ConversationId;

pub use auth::{Authenticator, JwtConfig, JwtVerifier, Principal, TokenFile, Verifier};
pub use error::{ApiError, ApiResult, ErrorBody};
pub use limits::Limits;
use turnpike_router::bus::Bus;
use turnpike_router::Ingress;

/// The apps and agents `apps` hosts, as the API lists them.
pub fn catalog(apps: &turnpike_worker::Apps) -> Vec<model::AppView> {
    apps.ids()
        .into_iter()
        .map(|app| model::AppView {
            id: app.to_string(),
            agents: apps
                .agent_specs(&app)
                .iter()
                .map(|spec| model::AgentView {
                    id: spec.name.to_string(),
                    model: spec.model.clone(),
                    tools: spec.tools.specs().into_iter().map(|t| t.name).collect(),
                    context_length: spec.context_length,
                })
                .collect(),
        })
        .collect()
}

/// What the edge is built from.
pub struct EdgeParts {
    pub bus: Arc<dyn Bus>,
    pub conversations: Conversations,
    pub trusted: TrustedKeys,
    /// Signs the opening batch of conversations created here.
    pub signer: RecordSigner,
    pub auth: Authenticator,
    /// The apps and agents this deployment hosts (conversations may only use these), read
    /// at each request: a reload of the apps folders shows at once.
    pub apps: std::sync::Arc<turnpike_worker::Apps>,
    /// The hybrid index `/v1/search` asks (none: search answers 503).
    pub search: Option<turnpike_index::Index>,
    pub limits: Limits,
    /// The key signed file links are made with (keep it the same across a fleet's routers).
    pub link_key: [u8; 32],
    /// A deployment's policy attached to every accepted event.
    pub directive: Option<IngressDirective>,
    /// Daily spending limits: messages under a spent one are refused (429 `budget_exceeded`).
    pub budgets: Vec<turnpike_router::usage::Budget>,
}

/// The edge's shared state.
#[derive(Clone)]
pub struct Edge {
    inner: Arc<Inner>,
}

struct Inner {
    bus: Arc<dyn Bus>,
    conversations: Conversations,
    ingress: Ingress,
    resolver: turnpike_resolver::Resolver,
    files: Files,
    trusted: TrustedKeys,
    signer: RecordSigner,
    auth: Authenticator,
    apps: std::sync::Arc<turnpike_worker::Apps>,
    search: Option<turnpike_index::Index>,
    limits: Limits,
    rates: limits::RateLimits,
    in_flight: limits::InFlight,
    link_key: [u8; 32],
    /// True once the router is shutting down: no new streams, open ones close after a grace.
    draining: tokio::sync::watch::Sender<bool>,
    /// WebSocket streams open now.
    streams: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

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
    pub fn new(parts: EdgeParts) -> Self {
        let mut ingress = Ingress::new(parts.bus.clone(), parts.conversations.clone());
        if let Some(d) = parts.directive {
            ingress = ingress.with_directive(d);
        }
        ingress = ingress.with_budgets(parts.budgets);
        let store = parts.conversations.store().clone();
        let inner = Inner {
            resolver: turnpike_resolver::Resolver::standard(
                parts.conversations.directory().clone(),
                store.clone(),
            ),
            files: Files::new(store),
            rates: limits::RateLimits::new(&parts.limits),
            in_flight: limits::InFlight::new(&parts.limits),
            draining: tokio::sync::watch::Sender::new(false),
            streams: Default::default(),
            bus: parts.bus,
            conversations: parts.conversations,
            ingress,
            trusted: parts.trusted,
            signer: parts.signer,
            auth: parts.auth,
            apps: parts.apps,
            search: parts.search,
            limits: parts.limits,
            link_key: parts.link_key,
        };
        Self {
            inner: Arc::new(inner),
        }
    }

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
            .route("/healthz", get(|| async { "ok" }))
            .route("/", get(console::page))
            .route("/console/{name}", get(console::asset))
            .merge(authed)
            .route_layer(axum::middleware::from_fn(metered))
            .fallback(|| async { ApiError::not_found("no such endpoint") })
            .method_not_allowed_fallback(|| async {
                ApiError::new(
                    axum::http::StatusCode::METHOD_NOT_ALLOWED,
                    "method_not_allowed",
                    "this endpoint does not take that method",
                )
            })
            .layer(axum::extract::DefaultBodyLimit::max(
                self.inner.limits.max_body_bytes,
            ))
            .with_state(self.clone())
    }

    /// Starts shutting down: new streams are refused (503), open ones are closed with 1001
    /// (going away) once the drain grace has passed, so their clients reconnect to another
    /// router and resume from their cursor.
    pub fn drain(&self) {
        self.inner.draining.send_replace(true);
    }

    /// How long open streams go on after [`Self::drain`].
    pub fn drain_grace(&self) -> std::time::Duration {
        self.inner.limits.drain_grace
    }

    /// After [`Self::drain`]: waits out the grace, then (up to `limit` more) until every open
    /// WebSocket stream has sent its 1001 and ended.
    pub async fn drained(&self, limit: std::time::Duration) {
        tokio::time::sleep(self.drain_grace()).await;
        let deadline = tokio::time::Instant::now() + limit;
        while self
            .inner
            .streams
            .load(std::sync::atomic::Ordering::Acquire)
            > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
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

/// The authenticated caller.
pub struct Caller(pub Principal);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Principal>()
            .cloned()
            .map(Caller)
            .ok_or_else(|| ApiError::unauthorized("missing bearer token"))
    }
}

/// A JSON body; a malformed or oversized one is refused in the API's error shape.
pub struct Body<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Body(v)),
            Err(rejection) => Err(ApiError::from_status(
                rejection.status(),
                rejection.body_text(),
            )),
        }
    }
}

/// Query parameters; malformed ones are refused in the API's error shape.
pub struct Params<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(q) => Ok(Params(q.0)),
            Err(rejection) => Err(ApiError::malformed(rejection.body_text())),
        }
    }
}

/// A conversation id from the path; one that cannot be an id is `404`, like a missing one.
pub fn conversation_id(text: &str) -> ApiResult<ConversationId> {
    text.parse()
        .map_err(|_| ApiError::not_found(format!("conversation {text:?} not found")))
}
