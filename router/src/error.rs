//! The one error type of this crate, with kinds that map to outcomes in one place.

use thiserror::Error;

/// What went wrong, as a kind the caller can match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The bus cannot be reached; nothing was accepted. Retry with the same idempotency key.
    Unavailable,
    /// The event is malformed or too large; it never reaches a lane.
    Invalid,
    /// No such conversation for this identity.
    NotFound,
    /// The conversation is closed: it accepts no more events.
    Closed,
    /// The lease is held by someone else, or was lost.
    LeaseLost,
    /// Stored data that cannot be read.
    Corrupt,
    /// A lane message this binary cannot read (see [`Error::unreadable`]): the caller parks it.
    Unreadable,
    /// The artifactory failed.
    Artifactory,
}

/// A router error: a kind, a message that says what was wrong, and the source.
#[derive(Debug, Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
    unreadable: Option<Box<crate::bus::Unreadable>>,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
            unreadable: None,
        }
    }

    pub(crate) fn with_source(
        kind: ErrorKind,
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            kind,
            message: message.into(),
            source: Some(source.into()),
            unreadable: None,
        }
    }

    /// A lane message that cannot be read, with its bytes.
    pub(crate) fn unreadable_message(message: crate::bus::Unreadable) -> Self {
        Self {
            kind: ErrorKind::Unreadable,
            message: format!(
                "lane message {} is unreadable: {}",
                message.seq, message.reason
            ),
            source: None,
            unreadable: Some(Box::new(message)),
        }
    }

    /// The lane message that could not be read, for [`ErrorKind::Unreadable`].
    pub fn unreadable(&self) -> Option<&crate::bus::Unreadable> {
        self.unreadable.as_deref()
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl From<turnpike_artifactory::Error> for Error {
    fn from(e: turnpike_artifactory::Error) -> Self {
        let kind = match e.kind() {
            turnpike_artifactory::ErrorKind::NotFound => ErrorKind::NotFound,
            _ => ErrorKind::Artifactory,
        };
        Error::with_source(kind, e.to_string(), e)
    }
}

impl From<turnpike_schemas::SchemaError> for Error {
    fn from(e: turnpike_schemas::SchemaError) -> Self {
        Error::with_source(ErrorKind::Invalid, e.to_string(), e)
    }
}

/// This crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
