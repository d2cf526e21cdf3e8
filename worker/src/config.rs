//! Worker settings.

use std::time::Duration;

/// How a worker behaves.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Conversations owned at once (turn slots).
    pub slots: usize,
    /// How long a lease lasts without renewal.
    pub lease_ttl: Duration,
    /// How often an owner renews its lease and reports progress on its wakes.
    pub renew_every: Duration,
    /// The delay of a nak for a wake whose conversation another worker owns (grows with
    /// deliveries, up to eight times this).
    pub busy_delay: Duration,
    /// Model and tool rounds per turn.
    pub max_rounds: u32,
    /// How long a shutdown waits for running turns before leaving them to recovery.
    pub grace: Duration,
    /// How often the worker announces itself (owned conversations) on the bus.
    pub heartbeat_every: Duration,
    /// How often a running turn looks at its lane for follow-ups and stops.
    pub lane_poll: Duration,
    /// How often the worker sweeps for turns left open by dead owners (and once at start).
    pub sweep_every: Duration,
    /// A bare git repository that every published project version is also pushed to, as
    /// `refs/turnpike/<conversation>/turn_<n>` (a mirror: failures are logged, the object store
    /// stays the source).
    pub git_remote: Option<String>,
    /// Where turns' workspaces are created (each is deleted when its turn ends).
    pub workspace_root: std::path::PathBuf,
    /// What a workspace may hold when its turn ends; past it the turn fails, nothing committed.
    pub workspace_quota: crate::workspace::Quota,
    /// Where tests make this worker hang or pause (nothing without the `failpoints` feature).
    pub failpoints: crate::failpoints::Failpoints,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            slots: 64,
            lease_ttl: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
            busy_delay: Duration::from_millis(250),
            max_rounds: 8,
            grace: Duration::from_secs(20),
            heartbeat_every: Duration::from_secs(5),
            lane_poll: Duration::from_secs(1),
            sweep_every: Duration::from_secs(30),
            git_remote: None,
            workspace_root: crate::workspace::default_root(),
            workspace_quota: crate::workspace::Quota::default(),
            failpoints: Default::default(),
        }
    }
}
