//! The index's one error type.

use std::fmt;

/// What went wrong, for callers that branch on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request itself is wrong (an empty query, a bad page token, a dimension mismatch).
    Invalid,
    /// The index backend (Postgres, the embedded files) could not be reached or failed: retry.
    Unavailable,
    /// The embedder failed (model files missing, the endpoint refused).
    Embedder,
    /// Stored data could not be read back.
    Corrupt,
}

/// An index error: a kind and a message that says what was wrong.
#[derive(Debug, thiserror::Error)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    pub fn with_source(
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

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, message)
    }

    pub(crate) fn unavailable(
        what: &str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        let message = format!("{what}: {source}");
        Self::with_source(ErrorKind::Unavailable, message, source)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
