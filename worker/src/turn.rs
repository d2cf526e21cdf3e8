//! One turn: batch one (its inputs, any `ingress_directive`, and `turn_dispatched`) commits
//! before anything runs; the app's callback works, folding in what arrives on the lane
//! (committed before it is seen); the turn log is written; batch two (replies, tool calls and
//! results, and `turn_complete` with the log's digest) closes the turn.

use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};
use tracing::{info, warn};
use turnpike_artifactory::{Files, Head, Record, RecordSigner, TurnLogs};
use turnpike_resolver::Resolver;
use turnpike_router::bus::{now_ms, Bus, LaneMessage};
use turnpike_schemas::entry::{
    AgentSwitched, ApprovalRequest, ApprovalResolved, AssistantMessage, Cancelled,
    CompactionMarker, ErrorEntry, IngressDirective, QuestionRequest, ToolCall, ToolResult,
    TurnAmbiguous, TurnComplete, TurnDispatched, TurnOutcome,
};
use turnpike_schemas::live::LiveFrame;
use turnpike_schemas::turnlog::TURN_LOG_VERSION;
use turnpike_schemas::{
    AgentId, AppId, Block, EntryBody, Event, EventBody, Family, Identity, RefPath, Reference,
    TurnId, TurnLog, WorkerId,
};

use crate::apps::{AgentSpec, Apps, OnNewMessage};
use crate::config::WorkerConfig;
use crate::error::{Error, Result};
use crate::timeline::Timeline;
use crate::tools::{ProjectHandle, SearchIndex, ToolContext};
use crate::workspace::Workspace;
use turnpike_artifactory::git::{Lineage, Project};

/// What a turn needs from its owner.
pub struct TurnEnv {
    pub worker: WorkerId,
    pub bus: Arc<dyn Bus>,
    pub record: Record,
    pub turn_logs: TurnLogs,
    pub files: Files,
    pub resolver: Resolver,
    pub search: Option<Arc<dyn SearchIndex>>,
    /// Where the turn goes to be indexed once complete.
    pub indexing: Option<turnpike_index::indexer::IndexQueue>,
    pub cell: Result<Arc<crate::cell::Cell>, String>,
    pub signer: RecordSigner,
    pub apps: Arc<Apps>,
    pub directory: turnpike_artifactory::Directory,
    /// Where a sweep finds turns left open: marked before the first batch one of a drain,
    /// cleared when the drain ends with every turn closed and promoted.
    pub open_turns: turnpike_artifactory::OpenTurns,
    /// Where lane messages that cannot be taken are set aside.
    pub dead_letters: turnpike_artifactory::DeadLetters,
    /// Whether this owner has marked the conversation (and not cleared the mark since).
    pub marked: std::sync::atomic::AtomicBool,
    /// The owner's lease deadline: fenced writes check it first.
    pub fence: crate::fence::Fence,
    pub config: WorkerConfig,
}

impl TurnEnv {
    /// Appends a batch at `head`; a moved head means another owner wrote: this one is fenced.
    /// Entries the record refuses are [`Error::Refused`]. Once committed, clients are told (a "new rows" tick).
    pub async fn append(&self, head: &Head, bodies: &[EntryBody]) -> Result<Head> {
        self.fence.check()?;
        let head = self
            .record
            .append(&self.signer, head, bodies)
            .await
            .map_err(Error::from_append)?;
        let tick = LiveFrame::Rows {
            through: head.leaves(),
        };
        self.bus
            .live(self.record.prefix().conversation(), tick.to_bytes().into())
            .await;
        Ok(head)
    }

    /// Clears the conversation's open-turn mark once its turn is closed (best effort: a stale
    /// mark only costs a sweep one head read).
    /// Marks the conversation for the sweep, once per drain (before its first batch one).
    async fn ensure_marked(&self) -> Result<()> {
        use std::sync::atomic::Ordering;
        if !self.marked.load(Ordering::Acquire) {
            self.open_turns.mark(self.record.prefix()).await?;
            self.marked.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Clears the mark at the end of a drain that left every turn closed and promoted.
    pub async fn end_drain(&self) {
        if self.marked.load(std::sync::atomic::Ordering::Acquire) {
            self.clear_open_mark().await;
        }
    }

    async fn clear_open_mark(&self) {
        // A superseded owner must not clear the mark the new owner set for its own turn.
        if self.fence.check().is_err() {
            return;
        }
        self.marked
            .store(false, std::sync::atomic::Ordering::Release);
        if let Err(e) = self.open_turns.clear(self.record.prefix()).await {
            warn!(conversation = %self.record.prefix().conversation(), error = %e, "could not clear the open-turn mark");
        }
    }
}

/// Whether `event`, arriving while a turn of `identity` runs, is folded into it: follow-ups,
/// steers, answers and attachments of the same identity, and a stop from anyone. A new message
/// starts the next turn, and so do another participant's words: one participant never drives a
/// turn (and its tools) that runs as another.
pub fn folds_into(identity: &Identity, event: &Event) -> bool {
    match event.body {
        EventBody::Message { .. } => false,
        EventBody::Stop { .. } => true,
        _ => &event.address.identity == identity,
    }
}

/// Why a running turn is asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopCause {
    /// A `stop` event on the lane (a user or client pressed stop).
    Requested,
    /// A new message arrived and the agent's policy is `on_new_message = "interrupt"`.
    Superseded,
}

impl StopCause {
    /// The reason recorded on the cancelled turn, when there is one to show.
    fn reason(self) -> Option<String> {
        match self {
            StopCause::Requested => None,
            StopCause::Superseded => Some("superseded by a new message".into()),
        }
    }
}

/// Watches the lane while a turn runs: counts arrivals and notices a stop.
///
/// Contract: the stop signal is raised only by a `stop` event (or, under the `interrupt`
/// policy, by a new message). The watch ending — a new message reached under the `queue`
/// policy, the turn finishing — is never a stop: receivers treat a closed channel as "nothing
/// more will come", not as an event.
struct LaneWatch {
    arrivals: watch::Receiver<u64>,
    stop: watch::Receiver<Option<StopCause>>,
    task: tokio::task::JoinHandle<()>,
}

impl LaneWatch {
    fn start(
        bus: Arc<dyn Bus>,
        env: &TurnEnv,
        after: u64,
        policy: OnNewMessage,
        identity: Identity,
    ) -> Self {
        let conversation = env.record.prefix().conversation();
        let every = env.config.lane_poll;
        let (count_tx, arrivals) = watch::channel(0u64);
        let (stop_tx, stop) = watch::channel(None);
        let task = tokio::spawn(async move {
            let mut cursor = after;
            let mut count = 0;
            loop {
                tokio::time::sleep(every).await;
                let messages = match bus.read_lane(conversation, cursor, None, 64).await {
                    Ok(messages) => messages,
                    // A message this binary cannot read: the owner parks it after the turn;
                    // nothing behind it concerns this one.
                    Err(e) if e.kind() == turnpike_router::ErrorKind::Unreadable => return,
                    Err(_) => continue,
                };
                for m in messages {
                    // A new message belongs to the next turn: nothing after it concerns this
                    // one. It waits its turn, unless the agent asked to be interrupted.
                    if matches!(m.event.body, EventBody::Message { .. }) {
                        if policy == OnNewMessage::Interrupt {
                            let _ = stop_tx.send(Some(StopCause::Superseded));
                        }
                        return;
                    }
                    // Another participant's words start a turn of their own, after this one.
                    if !folds_into(&identity, &m.event) {
                        return;
                    }
                    cursor = m.seq;
                    count += 1;
                    let _ = count_tx.send(count);
                    if matches!(m.event.body, EventBody::Stop { .. }) {
                        let _ = stop_tx.send(Some(StopCause::Requested));
                        return;
                    }
                }
            }
        });
        Self {
            arrivals,
            stop,
            task,
        }
    }

    /// Why the turn was asked to stop, if it was.
    fn cause(&self) -> Option<StopCause> {
        *self.stop.borrow()
    }
}

impl Drop for LaneWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The turn as an app's callback sees it. Methods take `&self`: tools, the agent loop and the
/// lane can all use the turn at once.
pub struct TurnContext<'a> {
    env: &'a TurnEnv,
    turn: TurnId,
    /// This attempt at the turn (a fresh random id): the key its side objects are written
    /// under until the record commits it.
    attempt: u64,
    app: AppId,
    agent: AgentId,
    spec: Option<Arc<AgentSpec>>,
    identity: Identity,
    workspace: Workspace,
    inputs: Vec<Event>,
    directive: Option<IngressDirective>,
    head: Mutex<Head>,
    blocks: Mutex<Vec<Block>>,
    /// The timeline the turn was built on, once asked for; the snapshot after the turn extends it.
    timeline: Mutex<Option<Timeline>>,
    /// Every agent of the turn's app.
    app_agents: Vec<AgentId>,
    /// Side-effecting calls whose intent was committed before they ran.
    intents: Mutex<std::collections::HashSet<String>>,
    /// The compaction this turn made, for batch two.
    compaction: Mutex<Option<CompactionMarker>>,
    /// The conversation's project lineage, the version the turn started from, and the project
    /// directory once opened.
    lineage: Lineage,
    base_version: Option<git2::Oid>,
    project: tokio::sync::OnceCell<Project>,
    /// What the turn may bring in from other conversations (all participants may see it).
    reach: crate::reach::Reach,
    /// Whether a tool hosted a file (written under the attempt, promoted after commit).
    hosted: std::sync::atomic::AtomicBool,
    watch: LaneWatch,
    deltas: mpsc::UnboundedSender<String>,
}

impl TurnContext<'_> {
    /// The turn being run.
    pub fn turn(&self) -> TurnId {
        self.turn
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
        let arrived = self
            .env
            .bus
            .read_lane(conversation, head.state().lane_through, None, 64)
            .await;
        let arrived = match arrived {
            Ok(arrived) => arrived,
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
            if let Some(block) = input_block(&event.body) {
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

/// The turn-log block of an input event.
pub fn input_block(body: &EventBody) -> Option<Block> {
    match body {
        EventBody::Message { text } => Some(Block::UserMessage { text: text.clone() }),
        EventBody::FollowUp { text } => Some(Block::FollowUp { text: text.clone() }),
        EventBody::Steer { text } => Some(Block::Steer { text: text.clone() }),
        EventBody::Stop { reason } => Some(Block::Stop {
            reason: reason.clone(),
        }),
        EventBody::Attachment {
            name,
            media_type,
            reference,
            ..
        } => Some(Block::Attachment {
            name: name.clone(),
            media_type: media_type.clone(),
            reference: reference.clone(),
        }),
        _ => None,
    }
}

/// Opens a new turn over `inputs` (batch one), then runs it to completion.
pub async fn run_new_turn(
    env: &TurnEnv,
    head: Head,
    inputs: Vec<LaneMessage>,
    epoch: u64,
) -> Result<Head> {
    let turn = TurnId::new(head.state().last_turn + 1).expect("turn numbers start at 1");
    // The agent the conversation was last switched to, else the one it was opened with.
    let agent: AgentId = head.state().active_agent.clone().unwrap_or_else(|| {
        inputs
            .first()
            .map(|m| m.event.address.agent.clone())
            .expect("a turn has at least one input")
    });
    let mut bodies: Vec<EntryBody> = inputs
        .iter()
        .map(|m| EntryBody::input(m.event.clone(), Some(m.seq)))
        .collect();
    if let Some(directive) = inputs.iter().find_map(|m| m.event.directive.clone()) {
        bodies.push(EntryBody::IngressDirective(directive));
    }
    bodies.push(EntryBody::TurnDispatched(TurnDispatched {
        turn,
        worker: env.worker,
        agent: agent.clone(),
        epoch,
        at_ms: now_ms(),
    }));
    // The mark goes first: a record that ends in an open turn always has one for the sweep.
    env.ensure_marked().await?;
    let head = match env.append(&head, &bodies).await {
        Ok(head) => head,
        // Inputs the record refuses can never be taken: set them aside, visibly, once.
        Err(Error::Refused(why)) => {
            let letters = inputs
                .iter()
                .map(|m| crate::parking::Letter::of_event(m, &why))
                .collect();
            return crate::parking::park(env, &head, letters).await;
        }
        Err(e) => return Err(e),
    };
    info!(conversation = %env.record.prefix().conversation(), %turn, worker = %env.worker, "turn dispatched");
    let place = format!("{} {turn}", env.record.prefix().conversation());
    env.config.failpoints.hit("after-batch-one", &place).await;
    let events = inputs.into_iter().map(|m| m.event).collect();
    let directive = bodies.iter().find_map(|b| match b {
        EntryBody::IngressDirective(d) => Some(d.clone()),
        _ => None,
    });
    finish_turn(env, head, turn, agent, events, directive, new_attempt()).await
}

/// A fresh attempt id: unique across workers and restarts (the random part of a ULID), so no
/// two attempts at a turn ever share the keys their side objects are written under.
fn new_attempt() -> u64 {
    ulid::Ulid::new().0 as u64
}

/// Re-runs the open turn under the same turn id (its worker died between the batches), as a
/// new attempt.
pub async fn recover_turn(env: &TurnEnv, head: Head, epoch: u64) -> Result<Head> {
    let Some((turn, entries)) = env.record.open_turn(&head).await? else {
        return Ok(head);
    };
    let agent = entries
        .iter()
        .find_map(|e| match &e.body {
            EntryBody::TurnDispatched(d) if d.turn == turn => Some(d.agent.clone()),
            _ => None,
        })
        .expect("open_turn returns the dispatch");
    let events: Vec<Event> = entries
        .iter()
        .filter_map(|e| e.body.as_input().map(|i| i.event.clone()))
        .collect();
    let directive = entries.iter().find_map(|e| match &e.body {
        EntryBody::IngressDirective(d) => Some(d.clone()),
        _ => None,
    });
    // A side-effecting call that started and has no committed result: its effect is unknown.
    // Quarantine the turn; never run the call again.
    let unanswered = entries.iter().find_map(|e| match &e.body {
        EntryBody::ToolCall(c)
            if c.side_effects
                && !entries.iter().any(
                    |r| matches!(&r.body, EntryBody::ToolResult(res) if res.call_id == c.call_id),
                ) =>
        {
            Some(c.clone())
        }
        _ => None,
    });
    if let Some(call) = unanswered {
        warn!(conversation = %env.record.prefix().conversation(), %turn, tool = %call.tool,
              "a side-effecting call was interrupted; quarantining the turn");
        // What the interrupted attempt may have left is not part of any committed turn.
        env.turn_logs.discard(env.record.prefix(), turn).await?;
        let body = EntryBody::TurnAmbiguous(TurnAmbiguous {
            turn,
            tool: call.tool.clone(),
            call_id: call.call_id.clone(),
            reason: format!(
                "the worker stopped after {} started and before its result was recorded; it is not run again: decide whether it took effect",
                call.tool
            ),
        });
        return env.append(&head, &[body]).await;
    }
    warn!(conversation = %env.record.prefix().conversation(), %turn, epoch, "recovering a turn left open");
    finish_turn(env, head, turn, agent, events, directive, new_attempt()).await
}

async fn finish_turn(
    env: &TurnEnv,
    head: Head,
    turn: TurnId,
    agent: AgentId,
    inputs: Vec<Event>,
    directive: Option<IngressDirective>,
    attempt: u64,
) -> Result<Head> {
    let conversation = env.record.prefix().conversation();
    let first = inputs.first().expect("a turn has at least one input");
    let app = first.address.app.clone();
    let identity = first.address.identity.clone();
    let route = env.apps.route(env.record.prefix().tenant(), &app, &agent);
    let app_agents = env.apps.agents_of(&app);
    let workspace =
        Workspace::create(&env.config.workspace_root, conversation, turn).map_err(|e| {
            Error::Workspace(format!(
                "cannot create a workspace under {}: {e}",
                env.config.workspace_root.display()
            ))
        })?;
    let reach =
        crate::reach::Reach::new(&env.directory, env.record.prefix().tenant(), conversation);
    let blocks: Vec<Block> = inputs.iter().filter_map(|e| input_block(&e.body)).collect();
    let input_count = blocks.len();
    let (delta_tx, mut delta_rx) = mpsc::unbounded_channel::<String>();
    let forwarder = {
        let bus = env.bus.clone();
        tokio::spawn(async move {
            while let Some(text) = delta_rx.recv().await {
                let frame = LiveFrame::Delta { turn, text };
                bus.live(conversation, frame.to_bytes().into()).await;
            }
        })
    };
    let lane_through = head.state().lane_through;
    let lineage = Lineage::new(env.files.store().clone(), env.record.prefix().clone());
    let spec = route.as_ref().ok().and_then(|r| r.agent.clone());
    let policy = spec
        .as_ref()
        .map_or(OnNewMessage::Queue, |s| s.on_new_message);
    let base_version = head
        .state()
        .version
        .as_deref()
        .and_then(|v| git2::Oid::from_str(v).ok());
    let watch = LaneWatch::start(env.bus.clone(), env, lane_through, policy, identity.clone());
    let ctx = TurnContext {
        env,
        turn,
        attempt,
        app,
        agent: agent.clone(),
        spec,
        identity,
        workspace,
        inputs,
        directive,
        head: Mutex::new(head),
        blocks: Mutex::new(blocks),
        timeline: Mutex::new(None),
        app_agents,
        intents: Mutex::new(Default::default()),
        compaction: Mutex::new(None),
        lineage,
        base_version,
        project: tokio::sync::OnceCell::new(),
        reach,
        hosted: Default::default(),
        watch,
        deltas: delta_tx,
    };
    let result = match &route {
        Ok(route) => route.callbacks.on_reactive_event(&ctx).await,
        Err(why) => Err(Error::Route(why.clone())),
    };
    let (outcome, mut failure) = match result {
        Ok(outcome) => (outcome, None),
        Err(Error::Fenced(why)) => return Err(Error::Fenced(why)),
        Err(e) => (TurnOutcome::Failed, Some(e.to_string())),
    };
    // A successful (or parked) turn publishes the project's next version; a failed or cancelled
    // one publishes nothing.
    let mut version = None;
    if failure.is_none() && matches!(outcome, TurnOutcome::Replied | TurnOutcome::Parked) {
        // What generated code left must be plain files within the quota before any of it is
        // committed (or even opened): a FIFO, a link or a huge tree fails the turn instead.
        let root = ctx.workspace.path().to_path_buf();
        let quota = env.config.workspace_quota;
        match tokio::task::spawn_blocking(move || crate::workspace::audit(&root, quota)).await {
            Ok(Ok(_)) => {}
            Ok(Err(why)) => failure = Some(why),
            Err(e) => failure = Some(format!("checking the workspace failed: {e}")),
        }
    }
    if failure.is_none() && matches!(outcome, TurnOutcome::Replied | TurnOutcome::Parked) {
        match publish_version(&ctx).await {
            Ok(v) => version = v,
            Err(Error::Fenced(why)) => return Err(Error::Fenced(why)),
            Err(e) => failure = Some(format!("publishing the project version failed: {e}")),
        }
    }
    let outcome = if failure.is_some() {
        TurnOutcome::Failed
    } else {
        outcome
    };
    let TurnContext {
        head,
        blocks,
        timeline,
        workspace,
        watch,
        deltas,
        spec,
        intents,
        compaction,
        identity,
        hosted,
        ..
    } = ctx;
    let hosted = hosted.into_inner();
    let intents = intents.into_inner().expect("intents lock");
    let stop_cause = watch.cause();
    drop(watch);
    drop(deltas);
    let _ = forwarder.await;
    let head = head.into_inner().expect("head lock");
    let blocks = blocks.into_inner().expect("blocks lock");
    if let Err(e) = workspace.remove().await {
        warn!(%conversation, %turn, error = %e, "could not remove the turn's workspace");
    }
    let side_effects = |tool: &str| spec.as_ref().is_some_and(|s| s.tools.side_effects(tool));
    let mut bodies: Vec<EntryBody> = compaction
        .into_inner()
        .expect("compaction lock")
        .map(EntryBody::CompactionMarker)
        .into_iter()
        .collect();
    bodies.extend(
        blocks
            .iter()
            .skip(input_count)
            .filter(|b| !matches!(b, Block::ToolCall { call_id, .. } if intents.contains(call_id)))
            .filter_map(|b| turn_entry(turn, b, &identity, &side_effects)),
    );
    let log = TurnLog {
        version: TURN_LOG_VERSION,
        conversation,
        turn,
        agent,
        outcome,
        blocks,
    };
    env.fence.check()?;
    let digest = env
        .turn_logs
        .write_attempt(env.record.prefix(), &log, attempt)
        .await?;
    let mut snapshot = None;
    if let Some(before) = timeline.into_inner().expect("timeline lock") {
        // What the next turn's rebuild reads in one fetch: bounded by what its agent could use.
        let budget = spec
            .as_ref()
            .map_or(u64::MAX, |s| 2 * u64::from(s.context_length));
        let after = crate::timeline::snapshot_after(
            &before,
            env.record.prefix(),
            turn,
            &log.blocks,
            budget,
        );
        env.fence.check()?;
        env.turn_logs
            .write_context_attempt(env.record.prefix(), &after, attempt)
            .await?;
        snapshot = Some(after);
    }
    match (outcome, failure) {
        (_, Some(message)) => bodies.push(EntryBody::Error(ErrorEntry {
            turn: Some(turn),
            message,
        })),
        (TurnOutcome::Cancelled, None) => bodies.push(EntryBody::Cancelled(Cancelled {
            turn,
            reason: stop_cause.and_then(StopCause::reason),
        })),
        _ => {}
    }
    bodies.push(EntryBody::TurnComplete(TurnComplete {
        turn,
        outcome,
        log: Some(Reference::new(
            Family::turn_log(),
            conversation,
            turn,
            RefPath::parse("log.json").expect("a valid path"),
        )),
        log_sha256: Some(digest),
        version: version.map(|v: git2::Oid| v.to_string()),
        attempt: Some(attempt),
        at_ms: now_ms(),
    }));
    let place = format!("{conversation} {turn}");
    env.config.failpoints.hit("before-batch-two", &place).await;
    let head = env.append(&head, &bodies).await?;
    info!(%conversation, %turn, ?outcome, "turn complete");
    env.config.failpoints.hit("before-promotion", &place).await;
    // Committed: this attempt's objects become the turn's. Should this fail (or the worker
    // die first), the mark stays and whoever next owns the conversation finishes it.
    if let Err(e) = promote(env, turn, attempt, version, &log, snapshot.as_ref(), hosted).await {
        // Committed but not promoted: stop here, mark kept, so that whoever owns the
        // conversation next finishes this promotion before any other turn runs.
        warn!(%conversation, %turn, error = %e, "promotion unfinished; the next owner finishes it");
        return Err(e);
    }
    if let Some(queue) = &env.indexing {
        queue.push(conversation);
    }
    Ok(head)
}

/// Commits the workspace over the version the turn started from; returns the turn's version
/// (the new commit, or the unchanged base). Nothing is published as the turn's ref here: the
/// ref is created only for the version the record's `turn_complete` names, after the commit
/// ([`promote`]), so a failed or superseded attempt's commit is never reachable through it.
async fn publish_version(ctx: &TurnContext<'_>) -> Result<Option<git2::Oid>> {
    ctx.env.fence.check()?;
    let empty = std::fs::read_dir(ctx.workspace.path()).map_or(true, |mut d| d.next().is_none());
    if empty && ctx.project.get().is_none() {
        // Nothing made and nothing opened: the project (if any) is unchanged.
        return Ok(ctx.base_version);
    }
    let project = ctx
        .project
        .get_or_try_init(|| {
            Project::open(ctx.lineage.clone(), ctx.workspace.path(), ctx.base_version)
        })
        .await?;
    let message = format!(
        "{}\n\nconversation {}, agent {}",
        ctx.turn,
        ctx.env.record.prefix().conversation(),
        ctx.agent
    );
    ctx.env.fence.check()?;
    project
        .commit_if_any(ctx.turn, &message)
        .await
        .map_err(Into::into)
}

/// Promotes a committed attempt: its side objects to the turn's canonical keys, its version
/// to the turn's git ref (and the mirror, when configured).
async fn promote(
    env: &TurnEnv,
    turn: TurnId,
    attempt: u64,
    version: Option<git2::Oid>,
    log: &TurnLog,
    snapshot: Option<&turnpike_schemas::timeline::ContextSnapshot>,
    hosted: bool,
) -> Result<()> {
    let prefix = env.record.prefix();
    // The log and snapshot are still in hand: promote them without reading them back. Only a
    // turn that hosted files needs the listing of what its attempt wrote.
    env.turn_logs.promote(prefix, log, snapshot).await?;
    if hosted {
        turnpike_artifactory::attempts::promote(env.files.store(), prefix, turn, attempt).await?;
    }
    let Some(version) = version else {
        return Ok(());
    };
    let lineage = Lineage::new(env.files.store().clone(), prefix.clone());
    lineage.publish_ref_once(turn, version).await?;
    if let Some(url) = &env.config.git_remote {
        if let Err(e) = turnpike_artifactory::git::push_to_remote(&lineage, url, turn).await {
            warn!(%turn, remote = %url, error = %e, "could not push the version to the git remote");
        }
    }
    Ok(())
}

/// Takes over what a previous owner left marked, before anything else in a drain: its mark
/// becomes this owner's (cleared when this drain ends), and a committed turn whose promotion
/// it left undone (it died between the commit and the promotion) is promoted now.
pub async fn finish_promotion(env: &TurnEnv, head: &Head) -> Result<()> {
    if !env.open_turns.is_marked(env.record.prefix()).await? {
        return Ok(());
    }
    env.marked.store(true, std::sync::atomic::Ordering::Release);
    if head.state().turn_open {
        // Recovered first; the mark stays until this drain ends.
        return Ok(());
    }
    turnpike_artifactory::attempts::finish_latest(env.files.store(), &env.record, head).await?;
    env.clear_open_mark().await;
    Ok(())
}

/// The record entry of a block the turn produced, for those that have one.
fn turn_entry(
    turn: TurnId,
    block: &Block,
    identity: &Identity,
    side_effects: &dyn Fn(&str) -> bool,
) -> Option<EntryBody> {
    match block {
        Block::AssistantMessage { text } => Some(EntryBody::AssistantMessage(AssistantMessage {
            turn,
            text: text.clone(),
        })),
        Block::ToolCall {
            call_id,
            tool,
            arguments,
        } => Some(EntryBody::ToolCall(ToolCall {
            turn,
            call_id: call_id.clone(),
            tool: tool.clone(),
            arguments: arguments.clone(),
            side_effects: side_effects(tool),
        })),
        Block::ToolResult {
            call_id,
            ok,
            output,
        } => Some(EntryBody::ToolResult(ToolResult {
            turn,
            call_id: call_id.clone(),
            ok: *ok,
            output: output.clone(),
        })),
        Block::ApprovalRequest {
            request_id,
            tool,
            arguments,
            approvers,
            ..
        } => Some(EntryBody::ApprovalRequest(ApprovalRequest {
            turn,
            request_id: *request_id,
            tool: tool.clone(),
            arguments: arguments.clone(),
            approvers: approvers.clone(),
        })),
        Block::ApprovalResponse {
            request_id,
            approved,
            by,
            reason,
            automatic,
            refused,
        } => Some(EntryBody::ApprovalResolved(ApprovalResolved {
            turn,
            request_id: *request_id,
            approved: *approved,
            by: by.clone(),
            reason: reason.clone(),
            automatic: *automatic,
            refused: refused.clone(),
        })),
        Block::QuestionRequest {
            request_id,
            question,
            ..
        } => Some(EntryBody::QuestionRequest(QuestionRequest {
            turn,
            request_id: *request_id,
            question: question.clone(),
        })),
        Block::AgentSwitched { from, to } => Some(EntryBody::AgentSwitched(AgentSwitched {
            from: from.clone(),
            to: to.clone(),
            by: identity.clone(),
        })),
        _ => None,
    }
}
