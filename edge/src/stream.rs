//! A conversation's live stream, over a WebSocket or (as a fallback) server-sent events.
//!
//! # Frame protocol
//! Every frame is one JSON object with a `type` ([`Frame`]):
//! - `{"type":"ready","through":N}` — first frame: the record holds rows up to `seq` N.
//! - `{"type":"rows","through":N}` — the record now holds rows up to N. Fetch what you lack
//!   with `GET /v1/conversations/{id}/messages?after=<your cursor>`.
//! - `{"type":"delta","turn":"turn_3","text":"…"}` — streamed model text of a running turn.
//!
//! Rows are only ever read from the record; frames are advisory. A client keeps one cursor
//! (the highest `seq` it has read). On (re)connecting it reads `messages?after=<cursor>`, then
//! follows `rows` frames: it misses nothing and reads nothing twice, however often the
//! connection drops, and a turn runs on whether or not anyone is connected. Deltas sent while a
//! client was away are not replayed: the turn's `assistant_message` row carries the whole text.
//! A `rows` frame is also sent when the record grows without a live message (checked every two
//! seconds), so a lost advisory message delays a client, never strands it.
//! - `{"type":"closed","reason":"…"}` — last frame: access was taken away (a revoked grant);
//!   checked on every tick, so a revoked grantee stops receiving within two seconds.
//!
//! On a WebSocket the server sends text frames and pings; whatever the client sends is ignored.
//! With SSE (`GET …/events`), each frame is one `data:` line; the event name is the frame type.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::BoxStream;
use futures::{SinkExt as _, Stream, StreamExt as _};
use turnpike_artifactory::Record;
use turnpike_schemas::live::LiveFrame;

use super::error::{ApiError, ApiResult, ErrorBody};
use super::model::Frame;
use crate::extract::Caller;
use crate::state::Edge;

/// How often the record is checked for rows no live message announced.
const POLL: Duration = Duration::from_secs(2);

/// The frames of one conversation from now on: `ready`, then `rows` and `delta` as they come,
/// for as long as `caller` may see the conversation (checked again on every tick).
async fn frames(
    edge: &Edge,
    record: Record,
    caller: &crate::auth::Principal,
) -> ApiResult<BoxStream<'static, Frame>> {
    let conversation = record.prefix().conversation();
    // Subscribe before reading the head, so nothing committed in between goes unannounced.
    let live = edge
        .inner
        .bus
        .subscribe_live(conversation)
        .await
        .map_err(ApiError::from)?;
    let head = record.head().await?;
    let ready = Frame::Ready {
        through: head.leaves(),
    };
    enum Input {
        Live(Option<bytes::Bytes>),
        Poll,
    }
    let told = head.leaves();
    let access = Access {
        directory: edge.inner.conversations.directory().clone(),
        tenant: caller.tenant.clone(),
        identity: caller.identity.clone(),
        closed: false,
    };
    let state = (
        live,
        head,
        told,
        record,
        tokio::time::interval(POLL),
        access,
    );
    let rest = futures::stream::unfold(
        state,
        |(mut live, mut head, mut told, record, mut poll, mut access)| async move {
            if access.closed {
                return None;
            }
            loop {
                let input = tokio::select! {
                    m = live.next() => Input::Live(m),
                    _ = poll.tick() => Input::Poll,
                };
                let frame = match input {
                    Input::Live(None) => return None,
                    Input::Live(Some(bytes)) => match serde_json::from_slice::<LiveFrame>(&bytes) {
                        Ok(LiveFrame::Delta { turn, text }) => Some(Frame::Delta {
                            turn: turn.to_string(),
                            text,
                        }),
                        Ok(LiveFrame::Rows { through }) if through > told => {
                            told = through;
                            Some(Frame::Rows { through })
                        }
                        Ok(LiveFrame::Revoked { identity }) if identity == access.identity => {
                            access.closed = true;
                            Some(Frame::Closed {
                                reason: "access to this conversation was revoked".into(),
                            })
                        }
                        _ => None,
                    },
                    Input::Poll if !access.still_visible(&record).await => {
                        access.closed = true;
                        Some(Frame::Closed {
                            reason: "access to this conversation was revoked".into(),
                        })
                    }
                    Input::Poll => match record.head_after(Some(&head)).await {
                        Ok(now) => {
                            let through = now.leaves();
                            head = now;
                            (through > told).then(|| {
                                told = through;
                                Frame::Rows { through }
                            })
                        }
                        Err(_) => None,
                    },
                };
                if let Some(frame) = frame {
                    return Some((frame, (live, head, told, record, poll, access)));
                }
            }
        },
    );
    Ok(futures::stream::once(async move { ready })
        .chain(rest)
        .boxed())
}

/// Who a stream is for, checked again on every tick.
struct Access {
    directory: turnpike_artifactory::Directory,
    tenant: turnpike_schemas::TenantId,
    identity: turnpike_schemas::Identity,
    closed: bool,
}

impl Access {
    /// False once the caller may no longer see the conversation; a store that cannot answer
    /// right now does not end the stream.
    async fn still_visible(&self, record: &Record) -> bool {
        let conversation = record.prefix().conversation();
        match self
            .directory
            .lookup(conversation, &self.tenant, &self.identity)
            .await
        {
            Ok(_) => true,
            Err(e) => e.kind() != turnpike_artifactory::ErrorKind::NotFound,
        }
    }
}

/// The conversation's stream over a WebSocket (see the module docs for the frames).
#[utoipa::path(get, path = "/v1/conversations/{id}/stream", tag = "streaming",
    params(("id" = String, Path, description = "conv_<ulid>")),
    responses((status = 101, description = "switching to the WebSocket protocol; frames are `Frame` objects"),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn websocket(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let entry = edge.visible(&caller, &id).await?;
    refuse_while_draining(&edge)?;
    let upgrade = upgrade.map_err(|e| {
        ApiError::malformed(format!(
            "{} (connect with a WebSocket client, or use …/events for server-sent events)",
            e.body_text()
        ))
    })?;
    let frames = frames(&edge, edge.record(&entry), &caller).await?;
    let draining = edge.inner.draining.subscribe();
    let grace = edge.inner.limits.drain_grace;
    let open = OpenStream::new(&edge);
    Ok(upgrade.on_upgrade(move |socket| pump(socket, frames, draining, grace, open)))
}

/// A new stream while the router shuts down: 503, try again (another router answers).
fn refuse_while_draining(edge: &Edge) -> ApiResult<()> {
    if *edge.inner.draining.borrow() {
        let mut refused =
            ApiError::unavailable("this router is shutting down: connect again to another one");
        refused.retry_after = Some(1);
        return Err(refused);
    }
    Ok(())
}

async fn pump(
    socket: WebSocket,
    mut frames: BoxStream<'static, Frame>,
    mut draining: tokio::sync::watch::Receiver<bool>,
    grace: Duration,
    _open: OpenStream,
) {
    let (mut tx, mut rx) = socket.split();
    let mut ping = tokio::time::interval(Duration::from_secs(20));
    ping.tick().await;
    // Resolves `grace` after the router starts shutting down (never, if it does not).
    let going_away = async move {
        if draining.wait_for(|d| *d).await.is_err() {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(grace).await;
    };
    tokio::pin!(going_away);
    loop {
        tokio::select! {
            _ = &mut going_away => {
                let close = axum::extract::ws::CloseFrame {
                    code: axum::extract::ws::close_code::AWAY,
                    reason: "the router is shutting down: reconnect and resume from your cursor".into(),
                };
                let _ = tokio::time::timeout(Duration::from_secs(1), tx.send(Message::Close(Some(close)))).await;
                break;
            }
            frame = frames.next() => {
                let Some(frame) = frame else { break };
                let text = serde_json::to_string(&frame).expect("frames serialise");
                if tx.send(Message::Text(text.into())).await.is_err() {
                    break;
                }
                if let Frame::Closed { reason } = frame {
                    let close = axum::extract::ws::CloseFrame {
                        code: 4403,
                        reason: reason.into(),
                    };
                    let _ = tx.send(Message::Close(Some(close))).await;
                    break;
                }
            }
            incoming = rx.next() => match incoming {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => break,
                Some(Ok(_)) => {}
            },
            _ = ping.tick() => {
                if tx.send(Message::Ping(Default::default())).await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = tx.close().await;
}

/// The conversation's stream as server-sent events (the fallback where WebSockets cannot go).
#[utoipa::path(get, path = "/v1/conversations/{id}/events", tag = "streaming",
    params(("id" = String, Path, description = "conv_<ulid>")),
    responses((status = 200, description = "an event stream of `Frame` objects", content_type = "text/event-stream", body = Frame),
              (status = 404, body = ErrorBody)))]
pub async fn sse(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let entry = edge.visible(&caller, &id).await?;
    refuse_while_draining(&edge)?;
    let frames = frames(&edge, edge.record(&entry), &caller).await?;
    let events = frames.map(|frame| -> Result<SseEvent, Infallible> {
        let name = match &frame {
            Frame::Ready { .. } => "ready",
            Frame::Rows { .. } => "rows",
            Frame::Delta { .. } => "delta",
            Frame::Closed { .. } => "closed",
        };
        Ok(SseEvent::default()
            .event(name)
            .data(serde_json::to_string(&frame).expect("frames serialise")))
    });
    Ok(sse_response(events))
}

fn sse_response(
    events: impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static,
) -> Response {
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// Counts an open WebSocket stream for as long as it lives (the gauge, and the edge's count a
/// drain waits on).
struct OpenStream(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl OpenStream {
    fn new(edge: &Edge) -> Self {
        metrics::gauge!("turnpike_websocket_connections").increment(1.0);
        let count = edge.inner.streams.clone();
        count.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        OpenStream(count)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        metrics::gauge!("turnpike_websocket_connections").decrement(1.0);
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}
