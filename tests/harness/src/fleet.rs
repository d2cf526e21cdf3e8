//! A fleet of separate processes on one machine: one nats-server, a shared local-filesystem
//! store, and `turnpike worker` / `turnpike router` processes started on demand.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use turnpike_artifactory::Conversations;
use turnpike_router::{JetStreamBus, JetStreamConfig};

use crate::fixtures::signer;
use crate::nats::NatsServer;
use crate::process::Process;

/// A fleet: one nats-server, a shared local-filesystem store, worker processes.
pub struct Fleet {
    pub nats: NatsServer,
    pub store: tempfile::TempDir,
    pub data: tempfile::TempDir,
    pub conversations: Conversations,
    pub bus: Arc<JetStreamBus>,
    /// App manifests every process hosts besides the defaults.
    pub apps: Option<PathBuf>,
    /// The `turnpike` binary the processes run.
    binary: PathBuf,
}

impl Fleet {
    /// Starts nats-server and opens the store and the bus; processes run `binary`.
    pub async fn start(binary: &Path) -> Fleet {
        let nats = NatsServer::start().expect("nats-server");
        let store = tempfile::tempdir().unwrap();
        let conversations = Conversations::new(
            // A file per object, as the processes are told (`fleet_args`): the shared store of a
            // fleet is a bucket, whose objects these stand for.
            turnpike_artifactory::open_store(&format!("file://{}", store.path().display()))
                .unwrap(),
        );
        let bus = JetStreamBus::connect(JetStreamConfig {
            url: nats.url(),
            ..Default::default()
        })
        .await
        .unwrap();
        Fleet {
            nats,
            store,
            data: tempfile::tempdir().unwrap(),
            conversations,
            bus,
            apps: None,
            binary: binary.to_path_buf(),
        }
    }

    /// Starts a worker process and waits until it is ready; returns it and its worker id.
    pub fn worker(&self, extra: &[&str]) -> (Process, String) {
        self.worker_with(extra, None)
    }

    /// A worker that hangs or pauses at `failpoints` (`TURNPIKE_FAILPOINTS`).
    pub fn failing_worker(&self, failpoints: &str) -> (Process, String) {
        self.worker_with(&[], Some(failpoints))
    }

    pub fn worker_with(&self, extra: &[&str], failpoints: Option<&str>) -> (Process, String) {
        let mut command: Vec<String> =
            ["worker", "--lease-ttl-ms", "2000", "--ack-wait-ms", "4000"]
                .map(String::from)
                .to_vec();
        command.extend(extra.iter().map(|s| s.to_string()));
        let (process, line) = self.spawn_with(command, "worker wkr_", failpoints);
        let id = line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        (process, id)
    }

    /// Starts `turnpike` on this fleet (its store, NATS and signing key) with `command`, and
    /// waits for a stderr line holding `ready`; returns the process and that line.
    pub fn spawn(&self, command: Vec<String>, ready: &str) -> (Process, String) {
        self.spawn_with(command, ready, None)
    }

    /// The global arguments of every process on this fleet.
    pub fn fleet_args(&self) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "--data-dir".into(),
            self.data.path().to_string_lossy().into_owned(),
            "--store".into(),
            format!("file://{}", self.store.path().display()),
            "--nats-url".into(),
            self.nats.url(),
        ];
        if let Some(apps) = &self.apps {
            args.extend(["--apps".into(), apps.display().to_string()]);
        }
        args
    }

    /// Runs a `turnpike` command on this fleet to its end.
    pub fn run(&self, command: &[&str]) -> std::process::Output {
        std::process::Command::new(&self.binary)
            .args(self.fleet_args())
            .args(command)
            .env("TURNPIKE_SIGNING_KEY", signer().to_hex())
            .env("TURNPIKE_LOG", "warn")
            .output()
            .expect("a turnpike process")
    }

    pub fn spawn_with(
        &self,
        command: Vec<String>,
        ready: &str,
        failpoints: Option<&str>,
    ) -> (Process, String) {
        let mut args = self.fleet_args();
        args.extend(command);
        let mut process = Process::start(
            &self.binary,
            &args,
            &[
                ("TURNPIKE_SIGNING_KEY", signer().to_hex()),
                ("TURNPIKE_LOG", "warn".into()),
                ("TURNPIKE_FAILPOINTS", failpoints.unwrap_or_default().into()),
            ],
        )
        .expect("a turnpike process");
        let line = process
            .wait_for_line(ready, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{ready:?}: {e}"));
        (process, line)
    }

    /// Starts a router process serving the API on a free loopback port; returns it and its
    /// base URL.
    pub fn router(&self, tokens: &Path) -> (Process, String) {
        let port = crate::services::free_port().unwrap();
        self.router_on(tokens, port)
    }

    /// Starts a router process serving the API on `port`.
    pub fn router_on(&self, tokens: &Path, port: u16) -> (Process, String) {
        let command = vec![
            "router".into(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--tokens".into(),
            tokens.display().to_string(),
        ];
        let (process, _) = self.spawn(command, "router ready");
        (process, format!("http://127.0.0.1:{port}"))
    }
}
