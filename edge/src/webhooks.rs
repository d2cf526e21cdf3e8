//! The caller's outbound webhooks: subscriptions to the turn events of their conversations
//! (all of them, or one), and the dead letters of deliveries that ran out of attempts.
//!
//! Contract: a subscription belongs to the identity that made it and hears of the
//! conversations that identity owns, in its tenant only; its signing secret is shown once, in
//! the answer that makes it. Another identity's subscription is `404` like one that does not
//! exist. Dead letters: an identity sees (and redelivers) those of its own subscriptions; a
//! tenant's admin sees every one of the tenant (app-wide webhooks' too). Workers deliver;
//! this module only writes subscriptions and moves dead letters back in line.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use turnpike_artifactory::webhooks::{Delivery, Subscriber, Subscription};
use turnpike_schemas::webhook::EventKind;
use utoipa::ToSchema;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{Body, Caller};
use crate::state::Edge;

/// A new subscription.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookInput {
    /// Where deliveries go: `http` or `https`. Internal addresses (loopback, private ranges,
    /// link-local and metadata) are refused at delivery unless the operator allows them.
    pub url: String,
    /// The kinds wanted (default: all).
    #[serde(default)]
    pub events: Vec<Kind>,
    /// Only this conversation of the caller's (default: every one they own).
    #[serde(default)]
    pub conversation: Option<String>,
}

/// A kind of event a subscription may want.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
pub enum Kind {
    #[serde(rename = "turn.completed")]
    TurnCompleted,
    #[serde(rename = "turn.failed")]
    TurnFailed,
    #[serde(rename = "turn.cancelled")]
    TurnCancelled,
    #[serde(rename = "turn.parked")]
    TurnParked,
    #[serde(rename = "schedule.firing")]
    ScheduleFiring,
}

impl From<Kind> for EventKind {
    fn from(kind: Kind) -> Self {
        match kind {
            Kind::TurnCompleted => EventKind::TurnCompleted,
            Kind::TurnFailed => EventKind::TurnFailed,
            Kind::TurnCancelled => EventKind::TurnCancelled,
            Kind::TurnParked => EventKind::TurnParked,
            Kind::ScheduleFiring => EventKind::ScheduleFiring,
        }
    }
}

/// A subscription as the API shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WebhookView {
    pub id: String,
    pub url: String,
    /// The kinds it wants (empty: all).
    pub events: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
    pub created_ms: u64,
}

/// A subscription just made, with its signing secret (shown this once; not in its `Debug`).
#[derive(Serialize, ToSchema)]
pub struct WebhookCreated {
    #[serde(flatten)]
    pub webhook: WebhookView,
    /// `whsec_…`: verify each delivery's `webhook-signature` with it (Standard Webhooks).
    pub secret: String,
}

impl std::fmt::Debug for WebhookCreated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookCreated")
            .field("webhook", &self.webhook)
            .field("secret", &"(redacted)")
            .finish()
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookList {
    pub webhooks: Vec<WebhookView>,
}

/// A delivery that ran out of attempts.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetterView {
    pub id: String,
    /// The message's `webhook-id` (the same on every attempt).
    pub message_id: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// `app:<app>/<name>` or the subscription's id.
    pub subscriber: String,
    pub attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub created_ms: u64,
    pub data: serde_json::Value,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetterList {
    pub dead_letters: Vec<DeadLetterView>,
}

fn view(s: &Subscription) -> WebhookView {
    WebhookView {
        id: s.id.clone(),
        url: s.url.clone(),
        events: s.events.iter().map(|k| k.name().to_owned()).collect(),
        conversation: s.conversation.map(|c| c.to_string()),
        created_ms: s.created_ms,
    }
}

fn dead_view(d: &Delivery) -> DeadLetterView {
    DeadLetterView {
        id: d.id.clone(),
        message_id: d.message.id.clone(),
        kind: d.message.kind.name().to_owned(),
        subscriber: match &d.subscriber {
            Subscriber::App { app, name, .. } => format!("app:{app}/{name}"),
            Subscriber::User { id, .. } => id.clone(),
        },
        attempts: d.attempts,
        last_error: d.last_error.clone(),
        created_ms: d.created_ms,
        data: d.message.data.clone(),
    }
}

/// Subscribes the caller to turn events of their conversations.
#[utoipa::path(operation_id = "create_webhook", post, path = "/v1/webhooks", tag = "webhooks",
    request_body = WebhookInput,
    responses((status = 201, body = WebhookCreated), (status = 404, body = ErrorBody),
              (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn create(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Body(input): Body<WebhookInput>,
) -> ApiResult<(StatusCode, Json<WebhookCreated>)> {
    let mut events: Vec<EventKind> = Vec::new();
    for kind in input.events.iter().map(|k| EventKind::from(*k)) {
        if !events.contains(&kind) {
            events.push(kind);
        }
    }
    let conversation = match input.conversation.as_deref() {
        None => None,
        // Only the owner's: a subscription hears of what its maker owns.
        Some(text) => Some(edge.owned_conversation(&caller, text).await?.conversation),
    };
    let webhooks = edge.inner.conversations.webhooks();
    let (subscription, secret) = webhooks
        .create(
            &caller.tenant,
            &caller.identity,
            &input.url,
            events,
            conversation,
        )
        .await
        .map_err(|e| match e.kind() {
            turnpike_artifactory::ErrorKind::Key => ApiError::unavailable(e.to_string()),
            _ => e.into(),
        })?;
    Ok((
        StatusCode::CREATED,
        Json(WebhookCreated {
            webhook: view(&subscription),
            secret: secret.expose().to_owned(),
        }),
    ))
}

/// The caller's subscriptions (never their secrets).
#[utoipa::path(operation_id = "list_webhooks", get, path = "/v1/webhooks", tag = "webhooks",
    responses((status = 200, body = WebhookList)))]
pub async fn list(
    State(edge): State<Edge>,
    Caller(caller): Caller,
) -> ApiResult<Json<WebhookList>> {
    let subs = edge
        .inner
        .conversations
        .webhooks()
        .list(&caller.tenant, &caller.identity)
        .await?;
    Ok(Json(WebhookList {
        webhooks: subs.iter().map(view).collect(),
    }))
}

/// Deletes one of the caller's subscriptions (its waiting deliveries are dropped).
#[utoipa::path(operation_id = "delete_webhook", delete, path = "/v1/webhooks/{id}", tag = "webhooks",
    params(("id" = String, Path, description = "wh_<ulid>")),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub async fn delete(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let removed = edge
        .inner
        .conversations
        .webhooks()
        .remove(&caller.tenant, &caller.identity, &id)
        .await?;
    if removed {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("webhook {id:?} not found")))
    }
}

/// Whether `caller` may see dead letter `d`: its subscription's owner, or the tenant's admin.
fn visible(caller: &Principal, d: &Delivery) -> bool {
    d.tenant == caller.tenant
        && (caller.admin
            || matches!(&d.subscriber, Subscriber::User { owner, .. } if *owner == caller.identity))
}

/// Deliveries that ran out of attempts: the caller's (every one of the tenant for an admin).
#[utoipa::path(operation_id = "list_dead_letters", get, path = "/v1/webhooks/dead-letters", tag = "webhooks",
    responses((status = 200, body = DeadLetterList)))]
pub async fn dead_letters(
    State(edge): State<Edge>,
    Caller(caller): Caller,
) -> ApiResult<Json<DeadLetterList>> {
    let dead = edge
        .inner
        .conversations
        .webhooks()
        .dead_letters(&caller.tenant)
        .await?;
    Ok(Json(DeadLetterList {
        dead_letters: dead
            .iter()
            .filter(|d| visible(&caller, d))
            .map(dead_view)
            .collect(),
    }))
}

/// Puts a dead letter back in line, its attempts from zero (the same `webhook-id`).
#[utoipa::path(operation_id = "redeliver_dead_letter", post, path = "/v1/webhooks/dead-letters/{id}/redeliver", tag = "webhooks",
    params(("id" = String, Path, description = "dlv_<hex>")),
    responses((status = 202), (status = 404, body = ErrorBody)))]
pub async fn redeliver(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let webhooks = edge.inner.conversations.webhooks();
    let not_found = || ApiError::not_found(format!("dead letter {id:?} not found"));
    let found = webhooks
        .dead_letter(&caller.tenant, &id)
        .await?
        .filter(|d| visible(&caller, d))
        .ok_or_else(not_found)?;
    if webhooks.redeliver(&caller.tenant, &found.id).await? {
        Ok(StatusCode::ACCEPTED)
    } else {
        Err(not_found())
    }
}
