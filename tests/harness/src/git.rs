//! The real `git` binary, for checking what Turnpike writes.

use std::path::Path;
use std::process::Command;

/// Runs `git --git-dir GIT_DIR ARGS…` and returns its stdout; panics with git's stderr when it
/// fails.
pub fn git(git_dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("--git-dir")
        .arg(git_dir)
        .args(args)
        .output()
        .expect("the git binary runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("git prints UTF-8 here")
}

/// Creates an empty bare repository at `dir`.
pub fn init_bare(dir: &Path) {
    let status = Command::new("git")
        .args(["init", "--bare", "-q"])
        .arg(dir)
        .status()
        .expect("the git binary runs");
    assert!(status.success(), "git init --bare {}", dir.display());
}
