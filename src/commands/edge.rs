//! Mounting the HTTP/WebSocket edge: who may call (tokens, JWTs), which apps exist, and the
//! search and replay services the edge borrows from the index and the agent loop.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context as _, Result};
use async_trait::async_trait;
use sha2::Digest as _;
use turnpike_artifactory::{Conversations, DirectoryEntry, Transcript};
use turnpike_index::{Filters, Kind, Scope, SearchRequest};
use turnpike_router::edge::model::{
    AgentView, AppView, ReplayTurn, ReplayView, SearchHitView, SearchQuery, SearchResults,
};
use turnpike_router::edge::{
    ApiError, ApiResult, Authenticator, Edge, EdgeParts, JwtConfig, JwtVerifier, Limits, Principal,
    ReplayService, SearchService, TokenFile,
};
use turnpike_router::Bus;
use turnpike_schemas::TurnLog;
use turnpike_worker::Apps;

use crate::cli::{EdgeArgs, Global};
use crate::env::Env;

/// The identity the embedded default's generated token stands for.
pub const LOCAL_IDENTITY: &str = "local:me";

/// Where `turnpike serve` keeps its generated token file.
pub fn default_tokens_path(global: &Global) -> std::path::PathBuf {
    global.data_dir.join("tokens.toml")
}

/// The authenticator the flags describe. With neither `--tokens` nor `--jwks`, the embedded
/// default (`embedded`) creates `<data-dir>/tokens.toml` with one admin token for `local:me`;
/// a fleet router refuses to start without one of them.
pub fn authenticator(global: &Global, args: &EdgeArgs, embedded: bool) -> Result<Authenticator> {
    let mut auth = Authenticator::new();
    let tokens = match (&args.tokens, &args.jwks) {
        (Some(path), _) => Some(path.clone()),
        (None, None) if embedded => {
            let path = default_tokens_path(global);
            if !path.exists() {
                write_default_tokens(&path)?;
            }
            Some(path)
        }
        (None, None) => bail!("the edge needs callers: pass --tokens FILE or --jwks FILE"),
        (None, Some(_)) => None,
    };
    if let Some(path) = tokens {
        let file = TokenFile::load(&path).map_err(anyhow::Error::msg)?;
        if file.is_empty() {
            bail!("{}: no tokens", path.display());
        }
        auth = auth.with(Arc::new(file));
    }
    if let Some(path) = &args.jwks {
        if args.jwt_issuer.is_empty() {
            bail!("--jwks needs --jwt-issuer");
        }
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let verifier = JwtVerifier::from_jwks(
            &text,
            JwtConfig {
                issuer: args.jwt_issuer.clone(),
                audience: args.jwt_audience.clone(),
                identity_scope: args.jwt_identity_scope.clone(),
                tenant_claim: args.jwt_tenant_claim.clone(),
                admin_claim: args.jwt_admin_claim.clone(),
            },
        )
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        auth = auth.with(Arc::new(verifier));
    }
    Ok(auth)
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
pub fn local_token(global: &Global) -> Option<String> {
    let text = std::fs::read_to_string(default_tokens_path(global)).ok()?;
    let value: toml::Value = toml::from_str(&text).ok()?;
    value
        .get("tokens")?
        .as_array()?
        .iter()
        .find_map(|t| t.get("token")?.as_str().map(str::to_owned))
}

/// The apps and agents `apps` hosts, as the API lists them.
pub fn catalog(apps: &Apps) -> Vec<AppView> {
    apps.ids()
        .into_iter()
        .map(|app| AppView {
            id: app.to_string(),
            agents: apps
                .agent_specs(app)
                .iter()
                .map(|spec| AgentView {
                    id: spec.name.to_string(),
                    model: spec.model.clone(),
                    tools: spec.tools.specs().into_iter().map(|t| t.name).collect(),
                    context_length: spec.context_length,
                })
                .collect(),
        })
        .collect()
}

/// The edge over this process's bus, store and index.
pub fn build(
    global: &Global,
    env: &Env,
    bus: Arc<dyn Bus>,
    apps: &Apps,
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
        auth: authenticator(global, args, embedded)?,
        catalog: catalog(apps),
        search: index.map(|index| {
            Arc::new(IndexSearch {
                index,
                resolver: env.resolver(),
            }) as Arc<dyn SearchService>
        }),
        replay: Some(Arc::new(Replayer {
            conversations: env.conversations.clone(),
        })),
        limits: Limits {
            rate_per_second: args.rate_per_second,
            burst: args.rate_burst,
            max_in_flight: args.max_in_flight,
            ..Limits::default()
        },
        link_key,
        directive: None,
    }))
}

/// `/v1/search` over the hybrid index.
struct IndexSearch {
    index: turnpike_index::Index,
    resolver: turnpike_resolver::Resolver,
}

fn index_error(e: turnpike_index::Error) -> ApiError {
    match e.kind() {
        turnpike_index::ErrorKind::Invalid => ApiError::invalid(e.to_string()),
        _ => ApiError::unavailable(e.to_string()),
    }
}

#[async_trait]
impl SearchService for IndexSearch {
    async fn search(&self, caller: &Principal, query: SearchQuery) -> ApiResult<SearchResults> {
        let mut request = SearchRequest::new(query.q);
        if let Some(mode) = &query.mode {
            request.mode = mode
                .parse()
                .map_err(|e: turnpike_index::Error| ApiError::invalid(format!("mode: {e}")))?;
        }
        request.filters = Filters {
            app: query.app,
            agent: query.agent,
            conversation: query.conversation,
            kinds: match &query.kinds {
                Some(list) => list
                    .split(',')
                    .filter(|k| !k.trim().is_empty())
                    .map(|k| k.trim().parse::<Kind>())
                    .collect::<Result<_, _>>()
                    .map_err(|e| ApiError::invalid(format!("kinds: {e}")))?,
                None => Vec::new(),
            },
            since_ms: None,
            until_ms: None,
        };
        request.limit = query.limit.unwrap_or(10) as usize;
        request.offset = query.offset.unwrap_or(0) as usize;
        request.validate().map_err(index_error)?;
        let scope = Scope::new(caller.tenant.to_string(), caller.identity.to_string());
        let page = turnpike_index::hydrate::search(
            &self.index,
            &self.resolver,
            &caller.identity,
            &scope,
            &request,
        )
        .await
        .map_err(index_error)?;
        Ok(SearchResults {
            hits: page
                .hits
                .into_iter()
                .map(|h| SearchHitView {
                    conversation: h.conversation,
                    turn: format!("turn_{}", h.turn),
                    kind: h.kind.as_str().to_owned(),
                    reference: h.reference,
                    app: h.app,
                    agent: h.agent,
                    at_ms: h.at_ms,
                    score: h.score,
                    snippet: h.snippet.unwrap_or_default(),
                })
                .collect(),
            next_offset: page.next_offset.map(|o| o as u32),
        })
    }
}

/// The committed turns' logs of a conversation, checked against the digests its record holds.
pub async fn recorded_logs(
    conversations: &Conversations,
    entry: &DirectoryEntry,
) -> turnpike_artifactory::Result<Vec<TurnLog>> {
    let record = turnpike_artifactory::Record::new(conversations.store().clone(), entry.prefix());
    let transcript = Transcript::from_entries(&record.entries().await?);
    let logs = conversations.turn_logs();
    let mut recorded = Vec::new();
    for view in &transcript.committed {
        let Some(complete) = &view.complete else {
            continue;
        };
        recorded.push(
            logs.read_checked(&entry.prefix(), view.turn, complete.log_sha256.as_deref())
                .await?,
        );
    }
    Ok(recorded)
}

/// `/v1/admin/…/replay` through the agent loop's replay.
struct Replayer {
    conversations: Conversations,
}

#[async_trait]
impl ReplayService for Replayer {
    async fn replay(&self, entry: &DirectoryEntry) -> ApiResult<ReplayView> {
        let logs = recorded_logs(&self.conversations, entry).await?;
        let replays = turnpike_worker::replay::replay(&logs, None).await;
        let turns: Vec<ReplayTurn> = replays
            .iter()
            .map(|r| ReplayTurn {
                turn: r.turn.to_string(),
                reproduced: r.divergence.is_none(),
                divergence: r.divergence.as_ref().map(|d| d.to_string()),
            })
            .collect();
        Ok(ReplayView {
            conversation: entry.conversation.to_string(),
            reproduced: turns.iter().all(|t| t.reproduced),
            turns,
        })
    }
}
