//! Ingress: the one way an event reaches a lane. It validates the event, checks that the
//! conversation exists and belongs to the caller, binds the caller's identity, and publishes.
//! A refused event never reaches a lane.
//!
//! What it reads per event is remembered per process (shared by clones), for conversations in
//! use — at most [`MEMO_LIMIT`] of each kind, none unused for [`MEMO_IDLE`] (open marks: for
//! [`OPEN_FOR`]; see [`crate::recent`]): memory that follows the conversations in use, not
//! every conversation ever seen:
//! - directory entries, which never change once written (but a conversation may be deleted);
//! - that a conversation is closed, which never changes back;
//! - that it is open (closed nor deleted), for [`OPEN_FOR`]: a close or a deletion through this
//!   ingress's process is seen at once ([`Ingress::forget_open`], [`Ingress::forget`]), one
//!   through another process within that time. (Checking and publishing were never one step:
//!   an event racing a close could always slip in.)
//!
//! Grants are not remembered: a caller who is not the owner is checked against the store every
//! time, so a revoked grant refuses the next event.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use turnpike_artifactory::{Conversations, DirectoryEntry};
use turnpike_schemas::entry::IngressDirective;
use turnpike_schemas::{
    Address, ConversationId, Event, EventBody, EventId, Identity, Origin, TenantId,
};

use crate::bus::{now_ms, Bus, Published};
use crate::error::{Error, ErrorKind, Result};
use crate::recent::Recent;

/// How long a conversation seen open is taken to be open without looking again.
pub const OPEN_FOR: Duration = Duration::from_secs(1);

/// The most conversations each part of the memo remembers; past it, the least recently used
/// goes first. (An entry is kept without its instructions, about 400 bytes: the memo stays
/// under 2 MiB.)
pub const MEMO_LIMIT: usize = 4096;
/// How long a conversation nobody sends to stays remembered.
pub const MEMO_IDLE: Duration = Duration::from_secs(60);

/// Publishes events on behalf of authenticated callers.
#[derive(Clone)]
pub struct Ingress {
    bus: Arc<dyn Bus>,
    conversations: Conversations,
    directive: Option<IngressDirective>,
    budgets: Arc<Vec<crate::usage::Budget>>,
    memo: Arc<Memo>,
}

/// What ingress remembers (see the module's contract).
struct Memo {
    entries: Mutex<Recent<ConversationId, DirectoryEntry>>,
    open: Mutex<Recent<ConversationId, Instant>>,
    closed: Mutex<Recent<ConversationId, ()>>,
}

impl Default for Memo {
    fn default() -> Self {
        Self {
            entries: Mutex::new(Recent::new(MEMO_LIMIT, MEMO_IDLE)),
            open: Mutex::new(Recent::new(MEMO_LIMIT, OPEN_FOR)),
            closed: Mutex::new(Recent::new(MEMO_LIMIT, MEMO_IDLE)),
        }
    }
}

/// Remembers `value` for `key`.
fn remember<V>(map: &Mutex<Recent<ConversationId, V>>, key: ConversationId, value: V) {
    map.lock().expect("ingress memo lock").put(key, value);
}

/// An event a trigger (a schedule's firing, a webhook delivery) decided durably before
/// publishing it: published under this id and key, whoever retries.
#[derive(Debug, Clone)]
pub struct Trigger {
    pub id: EventId,
    /// The idempotency key (deduplicated on the bus within its window).
    pub key: String,
    /// What sent it: its turn is a session's.
    pub origin: Origin,
}

impl Ingress {
    pub fn new(bus: Arc<dyn Bus>, conversations: Conversations) -> Self {
        Self {
            bus,
            conversations,
            directive: None,
            budgets: Arc::default(),
            memo: Arc::default(),
        }
    }

    /// This process closed `conversation`: the next event looks again (and finds it closed).
    pub fn forget_open(&self, conversation: ConversationId) {
        self.memo
            .open
            .lock()
            .expect("ingress memo lock")
            .pop(&conversation);
    }

    /// This process deleted `conversation`: nothing of it is remembered.
    pub fn forget(&self, conversation: ConversationId) {
        self.forget_open(conversation);
        self.memo
            .entries
            .lock()
            .expect("ingress memo lock")
            .pop(&conversation);
    }

    /// The directory entry, if `caller` may send to it (its owner, or a grantee — checked in
    /// the store every time); from the memo without its instructions and origin.
    async fn entry_for(
        &self,
        conversation: ConversationId,
        tenant: &TenantId,
        caller: &Identity,
    ) -> Result<DirectoryEntry> {
        let directory = self.conversations.directory();
        let as_error = |e: turnpike_artifactory::Error| {
            // Missing and forbidden look the same; a store that cannot answer is not "not
            // found" (the caller should retry, not give up).
            let kind = match e.kind() {
                turnpike_artifactory::ErrorKind::NotFound => ErrorKind::NotFound,
                _ => ErrorKind::Unavailable,
            };
            Error::with_source(kind, e.to_string(), e)
        };
        let known = self
            .memo
            .entries
            .lock()
            .expect("ingress memo lock")
            .get(&conversation)
            .cloned();
        if let Some(entry) = known {
            if &entry.tenant == tenant && &entry.owner == caller {
                return Ok(entry);
            }
            return directory
                .lookup(conversation, tenant, caller)
                .await
                .map_err(as_error);
        }
        let entry = directory
            .lookup(conversation, tenant, caller)
            .await
            .map_err(as_error)?;
        // Kept without what ingress does not read (instructions may be 16 KiB).
        let kept = DirectoryEntry {
            instructions: None,
            started_by: None,
            ..entry.clone()
        };
        remember(&self.memo.entries, conversation, kept);
        Ok(entry)
    }

    /// Whether `conversation` is closed (see the module's contract for what is remembered).
    async fn closed(&self, conversation: ConversationId) -> Result<bool> {
        if self
            .memo
            .closed
            .lock()
            .expect("ingress memo lock")
            .get(&conversation)
            .is_some()
        {
            return Ok(true);
        }
        let fresh = self
            .memo
            .open
            .lock()
            .expect("ingress memo lock")
            .get(&conversation)
            .is_some_and(|seen| seen.elapsed() < OPEN_FOR);
        if fresh {
            return Ok(false);
        }
        let seen = Instant::now();
        let closed = self
            .conversations
            .directory()
            .closed_at(conversation)
            .await?
            .is_some();
        if !closed {
            // Still there? A conversation deleted elsewhere is seen within OPEN_FOR.
            if let Err(e) = self
                .conversations
                .directory()
                .lookup_unchecked(conversation)
                .await
            {
                if e.kind() == turnpike_artifactory::ErrorKind::NotFound {
                    self.forget(conversation);
                    return Err(Error::with_source(ErrorKind::NotFound, e.to_string(), e));
                }
                return Err(e.into());
            }
        }
        if closed {
            remember(&self.memo.closed, conversation, ());
        } else {
            remember(&self.memo.open, conversation, seen);
        }
        Ok(closed)
    }

    /// Attaches `directive` to every event this ingress accepts (a deployment's policy: it can
    /// only lower an agent's budgets or add a required approver).
    pub fn with_directive(mut self, directive: IngressDirective) -> Self {
        self.directive = Some(directive);
        self
    }

    /// Refuses messages and follow-ups (what starts model calls) while a budget that applies
    /// is spent, reading the usage ledger for each.
    pub fn with_budgets(mut self, budgets: Vec<crate::usage::Budget>) -> Self {
        self.budgets = Arc::new(budgets);
        self
    }

    /// Submits `body` to `conversation` as `caller` (its owner, or an identity it was shared
    /// with). A retry with the same idempotency key is accepted once. A closed conversation
    /// refuses events (`Closed`); a message or follow-up under a spent budget is refused
    /// (`BudgetSpent`), other events (a stop, an answer) still pass.
    pub async fn submit(
        &self,
        tenant: &TenantId,
        caller: &Identity,
        conversation: ConversationId,
        body: EventBody,
        idempotency_key: Option<String>,
    ) -> Result<(Event, Published)> {
        self.publish(tenant, caller, conversation, body, idempotency_key, None)
            .await
    }

    /// Submits `body` as event `id` unless that event is on the lane already after
    /// `lane_after` (the lane's last sequence before the event was decided): a trigger that
    /// claimed its event durably (a schedule's firing, a webhook delivery) publishes it once
    /// however often it retries, within the bus's duplicate window (same id and key) and past
    /// it (the lane is looked at first). Found there: `duplicate`, with its sequence.
    pub async fn submit_once(
        &self,
        tenant: &TenantId,
        caller: &Identity,
        conversation: ConversationId,
        body: EventBody,
        trigger: Trigger,
        lane_after: u64,
    ) -> Result<Published> {
        if let Some(seq) = self
            .find_on_lane(conversation, lane_after, trigger.id)
            .await?
        {
            return Ok(Published {
                seq,
                duplicate: true,
            });
        }
        self.submit_as(tenant, caller, conversation, body, trigger)
            .await
            .map(|(_, published)| published)
    }

    /// The sequence of event `id` on the lane after `after`, if it is there.
    pub async fn find_on_lane(
        &self,
        conversation: ConversationId,
        after: u64,
        id: EventId,
    ) -> Result<Option<u64>> {
        const PAGE: usize = 256;
        let mut from = after;
        loop {
            let page = match self.bus.read_lane(conversation, from, None, PAGE).await {
                Ok(page) => page,
                // A message this binary cannot read is not the event it wrote.
                Err(e) if e.kind() == ErrorKind::Unreadable => return Ok(None),
                Err(e) => return Err(e),
            };
            if let Some(found) = page.iter().find(|m| m.event.id == id) {
                return Ok(Some(found.seq));
            }
            match page.last() {
                Some(last) if page.len() == PAGE => from = last.seq,
                _ => return Ok(None),
            }
        }
    }

    /// Submits like [`Self::submit`] the event a trigger decided ahead (its id, key and
    /// origin): a trigger that decided its event before publishing it (a schedule's claim)
    /// publishes the same event however often it retries.
    pub async fn submit_as(
        &self,
        tenant: &TenantId,
        caller: &Identity,
        conversation: ConversationId,
        body: EventBody,
        trigger: Trigger,
    ) -> Result<(Event, Published)> {
        let Trigger { id, key, origin } = trigger;
        self.publish(
            tenant,
            caller,
            conversation,
            body,
            Some(key),
            Some((id, origin)),
        )
        .await
    }

    async fn publish(
        &self,
        tenant: &TenantId,
        caller: &Identity,
        conversation: ConversationId,
        body: EventBody,
        idempotency_key: Option<String>,
        decided: Option<(EventId, Origin)>,
    ) -> Result<(Event, Published)> {
        let entry = self.entry_for(conversation, tenant, caller).await?;
        if self.closed(conversation).await? {
            return Err(Error::new(
                ErrorKind::Closed,
                format!("conversation {conversation} is closed; it accepts no more events"),
            ));
        }
        if !self.budgets.is_empty()
            && matches!(body, EventBody::Message { .. } | EventBody::FollowUp { .. })
        {
            let spent = crate::usage::check_budgets(
                self.bus.as_ref(),
                &self.budgets,
                &entry.tenant,
                &entry.app,
            )
            .await;
            match spent {
                Ok(Some(why)) => return Err(Error::new(ErrorKind::BudgetSpent, why)),
                Ok(None) => {}
                // Unknown spend is not spend (as at dispatch): the message is not refused for
                // a ledger that cannot be read.
                Err(e) => {
                    tracing::warn!(%conversation, error = %e, "could not read the usage ledger; budgets not checked");
                }
            }
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
        if let Some((id, origin)) = decided {
            event.id = id;
            event.origin = Some(origin);
        }
        event.idempotency_key = idempotency_key;
        event.directive = self.directive.clone();
        event.traceparent = crate::trace::current();
        event.validate()?;
        let published = self.bus.publish(&event).await?;
        Ok((event, published))
    }
}
