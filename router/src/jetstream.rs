//! The JetStream backend: lanes as sharded streams, wakes through a shared durable pull
//! consumer per shard, leases in a key-value bucket.
//!
//! Everything is created idempotently at connect with explicit settings. Lanes are read in order
//! by direct get (`next_by_subj`), so no consumer is created per conversation.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::message::AckKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{self, DiscardPolicy, RetentionPolicy, StorageType};
use async_trait::async_trait;
use futures::StreamExt as _;
use tokio::sync::{mpsc, Mutex, OnceCell};
use tokio::task::JoinHandle;
use tracing::{debug, warn};
use turnpike_schemas::{ConversationId, Event, WorkerId};

use crate::bus::{
    decode_lane_message, dedupe_id, may_claim, now_ms, republished_envelope, Bus, Envelope,
    LaneMessage, Lease, LeaseValue, Published, Wake, WakeAck,
};
use crate::error::{Error, ErrorKind, Result};
use crate::heartbeat::Heartbeat;
use crate::recent::Recent;
use crate::subject::{
    heartbeat_subject, lease_subject, usage_subject, Shards, DISPATCH_CONSUMER, LEASE_STREAM,
    LEASE_SUBJECTS, USAGE_STREAM, USAGE_SUBJECTS,
};
use crate::usage::{Day, UsageScope, UsageTotals};

/// How many days of usage counters the bus keeps (the admin API reads back at most 92).
const USAGE_KEPT_DAYS: u64 = 100;
/// Lease hints kept: those of the conversations this process used in the last minutes, at most
/// this many (owners renew theirs every few seconds).
const LEASES_CACHED: usize = 4_096;
const LEASE_CACHE_IDLE: Duration = Duration::from_secs(120);

/// How a process proves itself to NATS, and how its connection is protected (the bus carries
/// every user's messages). Any combination the server asks for: a credentials file, an nkey
/// seed, a user and password, or a token; TLS with a CA to trust and a client certificate.
#[derive(Clone, Default)]
pub struct NatsAuth {
    /// A `.creds` file (a user JWT and its nkey seed, as `nsc` writes them).
    pub credentials_file: Option<std::path::PathBuf>,
    /// A file holding an nkey seed (`SU…`).
    pub nkey_file: Option<std::path::PathBuf>,
    pub user: Option<String>,
    pub password: Option<String>,
    pub token: Option<String>,
    /// CA certificates (PEM) to verify the servers with.
    pub ca_file: Option<std::path::PathBuf>,
    /// A client certificate and its key (PEM), for servers that verify clients.
    pub cert_file: Option<std::path::PathBuf>,
    pub key_file: Option<std::path::PathBuf>,
    /// Refuse to talk to a server without TLS (implied by a password, a token or a client
    /// certificate).
    pub require_tls: bool,
}

impl std::fmt::Debug for NatsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Secrets never reach a log.
        f.debug_struct("NatsAuth")
            .field("credentials_file", &self.credentials_file)
            .field("nkey_file", &self.nkey_file)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "…"))
            .field("token", &self.token.as_ref().map(|_| "…"))
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("require_tls", &self.require_tls)
            .finish()
    }
}

impl NatsAuth {
    /// `options` with these settings; a file that cannot be read is an error naming it.
    pub async fn apply(
        &self,
        mut options: async_nats::ConnectOptions,
    ) -> Result<async_nats::ConnectOptions> {
        let invalid = |what: &str, e: &dyn std::fmt::Display| {
            Error::new(ErrorKind::Invalid, format!("{what}: {e}"))
        };
        if let Some(path) = &self.credentials_file {
            options = options
                .credentials_file(path)
                .await
                .map_err(|e| invalid(&format!("the NATS credentials {}", path.display()), &e))?;
        }
        if let Some(path) = &self.nkey_file {
            let seed = tokio::fs::read_to_string(path)
                .await
                .map_err(|e| invalid(&format!("the nkey seed {}", path.display()), &e))?;
            options = options.nkey(seed.trim().to_owned());
        }
        match (&self.user, &self.password) {
            (Some(user), Some(password)) => {
                options = options.user_and_password(user.clone(), password.clone())
            }
            (None, None) => {}
            _ => {
                return Err(Error::new(
                    ErrorKind::Invalid,
                    "a NATS user needs a password, and a password a user",
                ))
            }
        }
        if let Some(token) = &self.token {
            options = options.token(token.clone());
        }
        if let Some(ca) = &self.ca_file {
            options = options.add_root_certificates(ca.clone()).require_tls(true);
        }
        match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => {
                options = options.add_client_certificate(cert.clone(), key.clone())
            }
            (None, None) => {}
            _ => {
                return Err(Error::new(
                    ErrorKind::Invalid,
                    "a NATS client certificate needs its key, and a key its certificate",
                ))
            }
        }
        if self.requires_tls() {
            options = options.require_tls(true);
        }
        Ok(options)
    }

    /// Whether the connection must be TLS: asked for, or a password, a token or a client
    /// certificate would otherwise go over a connection a server (or anyone between) could
    /// leave in plaintext.
    pub fn requires_tls(&self) -> bool {
        self.require_tls
            || self.ca_file.is_some()
            || self.password.is_some()
            || self.token.is_some()
            || self.cert_file.is_some()
    }
}

/// How a JetStream deployment is laid out. Defaults suit one server; raise `replicas` on a
/// cluster.
#[derive(Debug, Clone)]
pub struct JetStreamConfig {
    /// One server, or several separated by commas (`nats://a:4222,nats://b:4222`): the client
    /// connects to whichever answers and fails over between them.
    pub url: String,
    pub auth: NatsAuth,
    pub shards: Shards,
    pub replicas: usize,
    /// How long a retried publish with the same idempotency key is recognised.
    pub duplicate_window: Duration,
    /// How long lane messages are kept (the record is the long-term truth).
    pub max_age: Duration,
    /// How long a delivered wake may go without an ack or progress before redelivery.
    pub ack_wait: Duration,
    pub max_ack_pending: i64,
    /// The connection's name, as NATS monitoring (`/connz`) shows it.
    pub name: String,
    /// Wakes a worker process pulls ahead per shard (and holds in its intake, in all). Wakes
    /// pulled by a worker whose turn slots are full wait for a redelivery while another worker
    /// may sit idle: keep this near the process's slots (see `prefetch_for`).
    pub prefetch: usize,
}

/// The prefetch that suits a process with `slots` turn slots over `shards` lane streams: about
/// twice its slots in all, at least one per shard, at most 16 per shard.
pub fn prefetch_for(slots: usize, shards: u32) -> usize {
    (2 * slots / shards.max(1) as usize).clamp(1, 16)
}

impl Default for JetStreamConfig {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".into(),
            auth: NatsAuth::default(),
            shards: Shards::default(),
            replicas: 1,
            duplicate_window: Duration::from_secs(120),
            max_age: Duration::from_secs(7 * 24 * 3600),
            ack_wait: Duration::from_secs(30),
            max_ack_pending: 50_000,
            name: "turnpike".into(),
            prefetch: 16,
        }
    }
}

/// The bus on NATS JetStream.
pub struct JetStreamBus {
    client: async_nats::Client,
    js: jetstream::Context,
    config: JetStreamConfig,
    streams: Vec<stream::Stream>,
    leases: stream::Stream,
    usage: stream::Stream,
    wakes: OnceCell<Mutex<mpsc::Receiver<Wake>>>,
    /// The last lease revision and value this process wrote or read, per conversation in use
    /// lately (a hint: without it, the lease is read first).
    lease_cache: std::sync::Mutex<Recent<ConversationId, (u64, LeaseValue)>>,
    feeders: std::sync::Mutex<Vec<JoinHandle<()>>>,
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Unavailable, format!("{what}: {e}"))
}

impl JetStreamBus {
    /// A core subscription to `subject`, registered with the server before it is returned (so
    /// nothing published after this call is missed).
    async fn subscribed(&self, subject: String, what: &str) -> Result<async_nats::Subscriber> {
        let subscriber = self
            .client
            .subscribe(subject)
            .await
            .map_err(|e| unavailable(what, e))?;
        self.client
            .flush()
            .await
            .map_err(|e| unavailable(what, e))?;
        Ok(subscriber)
    }

    /// Connects and creates (or checks) the streams, consumers and lease bucket.
    pub async fn connect(config: JetStreamConfig) -> Result<Arc<Self>> {
        let servers: Vec<&str> = config
            .url
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if servers.is_empty() {
            return Err(Error::new(ErrorKind::Invalid, "no NATS server given"));
        }
        for server in &servers {
            server.parse::<async_nats::ServerAddr>().map_err(|e| {
                // Said without what might be credentials in it.
                let shown = server.rsplit('@').next().unwrap_or(server);
                Error::new(
                    ErrorKind::Invalid,
                    format!("…{shown:?} is not a NATS server address: {e}"),
                )
            })?;
        }
        // What the server or the connection last said went wrong (an authorization
        // violation, a TLS failure): said in the error when the first requests time out.
        let trouble: Arc<std::sync::Mutex<Option<String>>> = Default::default();
        let noted = trouble.clone();
        let options = async_nats::ConnectOptions::new()
            .name(config.name.clone())
            .connection_timeout(Duration::from_secs(5))
            .retry_on_initial_connect()
            .max_reconnects(None)
            .event_callback(move |event| {
                let noted = noted.clone();
                async move {
                    match &event {
                        async_nats::Event::ServerError(_) | async_nats::Event::ClientError(_) => {
                            warn!(%event, "NATS");
                            *noted.lock().expect("trouble lock") = Some(event.to_string());
                        }
                        async_nats::Event::Connected => {
                            *noted.lock().expect("trouble lock") = None;
                        }
                        _ => {}
                    }
                }
            });
        let client = config
            .auth
            .apply(options)
            .await?
            .connect(servers.as_slice())
            .await
            .map_err(|e| unavailable(&format!("connecting to NATS at {}", config.url), e))?;
        let js = jetstream::new(client.clone());
        let mut streams = Vec::new();
        for k in 0..config.shards.count() {
            let stream = js
                .get_or_create_stream(stream::Config {
                    name: config.shards.stream(k),
                    subjects: vec![config.shards.stream_subjects(k)],
                    retention: RetentionPolicy::Limits,
                    storage: StorageType::File,
                    discard: DiscardPolicy::Old,
                    max_age: config.max_age,
                    duplicate_window: config.duplicate_window,
                    num_replicas: config.replicas,
                    allow_direct: true,
                    ..Default::default()
                })
                .await
                .map_err(|e| {
                    let said = trouble.lock().expect("trouble lock").clone();
                    let tls = if config.auth.requires_tls() {
                        "; TLS is required (credentials or certificates are set, or asked for): the servers must offer it and be trusted"
                    } else {
                        ""
                    };
                    match said {
                        Some(said) => unavailable(
                            "creating a lane stream",
                            format!("{e} (the connection: {said}{tls})"),
                        ),
                        None => unavailable("creating a lane stream", format!("{e}{tls}")),
                    }
                })?;
            stream
                .get_or_create_consumer::<pull::Config>(
                    DISPATCH_CONSUMER,
                    pull::Config {
                        durable_name: Some(DISPATCH_CONSUMER.into()),
                        ack_policy: AckPolicy::Explicit,
                        deliver_policy: DeliverPolicy::All,
                        ack_wait: config.ack_wait,
                        max_deliver: -1,
                        max_ack_pending: config.max_ack_pending,
                        num_replicas: config.replicas,
                        ..Default::default()
                    },
                )
                .await
                .map_err(|e| unavailable("creating the dispatch consumer", e))?;
            streams.push(stream);
        }
        // Leases live on a stream of their own, one message per conversation, updated with
        // compare-and-set on the subject's last sequence (what a KV bucket does underneath,
        // without depending on the KV API of a particular server version).
        let leases = js
            .get_or_create_stream(stream::Config {
                name: LEASE_STREAM.into(),
                subjects: vec![LEASE_SUBJECTS.into()],
                retention: RetentionPolicy::Limits,
                storage: StorageType::File,
                max_messages_per_subject: 1,
                discard: DiscardPolicy::Old,
                num_replicas: config.replicas,
                allow_direct: true,
                ..Default::default()
            })
            .await
            .map_err(|e| unavailable("creating the lease stream", e))?;
        // The usage ledger: the same compare-and-set, one message per counter and day; days
        // older than the admin API reaches age out.
        let usage = js
            .get_or_create_stream(stream::Config {
                name: USAGE_STREAM.into(),
                subjects: vec![USAGE_SUBJECTS.into()],
                retention: RetentionPolicy::Limits,
                storage: StorageType::File,
                max_messages_per_subject: 1,
                max_age: Duration::from_secs(USAGE_KEPT_DAYS * 24 * 3600),
                discard: DiscardPolicy::Old,
                num_replicas: config.replicas,
                allow_direct: true,
                ..Default::default()
            })
            .await
            .map_err(|e| unavailable("creating the usage stream", e))?;
        Ok(Arc::new(Self {
            client,
            js,
            config,
            streams,
            leases,
            usage,
            wakes: OnceCell::new(),
            lease_cache: std::sync::Mutex::new(Recent::new(LEASES_CACHED, LEASE_CACHE_IDLE)),
            feeders: std::sync::Mutex::new(Vec::new()),
        }))
    }

    /// The lane layout this process runs on: the shard count and, per lane stream, its
    /// creation time (a recreated stream restarts its sequences, so it is a new epoch).
    pub fn layout(&self) -> crate::layout::LaneLayout {
        crate::layout::LaneLayout {
            shards: self.config.shards.count(),
            streams: self
                .streams
                .iter()
                .map(|s| {
                    let info = s.cached_info();
                    crate::layout::StreamEpoch {
                        name: info.config.name.clone(),
                        created: format!("{:?}", info.created),
                    }
                })
                .collect(),
        }
    }

    /// The revision and value of a conversation's lease, if one was ever written.
    async fn read_lease(&self, conversation: ConversationId) -> Result<Option<(u64, LeaseValue)>> {
        match self
            .leases
            .direct_get_last_for_subject(lease_subject(conversation))
            .await
        {
            Ok(m) => {
                let value: LeaseValue = serde_json::from_slice(&m.payload).map_err(|e| {
                    Error::with_source(
                        ErrorKind::Corrupt,
                        format!("the lease of {conversation} is unreadable"),
                        e,
                    )
                })?;
                Ok(Some((m.sequence, value)))
            }
            Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => Ok(None),
            Err(e) => Err(unavailable("reading a lease", e)),
        }
    }

    /// A usage counter's last sequence (0: never written) and value.
    async fn read_usage(&self, subject: &str) -> Result<(u64, UsageTotals)> {
        match self.usage.direct_get_last_for_subject(subject).await {
            Ok(m) => {
                let totals = serde_json::from_slice(&m.payload).map_err(|e| {
                    Error::with_source(
                        ErrorKind::Corrupt,
                        format!("the usage counter {subject} is unreadable"),
                        e,
                    )
                })?;
                Ok((m.sequence, totals))
            }
            Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => {
                Ok((0, UsageTotals::default()))
            }
            Err(e) => Err(unavailable("reading usage", e)),
        }
    }

    fn cached_lease(&self, conversation: ConversationId) -> Option<(u64, LeaseValue)> {
        self.lease_cache
            .lock()
            .expect("lease cache lock")
            .get(&conversation)
            .cloned()
    }

    fn remember_lease(&self, conversation: ConversationId, revision: u64, value: LeaseValue) {
        self.lease_cache
            .lock()
            .expect("lease cache lock")
            .put(conversation, (revision, value));
    }

    /// Builds a held lease and remembers it.
    fn lease(
        &self,
        conversation: ConversationId,
        owner: WorkerId,
        revision: u64,
        value: LeaseValue,
    ) -> Lease {
        let expires_ms = value.expires_ms;
        self.remember_lease(conversation, revision, value);
        Lease {
            conversation,
            owner,
            revision,
            expires_ms,
        }
    }

    /// Writes a lease if its last revision is still `last` (0: never written). Returns the new
    /// revision, or `None` when someone else wrote in between.
    async fn write_lease(
        &self,
        conversation: ConversationId,
        value: &LeaseValue,
        last: u64,
    ) -> Result<Option<u64>> {
        let payload = serde_json::to_vec(value).expect("lease values serialise");
        let message = PublishMessage::build()
            .payload(payload.into())
            .expected_last_subject_sequence(last);
        let ack = self
            .js
            .send_publish(lease_subject(conversation), message)
            .await
            .map_err(|e| unavailable("writing a lease", e))?
            .await;
        match ack {
            Ok(ack) => Ok(Some(ack.sequence)),
            Err(e)
                if e.kind()
                    == async_nats::jetstream::context::PublishErrorKind::WrongLastSequence =>
            {
                Ok(None)
            }
            Err(e) => Err(unavailable("writing a lease", e)),
        }
    }

    fn stream_of(&self, conversation: ConversationId) -> &stream::Stream {
        &self.streams[self.config.shards.shard_of(conversation) as usize]
    }

    /// Starts one feeder per shard, pulling wakes from the shared dispatch consumers.
    /// The dispatch consumer's state on every shard, in shard order.
    async fn dispatch_infos(&self) -> Result<Vec<async_nats::jetstream::consumer::Info>> {
        let mut out = Vec::with_capacity(self.streams.len());
        for stream in &self.streams {
            let mut consumer: PullConsumer = stream
                .get_consumer(DISPATCH_CONSUMER)
                .await
                .map_err(|e| unavailable("reading the dispatch consumer", e))?;
            let info = consumer
                .info()
                .await
                .map_err(|e| unavailable("reading the dispatch consumer", e))?;
            out.push(info.clone());
        }
        Ok(out)
    }

    async fn start_feeders(&self) -> Mutex<mpsc::Receiver<Wake>> {
        let prefetch = self.config.prefetch.max(1);
        let (tx, rx) = mpsc::channel(prefetch);
        let mut feeders = self.feeders.lock().expect("feeder list lock");
        for stream in &self.streams {
            feeders.push(tokio::spawn(feed(stream.clone(), tx.clone(), prefetch)));
        }
        Mutex::new(rx)
    }
}

impl Drop for JetStreamBus {
    fn drop(&mut self) {
        if let Ok(feeders) = self.feeders.lock() {
            for f in feeders.iter() {
                f.abort();
            }
        }
    }
}

/// Pulls wakes from one shard's dispatch consumer until the receiver is gone, reconnecting
/// with backoff when NATS is away.
async fn feed(stream: stream::Stream, tx: mpsc::Sender<Wake>, prefetch: usize) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let consumer: std::result::Result<PullConsumer, _> =
            stream.get_consumer(DISPATCH_CONSUMER).await;
        let messages = match consumer {
            Ok(c) => {
                c.stream()
                    .max_messages_per_batch(prefetch)
                    .heartbeat(Duration::from_secs(2))
                    .messages()
                    .await
            }
            Err(e) => {
                warn!(error = %e, "dispatch consumer unavailable");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        let mut messages = match messages {
            Ok(m) => m,
            Err(e) => {
                warn!(error = %e, "cannot pull wakes");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        while let Some(item) = messages.next().await {
            let message = match item {
                Ok(m) => m,
                Err(e) => {
                    debug!(error = %e, "wake stream interrupted");
                    break;
                }
            };
            let Ok(info) = message.info() else { continue };
            let (seq, deliveries) = (info.stream_sequence, info.delivered.max(1) as u64);
            let published_ms = u64::try_from(info.published.unix_timestamp_nanos() / 1_000_000)
                .unwrap_or_default();
            let (message, acker) = message.split();
            // Only the address is read here: a message whose body this binary cannot read
            // still wakes its owner, who parks it as a dead letter.
            let envelope: Envelope = match serde_json::from_slice(&message.payload) {
                Ok(e) => e,
                Err(e) => {
                    warn!(seq, error = %e, "lane message without a readable address; terminating its wake");
                    let _ = acker.ack_with(AckKind::Term).await;
                    continue;
                }
            };
            let wake = Wake::new(
                envelope.address.conversation,
                envelope.address.tenant,
                seq,
                deliveries,
                Box::new(JsAck(acker)),
            )
            .published_at(published_ms);
            if tx.send(wake).await.is_err() {
                return;
            }
        }
        tokio::time::sleep(backoff).await;
    }
}

struct JsAck(async_nats::jetstream::message::Acker);

#[async_trait]
impl WakeAck for JsAck {
    async fn ack(&self) -> Result<()> {
        self.0
            .ack()
            .await
            .map_err(|e| unavailable("acking a wake", e))
    }

    async fn nak(&self, delay: Duration) -> Result<()> {
        self.0
            .ack_with(AckKind::Nak(Some(delay)))
            .await
            .map_err(|e| unavailable("naking a wake", e))
    }

    async fn progress(&self) -> Result<()> {
        self.0
            .ack_with(AckKind::Progress)
            .await
            .map_err(|e| unavailable("extending a wake", e))
    }

    async fn term(&self) -> Result<()> {
        self.0
            .ack_with(AckKind::Term)
            .await
            .map_err(|e| unavailable("terminating a wake", e))
    }
}

#[async_trait]
impl Bus for JetStreamBus {
    async fn pending_per_shard(&self) -> Result<Vec<(u32, u64)>> {
        Ok(self
            .dispatch_infos()
            .await?
            .iter()
            .enumerate()
            .map(|(shard, info)| (shard as u32, info.num_pending))
            .collect())
    }

    async fn unsettled(&self) -> Result<Option<u64>> {
        let infos = self.dispatch_infos().await?;
        Ok(Some(
            infos
                .iter()
                .map(|i| i.num_pending + i.num_ack_pending as u64)
                .sum(),
        ))
    }

    async fn publish(&self, event: &Event) -> Result<Published> {
        let payload = serde_json::to_vec(event).expect("events serialise");
        let subject = self.config.shards.lane_subject(event.address.conversation);
        let mut message = PublishMessage::build()
            .payload(payload.into())
            .message_id(dedupe_id(event));
        if let Some(tp) = &event.traceparent {
            message = message.header(crate::trace::TRACEPARENT, tp.as_str());
        }
        let ack = self
            .js
            .send_publish(subject, message)
            .await
            .map_err(|e| unavailable("publishing to a lane", e))?
            .await
            .map_err(|e| unavailable("publishing to a lane (no acknowledgement)", e))?;
        Ok(Published {
            seq: ack.sequence,
            duplicate: ack.duplicate,
        })
    }

    async fn republish(
        &self,
        conversation: ConversationId,
        bytes: &[u8],
        dedupe: &str,
    ) -> Result<Published> {
        republished_envelope(conversation, bytes)?;
        let subject = self.config.shards.lane_subject(conversation);
        let ack = self
            .js
            .send_publish(
                subject,
                PublishMessage::build()
                    .payload(bytes.to_vec().into())
                    .message_id(format!("republished:{conversation}:{dedupe}")),
            )
            .await
            .map_err(|e| unavailable("republishing to a lane", e))?
            .await
            .map_err(|e| unavailable("republishing to a lane (no acknowledgement)", e))?;
        Ok(Published {
            seq: ack.sequence,
            duplicate: ack.duplicate,
        })
    }

    async fn read_lane(
        &self,
        conversation: ConversationId,
        after: u64,
        until: Option<u64>,
        limit: usize,
    ) -> Result<Vec<LaneMessage>> {
        let stream = self.stream_of(conversation);
        let subject = self.config.shards.lane_subject(conversation);
        let mut out = Vec::new();
        let mut next = after + 1;
        while out.len() < limit && until.is_none_or(|u| next <= u) {
            let message = match stream
                .direct_get_next_for_subject(subject.as_str(), Some(next))
                .await
            {
                Ok(m) => m,
                Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => break,
                Err(e) => return Err(unavailable("reading a lane", e)),
            };
            match decode_lane_message(message.sequence, &message.payload) {
                Ok(mut m) => {
                    m.event.traceparent = message
                        .headers
                        .get(crate::trace::TRACEPARENT)
                        .map(|v| v.as_str().to_owned());
                    out.push(m)
                }
                Err(_) if !out.is_empty() => break,
                Err(unreadable) => return Err(Error::unreadable_message(unreadable)),
            }
            next = message.sequence + 1;
        }
        Ok(out)
    }

    async fn lane_last(&self, conversation: ConversationId) -> Result<u64> {
        let subject = self.config.shards.lane_subject(conversation);
        match self
            .stream_of(conversation)
            .direct_get_last_for_subject(subject)
            .await
        {
            Ok(m) => Ok(m.sequence),
            Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => Ok(0),
            Err(e) => Err(unavailable("reading a lane head", e)),
        }
    }

    async fn purge_lane(&self, conversation: ConversationId) -> Result<()> {
        let subject = self.config.shards.lane_subject(conversation);
        self.stream_of(conversation)
            .purge()
            .filter(subject)
            .await
            .map_err(|e| unavailable("purging a lane", e))?;
        Ok(())
    }

    async fn next_wake(&self) -> Result<Wake> {
        let wakes = self.wakes.get_or_init(|| self.start_feeders()).await;
        wakes
            .lock()
            .await
            .recv()
            .await
            .ok_or_else(|| Error::new(ErrorKind::Unavailable, "the wake feed stopped"))
    }

    async fn claim(
        &self,
        conversation: ConversationId,
        worker: WorkerId,
        ttl: Duration,
    ) -> Result<Option<Lease>> {
        let now = now_ms();
        let value = LeaseValue {
            owner: Some(worker),
            expires_ms: now + ttl.as_millis() as u64,
        };
        // Fast path: a compare-and-set at what this process saw last (nothing, for a lease it
        // never saw). It succeeds only if that is still the current value, which may_claim
        // allows: one round trip for the common case.
        let cached = self.cached_lease(conversation);
        if may_claim(cached.as_ref().map(|(_, v)| v), now) {
            let last = cached.map(|(rev, _)| rev).unwrap_or(0);
            if let Some(revision) = self.write_lease(conversation, &value, last).await? {
                return Ok(Some(self.lease(conversation, worker, revision, value)));
            }
        }
        let current = self.read_lease(conversation).await?;
        if let Some((revision, held)) = &current {
            self.remember_lease(conversation, *revision, held.clone());
        }
        if !may_claim(current.as_ref().map(|(_, v)| v), now) {
            return Ok(None);
        }
        let last = current.map(|(rev, _)| rev).unwrap_or(0);
        Ok(self
            .write_lease(conversation, &value, last)
            .await?
            .map(|revision| self.lease(conversation, worker, revision, value)))
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let value = LeaseValue {
            owner: Some(lease.owner),
            expires_ms: now_ms() + ttl.as_millis() as u64,
        };
        match self
            .write_lease(lease.conversation, &value, lease.revision)
            .await
        {
            Ok(Some(revision)) => Ok(self.lease(lease.conversation, lease.owner, revision, value)),
            Ok(None) => Err(Error::new(
                ErrorKind::LeaseLost,
                format!("the lease of {} was taken over", lease.conversation),
            )),
            // Ambiguous: the write may have landed and only its acknowledgement was lost (a
            // timeout). If the lease now holds exactly the value this call wrote — our worker,
            // our new expiry to the millisecond — it did: adopt its revision instead of being
            // fenced on the next renewal. Anything else stays an error.
            Err(e) => match self.read_lease(lease.conversation).await {
                Ok(Some((revision, held))) if held == value => {
                    Ok(self.lease(lease.conversation, lease.owner, revision, value))
                }
                _ => Err(e),
            },
        }
    }

    async fn add_usage(&self, scope: &UsageScope, day: Day, delta: &UsageTotals) -> Result<()> {
        let subject = usage_subject(&scope.key(day));
        // Bounded: each conflict means another process added in between; a counter this hot
        // still converges within a few rounds.
        for attempt in 0..64u64 {
            if attempt > 0 {
                // Spread the contenders out: up to attempt × 2 ms, jittered.
                let jitter = (now_ms() ^ (attempt.wrapping_mul(0x9e37_79b9))) % (2 * attempt + 1);
                tokio::time::sleep(Duration::from_millis(jitter)).await;
            }
            let (last, current) = self.read_usage(&subject).await?;
            let payload = serde_json::to_vec(&current.plus(*delta)).expect("totals serialise");
            let message = PublishMessage::build()
                .payload(payload.into())
                .expected_last_subject_sequence(last);
            let ack = self
                .js
                .send_publish(subject.clone(), message)
                .await
                .map_err(|e| unavailable("adding usage", e))?
                .await;
            match ack {
                Ok(_) => return Ok(()),
                Err(e)
                    if e.kind()
                        == async_nats::jetstream::context::PublishErrorKind::WrongLastSequence => {}
                Err(e) => return Err(unavailable("adding usage", e)),
            }
        }
        Err(unavailable(
            "adding usage",
            "the counter kept changing under 64 attempts",
        ))
    }

    async fn usage(&self, scope: &UsageScope, day: Day) -> Result<UsageTotals> {
        Ok(self.read_usage(&usage_subject(&scope.key(day))).await?.1)
    }

    async fn live(&self, conversation: ConversationId, payload: bytes::Bytes) {
        let _ = self
            .client
            .publish(crate::subject::live_subject(conversation), payload)
            .await;
    }

    async fn subscribe_live(
        &self,
        conversation: ConversationId,
    ) -> Result<futures::stream::BoxStream<'static, bytes::Bytes>> {
        use futures::StreamExt as _;
        let subscriber = self
            .subscribed(
                crate::subject::live_subject(conversation),
                "subscribing to live messages",
            )
            .await?;
        Ok(subscriber.map(|m| m.payload).boxed())
    }

    async fn lane_signals(
        &self,
        conversation: ConversationId,
    ) -> Result<futures::stream::BoxStream<'static, ()>> {
        // JetStream messages are delivered to core subscribers of their subject too. No flush:
        // the subscription and every later request go out on one connection, and the server
        // handles a connection's commands in order, so it is in place before any request this
        // bus sends after it (a lane read included), as the contract asks; a flush would cost a
        // round trip per turn. (In a cluster, interest spreads to the other servers
        // asynchronously, with or without a flush.)
        let subscriber = self
            .client
            .subscribe(self.config.shards.lane_subject(conversation))
            .await
            .map_err(|e| unavailable("watching a lane", e))?;
        Ok(subscriber.map(|_| ()).boxed())
    }

    async fn heartbeat(&self, beat: &Heartbeat) {
        let payload = serde_json::to_vec(beat).expect("heartbeats serialise");
        let _ = self
            .client
            .publish(heartbeat_subject(beat.worker), payload.into())
            .await;
    }

    async fn watch_heartbeats(&self) -> Result<futures::stream::BoxStream<'static, Heartbeat>> {
        let subscriber = self
            .subscribed(crate::subject::HEARTBEATS.into(), "watching heartbeats")
            .await?;
        // A flush only puts the watch on the wire; beats come from other connections, which
        // the server does not order with this one. A round trip on this connection does: a
        // request to an inbox nobody answers, which the server refuses at once ("no
        // responders") after it has taken the watch. (Bounded: a server that stays silent
        // leaves the flush's weaker promise.)
        let inbox = self.client.new_inbox();
        let _ = tokio::time::timeout(
            Duration::from_millis(500),
            self.client.request(inbox, bytes::Bytes::new()),
        )
        .await;
        // Anything else on the subject (an older or foreign sender) is skipped.
        Ok(subscriber
            .filter_map(|message| {
                futures::future::ready(serde_json::from_slice::<Heartbeat>(&message.payload).ok())
            })
            .boxed())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let value = LeaseValue {
            owner: None,
            expires_ms: 0,
        };
        if let Some(revision) = self
            .write_lease(lease.conversation, &value, lease.revision)
            .await?
        {
            self.remember_lease(lease.conversation, revision, value);
        }
        Ok(())
    }
}

#[cfg(test)]
mod prefetch_tests {
    use super::prefetch_for;

    #[test]
    fn prefetch_follows_the_slots_within_bounds() {
        assert_eq!(prefetch_for(4, 8), 1);
        assert_eq!(prefetch_for(32, 8), 8);
        assert_eq!(prefetch_for(64, 8), 16);
        assert_eq!(prefetch_for(512, 8), 16);
        assert_eq!(prefetch_for(1, 1), 2);
        assert_eq!(prefetch_for(4, 0), 8);
    }
}
