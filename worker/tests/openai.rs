//! The `openai` provider against a real HTTP server that speaks the chat-completions protocol:
//! streamed deltas, tool calls (parallel, arguments in fragments), a stalled stream, a 429 then
//! success, and a 400.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use turnpike_agent::model::openai::{OpenAi, OpenAiConfig};
use turnpike_agent::model::{
    CallContext, Message, ModelErrorKind, ModelProvider, ModelRequest, Role, ToolChoice, ToolSpec,
};

/// A request body and its authorization header.
type Request = (Value, Option<String>);

/// Every request the server saw, by model.
#[derive(Clone, Default)]
struct Seen {
    requests: Arc<Mutex<HashMap<String, Vec<Request>>>>,
}

fn sse(chunks: Vec<Value>, then_hang: bool) -> Response {
    let (tx, rx) = mpsc::channel::<Result<String, Infallible>>(16);
    tokio::spawn(async move {
        for c in chunks {
            let _ = tx.send(Ok(format!("data: {c}\n\n"))).await;
        }
        if then_hang {
            // Keep the connection open, sending nothing, until the client gives up.
            tx.closed().await;
        } else {
            let _ = tx.send(Ok("data: [DONE]\n\n".into())).await;
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

fn delta(content: Value) -> Value {
    json!({"choices": [{"index": 0, "delta": content, "finish_reason": null}]})
}

async fn completions(
    State(seen): State<Seen>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let model = body["model"].as_str().unwrap_or_default().to_owned();
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let attempt = {
        let mut requests = seen.requests.lock().unwrap();
        let list = requests.entry(model.clone()).or_default();
        list.push((body.clone(), auth));
        list.len()
    };
    match model.as_str() {
        "text" => sse(
            vec![
                delta(json!({"role": "assistant", "content": ""})),
                delta(json!({"content": "Hel"})),
                delta(json!({"content": "lo, "})),
                delta(json!({"content": "world"})),
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
                json!({"choices": [], "model": "text-2026-01-01", "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15,
                    "prompt_tokens_details": {"cached_tokens": 5}, "completion_tokens_details": {"reasoning_tokens": 2}}}),
            ],
            false,
        ),
        "tools" => sse(
            vec![
                delta(json!({"tool_calls": [
                    {"index": 0, "id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": ""}},
                    {"index": 1, "id": "call_b", "type": "function", "function": {"name": "list_files", "arguments": "{\"pa"}}]})),
                delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"path\": "}}]})),
                delta(json!({"tool_calls": [{"index": 1, "function": {"arguments": "th\": \"docs\"}"}}]})),
                delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"a.txt\"}"}}]})),
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            ],
            false,
        ),
        // llama-cpp-python's way: the id and the name again in every fragment.
        "repeats" => sse(
            vec![
                delta(json!({"role": "assistant", "content": null, "tool_calls": null})),
                delta(json!({"tool_calls": [{"index": 0, "id": "call_x", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\""}}]})),
                delta(json!({"tool_calls": [{"index": 0, "id": "call_x", "type": "function", "function": {"name": "read_file", "arguments": ": \"a.txt\"}"}}]})),
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            ],
            false,
        ),
        "stall" => sse(vec![delta(json!({"content": "thinking"}))], true),
        "flaky" if attempt == 1 => (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", "0")],
            Json(json!({"error": {"message": "slow down"}})),
        )
            .into_response(),
        "flaky" => sse(vec![delta(json!({"content": "ok after a retry"}))], false),
        _ => (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": {"message": format!("model {model:?} does not exist"), "type": "invalid_request_error"}})),
        )
            .into_response(),
    }
}

async fn server() -> (String, Seen) {
    let seen = Seen::default();
    let app = Router::new()
        .route("/v1/chat/completions", post(completions))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/v1"), seen)
}

fn provider(base_url: String) -> OpenAi {
    OpenAi::new(OpenAiConfig {
        base_url,
        api_key_env: Some("TURNPIKE_TEST_OPENAI_KEY".into()),
        connect_timeout: Duration::from_secs(5),
        stall_timeout: Duration::from_millis(500),
        deadline: Duration::from_secs(30),
        max_retries: 2,
        backoff: Duration::from_millis(10),
        stream: true,
    })
    .unwrap()
}

fn request(model: &str) -> ModelRequest {
    ModelRequest {
        tool_choice: Default::default(),
        temperature: None,
        model: model.into(),
        messages: vec![
            Message::new(Role::System, "be brief"),
            Message::new(Role::User, "hi"),
        ],
        tools: vec![ToolSpec {
            name: "read_file".into(),
            description: "read".into(),
            parameters: json!({"type": "object"}),
        }],
        turn_start: 1,
        closing: false,
        compaction: false,
        max_tokens: None,
    }
}

fn context() -> (CallContext, mpsc::UnboundedReceiver<String>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let (_arrivals_tx, arrivals) = watch::channel(0);
    (CallContext::new(Some(tx), arrivals), rx)
}

fn set_key() {
    // Every test sets the same value; tests in this file never unset it.
    unsafe { std::env::set_var("TURNPIKE_TEST_OPENAI_KEY", "sk-test-123") };
}

#[tokio::test]
async fn streamed_text_arrives_as_deltas_with_usage_and_the_key() {
    set_key();
    let (url, seen) = server().await;
    let (mut cx, mut deltas) = context();
    let reply = provider(url)
        .complete(&request("text"), &mut cx)
        .await
        .unwrap();
    assert_eq!(reply.text, "Hello, world");
    assert!(reply.tool_calls.is_empty());
    assert_eq!(reply.finish_reason.as_deref(), Some("stop"));
    let usage = reply.usage.unwrap();
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (12, 3));
    // The nested details are read; the model is the one the response named.
    assert_eq!((usage.cached_tokens, usage.reasoning_tokens), (5, 2));
    assert_eq!(reply.model.as_deref(), Some("text-2026-01-01"));
    let mut streamed = Vec::new();
    while let Ok(d) = deltas.try_recv() {
        streamed.push(d);
    }
    assert_eq!(streamed, ["Hel", "lo, ", "world"]);
    let requests = seen.requests.lock().unwrap();
    let (body, auth) = &requests["text"][0];
    assert_eq!(auth.as_deref(), Some("Bearer sk-test-123"));
    assert_eq!(body["stream"], true);
    assert_eq!(body["messages"][1]["role"], "user");
    assert_eq!(body["tools"][0]["function"]["name"], "read_file");
}

#[tokio::test]
async fn parallel_tool_calls_are_assembled_from_fragments() {
    set_key();
    let (url, _) = server().await;
    let (mut cx, _) = context();
    let reply = provider(url)
        .complete(&request("tools"), &mut cx)
        .await
        .unwrap();
    assert_eq!(reply.tool_calls.len(), 2);
    assert_eq!(reply.tool_calls[0].id, "call_a");
    assert_eq!(reply.tool_calls[0].name, "read_file");
    assert_eq!(reply.tool_calls[0].arguments, json!({"path": "a.txt"}));
    assert_eq!(reply.tool_calls[1].name, "list_files");
    assert_eq!(reply.tool_calls[1].arguments, json!({"path": "docs"}));
    assert_eq!(reply.finish_reason.as_deref(), Some("tool_calls"));
}

#[tokio::test]
async fn tool_choice_and_temperature_are_sent_as_the_protocol_says() {
    set_key();
    let (url, seen) = server().await;
    let (mut cx, _) = context();
    let choices = [
        (ToolChoice::Auto, json!("auto")),
        (ToolChoice::Required, json!("required")),
        (ToolChoice::None, json!("none")),
        (
            ToolChoice::Tool("read_file".into()),
            json!({"type": "function", "function": {"name": "read_file"}}),
        ),
    ];
    for (choice, want) in choices {
        let mut r = request("tools");
        r.tool_choice = choice;
        r.temperature = Some(0.0);
        provider(url.clone()).complete(&r, &mut cx).await.unwrap();
        let body = seen.requests.lock().unwrap()["tools"]
            .last()
            .unwrap()
            .0
            .clone();
        assert_eq!(body["tool_choice"], want);
        assert_eq!(body["temperature"], json!(0.0));
    }
    // A closing call has no tools, so no tool choice; no temperature leaves the default.
    let mut r = request("tools");
    r.closing = true;
    r.tool_choice = ToolChoice::Required;
    provider(url).complete(&r, &mut cx).await.unwrap();
    let body = seen.requests.lock().unwrap()["tools"]
        .last()
        .unwrap()
        .0
        .clone();
    assert!(
        body.get("tools").is_none() && body.get("tool_choice").is_none(),
        "{body}"
    );
    assert!(body.get("temperature").is_none(), "{body}");
}

#[tokio::test]
async fn an_id_and_name_repeated_in_every_fragment_are_taken_once() {
    set_key();
    let (url, _) = server().await;
    let (mut cx, _) = context();
    let reply = provider(url)
        .complete(&request("repeats"), &mut cx)
        .await
        .unwrap();
    assert_eq!(reply.tool_calls.len(), 1);
    assert_eq!(reply.tool_calls[0].id, "call_x");
    assert_eq!(reply.tool_calls[0].name, "read_file");
    assert_eq!(reply.tool_calls[0].arguments, json!({"path": "a.txt"}));
}

#[tokio::test]
async fn a_stalled_stream_times_out_and_is_not_retried() {
    set_key();
    let (url, seen) = server().await;
    let (mut cx, mut deltas) = context();
    let err = provider(url)
        .complete(&request("stall"), &mut cx)
        .await
        .unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Timeout, "{err}");
    assert!(err.message.contains("stalled"), "{err}");
    assert_eq!(deltas.try_recv().unwrap(), "thinking");
    assert_eq!(
        seen.requests.lock().unwrap()["stall"].len(),
        1,
        "streamed calls are not retried"
    );
}

#[tokio::test]
async fn a_429_is_retried_then_succeeds() {
    set_key();
    let (url, seen) = server().await;
    let (mut cx, _) = context();
    let reply = provider(url)
        .complete(&request("flaky"), &mut cx)
        .await
        .unwrap();
    assert_eq!(reply.text, "ok after a retry");
    assert_eq!(seen.requests.lock().unwrap()["flaky"].len(), 2);
}

#[tokio::test]
async fn a_400_is_a_clear_error_and_not_retried() {
    set_key();
    let (url, seen) = server().await;
    let (mut cx, _) = context();
    let err = provider(url)
        .complete(&request("nope"), &mut cx)
        .await
        .unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Rejected);
    assert!(err.message.contains("400"), "{err}");
    assert!(
        err.message.contains("model \"nope\" does not exist"),
        "{err}"
    );
    assert_eq!(seen.requests.lock().unwrap()["nope"].len(), 1);
}

#[tokio::test]
async fn an_unreachable_endpoint_is_unavailable_after_retries() {
    set_key();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    drop(listener);
    let (mut cx, _) = context();
    let err = provider(url)
        .complete(&request("text"), &mut cx)
        .await
        .unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Unavailable, "{err}");
}

/// A chat model for the multi-turn test: on a request whose last message is the user's, it
/// asks to write a file; after a tool result it replies, saying how many messages it saw.
async fn chat(State(seen): State<Seen>, Json(body): Json<Value>) -> Response {
    seen.requests
        .lock()
        .unwrap()
        .entry("chat".into())
        .or_default()
        .push((body.clone(), None));
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let last = messages.last().cloned().unwrap_or_default();
    // Usage: ten prompt tokens per message, one completion token per call.
    let usage = json!({"choices": [], "usage": {"prompt_tokens": 10 * messages.len(), "completion_tokens": 1}});
    if last["role"] == "user" {
        let text = last["content"].as_str().unwrap_or_default();
        let args = json!({"path": "note.txt", "content": text}).to_string();
        sse(
            vec![
                delta(
                    json!({"tool_calls": [{"index": 0, "id": format!("call_{}", messages.len()),
                "type": "function", "function": {"name": "write_file", "arguments": args}}]}),
                ),
                usage,
            ],
            false,
        )
    } else {
        sse(
            vec![
                delta(json!({"content": format!("noted; I saw {} messages", messages.len())})),
                usage,
            ],
            false,
        )
    }
}

#[tokio::test]
async fn an_openai_agent_holds_a_multi_turn_conversation_through_a_worker() {
    use turnpike_artifactory::{ConversationPrefix, Conversations, NewConversation, RecordSigner};
    use turnpike_router::embedded::{EmbeddedBus, EmbeddedConfig};
    use turnpike_router::{Bus, Ingress};
    use turnpike_schemas::{Block, EventBody, Identity, TurnId};
    use turnpike_worker::{Apps, Manifest, Registry, Worker, WorkerConfig, WorkerPool};

    set_key();
    let seen = Seen::default();
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let dir = tempfile::tempdir().unwrap();
    let manifest = Manifest::parse(
        &format!(
            "app = \"notes\"\n[agents.scribe]\nprovider = \"openai\"\nmodel = \"chat\"\n\
             base_url = \"{url}\"\napi_key_env = \"TURNPIKE_TEST_OPENAI_KEY\"\n\
             system_prompt = \"Keep notes.\"\ntools = [\"write_file\"]\n"
        ),
        dir.path(),
        &Registry::builtin(),
    )
    .unwrap();
    let apps = Arc::new(Apps::new().with_manifest(manifest, None));
    let store: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let conversations = Conversations::new(store);
    let bus: Arc<dyn Bus> =
        EmbeddedBus::open(&dir.path().join("bus.redb"), EmbeddedConfig::default()).unwrap();
    let signer = RecordSigner::from_seed([7; 32]);
    let owner: Identity = "oidc:acme:u-1".parse().unwrap();
    let (entry, record, _) = conversations
        .create(
            &signer,
            NewConversation {
                tenant: "acme".parse().unwrap(),
                owner: owner.clone(),
                app: "notes".parse().unwrap(),
                agent: "scribe".parse().unwrap(),
                at_ms: 1,
                instructions: None,
                started_by: None,
            },
        )
        .await
        .unwrap();
    let pool = WorkerPool::start([Worker::new(
        bus.clone(),
        conversations.clone(),
        signer,
        apps,
        WorkerConfig {
            workspace_root: dir.path().join("ws"),
            ..WorkerConfig::default()
        },
    )]);
    let ingress = Ingress::new(bus, conversations.clone());
    for (n, text) in [(1, "buy milk"), (2, "and eggs")] {
        ingress
            .submit(
                &"acme".parse().unwrap(),
                &owner,
                entry.conversation,
                EventBody::Message { text: text.into() },
                None,
            )
            .await
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let head = record.head().await.unwrap();
            if head.state().last_turn >= n && !head.state().turn_open {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "turn {n} did not finish"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    pool.stop().await;

    let logs = conversations.turn_logs();
    let prefix = ConversationPrefix::new("acme".parse().unwrap(), entry.conversation);
    let two = logs.read(&prefix, TurnId::new(2).unwrap()).await.unwrap();
    let reply = two.blocks.iter().find_map(|b| match b {
        Block::AssistantMessage { text } => Some(text.clone()),
        _ => None,
    });
    // system, turn 1 (user, assistant+call, tool, assistant), turn 2 (user, assistant+call, tool)
    assert_eq!(reply.as_deref(), Some("noted; I saw 8 messages"));
    // Turn 2's two calls saw 6 and 8 messages: the usage the endpoint reported, summed.
    let usage = two.usage.expect("the endpoint reported usage");
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (140, 2));
    let requests = seen.requests.lock().unwrap();
    let bodies: Vec<&Value> = requests["chat"].iter().map(|(b, _)| b).collect();
    assert_eq!(bodies.len(), 4, "two model calls per turn");
    let history = bodies[2]["messages"].as_array().unwrap();
    let roles: Vec<&str> = history
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "tool", "assistant", "user"]
    );
    assert_eq!(history[1]["content"], "buy milk");
    assert_eq!(
        history[2]["tool_calls"][0]["function"]["name"],
        "write_file"
    );
    assert_eq!(
        history[3]["tool_call_id"],
        history[2]["tool_calls"][0]["id"]
    );
    assert_eq!(history[4]["content"], "noted; I saw 4 messages");
    assert_eq!(history[5]["content"], "and eggs");
}
