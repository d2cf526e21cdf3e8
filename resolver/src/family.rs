//! What a family's resolver is given (an [`AuthorizedReference`]) and gives back (bytes, a
//! stream, or a [`ResolveError`]).

use async_trait::async_trait;
use bytes::Bytes;
use thiserror::Error;
use turnpike_artifactory::ConversationPrefix;
use turnpike_schemas::{Family, Reference};

/// Why a reference did not resolve.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// Missing, or not visible to the caller: the two are never told apart.
    #[error("not found: {0}")]
    NotFound(String),
    /// The text is not a reference (says what is wrong; reveals nothing about any object).
    #[error("{0}")]
    Invalid(String),
    /// A store failed; retry later.
    #[error("the store failed while resolving: {0}")]
    Unavailable(String),
}

impl ResolveError {
    pub(crate) fn not_found(reference: &Reference) -> Self {
        ResolveError::NotFound(reference.to_string())
    }
}

/// What a reference resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub bytes: Bytes,
    pub media_type: String,
}

/// What a reference resolved to, not read yet: the bytes come as a stream, so a large file is
/// never held in memory whole.
pub struct ResolvedStream {
    pub stream: futures::stream::BoxStream<'static, Result<Bytes, ResolveError>>,
    /// The size in bytes, when the store knows it before reading.
    pub size: Option<u64>,
    pub media_type: String,
}

impl ResolvedStream {
    /// A stream of bytes already read.
    pub fn whole(resolved: Resolved) -> Self {
        use futures::StreamExt as _;
        Self {
            size: Some(resolved.bytes.len() as u64),
            stream: futures::stream::once(async move { Ok(resolved.bytes) }).boxed(),
            media_type: resolved.media_type,
        }
    }
}

/// A reference the caller's identity may read. Private fields and one constructor
/// (`Resolver::authorize`): a family resolver cannot be handed an unchecked reference.
#[derive(Debug, Clone)]
pub struct AuthorizedReference {
    pub(crate) reference: Reference,
    pub(crate) prefix: ConversationPrefix,
}

impl AuthorizedReference {
    /// The reference.
    pub fn reference(&self) -> &Reference {
        &self.reference
    }

    /// Where the conversation's objects are.
    pub fn prefix(&self) -> &ConversationPrefix {
        &self.prefix
    }
}

/// Resolves the references of one family.
#[async_trait]
pub trait FamilyResolver: Send + Sync + 'static {
    /// The family this resolver serves.
    fn family(&self) -> Family;

    /// The bytes of an authorised reference, or `NotFound` when there are none.
    async fn resolve(&self, reference: &AuthorizedReference) -> Result<Resolved, ResolveError>;

    /// The same bytes as a stream (families of large objects read them as they go; the
    /// default reads them whole first).
    async fn open(&self, reference: &AuthorizedReference) -> Result<ResolvedStream, ResolveError> {
        Ok(ResolvedStream::whole(self.resolve(reference).await?))
    }
}
