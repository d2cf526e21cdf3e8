//! The worker's error type.

use thiserror::Error;

/// Why a turn or an owner stopped.
#[derive(Debug, Error)]
pub enum Error {
    /// Another worker took the conversation over: our effects are fenced.
    #[error("fenced: {0}")]
    Fenced(String),
    /// The turn's workspace could not be set up.
    #[error("{0}")]
    Workspace(String),
    /// What a model, an app or a client produced breaks a rule of the runtime (e.g. more tool
    /// calls in one reply than a turn may record): the turn fails with this reason, recorded
    /// once, and is not retried.
    #[error("{0}")]
    Refused(String),
    /// No app or agent is hosted for the turn's address.
    #[error("{0}")]
    Route(String),
    /// The model call failed.
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error(transparent)]
    Bus(#[from] turnpike_router::Error),
    #[error(transparent)]
    Artifactory(#[from] turnpike_artifactory::Error),
}

impl Error {
    /// Maps an append failure: a moved head means someone else wrote (fenced); entries the
    /// record's rules refuse are a rule violation, which no retry can mend (refused).
    pub fn from_append(e: turnpike_artifactory::Error) -> Self {
        match e.kind() {
            turnpike_artifactory::ErrorKind::HeadMoved => Error::Fenced(e.to_string()),
            turnpike_artifactory::ErrorKind::InvalidInput => Error::Refused(e.to_string()),
            _ => Error::Artifactory(e),
        }
    }
}

/// This crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
