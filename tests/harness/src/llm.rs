//! A real language model: llama.cpp's OpenAI-compatible server (`llama_cpp.server`, from PyPI)
//! serving SmolLM2-135M-Instruct on a free loopback port, one per test binary, its output kept
//! in a log the tests can read.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};

use crate::services::{free_port, Service};

/// The name the model is served under.
pub const MODEL: &str = "smollm2";

/// The tokens the server holds per request.
pub const CONTEXT: u32 = 4096;

/// A running model server.
pub struct LlamaServer {
    _service: Service,
    addr: SocketAddr,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl LlamaServer {
    /// Starts a server on a free port (the model loads in about a second).
    pub fn start() -> Result<Self> {
        Self::start_with_context(CONTEXT)
    }

    /// Starts a server that holds `context` tokens per request: longer requests are refused.
    pub fn start_with_context(context: u32) -> Result<Self> {
        let python = std::env::var("TURNPIKE_LLAMA_PYTHON")
            .unwrap_or_else(|_| "/var/tmp/turnpike-services/venv/bin/python".into());
        let gguf = std::env::var("TURNPIKE_LLM_GGUF").unwrap_or_else(|_| {
            "/var/tmp/turnpike-services/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf".into()
        });
        if !std::path::Path::new(&gguf).is_file() {
            bail!("the language model is not installed ({gguf}): run `scripts/services install tests` — the tests use the real model");
        }
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("llama.log");
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
        let args: Vec<String> = [
            "-m",
            "llama_cpp.server",
            "--model",
            &gguf,
            "--model_alias",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            &addr.port().to_string(),
            "--n_ctx",
            &context.to_string(),
        ]
        .map(String::from)
        .to_vec();
        let service = Service::start_logging(
            &python,
            &args,
            addr,
            Duration::from_secs(120),
            "TERM",
            Some(&log),
        )
        .with_context(|| format!("starting llama.cpp's server (log: {})", log.display()))?;
        Ok(Self {
            _service: service,
            addr,
            log,
            _dir: dir,
        })
    }

    /// The API base, `http://127.0.0.1:PORT/v1`.
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// What the server has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The test binary's server, started on first use.
pub fn shared() -> &'static LlamaServer {
    static SHARED: OnceLock<LlamaServer> = OnceLock::new();
    SHARED.get_or_init(|| LlamaServer::start().expect("starting the model server for the tests"))
}

/// A pass-through in front of a model server that keeps every request body it forwards: what
/// the server received, exactly. Responses stream back as they come, and a client that goes
/// away takes the upstream request with it.
pub struct RecordingProxy {
    url: String,
    seen: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RecordingProxy {
    /// Starts a proxy on a free port in front of `upstream` (an API base ending in `/v1`).
    pub async fn start(upstream: &str) -> Result<Self> {
        use axum::body::{Body, Bytes};
        use axum::extract::State;
        use axum::response::Response;

        type Seen = std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>;
        #[derive(Clone)]
        struct Upstream {
            url: String,
            client: reqwest::Client,
            seen: Seen,
        }
        async fn forward(State(up): State<Upstream>, body: Bytes) -> Response {
            if let Ok(json) = serde_json::from_slice(&body) {
                up.seen.lock().expect("seen lock").push(json);
            }
            let sent = up
                .client
                .post(format!("{}/chat/completions", up.url))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await;
            match sent {
                Ok(r) => Response::builder()
                    .status(r.status().as_u16())
                    .header(
                        "content-type",
                        r.headers()
                            .get("content-type")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("application/json")
                            .to_owned(),
                    )
                    .body(Body::from_stream(r.bytes_stream()))
                    .expect("a response"),
                Err(e) => Response::builder()
                    .status(502)
                    .body(Body::from(e.to_string()))
                    .expect("a response"),
            }
        }
        let seen: Seen = Default::default();
        let state = Upstream {
            url: upstream.trim_end_matches('/').to_owned(),
            client: reqwest::Client::new(),
            seen: seen.clone(),
        };
        let app = axum::Router::new()
            .route("/v1/chat/completions", axum::routing::post(forward))
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/v1", listener.local_addr()?);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { url, seen, task })
    }

    /// The proxy's API base.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Every request body forwarded so far, in order.
    pub fn requests(&self) -> Vec<serde_json::Value> {
        self.seen.lock().expect("seen lock").clone()
    }
}

impl Drop for RecordingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
