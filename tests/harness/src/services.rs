//! Real services as child processes on free loopback ports.
//!
//! A service started here is wrapped in a small watchdog shell that stops it when the test
//! process exits, however it exits, so a failing test never leaves a server behind.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

/// A free TCP port on 127.0.0.1 (free when asked; the service binds it right after).
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding a free loopback port")?;
    Ok(listener.local_addr()?.port())
}

/// Finds a program: `$ENV_VAR` if set, else the name on `PATH`.
pub fn program(name: &str, env_var: &str) -> Result<String> {
    if let Ok(path) = std::env::var(env_var) {
        return Ok(path);
    }
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(name).is_file()))
        .unwrap_or(false);
    if !found {
        bail!(
            "`{name}` is not installed: run `scripts/services install` (or set {env_var}) — the tests use the real service"
        );
    }
    Ok(name.to_owned())
}

/// A child process that dies with the test process.
pub struct Service {
    child: Child,
    pub addr: SocketAddr,
}

impl Service {
    /// Starts `program args…` under a watchdog and waits until `addr` accepts connections.
    pub fn start(
        program: &str,
        args: &[String],
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<Self> {
        Self::start_stopping_with(program, args, addr, timeout, "TERM")
    }

    /// Like [`Service::start`], stopping the service with `signal` (`INT` is Postgres's fast
    /// shutdown, which does not wait for clients).
    pub fn start_stopping_with(
        program: &str,
        args: &[String],
        addr: SocketAddr,
        timeout: Duration,
        signal: &str,
    ) -> Result<Self> {
        Self::start_logging(program, args, addr, timeout, signal, None)
    }

    /// Like [`Service::start_stopping_with`], its output appended to `log` when given.
    pub fn start_logging(
        program: &str,
        args: &[String],
        addr: SocketAddr,
        timeout: Duration,
        signal: &str,
        log: Option<&std::path::Path>,
    ) -> Result<Self> {
        // The shell watches the test process and stops the service when it is gone; a TERM
        // (from `Drop`) stops it at once.
        let script = r#"p="$1"; s="$2"; shift 2; "$@" & c=$!; trap 'kill -$s $c 2>/dev/null; wait $c; exit 0' TERM INT; trap 'kill -$s $c 2>/dev/null' EXIT; while kill -0 "$p" 2>/dev/null && kill -0 "$c" 2>/dev/null; do sleep 0.2; done"#;
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(script)
            .arg("sh")
            .arg(std::process::id().to_string())
            .arg(signal)
            .arg(program)
            .args(args)
            .stdin(Stdio::null());
        match log {
            Some(path) => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("opening {}", path.display()))?;
                command.stdout(file.try_clone()?).stderr(file);
            }
            None => {
                command.stdout(Stdio::null()).stderr(Stdio::null());
            }
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {program}"))?;
        let mut service = Service { child, addr };
        service
            .wait_ready(timeout)
            .with_context(|| format!("{program} did not start on {addr}"))?;
        Ok(service)
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("exited early with {status}");
            }
            if Instant::now() > deadline {
                bail!("not listening after {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // TERM the watchdog, which stops the service and waits for it.
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

/// Waits until nothing listens on `addr` any more.
pub fn wait_closed(addr: SocketAddr, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
        if Instant::now() > deadline {
            bail!("{addr} still accepts connections after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}
