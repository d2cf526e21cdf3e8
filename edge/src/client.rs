//! A client of the edge's API, for `turnpike chat`, the benchmarks and the tests: requests,
//! the live stream, and a cursor that reads every committed row exactly once.

use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use reqwest::Method;
use serde_json::Value;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::Message;

use super::model::Frame;

/// A response: its status and JSON body (`Null` when it had none or was not JSON).
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
    /// `Retry-After`, in seconds, when the server sent one.
    pub retry_after: Option<u64>,
}

impl Reply {
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The error's `code`, when the body is an error.
    pub fn code(&self) -> &str {
        self.body["code"].as_str().unwrap_or("")
    }

    /// The body if the request succeeded, else an error naming status, code and message.
    pub fn into_ok(self) -> Result<Value, String> {
        if self.ok() {
            Ok(self.body)
        } else {
            Err(format!(
                "{} {}: {}",
                self.status,
                self.code(),
                self.body["message"].as_str().unwrap_or("")
            ))
        }
    }
}

/// The API at `base` (e.g. `http://127.0.0.1:7700`) as the holder of `token`.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    pub fn new(base: &str, token: &str) -> Self {
        Self {
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(256)
                .build()
                .expect("an HTTP client builds"),
            base: base.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// The same server as another caller.
    pub fn as_token(&self, token: &str) -> Self {
        Self {
            http: self.http.clone(),
            base: self.base.clone(),
            token: token.to_owned(),
        }
    }

    /// Any request. `body` is sent as JSON; `key` as the `Idempotency-Key`.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        key: Option<&str>,
    ) -> Result<Reply, String> {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(body);
        }
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        reply(request.send().await.map_err(|e| e.to_string())?).await
    }

    /// A raw request for tests of malformed input: `body` as given, with `content_type`.
    pub async fn send_raw(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Result<Reply, String> {
        let request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body);
        reply(request.send().await.map_err(|e| e.to_string())?).await
    }

    pub async fn get(&self, path: &str) -> Result<Reply, String> {
        self.send(Method::GET, path, None, None).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<Reply, String> {
        self.send(Method::POST, path, Some(body), None).await
    }

    pub async fn delete(&self, path: &str) -> Result<Reply, String> {
        self.send(Method::DELETE, path, None, None).await
    }

    /// Downloads bytes (a file, a signed link), with or without the token.
    pub async fn bytes(&self, path: &str, authorised: bool) -> Result<(u16, Vec<u8>), String> {
        let mut request = self.http.get(format!("{}{path}", self.base));
        if authorised {
            request = request.bearer_auth(&self.token);
        }
        let response = request.send().await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let bytes = response.bytes().await.map_err(|e| e.to_string())?;
        Ok((status, bytes.to_vec()))
    }

    /// Uploads a file as an attachment of `conversation`.
    pub async fn attach(
        &self,
        conversation: &str,
        name: &str,
        media_type: &str,
        bytes: Vec<u8>,
    ) -> Result<Reply, String> {
        let part = reqwest::multipart::Part::bytes(bytes)
            .file_name(name.to_owned())
            .mime_str(media_type)
            .map_err(|e| e.to_string())?;
        let form = reqwest::multipart::Form::new().part("file", part);
        let response = self
            .http
            .post(format!(
                "{}/v1/conversations/{conversation}/attachments",
                self.base
            ))
            .bearer_auth(&self.token)
            .multipart(form)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        reply(response).await
    }

    /// Opens the conversation's live stream (a WebSocket), with a short-lived stream ticket
    /// as a browser would (the bearer token stays out of the URL).
    pub async fn stream(&self, conversation: &str) -> Result<FrameStream, String> {
        let issued = self
            .post(
                &format!("/v1/conversations/{conversation}/stream-tickets"),
                &Value::Null,
            )
            .await?;
        let ticket = match (issued.status, issued.body["ticket"].as_str()) {
            (201, Some(ticket)) => ticket.to_owned(),
            _ => {
                return Err(format!(
                    "no stream ticket ({}): {}",
                    issued.status, issued.body
                ))
            }
        };
        let url = format!(
            "{}/v1/conversations/{conversation}/stream?ticket={ticket}",
            self.base.replacen("http", "ws", 1)
        );
        let request = url.into_client_request().map_err(|e| e.to_string())?;
        let (socket, _) = tokio_tungstenite::connect_async(request)
            .await
            .map_err(|e| format!("connecting the stream: {e}"))?;
        Ok(FrameStream {
            socket,
            closed_with: None,
        })
    }
}

async fn reply(response: reqwest::Response) -> Result<Reply, String> {
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let bytes = response.bytes().await.map_err(|e| e.to_string())?;
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok(Reply {
        status,
        body,
        retry_after,
    })
}

/// A conversation's live frames over a WebSocket.
pub struct FrameStream {
    socket: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    /// The close code the server ended the stream with, once it did.
    closed_with: Option<u16>,
}

impl FrameStream {
    /// The next frame, or `None` when the stream ended.
    pub async fn next(&mut self) -> Option<Frame> {
        loop {
            match self.socket.next().await? {
                Ok(Message::Text(text)) => {
                    if let Ok(frame) = serde_json::from_str(&text) {
                        return Some(frame);
                    }
                }
                Ok(Message::Ping(p)) => {
                    let _ = self.socket.send(Message::Pong(p)).await;
                }
                Ok(Message::Close(frame)) => {
                    self.closed_with = frame.map(|f| u16::from(f.code));
                    return None;
                }
                Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// The close code the server ended the stream with (1001: the router went away).
    pub fn close_code(&self) -> Option<u16> {
        self.closed_with
    }

    /// The next frame within `wait`; `None` on timeout or end.
    pub async fn next_within(&mut self, wait: Duration) -> Option<Frame> {
        tokio::time::timeout(wait, self.next()).await.ok().flatten()
    }

    /// Drops the connection (as a client that goes away would).
    pub async fn close(mut self) {
        let _ = self.socket.close(None).await;
    }
}

/// Reads a conversation's committed rows in order, each exactly once, across reconnects: it
/// keeps the highest `seq` read and asks only for what comes after it.
#[derive(Debug, Clone)]
pub struct Cursor {
    pub conversation: String,
    /// The highest `seq` read (0: none).
    pub after: u64,
}

impl Cursor {
    pub fn new(conversation: &str) -> Self {
        Self {
            conversation: conversation.to_owned(),
            after: 0,
        }
    }

    /// Every row committed after the cursor, moving it past them.
    pub async fn read(&mut self, client: &Client) -> Result<Vec<Value>, String> {
        let mut rows = Vec::new();
        loop {
            let page = client
                .get(&format!(
                    "/v1/conversations/{}/messages?after={}&limit=500",
                    self.conversation, self.after
                ))
                .await?
                .into_ok()?;
            let through = page["through"].as_u64().unwrap_or(self.after);
            for row in page["rows"].as_array().into_iter().flatten() {
                rows.push(row.clone());
            }
            match page["next_after"].as_u64() {
                Some(next) if next > self.after => self.after = next,
                _ => {
                    // The page reached the head: everything up to `through` has been read.
                    self.after = self.after.max(through);
                    return Ok(rows);
                }
            }
        }
    }
}
