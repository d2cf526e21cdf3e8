//! The turn's workspace: a fresh directory on the executing machine, deleted when the turn
//! ends — after success, error, cancellation (the turn's future is dropped) or a panic
//! (unwinding drops it). Nothing in it outlives the turn; durable results go to the stores.

use std::io;
use std::path::{Path, PathBuf};

use turnpike_schemas::{ConversationId, TurnId};

/// A turn's private directory; removed on drop.
#[derive(Debug)]
pub struct Workspace {
    dir: Option<tempfile::TempDir>,
}

impl Workspace {
    /// Creates a fresh directory under `root` (created if absent), named after the turn.
    pub fn create(root: &Path, conversation: ConversationId, turn: TurnId) -> io::Result<Self> {
        std::fs::create_dir_all(root)?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("{conversation}-{turn}-"))
            .tempdir_in(root)?;
        Ok(Workspace { dir: Some(dir) })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir
            .as_ref()
            .expect("a live workspace has its directory")
            .path()
    }

    /// Removes the directory off the async threads (large trees take a while); dropping the
    /// workspace removes it too, synchronously.
    pub async fn remove(mut self) -> io::Result<()> {
        let Some(dir) = self.dir.take() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || dir.close())
            .await
            .map_err(io::Error::other)?
    }
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
        let ws = Workspace::create(root, ConversationId::new(), TurnId::FIRST).unwrap();
        std::fs::create_dir_all(ws.path().join("deep/er")).unwrap();
        std::fs::write(ws.path().join("deep/er/file.txt"), b"x").unwrap();
        let path = ws.path().to_path_buf();
        (ws, path)
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
