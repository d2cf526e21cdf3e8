//! The one error type of this crate, with kinds that map to outcomes in one place.

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
    /// A daily budget of the tenant or app is spent: nothing that would start model calls is
    /// accepted until it renews (midnight UTC).
    BudgetSpent,
    /// The lease is held by someone else, or was lost.
    LeaseLost,
    /// Stored data that cannot be read.
    Corrupt,
    /// A lane message this binary cannot read (see [`Error::unreadable`]): the caller parks it.
    Unreadable,
    /// The artifactory failed.
    Artifactory,
}

turnpike_schemas::error_type!(ErrorKind);

impl Error {
    /// A lane message that cannot be read, with its bytes (kept as the source).
    pub(crate) fn unreadable_message(message: Unreadable) -> Self {
        Self::with_source(
            ErrorKind::Unreadable,
            format!(
                "lane message {} is unreadable: {}",
                message.seq, message.reason
            ),
            message,
        )
    }

    /// The lane message that could not be read, for [`ErrorKind::Unreadable`].
    pub fn unreadable(&self) -> Option<&Unreadable> {
        self.source_as()
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

/// A lane message this binary cannot read (e.g. a newer event kind during a rolling upgrade),
/// with its bytes so that the reader can park it as a dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    pub seq: u64,
    pub bytes: Vec<u8>,
    pub reason: String,
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "lane message {} is unreadable: {}",
            self.seq, self.reason
        )
    }
}

impl std::error::Error for Unreadable {}
