//! Hosted files and attachments: bytes a turn published or a user attached, stored under the
//! conversation's prefix and located by references (`conv:fi:…`, `conv:at:…`).

use std::sync::Arc;

use bytes::Bytes;
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};
use turnpike_schemas::{EventId, Family, RefPath, Reference, TurnId};

use crate::error::{Error, Result};
use crate::layout::ConversationPrefix;

/// Writes hosted files and attachments.
#[derive(Debug, Clone)]
pub struct Files {
    store: Arc<dyn ObjectStore>,
}

impl Files {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self { store }
    }

    /// The store the files are in.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// Hosts `bytes` as `path` of `turn`, written by attempt `attempt` (created only if absent,
    /// under the attempt's own key; see [`crate::attempts`]); returns
    /// `conv:fi:<conv>/turn_<n>/<path>`, which resolves once the turn commits that attempt.
    pub async fn host(
        &self,
        prefix: &ConversationPrefix,
        turn: TurnId,
        attempt: u64,
        path: &RefPath,
        bytes: Bytes,
    ) -> Result<Reference> {
        // The attempt's own key: only this attempt writes it, so publishing the same path again
        // within the turn replaces it (the canonical key is created once, at promotion).
        let key = prefix.in_attempt(&prefix.hosted_file(turn, path), turn, attempt);
        self.store
            .put(&key, PutPayload::from(bytes))
            .await
            .map_err(|e| Error::store(&format!("hosting {path} of {turn}"), e))?;
        Ok(Reference::new(
            Family::hosted_file(),
            prefix.conversation(),
            turn,
            path.clone(),
        ))
    }

    /// Stores an attachment for the turn `turn` (the next one when it was uploaded); returns
    /// `conv:at:<conv>/turn_<n>/<id>/<name>`. `name` must be a valid path segment.
    pub async fn attach(
        &self,
        prefix: &ConversationPrefix,
        turn: TurnId,
        name: &str,
        bytes: Bytes,
    ) -> Result<Reference> {
        self.attach_as(prefix, turn, EventId::new(), name, bytes)
            .await
    }

    /// [`Self::attach`] under the id of the event that carries it: the same event stored
    /// again (a sender's retry) lands on the same object.
    pub async fn attach_as(
        &self,
        prefix: &ConversationPrefix,
        turn: TurnId,
        event: EventId,
        name: &str,
        bytes: Bytes,
    ) -> Result<Reference> {
        let path = RefPath::from_segments([event.to_string(), name.to_owned()]).map_err(|e| {
            Error::new(
                crate::ErrorKind::InvalidInput,
                format!("attachment name {name:?}: {e}"),
            )
        })?;
        self.store
            .put(&prefix.attachment(turn, &path), PutPayload::from(bytes))
            .await
            .map_err(|e| Error::store(&format!("storing attachment {name}"), e))?;
        Ok(Reference::new(
            Family::attachment(),
            prefix.conversation(),
            turn,
            path,
        ))
    }
}
