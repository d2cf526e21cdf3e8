//! What handlers take from a request: the authenticated caller, a JSON body, query parameters,
//! a conversation id — each refused in the API's error shape.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use turnpike_schemas::ConversationId;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};

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
