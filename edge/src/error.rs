//! The edge's one error shape: `{"code", "message", "details"}` with the status that fits.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// Every error response of the API.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorBody {
    /// A stable, machine-readable code: `unauthorized`, `not_found`, `malformed`, `invalid`,
    /// `payload_too_large`, `unsupported_media_type`, `conflict`, `forbidden`, `rate_limited`,
    /// `budget_exceeded`,
    /// `unavailable`, `internal`.
    pub code: String,
    /// What was wrong, for a person.
    pub message: String,
    /// More, when there is more (the limit that was exceeded, the field that was wrong).
    #[schema(value_type = Object)]
    pub details: serde_json::Value,
}

/// An error on its way to the client.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub body: ErrorBody,
    /// Seconds after which a retry may succeed (429, 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            body: ErrorBody {
                code: code.to_owned(),
                message: message.into(),
                details: serde_json::Value::Object(Default::default()),
            },
            retry_after: None,
        }
    }

    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        self.body.details = details;
        self
    }

    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds.max(1));
        self
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", message)
    }

    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "malformed", message)
    }

    pub fn too_large(message: impl Into<String>, limit: u64) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
            .with_details(serde_json::json!({ "limit_bytes": limit }))
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message).retry_after(1)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// The code that goes with a status the framework chose (a rejected body or query).
    pub fn from_status(status: StatusCode, message: impl Into<String>) -> Self {
        let code = match status {
            StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
            StatusCode::UNPROCESSABLE_ENTITY => "invalid",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
            s if s.is_server_error() => "internal",
            _ => "malformed",
        };
        Self::new(status, code, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(status = %self.status, message = %self.body.message, "request failed");
        }
        let mut response = (self.status, axum::Json(self.body)).into_response();
        if let Some(seconds) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&seconds.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        response
    }
}

/// Seconds until the next UTC midnight, when daily budgets renew.
fn seconds_to_utc_midnight() -> u64 {
    let now = turnpike_router::bus::now_ms() / 1000;
    86_400 - now % 86_400
}

impl From<turnpike_router::Error> for ApiError {
    fn from(e: turnpike_router::Error) -> Self {
        use turnpike_router::ErrorKind as K;
        match e.kind() {
            K::NotFound => ApiError::not_found(e.to_string()),
            K::Invalid => ApiError::invalid(e.to_string()),
            K::Closed => ApiError::conflict(e.to_string()),
            K::BudgetSpent => ApiError::new(
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                "budget_exceeded",
                e.to_string(),
            )
            .retry_after(seconds_to_utc_midnight()),
            K::Unavailable => ApiError::unavailable(e.to_string()),
            _ => ApiError::internal(e.to_string()),
        }
    }
}

impl From<turnpike_artifactory::Error> for ApiError {
    fn from(e: turnpike_artifactory::Error) -> Self {
        use turnpike_artifactory::ErrorKind as K;
        match e.kind() {
            K::NotFound => ApiError::not_found(e.to_string()),
            K::InvalidInput => ApiError::invalid(e.to_string()),
            K::Store => ApiError::unavailable(e.to_string()),
            _ => ApiError::internal(e.to_string()),
        }
    }
}

impl From<turnpike_resolver::ResolveError> for ApiError {
    fn from(e: turnpike_resolver::ResolveError) -> Self {
        use turnpike_resolver::ResolveError as R;
        match &e {
            R::NotFound(_) => ApiError::not_found(e.to_string()),
            R::Invalid(_) => ApiError::invalid(e.to_string()),
            R::Unavailable(_) => ApiError::unavailable(e.to_string()),
            _ => ApiError::internal(e.to_string()),
        }
    }
}

/// The result of a handler.
pub type ApiResult<T> = std::result::Result<T, ApiError>;
