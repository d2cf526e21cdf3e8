//! The admin listener of `serve`, `router` and `worker` (`--admin-listen`, default
//! `127.0.0.1:7701`; `off` for none): what an orchestrator probes and Prometheus scrapes.
//!
//! - `GET /livez`: 200 while the process's runtime answers.
//! - `GET /readyz`: 200 when every check passes, else 503; the JSON body lists each check
//!   with why (the bus answers a round trip, the store answers a read, for workers the cell's
//!   self-check passed, settings that were refused). From SIGTERM on it fails at once
//!   (`draining`), before anything else stops, so that traffic moves away first.
//! - `GET /metrics`: Prometheus text. Histograms with buckets (never summaries); no label
//!   grows with tenants, users or conversations.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context as _, Result};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use object_store::{ObjectStore, ObjectStoreExt as _};
use serde::Serialize;
use turnpike_router::bus::Bus;

/// Histogram buckets, in seconds: from a fast record append to a long turn.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];

/// How long one readiness check may take before it counts as failed.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// The process-wide metrics recorder (installed once; later calls get the same handle).
pub fn metrics() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let handle = PrometheusBuilder::new()
            .set_buckets(BUCKETS)
            .expect("the buckets are not empty")
            .install_recorder()
            .expect("no other metrics recorder is installed");
        describe();
        // Histograms keep their samples until drained: drain them now and then.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let upkeep = handle.clone();
            runtime.spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(5));
                loop {
                    tick.tick().await;
                    upkeep.run_upkeep();
                }
            });
        }
        handle
    })
}

/// The help text of every metric this binary's crates record.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_histogram!(
        "turnpike_turn_schedule_to_start_seconds",
        Unit::Seconds,
        "From the turn's first event accepted at the edge to its dispatch by a worker"
    );
    describe_histogram!(
        "turnpike_turn_duration_seconds",
        Unit::Seconds,
        "From a turn's dispatch to its completion, by outcome"
    );
    describe_counter!("turnpike_turns_total", "Turns completed, by outcome");
    describe_counter!(
        "turnpike_turns_abandoned_total",
        "Drains an owner gave up, by reason (fenced, failed, refused); the lane is retried"
    );
    describe_gauge!("turnpike_worker_slots_used", "Conversations owned now");
    describe_gauge!(
        "turnpike_worker_fleet_size",
        "Workers sharing the wakes, this one included, as its heartbeats count them"
    );
    describe_gauge!(
        "turnpike_lane_pending",
        "Wakes waiting for a worker, per lane shard (JetStream's dispatch consumers)"
    );
    describe_gauge!(
        "turnpike_lane_pending_sampled_at_seconds",
        "When turnpike_lane_pending was last read from the bus (Unix seconds)"
    );
    describe_gauge!(
        "turnpike_worker_slots",
        "Conversations a worker may own at once"
    );
    describe_counter!(
        "turnpike_lease_claims_total",
        "Lease claims, by result (won, held, failed)"
    );
    describe_histogram!(
        "turnpike_record_append_seconds",
        Unit::Seconds,
        "One record batch appended and synced"
    );
    describe_counter!(
        "turnpike_model_requests_total",
        "Model requests, by provider, model and outcome"
    );
    describe_histogram!(
        "turnpike_model_request_seconds",
        Unit::Seconds,
        "Model request latency, by provider and model"
    );
    describe_counter!(
        "turnpike_model_tokens_total",
        "Model tokens, by provider, model and direction (input, output)"
    );
    describe_counter!(
        "turnpike_tool_calls_total",
        "Tool calls, by tool and outcome"
    );
    describe_counter!("turnpike_cell_runs_total", "Cell runs, by outcome");
    describe_histogram!(
        "turnpike_cell_run_seconds",
        Unit::Seconds,
        "One cell run, start to result"
    );
    describe_histogram!(
        "turnpike_http_request_duration_seconds",
        Unit::Seconds,
        "API requests, by route, method and status"
    );
    describe_gauge!("turnpike_websocket_connections", "Open WebSocket streams");
    describe_counter!(
        "turnpike_submissions_total",
        "Events accepted onto a lane, by kind"
    );
    describe_counter!(
        "turnpike_rejections_total",
        "Events refused at the edge, by reason"
    );
    describe_gauge!(
        "turnpike_open_turn_marks",
        "Turns the last sweep found left open by owners that are gone (and took over)"
    );
    describe_histogram!(
        "turnpike_model_time_to_first_token_seconds",
        Unit::Seconds,
        "From a streamed model request to its first text, by provider and model"
    );
    describe_histogram!(
        "turnpike_approval_wait_seconds",
        Unit::Seconds,
        "From the turn that asked for an approval to the answer's acceptance"
    );
    describe_gauge!(
        "turnpike_index_queue_depth",
        "Conversations waiting to be indexed (or retried) in this process"
    );
    describe_counter!(
        "turnpike_index_failures_total",
        "Indexing attempts that failed (retried with backoff)"
    );
    describe_counter!(
        "turnpike_budget_refusals_total",
        "Turns refused at dispatch because a daily budget was spent"
    );
    describe_counter!(
        "turnpike_idle_closed_total",
        "Conversations closed as idle by a sweep"
    );
}

/// What `/readyz` checks.
pub struct Probes {
    pub bus: Option<Arc<dyn Bus>>,
    pub store: Arc<dyn ObjectStore>,
    /// For workers: the cell's self-check (`Err`: why there is no sandbox).
    pub cell: Option<std::result::Result<(), String>>,
    /// Whether a failed cell self-check makes the process unready (a fleet worker), or is
    /// only said (`turnpike serve`: turns run without a cell, `exec` refuses).
    pub cell_required: bool,
    /// Settings refused at start (e.g. a retention that does not parse), said in every answer.
    pub refused: Vec<String>,
    /// Set from SIGTERM on.
    pub draining: Arc<AtomicBool>,
}

#[derive(Serialize)]
struct Check {
    name: &'static str,
    ok: bool,
    detail: String,
}

#[derive(Serialize)]
struct Readiness {
    ready: bool,
    checks: Vec<Check>,
}

/// Binds `listen` (unless `off`) and serves the admin routes in the background; says where.
pub async fn start(listen: &str, probes: Probes) -> Result<Option<tokio::task::JoinHandle<()>>> {
    if listen == "off" {
        return Ok(None);
    }
    let addr: std::net::SocketAddr = listen
        .parse()
        .with_context(|| format!("--admin-listen {listen:?}: not an address (or `off`)"))?;
    metrics();
    if let Some(bus) = probes.bus.clone() {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(15));
            loop {
                tick.tick().await;
                if let Ok(Ok(shards)) =
                    tokio::time::timeout(CHECK_TIMEOUT, bus.pending_per_shard()).await
                {
                    for (shard, pending) in shards {
                        metrics::gauge!("turnpike_lane_pending", "shard" => shard.to_string())
                            .set(pending as f64);
                    }
                    // When the backlog was last read: a value that stopped moving because the
                    // bus stopped answering is told apart from a steady one.
                    metrics::gauge!("turnpike_lane_pending_sampled_at_seconds")
                        .set(turnpike_router::bus::now_ms() as f64 / 1000.0);
                }
            }
        });
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("admin listener on {addr}"))?;
    let bound = listener.local_addr()?;
    eprintln!("admin listening on http://{bound} (/livez /readyz /metrics)");
    let app = Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(scrape))
        .with_state(Arc::new(probes));
    Ok(Some(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the admin listener failed");
        }
    })))
}

async fn scrape() -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics().render(),
    )
}

async fn readyz(State(probes): State<Arc<Probes>>) -> impl IntoResponse {
    let mut checks = Vec::new();
    let draining = probes.draining.load(Ordering::Acquire);
    checks.push(Check {
        name: "draining",
        ok: !draining,
        detail: if draining {
            "shutting down: finishing or handing back what runs".into()
        } else {
            "serving".into()
        },
    });
    if let Some(bus) = &probes.bus {
        let answer = tokio::time::timeout(CHECK_TIMEOUT, bus.ping()).await;
        checks.push(match answer {
            Ok(Ok(())) => Check {
                name: "bus",
                ok: true,
                detail: "answers".into(),
            },
            Ok(Err(e)) => Check {
                name: "bus",
                ok: false,
                detail: e.to_string(),
            },
            Err(_) => Check {
                name: "bus",
                ok: false,
                detail: format!("no answer within {CHECK_TIMEOUT:?}"),
            },
        });
    }
    let probe = object_store::path::Path::from("readyz-probe");
    let answer = tokio::time::timeout(CHECK_TIMEOUT, probes.store.head(&probe)).await;
    checks.push(match answer {
        Ok(Ok(_)) | Ok(Err(object_store::Error::NotFound { .. })) => Check {
            name: "store",
            ok: true,
            detail: "answers".into(),
        },
        Ok(Err(e)) => Check {
            name: "store",
            ok: false,
            detail: e.to_string(),
        },
        Err(_) => Check {
            name: "store",
            ok: false,
            detail: format!("no answer within {CHECK_TIMEOUT:?}"),
        },
    });
    if let Some(cell) = &probes.cell {
        checks.push(Check {
            name: "cell",
            ok: cell.is_ok() || !probes.cell_required,
            detail: match cell {
                Ok(()) => "the self-check passed".into(),
                Err(why) if probes.cell_required => why.clone(),
                Err(why) => {
                    format!("unavailable (turns run; `exec` refuses until a sandbox works): {why}")
                }
            },
        });
    }
    for refused in &probes.refused {
        // Said, not failed: the process runs safely without the setting.
        checks.push(Check {
            name: "settings",
            ok: true,
            detail: refused.clone(),
        });
    }
    let ready = checks.iter().all(|c| c.ok);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(Readiness { ready, checks }))
}
