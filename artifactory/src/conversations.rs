//! Conversations: the directory and the records together, behind the caller's identity.

use std::sync::Arc;

use object_store::{ObjectStore, ObjectStoreExt as _};
use turnpike_schemas::entry::ConversationOpened;
use turnpike_schemas::{AgentId, AppId, ConversationId, EntryBody, Identity, TenantId};

use crate::directory::{Directory, DirectoryEntry};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::{RecordSigner, TrustedKeys};
use crate::record::{Head, Record};
use crate::turnlogs::TurnLogs;

/// What a new conversation needs.
#[derive(Debug, Clone)]
pub struct NewConversation {
    pub tenant: TenantId,
    pub owner: Identity,
    pub app: AppId,
    pub agent: AgentId,
    pub at_ms: u64,
    /// Instructions for every turn (see [`DirectoryEntry::instructions`]).
    pub instructions: Option<String>,
    /// What started it when no person did (see [`DirectoryEntry::started_by`]).
    pub started_by: Option<turnpike_schemas::Origin>,
}

/// The conversations in one object store.
#[derive(Debug, Clone)]
pub struct Conversations {
    store: Arc<dyn ObjectStore>,
    directory: Directory,
    /// The keys every record's head is checked against, once set.
    keys: Option<Arc<TrustedKeys>>,
    /// Users' connections, once the deployment has a key to seal them with.
    connections: Option<crate::Connections>,
}

impl Conversations {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self {
            directory: Directory::new(store.clone()),
            store,
            keys: None,
            connections: None,
        }
    }

    /// Every record opened through these conversations trusts a head only when its last root
    /// is signed by one of `keys` (see [`Record::trusting`]).
    pub fn trusting(mut self, keys: TrustedKeys) -> Self {
        self.keys = Some(Arc::new(keys));
        self
    }

    /// Users' connections are sealed with `key` (without one there are none: the API says so).
    pub fn with_connection_key(mut self, key: crate::ConnectionKey) -> Self {
        self.connections = Some(crate::Connections::new(self.store.clone(), key));
        self
    }

    /// Users' connections, when the deployment has a connection key.
    pub fn connections(&self) -> Option<&crate::Connections> {
        self.connections.as_ref()
    }

    /// Outbound webhooks: users' subscriptions (sealed with the connection key, when there is
    /// one), waiting deliveries and dead letters.
    pub fn webhooks(&self) -> crate::Webhooks {
        crate::Webhooks::new(
            self.store.clone(),
            self.connections.as_ref().map(|c| c.key().clone()),
        )
    }

    /// The keys heads are checked against, once set.
    pub fn trusted_keys(&self) -> Option<&TrustedKeys> {
        self.keys.as_deref()
    }

    /// Whether heads are checked against trusted keys.
    pub fn is_trusting(&self) -> bool {
        self.keys.is_some()
    }

    /// The record of the conversation at `prefix` (checked against the trusted keys, if set).
    pub fn record(&self, prefix: crate::ConversationPrefix) -> Record {
        let record = Record::new(self.store.clone(), prefix);
        match &self.keys {
            Some(keys) => record.trusting(keys.clone()),
            None => record,
        }
    }

    /// The underlying store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The directory of conversations.
    pub fn directory(&self) -> &Directory {
        &self.directory
    }

    /// The tombstones of deleted conversations, in the same store.
    pub fn tombstones(&self) -> crate::Tombstones {
        crate::Tombstones::new(self.store.clone())
    }

    /// What owners asked the index to forget, in the same store.
    pub fn forgotten(&self) -> crate::Forgotten {
        crate::Forgotten::new(self.store.clone())
    }

    /// The turn logs in the same store.
    pub fn turn_logs(&self) -> TurnLogs {
        TurnLogs::new(self.store.clone())
    }

    /// The dead letters in the same store.
    pub fn dead_letters(&self) -> crate::DeadLetters {
        crate::DeadLetters::new(self.store.clone())
    }

    /// The committed turns' logs of a conversation, each checked against the digest its record
    /// holds (what replay re-runs).
    pub async fn recorded_logs(
        &self,
        entry: &DirectoryEntry,
    ) -> Result<Vec<turnpike_schemas::TurnLog>> {
        let record = self.record(entry.prefix());
        let transcript = crate::Transcript::from_entries(&record.entries().await?);
        let logs = self.turn_logs();
        let mut recorded = Vec::new();
        for view in &transcript.committed {
            let Some(complete) = &view.complete else {
                continue;
            };
            recorded.push(
                logs.read_checked(&entry.prefix(), view.turn, complete.log_sha256.as_deref())
                    .await?,
            );
        }
        Ok(recorded)
    }

    /// The open-turn marks in the same store.
    pub fn open_turns(&self) -> crate::OpenTurns {
        crate::OpenTurns::new(self.store.clone())
    }

    /// Creates a conversation: registers it, then commits its opening batch.
    pub async fn create(
        &self,
        signer: &RecordSigner,
        new: NewConversation,
    ) -> Result<(DirectoryEntry, Record, Head)> {
        self.create_as(signer, ConversationId::new(), new).await
    }

    /// Creates the conversation `id` (chosen ahead, e.g. in a schedule's claim), or finds it
    /// created already as `new` says — by an earlier try that a crash cut short, or by another
    /// process at the same time — and finishes opening its record. The same id registered for
    /// another tenant, owner, app or agent is `AlreadyExists`; a deleted one (tombstoned) is
    /// `NotFound`.
    pub async fn ensure(
        &self,
        signer: &RecordSigner,
        id: ConversationId,
        new: NewConversation,
    ) -> Result<(DirectoryEntry, Record, Head)> {
        // A deleted conversation stays deleted: its id is not made again.
        let tombstone = crate::layout::tombstone(&new.tenant, id);
        match self.store.head(&tombstone).await {
            Ok(_) => return Err(Error::new(ErrorKind::NotFound, format!("{id} was deleted"))),
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(Error::store("looking for a tombstone", e)),
        }
        match self.create_as(signer, id, new.clone()).await {
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            other => return other,
        }
        let entry = self.directory.lookup_unchecked(id).await?;
        if entry.tenant != new.tenant
            || entry.owner != new.owner
            || entry.app != new.app
            || entry.agent != new.agent
        {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("{id} exists as another conversation"),
            ));
        }
        // The owner's marker may be what the cut-short try did not write.
        self.directory.create_marker(&entry).await?;
        let record = self.record(entry.prefix());
        let head = record.head().await?;
        if head.leaves() > 0 {
            return Ok((entry, record, head));
        }
        let opened = EntryBody::ConversationOpened(ConversationOpened {
            tenant: new.tenant,
            owner: new.owner,
            app: new.app,
            agent: new.agent,
            at_ms: new.at_ms,
        });
        match record.append(signer, &head, &[opened]).await {
            Ok(head) => Ok((entry, record, head)),
            // Opened by the other creator meanwhile.
            Err(e) if e.kind() == ErrorKind::HeadMoved => {
                let head = record.head().await?;
                Ok((entry, record, head))
            }
            Err(e) => Err(e),
        }
    }

    async fn create_as(
        &self,
        signer: &RecordSigner,
        id: ConversationId,
        new: NewConversation,
    ) -> Result<(DirectoryEntry, Record, Head)> {
        let entry = DirectoryEntry {
            conversation: id,
            tenant: new.tenant.clone(),
            owner: new.owner.clone(),
            app: new.app.clone(),
            agent: new.agent.clone(),
            created_ms: new.at_ms,
            instructions: new.instructions.clone(),
            started_by: new.started_by.clone(),
        };
        self.directory.create(&entry).await?;
        let record = self.record(entry.prefix());
        let opened = EntryBody::ConversationOpened(ConversationOpened {
            tenant: new.tenant,
            owner: new.owner,
            app: new.app,
            agent: new.agent,
            at_ms: new.at_ms,
        });
        let head = record
            .append(signer, &record.head().await?, &[opened])
            .await?;
        Ok((entry, record, head))
    }

    /// Opens a conversation as `actor` of `tenant`: another identity's (or another tenant's)
    /// conversation is `NotFound`.
    pub async fn open(
        &self,
        conversation: ConversationId,
        tenant: &TenantId,
        actor: &Identity,
    ) -> Result<(DirectoryEntry, Record)> {
        let entry = self.directory.lookup(conversation, tenant, actor).await?;
        let record = self.record(entry.prefix());
        Ok((entry, record))
    }
}
