//! The benchmarks `turnpike bench …` runs. Each measures beside a floor taken in the same run
//! (the raw store put, bare Python, raw JetStream, in-process ingress, …), so its numbers read
//! as ratios that hold on a noisy machine.
//!
//! # Layout
//! - [`series`]: [`Series`], percentiles and rates of timed operations
//! - [`record`]: appends and verification of the signed record
//! - [`search`]: ranking quality on a test collection, and the index at scale
//! - [`context`]: the context rebuild of a long conversation
//! - [`git`]: project versions
//! - [`lanes`]: accept → turn start and turns per second, embedded and on JetStream
//! - [`erase`]: deleting conversations from every store, and the sweep with nothing due
//! - [`edge`]: the HTTP/WebSocket edge over a stack the caller starts
//! - [`fairness`]: one tenant's burst against another tenant's single messages
//! - [`fleet`]: routers and workers as processes on NATS, through the API: scaling with W
//! - [`cell`]: the cell's overhead over bare Python
//! - [`mcp`]: an MCP call through Turnpike beside the Python client's, and a server's start
//! - [`model`]: what Turnpike adds to a real model's first token and to a tool-using turn
//! - [`remote`]: what a remote app adds to a turn, and the cost of one streamed action
//! - [`soak`]: resident memory over a long run, embedded and on a fleet
//!
//! The binary does the wiring (configuration, the stack under test) and calls these.
//!
//! The book: `book/src/operating/benchmarks.md` (and `book/src/SUMMARY.md` for the rest).

pub mod cell;
pub mod mcp;

/// The store a benchmark writes to: the embedded default's local store under a fresh folder in `dir` (or the
/// system's temporary folder), or the object store at `url`. Returns the folder (kept as long
/// as the store is used), the store, and where it is, for the report.
pub fn bench_store(
    dir: Option<std::path::PathBuf>,
    url: Option<String>,
) -> anyhow::Result<(
    tempfile::TempDir,
    std::sync::Arc<dyn object_store::ObjectStore>,
    String,
)> {
    let tmp = match dir {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir()?,
    };
    let (store, place): (std::sync::Arc<dyn object_store::ObjectStore>, String) = match url {
        Some(url) => (turnpike_artifactory::open_store(&url)?, url),
        // The embedded default's store: one SQLite database (without fsync: the benches
        // measure reads and the work around them).
        None => {
            let root = tmp.path().join("store");
            let root = root
                .to_str()
                .ok_or_else(|| anyhow::anyhow!("the temporary folder is not UTF-8"))?;
            (
                turnpike_artifactory::open_local(
                    root,
                    Some(turnpike_artifactory::LocalLayout::Sqlite),
                    false,
                )?,
                format!("the embedded default's local store (one SQLite database) at {root}"),
            )
        }
    };
    Ok((tmp, store, place))
}
pub mod a2a;
pub mod context;
mod cpu;
pub mod edge;
pub mod erase;
pub mod fairness;
pub mod fleet;
pub mod git;
pub mod lanes;
pub mod model;
pub mod record;
pub mod remote;
pub mod schedules;
pub mod search;
pub mod series;
pub mod soak;
pub mod webhooks;

pub use series::Series;
