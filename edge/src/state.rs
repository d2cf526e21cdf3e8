//! The edge's shared state: what it is built from ([`EdgeParts`]) and what every handler reaches
//! through [`Edge`].

use std::sync::Arc;

use turnpike_artifactory::{Conversations, Files, RecordSigner, TrustedKeys};
use turnpike_router::bus::Bus;
use turnpike_router::Ingress;
use turnpike_schemas::entry::IngressDirective;

use crate::auth::Authenticator;
use crate::hosted::{Catalog, Replayer};
use crate::limits::{self, Limits};

/// What the edge is built from.
pub struct EdgeParts {
    pub bus: Arc<dyn Bus>,
    pub conversations: Conversations,
    pub trusted: TrustedKeys,
    /// Signs the opening batch of conversations created here.
    pub signer: RecordSigner,
    pub auth: Authenticator,
    /// The apps and agents this deployment hosts (conversations may only use these), read
    /// at each request: a reload of the apps folders shows at once.
    pub apps: std::sync::Arc<dyn Catalog>,
    /// Replays conversations for `/v1/admin/conversations/{id}/replay`.
    pub replayer: std::sync::Arc<dyn Replayer>,
    /// The hybrid index `/v1/search` asks (none: search answers 503).
    pub search: Option<turnpike_index::Index>,
    pub limits: Limits,
    /// The key signed file links are made with (keep it the same across a fleet's routers).
    pub link_key: [u8; 32],
    /// A deployment's policy attached to every accepted event.
    pub directive: Option<IngressDirective>,
    /// Daily spending limits: messages under a spent one are refused (429 `budget_exceeded`).
    pub budgets: Vec<turnpike_router::usage::Budget>,
    /// A built book (mdBook's output, read by [`crate::book::Book::load`]) to serve at
    /// `/book/` (none: `/book/` says where it is).
    pub book: Option<crate::book::Book>,
}

/// The edge's shared state.
#[derive(Clone)]
pub struct Edge {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) bus: Arc<dyn Bus>,
    pub(crate) conversations: Conversations,
    pub(crate) ingress: Ingress,
    pub(crate) resolver: turnpike_resolver::Resolver,
    pub(crate) files: Files,
    pub(crate) trusted: TrustedKeys,
    pub(crate) signer: RecordSigner,
    pub(crate) auth: Authenticator,
    pub(crate) apps: std::sync::Arc<dyn Catalog>,
    pub(crate) replayer: std::sync::Arc<dyn Replayer>,
    pub(crate) search: Option<turnpike_index::Index>,
    pub(crate) limits: Limits,
    pub(crate) rates: limits::RateLimits,
    pub(crate) in_flight: limits::InFlight,
    pub(crate) link_key: [u8; 32],
    pub(crate) book: Option<crate::book::Book>,
    /// True once the router is shutting down: no new streams, open ones close after a grace.
    pub(crate) draining: tokio::sync::watch::Sender<bool>,
    /// WebSocket streams open now.
    pub(crate) streams: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Edge {
    pub fn new(parts: EdgeParts) -> Self {
        let mut ingress = Ingress::new(parts.bus.clone(), parts.conversations.clone());
        if let Some(d) = parts.directive {
            ingress = ingress.with_directive(d);
        }
        ingress = ingress.with_budgets(parts.budgets);
        let store = parts.conversations.store().clone();
        let inner = Inner {
            resolver: turnpike_resolver::Resolver::standard(
                parts.conversations.directory().clone(),
                store.clone(),
            ),
            files: Files::new(store),
            rates: limits::RateLimits::new(&parts.limits),
            in_flight: limits::InFlight::new(&parts.limits),
            draining: tokio::sync::watch::Sender::new(false),
            streams: Default::default(),
            bus: parts.bus,
            conversations: parts.conversations,
            ingress,
            trusted: parts.trusted,
            signer: parts.signer,
            auth: parts.auth,
            apps: parts.apps,
            replayer: parts.replayer,
            search: parts.search,
            limits: parts.limits,
            link_key: parts.link_key,
            book: parts.book,
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Starts shutting down: new streams are refused (503), open ones are closed with 1001
    /// (going away) once the drain grace has passed, so their clients reconnect to another
    /// router and resume from their cursor.
    pub fn drain(&self) {
        self.inner.draining.send_replace(true);
    }

    /// How long open streams go on after [`Self::drain`].
    pub fn drain_grace(&self) -> std::time::Duration {
        self.inner.limits.drain_grace
    }

    /// After [`Self::drain`]: waits out the grace, then (up to `limit` more) until every open
    /// WebSocket stream has sent its 1001 and ended.
    pub async fn drained(&self, limit: std::time::Duration) {
        tokio::time::sleep(self.drain_grace()).await;
        let deadline = tokio::time::Instant::now() + limit;
        while self
            .inner
            .streams
            .load(std::sync::atomic::Ordering::Acquire)
            > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}
