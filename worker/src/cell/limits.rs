//! Resource limits of a cell: rlimits set between fork and exec (inherited by everything the
//! cell starts), and a pids (and memory) cgroup when the worker may create one — rlimits on the
//! number of processes do not bind root, a cgroup does.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a cell may run by default.
pub const DEFAULT_WALL: Duration = Duration::from_secs(30);

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
            wall: DEFAULT_WALL,
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
    /// `RLIMIT_NPROC` only with `nproc`: it counts every process of the uid, so it bounds one
    /// cell only where the cell has a uid of its own ([`Budget::OwnUid`]).
    pub fn apply(&self, nproc: bool) -> std::io::Result<()> {
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
        if nproc {
            set(libc::RLIMIT_NPROC, self.processes)?;
        }
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

/// Whether moving a process into a cgroup waits for an RCU grace period on this host, judged
/// from the mount table (`/proc/self/mounts`): true when cgroups are mounted and no hierarchy
/// carries `favordynmods`.
///
/// Why it matters: a migration (a write to `cgroup.procs`, as every cell's child does before it
/// execs) takes the kernel's global `cgroup_threadgroup_rwsem` for writing, and unless some
/// hierarchy favours dynamic modifications that first waits for a grace period: about 10 ms
/// on a 2-core VM, more than the rest of a cell's start. `favordynmods` is global (one
/// hierarchy mounted with it is enough); it makes forks and exits a little dearer instead.
pub fn joins_wait_for_rcu(mounts: &str) -> bool {
    let mut cgroups = false;
    for line in mounts.lines() {
        let mut fields = line.split_whitespace();
        let (Some(_source), Some(_target), Some(fstype), Some(options)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if fstype != "cgroup" && fstype != "cgroup2" {
            continue;
        }
        if options.split(',').any(|o| o == "favordynmods") {
            return false;
        }
        cgroups = true;
    }
    cgroups
}

/// The advice a worker logs once where [`joins_wait_for_rcu`] holds.
pub const SLOW_JOINS: &str = "every cell waits about 10 ms for the kernel to move it into its \
     cgroup (an RCU grace period): no cgroup hierarchy here is mounted with `favordynmods`. \
     Remount the cgroup2 hierarchy with it (`mount -o remount,favordynmods /sys/fs/cgroup`, \
     or `/sys/fs/cgroup/unified` on a hybrid host; `scripts/services install` does it) or boot \
     with `cgroup_favordynmods=true`";

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

/// How a cell's process budget is kept its own — never shared with the worker's threads or
/// with another tenant's cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// The worker is root: each run drops to a host uid of its own (`cell_uid`), so
    /// `RLIMIT_NPROC` counts that run's processes only (and a pids cgroup binds too where one
    /// can be made).
    OwnUid,
    /// The worker is not root but may create pids cgroups: each run's own cgroup bounds its
    /// processes, and no `RLIMIT_NPROC` is set (it would count the worker's uid: its threads
    /// and every other cell).
    Cgroup,
}

impl Budget {
    /// The mode this process can give cells, or why none (then `exec` refuses: cells never
    /// run on a shared budget).
    pub fn detect(cgroups: bool, limits: &Limits) -> Result<Budget, String> {
        // SAFETY: geteuid cannot fail.
        let uid = unsafe { libc::geteuid() };
        if uid == 0 {
            return Ok(Budget::OwnUid);
        }
        if cgroups && ProcessGroup::create(Path::new("/"), limits).is_some() {
            return Ok(Budget::Cgroup);
        }
        Err(format!(
            "no sandbox: this worker runs as uid {uid}, not root, and may create no pids cgroup{}, so every cell would share one process budget (RLIMIT_NPROC counts all of uid {uid}'s processes: the worker's threads and every other tenant's cell); run the worker as root (each cell then gets a uid of its own) or delegate a cgroup with the pids controller to it",
            if cgroups { "" } else { " (cgroups are off)" }
        ))
    }
}

/// The host uids cells of a root worker run as: far above any account's, one per run, drawn
/// at random, so that cells of workers sharing a kernel (containers that all run as pid 1)
/// do not meet on one uid: with 100 cells running on a host at once, two share a uid with a
/// probability of about 2·10⁻⁵.
pub const CELL_UIDS: std::ops::Range<u32> = 1_900_000_000..2_147_000_000;

/// Uids this process's running cells hold: two cells of one worker never share one.
static HELD: std::sync::Mutex<std::collections::BTreeSet<u32>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A cell's uid, held for this process until dropped.
#[derive(Debug)]
pub struct CellUid(u32);

impl CellUid {
    /// Draws a uid no running cell of this process holds.
    pub fn take() -> Self {
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let uid = cell_uid();
            if held.insert(uid) {
                return CellUid(uid);
            }
        }
    }

    pub fn get(&self) -> u32 {
        self.0
    }

    /// The uid of the sandboxes over `workspace`: the one its running sandboxes hold (a turn's
    /// MCP server and its `exec` cells share the workspace's files, so they share its owner),
    /// or a new one. Released once the last of them ends.
    pub fn for_workspace(workspace: &Path) -> std::sync::Arc<CellUid> {
        let mut by = BY_WORKSPACE.lock().unwrap_or_else(|e| e.into_inner());
        by.retain(|_, uid| uid.strong_count() > 0);
        if let Some(uid) = by.get(workspace).and_then(std::sync::Weak::upgrade) {
            return uid;
        }
        let uid = std::sync::Arc::new(CellUid::take());
        by.insert(workspace.to_path_buf(), std::sync::Arc::downgrade(&uid));
        uid
    }
}

/// The uids of workspaces some sandbox of this process runs over.
static BY_WORKSPACE: std::sync::Mutex<
    std::collections::BTreeMap<PathBuf, std::sync::Weak<CellUid>>,
> = std::sync::Mutex::new(std::collections::BTreeMap::new());

impl Drop for CellUid {
    fn drop(&mut self) {
        HELD.lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.0);
    }
}

/// A uid for a cell of a root worker, drawn from [`CELL_UIDS`] (see [`CellUid::take`]).
pub fn cell_uid() -> u32 {
    let mut bytes = [0u8; 8];
    let drawn = match getrandom::getrandom(&mut bytes) {
        Ok(()) => u64::from_le_bytes(bytes),
        // No entropy: still distinct within this process.
        Err(_) => {
            (u64::from(std::process::id()) << 32) ^ unique().wrapping_mul(0x9E37_79B9_7F4A_7C15)
        }
    };
    let span = u64::from(CELL_UIDS.end - CELL_UIDS.start);
    CELL_UIDS.start + (drawn % span) as u32
}

/// Gives the workspace to `uid` (every entry, links themselves, never followed), so that the
/// cell may change what the host put there; at most `max` entries.
pub fn hand_over(root: &Path, uid: u32, max: usize) -> Result<(), String> {
    let chown = |path: &Path| {
        std::os::unix::fs::lchown(path, Some(uid), Some(uid))
            .map_err(|e| format!("cannot hand {} to the cell: {e}", path.display()))
    };
    chown(root)?;
    let mut stack = vec![root.to_path_buf()];
    let mut seen = 0usize;
    while let Some(dir) = stack.pop() {
        let Ok(read) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in read.filter_map(|e| e.ok()) {
            seen += 1;
            if seen > max {
                return Err(format!("the workspace holds more than {max} entries"));
            }
            let path = entry.path();
            chown(&path)?;
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(path);
            }
        }
    }
    Ok(())
}

/// Becomes `uid` (and gid `uid`, no supplementary groups) for good: between fork and exec.
pub fn drop_to(uid: u32) -> std::io::Result<()> {
    // SAFETY: setgroups/setgid/setuid are async-signal-safe; the order drops groups first.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0
            || libc::setgid(uid) != 0
            || libc::setuid(uid) != 0
        {
            return Err(std::io::Error::last_os_error());
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

#[cfg(test)]
mod mount_tests {
    use super::joins_wait_for_rcu;

    /// A hybrid host as Debian's VMs mount it: v1 controllers and an empty v2 hierarchy.
    const HYBRID: &str = "\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
";

    #[test]
    fn joins_wait_unless_some_hierarchy_favours_dynamic_modifications() {
        assert!(joins_wait_for_rcu(HYBRID));
        // One hierarchy with the option is enough: the lock it changes is global.
        let tuned = HYBRID.replace(
            "cgroup2 rw,relatime 0 0",
            "cgroup2 rw,relatime,favordynmods 0 0",
        );
        assert!(!joins_wait_for_rcu(&tuned));
        // Set by `cgroup_favordynmods=true` at boot, a v1 hierarchy shows it too.
        let booted = HYBRID.replace("rw,relatime,pids", "rw,relatime,favordynmods,pids");
        assert!(!joins_wait_for_rcu(&booted));
        // A pure v2 host, with and without.
        let v2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n";
        assert!(joins_wait_for_rcu(v2));
        assert!(!joins_wait_for_rcu(
            &v2.replace("nsdelegate", "nsdelegate,favordynmods")
        ));
    }

    #[test]
    fn no_cgroups_mounted_means_no_joins_to_wait_for() {
        assert!(!joins_wait_for_rcu(""));
        assert!(!joins_wait_for_rcu(
            "proc /proc proc rw 0 0\nsysfs /sys sysfs rw 0 0\n"
        ));
        // An option merely containing the word, or a short line, is not the option.
        assert!(joins_wait_for_rcu(
            "cgroup2 /sys/fs/cgroup cgroup2 rw,nofavordynmods 0 0\ncgroup2\n"
        ));
    }
}

#[cfg(test)]
mod uid_tests {
    use super::*;

    #[test]
    fn cells_of_one_process_never_hold_the_same_uid() {
        let held: Vec<CellUid> = (0..2000).map(|_| CellUid::take()).collect();
        let distinct: std::collections::BTreeSet<u32> = held.iter().map(CellUid::get).collect();
        assert_eq!(distinct.len(), held.len());
        assert!(held.iter().all(|u| CELL_UIDS.contains(&u.get())));
        let first = held[0].get();
        drop(held);
        assert!(
            !HELD.lock().unwrap().contains(&first),
            "released when dropped"
        );
    }

    #[test]
    fn sandboxes_over_one_workspace_share_its_uid_and_no_other_workspace_gets_it() {
        let (a, b) = (Path::new("/tmp/ws-a"), Path::new("/tmp/ws-b"));
        let server = CellUid::for_workspace(a);
        let cell = CellUid::for_workspace(a);
        let other = CellUid::for_workspace(b);
        assert_eq!(server.get(), cell.get());
        assert_ne!(server.get(), other.get());
        let uid = server.get();
        drop((server, cell));
        assert!(
            !HELD.lock().unwrap().contains(&uid),
            "released with the last"
        );
        assert_ne!(CellUid::for_workspace(a).get(), other.get());
    }
}
