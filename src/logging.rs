//! Logging: `tracing` to stderr, filtered like `RUST_LOG`, as text or JSON; and, with
//! `--otlp-endpoint`, Turnpike's spans to an OpenTelemetry collector ([`crate::telemetry`]).

use anyhow::Context as _;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

use crate::cli::{Global, LogFormat};

/// What must outlive the process's work: the tracer provider, shut down (flushed) on drop.
pub struct Guard(Option<opentelemetry_sdk::trace::SdkTracerProvider>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(provider) = self.0.take() {
            let _ = provider.shutdown();
        }
    }
}

pub fn init(global: &Global, runtime: &tokio::runtime::Handle) -> anyhow::Result<Guard> {
    let filter = match &global.log {
        Some(f) => EnvFilter::try_new(f).with_context(|| format!("invalid log filter {f:?}"))?,
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
    };
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match global.log_format {
        LogFormat::Text => fmt.boxed(),
        LogFormat::Json => fmt
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .boxed(),
    };
    let (provider, otel) = match &global.otlp_endpoint {
        Some(endpoint) => {
            let (provider, tracer) = crate::telemetry::otlp(endpoint, runtime.clone())?;
            // Turnpike's own spans only: the exporter's HTTP client must not trace itself.
            let ours = Targets::new()
                .with_target("turnpike", tracing::Level::INFO)
                .with_target("turnpike_edge", tracing::Level::INFO)
                .with_target("turnpike_router", tracing::Level::INFO)
                .with_target("turnpike_worker", tracing::Level::INFO);
            let layer = tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(ours);
            (Some(provider), Some(layer))
        }
        None => (None, None),
    };
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(otel)
        .init();
    Ok(Guard(provider))
}
