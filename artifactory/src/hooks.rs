//! Inbound webhooks' durable side: each delivery claimed once, and the conversation a payload
//! key names.
//!
//! # Contract
//! - [`Hooks::claim`] is create-only per (tenant, app, hook, delivery id): the first claim
//!   says what the delivery does (its conversation and event id, the lane position before
//!   it); every later one — the sender's retry, a redelivery days later, a concurrent POST —
//!   gets that first claim back, so the delivery becomes one event however often it comes.
//! - [`Hooks::keyed`] maps a payload key to one conversation, create-only: the first delivery
//!   with a key picks the conversation, every later one with it gets the same.
//! - Keys and delivery ids are stored hashed (they may hold anything a sender chose).
//!
//! Layout: `hooks/{tenant}/{app}/{hook}/deliveries/{sha256(id)}.json` (the claim),
//! `hooks/{tenant}/{app}/{hook}/done/{sha256(id)}.json` (its event published) and
//! `hooks/{tenant}/{app}/{hook}/keys/{sha256(key)}.json`.

use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _, PutMode, PutOptions, PutPayload};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use turnpike_schemas::{AppId, ConversationId, EventId, TenantId};

use crate::error::{Error, ErrorKind, Result};

/// What one delivery does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub conversation: ConversationId,
    pub event: EventId,
    /// The lane's last sequence before the event was decided (where to look for it).
    pub lane_after: u64,
    pub received_ms: u64,
}

/// Where a key's conversation is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Keyed {
    conversation: ConversationId,
}

/// The hooks' claims in one object store.
#[derive(Debug, Clone)]
pub struct Hooks {
    store: Arc<dyn ObjectStore>,
}

fn hashed(text: &str) -> String {
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

fn object(tenant: &TenantId, app: &AppId, hook: &str, kind: &str, name: &str) -> Path {
    Path::from(format!(
        "hooks/{tenant}/{app}/{hook}/{kind}/{}.json",
        hashed(name)
    ))
}

impl Hooks {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self { store }
    }

    /// Claims delivery `id` with `delivery`; returns the claim that stands and whether it is
    /// this one.
    pub async fn claim(
        &self,
        tenant: &TenantId,
        app: &AppId,
        hook: &str,
        id: &str,
        delivery: &Delivery,
    ) -> Result<(Delivery, bool)> {
        let path = object(tenant, app, hook, "deliveries", id);
        self.create_or_read(&path, delivery).await
    }

    /// Notes that delivery `id`'s event was published (idempotent).
    pub async fn mark_done(
        &self,
        tenant: &TenantId,
        app: &AppId,
        hook: &str,
        id: &str,
    ) -> Result<()> {
        let path = object(tenant, app, hook, "done", id);
        match self
            .store
            .put_opts(
                &path,
                PutPayload::from_static(b"{}"),
                PutOptions::from(PutMode::Create),
            )
            .await
        {
            Ok(_)
            | Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => Ok(()),
            Err(e) => Err(Error::store("noting a hook delivery done", e)),
        }
    }

    /// Whether delivery `id`'s event was published (see [`Self::mark_done`]).
    pub async fn is_done(
        &self,
        tenant: &TenantId,
        app: &AppId,
        hook: &str,
        id: &str,
    ) -> Result<bool> {
        let path = object(tenant, app, hook, "done", id);
        match self.store.head(&path).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(Error::store("reading a hook delivery's mark", e)),
        }
    }

    /// The conversation of payload key `key`: `fresh` if this is the first delivery with it.
    pub async fn keyed(
        &self,
        tenant: &TenantId,
        app: &AppId,
        hook: &str,
        key: &str,
        fresh: ConversationId,
    ) -> Result<ConversationId> {
        let path = object(tenant, app, hook, "keys", key);
        let (keyed, _) = self
            .create_or_read(
                &path,
                &Keyed {
                    conversation: fresh,
                },
            )
            .await?;
        Ok(keyed.conversation)
    }

    async fn create_or_read<T: Serialize + DeserializeOwned + Clone>(
        &self,
        path: &Path,
        value: &T,
    ) -> Result<(T, bool)> {
        let bytes = serde_json::to_vec(value).expect("hook claims serialise");
        match self
            .store
            .put_opts(
                path,
                PutPayload::from(bytes),
                PutOptions::from(PutMode::Create),
            )
            .await
        {
            Ok(_) => Ok((value.clone(), true)),
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => {
                let what = format!("hook claim {path}");
                let bytes = self
                    .store
                    .get(path)
                    .await
                    .map_err(|e| Error::store(&what, e))?
                    .bytes()
                    .await
                    .map_err(|e| Error::store(&what, e))?;
                let stored = serde_json::from_slice(&bytes).map_err(|e| {
                    Error::with_source(ErrorKind::Corrupt, format!("{what} is unreadable"), e)
                })?;
                Ok((stored, false))
            }
            Err(e) => Err(Error::store("claiming a hook delivery", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_claim_of_a_delivery_and_of_a_key_stands() {
        let hooks = Hooks::new(Arc::new(object_store::memory::InMemory::new()));
        let (tenant, app): (TenantId, AppId) = ("acme".parse().unwrap(), "ci".parse().unwrap());
        let first = Delivery {
            conversation: ConversationId::new(),
            event: EventId::new(),
            lane_after: 0,
            received_ms: 1,
        };
        let second = Delivery {
            conversation: ConversationId::new(),
            event: EventId::new(),
            lane_after: 3,
            received_ms: 2,
        };
        assert_eq!(
            hooks
                .claim(&tenant, &app, "push", "d-1", &first)
                .await
                .unwrap(),
            (first, true)
        );
        assert_eq!(
            hooks
                .claim(&tenant, &app, "push", "d-1", &second)
                .await
                .unwrap(),
            (first, false)
        );
        // Another hook, app or tenant with the same delivery id is another delivery.
        assert!(
            hooks
                .claim(&tenant, &app, "pull", "d-1", &second)
                .await
                .unwrap()
                .1
        );
        let other: TenantId = "globex".parse().unwrap();
        assert!(
            hooks
                .claim(&other, &app, "push", "d-1", &second)
                .await
                .unwrap()
                .1
        );
        let (a, b) = (ConversationId::new(), ConversationId::new());
        assert_eq!(
            hooks.keyed(&tenant, &app, "push", "42", a).await.unwrap(),
            a
        );
        assert_eq!(
            hooks.keyed(&tenant, &app, "push", "42", b).await.unwrap(),
            a
        );
        assert_eq!(
            hooks.keyed(&tenant, &app, "push", "43", b).await.unwrap(),
            b
        );
    }
}
