//! Logging: `tracing` to stderr, filtered like `RUST_LOG`, as text or JSON.

use anyhow::Context as _;
use tracing_subscriber::EnvFilter;

use crate::cli::{Global, LogFormat};

pub fn init(global: &Global) -> anyhow::Result<()> {
    let filter = match &global.log {
        Some(f) => EnvFilter::try_new(f).with_context(|| format!("invalid log filter {f:?}"))?,
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match global.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .init(),
    }
    Ok(())
}
