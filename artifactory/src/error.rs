//! The one error type of this crate.

use thiserror::Error;

/// What went wrong, as a kind the caller can match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The record's head moved since the caller observed it; nothing was written.
    HeadMoved,
    /// No such object, or not visible to the caller (the two are never told apart).
    NotFound,
    /// An object exists already where a create-only write was attempted.
    AlreadyExists,
    /// Stored bytes that cannot be read as what they should be.
    Corrupt,
    /// The caller asked for something invalid.
    InvalidInput,
    /// Signing keys: missing, unreadable or malformed.
    Key,
    /// The object store failed.
    Store,
}

/// An artifactory error: a kind, a message that says what was wrong, and the source.
#[derive(Debug, Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    pub(crate) fn with_source(
        kind: ErrorKind,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            kind,
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Maps an object store failure on `what`, keeping the source.
    pub(crate) fn store(what: &str, e: object_store::Error) -> Self {
        let kind = match &e {
            object_store::Error::NotFound { .. } => ErrorKind::NotFound,
            object_store::Error::AlreadyExists { .. }
            | object_store::Error::Precondition { .. } => ErrorKind::AlreadyExists,
            _ => ErrorKind::Store,
        };
        Self::with_source(kind, format!("{what}: {e}"), e)
    }
}

/// This crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
