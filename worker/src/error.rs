//! The worker's error type: a kind the owner decides on, a message, and the source.

/// Why a turn or an owner stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Another worker took the conversation over (or this one may no longer write): our
    /// effects are fenced.
    Fenced,
    /// The turn's workspace could not be set up.
    Workspace,
    /// What a model, an app or a client produced breaks a rule of the runtime (e.g. more tool
    /// calls in one reply than a turn may record), or the record refused an entry: the turn
    /// fails with this reason, recorded once, and is not retried.
    Refused,
    /// No app or agent is hosted for the turn's address.
    Route,
    /// The model call failed (the source is the [`turnpike_agent::model::ModelError`]).
    Model,
    /// A remote app could not be reached, timed out, or broke the protocol: the turn fails
    /// with this reason, recorded once, and is not retried.
    App,
    /// The bus failed (the source is the router's error).
    Bus,
    /// The durable stores failed (the source is the artifactory's error).
    Store,
}

turnpike_schemas::error_type!(ErrorKind);

impl Error {
    /// Our effects are fenced: `why`.
    pub fn fenced(why: impl Into<String>) -> Self {
        Self::new(ErrorKind::Fenced, why)
    }

    /// A rule of the runtime refuses this: `why`.
    pub fn refused(why: impl Into<String>) -> Self {
        Self::new(ErrorKind::Refused, why)
    }

    /// A remote app failed: `why`.
    pub fn app(why: impl Into<String>) -> Self {
        Self::new(ErrorKind::App, why)
    }

    /// Nothing is hosted for this: `why`.
    pub fn route(why: impl Into<String>) -> Self {
        Self::new(ErrorKind::Route, why)
    }

    /// The workspace could not be set up: `why`.
    pub fn workspace(why: impl Into<String>) -> Self {
        Self::new(ErrorKind::Workspace, why)
    }

    /// Whether our effects are fenced.
    pub fn is_fenced(&self) -> bool {
        self.kind() == ErrorKind::Fenced
    }

    /// The store's error behind this one, if it is one.
    pub fn store_error(&self) -> Option<&turnpike_artifactory::Error> {
        self.source_as()
    }

    /// Maps an append failure: a moved head means someone else wrote (fenced); entries the
    /// record's rules refuse are a rule violation, which no retry can mend (refused).
    pub fn from_append(e: turnpike_artifactory::Error) -> Self {
        let kind = match e.kind() {
            turnpike_artifactory::ErrorKind::HeadMoved => ErrorKind::Fenced,
            turnpike_artifactory::ErrorKind::InvalidInput => ErrorKind::Refused,
            _ => ErrorKind::Store,
        };
        Self::with_source(kind, e.to_string(), e)
    }
}

impl From<turnpike_agent::model::ModelError> for Error {
    fn from(e: turnpike_agent::model::ModelError) -> Self {
        Self::with_source(ErrorKind::Model, e.to_string(), e)
    }
}

impl From<turnpike_lifecycle::Fenced> for Error {
    fn from(e: turnpike_lifecycle::Fenced) -> Self {
        Self::with_source(ErrorKind::Fenced, e.to_string(), e)
    }
}

/// The harness's error: the worker's own, passed through it, comes back unchanged; the
/// harness's kinds map to the same kinds here.
impl From<turnpike_agent::Error> for Error {
    fn from(e: turnpike_agent::Error) -> Self {
        use turnpike_agent::ErrorKind as Agent;
        let e = match e.into_host::<Error>() {
            Ok(ours) => return ours,
            Err(e) => e,
        };
        let kind = match e.kind() {
            Agent::Refused => ErrorKind::Refused,
            Agent::Route => ErrorKind::Route,
            Agent::Model => ErrorKind::Model,
            Agent::App => ErrorKind::App,
            _ => ErrorKind::Store,
        };
        let message = e.to_string();
        match e.into_source() {
            Some(source) => Self::with_source(kind, message, source),
            None => Self::new(kind, message),
        }
    }
}

impl From<Error> for turnpike_agent::Error {
    fn from(e: Error) -> Self {
        turnpike_agent::Error::host(e)
    }
}

impl From<turnpike_router::Error> for Error {
    fn from(e: turnpike_router::Error) -> Self {
        Self::with_source(ErrorKind::Bus, e.to_string(), e)
    }
}

impl From<turnpike_artifactory::Error> for Error {
    fn from(e: turnpike_artifactory::Error) -> Self {
        Self::with_source(ErrorKind::Store, e.to_string(), e)
    }
}
