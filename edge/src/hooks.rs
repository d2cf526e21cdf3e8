//! Inbound webhooks: `POST /v1/hooks/{app}/{hook}`, a signed delivery from another system,
//! becomes a message in a conversation of the hook's owner (a new one per delivery, or the one
//! a field of the payload names) — the payload its text, or (`payload = "attachment"`) an
//! attachment that opens the turn on its own.
//!
//! # Contract
//! - No bearer token: the signature is the authentication — Standard Webhooks (`webhook-id`,
//!   `webhook-timestamp`, `webhook-signature`; the timestamp within the hook's tolerance) or
//!   GitHub's (`X-Hub-Signature-256`, `X-GitHub-Delivery`), an HMAC-SHA256 under the secret in
//!   the hook's environment variable, compared in constant time. The secret is never echoed.
//! - A bad or missing signature, a timestamp out of tolerance, an oversized body, a missing
//!   delivery id or a payload without the key the hook routes by is refused, and nothing is
//!   written or enqueued.
//! - A delivery is one event, whatever is retried: the first POST of a delivery id claims it
//!   (its conversation and event id) before publishing; every later POST of that id gets the
//!   same answer (`duplicate: true`) and publishes only what the first did not get to.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;
use turnpike_artifactory::hooks::{Delivery, Hooks};
use turnpike_artifactory::NewConversation;
use turnpike_router::bus::now_ms;
use turnpike_schemas::{
    AppId, ConversationId, EventBody, EventId, HookConversation, HookPayload, HookSignature,
    HookSpec,
};
use utoipa::ToSchema;

use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::Edge;

/// The longest delivery id taken.
const MAX_DELIVERY_ID: usize = 256;

/// A delivery taken.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct HookAccepted {
    pub conversation: String,
    pub event_id: String,
    /// This delivery id was taken before: nothing new was enqueued.
    pub duplicate: bool,
}

type HmacSha256 = Hmac<Sha256>;

/// The idempotency key of a delivery's message: short and printable whatever the sender's id.
fn delivery_key(app: &AppId, hook: &str, delivery: &str) -> String {
    use sha2::Digest as _;
    let digest = Sha256::digest(format!("{app}\n{hook}\n{delivery}").as_bytes());
    format!("hook:{}", hex::encode(&digest[..16]))
}

fn refused() -> ApiError {
    ApiError::unauthorized("the delivery's signature does not verify")
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

/// Checks the delivery's signature; returns its delivery id.
fn verify(spec: &HookSpec, secret: &str, headers: &HeaderMap, body: &[u8]) -> ApiResult<String> {
    match spec.signature {
        HookSignature::Standard => {
            let id = header(headers, "webhook-id").ok_or_else(refused)?;
            let timestamp = header(headers, "webhook-timestamp").ok_or_else(refused)?;
            let signatures = header(headers, "webhook-signature").ok_or_else(refused)?;
            let sent: i64 = timestamp.parse().map_err(|_| refused())?;
            let now = (now_ms() / 1000) as i64;
            if now.abs_diff(sent) > spec.tolerance_secs {
                return Err(ApiError::unauthorized(
                    "the delivery's timestamp is too far from now (a replay, or a clock off)",
                ));
            }
            let key = secret.strip_prefix("whsec_").unwrap_or(secret);
            let key = base64::engine::general_purpose::STANDARD
                .decode(key)
                .map_err(|_| {
                    tracing::warn!(hook = %spec.name, "a Standard Webhooks secret is not whsec_<base64>");
                    ApiError::unavailable("this hook is not set up")
                })?;
            let mut mac = HmacSha256::new_from_slice(&key).expect("HMAC takes any key");
            mac.update(id.as_bytes());
            mac.update(b".");
            mac.update(timestamp.as_bytes());
            mac.update(b".");
            mac.update(body);
            let good = signatures.split(' ').any(|one| {
                let Some(sig) = one.strip_prefix("v1,") else {
                    return false;
                };
                base64::engine::general_purpose::STANDARD
                    .decode(sig)
                    .is_ok_and(|sig| mac.clone().verify_slice(&sig).is_ok())
            });
            if !good {
                return Err(refused());
            }
            Ok(id.to_owned())
        }
        HookSignature::Github => {
            let sig = header(headers, "x-hub-signature-256")
                .and_then(|s| s.strip_prefix("sha256="))
                .and_then(|s| hex::decode(s).ok())
                .ok_or_else(refused)?;
            let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).expect("any key");
            mac.update(body);
            mac.verify_slice(&sig).map_err(|_| refused())?;
            let id = header(headers, "x-github-delivery")
                .ok_or_else(|| ApiError::malformed("the delivery has no X-GitHub-Delivery id"))?;
            Ok(id.to_owned())
        }
    }
}

/// Takes a signed delivery for an app's hook.
#[utoipa::path(operation_id = "receive_hook", post, path = "/v1/hooks/{app}/{hook}", tag = "hooks",
    params(("app" = String, Path), ("hook" = String, Path)),
    request_body(content = String, description = "the sender's payload (UTF-8; JSON when the hook routes by a field)"),
    responses((status = 202, body = HookAccepted), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 413, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(()))]
pub async fn receive(
    State(edge): State<Edge>,
    Path((app, hook)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> ApiResult<(StatusCode, Json<HookAccepted>)> {
    let spec = edge
        .inner
        .apps
        .hook(&app, &hook)
        .ok_or_else(|| ApiError::not_found(format!("no hook {hook:?} of app {app:?}")))?;
    let app: AppId = app
        .parse()
        .map_err(|_| ApiError::not_found("no such hook"))?;
    // Read up to this hook's own limit, no further (the signature is checked after).
    let raw: Bytes = axum::body::to_bytes(body, spec.max_bytes)
        .await
        .map_err(|_| {
            ApiError::too_large(
                format!(
                    "the delivery is more than this hook takes ({} bytes)",
                    spec.max_bytes
                ),
                spec.max_bytes as u64,
            )
        })?;
    let secret = std::env::var(&spec.secret_env)
        .ok()
        .filter(|s| !s.is_empty());
    let Some(secret) = secret else {
        tracing::warn!(app = %app, hook = %spec.name, env = %spec.secret_env, "a hook's secret is not set: its deliveries are refused");
        return Err(ApiError::unavailable("this hook is not set up"));
    };
    let delivery = verify(&spec, &secret, &headers, &raw)?;
    if delivery.is_empty()
        || delivery.len() > MAX_DELIVERY_ID
        || !delivery.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(ApiError::malformed(
            "a delivery id is 1–256 visible ASCII characters",
        ));
    }
    edge.inner.rates.check(&spec.owner.to_string())?;
    let text = std::str::from_utf8(&raw)
        .map_err(|_| ApiError::invalid("the delivery is not UTF-8 text"))?
        .to_owned();
    let key = match &spec.conversation {
        HookConversation::New => None,
        HookConversation::Field(pointer) => {
            let payload: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| ApiError::invalid(format!("the delivery is not JSON: {e}")))?;
            let key = match payload.pointer(pointer) {
                Some(serde_json::Value::String(s)) if !s.is_empty() => s.clone(),
                Some(serde_json::Value::Number(n)) => n.to_string(),
                _ => {
                    return Err(ApiError::invalid(format!(
                        "the delivery has no {pointer} (a string or a number) to route it by"
                    )))
                }
            };
            Some(key)
        }
    };
    // The event as it will be, checked before anything is written: what the lane would refuse
    // is refused now, with nothing claimed.
    let key_of_delivery = delivery_key(&app, &spec.name, &delivery);
    // As an attachment: its name says which hook and delivery; its reference is made once the
    // conversation and the event's id are known (a placeholder is checked here).
    let attachment_name = format!(
        "{}-{}.txt",
        spec.name,
        &hex::encode(<Sha256 as sha2::Digest>::digest(delivery.as_bytes()))[..12]
    );
    // The conversation the probe below is addressed to (the real one is decided after).
    let probed = ConversationId::new();
    let mut body = match spec.payload {
        HookPayload::Text => EventBody::Message { text },
        HookPayload::Attachment => EventBody::Attachment {
            name: attachment_name.clone(),
            media_type: "text/plain".into(),
            size: raw.len() as u64,
            reference: turnpike_schemas::Reference::new(
                turnpike_schemas::Family::attachment(),
                probed,
                turnpike_schemas::TurnId::FIRST,
                turnpike_schemas::RefPath::parse(&attachment_name)
                    .map_err(|e| ApiError::invalid(format!("the delivery's name: {e}")))?,
            ),
            preview: Some(crate::files::preview("text/plain", &raw)),
        },
    };
    {
        let mut probe = turnpike_schemas::Event::new(
            turnpike_schemas::Address {
                tenant: spec.tenant.clone(),
                app: app.clone(),
                agent: spec.agent.clone(),
                conversation: probed,
                identity: spec.owner.clone(),
            },
            body.clone(),
            now_ms(),
        );
        probe.idempotency_key = Some(key_of_delivery.clone());
        probe
            .validate()
            .map_err(|e| ApiError::invalid(format!("the delivery cannot be a message: {e}")))?;
    }
    let _slot = edge.inner.in_flight.enter().await?;
    let hooks = Hooks::new(edge.inner.conversations.store().clone());
    let conversation = match &key {
        None => ConversationId::new(),
        Some(key) => {
            hooks
                .keyed(&spec.tenant, &app, &spec.name, key, ConversationId::new())
                .await?
        }
    };
    let lane_after = match key {
        None => 0,
        Some(_) => edge.inner.bus.lane_last(conversation).await?,
    };
    let (claim, first) = hooks
        .claim(
            &spec.tenant,
            &app,
            &spec.name,
            &delivery,
            &Delivery {
                conversation,
                event: EventId::new(),
                lane_after,
                received_ms: now_ms(),
            },
        )
        .await?;
    if hooks
        .is_done(&spec.tenant, &app, &spec.name, &delivery)
        .await?
    {
        return Ok((
            StatusCode::ACCEPTED,
            Json(HookAccepted {
                conversation: claim.conversation.to_string(),
                event_id: claim.event.to_string(),
                duplicate: true,
            }),
        ));
    }
    edge.inner
        .conversations
        .ensure(
            &edge.inner.signer,
            claim.conversation,
            NewConversation {
                tenant: spec.tenant.clone(),
                owner: spec.owner.clone(),
                app: app.clone(),
                agent: spec.agent.clone(),
                at_ms: claim.received_ms,
                instructions: None,
                started_by: Some(turnpike_schemas::Origin::Hook {
                    app: app.clone(),
                    hook: spec.name.clone(),
                }),
            },
        )
        .await?;
    if let EventBody::Attachment { reference, .. } = &mut body {
        // Stored under the turn its event opens (the next one), under the event's own id.
        let prefix =
            turnpike_artifactory::ConversationPrefix::new(spec.tenant.clone(), claim.conversation);
        let head = edge
            .inner
            .conversations
            .record(prefix.clone())
            .head()
            .await?;
        let turn = turnpike_schemas::TurnId::new(head.state().last_turn + 1)
            .unwrap_or(turnpike_schemas::TurnId::FIRST);
        *reference = edge
            .inner
            .files
            .attach_as(&prefix, turn, claim.event, &attachment_name, raw.clone())
            .await?;
    }
    let published = edge
        .inner
        .ingress
        .submit_once(
            &spec.tenant,
            &spec.owner,
            claim.conversation,
            body,
            turnpike_router::Trigger {
                id: claim.event,
                key: key_of_delivery,
                origin: turnpike_schemas::Origin::Hook {
                    app: app.clone(),
                    hook: spec.name.clone(),
                },
            },
            claim.lane_after,
        )
        .await?;
    // Published: a redelivery after the lane let the event go (its age limit) answers from
    // here and publishes nothing.
    hooks
        .mark_done(&spec.tenant, &app, &spec.name, &delivery)
        .await?;
    metrics::counter!("turnpike_hook_deliveries_total", "duplicate" => (!first || published.duplicate).to_string())
        .increment(1);
    Ok((
        StatusCode::ACCEPTED,
        Json(HookAccepted {
            conversation: claim.conversation.to_string(),
            event_id: claim.event.to_string(),
            duplicate: !first || published.duplicate,
        }),
    ))
}
