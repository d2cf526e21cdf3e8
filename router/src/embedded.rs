//! The embedded backend: the bus's semantics in one process, durable on local disk.
//!
//! Lanes and idempotency keys live in a `redb` database (an accepted event survives a restart).
//! Wakes and leases live in memory: at open, one wake per lane is queued again, and the record
//! decides what is already done; leases need no durability when every holder is in this process.
//!
//! One task does not own this state: callers share it through `Arc<EmbeddedBus>`. The wake
//! queue is a `std::sync::Mutex` around plain data, never held across an await.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use redb::{
    Database, ReadableDatabase as _, ReadableTable as _, ReadableTableMetadata as _,
    TableDefinition,
};
use tokio::sync::Notify;
use tokio::time::Instant;
use turnpike_schemas::{ConversationId, Event, TenantId, WorkerId};

use crate::bus::{
    decode_lane_message, dedupe_id, may_claim, now_ms, republished_envelope, Bus, LaneMessage,
    Lease, LeaseValue, Published, Wake, WakeAck,
};
use crate::error::{Error, ErrorKind, Result};
use crate::heartbeat::Heartbeat;
use crate::usage::{Day, UsageScope, UsageTotals};

/// (conversation, seq) → event JSON.
const LANES: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("lanes");
/// conversation → (tenant, last seq).
const HEADS: TableDefinition<&str, (&str, u64)> = TableDefinition::new("lane_heads");
/// usage counter key → totals JSON (the usage ledger).
const USAGE: TableDefinition<&str, &[u8]> = TableDefinition::new("usage");
/// dedupe id → (seq, accepted at ms).
const DEDUPE: TableDefinition<&str, (u64, u64)> = TableDefinition::new("dedupe");
/// (accepted at ms, dedupe id): the dedupe ids in the order they expire, so that each commit
/// drops a few that left the duplicate window (as JetStream forgets message ids).
const DEDUPE_AT: TableDefinition<(u64, &str), ()> = TableDefinition::new("dedupe_at");

/// The page cache of the bus database. redb's default (1 GiB) keeps every page written in
/// memory until it is full: memory that grew with every event. Pages past this are read from
/// the file (the kernel's page cache, which it can reclaim).
pub const CACHE_BYTES: usize = 32 << 20;

/// The most expired dedupe ids one group commit drops: more than one commit adds, so the
/// table shrinks back to the window's worth whatever the rate.
const DEDUPE_PRUNE_PER_COMMIT: usize = 2 * MAX_GROUP;

/// Settings of the embedded bus.
#[derive(Debug, Clone)]
pub struct EmbeddedConfig {
    pub ack_wait: Duration,
    pub duplicate_window: Duration,
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        Self {
            ack_wait: Duration::from_secs(30),
            duplicate_window: Duration::from_secs(120),
        }
    }
}

#[derive(Debug, Clone)]
struct Pending {
    conversation: ConversationId,
    tenant: TenantId,
    seq: u64,
    deliveries: u64,
    /// When it was put on the lane (ms since the epoch; a reopened bus's queued wakes: then).
    published_ms: u64,
}

#[derive(Default)]
struct Queue {
    ready: VecDeque<Pending>,
    /// Put-off wakes by when they are due (and the order they were put off in).
    delayed: std::collections::BTreeMap<(Instant, u64), Pending>,
    inflight: HashMap<u64, (Instant, Pending)>,
    next_id: u64,
}

impl Queue {
    /// Moves ripe delayed and expired in-flight wakes back to ready, ahead of wakes never
    /// delivered and in the order they fell due (as JetStream redelivers); returns the next
    /// deadline.
    fn ripen(&mut self, now: Instant) -> Option<Instant> {
        let mut ripe: Vec<Pending> = Vec::new();
        while let Some(entry) = self.delayed.first_entry() {
            if entry.key().0 > now {
                break;
            }
            ripe.push(entry.remove());
        }
        let mut expired: Vec<(Instant, u64)> = self
            .inflight
            .iter()
            .filter(|(_, (deadline, _))| *deadline <= now)
            .map(|(id, (deadline, _))| (*deadline, *id))
            .collect();
        expired.sort();
        for (_, id) in expired {
            if let Some((_, p)) = self.inflight.remove(&id) {
                ripe.push(p);
            }
        }
        for p in ripe.into_iter().rev() {
            self.ready.push_front(p);
        }
        self.delayed
            .keys()
            .next()
            .map(|(t, _)| *t)
            .into_iter()
            .chain(self.inflight.values().map(|(t, _)| *t))
            .min()
    }
}

struct Wakes {
    queue: Mutex<Queue>,
    notify: Notify,
    ack_wait: Duration,
    /// The trace context each lane message was published with (advisory, in memory only:
    /// bounded, and a restart starts new traces).
    traces: Mutex<HashMap<(ConversationId, u64), String>>,
}

/// The most trace contexts remembered; past it the memory starts over.
const MAX_TRACES: usize = 10_000;

/// The bus in one process, durable on local disk.
pub struct EmbeddedBus {
    db: Arc<Database>,
    wakes: Arc<Wakes>,
    leases: Mutex<HashMap<ConversationId, (LeaseValue, u64)>>,
    lease_revisions: std::sync::atomic::AtomicU64,
    config: EmbeddedConfig,
    /// Publishes and usage additions go to one writer thread, which commits whatever is
    /// waiting in one transaction (group commit): one disk sync for many of them, and no sync
    /// on the async runtime.
    writer: Option<std::sync::mpsc::Sender<WriteRequest>>,
    /// The writer thread, joined on drop so the database is closed when the bus is gone.
    writer_thread: Option<std::thread::JoinHandle<()>>,
    /// Advisory live messages, one channel per conversation someone listens to.
    live: Fanout<bytes::Bytes>,
    /// A signal per lane someone watches, sent after each write to it commits.
    lane_signals: Fanout<()>,
    /// Heartbeats of the workers in this process, to whoever listens.
    heartbeats: tokio::sync::broadcast::Sender<Heartbeat>,
}

/// Per-conversation broadcast channels, made when someone subscribes and dropped when its last
/// subscriber goes (or a send finds nobody listening): the channels follow the conversations
/// watched now, not every conversation ever watched.
struct Fanout<T> {
    channels: Arc<Channels<T>>,
    capacity: usize,
}

type Channels<T> = Mutex<HashMap<ConversationId, tokio::sync::broadcast::Sender<T>>>;

/// One subscriber's receiver: dropping it drops the conversation's channel when no other
/// subscriber holds it.
struct Watch<T> {
    rx: Option<tokio::sync::broadcast::Receiver<T>>,
    channels: Arc<Channels<T>>,
    conversation: ConversationId,
}

impl<T> Drop for Watch<T> {
    fn drop(&mut self) {
        drop(self.rx.take());
        let mut channels = self.channels.lock().expect("fanout lock");
        if channels
            .get(&self.conversation)
            .is_some_and(|tx| tx.receiver_count() == 0)
        {
            channels.remove(&self.conversation);
        }
    }
}

impl<T: Clone + Send + 'static> Fanout<T> {
    fn new(capacity: usize) -> Self {
        Self {
            channels: Arc::new(Mutex::new(HashMap::new())),
            capacity,
        }
    }

    /// How many conversations have a channel now.
    #[cfg(test)]
    fn watched(&self) -> usize {
        self.channels.lock().expect("fanout lock").len()
    }

    fn send(&self, conversation: ConversationId, item: T) {
        let mut channels = self.channels.lock().expect("fanout lock");
        if let Some(tx) = channels.get(&conversation) {
            if tx.send(item).is_err() {
                channels.remove(&conversation);
            }
        }
    }

    /// What is sent to `conversation` from now on; missed items (a slow reader) are skipped,
    /// or reported as one item when `lagged` says what stands for them.
    fn subscribe(
        &self,
        conversation: ConversationId,
        lagged: Option<T>,
    ) -> futures::stream::BoxStream<'static, T> {
        use futures::StreamExt as _;
        use tokio::sync::broadcast::error::RecvError;
        let rx = self
            .channels
            .lock()
            .expect("fanout lock")
            .entry(conversation)
            .or_insert_with(|| tokio::sync::broadcast::channel(self.capacity).0)
            .subscribe();
        let watch = Watch {
            rx: Some(rx),
            channels: self.channels.clone(),
            conversation,
        };
        futures::stream::unfold((watch, lagged), |(mut watch, lagged)| async move {
            let rx = watch.rx.as_mut()?;
            loop {
                match rx.recv().await {
                    Ok(item) => return Some((item, (watch, lagged))),
                    Err(RecvError::Lagged(_)) => {
                        if let Some(item) = lagged.clone() {
                            return Some((item, (watch, lagged)));
                        }
                    }
                    Err(RecvError::Closed) => return None,
                }
            }
        })
        .boxed()
    }
}

/// One event waiting to be committed by the writer thread.
struct PublishRequest {
    conversation: ConversationId,
    tenant: TenantId,
    dedupe: String,
    payload: Vec<u8>,
    traceparent: Option<String>,
    now_ms: u64,
    window_ms: u64,
    reply: tokio::sync::oneshot::Sender<Result<Published>>,
}

/// An addition to a usage counter waiting to be committed by the writer thread.
struct UsageRequest {
    key: String,
    delta: UsageTotals,
    reply: tokio::sync::oneshot::Sender<Result<()>>,
}

/// What the writer thread commits: lanes' events and the usage ledger's additions, in groups.
/// A turn adds to two counters; as transactions of their own those were two more syncs per
/// turn, each holding redb's one write lock while events waited to be accepted.
enum WriteRequest {
    Publish(PublishRequest),
    Usage(UsageRequest),
}

/// What became of one request in a committed group.
enum Written {
    Published(Published),
    /// An addition, or why it was refused (its counter unreadable: that fails only the
    /// addition, never the events and additions committed with it).
    Added(Result<()>),
}

/// The most events one group commit takes.
const MAX_GROUP: usize = 512;

/// The writer thread: commits waiting requests in groups until the bus is dropped.
fn write_loop(
    db: Arc<Database>,
    wakes: Arc<Wakes>,
    requests: std::sync::mpsc::Receiver<WriteRequest>,
) {
    while let Ok(first) = requests.recv() {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match requests.try_recv() {
                Ok(r) => group.push(r),
                Err(_) => break,
            }
        }
        match commit_group(&db, &group) {
            Ok(outcomes) => {
                for (request, written) in group.into_iter().zip(outcomes) {
                    match (request, written) {
                        (WriteRequest::Publish(request), Written::Published(published)) => {
                            published_one(&wakes, request, published);
                        }
                        (WriteRequest::Usage(request), Written::Added(added)) => {
                            let _ = request.reply.send(added);
                        }
                        (WriteRequest::Publish(request), Written::Added(_)) => {
                            let _ = request
                                .reply
                                .send(Err(storage("publishing", "no outcome for the event")));
                        }
                        (WriteRequest::Usage(request), Written::Published(_)) => {
                            let _ = request
                                .reply
                                .send(Err(storage("adding usage", "no outcome for the addition")));
                        }
                    }
                }
            }
            Err(e) => {
                for request in group {
                    let e = Error::new(e.kind(), e.to_string());
                    match request {
                        WriteRequest::Publish(r) => {
                            let _ = r.reply.send(Err(e));
                        }
                        WriteRequest::Usage(r) => {
                            let _ = r.reply.send(Err(e));
                        }
                    }
                }
            }
        }
    }
}

/// Queues the wake of an event just committed (not of a duplicate) and answers its publisher.
fn published_one(wakes: &Wakes, request: PublishRequest, published: Published) {
    if let (false, Some(tp)) = (published.duplicate, &request.traceparent) {
        let mut traces = wakes.traces.lock().expect("trace memory lock");
        if traces.len() >= MAX_TRACES {
            traces.clear();
        }
        traces.insert((request.conversation, published.seq), tp.clone());
    }
    if !published.duplicate {
        push_wake(
            wakes,
            Pending {
                conversation: request.conversation,
                tenant: request.tenant.clone(),
                seq: published.seq,
                deliveries: 0,
                published_ms: crate::clock::now_ms(),
            },
        );
    }
    let _ = request.reply.send(Ok(published));
}

/// Applies a group of requests in one transaction, in order; nothing is stored if the commit
/// fails.
fn commit_group(db: &Database, group: &[WriteRequest]) -> Result<Vec<Written>> {
    let txn = db.begin_write().map_err(|e| storage("publishing", e))?;
    let mut out = Vec::with_capacity(group.len());
    {
        let mut seen = txn
            .open_table(DEDUPE)
            .map_err(|e| storage("publishing", e))?;
        let mut heads = txn
            .open_table(HEADS)
            .map_err(|e| storage("publishing", e))?;
        let mut lanes = txn
            .open_table(LANES)
            .map_err(|e| storage("publishing", e))?;
        let mut expiring = txn
            .open_table(DEDUPE_AT)
            .map_err(|e| storage("publishing", e))?;
        let mut usage = txn
            .open_table(USAGE)
            .map_err(|e| storage("adding usage", e))?;
        let mut oldest: Option<&PublishRequest> = None;
        for request in group {
            let r = match request {
                WriteRequest::Publish(r) => r,
                WriteRequest::Usage(u) => {
                    out.push(Written::Added(add_to_counter(&mut usage, &u.key, u.delta)?));
                    continue;
                }
            };
            oldest.get_or_insert(r);
            let conv = r.conversation.to_string();
            let earlier = seen
                .get(r.dedupe.as_str())
                .map_err(|e| storage("publishing", e))?
                .map(|v| v.value());
            let published = match earlier {
                Some((seq, at)) if r.now_ms.saturating_sub(at) < r.window_ms => Published {
                    seq,
                    duplicate: true,
                },
                _ => {
                    let last = heads
                        .get(conv.as_str())
                        .map_err(|e| storage("publishing", e))?
                        .map(|v| v.value().1)
                        .unwrap_or(0);
                    let seq = last + 1;
                    lanes
                        .insert((conv.as_str(), seq), r.payload.as_slice())
                        .map_err(|e| storage("publishing", e))?;
                    heads
                        .insert(conv.as_str(), (r.tenant.as_str(), seq))
                        .map_err(|e| storage("publishing", e))?;
                    seen.insert(r.dedupe.as_str(), (seq, r.now_ms))
                        .map_err(|e| storage("publishing", e))?;
                    expiring
                        .insert((r.now_ms, r.dedupe.as_str()), ())
                        .map_err(|e| storage("publishing", e))?;
                    Published {
                        seq,
                        duplicate: false,
                    }
                }
            };
            out.push(Written::Published(published));
        }
        if let Some(first) = oldest {
            let horizon = first.now_ms.saturating_sub(first.window_ms);
            forget_expired(&mut seen, &mut expiring, horizon, DEDUPE_PRUNE_PER_COMMIT)
                .map_err(|e| storage("publishing", e))?;
        }
    }
    txn.commit().map_err(|e| storage("publishing", e))?;
    Ok(out)
}

/// Adds `delta` to the usage counter `key` within a write transaction. The outer error is the
/// database's (it fails the group); the inner one refuses this addition alone (a counter that
/// does not parse: nothing is written, the transaction goes on).
fn add_to_counter(
    table: &mut redb::Table<&str, &[u8]>,
    key: &str,
    delta: UsageTotals,
) -> Result<Result<()>> {
    let current: UsageTotals = match table.get(key).map_err(|e| storage("adding usage", e))? {
        Some(v) => match serde_json::from_slice(v.value()) {
            Ok(totals) => totals,
            Err(e) => {
                return Ok(Err(Error::with_source(
                    ErrorKind::Corrupt,
                    format!("the usage counter {key} is unreadable"),
                    e,
                )))
            }
        },
        None => UsageTotals::default(),
    };
    let bytes = serde_json::to_vec(&current.plus(delta)).expect("totals serialise");
    table
        .insert(key, bytes.as_slice())
        .map_err(|e| storage("adding usage", e))?;
    Ok(Ok(()))
}

/// Drops up to `limit` dedupe ids accepted before `horizon` (ms). An id accepted again since
/// (its entry newer) keeps its entry.
fn forget_expired(
    seen: &mut redb::Table<&str, (u64, u64)>,
    expiring: &mut redb::Table<(u64, &str), ()>,
    horizon: u64,
    limit: usize,
) -> std::result::Result<usize, redb::Error> {
    let mut expired: Vec<(u64, String)> = Vec::new();
    for item in expiring.range((0, "")..(horizon, ""))?.take(limit) {
        let (key, _) = item?;
        let (at, id) = key.value();
        expired.push((at, id.to_owned()));
    }
    for (at, id) in &expired {
        expiring.remove((*at, id.as_str()))?;
        let current = seen.get(id.as_str())?.map(|v| v.value().1);
        if current == Some(*at) {
            seen.remove(id.as_str())?;
        }
    }
    Ok(expired.len())
}

fn push_wake(wakes: &Wakes, pending: Pending) {
    wakes
        .queue
        .lock()
        .expect("wake queue lock")
        .ready
        .push_back(pending);
    wakes.notify.notify_one();
}

fn storage(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Unavailable, format!("embedded bus, {what}: {e}"))
}

impl EmbeddedBus {
    /// Hands a request to the writer thread.
    fn send(&self, request: WriteRequest) -> Result<()> {
        self.writer
            .as_ref()
            .ok_or_else(|| storage("writing", "the bus is closing"))?
            .send(request)
            .map_err(|_| storage("writing", "the writer thread is gone"))
    }

    /// Hands one message to the writer thread and waits until it is durable.
    async fn write(
        &self,
        conversation: ConversationId,
        tenant: TenantId,
        dedupe: String,
        payload: Vec<u8>,
        traceparent: Option<String>,
    ) -> Result<Published> {
        let (reply, outcome) = tokio::sync::oneshot::channel();
        self.send(WriteRequest::Publish(PublishRequest {
            conversation,
            tenant,
            dedupe,
            payload,
            traceparent,
            now_ms: now_ms(),
            window_ms: self.config.duplicate_window.as_millis() as u64,
            reply,
        }))?;
        let published = outcome
            .await
            .map_err(|_| storage("publishing", "the writer thread is gone"))??;
        self.lane_signals.send(conversation, ());
        Ok(published)
    }

    /// Opens (or creates) the bus database at `path` and queues a wake for every lane.
    pub fn open(path: &Path, config: EmbeddedConfig) -> Result<Arc<Self>> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| storage("creating its directory", e))?;
        }
        let db = redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .create(path)
            .map_err(|e| storage(&format!("opening {}", path.display()), e))?;
        let txn = db.begin_write().map_err(|e| storage("starting", e))?;
        {
            txn.open_table(LANES)
                .map_err(|e| storage("creating tables", e))?;
            txn.open_table(HEADS)
                .map_err(|e| storage("creating tables", e))?;
            let mut seen = txn
                .open_table(DEDUPE)
                .map_err(|e| storage("creating tables", e))?;
            let mut expiring = txn
                .open_table(DEDUPE_AT)
                .map_err(|e| storage("creating tables", e))?;
            // Ids from before `DEDUPE_AT` existed (or an empty one): expired ones go, the
            // others are listed to expire.
            if expiring.is_empty().map_err(|e| storage("opening", e))? {
                let horizon = now_ms().saturating_sub(config.duplicate_window.as_millis() as u64);
                seen.retain(|_, (_, at)| at >= horizon)
                    .map_err(|e| storage("forgetting expired ids", e))?;
                let mut kept: Vec<(u64, String)> = Vec::new();
                for item in seen.iter().map_err(|e| storage("opening", e))? {
                    let (id, value) = item.map_err(|e| storage("opening", e))?;
                    kept.push((value.value().1, id.value().to_owned()));
                }
                for (at, id) in &kept {
                    expiring
                        .insert((*at, id.as_str()), ())
                        .map_err(|e| storage("opening", e))?;
                }
            }
        }
        txn.commit().map_err(|e| storage("creating tables", e))?;
        let db = Arc::new(db);
        let wakes = Arc::new(Wakes {
            traces: Mutex::new(HashMap::new()),
            queue: Mutex::new(Queue::default()),
            notify: Notify::new(),
            ack_wait: config.ack_wait,
        });
        let (writer, requests) = std::sync::mpsc::channel();
        let writer_thread = {
            let (db, wakes) = (db.clone(), wakes.clone());
            std::thread::Builder::new()
                .name("embedded-bus-writer".into())
                .spawn(move || write_loop(db, wakes, requests))
                .map_err(|e| storage("starting its writer", e))?
        };
        let bus = Arc::new(Self {
            db,
            wakes,
            leases: Mutex::new(HashMap::new()),
            lease_revisions: std::sync::atomic::AtomicU64::new(0),
            config,
            writer: Some(writer),
            writer_thread: Some(writer_thread),
            live: Fanout::new(1024),
            heartbeats: tokio::sync::broadcast::channel(256).0,
            lane_signals: Fanout::new(16),
        });
        bus.requeue_all()?;
        Ok(bus)
    }

    /// Queues one wake per lane, at its last sequence: the record decides what is done.
    fn requeue_all(&self) -> Result<()> {
        let txn = self.db.begin_read().map_err(|e| storage("reading", e))?;
        let heads = txn.open_table(HEADS).map_err(|e| storage("reading", e))?;
        let mut queue = self.wakes.queue.lock().expect("wake queue lock");
        for row in heads.iter().map_err(|e| storage("reading", e))? {
            let (conv, value) = row.map_err(|e| storage("reading", e))?;
            let (tenant, seq) = value.value();
            let (Ok(conversation), Ok(tenant)) = (conv.value().parse(), tenant.parse()) else {
                continue;
            };
            queue.ready.push_back(Pending {
                conversation,
                tenant,
                seq,
                deliveries: 0,
                published_ms: crate::clock::now_ms(),
            });
        }
        drop(queue);
        self.wakes.notify.notify_waiters();
        Ok(())
    }
}

impl Drop for EmbeddedBus {
    fn drop(&mut self) {
        // Closing the channel ends the writer after what it holds is committed.
        self.writer.take();
        if let Some(thread) = self.writer_thread.take() {
            let _ = thread.join();
        }
    }
}

struct EmbeddedAck {
    wakes: Arc<Wakes>,
    id: u64,
}

#[async_trait]
impl WakeAck for EmbeddedAck {
    async fn ack(&self) -> Result<()> {
        self.wakes
            .queue
            .lock()
            .expect("wake queue lock")
            .inflight
            .remove(&self.id);
        Ok(())
    }

    async fn nak(&self, delay: Duration) -> Result<()> {
        let mut queue = self.wakes.queue.lock().expect("wake queue lock");
        if let Some((_, p)) = queue.inflight.remove(&self.id) {
            let order = queue.next_id;
            queue.next_id += 1;
            queue.delayed.insert((Instant::now() + delay, order), p);
        }
        drop(queue);
        self.wakes.notify.notify_one();
        Ok(())
    }

    async fn progress(&self) -> Result<()> {
        let mut queue = self.wakes.queue.lock().expect("wake queue lock");
        if let Some((deadline, _)) = queue.inflight.get_mut(&self.id) {
            *deadline = Instant::now() + self.wakes.ack_wait;
        }
        Ok(())
    }
}

#[async_trait]
impl Bus for EmbeddedBus {
    async fn lane_signals(
        &self,
        conversation: ConversationId,
    ) -> Result<futures::stream::BoxStream<'static, ()>> {
        // A lagged receiver missed signals, which is still a signal.
        Ok(self.lane_signals.subscribe(conversation, Some(())))
    }

    async fn heartbeat(&self, beat: &Heartbeat) {
        // Nobody listening is not an error.
        let _ = self.heartbeats.send(beat.clone());
    }

    async fn watch_heartbeats(&self) -> Result<futures::stream::BoxStream<'static, Heartbeat>> {
        use futures::StreamExt as _;
        use tokio::sync::broadcast::error::RecvError;
        let rx = self.heartbeats.subscribe();
        // Missed beats (a slow reader) are skipped: the next ones say the same.
        Ok(futures::stream::unfold(rx, |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(beat) => return Some((beat, rx)),
                    Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => return None,
                }
            }
        })
        .boxed())
    }

    async fn live(&self, conversation: ConversationId, payload: bytes::Bytes) {
        self.live.send(conversation, payload);
    }

    async fn subscribe_live(
        &self,
        conversation: ConversationId,
    ) -> Result<futures::stream::BoxStream<'static, bytes::Bytes>> {
        // Live messages are advisory: missed ones are skipped.
        Ok(self.live.subscribe(conversation, None))
    }

    async fn publish(&self, event: &Event) -> Result<Published> {
        self.write(
            event.address.conversation,
            event.address.tenant.clone(),
            dedupe_id(event),
            serde_json::to_vec(event).expect("events serialise"),
            event.traceparent.clone(),
        )
        .await
    }

    async fn republish(
        &self,
        conversation: ConversationId,
        bytes: &[u8],
        dedupe: &str,
    ) -> Result<Published> {
        let envelope = republished_envelope(conversation, bytes)?;
        self.write(
            conversation,
            envelope.address.tenant,
            format!("republished:{conversation}:{dedupe}"),
            bytes.to_vec(),
            None,
        )
        .await
    }

    async fn read_lane(
        &self,
        conversation: ConversationId,
        after: u64,
        _until: Option<u64>,
        limit: usize,
    ) -> Result<Vec<LaneMessage>> {
        let conv = conversation.to_string();
        let txn = self
            .db
            .begin_read()
            .map_err(|e| storage("reading a lane", e))?;
        let lanes = txn
            .open_table(LANES)
            .map_err(|e| storage("reading a lane", e))?;
        let mut out = Vec::new();
        let range = lanes
            .range((conv.as_str(), after.saturating_add(1))..=(conv.as_str(), u64::MAX))
            .map_err(|e| storage("reading a lane", e))?;
        for row in range.take(limit) {
            let (key, value) = row.map_err(|e| storage("reading a lane", e))?;
            match decode_lane_message(key.value().1, value.value()) {
                Ok(message) => out.push(message),
                Err(_) if !out.is_empty() => break,
                Err(unreadable) => return Err(Error::unreadable_message(unreadable)),
            }
        }
        let traces = self.wakes.traces.lock().expect("trace memory lock");
        if !traces.is_empty() {
            for m in &mut out {
                m.event.traceparent = traces.get(&(conversation, m.seq)).cloned();
            }
        }
        Ok(out)
    }

    async fn lane_last(&self, conversation: ConversationId) -> Result<u64> {
        let txn = self
            .db
            .begin_read()
            .map_err(|e| storage("reading a lane head", e))?;
        let heads = txn
            .open_table(HEADS)
            .map_err(|e| storage("reading a lane head", e))?;
        Ok(heads
            .get(conversation.to_string().as_str())
            .map_err(|e| storage("reading a lane head", e))?
            .map(|v| v.value().1)
            .unwrap_or(0))
    }

    async fn add_usage(&self, scope: &UsageScope, day: Day, delta: &UsageTotals) -> Result<()> {
        // Through the writer thread: committed in the group of whatever waits with it (one
        // transaction is one writer at a time, so read-add-write is atomic), not on its own.
        let (reply, outcome) = tokio::sync::oneshot::channel();
        self.send(WriteRequest::Usage(UsageRequest {
            key: scope.key(day),
            delta: *delta,
            reply,
        }))?;
        outcome
            .await
            .map_err(|_| storage("adding usage", "the writer thread is gone"))?
    }

    async fn usage(&self, scope: &UsageScope, day: Day) -> Result<UsageTotals> {
        let txn = self
            .db
            .begin_read()
            .map_err(|e| storage("reading usage", e))?;
        let table = match txn.open_table(USAGE) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(UsageTotals::default()),
            Err(e) => return Err(storage("reading usage", e)),
        };
        let key = scope.key(day);
        match table
            .get(key.as_str())
            .map_err(|e| storage("reading usage", e))?
        {
            Some(v) => serde_json::from_slice(v.value()).map_err(|e| {
                Error::with_source(
                    ErrorKind::Corrupt,
                    format!("the usage counter {key} is unreadable"),
                    e,
                )
            }),
            None => Ok(UsageTotals::default()),
        }
    }

    async fn purge_lane(&self, conversation: ConversationId) -> Result<()> {
        let db = self.db.clone();
        let conv = conversation.to_string();
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_write().map_err(|e| storage("purging a lane", e))?;
            {
                let mut lanes = txn
                    .open_table(LANES)
                    .map_err(|e| storage("purging a lane", e))?;
                lanes
                    .retain_in((conv.as_str(), 0)..=(conv.as_str(), u64::MAX), |_, _| false)
                    .map_err(|e| storage("purging a lane", e))?;
            }
            txn.commit().map_err(|e| storage("purging a lane", e))
        })
        .await
        .map_err(|e| storage("purging a lane", e))?
    }

    async fn unsettled(&self) -> Result<Option<u64>> {
        let queue = self.wakes.queue.lock().expect("wake queue lock");
        let n = queue.ready.len() + queue.delayed.len() + queue.inflight.len();
        Ok(Some(n as u64))
    }

    async fn next_wake(&self) -> Result<Wake> {
        loop {
            let notified = self.wakes.notify.notified();
            let deadline = {
                let mut queue = self.wakes.queue.lock().expect("wake queue lock");
                let now = Instant::now();
                let deadline = queue.ripen(now);
                if let Some(mut pending) = queue.ready.pop_front() {
                    pending.deliveries += 1;
                    let id = queue.next_id;
                    queue.next_id += 1;
                    queue
                        .inflight
                        .insert(id, (now + self.wakes.ack_wait, pending.clone()));
                    return Ok(Wake::new(
                        pending.conversation,
                        pending.tenant,
                        pending.seq,
                        pending.deliveries,
                        Box::new(EmbeddedAck {
                            wakes: self.wakes.clone(),
                            id,
                        }),
                    )
                    .published_at(pending.published_ms));
                }
                deadline
            };
            match deadline {
                Some(at) => {
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    async fn claim(
        &self,
        conversation: ConversationId,
        worker: WorkerId,
        ttl: Duration,
    ) -> Result<Option<Lease>> {
        let now = now_ms();
        let mut leases = self.leases.lock().expect("lease lock");
        let current = leases.get(&conversation).map(|(v, _)| v);
        if !may_claim(current, now) {
            return Ok(None);
        }
        let revision = self
            .lease_revisions
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        let value = LeaseValue {
            owner: Some(worker),
            expires_ms: now + ttl.as_millis() as u64,
        };
        let expires_ms = value.expires_ms;
        leases.insert(conversation, (value, revision));
        Ok(Some(Lease {
            conversation,
            owner: worker,
            revision,
            expires_ms,
        }))
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let mut leases = self.leases.lock().expect("lease lock");
        match leases.get_mut(&lease.conversation) {
            Some((value, revision)) if *revision == lease.revision => {
                let new_revision = self
                    .lease_revisions
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                    + 1;
                value.expires_ms = now_ms() + ttl.as_millis() as u64;
                *revision = new_revision;
                Ok(Lease {
                    revision: new_revision,
                    expires_ms: value.expires_ms,
                    ..lease.clone()
                })
            }
            _ => Err(Error::new(
                ErrorKind::LeaseLost,
                format!("the lease of {} was taken over", lease.conversation),
            )),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let mut leases = self.leases.lock().expect("lease lock");
        if matches!(leases.get(&lease.conversation), Some((_, rev)) if *rev == lease.revision) {
            leases.remove(&lease.conversation);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use turnpike_schemas::{Address, ConversationId, Event, EventBody};

    use super::*;

    fn keyed(conversation: ConversationId, key: &str) -> Event {
        let mut event = Event::new(
            Address {
                tenant: "acme".parse().unwrap(),
                app: "support".parse().unwrap(),
                agent: "helper".parse().unwrap(),
                conversation,
                identity: "oidc:acme:u-17".parse().unwrap(),
            },
            EventBody::Message { text: key.into() },
            1,
        );
        event.idempotency_key = Some(key.into());
        event
    }

    fn remembered(bus: &EmbeddedBus) -> (u64, u64) {
        let txn = bus.db.begin_read().unwrap();
        let seen = txn.open_table(DEDUPE).unwrap().len().unwrap();
        let expiring = txn.open_table(DEDUPE_AT).unwrap().len().unwrap();
        (seen, expiring)
    }

    /// Item 7 of the third adversarial look: idempotency keys are forgotten once they leave the
    /// duplicate window (they were kept forever, a few hundred bytes of memory per event), and
    /// a key inside the window still deduplicates — also across a reopening.
    #[tokio::test]
    async fn dedupe_ids_are_forgotten_once_out_of_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bus.redb");
        let window = Duration::from_millis(300);
        let config = EmbeddedConfig {
            duplicate_window: window,
            ..Default::default()
        };
        let bus = EmbeddedBus::open(&path, config.clone()).unwrap();
        let conv = ConversationId::new();
        for i in 0..50 {
            assert!(
                !bus.publish(&keyed(conv, &format!("k{i}")))
                    .await
                    .unwrap()
                    .duplicate
            );
        }
        assert_eq!(remembered(&bus), (50, 50));
        assert!(bus.publish(&keyed(conv, "k7")).await.unwrap().duplicate);
        // Once the window has passed, the next commit forgets them.
        let start = now_ms();
        while now_ms() < start + window.as_millis() as u64 + 10 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!bus.publish(&keyed(conv, "fresh")).await.unwrap().duplicate);
        assert_eq!(remembered(&bus), (1, 1));
        assert!(bus.publish(&keyed(conv, "fresh")).await.unwrap().duplicate);
        // An accepted key older than the window is a new event again.
        assert!(!bus.publish(&keyed(conv, "k7")).await.unwrap().duplicate);
        drop(bus);
        let bus = EmbeddedBus::open(&path, config).unwrap();
        assert!(bus.publish(&keyed(conv, "fresh")).await.unwrap().duplicate);
        assert_eq!(remembered(&bus).0, 2);
    }

    /// Usage additions go through the writer with the events: a group that mixes both commits
    /// each in order (every event its own sequence, every addition counted once), and what
    /// was answered is there after a reopening. Before, each addition was a transaction of
    /// its own, and events waited behind its sync.
    #[tokio::test]
    async fn usage_additions_commit_in_the_events_groups() {
        use crate::usage::{Day, UsageScope, UsageTotals};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bus.redb");
        let bus = EmbeddedBus::open(&path, Default::default()).unwrap();
        let conv = ConversationId::new();
        let scope = UsageScope::Tenant("acme".parse().unwrap());
        let today = Day(20_000);
        let one = UsageTotals {
            turns: 1,
            input_tokens: 10,
            ..Default::default()
        };
        let tasks: Vec<_> = (0..200)
            .map(|i| {
                let (bus, scope) = (bus.clone(), scope.clone());
                tokio::spawn(async move {
                    let published = bus.publish(&keyed(conv, &format!("k{i}"))).await.unwrap();
                    bus.add_usage(&scope, today, &one).await.unwrap();
                    published.seq
                })
            })
            .collect();
        let mut seqs = Vec::new();
        for t in tasks {
            seqs.push(t.await.unwrap());
        }
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=200).collect::<Vec<u64>>());
        let all = (0..200).fold(UsageTotals::default(), |acc, _| acc.plus(one));
        assert_eq!(bus.usage(&scope, today).await.unwrap(), all);
        drop(bus);
        let bus = EmbeddedBus::open(&path, Default::default()).unwrap();
        assert_eq!(bus.usage(&scope, today).await.unwrap(), all);
        assert_eq!(bus.lane_last(conv).await.unwrap(), 200);
    }

    /// A counter that does not parse refuses its own additions and nothing else: the events and
    /// other additions committed in the same groups are accepted.
    #[tokio::test]
    async fn an_unreadable_counter_fails_only_its_own_additions() {
        use crate::usage::{Day, UsageScope, UsageTotals};
        let dir = tempfile::tempdir().unwrap();
        let bus = EmbeddedBus::open(&dir.path().join("bus.redb"), Default::default()).unwrap();
        let today = Day(20_000);
        let broken = UsageScope::Tenant("acme".parse().unwrap());
        let fine = UsageScope::Tenant("globex".parse().unwrap());
        {
            let txn = bus.db.begin_write().unwrap();
            txn.open_table(USAGE)
                .unwrap()
                .insert(broken.key(today).as_str(), b"not json".as_slice())
                .unwrap();
            txn.commit().unwrap();
        }
        let one = UsageTotals {
            turns: 1,
            ..Default::default()
        };
        let conv = ConversationId::new();
        let tasks: Vec<_> = (0..100)
            .map(|i| {
                let (bus, broken, fine) = (bus.clone(), broken.clone(), fine.clone());
                tokio::spawn(async move {
                    let event = keyed(conv, &format!("k{i}"));
                    let (published, refused, counted) = tokio::join!(
                        bus.publish(&event),
                        bus.add_usage(&broken, today, &one),
                        bus.add_usage(&fine, today, &one),
                    );
                    published.unwrap();
                    counted.unwrap();
                    refused.unwrap_err().kind()
                })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap(), ErrorKind::Corrupt);
        }
        assert_eq!(bus.lane_last(conv).await.unwrap(), 100);
        assert_eq!(bus.usage(&fine, today).await.unwrap().turns, 100);
    }

    /// Item 7 of the third adversarial look, in a soak: a conversation's channel stayed after
    /// its last watcher left (a broadcast buffer per conversation ever watched). A channel
    /// lives while someone watches; the last one out drops it, another watcher keeps it, and
    /// what is sent still reaches who is left.
    #[tokio::test]
    async fn a_conversations_channel_goes_with_its_last_watcher() {
        use futures::StreamExt as _;
        let dir = tempfile::tempdir().unwrap();
        let bus = EmbeddedBus::open(&dir.path().join("bus.redb"), Default::default()).unwrap();
        for _ in 0..100 {
            let conv = ConversationId::new();
            let signals = bus.lane_signals(conv).await.unwrap();
            let live = bus.subscribe_live(conv).await.unwrap();
            bus.publish(&keyed(conv, "k")).await.unwrap();
            bus.live(conv, bytes::Bytes::from_static(b"delta")).await;
            drop((signals, live));
        }
        assert_eq!((bus.lane_signals.watched(), bus.live.watched()), (0, 0));

        let conv = ConversationId::new();
        let first = bus.subscribe_live(conv).await.unwrap();
        let mut second = bus.subscribe_live(conv).await.unwrap();
        drop(first);
        assert_eq!(bus.live.watched(), 1, "a watcher is left");
        bus.live(conv, bytes::Bytes::from_static(b"still")).await;
        assert_eq!(second.next().await.unwrap(), "still");
        drop(second);
        assert_eq!(bus.live.watched(), 0);
    }
}
