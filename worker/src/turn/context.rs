//! The turn as an app's callback sees it.

use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};
use turnpike_artifactory::Head;
use turnpike_router::bus::LaneMessage;
use turnpike_schemas::entry::{CompactionMarker, IngressDirective, ToolCall};
use turnpike_schemas::{AgentId, AppId, Block, EntryBody, Event, Identity, TurnId};

use async_trait::async_trait;
use turnpike_agent::message::ToolCallRequest;
use turnpike_agent::model::CallContext;
use turnpike_agent::recall::RecallRequest;
use turnpike_agent::timeline::Timeline;
use turnpike_agent::tools::{ToolOutput, Toolset};
use turnpike_agent::{AgentSpec, Turn};

use crate::error::Result;
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
    pub(super) calls: Mutex<Vec<turnpike_agent::model::CallUsage>>,
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
    /// The agent's MCP servers, live for this turn once its toolset is asked for.
    pub(super) mcp: crate::mcp::TurnServers,
}

impl TurnContext<'_> {
    /// What the turn may bring in from other conversations.
    pub fn reach(&self) -> &crate::reach::Reach {
        &self.reach
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

    /// The lane's arrivals, committed (see [`Turn::commit_arrivals`]), in the worker's error.
    async fn commit_arrivals_here(&self) -> Result<Vec<Event>> {
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

    /// The timeline (see [`Turn::timeline`]), in the worker's error.
    async fn timeline_here(&self) -> Result<Timeline> {
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
}

#[async_trait]
impl Turn for TurnContext<'_> {
    fn turn(&self) -> TurnId {
        self.turn
    }

    fn attempt(&self) -> u64 {
        self.attempt
    }

    fn tenant(&self) -> &turnpike_schemas::TenantId {
        self.env.record.prefix().tenant()
    }

    fn conversation(&self) -> turnpike_schemas::ConversationId {
        self.env.record.prefix().conversation()
    }

    fn app(&self) -> &AppId {
        &self.app
    }

    fn agent_id(&self) -> &AgentId {
        &self.agent
    }

    fn agent(&self) -> Option<&Arc<AgentSpec>> {
        self.spec.as_ref()
    }

    fn app_agents(&self) -> &[AgentId] {
        &self.app_agents
    }

    fn identity(&self) -> &Identity {
        &self.identity
    }

    fn inputs(&self) -> &[Event] {
        &self.inputs
    }

    fn directive(&self) -> Option<&IngressDirective> {
        self.directive.as_ref()
    }

    fn max_rounds(&self) -> u32 {
        let mut rounds = self.env.config.max_rounds;
        if let Some(spec) = &self.spec {
            rounds = rounds.min(spec.max_rounds);
        }
        if let Some(limit) = self.directive.as_ref().and_then(|d| d.max_rounds) {
            rounds = rounds.min(limit);
        }
        rounds
    }

    fn workspace(&self) -> &std::path::Path {
        self.workspace.path()
    }

    fn push(&self, block: Block) {
        self.blocks.lock().expect("blocks lock").push(block);
    }

    fn blocks(&self) -> Vec<Block> {
        self.blocks.lock().expect("blocks lock").clone()
    }

    fn set_blocks(&self, blocks: Vec<Block>) {
        *self.blocks.lock().expect("blocks lock") = blocks;
    }

    fn set_usage(&self, cx: &CallContext) {
        *self.usage.lock().expect("usage lock") = cx.usage();
        *self.calls.lock().expect("calls lock") = cx.calls().to_vec();
    }

    fn set_exchange(&self, exchange: turnpike_schemas::turnlog::Exchange) {
        *self.exchange.lock().expect("exchange lock") = Some(exchange);
    }

    fn set_compaction(&self, marker: CompactionMarker) {
        *self.compaction.lock().expect("compaction lock") = Some(marker);
    }

    async fn commit_arrivals(&self) -> turnpike_agent::Result<Vec<Event>> {
        Ok(self.commit_arrivals_here().await?)
    }

    async fn stop_requested(&self) {
        let mut stop = self.watch.stop.clone();
        if stop.wait_for(|s| s.is_some()).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    fn arrivals(&self) -> watch::Receiver<u64> {
        self.watch.arrivals.clone()
    }

    fn deltas(&self) -> mpsc::UnboundedSender<String> {
        self.deltas.clone()
    }

    async fn timeline(&self) -> turnpike_agent::Result<Timeline> {
        Ok(self.timeline_here().await?)
    }

    async fn instructions(&self) -> Option<String> {
        self.env
            .directory
            .lookup_unchecked(self.env.record.prefix().conversation())
            .await
            .ok()
            .filter(|entry| entry.owner == self.identity)
            .and_then(|entry| entry.instructions)
    }

    async fn may_answer(&self, identity: &Identity, approvers: &[Identity]) -> bool {
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

    /// Recalls through this worker's index (see [`crate::recall::recall`]).
    async fn recall(&self, request: RecallRequest<'_>) -> Option<Block> {
        crate::recall::recall(crate::recall::RecallInput {
            spec: request.spec,
            index: self.env.search.as_ref(),
            tenant: self.tenant(),
            identity: &self.identity,
            conversation: self.conversation(),
            app: &self.app,
            blocks: request.blocks,
            in_timeline: request.in_timeline,
            available_tokens: request.available_tokens,
            tokens: request.tokens,
            reach: &self.reach,
        })
        .await
    }

    async fn toolset(&self) -> turnpike_agent::Result<Toolset> {
        let Some(spec) = &self.spec else {
            return Ok(Toolset::default());
        };
        if spec.mcp.is_empty() {
            return Ok(spec.tools.clone());
        }
        let mut never = vec![self.env.config.workspace_root.clone()];
        if let Ok(cell) = &self.env.cell {
            never.push(cell.scratch().to_path_buf());
        }
        let grants = crate::mcp::Grants {
            outbound: &self.env.config.outbound,
            roots: &self.env.config.mcp_read_roots,
            never: &never,
        };
        let sender = crate::mcp::Sender {
            connections: self.env.connections.as_ref(),
            tenant: self.env.record.prefix().tenant(),
            identity: &self.identity,
            app: self.app.as_str(),
        };
        self.mcp
            .toolset(
                spec,
                self.workspace.path(),
                &self.env.cell,
                &grants,
                &sender,
            )
            .await
            .map_err(turnpike_agent::Error::app)
    }

    async fn run_tool(
        &self,
        tools: &Toolset,
        call: &ToolCallRequest,
    ) -> turnpike_agent::Result<(bool, ToolOutput)> {
        if tools.side_effects(&call.name) {
            self.commit_intent(&call.id, &call.name, &call.arguments)
                .await?;
        }
        let cx = self.tool_context(&call.id);
        if let Some(spec) = &self.spec {
            if let Some(done) = crate::a2a::call(
                &cx,
                &spec.a2a,
                &self.env.config.outbound,
                &call.name,
                &call.arguments,
            )
            .await
            {
                return Ok(done);
            }
        }
        if let Some(done) = self
            .mcp
            .call(&cx, tools, &call.name, call.arguments.clone())
            .await
        {
            return Ok(done);
        }
        Ok(crate::tools::run_call(
            &self.env.tools,
            tools,
            &cx,
            &call.id,
            &call.name,
            call.arguments.clone(),
        )
        .await)
    }

    async fn restore_workspace(&self) -> std::result::Result<(), String> {
        let cx = self.tool_context("restore");
        let Some(handle) = &cx.project else {
            return Ok(());
        };
        if handle.base.is_none() {
            return Ok(());
        }
        handle
            .get()
            .await?
            .materialise(None, None)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}
