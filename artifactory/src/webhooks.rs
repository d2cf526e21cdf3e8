//! Outbound webhooks' durable side: users' subscriptions (their signing secrets sealed), the
//! deliveries waiting to go out, and the dead letters.
//!
//! # Contract
//! - A subscription belongs to one identity in one tenant and hears of that identity's
//!   conversations only (all of them, or one). Its `whsec_…` secret is made here, shown once
//!   (by [`Webhooks::create`]) and otherwise kept sealed under the deployment's connection key
//!   with its scope as associated data; [`Subscription`] never holds it.
//! - A delivery is one message to one subscriber. [`Webhooks::enqueue`] is create-only under a
//!   key made of its first due time and its id, both fixed by the caller from what it
//!   delivers: a caller that enqueues the same delivery again (a promotion finished twice)
//!   adds nothing while the first waits for its first attempt. Once that has failed, the
//!   delivery waits under another key, and the same enqueue makes a second copy: delivered
//!   twice under the same `webhook-id` (at least once, never lost).
//! - A delivery waits under its due time; a failed attempt moves it to its next due time,
//!   fixed by the delivery ([`Delivery::next_due`]: two holders that both tried it write one
//!   key), written before the old key goes (a crash in between leaves it twice — delivered
//!   twice, never lost); one out of attempts moves to the dead letters, which
//!   [`Webhooks::redeliver`] puts back.
//!
//! Layout: `tenants/{tenant}/webhooks/{sha256(identity)}/{id}.json` (subscriptions, under the
//! tenant: erasing the identity erases them), `webhooks/pending/{shard}/{due_ms}-{id}.json`
//! (waiting deliveries, due-ordered by name) and `webhooks/dead/{tenant}/{id}.json`.

use std::sync::Arc;

use futures::TryStreamExt as _;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use turnpike_schemas::webhook::EventKind;
use turnpike_schemas::{AppId, ConversationId, Identity, TenantId};

use crate::connections::ConnectionKey;
use crate::error::{Error, ErrorKind, Result};

/// How many shards waiting deliveries are spread over (each dispatched by one holder).
pub const SHARDS: u32 = 16;
/// The most subscriptions one identity may have in a tenant.
pub const MAX_PER_OWNER: usize = 100;
/// The longest subscriber URL, in bytes.
pub const MAX_URL_BYTES: usize = 2048;

/// Who a delivery is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Subscriber {
    /// The webhook `name` an app's manifest declares, with where it goes and the variable
    /// that holds its secret, as the manifest said when the delivery was made (any worker
    /// delivers it, whatever apps it hosts).
    App {
        app: AppId,
        name: String,
        url: String,
        secret_env: String,
    },
    /// A user's subscription.
    User { owner: Identity, id: String },
}

/// A user's subscription, as its owner may see it (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscription {
    /// `wh_<ulid>`.
    pub id: String,
    pub tenant: TenantId,
    pub owner: Identity,
    pub url: String,
    /// The kinds it wants (empty: all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<EventKind>,
    /// Only this conversation's events, when set; else every conversation of its owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<ConversationId>,
    pub created_ms: u64,
    /// An A2A client's push notifications for one task: deliveries speak A2A, and the
    /// subscription ends with the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a2a: Option<A2aPush>,
}

/// What an A2A client registered for a task's push notifications (`TaskPushNotificationConfig`).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct A2aPush {
    /// The task (`<conversation>-<lane seq>`).
    pub task: String,
    /// The config's id (the client's, or the subscription's).
    pub config: String,
    /// Whether the client gave a token: it is the subscription's signing key (sealed like
    /// every secret), and sent back as `X-A2A-Notification-Token`.
    #[serde(default)]
    pub token: bool,
    /// Sent as `Authorization`: `<scheme> <credentials>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization: Option<String>,
    /// The task's end is on its way: nothing more is sent, and the subscription goes once that
    /// is delivered.
    #[serde(default)]
    pub ended: bool,
}

impl std::fmt::Debug for A2aPush {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("A2aPush")
            .field("task", &self.task)
            .field("config", &self.config)
            .field("token", &self.token)
            .field(
                "authorization",
                &self.authorization.as_ref().map(|_| "(redacted)"),
            )
            .field("ended", &self.ended)
            .finish()
    }
}

#[derive(Serialize, Deserialize)]
struct Stored {
    subscription: Subscription,
    nonce: String,
    sealed: String,
}

/// What a subscriber is told: the Standard Webhooks payload is `{type, timestamp, data}`, sent
/// under `webhook-id` = `id` on every attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `msg_<hex>`: fixed by what happened (the same turn's outcome has the same id).
    pub id: String,
    pub kind: EventKind,
    pub at_ms: u64,
    pub data: serde_json::Value,
}

/// One message on its way to one subscriber.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// `dlv_<hex>`: a hash of the message id and the subscriber.
    pub id: String,
    pub tenant: TenantId,
    pub subscriber: Subscriber,
    pub message: Message,
    /// Attempts made so far.
    pub attempts: u32,
    /// Why the latest attempt failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub created_ms: u64,
    /// When its attempts began (made, or redelivered): the backoff counts from here.
    #[serde(default)]
    pub since_ms: u64,
}

impl Delivery {
    /// A first delivery of `message` to `subscriber`.
    pub fn new(tenant: TenantId, subscriber: Subscriber, message: Message) -> Self {
        let who = serde_json::to_string(&subscriber).expect("subscribers serialise");
        let id = format!("dlv_{}", &hashed(&format!("{}\0{who}", message.id))[..32]);
        Self {
            id,
            tenant,
            subscriber,
            created_ms: message.at_ms,
            since_ms: message.at_ms,
            message,
            attempts: 0,
            last_error: None,
        }
    }

    /// When its next attempt is due after `attempts` attempts, by `backoff` (each step after
    /// the one before): fixed by the delivery, so two holders that both tried it put it in
    /// line under the same key. `None`: out of attempts.
    pub fn next_due(&self, backoff: &[std::time::Duration]) -> Option<u64> {
        let steps = backoff.get(..=self.attempts as usize)?;
        let wait: u64 = steps.iter().map(|d| d.as_millis() as u64).sum();
        Some(self.since_ms.saturating_add(wait))
    }

    /// The shard it waits in.
    pub fn shard(&self) -> u32 {
        let digest = sha2::Sha256::digest(self.id.as_bytes());
        u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]) % SHARDS
    }
}

/// A waiting delivery, as a listing finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub path: Path,
    pub due_ms: u64,
}

/// The id of the message about turn `turn`'s end: the same whoever makes it (the worker that
/// ends the turn, the one that finishes its promotion, an edge catching up on a push config).
pub fn turn_message_id(
    tenant: &TenantId,
    conversation: ConversationId,
    turn: turnpike_schemas::TurnId,
) -> String {
    let key = format!("turn\0{tenant}\0{conversation}\0{turn}");
    format!("msg_{}", &hashed(&key)[..32])
}

/// A `whsec_…` signing secret in the clear. Its `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningSecret(String);

impl SigningSecret {
    /// A fresh secret: `whsec_` and 24 random bytes in base64.
    pub fn fresh() -> Result<Self> {
        let mut bytes = [0u8; 24];
        getrandom::getrandom(&mut bytes)
            .map_err(|e| Error::new(ErrorKind::Key, format!("no randomness for a secret: {e}")))?;
        use base64::Engine as _;
        Ok(Self(format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        )))
    }

    /// The secret whose key is `key`'s bytes (an A2A client's token: it can check the
    /// signatures with what it chose).
    pub fn of_key(key: &[u8]) -> Result<Self> {
        use base64::Engine as _;
        if key.is_empty() {
            return Err(Error::new(ErrorKind::InvalidInput, "an empty signing key"));
        }
        Ok(Self(format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode(key)
        )))
    }

    /// The key's bytes as text, when they are (the A2A token a secret was made of).
    pub fn key_text(&self) -> Option<String> {
        use base64::Engine as _;
        let key = base64::engine::general_purpose::STANDARD
            .decode(self.0.trim_start_matches("whsec_"))
            .ok()?;
        String::from_utf8(key).ok()
    }

    /// A secret as an operator gave it (`whsec_<base64>`, or bare base64).
    pub fn parse(text: &str) -> Result<Self> {
        use base64::Engine as _;
        let bare = text.trim().strip_prefix("whsec_").unwrap_or(text.trim());
        match base64::engine::general_purpose::STANDARD.decode(bare) {
            Ok(key) if !key.is_empty() => Ok(Self(format!("whsec_{bare}"))),
            _ => Err(Error::new(
                ErrorKind::InvalidInput,
                "a webhook secret is whsec_ followed by base64",
            )),
        }
    }

    /// The secret itself: for its owner, once, and for signing.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The Standard Webhooks signature of a message: `v1,<base64 HMAC-SHA256 of
    /// "{id}.{timestamp}.{body}" under the secret's bytes>`.
    pub fn sign(&self, id: &str, timestamp_secs: u64, body: &[u8]) -> String {
        use base64::Engine as _;
        use hmac::Mac as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let key = b64
            .decode(self.0.trim_start_matches("whsec_"))
            .expect("a secret is base64 (checked when made)");
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).expect("HMAC takes any key");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp_secs.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", b64.encode(mac.finalize().into_bytes()))
    }
}

impl std::fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningSecret(redacted)")
    }
}

fn hashed(text: &str) -> String {
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

/// How an owner is named in the store (a hash: an identity may hold anything).
pub fn owner_hash(owner: &Identity) -> String {
    hashed(&owner.to_string())
}

fn owner_dir(tenant: &TenantId, owner: &Identity) -> String {
    format!("tenants/{tenant}/webhooks/{}", owner_hash(owner))
}

fn aad(tenant: &TenantId, owner: &Identity, id: &str) -> Vec<u8> {
    format!("turnpike-webhook\0{tenant}\0{owner}\0{id}").into_bytes()
}

fn valid_id(id: &str) -> bool {
    id.len() <= 40 && id.starts_with("wh_") && id[3..].bytes().all(|b| b.is_ascii_alphanumeric())
}

fn dead_path(tenant: &TenantId, id: &str) -> Path {
    Path::from(format!("webhooks/dead/{tenant}/{id}.json"))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The webhooks' objects in one store. Subscriptions need the connection key (their secrets are
/// sealed with it); deliveries and dead letters do not.
#[derive(Debug, Clone)]
pub struct Webhooks {
    store: Arc<dyn ObjectStore>,
    key: Option<ConnectionKey>,
}

impl Webhooks {
    pub fn new(store: Arc<dyn ObjectStore>, key: Option<ConnectionKey>) -> Self {
        Self { store, key }
    }

    fn key(&self) -> Result<&ConnectionKey> {
        self.key.as_ref().ok_or_else(|| {
            Error::new(
                ErrorKind::Key,
                "webhook subscriptions need the deployment's connection key (TURNPIKE_CONNECTION_KEY)",
            )
        })
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &Path) -> Result<Option<T>> {
        let bytes = match self.store.get(path).await {
            Ok(got) => got
                .bytes()
                .await
                .map_err(|e| Error::store("reading a webhook object", e))?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(Error::store("reading a webhook object", e)),
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            Error::new(
                ErrorKind::Corrupt,
                format!("webhook object {path} does not parse: {e}"),
            )
        })
    }

    async fn put_json<T: Serialize>(&self, path: &Path, value: &T, create: bool) -> Result<()> {
        let body = serde_json::to_vec(value).expect("webhook objects serialise");
        let mode = if create {
            PutMode::Create
        } else {
            PutMode::Overwrite
        };
        match self
            .store
            .put_opts(path, PutPayload::from(body), PutOptions::from(mode))
            .await
        {
            Ok(_) => Ok(()),
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) if create => Ok(()),
            Err(e) => Err(Error::store("writing a webhook object", e)),
        }
    }

    /// Every object under `prefix` (`what` names them in an error).
    async fn listed(&self, prefix: &str, what: &str) -> Result<Vec<object_store::ObjectMeta>> {
        self.store
            .list(Some(&Path::from(prefix)))
            .try_collect()
            .await
            .map_err(|e| Error::store(&format!("listing {what}"), e))
    }

    async fn delete(&self, path: &Path) -> Result<()> {
        match self.store.delete(path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Error::store("deleting a webhook object", e)),
        }
    }

    /// Makes a subscription for `owner` in `tenant`; returns it with its secret (shown this
    /// once). The URL must be `http(s)` with a host (where it may lead is checked at each
    /// delivery, after resolution).
    pub async fn create(
        &self,
        tenant: &TenantId,
        owner: &Identity,
        url: &str,
        events: Vec<EventKind>,
        conversation: Option<ConversationId>,
    ) -> Result<(Subscription, SigningSecret)> {
        let secret = SigningSecret::fresh()?;
        self.create_with(tenant, owner, url, events, conversation, None, secret)
            .await
    }

    /// [`Self::create`] with the secret given, and an A2A client's push settings (the
    /// subscription is then one task's, of one conversation).
    #[allow(clippy::too_many_arguments)]
    pub async fn create_with(
        &self,
        tenant: &TenantId,
        owner: &Identity,
        url: &str,
        events: Vec<EventKind>,
        conversation: Option<ConversationId>,
        a2a: Option<A2aPush>,
        secret: SigningSecret,
    ) -> Result<(Subscription, SigningSecret)> {
        let key = self.key()?;
        check_url(url)?;
        if self.list(tenant, owner).await?.len() >= MAX_PER_OWNER {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("at most {MAX_PER_OWNER} webhook subscriptions per identity"),
            ));
        }
        let id = format!("wh_{}", ulid::Ulid::new());
        let (nonce, sealed) = key.seal(aad(tenant, owner, &id), secret.expose().as_bytes())?;
        let subscription = Subscription {
            id: id.clone(),
            tenant: tenant.clone(),
            owner: owner.clone(),
            url: url.to_owned(),
            events,
            conversation,
            created_ms: now_ms(),
            a2a,
        };
        let path = Path::from(format!("{}/{id}.json", owner_dir(tenant, owner)));
        let stored = Stored {
            subscription: subscription.clone(),
            nonce,
            sealed,
        };
        self.put_json(&path, &stored, true).await?;
        Ok((subscription, secret))
    }

    /// `owner`'s subscriptions in `tenant`, oldest first.
    pub async fn list(&self, tenant: &TenantId, owner: &Identity) -> Result<Vec<Subscription>> {
        let metas = self
            .listed(&owner_dir(tenant, owner), "webhook subscriptions")
            .await?;
        let mut out = Vec::new();
        for meta in metas {
            match self.get_json::<Stored>(&meta.location).await {
                Ok(Some(stored)) => out.push(stored.subscription),
                Ok(None) => {}
                // One damaged object does not stop the owner's other subscriptions (nor, in
                // the outbox, their turns): it is skipped and said.
                Err(e) if e.kind() == ErrorKind::Corrupt => {
                    tracing::warn!(path = %meta.location, error = %e, "a webhook subscription does not parse; skipped")
                }
                Err(e) => return Err(e),
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// The owners with subscriptions in `tenant`, as hashes ([`owner_hash`]).
    pub async fn owners(&self, tenant: &TenantId) -> Result<std::collections::HashSet<String>> {
        let prefix = Path::from(format!("tenants/{tenant}/webhooks"));
        let listed = self
            .store
            .list_with_delimiter(Some(&prefix))
            .await
            .map_err(|e| Error::store("listing webhook subscribers", e))?;
        Ok(listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_owned))
            .collect())
    }

    /// `owner`'s subscription `id` with its secret, if it is there (and opens).
    pub async fn with_secret(
        &self,
        tenant: &TenantId,
        owner: &Identity,
        id: &str,
    ) -> Result<Option<(Subscription, SigningSecret)>> {
        if !valid_id(id) {
            return Ok(None);
        }
        let path = Path::from(format!("{}/{id}.json", owner_dir(tenant, owner)));
        let Some(stored) = self.get_json::<Stored>(&path).await? else {
            return Ok(None);
        };
        let corrupt = || {
            Error::new(
                ErrorKind::Corrupt,
                format!("webhook subscription {id}'s secret does not open"),
            )
        };
        let plain = self
            .key()?
            .open(aad(tenant, owner, id), &stored.nonce, &stored.sealed)
            .ok_or_else(corrupt)?;
        let secret = String::from_utf8(plain).map_err(|_| corrupt())?;
        Ok(Some((stored.subscription, SigningSecret::parse(&secret)?)))
    }

    /// Marks `owner`'s A2A push subscription `id` as ended (its task's end is enqueued);
    /// whether it was there.
    pub async fn end_push(&self, tenant: &TenantId, owner: &Identity, id: &str) -> Result<bool> {
        if !valid_id(id) {
            return Ok(false);
        }
        let path = Path::from(format!("{}/{id}.json", owner_dir(tenant, owner)));
        let Some(mut stored) = self.get_json::<Stored>(&path).await? else {
            return Ok(false);
        };
        if let Some(push) = &mut stored.subscription.a2a {
            push.ended = true;
            self.put_json(&path, &stored, false).await?;
        }
        Ok(true)
    }

    /// Deletes `owner`'s subscription `id`; whether there was one. Its waiting deliveries are
    /// dropped when they come due.
    pub async fn remove(&self, tenant: &TenantId, owner: &Identity, id: &str) -> Result<bool> {
        if !valid_id(id) {
            return Ok(false);
        }
        let path = Path::from(format!("{}/{id}.json", owner_dir(tenant, owner)));
        match self.store.head(&path).await {
            Ok(_) => {}
            Err(object_store::Error::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(Error::store("reading a webhook subscription", e)),
        }
        self.delete(&path).await?;
        Ok(true)
    }

    /// Erases everything of `owner`'s in `tenant`: their subscriptions, and the deliveries to
    /// them — waiting or dead — which hold what their turns said. Returns how many objects went.
    pub async fn erase_owner(&self, tenant: &TenantId, owner: &Identity) -> Result<usize> {
        let theirs = |d: &Delivery| {
            d.tenant == *tenant
                && matches!(&d.subscriber, Subscriber::User { owner: o, .. } if o == owner)
        };
        let mut erased = 0;
        let metas = self
            .listed(&owner_dir(tenant, owner), "webhook subscriptions")
            .await?;
        for meta in metas {
            self.delete(&meta.location).await?;
            erased += 1;
        }
        for dead in self.dead_letters(tenant).await? {
            if theirs(&dead) {
                self.delete(&dead_path(tenant, &dead.id)).await?;
                erased += 1;
            }
        }
        for shard in 0..SHARDS {
            let (waiting, _) = self.due(shard, u64::MAX, usize::MAX).await?;
            for pending in waiting {
                if self.read(&pending).await?.is_some_and(|d| theirs(&d)) {
                    self.delete(&pending.path).await?;
                    erased += 1;
                }
            }
        }
        Ok(erased)
    }

    fn pending_path(delivery: &Delivery, due_ms: u64) -> Path {
        Path::from(format!(
            "webhooks/pending/{:02}/{due_ms:013}-{}.json",
            delivery.shard(),
            delivery.id
        ))
    }

    /// Puts `delivery` in line for `due_ms` (create-only: the same delivery at the same due
    /// time again adds nothing).
    pub async fn enqueue(&self, delivery: &Delivery, due_ms: u64) -> Result<()> {
        self.put_json(&Self::pending_path(delivery, due_ms), delivery, true)
            .await
    }

    /// The deliveries of `shard` due by `now`, earliest first (at most `limit`), and when the
    /// earliest later one is due.
    pub async fn due(
        &self,
        shard: u32,
        now: u64,
        limit: usize,
    ) -> Result<(Vec<Pending>, Option<u64>)> {
        let metas = self
            .listed(
                &format!("webhooks/pending/{shard:02}"),
                "waiting webhook deliveries",
            )
            .await?;
        let mut due: Vec<Pending> = metas
            .into_iter()
            .filter_map(|m| {
                let name = m.location.filename()?;
                let due_ms = name.split('-').next()?.parse().ok()?;
                Some(Pending {
                    path: m.location,
                    due_ms,
                })
            })
            .collect();
        due.sort_by(|a, b| (a.due_ms, a.path.as_ref()).cmp(&(b.due_ms, b.path.as_ref())));
        let later = due.iter().find(|p| p.due_ms > now).map(|p| p.due_ms);
        due.retain(|p| p.due_ms <= now);
        due.truncate(limit);
        Ok((due, later))
    }

    /// The delivery waiting at `pending` (`None`: it went meanwhile).
    pub async fn read(&self, pending: &Pending) -> Result<Option<Delivery>> {
        self.get_json(&pending.path).await
    }

    /// `delivery` (its attempt counted) waits again, until `due_ms`.
    pub async fn retry(&self, pending: &Pending, delivery: &Delivery, due_ms: u64) -> Result<()> {
        self.put_json(&Self::pending_path(delivery, due_ms), delivery, false)
            .await?;
        self.delete(&pending.path).await
    }

    /// The delivery at `pending` is done with (delivered, or its subscriber went).
    pub async fn finished(&self, pending: &Pending) -> Result<()> {
        self.delete(&pending.path).await
    }

    /// `delivery` ran out of attempts: it becomes a dead letter.
    pub async fn bury(&self, pending: &Pending, delivery: &Delivery) -> Result<()> {
        self.put_json(&dead_path(&delivery.tenant, &delivery.id), delivery, false)
            .await?;
        self.delete(&pending.path).await
    }

    /// The dead letters of `tenant`, oldest first.
    pub async fn dead_letters(&self, tenant: &TenantId) -> Result<Vec<Delivery>> {
        let metas = self
            .listed(&format!("webhooks/dead/{tenant}"), "webhook dead letters")
            .await?;
        let mut out = Vec::new();
        for meta in metas {
            if let Some(d) = self.get_json::<Delivery>(&meta.location).await? {
                out.push(d);
            }
        }
        out.sort_by(|a, b| (a.created_ms, &a.id).cmp(&(b.created_ms, &b.id)));
        Ok(out)
    }

    /// Dead letter `id` of `tenant`, if there is one.
    pub async fn dead_letter(&self, tenant: &TenantId, id: &str) -> Result<Option<Delivery>> {
        if id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Ok(None);
        }
        self.get_json(&dead_path(tenant, id)).await
    }

    /// Puts dead letter `id` of `tenant` back in line, its attempts from zero; whether there
    /// was one.
    pub async fn redeliver(&self, tenant: &TenantId, id: &str) -> Result<bool> {
        let Some(mut delivery) = self.dead_letter(tenant, id).await? else {
            return Ok(false);
        };
        let path = dead_path(tenant, id);
        delivery.attempts = 0;
        delivery.since_ms = now_ms();
        self.put_json(&Self::pending_path(&delivery, now_ms()), &delivery, false)
            .await?;
        self.delete(&path).await?;
        Ok(true)
    }
}

/// Checks a subscriber URL's form (where it leads is checked at delivery).
pub fn check_url(url: &str) -> Result<()> {
    let bad = |why: &str| Error::new(ErrorKind::InvalidInput, format!("webhook url: {why}"));
    if url.len() > MAX_URL_BYTES {
        return Err(bad(&format!("at most {MAX_URL_BYTES} bytes")));
    }
    let parsed = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(bad("an http or https URL with a host"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(bad(
            "no credentials in the URL (deliveries are signed instead)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> Webhooks {
        let key = ConnectionKey::from_hex(&"ab".repeat(32)).unwrap();
        Webhooks::new(Arc::new(object_store::memory::InMemory::new()), Some(key))
    }

    #[tokio::test]
    async fn a_secret_opens_only_for_its_owner_and_is_never_listed() {
        let hooks = store();
        let t: TenantId = "t".parse().unwrap();
        let alice: Identity = "local:t:alice".parse().unwrap();
        let bob: Identity = "local:t:bob".parse().unwrap();
        let (sub, secret) = hooks
            .create(&t, &alice, "https://example.com/h", vec![], None)
            .await
            .unwrap();
        assert!(secret.expose().starts_with("whsec_"));
        let listed = serde_json::to_string(&hooks.list(&t, &alice).await.unwrap()).unwrap();
        assert!(!listed.contains(secret.expose().trim_start_matches("whsec_")));
        let (_, again) = hooks
            .with_secret(&t, &alice, &sub.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(again, secret);
        assert!(hooks
            .with_secret(&t, &bob, &sub.id)
            .await
            .unwrap()
            .is_none());
        assert!(hooks.list(&t, &bob).await.unwrap().is_empty());
        assert!(!hooks.remove(&t, &bob, &sub.id).await.unwrap());
        assert!(hooks.remove(&t, &alice, &sub.id).await.unwrap());
        // Erasing alice takes her subscriptions and her deliveries, waiting or dead, and
        // nothing of bob's.
        let (kept, _) = hooks
            .create(&t, &bob, "https://example.com/b", vec![], None)
            .await
            .unwrap();
        hooks
            .create(&t, &alice, "https://example.com/a", vec![], None)
            .await
            .unwrap();
        let to = |owner: &Identity, id: &str, n: u32| {
            Delivery::new(
                t.clone(),
                Subscriber::User {
                    owner: owner.clone(),
                    id: id.into(),
                },
                Message {
                    id: format!("msg_{n}"),
                    kind: EventKind::TurnCompleted,
                    at_ms: 1,
                    data: serde_json::json!({"reply": "private"}),
                },
            )
        };
        hooks.enqueue(&to(&alice, "wh_a", 1), 1).await.unwrap();
        hooks.enqueue(&to(&bob, &kept.id, 2), 1).await.unwrap();
        let dead = to(&alice, "wh_a", 3);
        hooks.enqueue(&dead, 1).await.unwrap();
        let (due, _) = hooks.due(dead.shard(), u64::MAX, 10).await.unwrap();
        let p = due
            .iter()
            .find(|p| p.path.as_ref().contains(&dead.id))
            .unwrap();
        hooks.bury(p, &dead).await.unwrap();
        assert_eq!(hooks.erase_owner(&t, &alice).await.unwrap(), 3);
        assert!(hooks.list(&t, &alice).await.unwrap().is_empty());
        assert!(hooks.dead_letters(&t).await.unwrap().is_empty());
        let mut left = Vec::new();
        for shard in 0..SHARDS {
            for p in hooks.due(shard, u64::MAX, 10).await.unwrap().0 {
                left.push(hooks.read(&p).await.unwrap().unwrap());
            }
        }
        assert_eq!(left.len(), 1);
        assert_eq!(
            left[0].subscriber,
            Subscriber::User {
                owner: bob.clone(),
                id: kept.id.clone()
            }
        );
        assert_eq!(hooks.list(&t, &bob).await.unwrap().len(), 1);
        for bad in ["ftp://x/", "http://u:p@example.com/", "not a url"] {
            let err = hooks
                .create(&t, &alice, bad, vec![], None)
                .await
                .unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad}");
        }
    }

    #[tokio::test]
    async fn a_delivery_waits_retries_dies_and_comes_back() {
        let hooks = store();
        let t: TenantId = "t".parse().unwrap();
        let message = Message {
            id: "msg_1".into(),
            kind: EventKind::TurnCompleted,
            at_ms: 1_000,
            data: serde_json::json!({}),
        };
        let subscriber = Subscriber::App {
            app: "a".parse().unwrap(),
            name: "ops".into(),
            url: "https://example.com/".into(),
            secret_env: "S".into(),
        };
        let delivery = Delivery::new(t.clone(), subscriber, message);
        hooks.enqueue(&delivery, 1_000).await.unwrap();
        hooks.enqueue(&delivery, 1_000).await.unwrap();
        let shard = delivery.shard();
        let (due, later) = hooks.due(shard, 999, 10).await.unwrap();
        assert!(due.is_empty());
        assert_eq!(later, Some(1_000));
        let (due, _) = hooks.due(shard, 1_000, 10).await.unwrap();
        assert_eq!(due.len(), 1, "enqueued twice, waiting once");
        let mut d = hooks.read(&due[0]).await.unwrap().unwrap();
        d.attempts += 1;
        hooks.retry(&due[0], &d, 5_000).await.unwrap();
        let (due, later) = hooks.due(shard, 4_999, 10).await.unwrap();
        assert!(due.is_empty());
        assert_eq!(later, Some(5_000));
        let (due, _) = hooks.due(shard, 5_000, 10).await.unwrap();
        hooks.bury(&due[0], &d).await.unwrap();
        assert!(hooks.due(shard, u64::MAX, 10).await.unwrap().0.is_empty());
        let dead = hooks.dead_letters(&t).await.unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].attempts, 1);
        let other: TenantId = "u".parse().unwrap();
        assert!(hooks.dead_letters(&other).await.unwrap().is_empty());
        assert!(!hooks.redeliver(&other, &d.id).await.unwrap());
        assert!(hooks.redeliver(&t, &d.id).await.unwrap());
        assert!(hooks.dead_letters(&t).await.unwrap().is_empty());
        let (due, _) = hooks.due(shard, u64::MAX, 10).await.unwrap();
        assert_eq!(hooks.read(&due[0]).await.unwrap().unwrap().attempts, 0);
    }

    #[test]
    fn the_next_attempt_is_fixed_by_the_delivery_and_counts_from_its_start() {
        use std::time::Duration;
        let backoff = [0, 5, 300].map(Duration::from_secs);
        let mut d = Delivery::new(
            "t".parse().unwrap(),
            Subscriber::User {
                owner: "local:t:a".parse().unwrap(),
                id: "wh_1".into(),
            },
            Message {
                id: "msg_1".into(),
                kind: EventKind::TurnFailed,
                at_ms: 1_000,
                data: serde_json::json!({}),
            },
        );
        d.attempts = 1;
        assert_eq!(d.next_due(&backoff), Some(6_000), "whoever computes it");
        d.attempts = 2;
        assert_eq!(d.next_due(&backoff), Some(306_000));
        d.attempts = 3;
        assert_eq!(d.next_due(&backoff), None, "out of attempts");
        // Redelivered later: the steps count from then.
        d.attempts = 1;
        d.since_ms = 50_000;
        assert_eq!(d.next_due(&backoff), Some(55_000));
    }

    #[test]
    fn a_signature_matches_the_standard_webhooks_example() {
        // The example of the Standard Webhooks specification.
        let secret = SigningSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        assert!(format!("{secret:?}").contains("redacted"));
    }
}
