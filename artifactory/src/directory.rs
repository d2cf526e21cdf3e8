//! The conversation directory: which tenant owns a conversation and who may see it.
//!
//! One create-only object per conversation. Lookups for an identity that may not see a
//! conversation fail exactly like lookups of a conversation that does not exist.

use std::sync::Arc;

use object_store::{ObjectStore, ObjectStoreExt as _, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use turnpike_schemas::{AgentId, AppId, ConversationId, Identity, TenantId};

use crate::error::{Error, ErrorKind, Result};
use crate::layout::{
    closed_dir, closed_marker, directory_entry, grant_marker, grants_dir, idle_dir, idle_watch,
    owned_dir, owned_marker, ConversationPrefix,
};

/// What the directory knows of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectoryEntry {
    pub conversation: ConversationId,
    pub tenant: TenantId,
    pub owner: Identity,
    pub app: AppId,
    pub agent: AgentId,
    pub created_ms: u64,
    /// Instructions for every turn, given at creation (added to the agent's system prompt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// What started it when no person did (a schedule's firing, a hook's delivery): a
    /// session's conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_by: Option<turnpike_schemas::Origin>,
}

impl DirectoryEntry {
    /// The conversation's store prefix.
    pub fn prefix(&self) -> ConversationPrefix {
        ConversationPrefix::new(self.tenant.clone(), self.conversation)
    }
}

/// The directory in an object store.
#[derive(Debug, Clone)]
pub struct Directory {
    store: Arc<dyn ObjectStore>,
}

fn not_found(conversation: ConversationId) -> Error {
    Error::new(
        ErrorKind::NotFound,
        format!("conversation {conversation} not found"),
    )
}

impl Directory {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self { store }
    }

    /// Registers a conversation; fails with `AlreadyExists` if its id is taken. It is listed
    /// under its owner (see [`Directory::owned`]).
    pub async fn create(&self, entry: &DirectoryEntry) -> Result<()> {
        let bytes = serde_json::to_vec(entry).expect("directory entries serialise");
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        self.store
            .put_opts(
                &directory_entry(entry.conversation),
                PutPayload::from(bytes),
                opts,
            )
            .await
            .map_err(|e| Error::store(&format!("registering {}", entry.conversation), e))?;
        self.create_marker(entry).await
    }

    /// Lists a registered conversation under its owner (idempotent).
    pub async fn create_marker(&self, entry: &DirectoryEntry) -> Result<()> {
        self.store
            .put(
                &owned_marker(&entry.owner, entry.conversation),
                PutPayload::from_static(b""),
            )
            .await
            .map_err(|e| {
                Error::store(
                    &format!("listing {} under its owner", entry.conversation),
                    e,
                )
            })?;
        Ok(())
    }

    /// Looks a conversation up for `actor` acting in `tenant`: its owner and the identities it
    /// was shared with see it, and only from the conversation's own tenant; anyone else gets the
    /// same `NotFound` as for a conversation that does not exist — after the same store reads
    /// (the entry, then the grant), so the time taken tells nothing either.
    pub async fn lookup(
        &self,
        conversation: ConversationId,
        tenant: &TenantId,
        actor: &Identity,
    ) -> Result<DirectoryEntry> {
        let entry = match self.lookup_unchecked(conversation).await {
            Ok(entry) => Some(entry),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        if let Some(entry) = &entry {
            if &entry.tenant == tenant && &entry.owner == actor {
                return Ok(entry.clone());
            }
        }
        let granted = crate::store::exists(
            self.store.as_ref(),
            &grant_marker(conversation, actor),
            "reading the directory",
        )
        .await?;
        match entry {
            Some(entry) if granted && &entry.tenant == tenant => Ok(entry),
            _ => Err(not_found(conversation)),
        }
    }

    /// Looks a conversation up for its owner only (sharing and closing are the owner's), in
    /// the owner's tenant.
    pub async fn lookup_owned(
        &self,
        conversation: ConversationId,
        tenant: &TenantId,
        actor: &Identity,
    ) -> Result<DirectoryEntry> {
        let entry = self.lookup_unchecked(conversation).await?;
        if &entry.owner != actor || &entry.tenant != tenant {
            return Err(not_found(conversation));
        }
        Ok(entry)
    }

    /// Looks a conversation up for an admin of `tenant`: any conversation of that tenant, and
    /// `NotFound` for every other tenant's.
    pub async fn lookup_in_tenant(
        &self,
        conversation: ConversationId,
        tenant: &TenantId,
    ) -> Result<DirectoryEntry> {
        let entry = self.lookup_unchecked(conversation).await?;
        if &entry.tenant != tenant {
            return Err(not_found(conversation));
        }
        Ok(entry)
    }

    /// The ids of the conversations `owner` owns, newest first.
    pub async fn owned(&self, owner: &Identity) -> Result<Vec<ConversationId>> {
        use futures::TryStreamExt as _;
        let metas: Vec<_> = self
            .store
            .list(Some(&owned_dir(owner)))
            .try_collect()
            .await
            .map_err(|e| Error::store("listing conversations", e))?;
        let mut ids: Vec<ConversationId> = metas
            .iter()
            .filter_map(|m| m.location.filename()?.parse().ok())
            .collect();
        ids.sort_by(|a, b| b.cmp(a));
        Ok(ids)
    }

    /// Shares a conversation with `grantee` (idempotent).
    pub async fn grant(&self, conversation: ConversationId, grantee: &Identity) -> Result<()> {
        self.store
            .put(
                &grant_marker(conversation, grantee),
                PutPayload::from(grantee.to_string().into_bytes()),
            )
            .await
            .map_err(|e| Error::store(&format!("sharing {conversation}"), e))?;
        Ok(())
    }

    /// The identities a conversation is shared with (not its owner).
    pub async fn grantees(&self, conversation: ConversationId) -> Result<Vec<Identity>> {
        use futures::TryStreamExt as _;
        let dir = grants_dir(conversation);
        let metas: Vec<_> = self
            .store
            .list(Some(&dir))
            .try_collect()
            .await
            .map_err(|e| Error::store(&format!("listing the grants of {conversation}"), e))?;
        let mut out = Vec::new();
        for meta in metas {
            let bytes = match self.store.get(&meta.location).await {
                Ok(r) => r
                    .bytes()
                    .await
                    .map_err(|e| Error::store("reading a grant", e))?,
                // Revoked meanwhile.
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(Error::store("reading a grant", e)),
            };
            if let Some(identity) = std::str::from_utf8(&bytes)
                .ok()
                .and_then(|t| t.parse::<Identity>().ok())
            {
                out.push(identity);
            }
        }
        Ok(out)
    }

    /// Takes a grant back (idempotent).
    pub async fn revoke(&self, conversation: ConversationId, grantee: &Identity) -> Result<()> {
        match self
            .store
            .delete(&grant_marker(conversation, grantee))
            .await
        {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Error::store(&format!("unsharing {conversation}"), e)),
        }
    }

    /// Removes a conversation from the directory: its entry first (from then on nobody finds
    /// it), then its grants, its owner's listing, and last its closed marker (so a removal cut
    /// short never leaves a closed conversation open). Idempotent: a removal cut short is
    /// finished by running it again.
    pub async fn remove(&self, conversation: ConversationId, owner: &Identity) -> Result<()> {
        use futures::TryStreamExt as _;
        let mut paths: Vec<object_store::path::Path> = self
            .store
            .list(Some(&grants_dir(conversation)))
            .map_ok(|m| m.location)
            .try_collect()
            .await
            .map_err(|e| Error::store("listing grants to remove", e))?;
        paths.insert(0, directory_entry(conversation));
        paths.push(owned_marker(owner, conversation));
        paths.push(idle_watch(conversation));
        paths.push(closed_marker(conversation));
        for path in paths {
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::store(&format!("removing {path}"), e)),
            }
        }
        Ok(())
    }

    /// Every closed conversation with when it was closed (the marker's write time, ms since
    /// the epoch): one listing, no object read.
    pub async fn closed_list(&self) -> Result<Vec<(ConversationId, u64)>> {
        self.marker_times(&closed_dir(), "listing closed conversations")
            .await
    }

    /// Asks the idle sweep to look at a conversation: its owner let go of it, and its app
    /// closes idle conversations. Overwrites an earlier watch (its time is the last activity).
    pub async fn watch_idle(&self, conversation: ConversationId) -> Result<()> {
        self.store
            .put(&idle_watch(conversation), PutPayload::from_static(b""))
            .await
            .map(|_| ())
            .map_err(|e| Error::store(&format!("watching {conversation} for idleness"), e))
    }

    /// Drops a conversation's idle watch (gone already: fine).
    pub async fn unwatch_idle(&self, conversation: ConversationId) -> Result<()> {
        match self.store.delete(&idle_watch(conversation)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Error::store(&format!("unwatching {conversation}"), e)),
        }
    }

    /// Every watched conversation with when its watch was written (ms since the epoch): one
    /// listing, no object read.
    pub async fn idle_watches(&self) -> Result<Vec<(ConversationId, u64)>> {
        self.marker_times(&idle_dir(), "listing idle watches").await
    }

    /// The conversations of the markers under `dir`, with each marker's write time.
    async fn marker_times(
        &self,
        dir: &object_store::path::Path,
        doing: &str,
    ) -> Result<Vec<(ConversationId, u64)>> {
        use futures::TryStreamExt as _;
        let metas: Vec<_> = self
            .store
            .list(Some(dir))
            .try_collect()
            .await
            .map_err(|e| Error::store(doing, e))?;
        Ok(metas
            .into_iter()
            .filter_map(|m| {
                let id = m.location.filename()?.parse().ok()?;
                // A time before the epoch is not a time anyone can trust: skipped.
                let at = u64::try_from(m.last_modified.timestamp_millis()).ok()?;
                Some((id, at))
            })
            .collect())
    }

    /// Closes a conversation: it accepts no more events (idempotent; reading stays possible).
    pub async fn close(&self, conversation: ConversationId, at_ms: u64) -> Result<()> {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(
                &closed_marker(conversation),
                PutPayload::from(at_ms.to_string().into_bytes()),
                opts,
            )
            .await
        {
            Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
            Err(e) => Err(Error::store(&format!("closing {conversation}"), e)),
        }
    }

    /// When the conversation was closed (ms since the epoch), if it was.
    pub async fn closed_at(&self, conversation: ConversationId) -> Result<Option<u64>> {
        match self.store.get(&closed_marker(conversation)).await {
            Ok(r) => {
                let bytes = r
                    .bytes()
                    .await
                    .map_err(|e| Error::store(&format!("reading {conversation}"), e))?;
                Ok(Some(
                    std::str::from_utf8(&bytes)
                        .ok()
                        .and_then(|t| t.trim().parse().ok())
                        .unwrap_or(0),
                ))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Error::store(&format!("reading {conversation}"), e)),
        }
    }

    /// Every conversation, in id order (creation order): for the runtime's own sweeps (index
    /// rebuilds), never for callers.
    pub async fn list(&self) -> Result<Vec<DirectoryEntry>> {
        use futures::TryStreamExt as _;
        let dir = object_store::path::Path::from("directory/conversations");
        let metas: Vec<_> = self
            .store
            .list(Some(&dir))
            .try_collect()
            .await
            .map_err(|e| Error::store("listing conversations", e))?;
        let mut ids: Vec<ConversationId> = metas
            .iter()
            .filter_map(|m| m.location.filename()?.strip_suffix(".json")?.parse().ok())
            .collect();
        ids.sort();
        let mut entries = Vec::with_capacity(ids.len());
        for id in ids {
            entries.push(self.lookup_unchecked(id).await?);
        }
        Ok(entries)
    }

    /// Looks a conversation up with no access check: for the runtime itself, never for callers.
    pub async fn lookup_unchecked(&self, conversation: ConversationId) -> Result<DirectoryEntry> {
        let result = match self.store.get(&directory_entry(conversation)).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Err(not_found(conversation)),
            Err(e) => return Err(Error::store(&format!("looking up {conversation}"), e)),
        };
        let bytes = result
            .bytes()
            .await
            .map_err(|e| Error::store(&format!("looking up {conversation}"), e))?;
        serde_json::from_slice(&bytes).map_err(|e| {
            Error::with_source(
                ErrorKind::Corrupt,
                format!("the directory entry of {conversation} is unreadable: {e}"),
                e,
            )
        })
    }
}
