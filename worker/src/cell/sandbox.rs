//! How one run is put into its sandbox: what it holds while it runs (the seccomp programs, its
//! cgroup, its uid, the workspace and init descriptors), the bubblewrap command line, and what
//! happens between fork and exec.

use std::os::fd::AsRawFd as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Stdio;

use super::config::CellConfig;
use super::limits::{self, Budget, CellUid, Limits, ProcessGroup};

/// The descriptor numbers the workspace and the init binary are passed at.
const WORK_FD: i32 = 1010;
const INIT_FD: i32 = 1011;
/// The first descriptor number the seccomp programs are passed at (one after another).
const SECCOMP_FD: i32 = 1000;
/// Where descriptors are staged before they are placed (above every target).
const STAGING_FD: i32 = 1100;
/// The size of a cell's private `/tmp`.
const TMP_BYTES: u64 = 64 << 20;
/// The size of a cell's private `/dev/shm`.
const SHM_BYTES: u64 = 16 << 20;
/// Where the init binary is inside a cell.
const INIT_PATH: &str = "/run/turnpike-init";

/// What a run holds until it ends: no other cell of this worker gets its uid or its cgroup
/// meanwhile.
pub(super) struct Held {
    seccomp: Vec<std::fs::File>,
    pub(super) group: Option<ProcessGroup>,
    uid: Option<std::sync::Arc<CellUid>>,
    work: std::fs::File,
    init: Option<std::fs::File>,
    nproc: bool,
}

impl Held {
    /// Takes what a run over `workspace` needs. Never host root, never a shared budget: a root
    /// worker hands the workspace to a uid of the run's own; any other runs only in a cgroup of
    /// its own.
    pub(super) async fn take(
        config: &CellConfig,
        budget: Budget,
        filters: &[std::sync::Arc<tempfile::NamedTempFile>],
        workspace: &Path,
        max_entries: usize,
    ) -> Result<Held, String> {
        let seccomp = filters
            .iter()
            .map(|f| {
                std::fs::File::open(f.path())
                    .map_err(|e| format!("cannot open the seccomp program: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let group = if config.cgroups {
            ProcessGroup::create(&config.scratch, &config.limits)
        } else {
            None
        };
        let uid = match budget {
            Budget::OwnUid => {
                let held = CellUid::for_workspace(workspace);
                let (root, uid) = (workspace.to_path_buf(), held.get());
                tokio::task::spawn_blocking(move || limits::hand_over(&root, uid, max_entries))
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
        // The workspace (and the init binary) go in as descriptors, so that an unprivileged
        // bubblewrap needs no path to them.
        Ok(Held {
            seccomp,
            group,
            uid,
            work: open_path(workspace)?,
            init: config.init.as_deref().map(open_path).transpose()?,
            nproc: budget == Budget::OwnUid,
        })
    }

    /// The host uid the run's processes get (none: the worker's own, inside a cgroup).
    pub(super) fn uid(&self) -> Option<u32> {
        self.uid.as_deref().map(CellUid::get)
    }

    /// The bubblewrap command that runs `argv` in the sandbox, with every descriptor passed in
    /// and the limits applied between fork and exec.
    pub(super) fn command(
        &self,
        config: &CellConfig,
        extra: &Extra<'_>,
        argv: &[&str],
    ) -> std::process::Command {
        self.command_with(config, config.limits.clone(), extra, argv)
    }

    /// [`Self::command`] with other limits (a long-lived server's).
    pub(super) fn command_with(
        &self,
        config: &CellConfig,
        limits: Limits,
        extra: &Extra<'_>,
        argv: &[&str],
    ) -> std::process::Command {
        let mut command = bwrap(config, self.init.is_some(), extra);
        if self.init.is_some() {
            command.arg(INIT_PATH);
            for path in extra.read_only {
                command.arg("--read").arg(path);
            }
            command.arg("--");
        }
        command
            .args(argv)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        self.pass_in(&mut command, limits);
        command
    }

    /// Between fork and exec: the descriptors into place, the cgroup joined, the limits set,
    /// the uid dropped to.
    fn pass_in(&self, command: &mut std::process::Command, limits: Limits) {
        let mut passed: Vec<(i32, i32)> = self
            .seccomp
            .iter()
            .enumerate()
            .map(|(i, f)| (f.as_raw_fd(), SECCOMP_FD + i as i32))
            .collect();
        passed.push((self.work.as_raw_fd(), WORK_FD));
        if let Some(init) = &self.init {
            passed.push((init.as_raw_fd(), INIT_FD));
        }
        let procs_file = self.group.as_ref().map(|g| g.procs_file());
        let (nproc, uid) = (self.nproc, self.uid());
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
    }
}

/// What a sandbox may have beyond a cell's: host paths it may read (a server's own
/// installation), and the network.
#[derive(Debug, Clone, Copy, Default)]
pub struct Extra<'a> {
    pub read_only: &'a [std::path::PathBuf],
    pub network: bool,
    /// The workspace is mounted read-only: a process that lives beside the host's own work
    /// on the workspace (an MCP server, while the worker reads, writes, hands over and
    /// publishes it) must not be able to swap a path for a link under the host's feet.
    pub read_only_workspace: bool,
}

/// Bubblewrap's arguments up to the program: every namespace unshared (the network too unless
/// `extra` grants it), a read-only `/usr` (and `extra`'s paths), private `/tmp` and `/dev/shm`,
/// the workspace at `/work`, the seccomp programs.
fn bwrap(config: &CellConfig, init: bool, extra: &Extra<'_>) -> std::process::Command {
    let mut command = std::process::Command::new(&config.bwrap);
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
    if extra.network {
        command.arg("--share-net");
    }
    command
        // A private /tmp and /dev/shm of bounded size (the workspace has its own quota),
        // and the rest of /dev read-only: no memory to fill where no cgroup bounds it.
        .args(["--proc", "/proc", "--dev", "/dev", "--size"])
        .arg(TMP_BYTES.to_string())
        .args(["--tmpfs", "/tmp", "--size"])
        .arg(SHM_BYTES.to_string())
        .args(["--tmpfs", "/dev/shm", "--remount-ro", "/dev"])
        .arg(if extra.read_only_workspace {
            "--ro-bind-fd"
        } else {
            "--bind-fd"
        })
        .args([&WORK_FD.to_string(), "/work"]);
    if init {
        command.args(["--ro-bind-fd", &INIT_FD.to_string(), INIT_PATH]);
    }
    // After the private mounts, so that a path under `/tmp` is the host's (validation keeps
    // them off `/work`, `/proc` and `/dev`).
    for path in extra.read_only {
        command.arg("--ro-bind").arg(path).arg(path);
    }
    command
        // The root bwrap builds is a tmpfs: make it read-only too.
        .args(["--remount-ro", "/"])
        .args(["--chdir", "/work", "--hostname", "cell"])
        .args(["--add-seccomp-fd", "1000", "--add-seccomp-fd", "1001", "--"]);
    command
}

/// Opens a path (the workspace, the init binary) as an `O_PATH` descriptor for bubblewrap.
fn open_path(path: &Path) -> Result<std::fs::File, String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))
}
