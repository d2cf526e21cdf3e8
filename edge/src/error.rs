//! The edge's one error shape: `{"code", "message", "details"}` with the status that fits.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// Declares the API's error codes: name on the wire, status, meaning (the doc comment).
macro_rules! error_codes {
    ($($(#[doc = $doc:literal])* $variant:ident = $name:literal, $status:ident;)*) => {
        /// The stable, machine-readable kinds of the API's errors ([`ErrorBody::code`]): a
        /// client branches on these, never on messages. The book's reference lists them
        /// (`turnpike reference errors`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum ErrorCode {
            $($(#[doc = $doc])* $variant,)*
        }

        impl ErrorCode {
            /// Every code, in table order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The name on the wire.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $name,)*
                }
            }

            /// Where the code is explained: the errors reference of the book at the code's
            /// anchor, as a deployment serving the book serves it (an error's `type`).
            pub const fn explained_at(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => concat!("/book/reference/errors.html#", $name),)*
                }
            }

            /// The HTTP status an error of this code comes with.
            pub fn status(self) -> StatusCode {
                match self {
                    $(ErrorCode::$variant => StatusCode::$status,)*
                }
            }

            /// What it means and what to do, for a person.
            pub fn meaning(self) -> String {
                let lines: &[&str] = match self {
                    $(ErrorCode::$variant => &[$($doc),*],)*
                };
                lines.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ")
            }
        }
    };
}

error_codes! {
    /// The request is not valid JSON, or a parameter does not parse. Fix the request.
    Malformed = "malformed", BAD_REQUEST;
    /// No bearer token, or one that no longer identifies anyone (unknown, expired, wrong
    /// audience or issuer). Get a new token.
    Unauthorized = "unauthorized", UNAUTHORIZED;
    /// The caller is known but may not do this (not an admin, not an allowed approver, not the
    /// owner of what it names).
    Forbidden = "forbidden", FORBIDDEN;
    /// The request names something of another tenant: nothing crosses a tenant.
    CrossTenant = "cross_tenant", FORBIDDEN;
    /// No such thing for this caller: missing, or not theirs (the two are not told apart).
    NotFound = "not_found", NOT_FOUND;
    /// The endpoint exists but does not take that method.
    MethodNotAllowed = "method_not_allowed", METHOD_NOT_ALLOWED;
    /// The request conflicts with the state it acts on (a closed conversation, a request
    /// already answered).
    Conflict = "conflict", CONFLICT;
    /// The body, a message or an attachment is larger than its limit (`details.limit_bytes`).
    PayloadTooLarge = "payload_too_large", PAYLOAD_TOO_LARGE;
    /// A file's type is not accepted, or its content is not what it says it is.
    UnsupportedMediaType = "unsupported_media_type", UNSUPPORTED_MEDIA_TYPE;
    /// The request parses but a value does not fit (`message` says which field and why).
    Invalid = "invalid", UNPROCESSABLE_ENTITY;
    /// Too many requests from this identity: retry after `Retry-After` seconds.
    RateLimited = "rate_limited", TOO_MANY_REQUESTS;
    /// A daily budget of the tenant or app is spent; it renews at UTC midnight
    /// (`Retry-After`).
    BudgetExceeded = "budget_exceeded", TOO_MANY_REQUESTS;
    /// The service cannot take this now (the bus is saturated or unreachable, search has no
    /// index): retry after `Retry-After` seconds. Nothing was accepted.
    Unavailable = "unavailable", SERVICE_UNAVAILABLE;
    /// A fault on the server's side; the server logs it. Retrying with the same idempotency
    /// key is safe.
    Internal = "internal", INTERNAL_SERVER_ERROR;
}

/// Every error response of the API.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorBody {
    /// A stable, machine-readable code (see [`ErrorCode`]): `malformed`, `unauthorized`,
    /// `forbidden`, `cross_tenant`, `not_found`, `method_not_allowed`, `conflict`,
    /// `payload_too_large`, `unsupported_media_type`, `invalid`, `rate_limited`,
    /// `budget_exceeded`, `unavailable`, `internal`.
    pub code: String,
    /// Where the code is explained: the book's reference, as a deployment serving the book
    /// serves it (`/book/reference/errors.html#<code>`). As stable as `code`.
    #[serde(rename = "type")]
    pub explained_at: &'static str,
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
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status: code.status(),
            body: ErrorBody {
                code: code.as_str().to_owned(),
                explained_at: code.explained_at(),
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
        Self::new(ErrorCode::NotFound, message)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Invalid, message)
    }

    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Malformed, message)
    }

    pub fn too_large(message: impl Into<String>, limit: u64) -> Self {
        Self::new(ErrorCode::PayloadTooLarge, message)
            .with_details(serde_json::json!({ "limit_bytes": limit }))
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unauthorized, message)
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Conflict, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unavailable, message).retry_after(1)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }

    /// The code that goes with a status the framework chose (a rejected body or query).
    pub fn from_status(status: StatusCode, message: impl Into<String>) -> Self {
        let code = match status {
            StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::PayloadTooLarge,
            StatusCode::UNSUPPORTED_MEDIA_TYPE => ErrorCode::UnsupportedMediaType,
            StatusCode::UNPROCESSABLE_ENTITY => ErrorCode::Invalid,
            StatusCode::NOT_FOUND => ErrorCode::NotFound,
            StatusCode::METHOD_NOT_ALLOWED => ErrorCode::MethodNotAllowed,
            s if s.is_server_error() => ErrorCode::Internal,
            _ => ErrorCode::Malformed,
        };
        Self {
            status,
            ..Self::new(code, message)
        }
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
            K::BudgetSpent => ApiError::new(ErrorCode::BudgetExceeded, e.to_string())
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
