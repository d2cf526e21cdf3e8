//! What a cell needs from the machine.

use std::path::PathBuf;

use super::limits::Limits;

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
