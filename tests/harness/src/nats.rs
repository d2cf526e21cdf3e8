//! A real `nats-server -js` on a free loopback port with a temporary store, stopped on drop.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;

use crate::services::{free_port, program, wait_closed, Service};

/// A JetStream server for one test.
pub struct NatsServer {
    service: Option<Service>,
    addr: SocketAddr,
    store: tempfile::TempDir,
    /// A configuration file (TLS, users), when the server was started with one.
    conf: Option<std::path::PathBuf>,
}

impl NatsServer {
    /// Starts a server on a free port.
    pub fn start() -> Result<Self> {
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
        let mut server = NatsServer {
            service: None,
            addr,
            store: tempfile::tempdir()?,
            conf: None,
        };
        server.boot()?;
        Ok(server)
    }

    /// Starts a server with a configuration file: `conf` gets the port and the store folder
    /// and returns the file's text (its `listen` and `jetstream` blocks included).
    pub fn start_with_conf(conf: impl Fn(u16, &std::path::Path) -> String) -> Result<Self> {
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
        let store = tempfile::tempdir()?;
        let path = store.path().join("nats.conf");
        std::fs::write(&path, conf(addr.port(), &store.path().join("js")))?;
        let mut server = NatsServer {
            service: None,
            addr,
            store,
            conf: Some(path),
        };
        server.boot()?;
        Ok(server)
    }

    fn boot(&mut self) -> Result<()> {
        let program = program("nats-server", "TURNPIKE_NATS_SERVER")?;
        let args: Vec<String> = match &self.conf {
            Some(conf) => vec!["-c".into(), conf.to_string_lossy().into_owned()],
            None => vec![
                "-js".into(),
                "-a".into(),
                "127.0.0.1".into(),
                "-p".into(),
                self.addr.port().to_string(),
                "-sd".into(),
                self.store.path().to_string_lossy().into_owned(),
            ],
        };
        self.service = Some(Service::start(
            &program,
            &args,
            self.addr,
            Duration::from_secs(30),
        )?);
        Ok(())
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// Stops the server (its store is kept).
    pub fn stop(&mut self) -> Result<()> {
        self.service = None;
        wait_closed(self.addr, Duration::from_secs(30))
    }

    /// Starts it again on the same port with the same store.
    pub fn restart(&mut self) -> Result<()> {
        self.stop()?;
        self.boot()
    }
}
