//! The live exchange: a remote app over HTTP.
//!
//! `POST {url}/v1/turns` with the turn's context opens the exchange; its response is the app's
//! actions, one JSON object per line, held open for the whole turn. What the worker sends the
//! app during the turn goes to `POST {url}/v1/turns/{exchange}/messages`. Every request carries
//! `Turnpike-Protocol`, `Turnpike-Exchange`, `Idempotency-Key` (the same for every attempt at
//! a turn) and, when the agent names a secret, `Authorization: Bearer <secret>`.
//!
//! Contract: connecting is bounded by the connect timeout; every silence of the app (waiting
//! for the response, between two lines, answering a message) by the read timeout; the whole
//! exchange by its deadline. A line longer than `max_line_bytes`, or a stream longer than
//! `max_bytes`, ends the exchange with an error that says so.

use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt as _};
use serde_json::Value;
use tokio::time::Instant;
use turnpike_schemas::Block;

use super::driver::{Exchange, Step};
use super::protocol::{Limits, ToApp, PROTOCOL_VERSION};
use super::spec::RemoteSpec;
use crate::agent_loop::Inbox;
use crate::error::{Error, Result};
use crate::model::CallContext;

type ByteStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// A live exchange with a remote app.
pub struct HttpExchange {
    client: reqwest::Client,
    base: String,
    secret: Option<String>,
    id: String,
    key: String,
    limits: Limits,
    deadline: Instant,
    stream: Option<ByteStream>,
    /// Bytes read and not yet taken as lines; `scanned` of them hold no newline.
    buf: BytesMut,
    scanned: usize,
    read: u64,
}

/// The longest the exchange's last message (a stop, a park, a refusal) may take.
const FINAL_SEND: Duration = Duration::from_secs(5);

impl HttpExchange {
    /// An exchange `id` (unique per attempt) under the idempotency `key` (the same for every
    /// attempt at the turn).
    pub fn new(spec: &RemoteSpec, id: String, key: String, limits: Limits) -> Result<Self> {
        let client = spec.client.clone();
        let secret = match &spec.secret_env {
            Some(var) => Some(std::env::var(var).map_err(|_| {
                Error::app(format!(
                    "the app's secret variable {var} is not set on this worker"
                ))
            })?),
            None => None,
        };
        Ok(Self {
            client,
            base: spec.url.trim_end_matches('/').to_owned(),
            secret,
            id,
            key,
            limits,
            deadline: Instant::now() + Duration::from_millis(limits.deadline_ms),
            stream: None,
            buf: BytesMut::new(),
            scanned: 0,
            read: 0,
        })
    }

    fn post(&self, path: &str) -> reqwest::RequestBuilder {
        let mut request = self
            .client
            .post(format!("{}{path}", self.base))
            .header("Turnpike-Protocol", PROTOCOL_VERSION.to_string())
            .header("Turnpike-Exchange", &self.id)
            .header("Idempotency-Key", &self.key);
        if let Some(secret) = &self.secret {
            request = request.bearer_auth(secret);
        }
        request
    }

    /// The read timeout, cut short by the deadline.
    fn silence_until(&self) -> Instant {
        (Instant::now() + Duration::from_millis(self.limits.read_timeout_ms)).min(self.deadline)
    }

    /// Why a wait that ended at `until` timed out.
    fn timed_out(&self, until: Instant) -> Error {
        if until >= self.deadline {
            Error::app(format!(
                "the app did not finish within the turn's deadline of {} ms",
                self.limits.deadline_ms
            ))
        } else {
            Error::app(format!(
                "the app was silent for longer than the read timeout of {} ms",
                self.limits.read_timeout_ms
            ))
        }
    }

    /// Sends `request` and waits, within the read timeout, for a successful answer. (Takes
    /// no `&self`: the stream it would hold across the wait is not `Sync`.)
    async fn answered(
        request: reqwest::RequestBuilder,
        until: Instant,
        timed_out: Error,
        base: &str,
    ) -> Result<reqwest::Response> {
        let response = tokio::time::timeout_at(until, request.send())
            .await
            .map_err(|_| timed_out)?
            .map_err(|e| {
                Error::app(format!(
                    "cannot reach the app at {base}: {}",
                    error_chain(&e)
                ))
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = tokio::time::timeout(Duration::from_secs(2), response.bytes())
            .await
            .ok()
            .and_then(|b| b.ok())
            .unwrap_or_default();
        let shown: String = String::from_utf8_lossy(&body).chars().take(300).collect();
        Err(Error::app(format!("the app answered {status}: {shown}")))
    }

    async fn post_message(&mut self, message: &ToApp, until: Instant) -> Result<()> {
        let path = format!("/v1/turns/{}/messages", self.id);
        let request = self.post(&path).json(message);
        let (timed_out, base) = (self.timed_out(until), self.base.clone());
        Self::answered(request, until, timed_out, &base).await?;
        Ok(())
    }

    fn too_long(&self) -> Error {
        Error::app(format!(
            "the app sent an action longer than {} bytes",
            self.limits.max_line_bytes
        ))
    }

    /// The next complete line of the stream, or `None` at its end. Each byte is scanned for
    /// a newline once, and taking a line moves nothing: a stream of tiny chunks or empty lines
    /// costs time in proportion to its length, which `max_bytes` bounds.
    async fn line(&mut self) -> Result<Option<Vec<u8>>> {
        loop {
            if Instant::now() >= self.deadline {
                return Err(self.timed_out(self.deadline));
            }
            if let Some(at) = self.buf[self.scanned..].iter().position(|b| *b == b'\n') {
                let end = self.scanned + at;
                self.scanned = 0;
                if end as u64 > self.limits.max_line_bytes {
                    return Err(self.too_long());
                }
                let mut line = self.buf.split_to(end + 1);
                line.truncate(end);
                if line.last() == Some(&b'\r') {
                    line.truncate(end - 1);
                }
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(Some(line.to_vec()));
            }
            self.scanned = self.buf.len();
            if self.buf.len() as u64 > self.limits.max_line_bytes {
                return Err(self.too_long());
            }
            let until = self.silence_until();
            let Some(stream) = self.stream.as_mut() else {
                return Ok(None);
            };
            let chunk = tokio::time::timeout_at(until, stream.next())
                .await
                .map_err(|_| self.timed_out(until))?;
            match chunk {
                None => {
                    self.stream = None;
                    if self.buf.iter().all(u8::is_ascii_whitespace) {
                        return Ok(None);
                    }
                    // A last line without its newline.
                    self.buf.extend_from_slice(b"\n");
                }
                Some(Err(e)) => {
                    return Err(Error::app(format!(
                        "the app's stream broke: {}",
                        error_chain(&e)
                    )))
                }
                Some(Ok(bytes)) => {
                    self.read += bytes.len() as u64;
                    if self.read > self.limits.max_bytes {
                        return Err(Error::app(format!(
                            "the app sent more than {} bytes in one turn",
                            self.limits.max_bytes
                        )));
                    }
                    self.buf.extend_from_slice(&bytes);
                }
            }
        }
    }
}

/// Everything waiting on the lane, committed (one read takes a page of the lane).
async fn drain(inbox: &mut dyn Inbox) -> Result<Vec<Block>> {
    let mut arrived = Vec::new();
    loop {
        let page = inbox.arrivals().await?;
        if page.is_empty() {
            return Ok(arrived);
        }
        arrived.extend(page);
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[async_trait]
impl Exchange for HttpExchange {
    async fn start(&mut self, context: &Value) -> Result<()> {
        let request = self.post("/v1/turns").json(context);
        let (until, timed_out, base) = {
            let until = self.silence_until();
            (until, self.timed_out(until), self.base.clone())
        };
        let response = Self::answered(request, until, timed_out, &base).await?;
        self.stream = Some(Box::pin(response.bytes_stream()));
        Ok(())
    }

    async fn next(&mut self, inbox: &mut dyn Inbox, _cx: &mut CallContext) -> Result<Step> {
        // Arrivals are not watched here: they wait on the lane until the app takes them, so a
        // `done` the app sent always ends the turn it belongs to.
        tokio::select! {
            biased;
            _ = inbox.stop_requested() => Ok(Step::Stopped(inbox.arrivals().await?)),
            line = self.line() => Ok(match line? {
                Some(line) => Step::Line(line),
                None => Step::Closed,
            }),
        }
    }

    async fn take(
        &mut self,
        inbox: &mut dyn Inbox,
        cx: &mut CallContext,
        wait: Duration,
    ) -> Result<Step> {
        let until = (Instant::now() + wait).min(self.deadline);
        loop {
            let arrived = drain(inbox).await?;
            if !arrived.is_empty() || Instant::now() >= until {
                return Ok(Step::Arrived(arrived));
            }
            tokio::select! {
                biased;
                _ = inbox.stop_requested() => return Ok(Step::Stopped(inbox.arrivals().await?)),
                _ = cx.next_arrival() => {}
                _ = tokio::time::sleep_until(until) => {}
                // The app spoke while its take waited (it gave the wait up, or acts from another
                // task): the take ends with nothing and the line is read next.
                line = self.line() => return Ok(match line? {
                    Some(line) => Step::Line(line),
                    None => Step::Closed,
                }),
            }
        }
    }

    async fn stop_signal(&mut self, inbox: &mut dyn Inbox) {
        inbox.stop_requested().await
    }

    async fn stop_blocks(&mut self, inbox: &mut dyn Inbox) -> Result<Vec<Block>> {
        inbox.arrivals().await
    }

    async fn send(&mut self, message: &ToApp) -> Result<()> {
        let until = self.silence_until();
        self.post_message(message, until).await
    }

    async fn send_final(&mut self, message: &ToApp) -> Result<()> {
        let until = self.silence_until().min(Instant::now() + FINAL_SEND);
        self.post_message(message, until).await
    }
}
