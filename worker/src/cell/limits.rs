//! Resource limits of a cell: rlimits set between fork and exec (inherited by everything the
//! cell starts), and a pids (and memory) cgroup when the worker may create one — rlimits on the
//! number of processes do not bind root, a cgroup does.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A cell's limits.
#[derive(Debug, Clone)]
pub struct Limits {
    pub wall: Duration,
    pub cpu_seconds: u64,
    pub address_space_bytes: u64,
    pub file_size_bytes: u64,
    pub open_files: u64,
    pub processes: u64,
    /// Bytes of stdout and of stderr kept.
    pub output_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            wall: super::DEFAULT_WALL,
            cpu_seconds: 20,
            address_space_bytes: 1 << 30,
            file_size_bytes: 64 << 20,
            open_files: 256,
            processes: 64,
            output_bytes: 64 * 1024,
        }
    }
}

impl Limits {
    /// Sets the rlimits of the calling process (between fork and exec: async-signal-safe).
    pub fn apply(&self) -> std::io::Result<()> {
        let set = |resource, value: u64| {
            let lim = libc::rlimit {
                rlim_cur: value,
                rlim_max: value,
            };
            // SAFETY: setrlimit with a valid pointer.
            if unsafe { libc::setrlimit(resource, &lim) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        };
        set(libc::RLIMIT_CPU, self.cpu_seconds)?;
        set(libc::RLIMIT_AS, self.address_space_bytes)?;
        set(libc::RLIMIT_FSIZE, self.file_size_bytes)?;
        set(libc::RLIMIT_NOFILE, self.open_files)?;
        set(libc::RLIMIT_NPROC, self.processes)?;
        set(libc::RLIMIT_CORE, 0)?;
        Ok(())
    }
}

/// A cgroup (v1 `pids` and `memory` controllers, or v2) holding one cell.
pub struct ProcessGroup {
    dirs: Vec<PathBuf>,
}

impl ProcessGroup {
    /// Creates the group, or `None` where this process may not (then rlimits are the bound).
    pub fn create(_scratch: &Path, limits: &Limits) -> Option<ProcessGroup> {
        let name = format!("turnpike-cell-{}-{}", std::process::id(), unique());
        let mut dirs = Vec::new();
        let v1 = Path::new("/sys/fs/cgroup/pids");
        if v1.join("cgroup.procs").exists() {
            let dir = v1.join(&name);
            std::fs::create_dir(&dir).ok()?;
            std::fs::write(dir.join("pids.max"), limits.processes.to_string()).ok()?;
            dirs.push(dir);
            let mem = Path::new("/sys/fs/cgroup/memory").join(&name);
            if std::fs::create_dir(&mem).is_ok() {
                let _ = std::fs::write(
                    mem.join("memory.limit_in_bytes"),
                    limits.address_space_bytes.to_string(),
                );
                dirs.push(mem);
            }
        } else if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            let dir = Path::new("/sys/fs/cgroup").join(&name);
            std::fs::create_dir(&dir).ok()?;
            std::fs::write(dir.join("pids.max"), limits.processes.to_string()).ok()?;
            let _ = std::fs::write(
                dir.join("memory.max"),
                limits.address_space_bytes.to_string(),
            );
            dirs.push(dir);
        } else {
            return None;
        }
        Some(ProcessGroup { dirs })
    }

    /// The `cgroup.procs` files a child writes itself into.
    pub fn procs_file(&self) -> Vec<CString> {
        self.dirs
            .iter()
            .filter_map(|d| CString::new(d.join("cgroup.procs").to_string_lossy().as_bytes()).ok())
            .collect()
    }

    /// Kills every process in the group.
    pub fn kill_all(&self) {
        for dir in &self.dirs {
            if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                for pid in text.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    // SAFETY: kill with a pid read from the cgroup.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill_all();
        for dir in &self.dirs {
            // Empty once its processes are reaped; retry briefly.
            for _ in 0..50 {
                if std::fs::remove_dir(dir).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Writes the calling process into each `cgroup.procs` (between fork and exec).
pub fn join_group(files: &[CString]) -> std::io::Result<()> {
    for file in files {
        // SAFETY: open/write/close with valid pointers; async-signal-safe.
        unsafe {
            let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let n = libc::write(fd, b"0".as_ptr().cast(), 1);
            libc::close(fd);
            if n != 1 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// CPU time of reaped children of this process (user + system), in milliseconds.
pub fn children_cpu() -> u64 {
    // SAFETY: getrusage with a zeroed struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    let ms = |t: libc::timeval| t.tv_sec as u64 * 1000 + t.tv_usec as u64 / 1000;
    ms(usage.ru_utime) + ms(usage.ru_stime)
}
