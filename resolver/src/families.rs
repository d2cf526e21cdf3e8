//! The built-in families.
//!
//! - `fi`: a file a turn hosted, `conv:fi:<conv>/turn_<n>/<path>` → `turns/turn_<n>/files/<path>`
//! - `at`: a file a user attached, `conv:at:<conv>/turn_<n>/<id>/<name>` →
//!   `attachments/turn_<n>/<id>/<name>`
//! - `gi`: a file of a project version, `conv:gi:<conv>/turn_<n>/<path>`
//! - `tl`: a turn log, `conv:tl:<conv>/turn_<n>/log.json` → the whole log, or
//!   `…/turn_<n>/blocks/<i>` → one block as JSON

use std::sync::Arc;

use async_trait::async_trait;
use object_store::{ObjectStore, ObjectStoreExt as _};
use turnpike_artifactory::TurnLogs;
use turnpike_schemas::Family;

use crate::family::{AuthorizedReference, FamilyResolver, ResolveError, Resolved, ResolvedStream};

fn store_error(e: object_store::Error, reference: &AuthorizedReference) -> ResolveError {
    match e {
        object_store::Error::NotFound { .. } => ResolveError::not_found(reference.reference()),
        other => ResolveError::Unavailable(other.to_string()),
    }
}

/// Files hosted by turns (`fi`) or attached by users (`at`): bytes at a key the layout derives
/// from the reference.
pub struct HostedFiles {
    store: Arc<dyn ObjectStore>,
    family: Family,
}

impl HostedFiles {
    /// Files hosted by turns: `conv:fi:…`.
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self {
            store,
            family: Family::hosted_file(),
        }
    }

    /// Files users attached: `conv:at:…`.
    pub fn attachments(store: Arc<dyn ObjectStore>) -> Self {
        Self {
            store,
            family: Family::attachment(),
        }
    }
}

/// A media type from a file name's extension (the store keeps bytes only).
pub fn media_type_of(name: &str) -> &'static str {
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "txt" | "md" | "log" => "text/plain",
        "csv" => "text/csv",
        "json" => "application/json",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "pdf" => "application/pdf",
        "py" => "text/x-python",
        "html" => "text/html",
        _ => "application/octet-stream",
    }
}

#[async_trait]
impl FamilyResolver for HostedFiles {
    fn family(&self) -> Family {
        self.family.clone()
    }

    async fn open(&self, reference: &AuthorizedReference) -> Result<ResolvedStream, ResolveError> {
        use futures::{StreamExt as _, TryStreamExt as _};
        let object = if self.family == Family::attachment() {
            self.attachment(reference).await?
        } else {
            let r = reference.reference();
            turnpike_artifactory::attempts::open_committed(
                &self.store,
                reference.prefix(),
                r.turn(),
                &reference.prefix().hosted_file(r.turn(), r.path()),
            )
            .await
            .map_err(|e| committed_error(e, reference))?
            .ok_or_else(|| ResolveError::not_found(r))?
            .object
        };
        Ok(ResolvedStream {
            size: Some(object.meta.size),
            stream: object
                .into_stream()
                .map_err(|e| ResolveError::Unavailable(e.to_string()))
                .boxed(),
            media_type: media_type_of_reference(reference),
        })
    }

    async fn resolve(&self, reference: &AuthorizedReference) -> Result<Resolved, ResolveError> {
        let bytes = if self.family == Family::attachment() {
            self.attachment(reference)
                .await?
                .bytes()
                .await
                .map_err(|e| store_error(e, reference))?
        } else {
            // A hosted file is the committed attempt's, whether or not it is promoted yet (and
            // reading it whole promotes it on the way).
            let r = reference.reference();
            turnpike_artifactory::attempts::get_committed(
                &self.store,
                reference.prefix(),
                r.turn(),
                &reference.prefix().hosted_file(r.turn(), r.path()),
            )
            .await
            .map_err(|e| committed_error(e, reference))?
            .ok_or_else(|| ResolveError::not_found(r))?
        };
        Ok(Resolved {
            bytes,
            media_type: media_type_of_reference(reference),
        })
    }
}

impl HostedFiles {
    /// The object of an attachment, not read yet.
    async fn attachment(
        &self,
        reference: &AuthorizedReference,
    ) -> Result<object_store::GetResult, ResolveError> {
        let r = reference.reference();
        self.store
            .get(&reference.prefix().attachment(r.turn(), r.path()))
            .await
            .map_err(|e| store_error(e, reference))
    }
}

/// A committed turn object's read failure, as the resolver reports it.
fn committed_error(
    e: turnpike_artifactory::Error,
    reference: &AuthorizedReference,
) -> ResolveError {
    match e.kind() {
        turnpike_artifactory::ErrorKind::NotFound => ResolveError::not_found(reference.reference()),
        _ => ResolveError::Unavailable(e.to_string()),
    }
}

/// The media type a reference's file name says.
fn media_type_of_reference(reference: &AuthorizedReference) -> String {
    let name = reference
        .reference()
        .path()
        .segments()
        .last()
        .map(String::as_str)
        .unwrap_or_default();
    media_type_of(name).to_owned()
}

/// Turn logs and their blocks.
pub struct TurnLogBlocks {
    logs: TurnLogs,
}

impl TurnLogBlocks {
    pub fn new(logs: TurnLogs) -> Self {
        Self { logs }
    }
}

#[async_trait]
impl FamilyResolver for TurnLogBlocks {
    fn family(&self) -> Family {
        Family::turn_log()
    }

    async fn resolve(&self, reference: &AuthorizedReference) -> Result<Resolved, ResolveError> {
        let r = reference.reference();
        let segments = r.path().segments();
        let block = match segments {
            [log] if log == "log.json" => None,
            [blocks, i] if blocks == "blocks" => match i.parse::<usize>() {
                Ok(i) => Some(i),
                Err(_) => return Err(ResolveError::not_found(r)),
            },
            _ => return Err(ResolveError::not_found(r)),
        };
        let log = self
            .logs
            .read(reference.prefix(), r.turn())
            .await
            .map_err(|e| {
                if e.kind() == turnpike_artifactory::ErrorKind::NotFound {
                    ResolveError::not_found(r)
                } else {
                    ResolveError::Unavailable(e.to_string())
                }
            })?;
        let json = match block {
            None => serde_json::to_vec(&log),
            Some(i) => match log.blocks.get(i) {
                Some(b) => serde_json::to_vec(b),
                None => return Err(ResolveError::not_found(r)),
            },
        }
        .expect("turn logs serialise");
        Ok(Resolved {
            bytes: json.into(),
            media_type: "application/json".into(),
        })
    }
}

/// Project versions: `conv:gi:<conv>/turn_<n>/<path>` → the file at the version turn `n`
/// published.
pub struct ProjectVersions {
    store: Arc<dyn ObjectStore>,
}

impl ProjectVersions {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self { store }
    }
}

#[async_trait]
impl FamilyResolver for ProjectVersions {
    fn family(&self) -> Family {
        Family::git()
    }

    async fn resolve(&self, reference: &AuthorizedReference) -> Result<Resolved, ResolveError> {
        let r = reference.reference();
        let lineage =
            turnpike_artifactory::git::Lineage::new(self.store.clone(), reference.prefix().clone());
        let unavailable = |e: turnpike_artifactory::Error| ResolveError::Unavailable(e.to_string());
        let Some(commit) = lineage.ref_of(r.turn()).await.map_err(unavailable)? else {
            return Err(ResolveError::not_found(r));
        };
        match lineage.read_file(commit, r.path()).await {
            Ok(Some(bytes)) => {
                let name = r
                    .path()
                    .segments()
                    .last()
                    .map(String::as_str)
                    .unwrap_or_default();
                Ok(Resolved {
                    bytes,
                    media_type: media_type_of(name).to_owned(),
                })
            }
            Ok(None) => Err(ResolveError::not_found(r)),
            Err(e) if e.kind() == turnpike_artifactory::ErrorKind::NotFound => {
                Err(ResolveError::not_found(r))
            }
            Err(e) => Err(unavailable(e)),
        }
    }
}
