//! The end of a turn: the workspace audited, the version published, batch two committed, and
//! the committed attempt's objects promoted.

use std::sync::Mutex;

use tokio::sync::mpsc;
use tracing::{info, warn};
use turnpike_artifactory::Head;
use turnpike_router::bus::now_ms;
use turnpike_schemas::entry::{Cancelled, ErrorEntry, IngressDirective, TurnComplete, TurnOutcome};
use turnpike_schemas::live::LiveFrame;
use turnpike_schemas::turnlog::TURN_LOG_VERSION;
use turnpike_schemas::{
    AgentId, Block, EntryBody, Event, Family, RefPath, Reference, TurnId, TurnLog,
};

use crate::apps::OnNewMessage;
use crate::error::{Error, Result};
use crate::workspace::Workspace;
use turnpike_artifactory::git::{Lineage, Project};

use super::context::TurnContext;
use super::lane_watch::{LaneWatch, StopCause};
use super::TurnEnv;
pub(super) async fn finish_turn(
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
    let spec = route.as_ref().ok().and_then(|r| r.agent.clone());
    let policy = spec
        .as_ref()
        .map_or(OnNewMessage::Queue, |s| s.on_new_message);
    let base_version = head.state().version;
    let watch = LaneWatch::start(env.bus.clone(), env, lane_through, policy, identity.clone());
    let ctx = TurnContext {
        env,
        turn,
        attempt,
        app: app.clone(),
        agent: agent.clone(),
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
    };
    // A spent budget refuses the turn before it calls anything: its inputs are taken, the
    // reason recorded, nothing run.
    let refused = match turnpike_router::usage::check_budgets(
        env.bus.as_ref(),
        &env.config.budgets,
        env.record.prefix().tenant(),
        &app,
    )
    .await
    {
        Ok(refused) => refused,
        // Unknown spend is not spend: a ledger that cannot be read does not stop turns.
        Err(e) => {
            warn!(%conversation, %turn, error = %e, "could not read the usage ledger; budgets not checked");
            None
        }
    };
    let result = match (&route, refused) {
        (_, Some(why)) => {
            crate::metrics::budget_refusal();
            Err(Error::refused(why))
        }
        (Ok(route), None) => route.callbacks.on_reactive_event(&ctx).await,
        (Err(why), None) => Err(Error::route(why.clone())),
    };
    let (outcome, mut failure) = match result {
        Ok(outcome) => (outcome, None),
        Err(e) if e.is_fenced() => return Err(e),
        Err(e) => (TurnOutcome::Failed, Some(e.to_string())),
    };
    // A successful (or parked) turn publishes the project's next version; a failed or cancelled
    // one publishes nothing.
    let mut version = None;
    if failure.is_none() && matches!(outcome, TurnOutcome::Replied | TurnOutcome::Parked) {
        // What generated code left must be plain files within the quota before any of it is
        // committed (or even opened): a FIFO, a link or a huge tree fails the turn instead.
        if let Some(why) = ctx.workspace.error() {
            failure = Some(why.to_owned());
        } else if ctx.workspace.is_made() {
            let root = ctx.workspace.path().to_path_buf();
            let quota = env.config.workspace_quota;
            match tokio::task::spawn_blocking(move || crate::workspace::audit(&root, quota)).await {
                Ok(Ok(_)) => {}
                Ok(Err(why)) => failure = Some(why),
                Err(e) => failure = Some(format!("checking the workspace failed: {e}")),
            }
        }
    }
    if failure.is_none() && matches!(outcome, TurnOutcome::Replied | TurnOutcome::Parked) {
        match publish_version(&ctx).await {
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
        usage,
        calls,
        exchange,
        ..
    } = ctx;
    let turn_usage = usage.into_inner().expect("usage lock");
    let calls = calls.into_inner().expect("calls lock");
    let exchange = exchange.into_inner().expect("exchange lock");
    let hosted = hosted.into_inner();
    let intents = intents.into_inner().expect("intents lock");
    let stop_cause = watch.cause();
    env.lane.lock().expect("lane lock").quiet_through = watch.seen().quiet_through;
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
            .filter_map(|b| EntryBody::from_block(turn, b, &identity, &side_effects)),
    );
    let log = TurnLog {
        version: TURN_LOG_VERSION,
        conversation,
        turn,
        agent,
        outcome,
        blocks,
        usage: turn_usage,
        exchange,
        unindexed: spec.as_ref().is_some_and(|s| !s.index),
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
    // What the model calls used, whatever became of the turn: they were made.
    let usage = crate::usage::entries(turn, &calls, env.config.prices.as_deref());
    bodies.extend(usage.iter().cloned());
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
        version,
        attempt: Some(attempt),
        at_ms: now_ms(),
    }));
    let place = format!("{conversation} {turn}");
    env.config.failpoints.hit("before-batch-two", &place).await;
    let head = env.append(&head, &bodies).await?;
    info!(%conversation, %turn, ?outcome, "turn complete");
    count_usage(env, &app, &usage).await;
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

/// Adds a committed turn's usage to the ledger's counters (its tenant's, its app's in the
/// tenant), today. After the commit and only then: a turn is never counted twice; an owner
/// that dies here leaves it out (see [`turnpike_router::usage`]).
async fn count_usage(env: &TurnEnv, app: &turnpike_schemas::AppId, usage: &[EntryBody]) {
    if usage.is_empty() {
        return;
    }
    let mut totals = crate::usage::totals(usage.iter().filter_map(|b| match b {
        EntryBody::Usage(u) => Some(u),
        _ => None,
    }));
    totals.turns = 1;
    let tenant = env.record.prefix().tenant().clone();
    let day = turnpike_router::usage::Day::today();
    for scope in [
        turnpike_router::usage::UsageScope::Tenant(tenant.clone()),
        turnpike_router::usage::UsageScope::App(tenant, app.clone()),
    ] {
        if let Err(e) = env.bus.add_usage(&scope, day, &totals).await {
            warn!(conversation = %env.record.prefix().conversation(), error = %e, "could not add the turn's usage to the ledger");
        }
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

/// Promotes a committed attempt: its side objects to the turn's canonical keys, its version
/// to the turn's git ref (and the mirror, when configured).
async fn promote(
    env: &TurnEnv,
    turn: TurnId,
    attempt: u64,
    version: Option<turnpike_schemas::ProjectVersion>,
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
