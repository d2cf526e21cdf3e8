//! The environment commands run in: the store, the signing key and the trusted checkpoints.

use anyhow::{bail, Context as _, Result};
use std::path::PathBuf;
use std::sync::Arc;
use turnpike_artifactory::{
    open_local, open_store_with, Checkpoint, Conversations, LocalLayout, RecordSigner, TrustedKeys,
};
use turnpike_schemas::ConversationId;
use turnpike_worker::{Apps, EchoAgent, Registry};

use crate::cli::Global;

/// The built-in demo app: its manifest and its script.
const DEMO_MANIFEST: &str = include_str!("../apps/demo.toml");
const DEMO_SCRIPT: &str = include_str!("../apps/demo.script.toml");

/// Everything a command needs from the configuration.
pub struct Env {
    pub conversations: Conversations,
    pub signer: RecordSigner,
    pub trusted: TrustedKeys,
    /// Who may run operator commands on any conversation of their tenant.
    pub admins: Vec<turnpike_schemas::Identity>,
    data_dir: PathBuf,
    apps_dir: Option<PathBuf>,
}

impl Env {
    /// Opens the configured store and signing key.
    ///
    /// The embedded default (no `--store`) keeps a key under the data directory, creating it on
    /// first use. A fleet store requires a key from the environment or a file: the binary refuses
    /// to invent one there, since every worker must sign with a key the verifiers trust.
    pub fn open(global: &Global) -> Result<Self> {
        let embedded = global.store.is_none();
        let store = match &global.store {
            Some(location) => open_store_with(location, !global.no_fsync)?,
            None => {
                let dir = global.data_dir.join("store");
                let layout = global.local_store.map(|l| match l {
                    crate::cli::LocalStore::Sqlite => LocalLayout::Sqlite,
                    crate::cli::LocalStore::Files => LocalLayout::Files,
                });
                open_local(&dir.to_string_lossy(), layout, !global.no_fsync)?
            }
        };
        let signer = if let Ok(hex) = std::env::var("TURNPIKE_SIGNING_KEY") {
            RecordSigner::from_hex(&hex).context("TURNPIKE_SIGNING_KEY")?
        } else if let Some(path) = &global.signing_key {
            RecordSigner::load(path)?
        } else if embedded {
            RecordSigner::load_or_create(&global.data_dir.join("keys/record-signing.key"))?
        } else {
            bail!(
                "a record signing key is required with --store: set TURNPIKE_SIGNING_KEY (64 hex characters) or pass --signing-key FILE"
            );
        };
        let mut keys = vec![signer.verifying_key()];
        for text in &global.trusted_keys {
            keys.push(
                TrustedKeys::parse_public(text).with_context(|| format!("--trusted-key {text}"))?,
            );
        }
        let mut conversations =
            Conversations::new(store.clone()).trusting(TrustedKeys::new(keys.clone()));
        // Users' connections are sealed with the deployment's connection key: from the
        // environment, or (embedded) a key file made under the data directory. A fleet without
        // one has no connections; the API says how to give it one.
        let connection_key = std::env::var("TURNPIKE_CONNECTION_KEY").map(|k| k.trim().to_owned());
        if let Some(hex) = connection_key.ok().filter(|k| !k.is_empty()) {
            conversations = conversations.with_connection_key(
                turnpike_artifactory::ConnectionKey::from_hex(&hex)
                    .context("TURNPIKE_CONNECTION_KEY")?,
            );
        } else if embedded {
            conversations = conversations.with_connection_key(
                turnpike_artifactory::ConnectionKey::load_or_create(
                    &global.data_dir.join("keys/connection.key"),
                )?,
            );
        }
        Ok(Env {
            conversations,
            signer,
            trusted: TrustedKeys::new(keys),
            admins: global.admins.clone(),
            data_dir: global.data_dir.clone(),
            apps_dir: global.apps.clone(),
        })
    }

    /// The apps this process hosts: the manifests under `<data-dir>/apps` (the built-in demo
    /// app is written there when missing; `overwrite_demo` rewrites it) and under `--apps`.
    /// Conversations of an app hosted nowhere get the echo app. A bad manifest is refused
    /// with its file, field and reason.
    pub fn apps(&self, overwrite_demo: bool) -> Result<Arc<Apps>> {
        let dir = self.data_dir.join("apps");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for (name, text) in [
            ("demo.toml", DEMO_MANIFEST),
            ("demo.script.toml", DEMO_SCRIPT),
        ] {
            let path = dir.join(name);
            if overwrite_demo || !path.exists() {
                std::fs::write(&path, text)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
        }
        let registry = Registry::builtin();
        let mut apps = Apps::new()
            .with_fallback(Arc::new(EchoAgent))
            .load_dir(&dir, &registry)
            .map_err(anyhow::Error::msg)?;
        if let Some(extra) = &self.apps_dir {
            apps = apps
                .load_dir(extra, &registry)
                .map_err(anyhow::Error::msg)?;
        }
        Ok(Arc::new(apps))
    }

    /// Opens a conversation for an operator command (`command`): its owner or a grantee, or an
    /// admin of its tenant (logged with who did it). Anyone else, and any other tenant's
    /// conversation, is not found.
    pub async fn open_for(
        &self,
        command: &str,
        conversation: turnpike_schemas::ConversationId,
        tenant: &turnpike_schemas::TenantId,
        actor: &turnpike_schemas::Identity,
    ) -> Result<(
        turnpike_artifactory::DirectoryEntry,
        turnpike_artifactory::Record,
    )> {
        if !self.admins.contains(actor) {
            return Ok(self.conversations.open(conversation, tenant, actor).await?);
        }
        let entry = self
            .conversations
            .directory()
            .lookup_in_tenant(conversation, tenant)
            .await?;
        tracing::warn!(admin = %actor, %tenant, %conversation, command, "operator command run by an admin");
        eprintln!("admin {actor} ran `{command}` on {conversation} (tenant {tenant})");
        let record = self.conversations.record(entry.prefix());
        Ok((entry, record))
    }

    /// The resolver over this environment's store (references → bytes, as an identity).
    pub fn resolver(&self) -> turnpike_resolver::Resolver {
        turnpike_resolver::Resolver::standard(
            self.conversations.directory().clone(),
            self.conversations.store().clone(),
        )
    }

    fn checkpoint_path(&self, conversation: ConversationId) -> PathBuf {
        self.data_dir
            .join("trust")
            .join(format!("{conversation}.json"))
    }

    /// The last checkpoint this machine verified for a conversation.
    pub fn checkpoint(&self, conversation: ConversationId) -> Result<Option<Checkpoint>> {
        let path = self.checkpoint_path(conversation);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(
                serde_json::from_slice(&bytes)
                    .with_context(|| format!("reading {}", path.display()))?,
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Keeps a verified checkpoint (written to a temporary file, then renamed).
    pub fn save_checkpoint(
        &self,
        conversation: ConversationId,
        checkpoint: &Checkpoint,
    ) -> Result<()> {
        let path = self.checkpoint_path(conversation);
        let dir = path.parent().expect("checkpoints live in a directory");
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(checkpoint)?)?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
        Ok(())
    }

    /// Forgets the checkpoint (after a repair rewrote history on purpose).
    pub fn forget_checkpoint(&self, conversation: ConversationId) -> Result<()> {
        match std::fs::remove_file(self.checkpoint_path(conversation)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The hybrid index the flags select, or why there is none (search is then off; nothing else
/// depends on it).
/// Whether this deployment has an index: a Postgres URL, or an embedded index in the data
/// directory.
pub fn index_configured(global: &Global) -> bool {
    global.index.database_url.is_some() || global.data_dir.join("index").exists()
}

pub async fn open_index(global: &Global) -> Result<turnpike_index::Index, String> {
    use turnpike_index::embed::{Embedder, MiniLm, OpenAiEmbedder};
    let args = &global.index;
    let embedder: Arc<dyn Embedder> = match &args.embeddings_url {
        Some(url) => {
            let key = (!args.embeddings_key_env.is_empty())
                .then(|| std::env::var(&args.embeddings_key_env).ok())
                .flatten();
            Arc::new(
                OpenAiEmbedder::new(url, &args.embeddings_model, key, args.embeddings_dimension)
                    .map_err(|e| e.to_string())?,
            )
        }
        None => {
            let dir = args.embedding_model.clone();
            let model = tokio::task::spawn_blocking(move || MiniLm::load(&dir))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
            Arc::new(model)
        }
    };
    let backend: Arc<dyn turnpike_index::Backend> = match &args.database_url {
        Some(url) => Arc::new(
            turnpike_index::postgres::PgIndex::connect(url, embedder.dimension())
                .await
                .map_err(|e| format!("the index in Postgres: {e}"))?,
        ),
        None => {
            let dir = global.data_dir.join("index");
            Arc::new(
                turnpike_index::embedded::EmbeddedIndex::open(&dir).map_err(|e| {
                    format!(
                        "the embedded index {}: {e} (is `turnpike serve` running on this data directory?)",
                        dir.display()
                    )
                })?,
            )
        }
    };
    Ok(turnpike_index::Index::new(backend, embedder))
}
