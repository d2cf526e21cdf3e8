//! Conversations: the directory and the records together, behind the caller's identity.

use std::sync::Arc;

use object_store::ObjectStore;
use turnpike_schemas::entry::ConversationOpened;
use turnpike_schemas::{AgentId, AppId, ConversationId, EntryBody, Identity, TenantId};

use crate::directory::{Directory, DirectoryEntry};
use crate::error::Result;
use crate::keys::RecordSigner;
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
}

/// The conversations in one object store.
#[derive(Debug, Clone)]
pub struct Conversations {
    store: Arc<dyn ObjectStore>,
    directory: Directory,
}

impl Conversations {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self {
            directory: Directory::new(store.clone()),
            store,
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

    /// The turn logs in the same store.
    pub fn turn_logs(&self) -> TurnLogs {
        TurnLogs::new(self.store.clone())
    }

    /// Creates a conversation: registers it, then commits its opening batch.
    pub async fn create(
        &self,
        signer: &RecordSigner,
        new: NewConversation,
    ) -> Result<(DirectoryEntry, Record, Head)> {
        let entry = DirectoryEntry {
            conversation: ConversationId::new(),
            tenant: new.tenant.clone(),
            owner: new.owner.clone(),
            app: new.app.clone(),
            agent: new.agent.clone(),
            created_ms: new.at_ms,
            instructions: new.instructions.clone(),
        };
        self.directory.create(&entry).await?;
        let record = Record::new(self.store.clone(), entry.prefix());
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

    /// Opens a conversation as `actor`: another identity's conversation is `NotFound`.
    pub async fn open(
        &self,
        conversation: ConversationId,
        actor: &Identity,
    ) -> Result<(DirectoryEntry, Record)> {
        let entry = self.directory.lookup(conversation, actor).await?;
        let record = Record::new(self.store.clone(), entry.prefix());
        Ok((entry, record))
    }
}
