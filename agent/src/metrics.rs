//! What the harness counts and times, through the `metrics` facade (the binary installs the
//! Prometheus recorder; without one every call is a no-op). Labels are bounded: outcomes, tool
//! names and models from the manifests — never tenants, users or conversations.

use std::time::Duration;

/// One model request: its latency, outcome and tokens.
pub(crate) fn model_request(
    provider: &str,
    model: &str,
    took: Duration,
    usage: Option<(u64, u64)>,
    ok: bool,
) {
    let (provider, model) = (provider.to_owned(), model.to_owned());
    let outcome = if ok { "ok" } else { "error" };
    metrics::counter!("turnpike_model_requests_total", "provider" => provider.clone(), "model" => model.clone(), "outcome" => outcome)
        .increment(1);
    metrics::histogram!("turnpike_model_request_seconds", "provider" => provider.clone(), "model" => model.clone())
        .record(took.as_secs_f64());
    if let Some((input, output)) = usage {
        metrics::counter!("turnpike_model_tokens_total", "provider" => provider.clone(), "model" => model.clone(), "direction" => "input")
            .increment(input);
        metrics::counter!("turnpike_model_tokens_total", "provider" => provider, "model" => model, "direction" => "output")
            .increment(output);
    }
}

/// How long a model call took to stream its first text.
pub(crate) fn time_to_first_token(provider: &str, model: &str, took: Duration) {
    metrics::histogram!("turnpike_model_time_to_first_token_seconds", "provider" => provider.to_owned(), "model" => model.to_owned())
        .record(took.as_secs_f64());
}

/// One tool call's outcome (`ok`, `error`, `refused`, `parked`).
pub(crate) fn tool_call(tool: &str, outcome: &'static str) {
    metrics::counter!("turnpike_tool_calls_total", "tool" => tool.to_owned(), "outcome" => outcome)
        .increment(1);
}
