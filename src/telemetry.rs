//! Traces: when `--otlp-endpoint` is set, spans go to an OpenTelemetry collector over OTLP/HTTP
//! (JSON), batched on a thread of their own. One trace per turn: the edge's `accept` span,
//! carried over the bus beside the event (`turnpike_router::trace`), the worker's `turn` span,
//! its model calls (`chat {model}`, OpenTelemetry's GenAI conventions), tool calls
//! (`execute_tool {name}`) and cell runs. Only Turnpike's own spans are exported (never the
//! HTTP client's, which sends them).

use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::trace::SdkTracerProvider;

/// The exporter's HTTP client: the process's reqwest client, run on the process's runtime
/// (the batch processor's thread has none of its own).
#[derive(Debug)]
struct OnRuntime {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for OnRuntime {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let client = self.client.clone();
        let task = self.runtime.spawn(async move {
            let (parts, body) = request.into_parts();
            let response = client
                .request(parts.method, parts.uri.to_string())
                .headers(parts.headers)
                .body(body)
                .timeout(Duration::from_secs(10))
                .send()
                .await?;
            let status = response.status();
            let headers = response.headers().clone();
            let body = response.bytes().await?;
            let mut out = http::Response::new(body);
            *out.status_mut() = status;
            *out.headers_mut() = headers;
            Ok::<_, reqwest::Error>(out)
        });
        Ok(task.await??)
    }
}

/// The tracer provider exporting to `endpoint` (the collector's base URL, e.g.
/// `http://otel-collector:4318`, or the full `…/v1/traces`), and the layer feeding it.
pub fn otlp(
    endpoint: &str,
    runtime: tokio::runtime::Handle,
) -> anyhow::Result<(SdkTracerProvider, opentelemetry_sdk::trace::Tracer)> {
    let endpoint = endpoint.trim_end_matches('/');
    let url = if endpoint.ends_with("/v1/traces") {
        endpoint.to_owned()
    } else {
        format!("{endpoint}/v1/traces")
    };
    url::Url::parse(&url).with_context(|| format!("--otlp-endpoint {endpoint:?} is not a URL"))?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpJson)
        .with_endpoint(url)
        .with_http_client(OnRuntime {
            client: reqwest::Client::new(),
            runtime,
        })
        .build()
        .context("building the OTLP exporter")?;
    let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "turnpike".into());
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service)
                .build(),
        )
        .build();
    let tracer = provider.tracer("turnpike");
    Ok((provider, tracer))
}
