//! Turnpike processes for multi-process tests: killed with the thread that started them, and
//! killable on demand (SIGKILL, no goodbye) to test crashes.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

/// A running `turnpike` process whose stderr lines can be waited on.
pub struct Process {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Process {
    /// Starts `binary args…` with `envs`. The process is killed when the starting thread ends.
    pub fn start(binary: &Path, args: &[String], envs: &[(&str, String)]) -> Result<Self> {
        let mut command = Command::new(binary);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // Only what the test says: no configuration leaks in from the test's environment.
        for (key, _) in std::env::vars() {
            if key.starts_with("TURNPIKE_") || key.starts_with("AWS_") {
                command.env_remove(key);
            }
        }
        // Many processes run at once: each admin listener on a port of its own (a test that
        // needs it says where, or reads the port from the log).
        command.env("TURNPIKE_ADMIN_LISTEN", "127.0.0.1:0");
        for (k, v) in envs {
            command.env(k, v);
        }
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::process::CommandExt as _;
            // SAFETY: prctl is async-signal-safe; it only sets this child's parent-death signal.
            unsafe {
                command.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Process {
            child,
            lines,
            seen: Vec::new(),
        })
    }

    /// Waits for a stderr line containing `needle`; returns it.
    pub fn wait_for_line(&mut self, needle: &str, timeout: Duration) -> Result<String> {
        let mut lines = self.wait_for_lines(needle, 1, timeout)?;
        Ok(lines.remove(0))
    }

    /// How many stderr lines so far contain `needle` (without waiting).
    pub fn count_lines(&mut self, needle: &str) -> usize {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
        self.seen.iter().filter(|l| l.contains(needle)).count()
    }

    /// Every stderr line so far (without waiting).
    pub fn lines(&mut self) -> &[String] {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
        &self.seen
    }

    /// Waits until `count` stderr lines contain `needle`; returns the first `count`.
    pub fn wait_for_lines(
        &mut self,
        needle: &str,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<String>> {
        let deadline = Instant::now() + timeout;
        loop {
            let found: Vec<String> = self
                .seen
                .iter()
                .filter(|l| l.contains(needle))
                .take(count)
                .cloned()
                .collect();
            if found.len() == count {
                return Ok(found);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => bail!(
                    "not {count} lines containing {needle:?} within {timeout:?}; stderr so far:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Kills the process at once (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Freezes the process (SIGSTOP): it holds what it held, and does nothing.
    pub fn freeze(&self) {
        // SAFETY: sending a signal to our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGSTOP);
        }
    }

    /// Lets a frozen process go on (SIGCONT).
    pub fn thaw(&self) {
        // SAFETY: sending a signal to our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGCONT);
        }
    }

    /// Waits for the process to exit by itself; its exit code, or `None` if it is still running
    /// after `timeout` (or was killed by a signal).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return status.code(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => return None,
            }
        }
    }

    /// Asks the process to stop (SIGTERM) and returns at once.
    pub fn signal_term(&self) {
        // SAFETY: sending a signal to our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
    }

    /// Asks the process to stop (SIGTERM) and waits for it to exit.
    pub fn terminate(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        // SAFETY: sending a signal to our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                self.kill();
                bail!("did not stop within {timeout:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}
