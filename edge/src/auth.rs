//! Who is calling: bearer tokens mapped to principals.
//!
//! Two verifiers, tried in order:
//! - a **token file** (TOML) for the embedded default and small deployments: each token maps to
//!   an identity, a tenant and whether it may use the admin endpoints. Tokens are stored as
//!   given or as their SHA-256 (`sha256 = "…"`), so the file need not hold secrets.
//! - a **JWT verifier** for a fleet behind an identity provider: RS256/ES256/EdDSA tokens checked
//!   against a JWKS — a file, or fetched from the identity provider (a URL, or found by OIDC
//!   discovery from the issuer) and cached — with issuer, audience, expiry and not-before; the
//!   tenant comes from a claim and the identity is `oidc:<scope>/<tenant>:<sub>`, so the same
//!   subject in two tenants is two identities.
//!
//! A fetched key set is refreshed when it expires (the JWKS response's `Cache-Control:
//! max-age`, 5 minutes without one, 1 s to 24 h) and when a token names a key it does not hold
//! (a key the provider rotated in), at most once per refresh interval (the max-age, at most
//! 10 s), so a flood of made-up key ids costs the provider one request per interval. When the
//! provider cannot be reached or answers something unusable, the last good set keeps serving.
//!
//! A request without a token, or with one no verifier accepts, is `401` with nothing revealed.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use sha2::Digest as _;
use turnpike_schemas::{Identity, TenantId};

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub identity: Identity,
    pub tenant: TenantId,
    /// May use `/v1/admin/…`.
    pub admin: bool,
}

/// Turns a bearer token into a principal.
#[async_trait]
pub trait Verifier: Send + Sync {
    /// The principal the token stands for, or `None` if this verifier does not accept it.
    async fn verify(&self, token: &str) -> Option<Principal>;
}

/// Tries verifiers in order.
#[derive(Clone, Default)]
pub struct Authenticator {
    verifiers: Vec<Arc<dyn Verifier>>,
}

impl Authenticator {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with(mut self, verifier: Arc<dyn Verifier>) -> Self {
        self.verifiers.push(verifier);
        self
    }

    /// The principal of `token`, if any verifier accepts it.
    pub async fn authenticate(&self, token: &str) -> Option<Principal> {
        for v in &self.verifiers {
            if let Some(p) = v.verify(token).await {
                return Some(p);
            }
        }
        None
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFileText {
    #[serde(default)]
    tokens: Vec<TokenLine>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenLine {
    /// The token itself (fine for local use) …
    token: Option<String>,
    /// … or its SHA-256, hex.
    sha256: Option<String>,
    identity: String,
    #[serde(default = "default_tenant")]
    tenant: String,
    #[serde(default)]
    admin: bool,
}

fn default_tenant() -> String {
    "default".to_owned()
}

/// Tokens from a file:
///
/// ```toml
/// [[tokens]]
/// token = "dev-alice"            # or: sha256 = "<hex of the token's SHA-256>"
/// identity = "local:alice"
/// tenant = "default"             # optional
/// admin = false                  # optional
/// ```
#[derive(Debug, Clone, Default)]
pub struct TokenFile {
    by_digest: HashMap<[u8; 32], Principal>,
}

impl TokenFile {
    /// Parses a token file's text; says which entry is wrong and why.
    pub fn parse(text: &str) -> Result<Self, String> {
        let parsed: TokenFileText = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut by_digest = HashMap::new();
        for (i, line) in parsed.tokens.into_iter().enumerate() {
            let at = format!("tokens[{i}]");
            let digest: [u8; 32] = match (&line.token, &line.sha256) {
                (Some(t), None) if !t.is_empty() => sha2::Sha256::digest(t.as_bytes()).into(),
                (None, Some(h)) => hex::decode(h)
                    .ok()
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(|| format!("{at}.sha256: not 64 hex characters"))?,
                _ => return Err(format!("{at}: give exactly one of `token` or `sha256`")),
            };
            let identity: Identity = line
                .identity
                .parse()
                .map_err(|e| format!("{at}.identity: {e}"))?;
            let tenant: TenantId = line
                .tenant
                .parse()
                .map_err(|e| format!("{at}.tenant: {e}"))?;
            by_digest.insert(
                digest,
                Principal {
                    identity,
                    tenant,
                    admin: line.admin,
                },
            );
        }
        Ok(Self { by_digest })
    }

    /// Reads a token file.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Adds one token in code (the embedded default's generated token).
    pub fn insert(&mut self, token: &str, principal: Principal) {
        self.by_digest
            .insert(sha2::Sha256::digest(token.as_bytes()).into(), principal);
    }

    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }
}

#[async_trait]
impl Verifier for TokenFile {
    async fn verify(&self, token: &str) -> Option<Principal> {
        // Compared by digest: equal-time for equal-length digests, and no token is kept.
        let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        self.by_digest.get(&digest).cloned()
    }
}

/// What a JWT verifier checks.
#[derive(Debug, Clone)]
pub struct JwtConfig {
    /// The `iss` tokens must carry.
    pub issuer: String,
    /// The `aud` tokens must carry.
    pub audience: String,
    /// The scope part of identities: `oidc:<scope>/<tenant>:<sub>` (`oidc:<tenant>:<sub>` when
    /// empty).
    pub identity_scope: String,
    /// The claim naming the tenant (tokens without it are refused).
    pub tenant_claim: String,
    /// The claim that, when `true`, makes the caller an admin.
    pub admin_claim: String,
}

/// The longest bearer token a JWT verifier looks at (a longer one is refused unread).
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// One verification key: its `kid`, the key, its algorithm.
type Key = (
    Option<String>,
    jsonwebtoken::DecodingKey,
    jsonwebtoken::Algorithm,
);

/// JWTs verified against the keys of a JWKS (a file, or fetched: see [`JwksSource`]).
pub struct JwtVerifier {
    config: JwtConfig,
    keys: tokio::sync::RwLock<KeySet>,
    source: Option<JwksSource>,
}

/// The keys in use, and until when they are fresh (`None`: for good, as a file's).
struct KeySet {
    keys: Vec<Key>,
    fresh_until: Option<tokio::time::Instant>,
}

/// Where fetched keys come from.
#[derive(Debug, Clone)]
pub enum JwksLocation {
    /// A JWKS URL.
    Url(String),
    /// OIDC discovery: `{issuer}/.well-known/openid-configuration` names the JWKS URL.
    Discover(String),
}

/// A JWKS fetched over HTTP, with what its refreshes need.
pub struct JwksSource {
    location: JwksLocation,
    client: reqwest::Client,
    /// When a refresh was last tried; held across a refresh so only one runs at a time.
    attempted: tokio::sync::Mutex<Option<tokio::time::Instant>>,
    /// The last max-age the provider gave (milliseconds).
    max_age_ms: std::sync::atomic::AtomicU64,
}

/// The longest a fetched JWKS (or discovery document) may be.
const MAX_JWKS_BYTES: usize = 1024 * 1024;
const DEFAULT_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(300);
const MAX_REFRESH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

impl JwksSource {
    pub fn new(location: JwksLocation) -> Self {
        let client = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(5))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("an HTTP client without TLS settings builds");
        Self {
            location,
            client,
            attempted: tokio::sync::Mutex::new(None),
            max_age_ms: std::sync::atomic::AtomicU64::new(DEFAULT_MAX_AGE.as_millis() as u64),
        }
    }

    /// How often a refresh may be tried.
    fn interval(&self) -> std::time::Duration {
        let max_age = std::time::Duration::from_millis(
            self.max_age_ms.load(std::sync::atomic::Ordering::Relaxed),
        );
        max_age.min(MAX_REFRESH_INTERVAL)
    }

    async fn get(&self, url: &str) -> Result<(bytes::Bytes, Option<u64>), String> {
        secure_url(url)?;
        let mut response = self
            .client
            .get(url)
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("{url} answered {}", response.status()));
        }
        let max_age = response
            .headers()
            .get(reqwest::header::CACHE_CONTROL)
            .and_then(|v| v.to_str().ok())
            .and_then(max_age_secs);
        if response
            .content_length()
            .is_some_and(|n| n > MAX_JWKS_BYTES as u64)
        {
            return Err(format!("{url}: longer than {MAX_JWKS_BYTES} bytes"));
        }
        // Read in chunks: a body without a length is cut off at the cap, not buffered whole.
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| format!("{url}: {e}"))? {
            if body.len() + chunk.len() > MAX_JWKS_BYTES {
                return Err(format!("{url}: longer than {MAX_JWKS_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        Ok((bytes::Bytes::from(body), max_age))
    }

    /// The provider's current keys and how long they stay fresh.
    async fn fetch(&self) -> Result<(Vec<Key>, std::time::Duration), String> {
        let url = match &self.location {
            JwksLocation::Url(url) => url.clone(),
            JwksLocation::Discover(issuer) => {
                let at = format!(
                    "{}/.well-known/openid-configuration",
                    issuer.trim_end_matches('/')
                );
                let (body, _) = self.get(&at).await?;
                let doc: serde_json::Value =
                    serde_json::from_slice(&body).map_err(|e| format!("{at}: {e}"))?;
                doc.get("jwks_uri")
                    .and_then(|v| v.as_str())
                    .ok_or_else(|| format!("{at}: no jwks_uri"))?
                    .to_owned()
            }
        };
        let (body, max_age) = self.get(&url).await?;
        let text = std::str::from_utf8(&body).map_err(|e| format!("{url}: {e}"))?;
        let keys = parse_jwks(text, true).map_err(|e| format!("{url}: {e}"))?;
        let max_age = max_age
            .map(std::time::Duration::from_secs)
            .unwrap_or(DEFAULT_MAX_AGE)
            .clamp(
                std::time::Duration::from_secs(1),
                std::time::Duration::from_secs(24 * 3600),
            );
        Ok((keys, max_age))
    }
}

/// The `max-age` of a `Cache-Control` header, in seconds.
fn max_age_secs(cache_control: &str) -> Option<u64> {
    cache_control.split(',').find_map(|part| {
        let (name, value) = part.trim().split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("max-age")
            .then(|| value.trim().trim_matches('"').parse().ok())?
    })
}

/// The usable keys of a JWKS (`{"keys": [...]}`); every key must be usable, and there must be
/// one.
/// The signing keys of a JWKS. `published`: a set fetched from an identity provider, which
/// may also list keys for other uses (encryption, algorithms not verified here): those are
/// skipped, and only a set with no usable key at all is refused. A file an operator wrote must
/// hold only usable keys.
/// Keys are fetched over https only (anyone on the path of a plain-http fetch could swap them
/// and sign as anyone), except from a loopback address (an identity provider beside the router).
pub fn secure_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("{url}: {e}"))?;
    let host = parsed.host_str().unwrap_or_default();
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    match parsed.scheme() {
        "https" => Ok(()),
        "http" if loopback => Ok(()),
        _ => Err(format!(
            "{url}: keys are fetched over https (plain http only from a loopback address)"
        )),
    }
}

fn parse_jwks(jwks: &str, published: bool) -> Result<Vec<Key>, String> {
    use jsonwebtoken::jwk::{JwkSet, PublicKeyUse};
    let set: JwkSet = serde_json::from_str(jwks).map_err(|e| format!("the JWKS: {e}"))?;
    let mut keys = Vec::new();
    for (i, jwk) in set.keys.iter().enumerate() {
        if published && matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            continue;
        }
        let parsed = (|| {
            let key = jsonwebtoken::DecodingKey::from_jwk(jwk)
                .map_err(|e| format!("the JWKS key {i}: {e}"))?;
            let alg = match jwk.common.key_algorithm {
                Some(a) => a
                    .to_string()
                    .parse::<jsonwebtoken::Algorithm>()
                    .map_err(|e| format!("the JWKS key {i}: algorithm {a}: {e}"))?,
                None => match &jwk.algorithm {
                    jsonwebtoken::jwk::AlgorithmParameters::RSA(_) => {
                        jsonwebtoken::Algorithm::RS256
                    }
                    jsonwebtoken::jwk::AlgorithmParameters::EllipticCurve(_) => {
                        jsonwebtoken::Algorithm::ES256
                    }
                    jsonwebtoken::jwk::AlgorithmParameters::OctetKeyPair(_) => {
                        jsonwebtoken::Algorithm::EdDSA
                    }
                    _ => return Err(format!("the JWKS key {i}: no usable algorithm")),
                },
            };
            Ok((jwk.common.key_id.clone(), key, alg))
        })();
        match parsed {
            Ok(key) => keys.push(key),
            Err(e) if published => tracing::debug!(error = %e, "a published key is skipped"),
            Err(e) => return Err(e),
        }
    }
    if keys.is_empty() {
        return Err("the JWKS holds no keys".to_owned());
    }
    Ok(keys)
}

impl JwtVerifier {
    /// Reads the JWKS (`{"keys": [...]}`) text; every key must be usable.
    pub fn from_jwks(jwks: &str, config: JwtConfig) -> Result<Self, String> {
        Ok(Self {
            config,
            keys: tokio::sync::RwLock::new(KeySet {
                keys: parse_jwks(jwks, false)?,
                fresh_until: None,
            }),
            source: None,
        })
    }

    /// Keys fetched from the identity provider, and refreshed (see the module's doc). The
    /// first fetch happens here; when it fails the verifier still starts (it refuses every
    /// token until the provider answers) and the error is returned beside it, to be logged.
    pub async fn fetching(location: JwksLocation, config: JwtConfig) -> (Self, Option<String>) {
        let verifier = Self {
            config,
            keys: tokio::sync::RwLock::new(KeySet {
                keys: Vec::new(),
                fresh_until: Some(tokio::time::Instant::now()),
            }),
            source: Some(JwksSource::new(location)),
        };
        let error = verifier.refresh().await.err();
        (verifier, error)
    }

    /// Fetches the keys again, unless a refresh was tried within the refresh interval. On
    /// failure the keys in use stay.
    async fn refresh(&self) -> Result<(), String> {
        let Some(source) = &self.source else {
            return Ok(());
        };
        // One refresh at a time, and nobody waits for it: while one is under way (it may take
        // seconds when the provider is slow or down), other requests go on with the keys in use.
        let Ok(mut attempted) = source.attempted.try_lock() else {
            return Ok(());
        };
        let now = tokio::time::Instant::now();
        if attempted.is_some_and(|at| now.duration_since(at) < source.interval()) {
            return Ok(());
        }
        *attempted = Some(now);
        match source.fetch().await {
            Ok((keys, max_age)) => {
                source.max_age_ms.store(
                    max_age.as_millis() as u64,
                    std::sync::atomic::Ordering::Relaxed,
                );
                *self.keys.write().await = KeySet {
                    keys,
                    fresh_until: Some(now + max_age),
                };
                Ok(())
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot refresh the JWKS; the last good keys stay in use");
                Err(e)
            }
        }
    }

    /// Whether the keys in use are past their freshness.
    async fn stale(&self) -> bool {
        self.keys
            .read()
            .await
            .fresh_until
            .is_some_and(|t| tokio::time::Instant::now() >= t)
    }

    /// Whether a key with this `kid` is in use (a token without one may use any).
    async fn knows(&self, kid: Option<&str>) -> bool {
        let Some(kid) = kid else {
            return true;
        };
        self.keys
            .read()
            .await
            .keys
            .iter()
            .any(|(k, _, _)| k.as_deref() == Some(kid))
    }

    async fn principal(&self, token: &str, header: &jsonwebtoken::Header) -> Option<Principal> {
        let keys = self.keys.read().await;
        for (kid, key, alg) in &keys.keys {
            if header.kid.is_some() && kid.is_some() && header.kid != *kid {
                continue;
            }
            if header.alg != *alg {
                continue;
            }
            let mut validation = jsonwebtoken::Validation::new(*alg);
            validation.validate_nbf = true;
            validation.set_issuer(&[&self.config.issuer]);
            validation.set_audience(&[&self.config.audience]);
            validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
            let Ok(data) = jsonwebtoken::decode::<serde_json::Value>(token, key, &validation)
            else {
                continue;
            };
            let claims = data.claims;
            let sub = claims.get("sub")?.as_str()?;
            let tenant: TenantId = claims
                .get(&self.config.tenant_claim)?
                .as_str()?
                .parse()
                .ok()?;
            // The same subject in two tenants is two identities: the tenant is part of the
            // identity's scope, so nothing keyed by identity alone can cross tenants.
            let scope = match self.config.identity_scope.as_str() {
                "" => tenant.to_string(),
                scope => format!("{scope}/{tenant}"),
            };
            let identity: Identity = format!("oidc:{scope}:{sub}").parse().ok()?;
            let admin = claims
                .get(&self.config.admin_claim)
                .and_then(|v| v.as_bool())
                .unwrap_or(false);
            return Some(Principal {
                identity,
                tenant,
                admin,
            });
        }
        None
    }
}

#[async_trait]
impl Verifier for JwtVerifier {
    async fn verify(&self, token: &str) -> Option<Principal> {
        // Three dots-separated parts of a sane length, or it is not ours to judge.
        if token.len() > MAX_TOKEN_BYTES || token.split('.').count() != 3 {
            return None;
        }
        let header = jsonwebtoken::decode_header(token).ok()?;
        if self.stale().await {
            let _ = self.refresh().await;
        }
        if let Some(principal) = self.principal(token, &header).await {
            return Some(principal);
        }
        // A key id we do not hold may be a key the provider rotated in: look again (at most
        // once per refresh interval, whatever the tokens say).
        if self.source.is_some() && !self.knows(header.kid.as_deref()).await {
            let _ = self.refresh().await;
            return self.principal(token, &header).await;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_token_file_maps_tokens_and_digests_and_refuses_bad_lines() {
        let digest = hex::encode(sha2::Sha256::digest(b"secret-bob"));
        let file = TokenFile::parse(&format!(
            "[[tokens]]\ntoken = \"dev-alice\"\nidentity = \"local:alice\"\n\n[[tokens]]\nsha256 = \"{digest}\"\nidentity = \"local:bob\"\ntenant = \"acme\"\nadmin = true\n"
        ))
        .unwrap();
        let alice = file.verify("dev-alice").await.unwrap();
        assert_eq!(alice.identity.to_string(), "local:alice");
        assert_eq!(alice.tenant.to_string(), "default");
        assert!(!alice.admin);
        let bob = file.verify("secret-bob").await.unwrap();
        assert_eq!(bob.tenant.to_string(), "acme");
        assert!(bob.admin);
        assert!(file.verify("dev-alicE").await.is_none());
        assert!(file.verify("").await.is_none());

        let both = TokenFile::parse(
            "[[tokens]]\ntoken = \"a\"\nsha256 = \"00\"\nidentity = \"local:a\"\n",
        )
        .unwrap_err();
        assert!(both.contains("tokens[0]"), "{both}");
        let bad = TokenFile::parse("[[tokens]]\ntoken = \"a\"\nidentity = \"no spaces allowed\"\n")
            .unwrap_err();
        assert!(bad.contains("tokens[0].identity"), "{bad}");
    }

    fn jwt(key: &ed25519_dalek::SigningKey, kid: &str, claims: serde_json::Value) -> String {
        use ed25519_dalek::pkcs8::EncodePrivateKey as _;
        let der = key.to_pkcs8_der().unwrap();
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
        header.kid = Some(kid.to_owned());
        jsonwebtoken::encode(
            &header,
            &claims,
            &jsonwebtoken::EncodingKey::from_ed_der(der.as_bytes()),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn jwts_are_checked_against_the_jwks_issuer_audience_expiry_and_tenant() {
        use base64::Engine as _;
        let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        let stranger = ed25519_dalek::SigningKey::from_bytes(&[8; 32]);
        let x =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes());
        let jwks = serde_json::json!({"keys": [
            {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": "k1", "alg": "EdDSA", "use": "sig"}
        ]});
        let verifier = JwtVerifier::from_jwks(
            &jwks.to_string(),
            JwtConfig {
                issuer: "https://idp.example".into(),
                audience: "turnpike".into(),
                identity_scope: "acme".into(),
                tenant_claim: "tenant".into(),
                admin_claim: "turnpike_admin".into(),
            },
        )
        .unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let claims = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut c = serde_json::json!({
                "sub": "u-17", "iss": "https://idp.example", "aud": "turnpike",
                "exp": now + 600, "tenant": "acme", "turnpike_admin": true
            });
            f(&mut c);
            c
        };
        let good = jwt(&key, "k1", claims(&|_| {}));
        let p = verifier.verify(&good).await.expect("a valid token");
        assert_eq!(p.identity.to_string(), "oidc:acme/acme:u-17");
        // The same subject in another tenant is another identity.
        let other = jwt(&key, "k1", claims(&|c| c["tenant"] = "beta".into()));
        let q = verifier.verify(&other).await.expect("a valid token");
        assert_eq!(q.identity.to_string(), "oidc:acme/beta:u-17");
        assert_ne!(p.identity, q.identity);
        assert_eq!(p.tenant.to_string(), "acme");
        assert!(p.admin);
        let plain = jwt(&key, "k1", claims(&|c| c["turnpike_admin"] = false.into()));
        assert!(!verifier.verify(&plain).await.unwrap().admin);

        let refused = [
            (
                "another audience",
                jwt(&key, "k1", claims(&|c| c["aud"] = "other".into())),
            ),
            (
                "another issuer",
                jwt(&key, "k1", claims(&|c| c["iss"] = "https://evil".into())),
            ),
            (
                "expired",
                jwt(&key, "k1", claims(&|c| c["exp"] = (now - 3600).into())),
            ),
            (
                "no tenant",
                jwt(
                    &key,
                    "k1",
                    claims(&|c| {
                        c.as_object_mut().unwrap().remove("tenant");
                    }),
                ),
            ),
            ("another key", jwt(&stranger, "k1", claims(&|_| {}))),
            ("not a JWT", "a.b.c".to_owned()),
        ];
        for (what, token) in refused {
            assert!(
                verifier.verify(&token).await.is_none(),
                "{what} must be refused"
            );
        }
        // A token file and a JWT verifier chained: either kind of token gets in.
        let mut file = TokenFile::default();
        file.insert(
            "dev",
            Principal {
                identity: "local:dev".parse().unwrap(),
                tenant: "default".parse().unwrap(),
                admin: false,
            },
        );
        let auth = Authenticator::new()
            .with(Arc::new(file))
            .with(Arc::new(verifier));
        assert_eq!(
            auth.authenticate("dev").await.unwrap().identity.to_string(),
            "local:dev"
        );
        assert_eq!(
            auth.authenticate(&good).await.unwrap().identity.to_string(),
            "oidc:acme/acme:u-17"
        );
        assert!(auth.authenticate("nope").await.is_none());
        assert!(JwtVerifier::from_jwks(
            "{\"keys\": []}",
            JwtConfig {
                issuer: "i".into(),
                audience: "a".into(),
                identity_scope: "s".into(),
                tenant_claim: "t".into(),
                admin_claim: "x".into(),
            }
        )
        .is_err());
    }
}

#[cfg(test)]
mod url_tests {
    use super::secure_url;

    #[test]
    fn keys_come_over_https_or_from_loopback_only() {
        for ok in [
            "https://idp.example/jwks",
            "http://127.0.0.1:8080/jwks",
            "http://localhost/jwks",
            "http://[::1]:9/jwks",
        ] {
            assert!(secure_url(ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://idp.example/jwks",
            "http://10.0.0.1/jwks",
            "ftp://idp.example/jwks",
            "file:///etc/jwks",
            "not a url",
        ] {
            assert!(secure_url(bad).is_err(), "{bad}");
        }
    }
}
