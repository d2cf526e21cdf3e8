//! Stream tickets: short-lived, single-conversation credentials for the two streaming
//! endpoints, so that a browser (which cannot set headers on a WebSocket or an EventSource)
//! never puts its long-lived bearer token in a URL.
//!
//! # Contract
//! - `POST /v1/conversations/{id}/stream-tickets` (bearer token) answers a ticket for a
//!   conversation the caller may see now (`404` otherwise), valid for [`TICKET_TTL_S`] seconds.
//! - `?ticket=` is accepted on `…/{id}/stream` and `…/{id}/events` of **that** conversation
//!   only, and only until it expires: it authenticates as the caller who asked for it (never
//!   as an admin). Anything else — another conversation, another endpoint, an altered or
//!   expired ticket — is `401`, as a bad token is.
//! - Tickets are stateless (an HMAC under the edge's link key, with a purpose of its own, so a
//!   file link is never a ticket): every router of a fleet that shares the key accepts them.
//! - The stream itself re-checks access on every tick, so a ticket outlives no revocation.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use turnpike_schemas::{ConversationId, Identity, TenantId};

use super::error::{ApiError, ApiResult, ErrorBody};
use super::model::StreamTicket;
use crate::auth::Principal;
use crate::extract::Caller;
use crate::state::Edge;
use turnpike_router::bus::now_ms;

/// How long a ticket may be used to open a stream.
pub const TICKET_TTL_S: u64 = 60;

/// Separates tickets from every other use of the key.
const PURPOSE: &[u8] = b"turnpike stream ticket v1\0";

#[derive(Serialize, Deserialize)]
struct Claims {
    /// The conversation.
    c: String,
    /// The identity.
    i: String,
    /// The tenant.
    t: String,
    /// Expiry, ms since the epoch.
    e: u64,
}

fn mac(key: &[u8; 32], payload: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(PURPOSE);
    mac.update(payload);
    mac
}

/// Issues a ticket for `conversation` as `caller`, valid until `expires_ms`.
fn issue(
    key: &[u8; 32],
    caller: &Principal,
    conversation: ConversationId,
    expires_ms: u64,
) -> String {
    let claims = Claims {
        c: conversation.to_string(),
        i: caller.identity.to_string(),
        t: caller.tenant.to_string(),
        e: expires_ms,
    };
    let payload = serde_json::to_vec(&claims).expect("claims serialise");
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let signature = mac(key, &payload).finalize().into_bytes();
    format!("{}.{}", b64.encode(&payload), b64.encode(signature))
}

/// The principal a ticket stands for on the stream of `conversation` at `now`, if it does.
pub(crate) fn redeem(
    key: &[u8; 32],
    ticket: &str,
    conversation: ConversationId,
    now: u64,
) -> Option<Principal> {
    let (payload, signature) = ticket.split_once('.')?;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let payload = b64.decode(payload).ok()?;
    let signature = b64.decode(signature).ok()?;
    mac(key, &payload).verify_slice(&signature).ok()?;
    let claims: Claims = serde_json::from_slice(&payload).ok()?;
    if claims.e < now || claims.c != conversation.to_string() {
        return None;
    }
    Some(Principal {
        identity: claims.i.parse::<Identity>().ok()?,
        tenant: claims.t.parse::<TenantId>().ok()?,
        admin: false,
    })
}

/// Issues a short-lived ticket that opens this conversation's stream (`?ticket=`), so that a
/// browser need not put its bearer token in a URL.
#[utoipa::path(post, path = "/v1/conversations/{id}/stream-tickets", tag = "streaming",
    params(("id" = String, Path, description = "conv_<ulid>")),
    responses((status = 201, body = StreamTicket), (status = 404, body = ErrorBody)))]
pub async fn create(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<StreamTicket>)> {
    let entry = edge.visible(&caller, &id).await?;
    let expires_ms = now_ms() + TICKET_TTL_S * 1000;
    let ticket = issue(
        &edge.inner.link_key,
        &caller,
        entry.conversation,
        expires_ms,
    );
    Ok((
        StatusCode::CREATED,
        Json(StreamTicket { ticket, expires_ms }),
    ))
}

/// A ticket that does not open the stream it is shown at.
pub(crate) fn refused() -> ApiError {
    ApiError::unauthorized("the stream ticket is not valid for this stream, or has expired")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_opens_its_own_conversation_until_it_expires_and_nothing_else() {
        let key = [7; 32];
        let caller = Principal {
            identity: "oidc:acme:u-17".parse().unwrap(),
            tenant: "acme".parse().unwrap(),
            admin: true,
        };
        let (conv, other) = (ConversationId::new(), ConversationId::new());
        let ticket = issue(&key, &caller, conv, 1_000);
        let got = redeem(&key, &ticket, conv, 999).unwrap();
        assert_eq!(
            (got.identity, got.tenant),
            (caller.identity.clone(), caller.tenant.clone())
        );
        assert!(!got.admin, "a ticket never carries admin rights");
        assert!(redeem(&key, &ticket, conv, 1_001).is_none(), "expired");
        assert!(
            redeem(&key, &ticket, other, 999).is_none(),
            "another conversation"
        );
        assert!(
            redeem(&[8; 32], &ticket, conv, 999).is_none(),
            "another key"
        );
        // Altered claims (a later expiry) do not verify.
        let (payload, signature) = ticket.split_once('.').unwrap();
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut claims: serde_json::Value =
            serde_json::from_slice(&b64.decode(payload).unwrap()).unwrap();
        claims["e"] = u64::MAX.into();
        let forged = format!(
            "{}.{signature}",
            b64.encode(serde_json::to_vec(&claims).unwrap())
        );
        assert!(redeem(&key, &forged, conv, 999).is_none());
        assert!(redeem(&key, "garbage", conv, 0).is_none());
    }
}
