//! Ingress: the one way an event reaches a lane. It validates the event, checks that the
//! conversation exists and belongs to the caller, binds the caller's identity, and publishes.
//! A refused event never reaches a lane.

use std::sync::Arc;

use turnpike_artifactory::Conversations;
use turnpike_schemas::entry::IngressDirective;
use turnpike_schemas::{Address, ConversationId, Event, EventBody, Identity, TenantId};

use crate::bus::{now_ms, Bus, Published};
use crate::error::{Error, ErrorKind, Result};

/// Publishes events on behalf of authenticated callers.
#[derive(Clone)]
pub struct Ingress {
    bus: Arc<dyn Bus>,
    conversations: Conversations,
    directive: Option<IngressDirective>,
}

impl Ingress {
    pub fn new(bus: Arc<dyn Bus>, conversations: Conversations) -> Self {
        Self {
            bus,
            conversations,
            directive: None,
        }
    }

    /// Attaches `directive` to every event this ingress accepts (a deployment's policy: it can
    /// only lower an agent's budgets or add a required approver).
    pub fn with_directive(mut self, directive: IngressDirective) -> Self {
        self.directive = Some(directive);
        self
    }

    /// Submits `body` to `conversation` as `caller` (its owner, or an identity it was shared
    /// with). A retry with the same idempotency key is accepted once. A closed conversation
    /// refuses events (`Closed`).
    pub async fn submit(
        &self,
        tenant: &TenantId,
        caller: &Identity,
        conversation: ConversationId,
        body: EventBody,
        idempotency_key: Option<String>,
    ) -> Result<(Event, Published)> {
        let entry = self
            .conversations
            .directory()
            .lookup(conversation, tenant, caller)
            .await
            .map_err(|e| {
                // Missing and forbidden look the same; a store that cannot answer is not
                // "not found" (the caller should retry, not give up).
                let kind = match e.kind() {
                    turnpike_artifactory::ErrorKind::NotFound => ErrorKind::NotFound,
                    _ => ErrorKind::Unavailable,
                };
                Error::with_source(kind, e.to_string(), e)
            })?;
        if self
            .conversations
            .directory()
            .closed_at(conversation)
            .await?
            .is_some()
        {
            return Err(Error::new(
                ErrorKind::Closed,
                format!("conversation {conversation} is closed; it accepts no more events"),
            ));
        }
        let mut event = Event::new(
            Address {
                tenant: entry.tenant,
                app: entry.app,
                agent: entry.agent,
                conversation,
                identity: caller.clone(),
            },
            body,
            now_ms(),
        );
        event.idempotency_key = idempotency_key;
        event.directive = self.directive.clone();
        event.validate()?;
        let published = self.bus.publish(&event).await?;
        Ok((event, published))
    }
}
