//! Connections: each user's own credential for an MCP server of an app (a bearer token, or an
//! OAuth token they obtained), sealed at rest with the deployment's connection key.
//!
//! # Contract
//! - a credential is sealed with AES-256-GCM under the deployment key, a fresh random nonce
//!   per write, and its scope — tenant, identity, app, server — as the associated data: a
//!   sealed object copied to another user's, app's or tenant's place does not open there;
//! - the plaintext leaves this module only through [`Connections::secret`], for the worker's
//!   call to that server on that identity's behalf; [`Connections::list`] and
//!   [`Connection`] say *that* and *when*, never *what*; `Debug` of a [`Secret`] is redacted;
//! - a turn parked for a missing connection leaves a waiting mark
//!   ([`Connections::wait`]); connecting lists and clears the marks so the edge can resume
//!   those turns. A mark is advisory: a stale one resumes nothing (the card is answered or
//!   gone), a lost one leaves the card to be answered by hand;
//! - everything of an identity sits under one prefix, so erasing the user erases it.
//!
//! Layout: `tenants/{tenant}/connections/{sha256(identity)}/{app}/{server}` (sealed) and
//! `tenants/{tenant}/connection-waits/{sha256(identity)}/{app}/{server}/{conversation}` (marks:
//! beside, not under, the credentials, so no app's name can collide with them).

use std::sync::Arc;

use futures::TryStreamExt as _;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use turnpike_schemas::{ConversationId, Identity, RequestId, TenantId};

use crate::error::{Error, ErrorKind, Result};

/// The most bytes a credential may have (a long JWT fits; a file does not).
pub const MAX_SECRET_BYTES: usize = 8 << 10;

/// The deployment's key that seals every connection (32 bytes).
#[derive(Clone)]
pub struct ConnectionKey(Arc<LessSafeKey>);

impl std::fmt::Debug for ConnectionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnectionKey(…)")
    }
}

impl ConnectionKey {
    /// A key from 64 hex characters.
    pub fn from_hex(text: &str) -> Result<Self> {
        let bytes = hex::decode(text.trim())
            .ok()
            .filter(|b| b.len() == 32)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Key,
                    "a connection key is 64 hex characters (32 bytes)",
                )
            })?;
        let key = UnboundKey::new(&AES_256_GCM, &bytes)
            .map_err(|_| Error::new(ErrorKind::Key, "the connection key was refused"))?;
        Ok(Self(Arc::new(LessSafeKey::new(key))))
    }

    /// The key in `path`, made (readable by its owner only) when there is none yet.
    pub fn load_or_create(path: &std::path::Path) -> Result<Self> {
        let key_error = |what: &str, e: std::io::Error| {
            Error::with_source(ErrorKind::Key, format!("{what} {}: {e}", path.display()), e)
        };
        if path.exists() {
            let text = std::fs::read_to_string(path)
                .map_err(|e| key_error("cannot read the connection key", e))?;
            return Self::from_hex(&text);
        }
        let mut bytes = [0u8; 32];
        getrandom::getrandom(&mut bytes)
            .map_err(|e| Error::new(ErrorKind::Key, format!("no randomness for a key: {e}")))?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| key_error("cannot create", e))?;
        }
        crate::keys::write_private(path, &hex::encode(bytes))
            .map_err(|e| key_error("cannot write the connection key", e))?;
        Self::from_hex(&hex::encode(bytes))
    }
}

impl ConnectionKey {
    /// `plain` sealed under this key with `aad` bound to it: (nonce, sealed), both base64.
    pub(crate) fn seal(&self, aad: Vec<u8>, plain: &[u8]) -> Result<(String, String)> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::getrandom(&mut nonce)
            .map_err(|e| Error::new(ErrorKind::Key, format!("no randomness for a nonce: {e}")))?;
        let mut sealed = plain.to_vec();
        self.0
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut sealed,
            )
            .map_err(|_| Error::new(ErrorKind::Key, "a secret could not be sealed"))?;
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        Ok((b64.encode(nonce), b64.encode(&sealed)))
    }

    /// What [`Self::seal`] sealed with the same `aad`; `None` when it does not open (another
    /// key, another scope, damaged).
    pub(crate) fn open(&self, aad: Vec<u8>, nonce: &str, sealed: &str) -> Option<Vec<u8>> {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let nonce: [u8; NONCE_LEN] = b64.decode(nonce).ok()?.try_into().ok()?;
        let mut data = b64.decode(sealed).ok()?;
        let plain = self
            .0
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut data,
            )
            .ok()?;
        Some(plain.to_vec())
    }
}

/// A credential in the clear, on its way to one call. Its `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// A credential as a user gave it: 1 to [`MAX_SECRET_BYTES`] bytes of visible ASCII (it
    /// travels in an HTTP header).
    pub fn new(text: String) -> Result<Self> {
        if text.is_empty()
            || text.len() > MAX_SECRET_BYTES
            || !text.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "a credential is 1 to {MAX_SECRET_BYTES} visible ASCII characters (no spaces or line breaks)"
                ),
            ));
        }
        Ok(Self(text))
    }

    /// The credential itself: for the request that carries it, nowhere else.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(redacted)")
    }
}

/// Whose connection, to what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope<'a> {
    pub tenant: &'a TenantId,
    pub identity: &'a Identity,
    pub app: &'a str,
    pub server: &'a str,
}

impl Scope<'_> {
    fn aad(&self) -> Vec<u8> {
        format!(
            "turnpike-connection\0{}\0{}\0{}\0{}",
            self.tenant, self.identity, self.app, self.server
        )
        .into_bytes()
    }

    fn check(&self) -> Result<()> {
        let part = |s: &str| {
            !s.is_empty()
                && s.len() <= 64
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if part(self.app) && part(self.server) {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::InvalidInput,
                "an app and a server are 1–64 of a-z, A-Z, 0-9, '-' and '_'",
            ))
        }
    }
}

/// A stored connection, as its owner may see it: not the credential.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connection {
    pub app: String,
    pub server: String,
    pub connected_ms: u64,
}

/// A turn parked for a missing connection, waiting for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiting {
    pub conversation: ConversationId,
    pub request_id: RequestId,
}

#[derive(Serialize, Deserialize)]
struct Sealed {
    v: u32,
    connected_ms: u64,
    nonce: String,
    sealed: String,
}

/// The connections in one object store.
#[derive(Debug, Clone)]
pub struct Connections {
    store: Arc<dyn ObjectStore>,
    key: ConnectionKey,
}

fn identity_hash(identity: &Identity) -> String {
    hex::encode(sha2::Sha256::digest(identity.to_string().as_bytes()))
}

fn identity_dir(tenant: &TenantId, identity: &Identity) -> String {
    format!("tenants/{tenant}/connections/{}", identity_hash(identity))
}

fn waits_dir(tenant: &TenantId, identity: &Identity) -> String {
    format!(
        "tenants/{tenant}/connection-waits/{}",
        identity_hash(identity)
    )
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Connections {
    pub fn new(store: Arc<dyn ObjectStore>, key: ConnectionKey) -> Self {
        Self { store, key }
    }

    /// The key everything here is sealed with.
    pub(crate) fn key(&self) -> &ConnectionKey {
        &self.key
    }

    fn path(scope: &Scope<'_>) -> Path {
        Path::from(format!(
            "{}/{}/{}",
            identity_dir(scope.tenant, scope.identity),
            scope.app,
            scope.server
        ))
    }

    fn waiting_dir(scope: &Scope<'_>) -> String {
        format!(
            "{}/{}/{}",
            waits_dir(scope.tenant, scope.identity),
            scope.app,
            scope.server
        )
    }

    /// Stores (or replaces) the credential of `scope`.
    pub async fn put(&self, scope: &Scope<'_>, secret: &Secret) -> Result<Connection> {
        scope.check()?;
        let (nonce, sealed) = self.key.seal(scope.aad(), secret.expose().as_bytes())?;
        let connected_ms = now_ms();
        let body = serde_json::to_vec(&Sealed {
            v: 1,
            connected_ms,
            nonce,
            sealed,
        })
        .expect("sealed connections serialise");
        self.store
            .put(&Self::path(scope), PutPayload::from(body))
            .await
            .map_err(|e| Error::store("storing a connection", e))?;
        Ok(Connection {
            app: scope.app.to_owned(),
            server: scope.server.to_owned(),
            connected_ms,
        })
    }

    /// The credential of `scope`, if its owner connected. An object that does not open under
    /// this scope and key (moved, damaged, or sealed under another key) is `Corrupt`.
    pub async fn secret(&self, scope: &Scope<'_>) -> Result<Option<Secret>> {
        scope.check()?;
        let bytes = match self.store.get(&Self::path(scope)).await {
            Ok(got) => got
                .bytes()
                .await
                .map_err(|e| Error::store("reading a connection", e))?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(Error::store("reading a connection", e)),
        };
        let corrupt = || {
            Error::new(
                ErrorKind::Corrupt,
                format!(
                    "the connection to {}/{} does not open: connect again",
                    scope.app, scope.server
                ),
            )
        };
        let sealed: Sealed = serde_json::from_slice(&bytes)
            .ok()
            .filter(|s: &Sealed| s.v == 1)
            .ok_or_else(corrupt)?;
        let plain = self
            .key
            .open(scope.aad(), &sealed.nonce, &sealed.sealed)
            .ok_or_else(corrupt)?;
        let text = String::from_utf8(plain).map_err(|_| corrupt())?;
        Secret::new(text).map(Some).map_err(|_| corrupt())
    }

    /// Removes the credential of `scope`; whether there was one.
    pub async fn delete(&self, scope: &Scope<'_>) -> Result<bool> {
        scope.check()?;
        let path = Self::path(scope);
        match self.store.head(&path).await {
            Ok(_) => {}
            Err(object_store::Error::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(Error::store("reading a connection", e)),
        }
        match self.store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(true),
            Err(e) => Err(Error::store("deleting a connection", e)),
        }
    }

    /// The identity's connections in `tenant` (which, and since when; no credential).
    pub async fn list(&self, tenant: &TenantId, identity: &Identity) -> Result<Vec<Connection>> {
        let dir = identity_dir(tenant, identity);
        let objects: Vec<_> = self
            .store
            .list(Some(&Path::from(dir.clone())))
            .try_collect()
            .await
            .map_err(|e| Error::store("listing connections", e))?;
        let mut out = Vec::new();
        for meta in objects {
            let rest = meta.location.as_ref()[dir.len()..].trim_start_matches('/');
            let parts: Vec<&str> = rest.split('/').collect();
            let [app, server] = parts[..] else { continue };
            let connected_ms = match self.store.get(&meta.location).await {
                Ok(got) => got
                    .bytes()
                    .await
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Sealed>(&b).ok())
                    .map_or(0, |s| s.connected_ms),
                Err(_) => continue,
            };
            out.push(Connection {
                app: app.to_owned(),
                server: server.to_owned(),
                connected_ms,
            });
        }
        out.sort_by(|a, b| (&a.app, &a.server).cmp(&(&b.app, &b.server)));
        Ok(out)
    }

    /// Marks the turn of `waiting` as parked until `scope` connects (idempotent).
    pub async fn wait(&self, scope: &Scope<'_>, waiting: &Waiting) -> Result<()> {
        scope.check()?;
        let path = Path::from(format!(
            "{}/{}",
            Self::waiting_dir(scope),
            waiting.conversation
        ));
        let body = serde_json::to_vec(waiting).expect("marks serialise");
        self.store
            .put(&path, PutPayload::from(body))
            .await
            .map_err(|e| Error::store("marking a turn waiting for a connection", e))?;
        Ok(())
    }

    /// The turns waiting for `scope`, their marks removed (the caller resumes them).
    pub async fn take_waiting(&self, scope: &Scope<'_>) -> Result<Vec<Waiting>> {
        scope.check()?;
        let dir = Path::from(Self::waiting_dir(scope));
        let objects: Vec<_> = self
            .store
            .list(Some(&dir))
            .try_collect()
            .await
            .map_err(|e| Error::store("listing turns waiting for a connection", e))?;
        let mut out = Vec::new();
        for meta in objects {
            let Ok(got) = self.store.get(&meta.location).await else {
                continue;
            };
            if let Some(w) = got
                .bytes()
                .await
                .ok()
                .and_then(|b| serde_json::from_slice::<Waiting>(&b).ok())
            {
                out.push(w);
            }
            match self.store.delete(&meta.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::store("clearing a waiting mark", e)),
            }
        }
        Ok(out)
    }

    /// Erases every connection and mark of the identity in `tenant`; how many objects went.
    pub async fn erase(&self, tenant: &TenantId, identity: &Identity) -> Result<usize> {
        let mut erased = 0;
        for dir in [identity_dir(tenant, identity), waits_dir(tenant, identity)] {
            erased += crate::store::delete_under(
                self.store.as_ref(),
                &Path::from(dir),
                "a user's connections",
            )
            .await?;
        }
        Ok(erased)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    fn desk<'a>(tenant: &'a TenantId, who: &'a Identity) -> Scope<'a> {
        Scope {
            tenant,
            identity: who,
            app: "tickets",
            server: "desk",
        }
    }

    fn key() -> ConnectionKey {
        ConnectionKey::from_hex(&"ab".repeat(32)).unwrap()
    }

    #[tokio::test]
    async fn a_credential_opens_only_in_its_own_scope_and_is_never_stored_in_the_clear() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let c = Connections::new(store.clone(), key());
        let tenant: TenantId = "default".parse().unwrap();
        let alice: Identity = "local:alice".parse().unwrap();
        let bob: Identity = "local:bob".parse().unwrap();
        let secret = Secret::new("tok-alice-7f3a9c".into()).unwrap();
        c.put(&desk(&tenant, &alice), &secret).await.unwrap();
        assert_eq!(
            c.secret(&desk(&tenant, &alice)).await.unwrap(),
            Some(secret.clone())
        );
        assert_eq!(c.secret(&desk(&tenant, &bob)).await.unwrap(), None);
        // Nothing in the store holds the credential in the clear.
        let all: Vec<_> = store.list(None).try_collect().await.unwrap();
        assert_eq!(all.len(), 1);
        let bytes = store
            .get(&all[0].location)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert!(!String::from_utf8_lossy(&bytes).contains("tok-alice"));
        // Alice's sealed object copied to Bob's place does not open there.
        store
            .put(
                &Connections::path(&desk(&tenant, &bob)),
                PutPayload::from(bytes),
            )
            .await
            .unwrap();
        let err = c.secret(&desk(&tenant, &bob)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt);
        // Nor under another deployment key.
        let other = Connections::new(
            store.clone(),
            ConnectionKey::from_hex(&"cd".repeat(32)).unwrap(),
        );
        assert_eq!(
            other
                .secret(&desk(&tenant, &alice))
                .await
                .unwrap_err()
                .kind(),
            ErrorKind::Corrupt
        );
        let listed = c.list(&tenant, &alice).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (listed[0].app.as_str(), listed[0].server.as_str()),
            ("tickets", "desk")
        );
        assert!(format!("{secret:?}").contains("redacted"));
        // Waiting marks are taken once.
        let w = Waiting {
            conversation: ConversationId::new(),
            request_id: RequestId::new(),
        };
        c.wait(&desk(&tenant, &alice), &w).await.unwrap();
        assert_eq!(
            c.take_waiting(&desk(&tenant, &alice)).await.unwrap(),
            vec![w.clone()]
        );
        assert!(c
            .take_waiting(&desk(&tenant, &alice))
            .await
            .unwrap()
            .is_empty());
        assert!(c.delete(&desk(&tenant, &alice)).await.unwrap());
        assert!(!c.delete(&desk(&tenant, &alice)).await.unwrap());
        assert_eq!(c.secret(&desk(&tenant, &alice)).await.unwrap(), None);
        c.put(&desk(&tenant, &bob), &secret).await.unwrap();
        c.wait(&desk(&tenant, &bob), &w).await.unwrap();
        assert_eq!(c.erase(&tenant, &bob).await.unwrap(), 2);
        assert!(c
            .take_waiting(&desk(&tenant, &bob))
            .await
            .unwrap()
            .is_empty());
        assert!(c.list(&tenant, &bob).await.unwrap().is_empty());
    }

    #[test]
    fn bad_credentials_and_scopes_are_refused() {
        for bad in [
            "",
            "has space",
            "line\nbreak",
            &"x".repeat(MAX_SECRET_BYTES + 1),
        ] {
            assert_eq!(
                Secret::new(bad.to_owned()).unwrap_err().kind(),
                ErrorKind::InvalidInput
            );
        }
        assert!(ConnectionKey::from_hex("abcd").is_err());
        let tenant: TenantId = "default".parse().unwrap();
        let who: Identity = "local:a".parse().unwrap();
        for (app, server) in [("", "x"), ("a/b", "x"), ("a", "../x"), ("a", "x y")] {
            let scope = Scope {
                tenant: &tenant,
                identity: &who,
                app,
                server,
            };
            assert!(scope.check().is_err(), "{app}/{server}");
        }
    }
}
