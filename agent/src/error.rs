//! The harness's error type: a kind the worker decides on, a message, and the source.

/// Why the harness could not finish a turn's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// What a model, an app or a client produced breaks a rule of the runtime (e.g. more tool
    /// calls in one reply than a turn may record): the turn fails with this reason, recorded
    /// once, and is not retried.
    Refused,
    /// No app or agent is hosted for the turn's address.
    Route,
    /// The model call failed (the source is the [`crate::model::ModelError`]).
    Model,
    /// A remote app could not be reached, timed out, or broke the protocol: the turn fails
    /// with this reason, recorded once, and is not retried.
    App,
    /// The host the turn runs on failed (a commit was fenced, a store is down): the source is
    /// the host's own error, which it takes back unchanged (see [`Error::into_host`]).
    Host,
}

turnpike_schemas::error_type!(ErrorKind);

impl Error {
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

    /// The host failed with `e`; the host gets `e` back from [`Self::into_host`].
    pub fn host<E: std::error::Error + Send + Sync + 'static>(e: E) -> Self {
        Self::with_source(ErrorKind::Host, e.to_string(), e)
    }

    /// The host's own error, when this is one of its errors passed through the harness;
    /// otherwise this error.
    pub fn into_host<E: std::error::Error + Send + Sync + 'static>(self) -> Result<E, Self> {
        if self.kind() != ErrorKind::Host || self.source_as::<E>().is_none() {
            return Err(self);
        }
        let source = self.into_source().expect("a host error has a source");
        Ok(*source.downcast::<E>().expect("checked above"))
    }
}

impl From<crate::model::ModelError> for Error {
    fn from(e: crate::model::ModelError) -> Self {
        Self::with_source(ErrorKind::Model, e.to_string(), e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Fenced;

    impl std::fmt::Display for Fenced {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("fenced")
        }
    }

    impl std::error::Error for Fenced {}

    #[test]
    fn a_host_error_comes_back_to_the_host_unchanged() {
        let e = Error::host(Fenced);
        assert_eq!(
            (e.kind(), e.to_string()),
            (ErrorKind::Host, "fenced".into())
        );
        assert_eq!(e.into_host::<Fenced>().unwrap(), Fenced);
        let refused = Error::refused("no");
        assert_eq!(
            refused.into_host::<Fenced>().unwrap_err().kind(),
            ErrorKind::Refused
        );
    }
}
