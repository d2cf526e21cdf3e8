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
//! a seccomp filter ([`seccomp`]) denying what code in a cell never needs, resource limits
//! (CPU seconds, address space, file size, open files, processes — as a pids cgroup when the
//! worker may create one, which is what binds root), a wall-clock timeout that kills the whole
//! tree (bwrap is PID 1's parent in a PID namespace and dies with its parent; killing it ends
//! the namespace), and capped output.
//!
//! Fail closed: [`Cell::detect`] checks that the sandbox can be set up on this machine; where it
//! cannot, `exec` refuses with what is missing and nothing runs.

mod limits;
mod seccomp;

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Instant, SystemTime};

use serde::Serialize;
use tokio::io::AsyncReadExt as _;

pub use limits::{Budget, Limits, CELL_UIDS, DEFAULT_WALL};

/// What a cell needs from the machine.
#[derive(Debug, Clone)]
pub struct CellConfig {
    pub bwrap: PathBuf,
    pub python: PathBuf,
    pub limits: Limits,
    /// Where the seccomp program and cgroups are prepared (outside every workspace).
    pub scratch: PathBuf,
    /// The binary that runs inside the cell, started as `turnpike-init`, to add Landlock before
    /// the interpreter starts (the `turnpike` binary; none: bubblewrap and seccomp only).
    pub init: Option<PathBuf>,
    /// Put each run in a pids (and memory) cgroup where the worker may create one. Off: the
    /// rlimits of the unprivileged cell uid are the bound (as on a host with no writable cgroup
    /// hierarchy).
    pub cgroups: bool,
}

impl Default for CellConfig {
    fn default() -> Self {
        Self {
            bwrap: PathBuf::from("/usr/bin/bwrap"),
            python: PathBuf::from("/usr/bin/python3"),
            limits: Limits::default(),
            scratch: std::env::temp_dir().join("turnpike-cell"),
            init: None,
            cgroups: true,
        }
    }
}

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
        let mut seccomp_files = Vec::new();
        for filter in &self.filters {
            seccomp_files.push(
                std::fs::File::open(filter.path())
                    .map_err(|e| format!("cannot open the seccomp program: {e}"))?,
            );
        }
        let group = if self.config.cgroups {
            limits::ProcessGroup::create(&self.config.scratch, &self.config.limits)
        } else {
            None
        };
        // Never host root, never a shared budget: a root worker hands the workspace to a uid
        // of the run's own; any other runs only in a cgroup of its own.
        // Held until this run ends: no other cell of this worker gets the uid meanwhile.
        let held = match self.budget {
            Budget::OwnUid => {
                let held = limits::CellUid::take();
                let (root, uid) = (workspace.to_path_buf(), held.get());
                tokio::task::spawn_blocking(move || limits::hand_over(&root, uid, MAX_SNAPSHOT))
                    .await
                    .map_err(|e| format!("cannot hand the workspace over: {e}"))??;
                Some(held)
            }
            Budget::Cgroup if group.is_none() => {
                return Err(
                    "cannot create this run's pids cgroup: a cell runs only with a process budget of its own".into(),
                )
            }
            Budget::Cgroup => None,
        };
        let uid = held.as_ref().map(limits::CellUid::get);
        let nproc = self.budget == Budget::OwnUid;
        // The workspace (and the init binary) go in as descriptors, so that an unprivileged
        // bubblewrap needs no path to them.
        let work_fd = open_path(workspace)?;
        let init_fd = self.config.init.as_deref().map(open_path).transpose()?;
        let mut command = std::process::Command::new(&self.config.bwrap);
        command
            .args([
                "--unshare-all",
                "--die-with-parent",
                "--new-session",
                "--cap-drop",
                "ALL",
            ])
            .args(["--clearenv", "--setenv", "PATH", "/usr/bin:/bin"])
            .args(["--setenv", "HOME", "/work", "--setenv", "LANG", "C.UTF-8"])
            .args(["--setenv", "PYTHONDONTWRITEBYTECODE", "1"])
            .args(["--ro-bind", "/usr", "/usr"])
            .args([
                "--symlink",
                "usr/bin",
                "/bin",
                "--symlink",
                "usr/lib",
                "/lib",
            ])
            .args(["--symlink", "usr/sbin", "/sbin"]);
        if Path::new("/usr/lib64").exists() {
            command.args(["--symlink", "usr/lib64", "/lib64"]);
        }
        command
            // A private /tmp and /dev/shm of bounded size (the workspace has its own quota),
            // and the rest of /dev read-only: no memory to fill where no cgroup bounds it.
            .args(["--proc", "/proc", "--dev", "/dev", "--size"])
            .arg(TMP_BYTES.to_string())
            .args(["--tmpfs", "/tmp", "--size"])
            .arg(SHM_BYTES.to_string())
            .args(["--tmpfs", "/dev/shm", "--remount-ro", "/dev"])
            .args(["--bind-fd", &WORK_FD.to_string(), "/work"]);
        if init_fd.is_some() {
            command.args(["--ro-bind-fd", &INIT_FD.to_string(), INIT_PATH]);
        }
        command
            // The root bwrap builds is a tmpfs: make it read-only too.
            .args(["--remount-ro", "/"])
            .args(["--chdir", "/work", "--hostname", "cell"])
            .args(["--add-seccomp-fd", "1000", "--add-seccomp-fd", "1001", "--"]);
        if self.config.init.is_some() {
            command.args([INIT_PATH, "--"]);
        }
        command
            .arg(&self.config.python)
            .args(["-I", "-S", "-c", code])
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let limits = self.config.limits.clone();
        let seccomp_fds: Vec<i32> = seccomp_files
            .iter()
            .map(std::os::fd::AsRawFd::as_raw_fd)
            .collect();
        let procs_file = group.as_ref().map(|g| g.procs_file());
        let mut passed: Vec<(i32, i32)> = seccomp_fds
            .iter()
            .enumerate()
            .map(|(i, fd)| (*fd, 1000 + i as i32))
            .collect();
        passed.push((std::os::fd::AsRawFd::as_raw_fd(&work_fd), WORK_FD));
        if let Some(fd) = &init_fd {
            passed.push((std::os::fd::AsRawFd::as_raw_fd(fd), INIT_FD));
        }
        // Allocated here: nothing allocates between fork and exec.
        let mut above = vec![0i32; passed.len()];
        // SAFETY: only async-signal-safe calls (fcntl, dup2, open/write/close, setrlimit,
        // setgroups, setgid, setuid) between fork and exec.
        unsafe {
            command.pre_exec(move || {
                // First every source above every target, then each into place: a source that
                // happens to sit at a target's number is never overwritten before it is copied.
                for (i, (from, _)) in passed.iter().enumerate() {
                    above[i] = libc::fcntl(*from, libc::F_DUPFD, STAGING_FD);
                    if above[i] < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                for (i, (_, to)) in passed.iter().enumerate() {
                    if libc::dup2(above[i], *to) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    libc::close(above[i]);
                }
                if let Some(path) = &procs_file {
                    limits::join_group(path)?;
                }
                limits.apply(nproc)?;
                match uid {
                    Some(uid) => limits::drop_to(uid),
                    None => Ok(()),
                }
            });
        }
        let mut command = tokio::process::Command::from(command);
        command.kill_on_drop(true);
        let usage_before = limits::children_cpu();
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start bubblewrap: {e}"))?;
        let started_us = started.elapsed().as_micros() as u64;
        let cap = self.config.limits.output_bytes;
        let mut stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let first = std::sync::Arc::new(std::sync::OnceLock::new());
        let first_out = first.clone();
        let read_out = async move { read_capped(&mut stdout, cap, Some(&first_out)).await };
        let read_err = async move { read_capped(&mut stderr, cap, None).await };
        let wait = async {
            let (out, err, status) = tokio::join!(read_out, read_err, child.wait());
            (out, err, status)
        };
        let (timed_out, out, err, status) =
            match tokio::time::timeout(self.config.limits.wall, wait).await {
                Ok((out, err, status)) => (false, out, err, status.ok()),
                Err(_) => {
                    // Killing bwrap ends the PID namespace: the whole tree goes with it.
                    if let Some(g) = &group {
                        g.kill_all();
                    }
                    (true, (Vec::new(), false), (Vec::new(), false), None)
                }
            };
        drop(group);
        let duration = started.elapsed();
        use std::os::unix::process::ExitStatusExt as _;
        let after = snapshot_off_thread(workspace).await;
        let files = after
            .iter()
            .filter(|(path, meta)| before.get(*path) != Some(meta))
            .map(|(path, (size, _))| ChangedFile {
                path: path.clone(),
                size: *size,
            })
            .collect();
        Ok(RunResult {
            exit_code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| s.signal()),
            timed_out,
            stdout: String::from_utf8_lossy(&out.0).into_owned(),
            stderr: String::from_utf8_lossy(&err.0).into_owned(),
            truncated: out.1 || err.1,
            duration_ms: duration.as_millis() as u64,
            first_output_us: first
                .get()
                .map(|t: &Instant| t.duration_since(started).as_micros() as u64),
            started_us,
            cpu_ms: limits::children_cpu().saturating_sub(usage_before),
            files,
            // SAFETY: geteuid cannot fail.
            uid: uid.unwrap_or_else(|| unsafe { libc::geteuid() }),
        })
    }
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

/// The size of a cell's private `/tmp`.
const TMP_BYTES: u64 = 64 << 20;

/// Opens a path (the workspace, the init binary) as an `O_PATH` descriptor for bubblewrap.
fn open_path(path: &Path) -> Result<std::fs::File, String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))
}

/// The descriptor numbers the workspace and the init binary are passed at.
const WORK_FD: i32 = 1010;
const INIT_FD: i32 = 1011;
/// Where descriptors are staged before they are placed (above every target).
const STAGING_FD: i32 = 1100;

/// The size of a cell's private `/dev/shm`.
const SHM_BYTES: u64 = 16 << 20;

/// Where the init binary is inside a cell.
const INIT_PATH: &str = "/run/turnpike-init";
