//! `turnpike serve` as a separate process with its API on a free loopback port, and clients of
//! it for several identities.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use turnpike_edge::client::Client;

use crate::process::Process;
use crate::services::free_port;

/// Tokens every test server accepts.
pub const ALICE: &str = "token-alice";
pub const BOB: &str = "token-bob";
pub const ADMIN: &str = "token-admin";
/// `local:alice` again, but in tenant `beta`: another person who happens to share the name.
pub const ALICE_OF_BETA: &str = "token-alice-beta";
/// An admin of tenant `beta`.
pub const BETA_ADMIN: &str = "token-beta-admin";

const TOKENS: &str = r#"
[[tokens]]
token = "token-alice"
identity = "local:alice"

[[tokens]]
token = "token-bob"
identity = "local:bob"

[[tokens]]
token = "token-admin"
identity = "local:operator"
admin = true

[[tokens]]
token = "token-alice-beta"
identity = "local:alice"
tenant = "beta"

[[tokens]]
token = "token-beta-admin"
identity = "local:beta-operator"
tenant = "beta"
admin = true
"#;

/// Writes the tokens every test server accepts ([`ALICE`], [`BOB`], [`ADMIN`], …) into `dir`;
/// returns the file, for `--tokens`.
pub fn tokens_file(dir: &Path) -> Result<PathBuf> {
    let tokens = dir.join("test-tokens.toml");
    std::fs::write(&tokens, TOKENS)?;
    Ok(tokens)
}

/// A running `turnpike serve`.
pub struct Server {
    pub process: Process,
    pub base: String,
    pub data: tempfile::TempDir,
    binary: PathBuf,
    args: Vec<String>,
    envs: Vec<(&'static str, String)>,
}

impl Server {
    /// Starts `turnpike serve` (the binary at `binary`) on a fresh data directory, hosting the
    /// app manifests in `apps` too, with `extra` flags. With `search`, the embedding model is
    /// passed so the index is on.
    pub fn start(binary: &Path, apps: Option<&Path>, extra: &[&str], search: bool) -> Result<Self> {
        Self::start_with_env(binary, apps, extra, search, &[])
    }

    /// [`Self::start`] with more environment variables (`RUST_LOG` among them overrides the
    /// default `warn`).
    pub fn start_with_env(
        binary: &Path,
        apps: Option<&Path>,
        extra: &[&str],
        search: bool,
        more: &[(&'static str, String)],
    ) -> Result<Self> {
        let data = tempfile::tempdir()?;
        let tokens = tokens_file(data.path())?;
        let port = free_port()?;
        let mut args: Vec<String> = vec!["--data-dir".into(), data.path().display().to_string()];
        if let Some(apps) = apps {
            args.extend(["--apps".into(), apps.display().to_string()]);
        }
        args.extend([
            "serve".into(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--tokens".into(),
            tokens.display().to_string(),
        ]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut envs = vec![("RUST_LOG", "warn".to_owned())];
        let model = crate::index::model_dir().display().to_string();
        envs.push((
            "TURNPIKE_EMBEDDING_MODEL",
            if search {
                model
            } else {
                "/nonexistent-model".into()
            },
        ));
        for (key, value) in more {
            envs.retain(|(k, _)| k != key);
            envs.push((key, value.clone()));
        }
        let process = Self::launch(binary, &args, &envs)?;
        Ok(Self {
            process,
            base: format!("http://127.0.0.1:{port}"),
            data,
            binary: binary.to_path_buf(),
            args,
            envs,
        })
    }

    fn launch(binary: &Path, args: &[String], envs: &[(&str, String)]) -> Result<Process> {
        let mut process = Process::start(binary, args, envs)?;
        process.wait_for_line("API listening on", Duration::from_secs(120))?;
        process.wait_for_line("worker wkr_", Duration::from_secs(120))?;
        Ok(process)
    }

    /// Kills the server (no goodbye) and starts it again on the same data and address.
    pub fn restart(&mut self) -> Result<()> {
        self.process.kill();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            match Self::launch(&self.binary, &self.args, &self.envs) {
                Ok(p) => {
                    self.process = p;
                    return Ok(());
                }
                // The address may take a moment to be free again.
                Err(e) if std::time::Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A client holding `token`.
    pub fn client(&self, token: &str) -> Client {
        Client::new(&self.base, token)
    }

    /// The data directory's object store (to check what was written).
    pub fn store_dir(&self) -> PathBuf {
        self.data.path().join("store")
    }
}

/// Every file under `dir`, relative, sorted: a fingerprint of what a store holds. Records'
/// head hints (and their staging files) are left out: they are caches, rewritten in the
/// background after appends.
pub fn files_under(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, out);
            } else if let Ok(rel) = path.strip_prefix(root) {
                // The hint and the staging file a local store writes it through
                // (`record-head#N`, renamed into place) are caches written in the background.
                let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                if name != "record-head" && !name.starts_with("record-head#") {
                    out.push(rel.display().to_string());
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// One turn as a client reads it from the record's rows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TurnSummary {
    pub turn: String,
    /// The texts of the messages and follow-ups committed just before (and within) it.
    pub inputs: Vec<String>,
    pub replies: Vec<String>,
    /// `replied`, `cancelled`, … once complete.
    pub outcome: Option<String>,
    /// The reason recorded on a cancelled turn.
    pub cancel_reason: Option<String>,
}

/// The turns of a conversation as its rows show them, in order.
pub fn turns_of(rows: &[serde_json::Value]) -> Vec<TurnSummary> {
    let mut turns: Vec<TurnSummary> = Vec::new();
    let mut pending: Vec<String> = Vec::new();
    for row in rows {
        let kind = row["kind"].as_str().unwrap_or_default();
        let text = row["text"].as_str().map(str::to_owned);
        match kind {
            "user_message" | "follow_up" => pending.extend(text),
            "turn_dispatched" => turns.push(TurnSummary {
                turn: row["turn"].as_str().unwrap_or_default().to_owned(),
                inputs: std::mem::take(&mut pending),
                ..Default::default()
            }),
            "assistant_message" => {
                if let Some(t) = turns.last_mut() {
                    t.replies.extend(text);
                }
            }
            "cancelled" => {
                if let Some(t) = turns.last_mut() {
                    t.cancel_reason = row["data"]["reason"].as_str().map(str::to_owned);
                }
            }
            "turn_complete" => {
                if let Some(t) = turns.last_mut() {
                    t.outcome = row["data"]["outcome"].as_str().map(str::to_owned);
                }
            }
            _ => {}
        }
        // Inputs folded into a running turn belong to it.
        if kind == "follow_up" && turns.last().is_some_and(|t| t.outcome.is_none()) {
            let folded = std::mem::take(&mut pending);
            if let Some(t) = turns.last_mut() {
                t.inputs.extend(folded);
            }
        }
    }
    turns
}

/// Creates a conversation of `app`'s `agent` owned by `client`'s identity; returns its id.
pub async fn create(client: &Client, app: &str, agent: &str) -> String {
    let reply = client
        .post(
            "/v1/conversations",
            &serde_json::json!({"app": app, "agent": agent}),
        )
        .await
        .unwrap();
    assert_eq!(reply.status, 201, "{:?}", reply.body);
    reply.body["id"].as_str().unwrap().to_owned()
}

/// Posts `body` to the conversation's `what` (`messages`, `follow-ups`, `stop`, an approval,
/// …), which must accept it.
pub async fn submit(client: &Client, id: &str, what: &str, body: serde_json::Value) {
    let sent = client
        .post(&format!("/v1/conversations/{id}/{what}"), &body)
        .await
        .unwrap();
    assert_eq!(sent.status, 202, "{what}: {:?}", sent.body);
}

/// Sends a message to the conversation, which must accept it.
pub async fn say(client: &Client, id: &str, text: &str) {
    submit(client, id, "messages", serde_json::json!({ "text": text })).await;
}

/// Waits until the conversation holds `count` complete turns and none open; returns them.
pub async fn wait_for_complete_turns(
    client: &Client,
    id: &str,
    count: usize,
    timeout: Duration,
) -> Result<Vec<TurnSummary>> {
    let deadline = std::time::Instant::now() + timeout;
    let mut cursor = turnpike_edge::client::Cursor::new(id);
    let mut rows = Vec::new();
    loop {
        rows.extend(cursor.read(client).await.map_err(anyhow::Error::msg)?);
        let turns = turns_of(&rows);
        if turns.len() >= count && turns.iter().all(|t| t.outcome.is_some()) {
            return Ok(turns);
        }
        if std::time::Instant::now() > deadline {
            anyhow::bail!("timed out waiting for {count} complete turns of {id}: {turns:#?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the conversation's status is `status` (e.g. `running`).
pub async fn wait_for_status(
    client: &Client,
    id: &str,
    status: &str,
    timeout: Duration,
) -> Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let view = client
            .get(&format!("/v1/conversations/{id}"))
            .await
            .map_err(anyhow::Error::msg)?
            .into_ok()
            .map_err(anyhow::Error::msg)?;
        if view["status"] == status {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            anyhow::bail!("{id} never became {status}: {view}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `queue` app: agents whose script model takes a while, to test what a message arriving
/// during a turn does. `slow` answers its message after 2 s, `quick` after 0.1 s, `impatient`
/// is `slow` with `on_new_message = "interrupt"`, `stuck` would take ten minutes.
pub fn queue_apps() -> tempfile::TempDir {
    apps_with(&[
        ("queue.toml", QUEUE_MANIFEST),
        ("slow.script.toml", SLOW),
        ("quick.script.toml", QUICK),
        ("stuck.script.toml", STUCK),
    ])
}

/// A fresh apps folder holding `files` (name, text): manifests and the scripts they name.
pub fn apps_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let apps = tempfile::tempdir().expect("a temporary directory");
    for (name, text) in files {
        std::fs::write(apps.path().join(name), text).expect("writing an app file");
    }
    apps
}

const QUEUE_MANIFEST: &str = r#"
app = "queue"

[agents.slow]
provider = "script"
script = "slow.script.toml"

[agents.quick]
provider = "script"
script = "quick.script.toml"

[agents.impatient]
provider = "script"
script = "slow.script.toml"
on_new_message = "interrupt"

[agents.stuck]
provider = "script"
script = "stuck.script.toml"
"#;

/// A model that takes 2 s and answers the message it was given.
const SLOW: &str = r#"
[[turn]]
[[turn.step]]
text = "answer to: {last_user}"
delay_ms = 2000
"#;

const QUICK: &str = r#"
[[turn]]
[[turn.step]]
text = "answer to: {last_user}"
delay_ms = 100
"#;

/// A model that would take ten minutes.
const STUCK: &str = r#"
[[turn]]
[[turn.step]]
text = "never"
delay_ms = 600000
"#;

/// The `life` app: a `writer` agent whose scripted model writes the user's words to `note.md`
/// and publishes it, every turn.
pub fn writer_apps() -> tempfile::TempDir {
    apps_with(&[
        ("life.toml", WRITER_MANIFEST),
        ("writer.script.toml", WRITER_SCRIPT),
    ])
}

const WRITER_MANIFEST: &str = r#"
app = "life"

[agents.writer]
provider = "script"
script = "writer.script.toml"
tools = ["write_file", "publish"]
"#;

const WRITER_SCRIPT: &str = r#"
[[turn]]
[[turn.step]]
text = "Writing."
tool_calls = [{ name = "write_file", arguments = { path = "note.md", content = "{last_user}" } }]
[[turn.step]]
tool_calls = [{ name = "publish", arguments = { path = "note.md" } }]
[[turn.step]]
text = "Published the note."
"#;
