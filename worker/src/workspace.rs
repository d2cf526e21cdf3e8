//! The turn's workspace: a fresh directory on the executing machine, made when the turn first
//! uses it and deleted when the turn ends — after success, error, cancellation (the turn's
//! future is dropped) or a panic (unwinding drops it). Nothing in it outlives the turn; durable
//! results go to the stores. A turn that never uses it (a reply without tools) makes no
//! directory at all: creating and deleting one costs a file system two inodes and a block.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use turnpike_schemas::{ConversationId, TurnId};

/// A turn's private directory, made on first use; removed on drop.
#[derive(Debug)]
pub struct Workspace {
    /// Where it is, or will be once used: a fresh name under the root.
    path: PathBuf,
    /// Set by the first [`Workspace::path`]: whether making the directory worked.
    made: OnceLock<Result<(), String>>,
}

impl Workspace {
    /// Names a fresh directory under `root` (named after the turn, with a random part); nothing
    /// is made until [`Workspace::path`] is first called.
    pub fn new(root: &Path, conversation: ConversationId, turn: TurnId) -> Self {
        Workspace {
            path: root.join(format!("{conversation}-{turn}-{}", ulid::Ulid::new())),
            made: OnceLock::new(),
        }
    }

    /// The directory, made (private to this user) on the first call. When it cannot be made,
    /// the path is still returned (what uses it fails) and [`Workspace::error`] says why.
    pub fn path(&self) -> &Path {
        self.made.get_or_init(|| {
            make(&self.path).map_err(|e| {
                format!(
                    "cannot create a workspace under {}: {e}",
                    self.path.parent().unwrap_or(Path::new("/")).display()
                )
            })
        });
        &self.path
    }

    /// Whether the turn used its workspace (and it was made): one never used holds nothing to
    /// audit or commit.
    pub fn is_made(&self) -> bool {
        matches!(self.made.get(), Some(Ok(())))
    }

    /// Why the workspace could not be made, when the turn asked for it and it could not.
    pub fn error(&self) -> Option<&str> {
        match self.made.get() {
            Some(Err(why)) => Some(why),
            _ => None,
        }
    }

    /// Removes the directory off the async threads (large trees take a while); dropping the
    /// workspace removes it too, synchronously.
    pub async fn remove(mut self) -> io::Result<()> {
        if self.made.take().is_none() {
            return Ok(());
        }
        let path = std::mem::take(&mut self.path);
        tokio::task::spawn_blocking(move || remove_tree(&path))
            .await
            .map_err(io::Error::other)?
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        // Also after a failed make: whatever a tool made at the path goes too.
        if self.made.get().is_some() {
            let _ = remove_tree(&self.path);
        }
    }
}

/// Makes a workspace directory (its root too, if absent), readable by this user only.
fn make(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    if let Some(root) = path.parent() {
        std::fs::create_dir_all(root)?;
    }
    std::fs::DirBuilder::new().mode(0o700).create(path)
}

/// Removes a tree; one that is not there is removed already.
fn remove_tree(path: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// What a workspace may hold when its turn ends (and before anything of it is committed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub max_files: usize,
    pub max_bytes: u64,
}

impl Default for Quota {
    fn default() -> Self {
        Quota {
            max_files: 10_000,
            max_bytes: 256 << 20,
        }
    }
}

/// What an audit counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Audited {
    pub files: usize,
    pub bytes: u64,
}

/// Checks that a workspace holds only folders and regular files, within `quota`: generated
/// code may leave a FIFO (opening it would block a host thread), a socket, a device node, a
/// symbolic link (reading through it would leave the workspace) or a tree too large to commit.
/// Never follows links, never opens a file, and stops as soon as the quota is passed, so a huge
/// tree costs no more than the quota. Blocking: call it off the async threads.
pub fn audit(root: &Path, quota: Quota) -> Result<Audited, String> {
    let mut seen = Audited::default();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let read =
            std::fs::read_dir(&dir).map_err(|e| format!("cannot read the workspace: {e}"))?;
        for entry in read {
            let entry = entry.map_err(|e| format!("cannot read the workspace: {e}"))?;
            let path = entry.path();
            let rel = path
                .strip_prefix(root)
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            let kind = entry
                .file_type()
                .map_err(|e| format!("cannot read the workspace at {rel}: {e}"))?;
            if kind.is_dir() {
                // Folders count against the file quota too: a tree of empty folders is no
                // cheaper to walk and commit.
                seen.files += 1;
                if seen.files > quota.max_files {
                    return Err(format!(
                        "the workspace holds more than {} files and folders; that is more than a turn may leave",
                        quota.max_files
                    ));
                }
                stack.push(path);
                continue;
            }
            if !kind.is_file() {
                let what = if kind.is_symlink() {
                    "a symbolic link"
                } else {
                    use std::os::unix::fs::FileTypeExt as _;
                    if kind.is_fifo() {
                        "a FIFO"
                    } else if kind.is_socket() {
                        "a socket"
                    } else if kind.is_block_device() || kind.is_char_device() {
                        "a device node"
                    } else {
                        "a special file"
                    }
                };
                return Err(format!(
                    "the workspace holds {what} at {rel}; only folders and regular files may be left in it"
                ));
            }
            seen.files += 1;
            seen.bytes += entry
                .metadata()
                .map_err(|e| format!("cannot read the workspace at {rel}: {e}"))?
                .len();
            if seen.files > quota.max_files {
                return Err(format!(
                    "the workspace holds more than {} files and folders; that is more than a turn may leave",
                    quota.max_files
                ));
            }
            if seen.bytes > quota.max_bytes {
                return Err(format!(
                    "the workspace holds more than {} bytes; that is more than a turn may leave",
                    quota.max_bytes
                ));
            }
        }
    }
    Ok(seen)
}

/// Where workspaces go by default: `$TMPDIR/turnpike-workspaces`.
pub fn default_root() -> PathBuf {
    std::env::temp_dir().join("turnpike-workspaces")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn make(root: &Path) -> (Workspace, PathBuf) {
        let ws = Workspace::new(root, ConversationId::new(), TurnId::FIRST);
        std::fs::create_dir_all(ws.path().join("deep/er")).unwrap();
        std::fs::write(ws.path().join("deep/er/file.txt"), b"x").unwrap();
        let path = ws.path().to_path_buf();
        (ws, path)
    }

    #[test]
    fn an_audit_refuses_special_files_links_and_trees_past_the_quota() {
        let ws = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(ws.path().join("a/b")).unwrap();
        std::fs::write(ws.path().join("a/b/ok.txt"), b"12345").unwrap();
        // Two folders and a file count three.
        let quota = Quota {
            max_files: 4,
            max_bytes: 100,
        };
        assert_eq!(
            audit(ws.path(), quota).unwrap(),
            Audited { files: 3, bytes: 5 }
        );
        let fifo = ws.path().join("a/pipe");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string naming a path in our own temporary directory.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(audit(ws.path(), quota)
            .unwrap_err()
            .contains("a FIFO at a/pipe"));
        std::fs::remove_file(&fifo).unwrap();
        let sock = std::os::unix::net::UnixListener::bind(ws.path().join("s")).unwrap();
        assert!(audit(ws.path(), quota).unwrap_err().contains("a socket"));
        drop(sock);
        std::fs::remove_file(ws.path().join("s")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", ws.path().join("link")).unwrap();
        assert!(audit(ws.path(), quota)
            .unwrap_err()
            .contains("a symbolic link"));
        std::fs::remove_file(ws.path().join("link")).unwrap();
        for i in 0..3 {
            std::fs::write(ws.path().join(format!("f{i}")), b"x").unwrap();
        }
        assert!(audit(ws.path(), quota)
            .unwrap_err()
            .contains("more than 4 files"));
        for i in 0..3 {
            std::fs::remove_file(ws.path().join(format!("f{i}"))).unwrap();
        }
        let big = std::fs::File::create(ws.path().join("big")).unwrap();
        big.set_len(1 << 30).unwrap();
        assert!(audit(ws.path(), quota)
            .unwrap_err()
            .contains("more than 100 bytes"));
    }

    #[tokio::test]
    async fn a_workspace_is_made_private_on_first_use_and_never_when_unused() {
        use std::os::unix::fs::PermissionsExt as _;
        let root = tempfile::tempdir().unwrap();
        let unused = Workspace::new(
            &root.path().join("ws"),
            ConversationId::new(),
            TurnId::FIRST,
        );
        assert!(!unused.is_made());
        unused.remove().await.unwrap();
        assert!(!root.path().join("ws").exists(), "nothing was made");
        let used = Workspace::new(
            &root.path().join("ws"),
            ConversationId::new(),
            TurnId::FIRST,
        );
        let path = used.path().to_path_buf();
        assert!(used.is_made() && used.error().is_none());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(used.path(), path, "made once");
        used.remove().await.unwrap();
        assert!(!path.exists());
        // A root that cannot hold it: the error says so, and the path is still given.
        let file = root.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let blocked = Workspace::new(&file, ConversationId::new(), TurnId::FIRST);
        let _ = blocked.path();
        assert!(!blocked.is_made());
        assert!(blocked
            .error()
            .is_some_and(|e| e.contains("cannot create a workspace under")));
    }

    #[tokio::test]
    async fn removed_after_success() {
        let root = tempfile::tempdir().unwrap();
        let (ws, path) = make(root.path());
        assert!(path.join("deep/er/file.txt").is_file());
        ws.remove().await.unwrap();
        assert!(!path.exists());
    }

    #[tokio::test]
    async fn removed_after_an_error() {
        let root = tempfile::tempdir().unwrap();
        let (ws, path) = make(root.path());
        let failing = async move {
            let _ws = ws;
            Err::<(), _>("the agent failed")
        };
        assert!(failing.await.is_err());
        assert!(!path.exists());
    }

    #[tokio::test]
    async fn removed_after_cancellation() {
        let root = tempfile::tempdir().unwrap();
        let (ws, path) = make(root.path());
        let never = async move {
            let _ws = ws;
            std::future::pending::<()>().await;
        };
        // A stop cancels the turn by dropping its future.
        assert!(tokio::time::timeout(Duration::from_millis(10), never)
            .await
            .is_err());
        assert!(!path.exists());
    }

    #[tokio::test]
    async fn removed_after_a_panic() {
        let root = tempfile::tempdir().unwrap();
        let (ws, path) = make(root.path());
        let task = tokio::spawn(async move {
            let _ws = ws;
            panic!("a tool panicked");
        });
        assert!(task.await.unwrap_err().is_panic());
        assert!(!path.exists());
    }
}
