//! What a worker counts and times, through the `metrics` facade (the binary installs the
//! Prometheus recorder; without one every call is a no-op). Labels are bounded: outcomes,
//! reasons, tool names and models from the manifests — never tenants, users or conversations.

use std::time::Duration;

use turnpike_schemas::entry::TurnOutcome;
use turnpike_schemas::EntryBody;

/// A record batch was appended in `took`: its latency, and what its entries say (a dispatch's
/// schedule-to-start, a completion's outcome and duration, an idle close). `dispatched_ms`
/// holds the dispatch time of the turn this owner opened (0: none), for the duration.
pub(crate) fn committed(
    bodies: &[EntryBody],
    took: Duration,
    dispatched_ms: &std::sync::atomic::AtomicU64,
) {
    use std::sync::atomic::Ordering;
    metrics::histogram!("turnpike_record_append_seconds").record(took.as_secs_f64());
    let accepted = bodies
        .iter()
        .filter_map(|b| b.as_input().map(|i| i.event.accepted_at_ms))
        .min();
    for body in bodies {
        match body {
            EntryBody::TurnDispatched(d) => {
                dispatched_ms.store(d.at_ms, Ordering::Release);
                if let Some(accepted) = accepted {
                    metrics::histogram!("turnpike_turn_schedule_to_start_seconds")
                        .record(seconds(d.at_ms.saturating_sub(accepted)));
                }
            }
            EntryBody::TurnComplete(c) => {
                let outcome = outcome(c.outcome);
                metrics::counter!("turnpike_turns_total", "outcome" => outcome).increment(1);
                let since = dispatched_ms.swap(0, Ordering::AcqRel);
                if since > 0 {
                    metrics::histogram!("turnpike_turn_duration_seconds", "outcome" => outcome)
                        .record(seconds(c.at_ms.saturating_sub(since)));
                }
            }
            EntryBody::TurnAmbiguous(_) => {
                metrics::counter!("turnpike_turns_total", "outcome" => "quarantined").increment(1);
            }
            EntryBody::IdleClosed(_) => {
                metrics::counter!("turnpike_idle_closed_total").increment(1)
            }
            _ => {}
        }
    }
}

/// A turn outcome as a label.
fn outcome(o: TurnOutcome) -> &'static str {
    match o {
        TurnOutcome::Replied => "replied",
        TurnOutcome::Parked => "parked",
        TurnOutcome::Cancelled => "cancelled",
        TurnOutcome::Failed => "failed",
    }
}

/// How long an approval request waited for its answer (ms).
pub(crate) fn approval_wait(ms: u64) {
    metrics::histogram!("turnpike_approval_wait_seconds").record(seconds(ms));
}

/// A turn refused because a budget was spent.
pub(crate) fn budget_refusal() {
    metrics::counter!("turnpike_budget_refusals_total").increment(1);
}

/// One cell run.
pub(crate) fn cell_run(took: Duration, outcome: &'static str) {
    metrics::counter!("turnpike_cell_runs_total", "outcome" => outcome).increment(1);
    metrics::histogram!("turnpike_cell_run_seconds").record(took.as_secs_f64());
}

fn seconds(ms: u64) -> f64 {
    ms as f64 / 1_000.0
}
