//! Mounting the HTTP/WebSocket edge: who may call (tokens, JWTs), which apps exist, and the
//! keys its links are signed with.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context as _, Result};
use sha2::Digest as _;
use turnpike_edge::auth::JwksLocation;
use turnpike_edge::{Authenticator, Edge, EdgeParts, JwtConfig, JwtVerifier, Limits, TokenFile};
use turnpike_router::Bus;
use turnpike_worker::Apps;

use crate::cli::{EdgeArgs, Global};
use crate::env::Env;

/// The identity the embedded default's generated token stands for.
pub const LOCAL_IDENTITY: &str = "local:me";

/// Where `turnpike serve` keeps its generated token file.
pub fn default_tokens_path(global: &Global) -> std::path::PathBuf {
    global.data_dir.join("tokens.toml")
}

/// The authenticator the flags describe. With neither `--tokens` nor a JWKS (`--jwks`,
/// `--jwks-url`, `--jwt-discover`), the embedded default (`embedded`) creates
/// `<data-dir>/tokens.toml` with one admin token for `local:me`; a fleet router refuses to
/// start without one of them.
pub async fn authenticator(
    global: &Global,
    args: &EdgeArgs,
    embedded: bool,
) -> Result<Authenticator> {
    let mut auth = Authenticator::new();
    let tokens = match (&args.tokens, args.has_jwt()) {
        (Some(path), _) => Some(path.clone()),
        (None, false) if embedded => {
            let path = default_tokens_path(global);
            if !path.exists() {
                write_default_tokens(&path)?;
            }
            Some(path)
        }
        (None, false) => {
            bail!("the edge needs callers: pass --tokens FILE, --jwks FILE, --jwks-url URL or --jwt-discover")
        }
        (None, true) => None,
    };
    if let Some(path) = tokens {
        let file = TokenFile::load(&path).map_err(anyhow::Error::msg)?;
        if file.is_empty() {
            bail!("{}: no tokens", path.display());
        }
        auth = auth.with(Arc::new(file));
    }
    if !args.has_jwt() {
        return Ok(auth);
    }
    if args.jwt_issuer.is_empty() {
        bail!("--jwks, --jwks-url and --jwt-discover need --jwt-issuer");
    }
    let config = JwtConfig {
        issuer: args.jwt_issuer.clone(),
        audience: args.jwt_audience.clone(),
        identity_scope: args.jwt_identity_scope.clone(),
        tenant_claim: args.jwt_tenant_claim.clone(),
        admin_claim: args.jwt_admin_claim.clone(),
    };
    let location = match (&args.jwks, &args.jwks_url, args.jwt_discover) {
        (Some(path), None, false) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let verifier = JwtVerifier::from_jwks(&text, config)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            return Ok(auth.with(Arc::new(verifier)));
        }
        (None, Some(url), false) => {
            turnpike_edge::auth::secure_url(url).map_err(|e| anyhow::anyhow!("--jwks-url {e}"))?;
            JwksLocation::Url(url.clone())
        }
        (None, None, true) => {
            turnpike_edge::auth::secure_url(&args.jwt_issuer)
                .map_err(|e| anyhow::anyhow!("--jwt-issuer {e}"))?;
            JwksLocation::Discover(args.jwt_issuer.clone())
        }
        _ => bail!("give one of --jwks, --jwks-url or --jwt-discover"),
    };
    let (verifier, error) = JwtVerifier::fetching(location.clone(), config).await;
    if let Some(e) = error {
        tracing::warn!(?location, error = %e, "cannot fetch the JWKS yet: JWTs are refused until the identity provider answers");
    }
    Ok(auth.with(Arc::new(verifier)))
}

fn write_default_tokens(path: &Path) -> Result<()> {
    let mut secret = [0u8; 24];
    getrandom::getrandom(&mut secret).context("generating a token")?;
    let token = format!("tp_{}", hex::encode(secret));
    let text = format!(
        "# Bearer tokens for this data directory's API (`turnpike serve`). Add lines to let others in:\n\
         # [[tokens]]\n# token = \"…\"   (or sha256 = \"<hex digest of the token>\")\n# identity = \"local:ana\"\n# tenant = \"default\"\n# admin = false\n\n\
         [[tokens]]\ntoken = \"{token}\"\nidentity = \"{LOCAL_IDENTITY}\"\ntenant = \"default\"\nadmin = true\n"
    );
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

/// The first token of the local token file (what `turnpike chat` uses by default).
/// A client of the API at `url` as `token`, or as the token `turnpike serve` generated when
/// none is given (`turnpike chat`, `turnpike schedule`).
pub fn api_client(
    global: &Global,
    url: &str,
    token: Option<&str>,
) -> anyhow::Result<turnpike_edge::client::Client> {
    use anyhow::Context as _;
    let token = token
        .map(str::to_owned)
        .or_else(|| local_token(global))
        .context("no token: pass --token (or TURNPIKE_TOKEN); `turnpike serve` writes one to <data-dir>/tokens.toml")?;
    Ok(turnpike_edge::client::Client::new(url, &token))
}

pub fn local_token(global: &Global) -> Option<String> {
    let text = std::fs::read_to_string(default_tokens_path(global)).ok()?;
    let value: toml::Value = toml::from_str(&text).ok()?;
    value
        .get("tokens")?
        .as_array()?
        .iter()
        .find_map(|t| t.get("token")?.as_str().map(str::to_owned))
}

/// The edge over this process's bus, store and index.
pub async fn build(
    global: &Global,
    env: &Env,
    bus: Arc<dyn Bus>,
    apps: &Arc<Apps>,
    index: Option<turnpike_index::Index>,
    args: &EdgeArgs,
    embedded: bool,
) -> Result<Edge> {
    let link_key: [u8; 32] =
        sha2::Sha256::digest(format!("turnpike file links\0{}", env.signer.to_hex())).into();
    Ok(Edge::new(EdgeParts {
        bus,
        conversations: env.conversations.clone(),
        trusted: env.trusted.clone(),
        signer: env.signer.clone(),
        auth: authenticator(global, args, embedded).await?,
        apps: Arc::new(crate::hosted::AppsCatalog(apps.clone())),
        replayer: Arc::new(crate::hosted::AgentReplayer),
        search: index,
        limits: Limits {
            rate_per_second: args.rate_per_second,
            burst: args.rate_burst,
            max_in_flight: args.max_in_flight,
            drain_grace: std::time::Duration::from_millis(args.ws_grace_ms),
            ..Limits::default()
        },
        link_key,
        directive: (args.max_rounds.is_some() || args.required_approver.is_some()).then(|| {
            turnpike_schemas::entry::IngressDirective {
                max_rounds: args.max_rounds,
                required_approver: args.required_approver.clone(),
            }
        }),
        budgets: global.budgets.clone(),
        book: args
            .book
            .as_deref()
            .map(turnpike_edge::book::Book::load)
            .transpose()
            .map_err(anyhow::Error::msg)?,
    }))
}
