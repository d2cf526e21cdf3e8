//! The turn as an app's callback sees it.

use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};
use turnpike_artifactory::Head;
use turnpike_router::bus::LaneMessage;
use turnpike_schemas::entry::{CompactionMarker, IngressDirective, ToolCall};
use turnpike_schemas::{AgentId, AppId, Block, EntryBody, Event, Identity, TurnId};

use crate::apps::AgentSpec;
use crate::error::Result;
use crate::timeline::Timeline;
use crate::tools::{ProjectHandle, ToolContext};
use crate::workspace::Workspace;
use turnpike_artifactory::git::{Lineage, Project};

use super::lane_watch::{folds_into, LaneWatch};
use super::TurnEnv;

/// The turn as an app's callback sees it. Methods take `&self`: tools, the agent loop and the
/// lane can all use the turn at once.
pub struct TurnContext<'a> {
    pub(super) env: &'a TurnEnv,
    pub(super) turn: TurnId,
    /// This attempt at the turn (a fresh random id): the key its side objects are written
    /// under until the record commits it.
    pub(super) attempt: u64,
    pub(super) app: AppId,
    pub(super) agent: AgentId,
    pub(super) spec: Option<Arc<AgentSpec>>,
    pub(super) identity: Identity,
    pub(super) workspace: Workspace,
    pub(super) inputs: Vec<Event>,
    pub(super) directive: Option<IngressDirective>,
    pub(super) head: Mutex<Head>,
    pub(super) blocks: Mutex<Vec<Block>>,
    /// The tokens the turn's model calls reported.
    pub(super) usage: Mutex<Option<turnpike_schemas::turnlog::Usage>>,
    /// Each model call of the turn, for its `usage` entries.
    pub(super) calls: Mutex<Vec<crate::model::CallUsage>>,
    /// A remote app's exchange, for the turn log.
    pub(super) exchange: Mutex<Option<turnpike_schemas::turnlog::Exchange>>,
    /// The timeline the turn was built on, once asked for; the snapshot after the turn extends it.
    pub(super) timeline: Mutex<Option<Timeline>>,
    /// Every agent of the turn's app.
    pub(super) app_agents: Vec<AgentId>,
    /// Side-effecting calls whose intent was committed before they ran.
    pub(super) intents: Mutex<std::collections::HashSet<String>>,
    /// The compaction this turn made, for batch two.
    pub(super) compaction: Mutex<Option<CompactionMarker>>,
    /// The conversation's project lineage, the version the turn started from, and the project
    /// directory once opened.
    pub(super) lineage: Lineage,
    pub(super) base_version: Option<turnpike_schemas::ProjectVersion>,
    pub(super) project: tokio::sync::OnceCell<Project>,
    /// What the turn may bring in from other conversations (all participants may see it).
    pub(super) reach: crate::reach::Reach,
    /// Whether a tool hosted a file (written under the attempt, promoted after commit).
    pub(super) hosted: std::sync::atomic::AtomicBool,
    pub(super) watch: LaneWatch,
    pub(super) deltas: mpsc::UnboundedSender<String>,
}

impl TurnContext<'_> {
    /// The turn being run.
    pub fn turn(&self) -> TurnId {
        self.turn
    }

    /// This attempt at the turn: a recovered turn runs again under its id as a new attempt.
    pub fn attempt(&self) -> u64 {
        self.attempt
    }

    /// Keeps a remote app's exchange for the turn log.
    pub fn set_exchange(&self, exchange: turnpike_schemas::turnlog::Exchange) {
        *self.exchange.lock().expect("exchange lock") = Some(exchange);
    }

    /// The app and agent the turn runs for.
    pub fn app(&self) -> &AppId {
        &self.app
    }

    pub fn agent_id(&self) -> &AgentId {
        &self.agent
    }

    /// The agent's spec (from its app's manifest), when it has one.
    pub fn agent(&self) -> Option<&Arc<AgentSpec>> {
        self.spec.as_ref()
    }

    /// The identity the turn is bound to (the authenticated caller of its first input).
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The turn's private directory, deleted when the turn ends.
    pub fn workspace(&self) -> &std::path::Path {
        self.workspace.path()
    }

    /// The events committed in batch one.
    pub fn inputs(&self) -> &[Event] {
        &self.inputs
    }

    /// How many model and tool rounds the turn may take: the lowest of the deployment's limit,
    /// the agent's budget and the ingress directive's.
    pub fn max_rounds(&self) -> u32 {
        let mut rounds = self.env.config.max_rounds;
        if let Some(spec) = &self.spec {
            rounds = rounds.min(spec.max_rounds);
        }
        if let Some(limit) = self.directive.as_ref().and_then(|d| d.max_rounds) {
            rounds = rounds.min(limit);
        }
        rounds
    }

    /// Adds a reply to the turn.
    pub fn say(&self, text: String) {
        self.push(Block::AssistantMessage { text });
    }

    /// Adds a block to the turn log.
    pub fn push(&self, block: Block) {
        self.blocks.lock().expect("blocks lock").push(block);
    }

    /// The turn's blocks so far.
    pub fn blocks(&self) -> Vec<Block> {
        self.blocks.lock().expect("blocks lock").clone()
    }

    /// The tokens the turn's model calls used, as their endpoints reported them.
    pub fn set_usage(&self, cx: &crate::model::CallContext) {
        *self.usage.lock().expect("usage lock") = cx.usage();
        *self.calls.lock().expect("calls lock") = cx.calls().to_vec();
    }

    /// Replaces the turn's blocks (an agent loop that kept its own).
    pub fn set_blocks(&self, blocks: Vec<Block>) {
        *self.blocks.lock().expect("blocks lock") = blocks;
    }

    /// The events that arrived on the lane since the last commit — follow-ups, steers, stops —
    /// committed to the record before they are returned. A new `message` is not folded in: it
    /// starts the next turn. Does not add blocks; see [`Self::fold_arrivals`].
    pub async fn commit_arrivals(&self) -> Result<Vec<Event>> {
        let conversation = self.env.record.prefix().conversation();
        let head = self.head.lock().expect("head lock").clone();
        // The watch already saw that the next message is not this turn's: nothing to fold.
        if self.watch.seen().blocked_after == Some(head.state().lane_through) {
            return Ok(Vec::new());
        }
        let arrived = super::lane_watch::read_folding(
            self.env.bus.as_ref(),
            conversation,
            head.state().lane_through,
            &self.identity,
        )
        .await;
        let arrived = match arrived {
            Ok((arrived, _)) => arrived,
            // Parked by the owner once the turn is over; nothing to fold now.
            Err(e) if e.kind() == turnpike_router::ErrorKind::Unreadable => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let folded: Vec<LaneMessage> = arrived
            .into_iter()
            .take_while(|m| folds_into(&self.identity, &m.event))
            .collect();
        if folded.is_empty() {
            return Ok(Vec::new());
        }
        let bodies: Vec<EntryBody> = folded
            .iter()
            .map(|m| EntryBody::input(m.event.clone(), Some(m.seq)))
            .collect();
        let head = self.env.append(&head, &bodies).await?;
        *self.head.lock().expect("head lock") = head;
        Ok(folded.into_iter().map(|m| m.event).collect())
    }

    /// [`Self::commit_arrivals`], adding their blocks to the turn log.
    pub async fn fold_arrivals(&self) -> Result<Vec<Event>> {
        let events = self.commit_arrivals().await?;
        for event in &events {
            if let Some(block) = Block::from_event(&event.body) {
                self.push(block);
            }
        }
        Ok(events)
    }

    /// Resolves once a stop for this turn is waiting on the lane (cancel-safe). A watch that
    /// ended without a stop never resolves this: a closed channel is not a stop.
    pub async fn stop_requested(&self) {
        let mut stop = self.watch.stop.clone();
        if stop.wait_for(|s| s.is_some()).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Counts events reaching the lane during the turn (for a model that waits on input).
    pub fn arrivals(&self) -> watch::Receiver<u64> {
        self.watch.arrivals.clone()
    }

    /// Where streamed text goes: advisory deltas on `tp.live.{conv}`.
    pub fn deltas(&self) -> mpsc::UnboundedSender<String> {
        self.deltas.clone()
    }

    /// The timeline of the turns before this one (latest summary onwards). Asking for it also
    /// makes the turn leave a snapshot for the next one.
    pub async fn timeline(&self) -> Result<Timeline> {
        if let Some(t) = self.timeline.lock().expect("timeline lock").clone() {
            return Ok(t);
        }
        let state = self.head.lock().expect("head lock").state().clone();
        let timeline = crate::timeline::rebuild(
            &self.env.turn_logs,
            self.env.record.prefix(),
            &state,
            self.turn,
        )
        .await?;
        *self.timeline.lock().expect("timeline lock") = Some(timeline.clone());
        Ok(timeline)
    }

    /// Recalls for the turn through this worker's index (see [`crate::recall::recall`]).
    pub async fn recall(&self, mut input: crate::recall::RecallInput<'_>) -> Option<Block> {
        input.index = self.env.search.as_ref();
        crate::recall::recall(input).await
    }

    /// What the turn may bring in from other conversations.
    pub fn reach(&self) -> &crate::reach::Reach {
        &self.reach
    }

    /// The conversation.
    pub fn conversation(&self) -> turnpike_schemas::ConversationId {
        self.env.record.prefix().conversation()
    }

    /// The conversation's tenant.
    pub fn tenant(&self) -> &turnpike_schemas::TenantId {
        self.env.record.prefix().tenant()
    }

    /// What call `call_id` of this turn can reach.
    pub fn tool_context<'c>(&'c self, call_id: &'c str) -> ToolContext<'c> {
        ToolContext {
            workspace: self.workspace.path(),
            identity: &self.identity,
            prefix: self.env.record.prefix(),
            turn: self.turn,
            attempt: self.attempt,
            resolver: &self.env.resolver,
            files: &self.env.files,
            search: self.env.search.as_ref(),
            call_id,
            agent: &self.agent,
            app_agents: &self.app_agents,
            project: Some(ProjectHandle {
                cell: &self.project,
                lineage: &self.lineage,
                workspace: self.workspace.path(),
                base: self.base_version,
            }),
            cell: &self.env.cell,
            fence: &self.env.fence,
            reach: &self.reach,
            hosted: &self.hosted,
        }
    }

    /// Every agent of the turn's app.
    pub fn app_agents(&self) -> &[AgentId] {
        &self.app_agents
    }

    /// The ingress directive of the turn, if any.
    pub fn directive(&self) -> Option<&IngressDirective> {
        self.directive.as_ref()
    }

    /// Commits that a side-effecting call is about to run, before it runs: if the worker dies
    /// before the call's result is committed, recovery marks the turn ambiguous instead of
    /// running the call again.
    pub async fn commit_intent(
        &self,
        call_id: &str,
        tool: &str,
        arguments: &serde_json::Value,
    ) -> Result<()> {
        let head = self.head.lock().expect("head lock").clone();
        let entry = EntryBody::ToolCall(ToolCall {
            turn: self.turn,
            call_id: call_id.to_owned(),
            tool: tool.to_owned(),
            arguments: arguments.clone(),
            side_effects: true,
        });
        let head = self.env.append(&head, &[entry]).await?;
        *self.head.lock().expect("head lock") = head;
        self.intents
            .lock()
            .expect("intents lock")
            .insert(call_id.to_owned());
        Ok(())
    }

    /// The instructions the conversation was created with, if any (read from the directory).
    /// They are the owner's words: they steer the owner's turns only, never a turn that runs
    /// as someone the conversation is shared with.
    pub async fn instructions(&self) -> Option<String> {
        self.env
            .directory
            .lookup_unchecked(self.env.record.prefix().conversation())
            .await
            .ok()
            .filter(|entry| entry.owner == self.identity)
            .and_then(|entry| entry.instructions)
    }

    /// Whether `identity` may answer a request whose approvers are `approvers` (empty: whoever
    /// may see the conversation — its owner, or someone it is shared with).
    pub async fn may_answer(&self, identity: &Identity, approvers: &[Identity]) -> bool {
        if !approvers.is_empty() {
            return approvers.contains(identity);
        }
        self.env
            .directory
            .lookup(
                self.env.record.prefix().conversation(),
                self.env.record.prefix().tenant(),
                identity,
            )
            .await
            .is_ok()
    }

    /// Records the compaction this turn made (appended in batch two).
    pub fn set_compaction(&self, marker: CompactionMarker) {
        *self.compaction.lock().expect("compaction lock") = Some(marker);
    }
}
