//! The resolver: (bound identity, reference) → bytes, or a typed denial.
//!
//! A reference only locates; it never authorises. Resolution first authorises the identity for
//! the reference's conversation — producing an [`AuthorizedReference`], which only this crate
//! can construct — and then hands it to the resolver registered for its family. Another
//! identity's object yields exactly the same [`ResolveError::NotFound`] as a missing one: same
//! variant, same message, no bytes, no existence oracle.
//!
//! # Layout
//! - [`Resolver`]: authorisation and dispatch by family
//! - [`family`](FamilyResolver): what a family's resolver is given and gives back
//! - [`families`]: the built-in families — `fi` (files a turn hosted), `tl` (turn logs)
//!
//! The book: `book/src/operating/security.md` (and `book/src/SUMMARY.md` for the rest).

pub mod families;
mod family;

pub use family::{AuthorizedReference, FamilyResolver, ResolveError, Resolved, ResolvedStream};

use std::collections::HashMap;
use std::sync::Arc;

use turnpike_artifactory::Directory;
use turnpike_schemas::{Family, Identity, Reference, TenantId};

/// Authorises and dispatches references to the resolver of their family.
#[derive(Clone)]
pub struct Resolver {
    directory: Directory,
    families: HashMap<Family, Arc<dyn FamilyResolver>>,
    /// The tenant every resolution acts in (see [`Resolver::in_tenant`]).
    tenant: Option<TenantId>,
}

impl Resolver {
    /// A resolver with no families registered.
    pub fn new(directory: Directory) -> Self {
        Self {
            directory,
            families: HashMap::new(),
            tenant: None,
        }
    }

    /// This resolver acting in `tenant`: a reference to another tenant's conversation is
    /// `NotFound` whoever asks. Every resolution on behalf of a caller or a turn goes through a
    /// resolver scoped like this; an unscoped one takes the tenant from the conversation (for
    /// single-tenant tools).
    pub fn in_tenant(&self, tenant: &TenantId) -> Self {
        Self {
            tenant: Some(tenant.clone()),
            ..self.clone()
        }
    }

    /// A resolver with the built-in families (`fi`, `at`, `gi`, `tl`) over one object store.
    pub fn standard(directory: Directory, store: Arc<dyn object_store::ObjectStore>) -> Self {
        Self::new(directory)
            .register(Arc::new(families::HostedFiles::new(store.clone())))
            .register(Arc::new(families::HostedFiles::attachments(store.clone())))
            .register(Arc::new(families::ProjectVersions::new(store.clone())))
            .register(Arc::new(families::TurnLogBlocks::new(
                turnpike_artifactory::TurnLogs::new(store),
            )))
    }

    /// Registers (or replaces) the resolver of a family.
    pub fn register(mut self, family: Arc<dyn FamilyResolver>) -> Self {
        self.families.insert(family.family(), family);
        self
    }

    /// Checks that `identity` may read `reference`'s conversation.
    pub async fn authorize(
        &self,
        identity: &Identity,
        reference: &Reference,
    ) -> Result<AuthorizedReference, ResolveError> {
        let conversation = reference.conversation();
        let looked_up = match &self.tenant {
            Some(tenant) => self.directory.lookup(conversation, tenant, identity).await,
            None => match self.directory.lookup_unchecked(conversation).await {
                Ok(entry) => {
                    self.directory
                        .lookup(conversation, &entry.tenant, identity)
                        .await
                }
                Err(e) => Err(e),
            },
        };
        match looked_up {
            Ok(entry) => Ok(AuthorizedReference {
                reference: reference.clone(),
                prefix: entry.prefix(),
            }),
            Err(e) if e.kind() == turnpike_artifactory::ErrorKind::NotFound => {
                Err(ResolveError::not_found(reference))
            }
            Err(e) => Err(ResolveError::Unavailable(e.to_string())),
        }
    }

    /// Resolves reference text as `identity`.
    pub async fn resolve_str(
        &self,
        identity: &Identity,
        text: &str,
    ) -> Result<Resolved, ResolveError> {
        let reference: Reference = text
            .parse()
            .map_err(|e: turnpike_schemas::SchemaError| ResolveError::Invalid(e.to_string()))?;
        self.resolve(identity, &reference).await
    }

    /// Opens reference text as `identity`, for streaming (see [`ResolvedStream`]).
    pub async fn open_str(
        &self,
        identity: &Identity,
        text: &str,
    ) -> Result<ResolvedStream, ResolveError> {
        let reference: Reference = text
            .parse()
            .map_err(|e: turnpike_schemas::SchemaError| ResolveError::Invalid(e.to_string()))?;
        let authorized = self.authorize(identity, &reference).await?;
        match self.families.get(reference.family()) {
            Some(family) => family.open(&authorized).await,
            None => Err(ResolveError::not_found(&reference)),
        }
    }

    /// Resolves a reference as `identity`.
    pub async fn resolve(
        &self,
        identity: &Identity,
        reference: &Reference,
    ) -> Result<Resolved, ResolveError> {
        let authorized = self.authorize(identity, reference).await?;
        match self.families.get(reference.family()) {
            Some(family) => family.resolve(&authorized).await,
            // An unknown family locates nothing.
            None => Err(ResolveError::not_found(reference)),
        }
    }
}
