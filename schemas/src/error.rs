//! The one error type of this crate.

use thiserror::Error;

/// What was wrong with a piece of input, as a kind the caller can match on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchemaErrorKind {
    /// An id of the wrong shape.
    InvalidId,
    /// An identity that is not `provider:external_id` or `provider:scope:external_id`.
    InvalidIdentity,
    /// A reference outside grammar v1.
    InvalidReference,
    /// An event that fails validation (version, sizes, fields).
    InvalidEvent,
    /// A record entry whose payload does not match its kind.
    InvalidEntry,
}

/// Input that does not follow a schema; the message says what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct SchemaError {
    kind: SchemaErrorKind,
    message: String,
}

impl SchemaError {
    pub(crate) fn new(kind: SchemaErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    pub(crate) fn invalid_id(what: &str, input: &str, why: &str) -> Self {
        Self::new(
            SchemaErrorKind::InvalidId,
            format!("invalid {what} {:?}: {why}", truncate(input)),
        )
    }

    /// The kind of problem.
    pub fn kind(&self) -> &SchemaErrorKind {
        &self.kind
    }
}

/// Keeps error messages short when the input is long.
pub(crate) fn truncate(input: &str) -> String {
    const MAX: usize = 80;
    if input.chars().count() <= MAX {
        input.to_owned()
    } else {
        let head: String = input.chars().take(MAX).collect();
        format!("{head}…")
    }
}
