//! Traces: `turnpike serve --otlp-endpoint` sends one trace per turn to an OTLP/HTTP receiver
//! (this test's, decoding OTLP's JSON): the edge's accept span, the worker's turn span as its
//! child (the context crossed the bus beside the event), the model call as a GenAI `chat` span,
//! the tool call and, under it, the cell run.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::post;
use serde_json::{json, Value};
use turnpike_tests::edge::{apps_with, create, say, wait_for_complete_turns, Server, ALICE};

const LONG: Duration = Duration::from_secs(60);

/// An OTLP/HTTP receiver: every span of every export it was sent.
async fn receiver() -> (String, Arc<Mutex<Vec<Value>>>) {
    let spans: Arc<Mutex<Vec<Value>>> = Arc::default();
    let kept = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: axum::body::Bytes| {
            let kept = kept.clone();
            async move {
                let export: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let mut kept = kept.lock().unwrap();
                for rs in export["resourceSpans"].as_array().into_iter().flatten() {
                    for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                        for span in ss["spans"].as_array().into_iter().flatten() {
                            let mut span = span.clone();
                            span["resource"] = rs["resource"].clone();
                            kept.push(span);
                        }
                    }
                }
                axum::Json(json!({}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, spans)
}

/// The string value of a span's attribute.
fn attribute(span: &Value, key: &str) -> Option<String> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| {
            let v = &a["value"];
            v["stringValue"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| v.to_string())
        })
}

const MANIFEST: &str = r#"
app = "traced"

[agents.coder]
provider = "script"
script = "coder.script.toml"
tools = ["exec"]
"#;

/// Round 1 runs code in a cell; round 2 replies.
const SCRIPT: &str = r#"
[[turn]]
[[turn.step]]
tool_calls = [{ name = "exec", arguments = { code = "print(6 * 7)" } }]
[[turn.step]]
text = "The cell said 42."
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_runs_from_the_edge_through_the_lane_to_the_model_the_tool_and_the_cell() {
    let (url, spans) = receiver().await;
    let apps = apps_with(&[("traced.toml", MANIFEST), ("coder.script.toml", SCRIPT)]);
    let server = Server::start_with_env(
        &PathBuf::from(env!("CARGO_BIN_EXE_turnpike")),
        Some(apps.path()),
        &["--otlp-endpoint", &url],
        false,
        // Export within a fraction of a second, not the default five.
        &[("OTEL_BSP_SCHEDULE_DELAY", "100".into())],
    )
    .expect("turnpike serve");
    let alice = server.client(ALICE);
    let id = create(&alice, "traced", "coder").await;
    say(&alice, &id, "what is six times seven?").await;
    let turns = wait_for_complete_turns(&alice, &id, 1, LONG).await.unwrap();
    assert_eq!(turns[0].replies, ["The cell said 42."], "{turns:#?}");

    // Wait for the spans of the whole turn.
    let deadline = Instant::now() + LONG;
    // Spans of the turn's trace only (the worker's start-up self-check runs a cell too).
    let find = |spans: &[Value], name: &str| -> Option<Value> {
        let turn = spans.iter().find(|s| s["name"] == "turn turn_1")?;
        spans
            .iter()
            .filter(|s| s["traceId"] == turn["traceId"])
            .find(|s| s["name"].as_str().is_some_and(|n| n.starts_with(name)))
            .cloned()
    };
    let names = [
        "accept message",
        "turn turn_1",
        "chat ",
        "execute_tool exec",
        "cell run",
    ];
    let got: Vec<Value> = loop {
        let now = spans.lock().unwrap().clone();
        let found: Vec<Option<Value>> = names.iter().map(|n| find(&now, n)).collect();
        if found.iter().all(Option::is_some) {
            break found.into_iter().map(Option::unwrap).collect();
        }
        assert!(
            Instant::now() < deadline,
            "spans missing: {:?}",
            now.iter().map(|s| s["name"].clone()).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let [accept, turn, chat, tool, cell] = &got[..] else {
        unreachable!()
    };
    // One trace, and each span the child of the one before it in the path.
    for span in &got {
        assert_eq!(span["traceId"], accept["traceId"], "{span:#}");
        assert_eq!(
            attribute(span, "service.name").or_else(|| span["resource"]["attributes"]
                .as_array()
                .and_then(|a| a.iter().find(|x| x["key"] == "service.name"))
                .map(|x| x["value"]["stringValue"].as_str().unwrap_or("").to_owned())),
            Some("turnpike".into())
        );
    }
    assert_eq!(
        turn["parentSpanId"], accept["spanId"],
        "the turn continues the accept"
    );
    assert_eq!(chat["parentSpanId"], turn["spanId"]);
    assert_eq!(tool["parentSpanId"], turn["spanId"]);
    assert_eq!(
        cell["parentSpanId"], tool["spanId"],
        "the cell runs inside the tool call"
    );
    // The model span after OpenTelemetry's GenAI conventions.
    assert_eq!(
        attribute(chat, "gen_ai.operation.name").as_deref(),
        Some("chat")
    );
    assert_eq!(
        attribute(chat, "gen_ai.provider.name").as_deref(),
        Some("script")
    );
    assert!(
        attribute(chat, "gen_ai.request.model").is_some(),
        "{chat:#}"
    );
    assert_eq!(attribute(tool, "gen_ai.tool.name").as_deref(), Some("exec"));
    assert_eq!(
        attribute(turn, "turnpike.conversation").as_deref(),
        Some(id.as_str())
    );
    // The second model call (the reply) is in the same trace too.
    let chats = spans
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s["name"].as_str().is_some_and(|n| n.starts_with("chat ")))
        .filter(|s| s["traceId"] == accept["traceId"])
        .count();
    assert_eq!(chats, 2, "two model calls in the turn");
}
