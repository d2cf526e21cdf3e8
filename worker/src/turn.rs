//! One turn: batch one (its inputs and `turn_dispatched`) commits before anything runs; the
//! agent works, folding in what arrives on the lane (committed before it is seen); the turn
//! log is written; batch two (replies and `turn_complete`) closes the turn.

use std::sync::Arc;

use tracing::{info, warn};
use turnpike_artifactory::{Head, Record, RecordSigner, TurnLogs};
use turnpike_router::bus::{now_ms, Bus, LaneMessage};
use turnpike_schemas::entry::{
    AssistantMessage, Cancelled, ErrorEntry, TurnComplete, TurnDispatched, TurnOutcome,
};
use turnpike_schemas::turnlog::TURN_LOG_VERSION;
use turnpike_schemas::{
    AgentId, Block, EntryBody, Event, EventBody, Family, RefPath, Reference, TurnId, TurnLog,
    WorkerId,
};

use crate::agent::Agent;
use crate::config::{Fault, WorkerConfig};
use crate::error::{Error, Result};
use crate::workspace::Workspace;

/// What a turn needs from its owner.
pub struct TurnEnv {
    pub worker: WorkerId,
    pub bus: Arc<dyn Bus>,
    pub record: Record,
    pub turn_logs: TurnLogs,
    pub signer: RecordSigner,
    pub agent: Arc<dyn Agent>,
    pub config: WorkerConfig,
}

impl TurnEnv {
    /// Appends a batch at `head`; a moved head or a refused entry means another owner wrote:
    /// this one is fenced.
    pub async fn append(&self, head: &Head, bodies: &[EntryBody]) -> Result<Head> {
        self.record
            .append(&self.signer, head, bodies)
            .await
            .map_err(Error::from_append)
    }
}

/// The turn as the agent sees it.
pub struct TurnContext<'a> {
    env: &'a TurnEnv,
    turn: TurnId,
    workspace: Workspace,
    inputs: Vec<Event>,
    head: Head,
    replies: Vec<String>,
    blocks: Vec<Block>,
}

impl TurnContext<'_> {
    /// The turn being run.
    pub fn turn(&self) -> TurnId {
        self.turn
    }

    /// The turn's private directory, deleted when the turn ends.
    pub fn workspace(&self) -> &std::path::Path {
        self.workspace.path()
    }

    /// The events committed in batch one.
    pub fn inputs(&self) -> &[Event] {
        &self.inputs
    }

    /// How many model and tool rounds the turn may take.
    pub fn max_rounds(&self) -> u32 {
        self.env.config.max_rounds
    }

    /// Adds a reply to the turn.
    pub fn say(&mut self, text: String) {
        self.blocks
            .push(Block::AssistantMessage { text: text.clone() });
        self.replies.push(text);
    }

    /// The events that arrived on the lane since the last commit — follow-ups, steers, stops —
    /// committed to the record before they are returned. A new `message` is not folded in: it
    /// starts the next turn.
    pub async fn fold_arrivals(&mut self) -> Result<Vec<Event>> {
        let conversation = self.env.record.prefix().conversation();
        let arrived = self
            .env
            .bus
            .read_lane(conversation, self.head.state().lane_through, None, 64)
            .await?;
        let folded: Vec<LaneMessage> = arrived
            .into_iter()
            .take_while(|m| !matches!(m.event.body, EventBody::Message { .. }))
            .collect();
        if folded.is_empty() {
            return Ok(Vec::new());
        }
        let bodies: Vec<EntryBody> = folded
            .iter()
            .map(|m| EntryBody::input(m.event.clone(), Some(m.seq)))
            .collect();
        self.head = self.env.append(&self.head, &bodies).await?;
        let events: Vec<Event> = folded.into_iter().map(|m| m.event).collect();
        for event in &events {
            if let Some(block) = input_block(&event.body) {
                self.blocks.push(block);
            }
        }
        Ok(events)
    }
}

fn input_block(body: &EventBody) -> Option<Block> {
    match body {
        EventBody::Message { text } => Some(Block::UserMessage { text: text.clone() }),
        EventBody::FollowUp { text } => Some(Block::FollowUp { text: text.clone() }),
        EventBody::Steer { text } => Some(Block::Steer { text: text.clone() }),
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
    let agent: AgentId = inputs
        .first()
        .map(|m| m.event.address.agent.clone())
        .expect("a turn has at least one input");
    let mut bodies: Vec<EntryBody> = inputs
        .iter()
        .map(|m| EntryBody::input(m.event.clone(), Some(m.seq)))
        .collect();
    bodies.push(EntryBody::TurnDispatched(TurnDispatched {
        turn,
        worker: env.worker,
        agent: agent.clone(),
        epoch,
        at_ms: now_ms(),
    }));
    let head = env.append(&head, &bodies).await?;
    info!(conversation = %env.record.prefix().conversation(), %turn, worker = %env.worker, "turn dispatched");
    match env.config.fault {
        Some(Fault::HangAfterBatchOne) => {
            eprintln!(
                "fault: hanging after batch one of {} {turn}",
                env.record.prefix().conversation()
            );
            std::future::pending::<()>().await;
        }
        Some(Fault::PauseAfterBatchOne) => {
            eprintln!(
                "fault: pausing after batch one of {} {turn}",
                env.record.prefix().conversation()
            );
            tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        }
        _ => {}
    }
    let events = inputs.into_iter().map(|m| m.event).collect();
    finish_turn(env, head, turn, agent, events).await
}

/// Re-runs the open turn under the same turn id (its worker died between the batches).
pub async fn recover_turn(env: &TurnEnv, head: Head) -> Result<Head> {
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
    warn!(conversation = %env.record.prefix().conversation(), %turn, "recovering a turn left open");
    finish_turn(env, head, turn, agent, events).await
}

async fn finish_turn(
    env: &TurnEnv,
    head: Head,
    turn: TurnId,
    agent: AgentId,
    inputs: Vec<Event>,
) -> Result<Head> {
    let blocks = inputs.iter().filter_map(|e| input_block(&e.body)).collect();
    let conversation = env.record.prefix().conversation();
    let workspace =
        Workspace::create(&env.config.workspace_root, conversation, turn).map_err(|e| {
            Error::Workspace(format!(
                "cannot create a workspace under {}: {e}",
                env.config.workspace_root.display()
            ))
        })?;
    let mut ctx = TurnContext {
        env,
        turn,
        workspace,
        inputs,
        head,
        replies: Vec::new(),
        blocks,
    };
    let (outcome, failure) = match env.agent.run(&mut ctx).await {
        Ok(outcome) => (outcome, None),
        Err(Error::Fenced(why)) => return Err(Error::Fenced(why)),
        Err(e) => (TurnOutcome::Failed, Some(e.to_string())),
    };
    let TurnContext {
        head,
        replies,
        blocks,
        workspace,
        ..
    } = ctx;
    if let Err(e) = workspace.remove().await {
        warn!(%conversation, %turn, error = %e, "could not remove the turn's workspace");
    }
    let log = TurnLog {
        version: TURN_LOG_VERSION,
        conversation,
        turn,
        agent,
        outcome,
        blocks,
    };
    env.turn_logs.write(env.record.prefix(), &log).await?;
    let mut bodies: Vec<EntryBody> = replies
        .into_iter()
        .map(|text| EntryBody::AssistantMessage(AssistantMessage { turn, text }))
        .collect();
    match (outcome, failure) {
        (_, Some(message)) => bodies.push(EntryBody::Error(ErrorEntry {
            turn: Some(turn),
            message,
        })),
        (TurnOutcome::Cancelled, None) => {
            bodies.push(EntryBody::Cancelled(Cancelled { turn, reason: None }))
        }
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
        at_ms: now_ms(),
    }));
    let head = env.append(&head, &bodies).await?;
    info!(%conversation, %turn, ?outcome, "turn complete");
    Ok(head)
}
