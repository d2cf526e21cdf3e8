//! The cell: where generated code runs, and only there.
//!
//! Built on bubblewrap: every namespace unshared (network included), a read-only runtime (the
//! host's `/usr` and nothing of `/etc`, `/home` or `/root`), the turn's workspace as the only
//! writable path (at `/work`), a private `/tmp`, a cleared environment, all capabilities dropped,
//! never host root: a worker running as root drops the cell (bubblewrap included) to an
//! unprivileged host uid of its own ([`CELL_UIDS`]) before it starts, so `RLIMIT_NPROC` binds
//! that cell alone even where no cgroup can be made, and the workspace is handed over by file
//! descriptor and owned by that uid for the run. A worker that is not root runs each cell in a
//! pids cgroup of its own; where it can make none, no cell runs ([`Budget`]): every cell would
//! share the worker's uid, and so one process budget with the worker and every other tenant,
//! a seccomp filter (`seccomp`) denying what code in a cell never needs, resource limits
//! (CPU seconds, address space, file size, open files, processes — as a pids cgroup when the
//! worker may create one, which is what binds root), a wall-clock timeout that kills the whole
//! tree (bwrap is PID 1's parent in a PID namespace and dies with its parent; killing it ends
//! the namespace), and capped output.
//!
//! Fail closed: [`Cell::detect`] checks that the sandbox can be set up on this machine; where it
//! cannot, `exec` refuses with what is missing and nothing runs.

mod config;
mod limits;
mod sandbox;
mod seccomp;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Instant, SystemTime};

use serde::Serialize;
use tokio::io::AsyncReadExt as _;

pub use config::CellConfig;
pub use limits::{Budget, Limits, CELL_UIDS, DEFAULT_WALL};
pub use sandbox::Extra;

/// A languages the cell runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    Python,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunResult {
    /// The exit code, when the program exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    /// Output beyond the cap was dropped.
    pub truncated: bool,
    pub duration_ms: u64,
    /// From the call to the first byte of stdout, in microseconds (none: no output).
    pub first_output_us: Option<u64>,
    /// From the call until bubblewrap was started, in microseconds: the host's setup (snapshot,
    /// cgroup, hand-over) and the spawn itself, whose child joins the run's cgroup before it
    /// execs. For `turnpike bench cell`; not part of what a tool reports.
    #[serde(skip)]
    pub started_us: u64,
    /// CPU time the run used (user + system, of the whole tree), in milliseconds.
    pub cpu_ms: u64,
    /// Files created or changed in the workspace (relative paths).
    pub files: Vec<ChangedFile>,
    /// The host uid the run's processes had (never 0).
    pub uid: u32,
}

/// A file the run created or changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChangedFile {
    pub path: String,
    pub size: u64,
}

/// A sandbox that was found to work on this machine.
#[derive(Debug, Clone)]
pub struct Cell {
    config: CellConfig,
    /// The seccomp programs, written once; each run opens them afresh (bwrap reads an fd to
    /// its end).
    filters: Vec<std::sync::Arc<tempfile::NamedTempFile>>,
    /// Runs go into cgroups here, and moving a process into one waits for an RCU grace period
    /// (see [`limits::joins_wait_for_rcu`]).
    joins_wait: bool,
    /// How each run's process budget is its own.
    budget: Budget,
}

impl Cell {
    /// Checks that a cell can be set up here; the error says what is missing.
    pub async fn detect(config: CellConfig) -> Result<Cell, String> {
        if !config.bwrap.is_file() {
            return Err(format!(
                "no sandbox: bubblewrap is not installed at {} (Debian package `bubblewrap`)",
                config.bwrap.display()
            ));
        }
        if !config.python.is_file() {
            return Err(format!("no Python runtime at {}", config.python.display()));
        }
        let budget = Budget::detect(config.cgroups, &config.limits)?;
        std::fs::create_dir_all(&config.scratch)
            .map_err(|e| format!("cannot prepare {}: {e}", config.scratch.display()))?;
        let mut filters = Vec::new();
        for program in seccomp::program()? {
            use std::io::Write as _;
            let mut file = tempfile::NamedTempFile::new_in(&config.scratch)
                .map_err(|e| format!("cannot prepare the seccomp program: {e}"))?;
            file.write_all(&program)
                .map_err(|e| format!("cannot write the seccomp program: {e}"))?;
            filters.push(std::sync::Arc::new(file));
        }
        let joins_wait = config.cgroups
            && limits::ProcessGroup::create(&config.scratch, &config.limits).is_some()
            && std::fs::read_to_string("/proc/self/mounts")
                .is_ok_and(|m| limits::joins_wait_for_rcu(&m));
        let cell = Cell {
            config,
            filters,
            joins_wait,
            budget,
        };
        let probe = tempfile::tempdir_in(&cell.config.scratch)
            .map_err(|e| format!("cannot prepare a probe workspace: {e}"))?;
        let result = cell
            .run(probe.path(), Language::Python, "print('ok')")
            .await
            .map_err(|e| format!("no sandbox: bubblewrap cannot set up a cell here: {e}"))?;
        if result.exit_code != Some(0) || result.stdout.trim() != "ok" {
            return Err(format!(
                "no sandbox: a probe cell failed (exit {:?}): {}",
                result.exit_code,
                result.stderr.trim()
            ));
        }
        // Only for a sandbox that works: where none does, the refusal above is what matters.
        if cell.joins_wait {
            tracing::warn!("{}", limits::SLOW_JOINS);
        }
        Ok(cell)
    }

    /// Where this cell prepares seccomp programs and cgroups (no sandbox may be shown it).
    pub fn scratch(&self) -> &Path {
        &self.config.scratch
    }

    /// How each run's process budget is kept its own.
    pub fn budget(&self) -> Budget {
        self.budget
    }

    /// Whether each run waits for the kernel to move it into its cgroup (an RCU grace period,
    /// about 10 ms): cgroups are in use and no hierarchy is mounted with `favordynmods`.
    pub fn cgroup_joins_wait(&self) -> bool {
        self.joins_wait
    }

    /// Runs `code` in a fresh cell over `workspace` (mounted read-write at `/work`).
    pub async fn run(
        &self,
        workspace: &Path,
        language: Language,
        code: &str,
    ) -> Result<RunResult, String> {
        let started = Instant::now();
        let span = tracing::info_span!("turnpike.cell", otel.name = "cell run", turnpike.cell.language = ?language);
        let result = {
            use tracing::Instrument as _;
            self.run_unmetered(workspace, language, code)
                .instrument(span)
                .await
        };
        let outcome = match &result {
            Ok(r) if r.timed_out => "timed_out",
            Ok(r) if r.exit_code == Some(0) => "ok",
            Ok(_) => "failed",
            Err(_) => "error",
        };
        crate::metrics::cell_run(started.elapsed(), outcome);
        result
    }

    async fn run_unmetered(
        &self,
        workspace: &Path,
        language: Language,
        code: &str,
    ) -> Result<RunResult, String> {
        let Language::Python = language;
        let started = Instant::now();
        let before = snapshot_off_thread(workspace).await;
        let held = sandbox::Held::take(
            &self.config,
            self.budget,
            &self.filters,
            workspace,
            MAX_SNAPSHOT,
        )
        .await?;
        let python = self.config.python.to_string_lossy();
        let argv = [&*python, "-I", "-S", "-c", code];
        let command = held.command(&self.config, &Extra::default(), &argv);
        let mut command = tokio::process::Command::from(command);
        command.kill_on_drop(true);
        let usage_before = limits::children_cpu();
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start bubblewrap: {e}"))?;
        let started_us = started.elapsed().as_micros() as u64;
        let ended = self.collect(child, &held, started).await;
        let uid = held.uid();
        let duration = started.elapsed();
        let after = snapshot_off_thread(workspace).await;
        // Held until this run ends: no other cell of this worker gets the uid meanwhile.
        drop(held);
        use std::os::unix::process::ExitStatusExt as _;
        Ok(RunResult {
            exit_code: ended.status.and_then(|s| s.code()),
            signal: ended.status.and_then(|s| s.signal()),
            timed_out: ended.timed_out,
            stdout: String::from_utf8_lossy(&ended.stdout.0).into_owned(),
            stderr: String::from_utf8_lossy(&ended.stderr.0).into_owned(),
            truncated: ended.stdout.1 || ended.stderr.1,
            duration_ms: duration.as_millis() as u64,
            first_output_us: ended.first_output_us,
            started_us,
            cpu_ms: limits::children_cpu().saturating_sub(usage_before),
            files: changed(&before, &after),
            // SAFETY: geteuid cannot fail.
            uid: uid.unwrap_or_else(|| unsafe { libc::geteuid() }),
        })
    }

    /// Starts `argv` as a long-lived process in a cell over `workspace` (a stdio MCP server):
    /// the same sandbox and limits as a run but no wall-clock limit, stdin and stdout piped,
    /// the last of stderr kept for the error that explains a failure. It ends when the
    /// returned process is dropped.
    pub async fn spawn(
        &self,
        workspace: &Path,
        argv: &[String],
        extra: &Extra<'_>,
    ) -> Result<CellProcess, String> {
        let held = sandbox::Held::take(
            &self.config,
            self.budget,
            &self.filters,
            workspace,
            MAX_SNAPSHOT,
        )
        .await?;
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        // It lives for the turn: more CPU time and address space than a run (a language
        // runtime reserves much it never touches); the process count and files stay a cell's.
        let limits = Limits {
            cpu_seconds: SERVER_CPU_SECONDS,
            address_space_bytes: SERVER_ADDRESS_SPACE,
            ..self.config.limits.clone()
        };
        let mut command = held.command_with(&self.config, limits, extra, &argv);
        command.stdin(std::process::Stdio::piped());
        let mut command = tokio::process::Command::from(command);
        command.kill_on_drop(true);
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start bubblewrap: {e}"))?;
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        if let Some(mut pipe) = child.stderr.take() {
            let kept = stderr.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = pipe.read(&mut buf).await {
                    let Ok(mut kept) = kept.lock() else { return };
                    kept.extend_from_slice(&buf[..n]);
                    let over = kept.len().saturating_sub(STDERR_KEPT);
                    kept.drain(..over);
                }
            });
        }
        Ok(CellProcess {
            child,
            stderr,
            _held: held,
        })
    }

    /// Reads the run's capped output until it exits or its wall-clock limit passes; then the
    /// whole tree is killed (killing bwrap ends the PID namespace, and the cgroup's processes
    /// are killed too).
    async fn collect(
        &self,
        mut child: tokio::process::Child,
        held: &sandbox::Held,
        started: Instant,
    ) -> Ended {
        let cap = self.config.limits.output_bytes;
        let (Some(mut stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take())
        else {
            return Ended::default();
        };
        let first = std::sync::OnceLock::new();
        let wait = async {
            tokio::join!(
                read_capped(&mut stdout, cap, Some(&first)),
                read_capped(&mut stderr, cap, None),
                child.wait()
            )
        };
        let mut ended = match tokio::time::timeout(self.config.limits.wall, wait).await {
            Ok((stdout, stderr, status)) => Ended {
                timed_out: false,
                stdout,
                stderr,
                status: status.ok(),
                first_output_us: None,
            },
            Err(_) => {
                if let Some(g) = &held.group {
                    g.kill_all();
                }
                Ended {
                    timed_out: true,
                    ..Ended::default()
                }
            }
        };
        ended.first_output_us = first
            .get()
            .map(|t: &Instant| t.duration_since(started).as_micros() as u64);
        ended
    }
}

/// A long-lived process in a cell ([`Cell::spawn`]); killed, with its cgroup, when dropped.
pub struct CellProcess {
    pub child: tokio::process::Child,
    stderr: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    _held: sandbox::Held,
}

impl CellProcess {
    /// The last of what the process wrote to stderr (at most [`STDERR_KEPT`] bytes).
    pub fn stderr_tail(&self) -> String {
        let kept = self.stderr.lock().map(|k| k.clone()).unwrap_or_default();
        String::from_utf8_lossy(&kept).trim().to_owned()
    }
}

/// The CPU seconds of a long-lived process in a cell.
pub const SERVER_CPU_SECONDS: u64 = 600;
/// The address space of a long-lived process in a cell.
pub const SERVER_ADDRESS_SPACE: u64 = 8 << 30;

/// How much of a long-lived process's stderr is kept.
pub const STDERR_KEPT: usize = 4096;

/// How a run's process ended, and what it wrote (bytes, and whether the cap cut them).
#[derive(Default)]
struct Ended {
    timed_out: bool,
    stdout: (Vec<u8>, bool),
    stderr: (Vec<u8>, bool),
    status: Option<std::process::ExitStatus>,
    first_output_us: Option<u64>,
}

/// The files created or changed between two snapshots.
fn changed(
    before: &BTreeMap<String, (u64, SystemTime)>,
    after: &BTreeMap<String, (u64, SystemTime)>,
) -> Vec<ChangedFile> {
    after
        .iter()
        .filter(|(path, meta)| before.get(*path) != Some(meta))
        .map(|(path, (size, _))| ChangedFile {
            path: path.clone(),
            size: *size,
        })
        .collect()
}

/// Reads up to `cap` bytes, then drains the rest (so the writer never blocks) and says so.
async fn read_capped(
    reader: &mut (impl tokio::io::AsyncRead + Unpin),
    cap: usize,
    first: Option<&std::sync::OnceLock<Instant>>,
) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    let mut truncated = false;
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if let Some(first) = first {
                    let _ = first.set(Instant::now());
                }
                let room = cap.saturating_sub(out.len());
                if n > room {
                    truncated = true;
                }
                out.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    (out, truncated)
}

/// The most workspace entries a snapshot looks at: past it the workspace is over any quota,
/// and the turn's audit fails it anyway.
const MAX_SNAPSHOT: usize = 100_000;

/// [`snapshot`] on a blocking thread (a large tree takes a while to walk).
async fn snapshot_off_thread(root: &Path) -> BTreeMap<String, (u64, SystemTime)> {
    let root = root.to_path_buf();
    tokio::task::spawn_blocking(move || snapshot(&root))
        .await
        .unwrap_or_default()
}

/// Regular files under `root` (relative path → size and modification time), at most
/// [`MAX_SNAPSHOT`] entries looked at; symbolic links are never followed.
fn snapshot(root: &Path) -> BTreeMap<String, (u64, SystemTime)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    let mut looked_at = 0usize;
    while let Some(dir) = stack.pop() {
        let Ok(read) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in read.filter_map(|e| e.ok()) {
            looked_at += 1;
            if looked_at > MAX_SNAPSHOT {
                return out;
            }
            let Ok(meta) = e.path().symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                stack.push(e.path());
            } else if meta.is_file() {
                if let Ok(rel) = e.path().strip_prefix(root) {
                    out.insert(
                        rel.to_string_lossy().into_owned(),
                        (
                            meta.len(),
                            meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                        ),
                    );
                }
            }
        }
    }
    out
}
