//! The end of a turn: the workspace audited, the version published, batch two committed, and
//! the committed attempt's objects promoted.

use std::sync::Mutex;

use tokio::sync::mpsc;
use tracing::{info, warn};
use turnpike_artifactory::{Head, Record};
use turnpike_router::bus::now_ms;
use turnpike_schemas::entry::{Cancelled, ErrorEntry, IngressDirective, TurnComplete, TurnOutcome};
use turnpike_schemas::live::LiveFrame;
use turnpike_schemas::turnlog::TURN_LOG_VERSION;
use turnpike_schemas::{
    AgentId, Block, EntryBody, Event, Family, RefPath, Reference, TurnId, TurnLog,
};

use crate::error::{Error, Result};
use crate::workspace::Workspace;
use turnpike_agent::apps::OnNewMessage;
use turnpike_artifactory::git::{Lineage, Project};

use super::context::TurnContext;
use super::lane_watch::{LaneWatch, StopCause};
use super::opening::{Opening, Upcoming};
use super::TurnEnv;
/// A turn after its batch one, through its batch two (DESIGN's life of a turn, steps 6–9): the
/// turn's context is opened, the app does the work, what the workspace holds is checked and
/// published as the project's next version, the turn log is written under the attempt, batch two
/// is committed — with the next turn's batch one when `upcoming` has it ready — and the
/// attempt's objects are promoted (the context snapshot written beside). Returns the head and
/// that next turn, opened.
#[allow(clippy::too_many_arguments)]
pub(super) async fn finish_turn(
    env: &TurnEnv,
    head: Head,
    turn: TurnId,
    agent: AgentId,
    inputs: Vec<Event>,
    directive: Option<IngressDirective>,
    attempt: u64,
    upcoming: &mut dyn Upcoming,
) -> Result<(Head, Option<Opening>)> {
    let app = inputs
        .first()
        .expect("a turn has at least one input")
        .address
        .app
        .clone();
    let route = env.apps.route(env.record.prefix().tenant(), &app, &agent);
    let spec = route.as_ref().ok().and_then(|r| r.agent.clone());
    let opened = open(env, head, turn, agent, inputs, directive, attempt, spec)?;
    let (outcome, failure) = work(env, &opened.ctx, &route).await?;
    let (outcome, failure, version) = keep_workspace(&opened.ctx, outcome, failure).await?;
    let ended = Ended::take(opened).await;
    commit(env, ended, outcome, failure, version, upcoming).await
}

/// A turn's context, open.
struct Opened<'a> {
    ctx: TurnContext<'a>,
    /// Forwards the turn's streamed text to the conversation's live stream until the context
    /// is taken apart.
    forwarder: tokio::task::JoinHandle<()>,
    /// How many of the turn's blocks are its inputs (committed in batch one).
    input_count: usize,
}

/// Opens the turn's context: its workspace (made on first use), its lane watch, its stream of
/// text, the project it starts from.
#[allow(clippy::too_many_arguments)]
fn open(
    env: &TurnEnv,
    head: Head,
    turn: TurnId,
    agent: AgentId,
    inputs: Vec<Event>,
    directive: Option<IngressDirective>,
    attempt: u64,
    spec: Option<std::sync::Arc<turnpike_agent::AgentSpec>>,
) -> Result<Opened<'_>> {
    let conversation = env.record.prefix().conversation();
    let first = inputs.first().expect("a turn has at least one input");
    let app = first.address.app.clone();
    let identity = first.address.identity.clone();
    let app_agents = env.apps.agents_of(&app);
    // Made when the turn first uses it (most replies never do); its root is checked now, so a
    // worker that cannot keep workspaces at all stops before anything runs (and the turn is
    // retried), as when every workspace was made up front.
    std::fs::create_dir_all(&env.config.workspace_root).map_err(|e| {
        Error::workspace(format!(
            "cannot create a workspace under {}: {e}",
            env.config.workspace_root.display()
        ))
    })?;
    let workspace = Workspace::new(&env.config.workspace_root, conversation, turn);
    let reach =
        crate::reach::Reach::new(&env.directory, env.record.prefix().tenant(), conversation);
    let blocks: Vec<Block> = inputs
        .iter()
        .filter_map(|e| Block::from_event(&e.body))
        .collect();
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
    let policy = spec
        .as_ref()
        .map_or(OnNewMessage::Queue, |s| s.on_new_message);
    let base_version = head.state().version;
    let watch = LaneWatch::start(env.bus.clone(), env, lane_through, policy, identity.clone());
    let ctx = TurnContext {
        env,
        turn,
        attempt,
        app,
        agent,
        spec,
        identity,
        workspace,
        inputs,
        directive,
        head: Mutex::new(head),
        blocks: Mutex::new(blocks),
        usage: Mutex::new(None),
        calls: Mutex::new(Vec::new()),
        exchange: Mutex::new(None),
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
        mcp: Default::default(),
    };
    Ok(Opened {
        ctx,
        forwarder,
        input_count,
    })
}

/// The work of the turn: the app's callback (the built-in agent loop unless the app brings its
/// own), after a budget check. A fenced turn stops here; any other failure ends the turn
/// `failed` with its reason.
async fn work(
    env: &TurnEnv,
    ctx: &TurnContext<'_>,
    route: &std::result::Result<turnpike_agent::apps::Route, String>,
) -> Result<(TurnOutcome, Option<String>)> {
    // A spent budget refuses the turn before it calls anything: its inputs are taken, the
    // reason recorded, nothing run.
    let refused = match turnpike_router::usage::check_budgets(
        env.bus.as_ref(),
        &env.config.budgets,
        env.record.prefix().tenant(),
        &ctx.app,
    )
    .await
    {
        Ok(refused) => refused,
        // Unknown spend is not spend: a ledger that cannot be read does not stop turns.
        Err(e) => {
            warn!(conversation = %ctx.env.record.prefix().conversation(), turn = %ctx.turn, error = %e, "could not read the usage ledger; budgets not checked");
            None
        }
    };
    let result = match (route, refused) {
        (_, Some(why)) => {
            crate::metrics::budget_refusal();
            Err(Error::refused(why))
        }
        (Ok(route), None) => route
            .callbacks
            .on_reactive_event(ctx)
            .await
            .map_err(Error::from),
        (Err(why), None) => Err(Error::route(why.clone())),
    };
    match result {
        Ok(outcome) => Ok((outcome, None)),
        Err(e) if e.is_fenced() => Err(e),
        Err(e) => Ok((TurnOutcome::Failed, Some(e.to_string()))),
    }
}

/// What the workspace holds, kept: a successful (or parked) turn's workspace must be plain
/// files within the quota, and becomes the project's next version; a failed or cancelled turn
/// publishes nothing. Returns the turn's outcome (failed if either step failed), its failure
/// and its version.
async fn keep_workspace(
    ctx: &TurnContext<'_>,
    outcome: TurnOutcome,
    mut failure: Option<String>,
) -> Result<(
    TurnOutcome,
    Option<String>,
    Option<turnpike_schemas::ProjectVersion>,
)> {
    let kept = failure.is_none() && matches!(outcome, TurnOutcome::Replied | TurnOutcome::Parked);
    if !kept {
        let outcome = if failure.is_some() {
            TurnOutcome::Failed
        } else {
            outcome
        };
        return Ok((outcome, failure, None));
    }
    // What generated code left must be plain files within the quota before any of it is
    // committed (or even opened): a FIFO, a link or a huge tree fails the turn instead.
    if let Some(why) = ctx.workspace.error() {
        failure = Some(why.to_owned());
    } else if ctx.workspace.is_made() {
        let root = ctx.workspace.path().to_path_buf();
        let quota = ctx.env.config.workspace_quota;
        match tokio::task::spawn_blocking(move || crate::workspace::audit(&root, quota)).await {
            Ok(Ok(_)) => {}
            Ok(Err(why)) => failure = Some(why),
            Err(e) => failure = Some(format!("checking the workspace failed: {e}")),
        }
    }
    let mut version = None;
    if failure.is_none() {
        match publish_version(ctx).await {
            Ok(v) => version = v,
            Err(e) if e.is_fenced() => return Err(e),
            Err(e) => failure = Some(format!("publishing the project version failed: {e}")),
        }
    }
    let outcome = if failure.is_some() {
        TurnOutcome::Failed
    } else {
        outcome
    };
    Ok((outcome, failure, version))
}

/// What is left of a turn once its context is taken apart (its workspace removed, its stream
/// of text flushed): what batch two is made of.
struct Ended {
    head: Head,
    turn: TurnId,
    attempt: u64,
    app: turnpike_schemas::AppId,
    agent: AgentId,
    identity: turnpike_schemas::Identity,
    /// What sent the turn's first input when no person did (a session's turn).
    origin: Option<turnpike_schemas::Origin>,
    spec: Option<std::sync::Arc<turnpike_agent::AgentSpec>>,
    input_count: usize,
    blocks: Vec<Block>,
    timeline: Option<turnpike_agent::timeline::Timeline>,
    usage: Option<turnpike_schemas::turnlog::Usage>,
    calls: Vec<turnpike_agent::model::CallUsage>,
    exchange: Option<turnpike_schemas::turnlog::Exchange>,
    compaction: Option<turnpike_schemas::entry::CompactionMarker>,
    intents: std::collections::HashSet<String>,
    hosted: bool,
    stop_cause: Option<StopCause>,
}

impl Ended {
    async fn take(opened: Opened<'_>) -> Ended {
        let Opened {
            ctx,
            forwarder,
            input_count,
        } = opened;
        let env = ctx.env;
        let TurnContext {
            head,
            turn,
            attempt,
            app,
            agent,
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
            usage,
            calls,
            exchange,
            inputs,
            ..
        } = ctx;
        let origin = inputs.first().and_then(|e| e.origin.clone());
        let stop_cause = watch.cause();
        env.lane.lock().expect("lane lock").quiet_through = watch.seen().quiet_through;
        drop(watch);
        drop(deltas);
        let _ = forwarder.await;
        if let Err(e) = workspace.remove().await {
            let conversation = env.record.prefix().conversation();
            warn!(%conversation, %turn, error = %e, "could not remove the turn's workspace");
        }
        Ended {
            head: head.into_inner().expect("head lock"),
            turn,
            attempt,
            app,
            agent,
            identity,
            origin,
            spec,
            input_count,
            blocks: blocks.into_inner().expect("blocks lock"),
            timeline: timeline.into_inner().expect("timeline lock"),
            usage: usage.into_inner().expect("usage lock"),
            calls: calls.into_inner().expect("calls lock"),
            exchange: exchange.into_inner().expect("exchange lock"),
            compaction: compaction.into_inner().expect("compaction lock"),
            intents: intents.into_inner().expect("intents lock"),
            hosted: hosted.into_inner(),
            stop_cause,
        }
    }
}

/// Writes the turn log under the attempt, commits batch two (with the next turn's batch one,
/// when `upcoming` has it), counts the usage and promotes the attempt, writing the context
/// snapshot beside it (DESIGN steps 7–9).
async fn commit(
    env: &TurnEnv,
    ended: Ended,
    outcome: TurnOutcome,
    failure: Option<String>,
    version: Option<turnpike_schemas::ProjectVersion>,
    upcoming: &mut dyn Upcoming,
) -> Result<(Head, Option<Opening>)> {
    let conversation = env.record.prefix().conversation();
    let (turn, attempt) = (ended.turn, ended.attempt);
    let mut bodies = done_entries(&ended);
    let failure_text = failure.clone();
    let log = TurnLog {
        version: TURN_LOG_VERSION,
        conversation,
        turn,
        agent: ended.agent.clone(),
        outcome,
        blocks: ended.blocks,
        usage: ended.usage,
        exchange: ended.exchange,
        unindexed: ended.spec.as_ref().is_some_and(|s| !s.index),
    };
    env.fence.check()?;
    let digest = env
        .turn_logs
        .write_attempt(env.record.prefix(), &log, attempt)
        .await?;
    // What the model calls used, whatever became of the turn: they were made.
    let usage = crate::usage::entries(turn, &ended.calls, env.config.prices.as_deref());
    bodies.extend(usage.iter().cloned());
    match (outcome, failure) {
        (_, Some(message)) => bodies.push(EntryBody::Error(ErrorEntry {
            turn: Some(turn),
            message,
        })),
        (TurnOutcome::Cancelled, None) => bodies.push(EntryBody::Cancelled(Cancelled {
            turn,
            reason: ended.stop_cause.and_then(StopCause::reason),
        })),
        _ => {}
    }
    // The completion's time: also its webhook message's (the same when a promotion is redone).
    let completed_ms = now_ms();
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
        version,
        attempt: Some(attempt),
        at_ms: completed_ms,
    }));
    // Marked before the commit: a sender who connects the moment the card is committed finds
    // the mark (a mark whose card never commits resumes nothing: its answer is refused).
    if outcome == TurnOutcome::Parked {
        crate::mcp::mark_waiting(env, ended.app.as_str(), &ended.identity, &log.blocks).await;
    }
    let place = format!("{conversation} {turn}");
    env.config.failpoints.hit("before-batch-two", &place).await;
    let (head, next) = append_closing(env, &ended.head, &bodies, upcoming).await?;
    info!(%conversation, %turn, ?outcome, "turn complete");
    // The turn is over: a slot this owner owes goes to the next wake now, not after the
    // promotion and the release below (this owner then starts no more turns) — unless the
    // next turn, opened with this batch two, holds it already.
    let gave_up = next.is_none() && env.turn_slot.give_up_if_owed();
    tracing::debug!(target: crate::dispatch::WAKES, %conversation, gave_up, "turn committed");
    let snapshot = ended
        .timeline
        .as_ref()
        .map(|before| snapshot(env, before, &log, ended.spec.as_deref()));
    count_usage(env, &ended.app, &usage).await;
    env.config.failpoints.hit("before-promotion", &place).await;
    // Committed: this attempt's objects become the turn's. Should this fail (or the worker
    // die first), the mark stays and whoever next owns the conversation finishes it.
    let hosted = ended.hosted;
    let promoted = async {
        let log_moved =
            promote(env, turn, attempt, version, &log, snapshot.as_ref(), hosted).await?;
        // Part of the promotion: its subscribers are told (again, by whoever finishes it).
        let facts = crate::webhooks::TurnFacts {
            record: &env.record,
            tenant: env.record.prefix().tenant(),
            app: &ended.app,
            agent: &ended.agent,
            conversation,
            sender: &ended.identity,
            origin: ended.origin.as_ref(),
            log: &log,
            failure: failure_text.as_deref(),
            at_ms: completed_ms,
        };
        env.notifier.turn_ended(&facts).await?;
        Ok::<bool, Error>(log_moved)
    };
    let log_moved = match promoted.await {
        Ok(moved) => moved,
        Err(e) => {
            // Committed but not promoted: stop here, mark kept, so that whoever owns the
            // conversation next finishes this promotion before any other turn runs.
            warn!(%conversation, %turn, error = %e, "promotion unfinished; the next owner finishes it");
            return Err(e);
        }
    };
    let left = Promoted {
        turn,
        attempt,
        snapshot: snapshot.is_some(),
        hosted,
        log_moved,
    };
    clear_after_promotion(env, left);
    if let Some(queue) = &env.indexing {
        queue.push(conversation);
    }
    Ok((head, next))
}

/// Appends a turn's batch two at `head`, with the next turn's batch one after it when
/// `upcoming` has one ready for the state the batch two leaves. Should the record refuse the
/// two together, the batch one's inputs go back and the batch two is appended alone (a turn
/// is never left open for its successor's sake).
async fn append_closing(
    env: &TurnEnv,
    head: &Head,
    bodies: &[EntryBody],
    upcoming: &mut dyn Upcoming,
) -> Result<(Head, Option<Opening>)> {
    let mut after = head.state().clone();
    let applies = bodies
        .iter()
        .all(|b| turnpike_artifactory::record::state::apply(&mut after, b).is_ok());
    let Some(opening) = applies.then(|| upcoming.take(env, &after)).flatten() else {
        return Ok((env.append(head, bodies).await?, None));
    };
    let both: Vec<EntryBody> = bodies.iter().chain(&opening.bodies).cloned().collect();
    match env.append(head, &both).await {
        Ok(head) => Ok((head, Some(opening))),
        Err(e) if e.kind() == crate::error::ErrorKind::Refused => {
            upcoming.give_back(opening);
            Ok((env.append(head, bodies).await?, None))
        }
        Err(e) => Err(e),
    }
}

/// What the turn did, as record entries: the compaction it made, then its blocks past its
/// inputs (a side-effecting call whose intent is committed already is not recorded twice).
fn done_entries(ended: &Ended) -> Vec<EntryBody> {
    let side_effects = |tool: &str| {
        ended
            .spec
            .as_ref()
            .is_some_and(|s| s.tools.side_effects(tool))
    };
    let mut bodies: Vec<EntryBody> = ended
        .compaction
        .clone()
        .map(EntryBody::CompactionMarker)
        .into_iter()
        .collect();
    bodies.extend(
        ended
            .blocks
            .iter()
            .skip(ended.input_count)
            .filter(|b| !matches!(b, Block::ToolCall { call_id, .. } if ended.intents.contains(call_id)))
            .filter_map(|b| EntryBody::from_block(ended.turn, b, &ended.identity, &side_effects)),
    );
    bodies
}

/// The snapshot the next turn's rebuild reads in one fetch: the timeline this turn was built
/// on and its own blocks, bounded by what its agent could use. Written with the promotion.
fn snapshot(
    env: &TurnEnv,
    before: &turnpike_agent::timeline::Timeline,
    log: &TurnLog,
    spec: Option<&turnpike_agent::AgentSpec>,
) -> turnpike_schemas::timeline::ContextSnapshot {
    let budget = spec.map_or(u64::MAX, |s| 2 * u64::from(s.context_length));
    crate::timeline::snapshot_after(before, env.record.prefix(), log.turn, &log.blocks, budget)
}

/// Adds a committed turn's usage to the ledger's counters (its tenant's, its app's in the
/// tenant), today. After the commit and only then: a turn is never counted twice; an owner
/// that dies here leaves it out (see [`turnpike_router::usage`]).
async fn count_usage(env: &TurnEnv, app: &turnpike_schemas::AppId, usage: &[EntryBody]) {
    if usage.is_empty() {
        return;
    }
    let mut totals =
        turnpike_router::usage::UsageTotals::of_entries(usage.iter().filter_map(|b| match b {
            EntryBody::Usage(u) => Some(u),
            _ => None,
        }));
    totals.turns = 1;
    let tenant = env.record.prefix().tenant().clone();
    let day = turnpike_router::usage::Day::today();
    let scopes = [
        turnpike_router::usage::UsageScope::Tenant(tenant.clone()),
        turnpike_router::usage::UsageScope::App(tenant, app.clone()),
    ];
    // At once: one wait for the bus, not two in a row (one group commit on the embedded bus).
    let added =
        futures::future::join_all(scopes.iter().map(|s| env.bus.add_usage(s, day, &totals))).await;
    for e in added.into_iter().filter_map(std::result::Result::err) {
        warn!(conversation = %env.record.prefix().conversation(), error = %e, "could not add the turn's usage to the ledger");
    }
}

/// Commits the workspace over the version the turn started from; returns the turn's version
/// (the new commit, or the unchanged base). Nothing is published as the turn's ref here: the
/// ref is created only for the version the record's `turn_complete` names, after the commit
/// ([`promote`]), so a failed or superseded attempt's commit is never reachable through it.
async fn publish_version(
    ctx: &TurnContext<'_>,
) -> Result<Option<turnpike_schemas::ProjectVersion>> {
    ctx.env.fence.check()?;
    // A workspace never used holds nothing (asking for its path would make it).
    let empty = !ctx.workspace.is_made()
        || std::fs::read_dir(ctx.workspace.path()).map_or(true, |mut d| d.next().is_none());
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

/// What a promoted turn may have left to clear (see [`clear_after_promotion`]).
struct Promoted {
    turn: TurnId,
    attempt: u64,
    /// It wrote a context snapshot: the one before it is no longer read.
    snapshot: bool,
    /// It hosted files: its attempt holds more than its log.
    hosted: bool,
    /// Its log was moved out of the attempt, not copied.
    log_moved: bool,
}

/// Once a turn is promoted, in the background, off the turn's path: deletes the attempt's own
/// copies of what was promoted (see `attempts::clear`) and the snapshot the turn before left
/// (only the latest is read; keeping each would store a conversation's context once per turn,
/// its storage growing with the square of its length). A delete that fails (or a worker that
/// dies first) leaves a dead object, never a wrong context. A turn whose log was moved and
/// that hosted nothing and wrote no snapshot leaves nothing: no task at all.
fn clear_after_promotion(env: &TurnEnv, left: Promoted) {
    let Promoted {
        turn,
        attempt,
        snapshot,
        hosted,
        log_moved,
    } = left;
    if log_moved && !hosted && !snapshot {
        return;
    }
    let (logs, prefix) = (env.turn_logs.clone(), env.record.prefix().clone());
    let store = env.files.store().clone();
    tokio::spawn(async move {
        let conversation = prefix.conversation();
        // The log is the attempt's only object unless it hosted files (the snapshot goes under
        // no attempt: see `TurnLogs::put_context`); moved, it is not there either.
        let written = [prefix.turn_log(turn)];
        let named = match (hosted, log_moved) {
            (true, _) => None,
            (false, false) => Some(written.as_slice()),
            (false, true) => Some(&[][..]),
        };
        if let Err(e) =
            turnpike_artifactory::attempts::clear(&store, &prefix, turn, attempt, named).await
        {
            tracing::debug!(%conversation, %turn, error = %e, "an attempt's copies stay");
        }
        let Some(previous) = turn.number().checked_sub(1).and_then(TurnId::new) else {
            return;
        };
        if snapshot {
            if let Err(e) = logs.forget_context(&prefix, previous).await {
                tracing::debug!(%conversation, turn = %previous, error = %e,
                    "an older context snapshot stays");
            }
        }
    });
}

/// Promotes a committed attempt: its side objects to the turn's canonical keys, its version
/// to the turn's git ref (and the mirror, when configured). Returns whether the log was moved
/// out of the attempt (see `TurnLogs::promote`).
async fn promote(
    env: &TurnEnv,
    turn: TurnId,
    attempt: u64,
    version: Option<turnpike_schemas::ProjectVersion>,
    log: &TurnLog,
    snapshot: Option<&turnpike_schemas::timeline::ContextSnapshot>,
    hosted: bool,
) -> Result<bool> {
    let prefix = env.record.prefix();
    // The log and snapshot are still in hand: written without reading them back, at once (one
    // group commit where the store has them). The snapshot is a cache: one not written means
    // a rebuild from the logs, not an unfinished promotion. Only a turn that hosted files
    // needs the listing of what its attempt wrote.
    let cached = async {
        let Some(snapshot) = snapshot else { return };
        if let Err(e) = env.turn_logs.put_context(prefix, snapshot).await {
            warn!(conversation = %prefix.conversation(), %turn, error = %e,
                "the context snapshot was not written; the next turn rebuilds from the logs");
        }
    };
    let (promoted, ()) = tokio::join!(env.turn_logs.promote(prefix, log, attempt), cached);
    let log_moved = promoted?;
    if hosted {
        turnpike_artifactory::attempts::promote(env.files.store(), prefix, turn, attempt).await?;
    }
    let Some(version) = version else {
        return Ok(log_moved);
    };
    let lineage = Lineage::new(env.files.store().clone(), prefix.clone());
    lineage.publish_ref_once(turn, version).await?;
    if let Some(url) = &env.config.git_remote {
        if let Err(e) = turnpike_artifactory::git::push_to_remote(&lineage, url, turn).await {
            warn!(%turn, remote = %url, error = %e, "could not push the version to the git remote");
        }
    }
    Ok(log_moved)
}

/// Takes over what a previous owner left marked, before anything else in a drain: its mark
/// becomes this owner's (cleared when this drain ends), and a committed turn whose promotion
/// it left undone (it died between the commit and the promotion) is promoted now — also when
/// a turn is open after it (opened with its batch two), before that one is recovered.
pub async fn finish_promotion(env: &TurnEnv, head: &Head) -> Result<()> {
    if !env.open_turns.is_marked(env.record.prefix()).await? {
        // Not there, whatever this owner last knew (a drain again after a claim of its own):
        // its next batch one marks first.
        env.marked
            .store(false, std::sync::atomic::Ordering::Release);
        return Ok(());
    }
    env.marked.store(true, std::sync::atomic::Ordering::Release);
    if !head.state().turn_open {
        finish_committed(env, &env.record, head).await?;
        env.clear_open_mark().await;
        return Ok(());
    }
    // A turn is open: recovered first, and the mark stays until this drain ends. An owner
    // finishes a turn's promotion before it opens the next on its own, but one opened with
    // that turn's commit may have lost its owner in between.
    if env.record.opened_with_close(head).await? {
        finish_committed(env, &env.record, head).await?;
    }
    Ok(())
}

/// Finishes the promotion of the latest complete turn of `record` (its owner died between
/// the commit and the end of the promotion): its objects, its version's ref, and its
/// subscribers told, as the promotion would have — the same message (its id and time from
/// the record), enqueued create-only. What only the dead owner had in hand (the failure's
/// text, the input's origin) is read back from the record. Done already, it changes nothing.
pub async fn finish_committed(shared: &super::Shared, record: &Record, head: &Head) -> Result<()> {
    turnpike_artifactory::attempts::finish_latest(shared.files.store(), record, head).await?;
    let Some(turn) = turnpike_artifactory::attempts::latest_complete(head) else {
        return Ok(());
    };
    let Some(end) = record.turn_end(head, turn).await? else {
        return Ok(());
    };
    let Some(first) = end.first_input else {
        return Ok(());
    };
    let prefix = record.prefix();
    let log = shared.turn_logs.read(prefix, turn).await?;
    let facts = crate::webhooks::TurnFacts {
        record,
        tenant: prefix.tenant(),
        app: &first.address.app,
        agent: &log.agent,
        conversation: prefix.conversation(),
        sender: &first.address.identity,
        origin: first.origin.as_ref(),
        log: &log,
        failure: end.error.as_deref(),
        at_ms: end.complete.at_ms,
    };
    shared.notifier.turn_ended(&facts).await?;
    Ok(())
}
