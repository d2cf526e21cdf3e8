//! The OpenAI-compatible embedder against a real HTTP server speaking `/v1/embeddings`: the
//! request it sends, batching, order by `index`, unit length, and clear errors.

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use turnpike_index::embed::OpenAiEmbedder;
use turnpike_index::{Embedder, ErrorKind};

/// A request body and its authorization header.
type Request = (Value, Option<String>);

#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Request>>>);

/// A server that embeds each input as [len, 0, 0, vowels] (so results are checkable), returns
/// the items in reverse order, and misbehaves on request: model "broken" → 500, "short" → a
/// 2-d vector, "few" → one item too few.
async fn embeddings(
    State(seen): State<Seen>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    seen.0.lock().unwrap().push((body.clone(), auth));
    let model = body["model"].as_str().unwrap_or_default();
    if model == "broken" {
        return (StatusCode::INTERNAL_SERVER_ERROR, "the model fell over").into_response();
    }
    let inputs: Vec<String> = body["input"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let mut data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let vowels = text.chars().filter(|c| "aeiou".contains(*c)).count() as f32;
            let v = if model == "short" {
                vec![1.0, 0.0]
            } else {
                vec![text.len() as f32, 0.0, 0.0, vowels]
            };
            json!({"object": "embedding", "index": i, "embedding": v})
        })
        .collect();
    if model == "few" {
        data.pop();
    }
    data.reverse();
    Json(json!({"object": "list", "data": data, "model": model})).into_response()
}

async fn server() -> (String, Seen) {
    let seen = Seen::default();
    let app = Router::new()
        .route("/v1/embeddings", post(embeddings))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/v1"), seen)
}

#[tokio::test]
async fn embeds_in_order_in_batches_with_unit_length_and_the_key() {
    let (url, seen) = server().await;
    let embedder = OpenAiEmbedder::new(&url, "tiny", Some("sk-test".into()), 4).unwrap();
    let texts: Vec<String> = (0..300).map(|i| "a".repeat(i % 7 + 1) + "xyz").collect();
    let vectors = embedder.embed(&texts).await.unwrap();
    assert_eq!(vectors.len(), 300);
    for (text, v) in texts.iter().zip(&vectors) {
        // [len, 0, 0, vowels] normalised: the ratio survives, the length is 1.
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
        let vowels = text.chars().filter(|c| "aeiou".contains(*c)).count() as f32;
        assert!(
            (v[3] / v[0] - vowels / text.len() as f32).abs() < 1e-5,
            "{text}"
        );
    }
    let seen = seen.0.lock().unwrap();
    assert_eq!(seen.len(), 3, "300 inputs in batches of at most 128");
    assert_eq!(seen[0].0["model"], "tiny");
    assert_eq!(seen[0].0["input"].as_array().unwrap().len(), 128);
    assert_eq!(seen[0].1.as_deref(), Some("Bearer sk-test"));
}

#[tokio::test]
async fn server_errors_and_wrong_shapes_are_clear_errors() {
    let (url, _) = server().await;
    let texts = vec!["one".to_string(), "two".to_string()];
    for (model, dimension, expect) in [
        ("broken", 4, "500"),
        ("short", 4, "2 dimensions; configured for 4"),
        ("few", 4, "asked for 2 embeddings, got 1"),
    ] {
        let embedder = OpenAiEmbedder::new(&url, model, None, dimension).unwrap();
        let e = embedder.embed(&texts).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Embedder);
        assert!(e.to_string().contains(expect), "{model}: {e}");
    }
    // Nothing listening.
    let embedder = OpenAiEmbedder::new("http://127.0.0.1:9/v1", "tiny", None, 4).unwrap();
    assert_eq!(
        embedder.embed(&texts).await.unwrap_err().kind(),
        ErrorKind::Embedder
    );
}
