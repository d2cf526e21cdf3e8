//! The index's one error type.

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

turnpike_schemas::error_type!(ErrorKind);

impl Error {
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
