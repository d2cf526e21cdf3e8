//! Who may call, through the API of `turnpike serve`: JWTs checked against the keys an
//! identity provider publishes (found by OIDC discovery from a local provider in this file),
//! every forged or misdated token refused, and the provider's keys rotated without a restart —
//! the last good keys serving while the provider is down.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use turnpike_edge::client::Client;
use turnpike_tests::edge::Server;

const LONG: Duration = Duration::from_secs(60);

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_turnpike"))
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A key of the provider: an Ed25519 key with its `kid`.
struct Key {
    kid: String,
    signing: ed25519_dalek::SigningKey,
}

impl Key {
    fn new(kid: &str, seed: u8) -> Key {
        Key {
            kid: kid.to_owned(),
            signing: ed25519_dalek::SigningKey::from_bytes(&[seed; 32]),
        }
    }

    fn public(&self) -> Value {
        json!({"kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig", "kid": self.kid,
               "x": b64(self.signing.verifying_key().as_bytes())})
    }

    fn sign(&self, header: jsonwebtoken::Header, claims: &Value) -> String {
        use ed25519_dalek::pkcs8::EncodePrivateKey as _;
        let der = self.signing.to_pkcs8_der().unwrap();
        jsonwebtoken::encode(
            &header,
            claims,
            &jsonwebtoken::EncodingKey::from_ed_der(der.as_bytes()),
        )
        .unwrap()
    }

    /// A token under this key's `kid`.
    fn token(&self, claims: &Value) -> String {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
        header.kid = Some(self.kid.clone());
        self.sign(header, claims)
    }
}

/// A local identity provider: OIDC discovery and a JWKS (max-age 1 s) it can change or stop
/// serving.
struct Idp {
    issuer: String,
    keys: Arc<Mutex<Vec<Value>>>,
    down: Arc<AtomicBool>,
    /// JWKS requests answered while down.
    asked_while_down: Arc<AtomicUsize>,
}

impl Idp {
    async fn start(keys: Vec<Value>) -> Idp {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let issuer = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
        let idp = Idp {
            issuer: issuer.clone(),
            keys: Arc::new(Mutex::new(keys)),
            down: Arc::new(AtomicBool::new(false)),
            asked_while_down: Arc::new(AtomicUsize::new(0)),
        };
        let (keys, down, asked) = (
            idp.keys.clone(),
            idp.down.clone(),
            idp.asked_while_down.clone(),
        );
        tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let (keys, down, asked, issuer) =
                    (keys.clone(), down.clone(), asked.clone(), issuer.clone());
                tokio::spawn(async move {
                    let mut socket = BufReader::new(socket);
                    let mut first = String::new();
                    if socket.read_line(&mut first).await.unwrap_or(0) == 0 {
                        return;
                    }
                    loop {
                        let mut line = String::new();
                        if socket.read_line(&mut line).await.unwrap_or(0) == 0 || line == "\r\n" {
                            break;
                        }
                    }
                    let (status, body) = if down.load(Ordering::SeqCst) {
                        asked.fetch_add(1, Ordering::SeqCst);
                        ("503 Service Unavailable", "{}".to_owned())
                    } else if first.contains("/.well-known/openid-configuration") {
                        let doc =
                            json!({"issuer": issuer, "jwks_uri": format!("{issuer}/jwks.json")});
                        ("200 OK", doc.to_string())
                    } else if first.contains("/jwks.json") {
                        let set = json!({"keys": *keys.lock().unwrap()});
                        ("200 OK", set.to_string())
                    } else {
                        ("404 Not Found", "{}".to_owned())
                    };
                    let reply = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncache-control: public, max-age=1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = socket.write_all(reply.as_bytes()).await;
                });
            }
        });
        idp
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn claims(issuer: &str) -> Value {
    json!({"sub": "u-17", "iss": issuer, "aud": "turnpike", "exp": now() + 600,
           "iat": now(), "tenant": "acme"})
}

async fn status(server: &Server, token: &str) -> u16 {
    Client::new(&server.base, token)
        .get("/v1/conversations")
        .await
        .unwrap()
        .status
}

/// Waits until a call with `token` answers `want`.
async fn until_status(server: &Server, token: &str, want: u16, what: &str) {
    let deadline = Instant::now() + LONG;
    loop {
        let got = status(server, token).await;
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: still {got}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn serve(idp: &Idp) -> Server {
    Server::start(
        &binary(),
        None,
        &["--jwt-discover", "--jwt-issuer", &idp.issuer],
        false,
    )
    .expect("turnpike serve")
}

/// Item 8 of the third adversarial look: every forged, misdated or malformed token is refused
/// through the API, a valid one is let in as its tenant's identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_misdated_and_malformed_jwts_are_refused_through_the_api() {
    let key = Key::new("k1", 7);
    let idp = Idp::start(vec![key.public()]).await;
    let server = serve(&idp);
    let good = key.token(&claims(&idp.issuer));
    assert_eq!(status(&server, &good).await, 200);
    let who = Client::new(&server.base, &good)
        .get("/v1/me")
        .await
        .unwrap();
    assert!(who.body.to_string().contains("u-17"), "{:?}", who.body);

    let changed = |f: &dyn Fn(&mut Value)| {
        let mut c = claims(&idp.issuer);
        f(&mut c);
        c
    };
    let stranger = Key::new("k1", 8);
    let mut cases: Vec<(&str, String)> = vec![
        (
            "not before an hour from now",
            key.token(&changed(&|c| c["nbf"] = (now() + 3600).into())),
        ),
        (
            "expired",
            key.token(&changed(&|c| c["exp"] = (now() - 3600).into())),
        ),
        (
            "another audience",
            key.token(&changed(&|c| c["aud"] = "other".into())),
        ),
        (
            "another issuer",
            key.token(&changed(&|c| c["iss"] = "https://evil.example".into())),
        ),
        (
            "no exp",
            key.token(&changed(&|c| {
                c.as_object_mut().unwrap().remove("exp");
            })),
        ),
        (
            "no tenant",
            key.token(&changed(&|c| {
                c.as_object_mut().unwrap().remove("tenant");
            })),
        ),
        (
            "another key under the same kid",
            stranger.token(&claims(&idp.issuer)),
        ),
        (
            "an unknown kid",
            Key::new("k9", 7).token(&claims(&idp.issuer)),
        ),
    ];
    // alg none.
    let header = b64(br#"{"alg":"none","typ":"JWT","kid":"k1"}"#);
    let payload = b64(claims(&idp.issuer).to_string().as_bytes());
    cases.push(("alg none", format!("{header}.{payload}.")));
    // HS256 keyed with the public key.
    let mut hs = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    hs.kid = Some("k1".into());
    cases.push((
        "HS256 keyed with the public key",
        jsonwebtoken::encode(
            &hs,
            &claims(&idp.issuer),
            &jsonwebtoken::EncodingKey::from_secret(key.signing.verifying_key().as_bytes()),
        )
        .unwrap(),
    ));
    // The stranger's key embedded in the header, signed by the stranger.
    let mut embedded = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
    embedded.kid = Some("k1".into());
    embedded.jwk = Some(serde_json::from_value(stranger.public()).unwrap());
    cases.push((
        "an embedded jwk",
        stranger.sign(embedded, &claims(&idp.issuer)),
    ));
    // A tampered payload: another tenant under the good signature.
    let parts: Vec<&str> = good.split('.').collect();
    let other = b64(changed(&|c| c["tenant"] = "beta".into())
        .to_string()
        .as_bytes());
    cases.push((
        "a tampered payload",
        format!("{}.{other}.{}", parts[0], parts[2]),
    ));
    for (what, token) in &cases {
        assert_eq!(status(&server, token).await, 401, "{what} must be refused");
    }
    // A 200 KB header is refused unread (by the verifier, or before it by the HTTP server).
    let huge = format!("{}.{payload}.{}", b64(&vec![b'a'; 150_000]), parts[2]);
    let got = status(&server, &huge).await;
    assert!(matches!(got, 400 | 401 | 431), "a 200 KB token: {got}");
    // The good token still works after all that.
    assert_eq!(status(&server, &good).await, 200);
}

/// Item 8: keys come from the provider and rotate without a restart: a new key is picked up,
/// a removed one stops working, and while the provider is down the last good keys serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_keys_are_picked_up_without_a_restart_and_survive_the_provider_going_down() {
    let old = Key::new("k1", 7);
    let new = Key::new("k2", 9);
    // Providers also publish keys for other uses (encryption): they are skipped, not fatal.
    let encryption = json!({"kty": "RSA", "use": "enc", "alg": "RSA-OAEP", "kid": "enc-1",
        "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw",
        "e": "AQAB"});
    let idp = Idp::start(vec![old.public(), encryption]).await;
    let server = serve(&idp);
    let with_old = old.token(&claims(&idp.issuer));
    let with_new = new.token(&claims(&idp.issuer));
    assert_eq!(status(&server, &with_old).await, 200);
    assert_eq!(status(&server, &with_new).await, 401, "not published yet");
    // The provider publishes the new key beside the old one: a token under it gets in.
    idp.keys.lock().unwrap().push(new.public());
    until_status(&server, &with_new, 200, "the new key").await;
    assert_eq!(status(&server, &with_old).await, 200);
    // The old key is withdrawn: once the cached set expires, it stops working.
    idp.keys.lock().unwrap().remove(0);
    until_status(&server, &with_old, 401, "the withdrawn key").await;
    assert_eq!(status(&server, &with_new).await, 200);
    // The provider goes down: the server asks it again (its set expired), and every answer
    // meanwhile still lets the new key in.
    idp.down.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + LONG;
    while idp.asked_while_down.load(Ordering::SeqCst) < 2 {
        assert!(Instant::now() < deadline, "the server never asked again");
        assert_eq!(
            status(&server, &with_new).await,
            200,
            "the last good keys serve"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(status(&server, &with_new).await, 200);
    assert_eq!(status(&server, &with_old).await, 401);
}

/// Two sources of keys at once (a file and a URL, or a URL and discovery) are refused at
/// start, with a reason: which keys would verify a token must never be a guess.
#[test]
fn two_sources_of_keys_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, r#"{"keys":[]}"#).unwrap();
    let jwks = jwks.display().to_string();
    for sources in [
        vec!["--jwks", &jwks, "--jwks-url", "http://127.0.0.1:9/jwks"],
        vec!["--jwks-url", "http://127.0.0.1:9/jwks", "--jwt-discover"],
    ] {
        let out = std::process::Command::new(binary())
            .args(["--data-dir", &dir.path().join("data").display().to_string()])
            .args(["--admin-listen", "off"])
            .arg("serve")
            .args([
                "--listen",
                "127.0.0.1:0",
                "--jwt-issuer",
                "https://idp.example",
            ])
            .args(&sources)
            .env_remove("TURNPIKE_CONFIG")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{sources:?} started");
        assert!(
            stderr.contains("give one of --jwks, --jwks-url or --jwt-discover"),
            "{sources:?}: {stderr}"
        );
    }
}
