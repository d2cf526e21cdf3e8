//! Outbound webhooks: what a turn's end (or a schedule's firing) tells subscribers, and the
//! dispatcher that delivers it.
//!
//! # Contract
//! - **Outbox.** A committed turn's outcome (completed, failed, cancelled, parked) becomes one
//!   [`Message`] whose id is fixed by the turn (`msg_` + a hash of tenant, conversation and
//!   turn), enqueued as one delivery per matching subscriber during the promotion: after batch
//!   two, before the open-turn mark is cleared. An owner that dies first leaves the mark, and
//!   whoever finishes the promotion enqueues the same deliveries (create-only, same keys): no
//!   outcome is lost, none is enqueued twice while its first attempt waits (after that, a
//!   redone promotion may send it twice, under the same `webhook-id`).
//! - **Subscribers.** An app's manifest webhooks hear of that app's turns in their tenant;
//!   a user's subscriptions hear of the conversations they own (or one of them). Nothing of a
//!   tenant reaches another's subscriber. A subscription made moments ago is seen by turns that
//!   end from about [`SUBSCRIBERS_FRESH`] later (subscribers are cached that long).
//! - **Delivery.** Shards of waiting deliveries are held under leases ([`crate::shards`]).
//!   Each attempt resolves the URL, checks every address against the deployment's outbound
//!   rules (invariant 12: internal addresses refused unless allowed), connects only to those,
//!   follows no redirect, signs per Standard Webhooks (`webhook-id` the message's id on every
//!   attempt) and counts as delivered on a 2xx only. A failure waits for the next step of the
//!   backoff; past the last, the delivery is a dead letter. An attempt never outlasts its
//!   shard's lease (cut off, not counted, when it might). At least once: a holder that dies
//!   after the POST and before it notes the delivery sends it again, under the same id.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use tracing::{debug, warn};
use turnpike_artifactory::webhooks::{
    owner_hash, A2aPush, Delivery, Message, Pending, SigningSecret, Subscriber, Subscription,
    SHARDS,
};
use turnpike_artifactory::{Directory, Webhooks};
use turnpike_router::bus::{now_ms, Bus};
use turnpike_router::recent::Recent;
use turnpike_schemas::entry::TurnOutcome;
use turnpike_schemas::webhook::{wants, EventKind};
use turnpike_schemas::{AgentId, AppId, Block, ConversationId, Identity, TenantId, TurnLog};

use crate::shards::ShardLeases;

/// How long a tenant's subscribers are cached by the outbox.
pub const SUBSCRIBERS_FRESH: Duration = Duration::from_secs(1);
/// The lease tag of delivery shards (see [`crate::shards::shard_key`]).
pub const SHARD_TAG: u64 = 0x5745_4248_4f4f_4b53;
/// The most conversations whose owner the outbox remembers, and for how long one nobody's turn
/// ended in stays remembered (memory that follows the conversations in use).
const OWNERS_KEPT: usize = 4096;
const OWNERS_IDLE: Duration = Duration::from_secs(120);
/// The most of a reply a message carries, in bytes.
pub const MAX_REPLY_BYTES: usize = 4096;

/// How deliveries are paced.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    pub lease_ttl: Duration,
    /// How often a held shard is looked at for due deliveries.
    pub tick: Duration,
    /// When each attempt is made, after the one before it failed (the first is at once):
    /// one attempt per entry, then a dead letter.
    pub backoff: Vec<Duration>,
    /// The longest an attempt may take.
    pub timeout: Duration,
    /// How many deliveries of a shard go out at once.
    pub concurrency: usize,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        let s = Duration::from_secs;
        Self {
            lease_ttl: s(6),
            tick: Duration::from_millis(500),
            // Eight attempts over about 28 hours, as Standard Webhooks' senders retry.
            backoff: vec![
                s(0),
                s(5),
                s(5 * 60),
                s(30 * 60),
                s(2 * 3600),
                s(5 * 3600),
                s(10 * 3600),
                s(10 * 3600),
            ],
            timeout: s(15),
            concurrency: 32,
        }
    }
}

/// The turn a message is about.
pub struct TurnFacts<'a> {
    /// The conversation's record (an A2A push subscription follows its task in it).
    pub record: &'a turnpike_artifactory::Record,
    pub tenant: &'a TenantId,
    pub app: &'a AppId,
    pub agent: &'a AgentId,
    pub conversation: ConversationId,
    /// Who sent the turn's input (the owner, or someone it is shared with).
    pub sender: &'a Identity,
    pub origin: Option<&'a turnpike_schemas::Origin>,
    pub log: &'a TurnLog,
    pub failure: Option<&'a str>,
    pub at_ms: u64,
}

/// The kind of message a turn that ended with `outcome` is.
fn turn_kind(outcome: TurnOutcome) -> EventKind {
    match outcome {
        TurnOutcome::Replied => EventKind::TurnCompleted,
        TurnOutcome::Failed => EventKind::TurnFailed,
        TurnOutcome::Cancelled => EventKind::TurnCancelled,
        TurnOutcome::Parked => EventKind::TurnParked,
    }
}

/// The message about a turn's end.
pub fn turn_message(t: &TurnFacts<'_>) -> Message {
    let kind = turn_kind(t.log.outcome);
    let id = turnpike_artifactory::webhooks::turn_message_id(t.tenant, t.conversation, t.log.turn);
    let reply = t.log.blocks.iter().rev().find_map(|b| match b {
        Block::AssistantMessage { text } => Some(truncated(text, MAX_REPLY_BYTES)),
        _ => None,
    });
    let parked = (t.log.outcome == TurnOutcome::Parked)
        .then(|| {
            t.log.blocks.iter().rev().find_map(|b| match b {
                Block::ApprovalRequest {
                    request_id,
                    tool,
                    connection,
                    ..
                } => Some(json!({
                    "kind": if connection.is_some() { "connection" } else { "approval" },
                    "request_id": request_id.to_string(),
                    "tool": tool,
                    "connection": connection,
                })),
                Block::QuestionRequest {
                    request_id,
                    question,
                    ..
                } => Some(json!({
                    "kind": "question",
                    "request_id": request_id.to_string(),
                    "question": truncated(question, MAX_REPLY_BYTES),
                })),
                _ => None,
            })
        })
        .flatten();
    let mut data = json!({
        "tenant": t.tenant.to_string(),
        "app": t.app.to_string(),
        "agent": t.agent.to_string(),
        "conversation": t.conversation.to_string(),
        "turn": t.log.turn.to_string(),
        "identity": t.sender.to_string(),
        "outcome": t.log.outcome,
        "session": t.origin.is_some(),
    });
    let fields = data.as_object_mut().expect("an object");
    if let Some(reply) = reply {
        fields.insert("reply".into(), reply.into());
    }
    if let Some(parked) = parked {
        fields.insert("parked".into(), parked);
    }
    if let Some(failure) = t.failure {
        fields.insert("error".into(), truncated(failure, MAX_REPLY_BYTES).into());
    }
    if let Some(origin) = t.origin {
        fields.insert("origin".into(), json!(origin));
    }
    Message {
        id,
        kind,
        at_ms: t.at_ms,
        data,
    }
}

fn truncated(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// What was read, and when.
type Fresh<T> = (Instant, Arc<T>);
/// An owner in a tenant.
type OwnerKey = (TenantId, Identity);

/// Finds a message's subscribers and enqueues its deliveries (the outbox).
pub struct Notifier {
    webhooks: Webhooks,
    directory: Directory,
    apps: Arc<turnpike_agent::Apps>,
    /// Per tenant: when it was listed, and the owners (hashed) with subscriptions.
    owners: Mutex<HashMap<TenantId, Fresh<HashSet<String>>>>,
    /// Per (tenant, owner): when listed, and the subscriptions.
    subscriptions: Mutex<lru::LruCache<OwnerKey, Fresh<Vec<Subscription>>>>,
    /// Per conversation: its owner (never changes).
    conversation_owners: Mutex<Recent<ConversationId, Identity>>,
    /// Woken when deliveries are enqueued (a dispatcher in this process looks at once).
    pub kick: Arc<tokio::sync::Notify>,
}

impl Notifier {
    pub fn new(webhooks: Webhooks, directory: Directory, apps: Arc<turnpike_agent::Apps>) -> Self {
        // About the owners in use, small entries.
        let size = std::num::NonZeroUsize::new(4096).expect("not zero");
        Self {
            webhooks,
            directory,
            apps,
            owners: Mutex::new(HashMap::new()),
            subscriptions: Mutex::new(lru::LruCache::new(size)),
            conversation_owners: Mutex::new(Recent::new(OWNERS_KEPT, OWNERS_IDLE)),
            kick: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// Enqueues a turn's outcome for its subscribers. Errors are the store's: the caller
    /// keeps the promotion unfinished so that it is done again.
    pub async fn turn_ended(&self, t: &TurnFacts<'_>) -> turnpike_artifactory::Result<usize> {
        let kind = turn_kind(t.log.outcome);
        let mut subscribers: Vec<Subscriber> = self
            .apps
            .webhooks(t.app)
            .into_iter()
            .filter(|w| &w.tenant == t.tenant)
            .filter(|w| w.agent.as_ref().is_none_or(|a| a == t.agent))
            .filter(|w| wants(&w.events, kind))
            .map(|w| Subscriber::App {
                app: t.app.clone(),
                name: w.name,
                url: w.url,
                secret_env: w.secret_env,
            })
            .collect();
        let owners = self.owners_with_subscriptions(t.tenant).await?;
        // A2A push subscriptions follow one task: the task's end is their last message.
        let mut ended: Vec<(Identity, String)> = Vec::new();
        if !owners.is_empty() {
            let owner = self.owner_of(t.tenant, t.conversation).await?;
            if let Some(owner) = owner.filter(|o| owners.contains(&owner_hash(o))) {
                let theirs = self.subscriptions_of(t.tenant, &owner).await?;
                for s in theirs
                    .iter()
                    .filter(|s| s.conversation.is_none_or(|c| c == t.conversation))
                    .filter(|s| wants(&s.events, kind))
                {
                    if let Some(push) = &s.a2a {
                        // Only the turns of its task, from the record (a parked task goes on
                        // in the turn that answers it; another message's turn is not its).
                        if push.ended || !in_task(t, push).await? {
                            continue;
                        }
                        if kind != EventKind::TurnParked {
                            ended.push((owner.clone(), s.id.clone()));
                        }
                    }
                    subscribers.push(Subscriber::User {
                        owner: owner.clone(),
                        id: s.id.clone(),
                    });
                }
            }
        }
        if subscribers.is_empty() {
            // Nobody to tell (most turns): the message is not even made.
            return Ok(0);
        }
        let count = self.enqueue(t.tenant, subscribers, turn_message(t)).await?;
        for (owner, id) in ended {
            // Enqueued first: a crash between the two leaves the subscription open (it hears of
            // its own task's turns only, and none come after the end); the end is delivered.
            self.webhooks.end_push(t.tenant, &owner, &id).await?;
            self.subscriptions
                .lock()
                .expect("lock")
                .pop(&(t.tenant.clone(), owner));
        }
        Ok(count)
    }

    /// Enqueues a schedule firing's outcome for its owner's subscribers (those of every
    /// conversation; a firing belongs to no one conversation before it fires).
    pub async fn firing(
        &self,
        tenant: &TenantId,
        owner: &Identity,
        message: Message,
    ) -> turnpike_artifactory::Result<usize> {
        if !self
            .owners_with_subscriptions(tenant)
            .await?
            .contains(&owner_hash(owner))
        {
            return Ok(0);
        }
        let subscribers = self
            .subscriptions_of(tenant, owner)
            .await?
            .iter()
            .filter(|s| s.conversation.is_none() && wants(&s.events, message.kind))
            .map(|s| Subscriber::User {
                owner: owner.clone(),
                id: s.id.clone(),
            })
            .collect();
        self.enqueue(tenant, subscribers, message).await
    }

    async fn enqueue(
        &self,
        tenant: &TenantId,
        subscribers: Vec<Subscriber>,
        message: Message,
    ) -> turnpike_artifactory::Result<usize> {
        use futures::StreamExt as _;
        let count = subscribers.len();
        let enqueued: Vec<turnpike_artifactory::Result<()>> = futures::stream::iter(subscribers)
            .map(|subscriber| {
                let delivery = Delivery::new(tenant.clone(), subscriber, message.clone());
                async move {
                    // Due when it happened: the same delivery enqueued again has the same key.
                    self.webhooks.enqueue(&delivery, message.at_ms).await
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        enqueued
            .into_iter()
            .collect::<turnpike_artifactory::Result<Vec<()>>>()?;
        if count > 0 {
            metrics::counter!("turnpike_webhook_enqueued_total").increment(count as u64);
            self.kick.notify_waiters();
        }
        Ok(count)
    }

    /// The owners (hashed) with subscriptions in `tenant`: one listing per tenant per
    /// [`SUBSCRIBERS_FRESH`], so a turn of an owner with none reads nothing more.
    async fn owners_with_subscriptions(
        &self,
        tenant: &TenantId,
    ) -> turnpike_artifactory::Result<Arc<HashSet<String>>> {
        if let Some((at, owners)) = self.owners.lock().expect("lock").get(tenant) {
            if at.elapsed() < SUBSCRIBERS_FRESH {
                return Ok(owners.clone());
            }
        }
        let owners = Arc::new(self.webhooks.owners(tenant).await?);
        self.owners
            .lock()
            .expect("lock")
            .insert(tenant.clone(), (Instant::now(), owners.clone()));
        Ok(owners)
    }

    async fn owner_of(
        &self,
        tenant: &TenantId,
        conversation: ConversationId,
    ) -> turnpike_artifactory::Result<Option<Identity>> {
        if let Some(owner) = self
            .conversation_owners
            .lock()
            .expect("lock")
            .get(&conversation)
        {
            return Ok(Some(owner.clone()));
        }
        let entry = match self.directory.lookup_in_tenant(conversation, tenant).await {
            Ok(entry) => entry,
            Err(e) if e.kind() == turnpike_artifactory::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        self.conversation_owners
            .lock()
            .expect("lock")
            .put(conversation, entry.owner.clone());
        Ok(Some(entry.owner))
    }

    async fn subscriptions_of(
        &self,
        tenant: &TenantId,
        owner: &Identity,
    ) -> turnpike_artifactory::Result<Arc<Vec<Subscription>>> {
        let key = (tenant.clone(), owner.clone());
        if let Some((at, subs)) = self.subscriptions.lock().expect("lock").get(&key) {
            if at.elapsed() < SUBSCRIBERS_FRESH {
                return Ok(subs.clone());
            }
        }
        let subs = Arc::new(self.webhooks.list(tenant, owner).await?);
        self.subscriptions
            .lock()
            .expect("lock")
            .put(key, (Instant::now(), subs.clone()));
        Ok(subs)
    }
}

/// Delivers the waiting deliveries of the shards it holds.
pub struct Dispatcher {
    bus: Arc<dyn Bus>,
    webhooks: Webhooks,
    outbound: turnpike_agent::outbound::Outbound,
    worker: turnpike_schemas::WorkerId,
    config: WebhookConfig,
    peers: Arc<AtomicUsize>,
    kick: Arc<tokio::sync::Notify>,
    /// Clients by (host, pinned addresses): a connection pool per subscriber host.
    clients: Mutex<lru::LruCache<(String, Vec<SocketAddr>), reqwest::Client>>,
}

/// How one attempt went.
enum Attempt {
    /// Taken; true when it was an A2A task's last message (its subscription goes).
    Delivered(bool),
    /// Its subscriber is gone (the subscription deleted): dropped.
    Gone,
    Failed(String),
}

impl Dispatcher {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        bus: Arc<dyn Bus>,
        webhooks: Webhooks,
        outbound: turnpike_agent::outbound::Outbound,
        worker: turnpike_schemas::WorkerId,
        config: WebhookConfig,
        peers: Arc<AtomicUsize>,
        kick: Arc<tokio::sync::Notify>,
    ) -> Self {
        Self {
            bus,
            webhooks,
            outbound,
            worker,
            config,
            peers,
            kick,
            clients: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(256).expect("not zero"),
            )),
        }
    }

    /// Holds free delivery shards and delivers what is due in them until `stop` turns true
    /// (then lets its shards go) or its task is aborted (its shards pass on with their leases).
    pub async fn run(self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut leases: ShardLeases<()> = ShardLeases::new(
            self.bus.clone(),
            self.worker,
            "webhooks",
            SHARD_TAG,
            SHARDS,
            self.config.lease_ttl,
            self.peers.clone(),
        );
        let mut next_due = u64::MAX;
        loop {
            let wait = Duration::from_millis(next_due.saturating_sub(now_ms()).max(5))
                .min(self.config.tick);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.kick.notified() => {}
                _ = async { let _ = stop.wait_for(|stop| *stop).await; } => {
                    leases.release_all().await;
                    return;
                }
            }
            leases.maintain().await;
            next_due = u64::MAX;
            for (shard, fresh_until, ()) in leases.fresh() {
                if let Some(later) = self.shard_due(shard, fresh_until).await {
                    next_due = next_due.min(later);
                }
            }
        }
    }

    /// Delivers what is due in `shard` (stopping at `fresh_until`); when the next is due.
    async fn shard_due(&self, shard: u32, fresh_until: Instant) -> Option<u64> {
        use futures::StreamExt as _;
        loop {
            let (due, later) = match self.webhooks.due(shard, now_ms(), 256).await {
                Ok(listed) => listed,
                Err(e) => {
                    warn!(shard, error = %e, "cannot list a shard's waiting webhook deliveries");
                    return None;
                }
            };
            let full = due.len() == 256;
            futures::stream::iter(due)
                .for_each_concurrent(self.config.concurrency, |p| async move {
                    // Never past the lease: an attempt still going when it may have run out
                    // (a slow name server, a receiver that answers slowly) is abandoned, not
                    // counted, and the delivery stays where it was for whoever holds it next.
                    let left = fresh_until.saturating_duration_since(Instant::now());
                    if left.is_zero() || tokio::time::timeout(left, self.attempt(&p)).await.is_err()
                    {
                        debug!(
                            shard,
                            "a webhook attempt ran out of lease; it is tried again"
                        );
                    }
                })
                .await;
            if !full || Instant::now() >= fresh_until {
                return later;
            }
        }
    }

    /// One attempt at the delivery waiting at `pending`, and what follows from it.
    async fn attempt(&self, pending: &Pending) {
        let mut delivery = match self.webhooks.read(pending).await {
            Ok(Some(d)) => d,
            Ok(None) => return,
            Err(e) => {
                warn!(error = %e, "cannot read a waiting webhook delivery");
                return;
            }
        };
        let outcome = self.post(&delivery).await;
        let noted = match outcome {
            Attempt::Delivered(last) => {
                metrics::counter!("turnpike_webhook_deliveries_total", "outcome" => "delivered")
                    .increment(1);
                if let (true, Subscriber::User { owner, id }) = (last, &delivery.subscriber) {
                    if let Err(e) = self.webhooks.remove(&delivery.tenant, owner, id).await {
                        warn!(delivery = %delivery.id, error = %e, "cannot remove an ended A2A push subscription");
                    }
                }
                self.webhooks.finished(pending).await
            }
            Attempt::Gone => {
                debug!(delivery = %delivery.id, "a webhook's subscriber is gone; its delivery is dropped");
                self.webhooks.finished(pending).await
            }
            Attempt::Failed(why) => {
                metrics::counter!("turnpike_webhook_deliveries_total", "outcome" => "failed")
                    .increment(1);
                delivery.attempts += 1;
                delivery.last_error = Some(why);
                match delivery.next_due(&self.config.backoff) {
                    Some(due) => self.webhooks.retry(pending, &delivery, due).await,
                    None => {
                        warn!(delivery = %delivery.id, tenant = %delivery.tenant, attempts = delivery.attempts,
                            error = delivery.last_error.as_deref().unwrap_or(""), "a webhook delivery is a dead letter");
                        metrics::counter!("turnpike_webhook_dead_letters_total").increment(1);
                        self.webhooks.bury(pending, &delivery).await
                    }
                }
            }
        };
        if let Err(e) = noted {
            warn!(delivery = %delivery.id, error = %e, "cannot note a webhook delivery's attempt; it is tried again");
        }
    }

    /// Where `delivery` goes and its secret (`None`: its subscriber is gone).
    async fn target(&self, d: &Delivery) -> Result<Option<Target>, String> {
        match &d.subscriber {
            Subscriber::App {
                url, secret_env, ..
            } => {
                let secret = std::env::var(secret_env)
                    .ok()
                    .ok_or_else(|| format!("the secret variable {secret_env} is not set"))
                    .and_then(|s| {
                        SigningSecret::parse(&s).map_err(|_| {
                            format!("the secret in {secret_env} is not whsec_<base64>")
                        })
                    })?;
                Ok(Some((url.clone(), secret, None)))
            }
            Subscriber::User { owner, id } => {
                match self.webhooks.with_secret(&d.tenant, owner, id).await {
                    Ok(Some((sub, secret))) => Ok(Some((sub.url, secret, sub.a2a))),
                    Ok(None) => Ok(None),
                    Err(e) => Err(format!("the subscription cannot be read: {e}")),
                }
            }
        }
    }

    async fn post(&self, d: &Delivery) -> Attempt {
        let (url, secret, a2a) = match self.target(d).await {
            Ok(Some(found)) => found,
            Ok(None) => return Attempt::Gone,
            Err(why) => return Attempt::Failed(why),
        };
        let Ok(parsed) = url::Url::parse(&url) else {
            return Attempt::Failed(format!("{url} is not a URL"));
        };
        // Invariant 12: every address the name resolves to is public or allowed, and the
        // request goes to those addresses only.
        let pinned = match self.outbound.resolve(&parsed).await {
            Ok(pinned) => pinned,
            Err(why) => {
                // The subscriber is told that, not where its name led (no probing of the
                // deployment's own names through dead letters); operators read it here.
                debug!(delivery = %d.id, %why, "a webhook's address was refused");
                return Attempt::Failed(
                    "refused: the URL does not resolve, or leads to an internal address the operator has not allowed".into(),
                );
            }
        };
        let client = match self.client(&parsed, pinned) {
            Ok(c) => c,
            Err(why) => return Attempt::Failed(why),
        };
        let timestamp = now_ms() / 1000;
        let body = match &a2a {
            Some(push) => a2a_status_update(push, &d.message),
            None => json!({
                "type": d.message.kind.name(),
                "timestamp": rfc3339(d.message.at_ms),
                "data": d.message.data,
            }),
        };
        let body = serde_json::to_vec(&body).expect("messages serialise");
        let signature = secret.sign(&d.message.id, timestamp, &body);
        let mut request = client
            .post(parsed)
            .header("content-type", "application/json")
            .header("user-agent", "turnpike-webhooks")
            .header("webhook-id", &d.message.id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature);
        if let Some(push) = &a2a {
            if let (true, Some(token)) = (push.token, secret.key_text()) {
                request = request.header("x-a2a-notification-token", token);
            }
            if let Some(authorization) = &push.authorization {
                request = request.header("authorization", authorization);
            }
        }
        let sent = request.body(body).send().await;
        match sent {
            Ok(r) if r.status().is_success() => {
                Attempt::Delivered(a2a.is_some() && d.message.kind != EventKind::TurnParked)
            }
            Ok(r) if r.status().is_redirection() => Attempt::Failed(format!(
                "answered {} (redirects are not followed)",
                r.status()
            )),
            Ok(r) => Attempt::Failed(format!("answered {}", r.status())),
            Err(e) if e.is_timeout() => Attempt::Failed(format!(
                "no answer within {} s",
                self.config.timeout.as_secs_f32()
            )),
            Err(e) => Attempt::Failed(format!("could not be reached: {}", e.without_url())),
        }
    }

    fn client(&self, url: &url::Url, pinned: Vec<SocketAddr>) -> Result<reqwest::Client, String> {
        let host = url.host_str().unwrap_or_default().to_owned();
        let key = (host.clone(), pinned.clone());
        if let Some(c) = self.clients.lock().expect("lock").get(&key) {
            return Ok(c.clone());
        }
        let client = reqwest::Client::builder()
            // No proxy: it would resolve the name again, past the addresses checked.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(self.config.timeout)
            .resolve_to_addrs(&host, &pinned)
            .build()
            .map_err(|e| format!("no HTTP client: {e}"))?;
        self.clients.lock().expect("lock").put(key, client.clone());
        Ok(client)
    }
}

/// Whether the turn `t` ended is one of `push`'s task's, as the record shows the task.
async fn in_task(t: &TurnFacts<'_>, push: &A2aPush) -> turnpike_artifactory::Result<bool> {
    let Ok(task) = push.task.parse::<turnpike_artifactory::tasks::TaskRef>() else {
        return Ok(false);
    };
    if task.conversation != t.conversation {
        return Ok(false);
    }
    Ok(turnpike_artifactory::tasks::read(t.record, task)
        .await?
        .is_some_and(|view| view.turns.contains(&t.log.turn)))
}

/// Where a delivery goes, what it is signed with, and whether it speaks A2A.
type Target = (String, SigningSecret, Option<A2aPush>);

/// An A2A client's push notification of a turn's end: a `statusUpdate` of its task, as the
/// protocol's `StreamResponse` (the task's state from the turn's outcome, and what it said).
fn a2a_status_update(push: &A2aPush, message: &Message) -> serde_json::Value {
    let data = &message.data;
    let parked_kind = data["parked"]["kind"].as_str();
    let state = match message.kind {
        EventKind::TurnCompleted => "TASK_STATE_COMPLETED",
        EventKind::TurnFailed => "TASK_STATE_FAILED",
        EventKind::TurnCancelled => "TASK_STATE_CANCELED",
        EventKind::TurnParked if parked_kind == Some("connection") => "TASK_STATE_AUTH_REQUIRED",
        EventKind::TurnParked => "TASK_STATE_INPUT_REQUIRED",
        EventKind::ScheduleFiring => "TASK_STATE_WORKING",
    };
    let text = data["reply"]
        .as_str()
        .or(data["parked"]["question"].as_str())
        .or(data["error"].as_str())
        .map(str::to_owned)
        .or_else(|| {
            data["parked"]["tool"]
                .as_str()
                .map(|tool| format!("the call {tool} waits for your approval"))
        });
    let context = data["conversation"].as_str().unwrap_or_default();
    let mut status = json!({"state": state, "timestamp": rfc3339(message.at_ms)});
    if let Some(text) = text {
        status["message"] = json!({
            "messageId": format!("{}-{}", push.task, message.id),
            "contextId": context,
            "taskId": push.task,
            "role": "ROLE_AGENT",
            "parts": [{"text": text}],
        });
    }
    json!({"statusUpdate": {"taskId": push.task, "contextId": context, "status": status}})
}

fn rfc3339(ms: u64) -> String {
    jiff::Timestamp::from_millisecond(ms as i64)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(outcome: TurnOutcome, blocks: Vec<Block>) -> TurnLog {
        TurnLog {
            version: turnpike_schemas::turnlog::TURN_LOG_VERSION,
            conversation: ConversationId::new(),
            turn: turnpike_schemas::TurnId::new(2).unwrap(),
            agent: "a".parse().unwrap(),
            outcome,
            blocks,
            usage: Default::default(),
            exchange: Default::default(),
            unindexed: false,
        }
    }

    #[test]
    fn a_turns_message_has_one_id_and_says_what_ended() {
        let (tenant, app, agent): (TenantId, AppId, AgentId) = (
            "t".parse().unwrap(),
            "app".parse().unwrap(),
            "a".parse().unwrap(),
        );
        let sender: Identity = "local:t:alice".parse().unwrap();
        let conversation = ConversationId::new();
        let long = "é".repeat(MAX_REPLY_BYTES);
        let replied = log(
            TurnOutcome::Replied,
            vec![Block::AssistantMessage { text: long }],
        );
        let record = turnpike_artifactory::Record::new(
            std::sync::Arc::new(object_store::memory::InMemory::new()),
            turnpike_artifactory::ConversationPrefix::new(tenant.clone(), conversation),
        );
        let facts = |log| TurnFacts {
            record: &record,
            tenant: &tenant,
            app: &app,
            agent: &agent,
            conversation,
            sender: &sender,
            origin: None,
            log,
            failure: None,
            at_ms: 5,
        };
        let one = turn_message(&facts(&replied));
        let two = turn_message(&facts(&replied));
        assert_eq!(one.id, two.id);
        assert_eq!(one.kind, EventKind::TurnCompleted);
        assert!(one.data["reply"].as_str().unwrap().len() <= MAX_REPLY_BYTES + 3);
        let parked = log(
            TurnOutcome::Parked,
            vec![Block::QuestionRequest {
                request_id: turnpike_schemas::RequestId::new(),
                call_id: "c".into(),
                question: "which?".into(),
            }],
        );
        let message = turn_message(&facts(&parked));
        assert_eq!(message.kind, EventKind::TurnParked);
        assert_eq!(message.data["parked"]["kind"], "question");
        assert_eq!(message.data["session"], false);
    }
}
