//! The one error type of this crate.

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

turnpike_schemas::error_type!(ErrorKind);

impl Error {
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
