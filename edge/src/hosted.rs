//! What the edge needs of the harness, which it does not depend on: the catalogue of the apps a
//! deployment hosts, and replay. The binary wires the harness's own in (`turnpike-agent`), so
//! editing how an agent runs rebuilds neither the edge nor the router.

use async_trait::async_trait;
use turnpike_schemas::{TurnId, TurnLog};

use crate::model::AppView;

/// The apps and agents a deployment hosts (conversations may only use these).
pub trait Catalog: Send + Sync {
    /// The apps hosted now, in id order, each with its agents. Read at each request: a reload
    /// of the apps folders shows at once.
    fn apps(&self) -> Vec<AppView>;

    /// The inbound hook `hook` of `app`, if a hosted manifest declares one.
    fn hook(&self, app: &str, hook: &str) -> Option<turnpike_schemas::HookSpec> {
        let _ = (app, hook);
        None
    }
}

/// One turn replayed from its recorded outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replayed {
    pub turn: TurnId,
    /// Where the replay diverged from the record; `None`: it reproduced the turn.
    pub divergence: Option<String>,
}

/// Replays a conversation's recorded turns (no model or tool is called).
#[async_trait]
pub trait Replayer: Send + Sync {
    /// Each turn of `logs`, replayed in order.
    async fn replay(&self, logs: &[TurnLog]) -> Vec<Replayed>;
}
