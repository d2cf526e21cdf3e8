//! The running turn as the harness sees it.
//!
//! Contract: everything the harness does to the world goes through a [`Turn`], which the host
//! (the worker) implements under the turn's lease. What arrives on the lane is committed to the
//! record before [`Turn::commit_arrivals`] returns it; a side-effecting call's intent is
//! committed before [`Turn::run_tool`] runs it; the turn's blocks, usage, exchange and
//! compaction are kept by the host and committed in batch two. Methods take `&self`: tools, the
//! agent loop and the lane can all use the turn at once. An error of the host comes back as
//! [`crate::ErrorKind::Host`], which the host takes back unchanged.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::{mpsc, watch};
use turnpike_schemas::entry::{CompactionMarker, IngressDirective};
use turnpike_schemas::turnlog::Exchange;
use turnpike_schemas::{AgentId, AppId, Block, ConversationId, Event, Identity, TenantId, TurnId};

use crate::error::Result;
use crate::message::ToolCallRequest;
use crate::model::CallContext;
use crate::recall::RecallRequest;
use crate::spec::AgentSpec;
use crate::timeline::Timeline;
use crate::tools::{ToolOutput, Toolset};

/// One turn of a conversation, between its batch one and its batch two.
#[async_trait]
pub trait Turn: Send + Sync {
    // Who and what.

    /// The turn being run.
    fn turn(&self) -> TurnId;
    /// This attempt at the turn: a recovered turn runs again under its id as a new attempt.
    fn attempt(&self) -> u64;
    /// The conversation's tenant.
    fn tenant(&self) -> &TenantId;
    /// The conversation.
    fn conversation(&self) -> ConversationId;
    /// The app the turn runs for.
    fn app(&self) -> &AppId;
    /// The agent the turn runs for.
    fn agent_id(&self) -> &AgentId;
    /// The agent's spec (from its app's manifest), when it has one.
    fn agent(&self) -> Option<&Arc<AgentSpec>>;
    /// Every agent of the turn's app.
    fn app_agents(&self) -> &[AgentId];
    /// The identity the turn is bound to (the authenticated caller of its first input).
    fn identity(&self) -> &Identity;
    /// The events committed in batch one.
    fn inputs(&self) -> &[Event];
    /// The ingress directive of the turn, if any.
    fn directive(&self) -> Option<&IngressDirective>;
    /// How many model and tool rounds the turn may take: the lowest of the deployment's limit,
    /// the agent's budget and the ingress directive's.
    fn max_rounds(&self) -> u32;
    /// The turn's private directory, deleted when the turn ends.
    fn workspace(&self) -> &Path;

    // What the turn did (kept by the host for batch two).

    /// Adds a block to the turn log.
    fn push(&self, block: Block);
    /// Adds a reply to the turn.
    fn say(&self, text: String) {
        self.push(Block::AssistantMessage { text });
    }
    /// The turn's blocks so far.
    fn blocks(&self) -> Vec<Block>;
    /// Replaces the turn's blocks (an agent loop that kept its own).
    fn set_blocks(&self, blocks: Vec<Block>);
    /// The tokens the turn's model calls used, as their endpoints reported them.
    fn set_usage(&self, cx: &CallContext);
    /// Keeps a remote app's exchange for the turn log.
    fn set_exchange(&self, exchange: Exchange);
    /// Records the compaction this turn made (appended in batch two).
    fn set_compaction(&self, marker: CompactionMarker);

    // The lane.

    /// The events that arrived on the lane since the last commit — follow-ups, steers, stops —
    /// committed to the record before they are returned. A new `message` is not folded in: it
    /// starts the next turn. Does not add blocks; see [`Self::fold_arrivals`].
    async fn commit_arrivals(&self) -> Result<Vec<Event>>;
    /// [`Self::commit_arrivals`], adding their blocks to the turn log.
    async fn fold_arrivals(&self) -> Result<Vec<Event>> {
        let events = self.commit_arrivals().await?;
        for event in &events {
            if let Some(block) = Block::from_event(&event.body) {
                self.push(block);
            }
        }
        Ok(events)
    }
    /// Resolves once a stop for this turn is waiting on the lane (cancel-safe). A watch that
    /// ended without a stop never resolves this.
    async fn stop_requested(&self);
    /// Counts events reaching the lane during the turn (for a model that waits on input).
    fn arrivals(&self) -> watch::Receiver<u64>;
    /// Where streamed text goes: advisory deltas to the conversation's live stream.
    fn deltas(&self) -> mpsc::UnboundedSender<String>;

    // The context.

    /// The timeline of the turns before this one (latest summary onwards). Asking for it also
    /// makes the turn leave a snapshot for the next one.
    async fn timeline(&self) -> Result<Timeline>;
    /// The instructions the conversation was created with, if any: the owner's words, for the
    /// owner's turns only.
    async fn instructions(&self) -> Option<String>;
    /// Whether `identity` may answer a request whose approvers are `approvers` (empty: whoever
    /// may see the conversation).
    async fn may_answer(&self, identity: &Identity, approvers: &[Identity]) -> bool;
    /// Rows of the user's other conversations that match the turn's input, as the turn's
    /// identity may see them (`None`: nothing to search for).
    async fn recall(&self, request: RecallRequest<'_>) -> Option<Block>;

    // Tools.

    /// The tools this turn's agent may call: its allowlist of the host's tools, and the tools
    /// its MCP servers offer now (a host without MCP gives the allowlist alone). An error
    /// says which server failed and why; the turn fails with it.
    async fn toolset(&self) -> Result<Toolset> {
        Ok(self.agent().map(|a| a.tools.clone()).unwrap_or_default())
    }

    /// Runs `call` of a tool `tools` allows (no gating): a side-effecting one only after its
    /// intent is committed. `Ok((ok, output))`: the call ran (or was refused with a message
    /// for the model); `Err`: it did not run (the intent could not be committed).
    async fn run_tool(&self, tools: &Toolset, call: &ToolCallRequest)
        -> Result<(bool, ToolOutput)>;
    /// Brings the files of the project's latest version into the workspace: an approved call
    /// runs in a later turn's fresh workspace, over what its parked turn left.
    async fn restore_workspace(&self) -> std::result::Result<(), String>;
}
