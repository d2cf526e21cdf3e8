//! `turnpike conversation verify | replay | repair | dead-letters | requeue`.

use std::process::ExitCode;

use anyhow::{Context as _, Result};
use turnpike_artifactory::record::TurnView;
use turnpike_artifactory::{DirectoryEntry, Transcript};
use turnpike_schemas::{ConversationId, EntryBody, EventBody, Identity};

use turnpike_agent::replay::WhatIf;

use crate::cli::ConversationCommand;
use crate::env::{now_ms, Env};

pub async fn run(
    global: &crate::cli::Global,
    env: &Env,
    command: ConversationCommand,
) -> Result<ExitCode> {
    match command {
        ConversationCommand::Verify {
            conversation,
            actor,
            incremental,
        } => {
            verify(
                env,
                conversation,
                &actor.tenant,
                &actor.identity,
                incremental,
            )
            .await
        }
        ConversationCommand::Replay {
            conversation,
            actor,
            what_if,
        } => {
            let (entry, record) = env
                .open_for("replay", conversation, &actor.tenant, &actor.identity)
                .await?;
            let transcript = Transcript::from_entries(&record.entries().await?);
            print_transcript(&entry, &transcript);
            println!();
            let same = replay_report(
                env,
                conversation,
                &actor.tenant,
                &actor.identity,
                what_if.as_ref(),
            )
            .await?;
            Ok(if same || what_if.is_some() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        ConversationCommand::Create { actor, app, agent } => {
            let new = turnpike_artifactory::NewConversation {
                tenant: actor.tenant,
                owner: actor.identity,
                app,
                agent,
                at_ms: now_ms(),
                instructions: None,
                started_by: None,
            };
            let (entry, _, _) = env.conversations.create(&env.signer, new).await?;
            println!("{}", entry.conversation);
            Ok(ExitCode::SUCCESS)
        }
        ConversationCommand::Repair {
            conversation,
            actor,
        } => repair(global, env, conversation, &actor.tenant, &actor.identity).await,
        ConversationCommand::List {
            actor,
            app,
            status,
            json,
        } => list(global, env, &actor, app, status, json).await,
        ConversationCommand::Delete {
            conversation,
            actor,
            reason,
        } => {
            delete(
                global,
                env,
                conversation,
                &actor.tenant,
                &actor.identity,
                &reason,
            )
            .await
        }
        ConversationCommand::Export {
            conversation,
            file,
            actor,
        } => {
            export(
                global,
                env,
                conversation,
                &file,
                &actor.tenant,
                &actor.identity,
            )
            .await
        }
        ConversationCommand::Import {
            file,
            expect_key,
            check,
        } => import(global, env, &file, &expect_key, check).await,
        ConversationCommand::DeadLetters {
            conversation,
            actor,
        } => {
            let (entry, _) = env
                .open_for("dead-letters", conversation, &actor.tenant, &actor.identity)
                .await?;
            let letters = env
                .conversations
                .dead_letters()
                .list(&entry.prefix())
                .await?;
            if letters.is_empty() {
                println!("no dead letters in {conversation}");
            }
            for letter in letters {
                let bytes = letter.bytes()?;
                let requeued = match &letter.requeued {
                    Some(r) => format!(" — requeued by {} at lane sequence {}", r.by, r.lane_seq),
                    None => String::new(),
                };
                println!(
                    "lane sequence {} ({} bytes, parked at {} ms): {}{requeued}",
                    letter.lane_seq,
                    bytes.len(),
                    letter.parked_ms,
                    letter.reason
                );
                println!("  {}", String::from_utf8_lossy(&bytes));
            }
            Ok(ExitCode::SUCCESS)
        }
        ConversationCommand::Requeue {
            conversation,
            actor,
            seq,
        } => {
            let (entry, record) = env
                .open_for("requeue", conversation, &actor.tenant, &actor.identity)
                .await?;
            let letters = env.conversations.dead_letters();
            let letter = letters.get(&entry.prefix(), seq).await?;
            // Only a letter the record set aside: one left by an owner that died before it
            // committed the parking was taken by the next owner, and must not run twice.
            let parked = record
                .entries()
                .await?
                .iter()
                .any(|e| matches!(&e.body, EntryBody::LaneParked(p) if p.lane_seq == seq));
            if !parked {
                anyhow::bail!(
                    "lane sequence {seq} is not set aside in the record of {conversation} (its message was taken after all); nothing was requeued"
                );
            }
            if let Some(r) = &letter.requeued {
                anyhow::bail!(
                    "lane sequence {seq} was requeued already by {} (lane sequence {})",
                    r.by,
                    r.lane_seq
                );
            }
            let bus =
                crate::commands::runtime::open_bus(global, env, std::time::Duration::from_secs(30))
                    .await?;
            // Keyed by the letter: a requeue retried after a crash is one message.
            let published = bus
                .republish(
                    conversation,
                    &letter.bytes()?,
                    &format!("dead-letter-{seq}"),
                )
                .await?;
            letters
                .mark_requeued(
                    &entry.prefix(),
                    seq,
                    turnpike_artifactory::dead_letters::Requeued {
                        by: actor.identity.to_string(),
                        at_ms: now_ms(),
                        lane_seq: published.seq,
                    },
                )
                .await?;
            println!(
                "requeued lane sequence {seq} of {conversation} at lane sequence {}",
                published.seq
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Verifies and prints the verdict; exit 0 when intact, 1 when not.
pub async fn verify(
    env: &Env,
    conversation: ConversationId,
    tenant: &turnpike_schemas::TenantId,
    actor: &Identity,
    incremental: bool,
) -> Result<ExitCode> {
    let (_, record) = env.open_for("verify", conversation, tenant, actor).await?;
    let known = env.checkpoint(conversation)?;
    let verdict = match (&known, incremental) {
        (Some(known), true) => record.verify_from(&env.trusted, known).await?,
        (known, _) => record.verify(&env.trusted, known.as_ref()).await?,
    };
    match verdict {
        Ok(report) => {
            println!(
                "verified {conversation}: {} entries in {} batches checked; {} entries, root {}",
                report.entries_checked,
                report.batches_checked,
                report.checkpoint.leaves,
                report.checkpoint.root
            );
            env.save_checkpoint(conversation, &report.checkpoint)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(failure) => {
            println!("FAILED {conversation}: {failure}");
            Ok(ExitCode::from(1))
        }
    }
}

/// Re-runs the committed turns from their recorded outputs (no live model or tool is called),
/// applying `what_if` if given, and prints where each turn matches or diverges. Turn logs are
/// checked against the digests the signed record holds. Returns whether every turn
/// reproduced its record.
pub async fn replay_report(
    env: &Env,
    conversation: ConversationId,
    tenant: &turnpike_schemas::TenantId,
    actor: &Identity,
    what_if: Option<&WhatIf>,
) -> Result<bool> {
    let (entry, _) = env.open_for("replay", conversation, tenant, actor).await?;
    let recorded = env.conversations.recorded_logs(&entry).await?;
    match what_if {
        Some(w) => println!("replay of {conversation} with a what-if ({w:?}):"),
        None => {
            println!("replay of {conversation} (recorded outputs; no model or tool is called):")
        }
    }
    let replays = turnpike_agent::replay::replay(&recorded, what_if).await;
    let mut same = true;
    for r in &replays {
        match &r.divergence {
            None => println!(
                "  {}: reproduced ({} blocks, {}){}",
                r.turn,
                r.blocks.len(),
                format!("{:?}", r.recorded_outcome).to_lowercase(),
                if r.context_changed {
                    " — on a history changed by an earlier divergence; a live model could answer differently"
                } else {
                    ""
                }
            ),
            Some(d) => {
                same = false;
                println!("  DIVERGES: {d}");
            }
        }
    }
    Ok(same)
}

/// Lists a tenant's conversations with their phases, for an admin of that tenant.
async fn list(
    global: &crate::cli::Global,
    env: &Env,
    actor: &crate::cli::Actor,
    app: Option<turnpike_schemas::AppId>,
    status: Option<String>,
    json: bool,
) -> Result<ExitCode> {
    if !env.admins.contains(&actor.identity) {
        anyhow::bail!("listing a tenant's conversations is for its admins (--admin)");
    }
    if let Some(s) = &status {
        anyhow::ensure!(
            turnpike_lifecycle::phases::PHASES.contains(&s.as_str()),
            "--status {s:?}: one of idle, running, waiting, idle_closed, closed"
        );
    }
    let index = if crate::env::index_configured(global) {
        crate::env::open_index(global).await.ok()
    } else {
        None
    };
    let phases = turnpike_lifecycle::phases::list(
        &env.conversations,
        &actor.tenant,
        app.as_ref(),
        status.as_deref(),
        index.as_ref(),
    )
    .await?;
    tracing::warn!(admin = %actor.identity, tenant = %actor.tenant, "conversation list run by an admin");
    if json {
        println!("{}", serde_json::to_string_pretty(&phases)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<31} {:<8} {:<6} {:<16} {:>6}",
        "NAME", "PHASE", "READY", "AGENT", "AGE"
    );
    let now = now_ms();
    for p in &phases {
        println!(
            "{:<31} {:<8} {:<6} {:<16} {:>6}",
            p.conversation,
            p.phase,
            if p.ready { "True" } else { "False" },
            p.agent,
            age(now.saturating_sub(p.created_ms))
        );
        for c in p
            .conditions
            .iter()
            .filter(|c| c.kind == "Degraded" && c.status)
        {
            println!("  Degraded: {}", c.reason);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `42s`, `5m`, `3h`, `2d`, as `kubectl get` shows ages.
fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=119 => format!("{s}s"),
        120..=7_199 => format!("{}m", s / 60),
        7_200..=172_799 => format!("{}h", s / 3_600),
        _ => format!("{}d", s / 86_400),
    }
}

/// Deletes a conversation from every store, as its owner or an admin of its tenant.
async fn delete(
    global: &crate::cli::Global,
    env: &Env,
    conversation: ConversationId,
    tenant: &turnpike_schemas::TenantId,
    actor: &Identity,
    reason: &str,
) -> Result<ExitCode> {
    let (entry, _) = env.open_for("delete", conversation, tenant, actor).await?;
    if entry.owner != *actor && !env.admins.contains(actor) {
        // A grantee sees it, and may not delete it: say nothing more than for a stranger.
        anyhow::bail!("not found: {conversation}");
    }
    let bus =
        crate::commands::runtime::open_bus(global, env, std::time::Duration::from_secs(30)).await?;
    // A deployment with an index must reach it: rows left behind would outlive the deletion.
    // (Asked before opening: opening an embedded index creates its folder.)
    let configured = crate::env::index_configured(global);
    let index = match crate::env::open_index(global).await {
        Ok(index) => Some(index),
        Err(why) if configured => {
            anyhow::bail!("the index is configured but cannot be opened, so its rows could not be deleted: {why}")
        }
        Err(_) => None,
    };
    let failpoints = turnpike_worker::Failpoints::from_env().map_err(anyhow::Error::msg)?;
    let eraser = turnpike_lifecycle::erasure::Eraser::new(env.conversations.clone(), bus, index)
        .with_failpoints(failpoints);
    let tombstone = eraser
        .erase(&entry, &actor.to_string(), reason)
        .await
        .map_err(anyhow::Error::new)?;
    println!(
        "deleted {conversation}: tombstone {}",
        serde_json::to_string(&tombstone)?
    );
    Ok(ExitCode::SUCCESS)
}

/// `conversation export`: the owner's, or an admin's of its tenant (a grantee reads it, and
/// may not take all of it away).
async fn export(
    global: &crate::cli::Global,
    env: &Env,
    conversation: ConversationId,
    file: &std::path::Path,
    tenant: &turnpike_schemas::TenantId,
    actor: &Identity,
) -> Result<ExitCode> {
    let (entry, _) = env.open_for("export", conversation, tenant, actor).await?;
    if entry.owner != *actor && !env.admins.contains(actor) {
        anyhow::bail!("not found: {conversation}");
    }
    let partial = file.with_extension("partial");
    let out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&partial)
        .with_context(|| format!("creating {}", partial.display()))?;
    // On a fleet the lane says whether events wait; the embedded bus belongs to `serve`.
    let lane_last = match &global.nats_url {
        Some(_) => {
            let bus =
                crate::commands::runtime::open_bus(global, env, std::time::Duration::from_secs(30))
                    .await?;
            Some(bus.lane_last(conversation).await?)
        }
        None => None,
    };
    let exported = turnpike_artifactory::archive::export(
        &env.conversations,
        &entry,
        &env.trusted,
        &env.signer,
        lane_last,
        &actor.to_string(),
        out,
    )
    .await;
    let manifest = match exported {
        Ok(manifest) => manifest,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e.into());
        }
    };
    // Never over another file: the archive appears whole or not at all.
    std::fs::hard_link(&partial, file).with_context(|| format!("writing {}", file.display()))?;
    let _ = std::fs::remove_file(&partial);
    println!(
        "exported {conversation} to {}: {} batches, root {}{}",
        file.display(),
        manifest.batches,
        manifest.root,
        if manifest
            .files
            .contains_key(turnpike_artifactory::archive::PROJECT)
        {
            ", with the project bundle"
        } else {
            ""
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// `conversation import`: restores an archive here, then indexes it when there is an index.
async fn import(
    global: &crate::cli::Global,
    env: &Env,
    file: &std::path::Path,
    expect_key: &[String],
    check_only: bool,
) -> Result<ExitCode> {
    let expect_keys = expect_key
        .iter()
        .map(|k| turnpike_artifactory::TrustedKeys::parse_public(k))
        .collect::<std::result::Result<Vec<_>, _>>()
        .context("--expect-key")?;
    let by = format!(
        "operator {}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    );
    let options = turnpike_artifactory::archive::ImportOptions {
        expect_keys,
        check_only,
        by,
    };
    let report =
        turnpike_artifactory::archive::import(&env.conversations, &env.signer, file, options)
            .await?;
    let conversation = report.manifest.entry.conversation;
    if !report.origin_verified {
        eprintln!(
            "warning: the archive's origin is not verified: it is signed by key {}, which nobody vouched for (pass --expect-key with the exporting deployment's public key)",
            report
                .manifest
                .signature
                .as_ref()
                .map(|s| s.key_id.as_str())
                .unwrap_or("?")
        );
    }
    if check_only {
        println!(
            "{} holds {conversation} (tenant {}, owner {}): {} batches verify up to root {}, roots signed by {}",
            file.display(),
            report.manifest.entry.tenant,
            report.manifest.entry.owner,
            report.batches,
            report.manifest.root,
            report.manifest.keys.keys().cloned().collect::<Vec<_>>().join(", ")
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "imported {conversation} (tenant {}, owner {}): {} batches re-signed here, {} objects; original root {}",
        report.manifest.entry.tenant,
        report.manifest.entry.owner,
        report.batches,
        report.objects,
        report.manifest.root
    );
    if crate::env::index_configured(global) {
        let index = crate::env::open_index(global)
            .await
            .map_err(anyhow::Error::msg)?;
        let indexer =
            turnpike_index::indexer::Indexer::new(index, env.conversations.store().clone());
        let turns = indexer.index_conversation(conversation, false).await?;
        println!("indexed {turns} turns");
    }
    Ok(ExitCode::SUCCESS)
}

/// Repairs under the conversation's lease, so that no turn appends while the record is
/// rewritten (a repair cut short is rolled forward by the next owner or the next repair).
async fn repair(
    global: &crate::cli::Global,
    env: &Env,
    conversation: ConversationId,
    tenant: &turnpike_schemas::TenantId,
    actor: &Identity,
) -> Result<ExitCode> {
    let (_, record) = env.open_for("repair", conversation, tenant, actor).await?;
    let bus =
        crate::commands::runtime::open_bus(global, env, std::time::Duration::from_secs(30)).await?;
    let Some(lease) = bus
        .claim(
            conversation,
            turnpike_schemas::WorkerId::new(),
            std::time::Duration::from_secs(300),
        )
        .await?
    else {
        anyhow::bail!(
            "a worker owns {conversation} now; repair it when it is idle (or stop its workers)"
        );
    };
    // Renewed while the repair runs, so that no worker takes the conversation meanwhile (and
    // should one, the repair sees its batches and changes nothing).
    let ttl = std::time::Duration::from_secs(300);
    let (done, mut stop) = tokio::sync::oneshot::channel::<()>();
    let keeper = {
        let (bus, mut held) = (bus.clone(), lease.clone());
        tokio::spawn(async move {
            loop {
                // A renewal in flight runs to its end, so the lease handed back is the latest.
                tokio::select! {
                    _ = &mut stop => return held,
                    _ = tokio::time::sleep(ttl / 5) => {}
                }
                match bus.renew(&held, ttl).await {
                    Ok(renewed) => held = renewed,
                    Err(e) => {
                        eprintln!("warning: the repair's lease could not be renewed: {e}");
                        return held;
                    }
                }
            }
        })
    };
    let report = record.repair(&env.signer, &env.trusted, now_ms()).await;
    let _ = done.send(());
    let lease = keeper.await.unwrap_or(lease);
    let _ = bus.release(&lease).await;
    let report = report?;
    for removed in &report.removed {
        match removed.position {
            Some(p) => println!(
                "removed entry {p} of batch {}: {}",
                removed.batch, removed.reason
            ),
            None => println!("removed batch {}: {}", removed.batch, removed.reason),
        }
    }
    println!(
        "repaired {conversation}: {} entries kept in {} batches (was {} batches); originals kept under record-repaired/{}/",
        report.kept_entries, report.batches_after, report.batches_before, report.backup_stamp
    );
    // History was rewritten on purpose: the old checkpoint no longer applies.
    env.forget_checkpoint(conversation)?;
    Ok(ExitCode::SUCCESS)
}

/// Prints committed turns, then incomplete and quarantined ones apart.
pub fn print_transcript(entry: &DirectoryEntry, transcript: &Transcript) {
    println!(
        "conversation {} (tenant {}, owner {}, app {}, agent {})",
        entry.conversation, entry.tenant, entry.owner, entry.app, entry.agent
    );
    if transcript.committed.is_empty() {
        println!("  no committed turns");
    }
    for view in &transcript.committed {
        print_turn(view);
    }
    if !transcript.incomplete.is_empty() {
        println!("incomplete turns (dispatched, not completed; recovery retries them):");
        for view in &transcript.incomplete {
            print_turn(view);
        }
    }
    if !transcript.quarantined.is_empty() {
        println!("quarantined turns (side effects unknown; need a decision):");
        for view in &transcript.quarantined {
            print_turn(view);
        }
    }
    if !transcript.pending.is_empty() {
        println!(
            "{} input(s) waiting for the next turn",
            transcript.pending.len()
        );
    }
}

fn print_turn(view: &TurnView) {
    let status = match (&view.complete, &view.ambiguous) {
        (_, Some(a)) => format!("ambiguous: {} call {} — {}", a.tool, a.call_id, a.reason),
        (Some(c), None) => format!("{:?}", c.outcome).to_lowercase(),
        (None, None) => "not completed".to_owned(),
    };
    println!("{} [{status}]", view.turn);
    let mut dispatched = false;
    for entry in &view.entries {
        dispatched |= matches!(entry.body, EntryBody::TurnDispatched(_));
        if let Some(line) = describe(&entry.body) {
            // Inputs committed after the dispatch arrived while the turn ran.
            let folded = if dispatched && entry.body.as_input().is_some() {
                "(folded into the running turn) "
            } else {
                ""
            };
            println!("  {folded}{line}");
        }
    }
}

pub fn describe(body: &EntryBody) -> Option<String> {
    if let Some(input) = body.as_input() {
        let who = &input.event.address.identity;
        return Some(match &input.event.body {
            EventBody::Message { text } => format!("user ({who}): {text}"),
            EventBody::FollowUp { text } => format!("follow-up ({who}): {text}"),
            EventBody::Steer { text } => format!("steer ({who}): {text}"),
            EventBody::Attachment {
                name, reference, ..
            } => format!("attachment ({who}): {name} at {reference}"),
            EventBody::ApprovalResponse {
                request_id,
                approve,
                reason,
                ..
            } => format!(
                "{} {request_id} ({who}){}",
                if *approve { "approve" } else { "deny" },
                reason
                    .as_ref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            ),
            EventBody::QuestionResponse { request_id, answer } => {
                format!("answer to {request_id} ({who}): {answer}")
            }
            other => format!("{} ({who})", other.kind_name()),
        });
    }
    match body {
        EntryBody::AssistantMessage(m) => Some(format!("assistant: {}", m.text)),
        EntryBody::ToolCall(c) => Some(format!(
            "tool call {} {}({})",
            c.call_id, c.tool, c.arguments
        )),
        EntryBody::ToolResult(r) => {
            let mut output = r.output.to_string();
            if output.len() > 160 {
                let cut = (0..=160)
                    .rev()
                    .find(|i| output.is_char_boundary(*i))
                    .unwrap_or(0);
                output.truncate(cut);
                output.push('…');
            }
            Some(format!("tool result {} ok={}: {output}", r.call_id, r.ok))
        }
        EntryBody::Error(e) => Some(format!("error: {}", e.message)),
        EntryBody::ApprovalRequest(r) => Some(format!(
            "{} {}: {}({}){}",
            match &r.connection {
                Some(server) => format!("connection to {server} required"),
                None => "approval requested".to_owned(),
            },
            r.request_id,
            r.tool,
            r.arguments,
            if r.approvers.is_empty() {
                String::new()
            } else {
                format!(
                    " — approvers: {}",
                    r.approvers
                        .iter()
                        .map(|a| a.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        )),
        EntryBody::ApprovalResolved(r) => Some(match (&r.refused, r.automatic) {
            (Some(why), _) => format!("approval answer refused for {}: {why}", r.request_id),
            (None, true) => format!("approval {} rejected automatically", r.request_id),
            (None, false) => format!(
                "approval {} {} by {}{}",
                r.request_id,
                if r.approved { "granted" } else { "denied" },
                r.by.as_ref().map(|b| b.to_string()).unwrap_or_default(),
                r.reason
                    .as_ref()
                    .map(|x| format!(": {x}"))
                    .unwrap_or_default()
            ),
        }),
        EntryBody::QuestionRequest(q) => Some(format!("question {}: {}", q.request_id, q.question)),
        EntryBody::AgentSwitched(a) => Some(format!(
            "agent switched from {} to {} by {}",
            a.from, a.to, a.by
        )),
        EntryBody::Recall(r) => Some(match &r.note {
            Some(note) => format!("recall: {note}"),
            None if r.references.is_empty() => "recall: nothing matched".to_owned(),
            None => format!("recalled {}", r.references.join(", ")),
        }),
        EntryBody::CompactionMarker(m) => Some(format!(
            "compacted turns through {} into a summary ({} bytes, model {})",
            m.through,
            m.summary.len(),
            m.model
        )),
        EntryBody::Cancelled(c) => Some(format!(
            "cancelled: {}",
            c.reason.as_deref().unwrap_or("stop")
        )),
        EntryBody::LaneParked(p) => Some(format!(
            "lane message {} set aside as a dead letter: {}",
            p.lane_seq, p.reason
        )),
        EntryBody::IdleClosed(c) => Some(format!(
            "closed as idle: nothing happened for {} s",
            c.after_ms / 1_000
        )),
        EntryBody::Reopened(_) => Some("reopened by the next event".to_owned()),
        _ => None,
    }
}
