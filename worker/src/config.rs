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
    /// The delay of a nak for a wake this worker cannot take now: once this long when its slots
    /// are full or the owner is between turns; growing with deliveries (up to eight times this)
    /// while another worker runs a turn of the conversation.
    pub busy_delay: Duration,
    /// Model and tool rounds per turn.
    pub max_rounds: u32,
    /// How long a worker alone on the bus keeps a conversation's lease after a drain, for the
    /// next message to resume (see `crate::kept`); zero: released at once, as in a fleet.
    pub keep_lease_for: Duration,
    /// How long a shutdown waits for running turns before leaving them to recovery.
    pub grace: Duration,
    /// How often the worker announces itself (owned conversations) on the bus.
    pub heartbeat_every: Duration,
    /// How often a running turn looks at its lane for follow-ups and stops.
    pub lane_poll: Duration,
    /// How often the worker sweeps for turns left open by dead owners (and once at start).
    pub sweep_every: Duration,
    /// Conversations closed longer than this are deleted by the sweep (`None`: never).
    pub retention: Option<Duration>,
    /// Conversations of apps that set no `idle_timeout` are closed as idle after this long
    /// without activity (`None`: never; an app's own setting wins).
    pub idle_timeout: Option<Duration>,
    /// A bare git repository that every published project version is also pushed to, as
    /// `refs/turnpike/<conversation>/turn_<n>` (a mirror: failures are logged, the object store
    /// stays the source).
    pub git_remote: Option<String>,
    /// Where turns' workspaces are created (each is deleted when its turn ends).
    pub workspace_root: std::path::PathBuf,
    /// What a workspace may hold when its turn ends; past it the turn fails, nothing committed.
    pub workspace_quota: crate::workspace::Quota,
    /// Prices of models, for the cost of each call's `usage` entry (`None`: costs unknown).
    pub prices: Option<std::sync::Arc<crate::usage::PriceTable>>,
    /// Daily spending limits: a turn of a tenant or app whose budget is spent fails at once,
    /// before any model call, with the reason recorded.
    pub budgets: Vec<turnpike_router::usage::Budget>,
    /// Where tests make this worker hang or pause (nothing without the `failpoints` feature).
    pub failpoints: turnpike_lifecycle::failpoints::Failpoints,
    /// The host paths an MCP server's manifest may name in `read_only` (each must lie under
    /// one, after its links are resolved): the operator's grant, never the workspaces.
    pub mcp_read_roots: Vec<std::path::PathBuf>,
    /// Internal addresses, ranges and hosts the operator lets apps' servers be called at
    /// (invariant 12: none by default; public addresses need no entry).
    pub outbound: turnpike_agent::outbound::Outbound,
    /// How the worker's slots are shared between tenants when work waits: weights and caps
    /// (DESIGN step 2; invariant 13).
    pub fair: crate::fair::FairShare,
    /// Whether (and how) this worker fires schedules: it holds free schedule shards beside its
    /// turns (`None`: it leaves them to other workers).
    pub schedules: Option<crate::schedules::SchedulerConfig>,
    /// Whether (and how) this worker delivers outbound webhooks: it holds free delivery shards
    /// beside its turns (`None`: it leaves them to other workers).
    pub webhooks: Option<crate::webhooks::WebhookConfig>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            slots: 64,
            lease_ttl: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
            busy_delay: Duration::from_millis(250),
            max_rounds: 8,
            keep_lease_for: Duration::from_secs(1),
            grace: Duration::from_secs(20),
            heartbeat_every: Duration::from_secs(5),
            lane_poll: Duration::from_secs(1),
            sweep_every: Duration::from_secs(30),
            retention: None,
            idle_timeout: None,
            git_remote: None,
            workspace_root: crate::workspace::default_root(),
            workspace_quota: crate::workspace::Quota::default(),
            prices: None,
            budgets: Vec::new(),
            failpoints: Default::default(),
            mcp_read_roots: vec!["/opt".into()],
            outbound: Default::default(),
            fair: Default::default(),
            schedules: Some(Default::default()),
            webhooks: Some(Default::default()),
        }
    }
}

/// Parses a retention setting: `off`, or a duration such as `90s`, `30m`, `24h`, `7d`. The
/// error says what is wrong (a deployment then deletes nothing, and says so).
pub fn parse_retention(text: &str) -> Result<Option<Duration>, String> {
    let text = text.trim();
    if text == "off" {
        return Ok(None);
    }
    let duration = parse_duration(text)?;
    if duration.is_zero() {
        return Err(format!(
            "{text:?} is no time at all; say `off` to keep everything"
        ));
    }
    Ok(Some(duration))
}

use turnpike_agent::duration::parse_duration;
pub use turnpike_agent::duration::parse_idle_timeout;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_settings_parse_or_say_why_not() {
        assert_eq!(parse_retention("off").unwrap(), None);
        assert_eq!(
            parse_retention("24h").unwrap(),
            Some(Duration::from_secs(86_400))
        );
        assert_eq!(
            parse_retention("90s").unwrap(),
            Some(Duration::from_secs(90))
        );
        assert_eq!(
            parse_retention("7d").unwrap(),
            Some(Duration::from_secs(604_800))
        );
        for bad in ["banana", "24", "h", "0s", "5w", "-3h", ""] {
            assert!(parse_retention(bad).is_err(), "{bad}");
        }
    }
}
