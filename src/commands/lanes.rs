//! `turnpike send` and `turnpike tail`: an event onto a lane; committed rows off the record.
//! `turnpike workers`: who is alive in a fleet.
//!
//! While `turnpike serve` runs on the same data directory it holds the embedded bus, so `send`
//! goes through its API instead (`--url`), with the token the data directory's token file
//! holds for `--actor`; without one it says how to get in. (`tail` reads the store, which
//! serve shares.)

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use turnpike_artifactory::{NewConversation, Transcript};
use turnpike_router::Ingress;
use turnpike_schemas::{ConversationId, EntryBody, EventBody};

use crate::cli::{EventKindArg, Global, SendArgs, TailArgs, WorkersArgs};
use crate::commands::conversation::describe;
use crate::commands::runtime::open_bus;
use crate::env::{now_ms, Env};

/// `turnpike workers`: listens to a fleet's heartbeats for a window and lists who spoke.
pub async fn workers(global: &Global, args: WorkersArgs) -> Result<ExitCode> {
    anyhow::ensure!(
        global.nats_url.is_some(),
        "`turnpike workers` lists a fleet's workers: it needs --nats-url (`turnpike serve` runs its workers in its own process)"
    );
    let env = Env::open(global)?;
    let bus = open_bus(global, &env, Duration::from_secs(30)).await?;
    let beats = bus
        .heartbeats(Duration::from_millis(args.window_ms.max(1)))
        .await?;
    let now = now_ms();
    for beat in &beats {
        if args.json {
            println!("{}", serde_json::to_string(beat)?);
        } else {
            println!(
                "{}  owns {} of {} slots  (heard {:.1} s ago)",
                beat.worker,
                beat.owned,
                beat.slots,
                now.saturating_sub(beat.at_ms) as f64 / 1e3
            );
        }
    }
    if beats.is_empty() && !args.json {
        println!("no worker heard from within {} ms", args.window_ms.max(1));
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn send(global: &Global, args: SendArgs) -> Result<ExitCode> {
    let env = Env::open(global)?;
    let bus = match open_bus(global, &env, Duration::from_secs(30)).await {
        Ok(bus) => bus,
        Err(e) if global.nats_url.is_none() && held_by_a_server(&e) => {
            return send_through_api(global, args).await;
        }
        Err(e) => return Err(e),
    };
    let body = match args.kind {
        EventKindArg::Message => EventBody::Message { text: args.text },
        EventKindArg::FollowUp => EventBody::FollowUp { text: args.text },
        EventKindArg::Steer => EventBody::Steer { text: args.text },
        EventKindArg::Stop => EventBody::Stop {
            reason: (!args.text.is_empty()).then_some(args.text),
        },
        EventKindArg::Approve | EventKindArg::Deny => EventBody::ApprovalResponse {
            request_id: args
                .request
                .ok_or_else(|| anyhow::anyhow!("--kind approve|deny needs --request REQ_ID"))?,
            approve: args.kind == EventKindArg::Approve,
            reason: (!args.text.is_empty()).then_some(args.text),
            tool: None,
            arguments: None,
        },
        EventKindArg::Answer => EventBody::QuestionResponse {
            request_id: args
                .request
                .ok_or_else(|| anyhow::anyhow!("--kind answer needs --request REQ_ID"))?,
            answer: args.text,
        },
        EventKindArg::SwitchAgent => EventBody::SwitchAgent {
            agent: args
                .text
                .parse()
                .map_err(|e| anyhow::anyhow!("--text must name the agent: {e}"))?,
        },
        EventKindArg::Compact => EventBody::Compact {},
    };
    let conversation: ConversationId = if args.conversation == "new" {
        let (entry, _, _) = env
            .conversations
            .create(
                &env.signer,
                NewConversation {
                    tenant: args.actor.tenant.clone(),
                    owner: args.actor.identity.clone(),
                    app: "demo".parse()?,
                    agent: "echo".parse()?,
                    at_ms: now_ms(),
                    instructions: None,
                    started_by: None,
                },
            )
            .await?;
        println!("{}", entry.conversation);
        entry.conversation
    } else {
        args.conversation.parse()?
    };
    let ingress = Ingress::new(bus, env.conversations.clone());
    let (event, published) = ingress
        .submit(
            &args.actor.tenant,
            &args.actor.identity,
            conversation,
            body,
            args.idempotency_key,
        )
        .await?;
    println!(
        "accepted {} at lane sequence {}{}",
        event.id,
        published.seq,
        if published.duplicate {
            " (duplicate: accepted before)"
        } else {
            ""
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// Whether opening the embedded bus failed because another process (`turnpike serve`) holds
/// it.
fn held_by_a_server(e: &anyhow::Error) -> bool {
    e.chain()
        .any(|cause| cause.to_string().contains("already open"))
}

/// The token the data directory's token file holds for `identity` in `tenant`.
fn token_for(global: &Global, identity: &str, tenant: &str) -> Option<String> {
    let path = crate::commands::edge::default_tokens_path(global);
    let value: toml::Value = toml::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    value.get("tokens")?.as_array()?.iter().find_map(|t| {
        let same = t.get("identity")?.as_str()? == identity
            && t.get("tenant")
                .and_then(|v| v.as_str())
                .unwrap_or("default")
                == tenant;
        same.then(|| t.get("token")?.as_str().map(str::to_owned))?
    })
}

/// `send` through the API of the server that holds the data directory.
async fn send_through_api(global: &Global, args: SendArgs) -> Result<ExitCode> {
    let (identity, tenant) = (
        args.actor.identity.to_string(),
        args.actor.tenant.to_string(),
    );
    let Some(token) = token_for(global, &identity, &tenant) else {
        anyhow::bail!(
            "a server (`turnpike serve`) holds {}; its API is the way in, but {} holds no token for {identity} in tenant {tenant}: add one there, or send as an identity it has",
            global.data_dir.display(),
            crate::commands::edge::default_tokens_path(global).display()
        );
    };
    eprintln!(
        "a server holds {}: sending through its API at {}",
        global.data_dir.display(),
        args.url
    );
    let client = turnpike_edge::client::Client::new(&args.url, &token);
    let conversation = if args.conversation == "new" {
        let made = client
            .post(
                "/v1/conversations",
                &serde_json::json!({"app": "demo", "agent": "echo"}),
            )
            .await
            .map_err(anyhow::Error::msg)?
            .into_ok()
            .map_err(|e| anyhow::anyhow!("creating a conversation: {e}"))?;
        let id = made["id"].as_str().unwrap_or_default().to_owned();
        println!("{id}");
        id
    } else {
        args.conversation.clone()
    };
    let text = args.text;
    let reason = (!text.is_empty()).then(|| text.clone());
    let request = || {
        args.request
            .as_ref()
            .map(|r| r.to_string())
            .ok_or_else(|| anyhow::anyhow!("--kind {:?} needs --request REQ_ID", args.kind))
    };
    let (path, body) = match args.kind {
        EventKindArg::Message => ("messages".to_owned(), serde_json::json!({"text": text})),
        EventKindArg::FollowUp => ("follow-ups".to_owned(), serde_json::json!({"text": text})),
        EventKindArg::Steer => ("steer".to_owned(), serde_json::json!({"text": text})),
        EventKindArg::Stop => ("stop".to_owned(), serde_json::json!({"reason": reason})),
        EventKindArg::Approve => (
            format!("approvals/{}/approve", request()?),
            serde_json::json!({"reason": reason}),
        ),
        EventKindArg::Deny => (
            format!("approvals/{}/reject", request()?),
            serde_json::json!({"reason": reason}),
        ),
        EventKindArg::Answer => (
            format!("questions/{}/answer", request()?),
            serde_json::json!({"answer": text}),
        ),
        EventKindArg::SwitchAgent => ("agent".to_owned(), serde_json::json!({"agent": text})),
        EventKindArg::Compact => ("compact".to_owned(), serde_json::json!({})),
    };
    let reply = client
        .send(
            reqwest::Method::POST,
            &format!("/v1/conversations/{conversation}/{path}"),
            Some(&body),
            args.idempotency_key.as_deref(),
        )
        .await
        .map_err(anyhow::Error::msg)?;
    if reply.status != 202 {
        anyhow::bail!(
            "the server refused the event ({}): {}",
            reply.status,
            reply.body
        );
    }
    println!(
        "accepted {} at lane sequence {}{}",
        reply.body["event_id"].as_str().unwrap_or("the event"),
        reply.body["lane_seq"].as_u64().unwrap_or_default(),
        if reply.body["duplicate"].as_bool() == Some(true) {
            " (duplicate: accepted before)"
        } else {
            ""
        }
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn tail(global: &Global, args: TailArgs) -> Result<ExitCode> {
    let env = Env::open(global)?;
    let (_, record) = env
        .conversations
        .open(args.conversation, &args.actor.tenant, &args.actor.identity)
        .await?;
    let mut printed = 0u64;
    let deadline = args
        .timeout_secs
        .map(|s| std::time::Instant::now() + Duration::from_secs(s));
    loop {
        let entries = record.entries().await?;
        let from = printed;
        for entry in entries.iter().filter(|e| e.position >= from) {
            if let Some(line) = describe(&entry.body).or_else(|| marker(&entry.body)) {
                println!("{:>6}  {line}", entry.position);
            }
            printed = entry.position + 1;
        }
        if !args.follow {
            return Ok(ExitCode::SUCCESS);
        }
        if let Some(n) = args.until_turns {
            if Transcript::from_entries(&entries).committed.len() as u64 >= n {
                return Ok(ExitCode::SUCCESS);
            }
        }
        if deadline.is_some_and(|d| std::time::Instant::now() > d) {
            eprintln!(
                "tail: gave up after {}s",
                args.timeout_secs.unwrap_or_default()
            );
            return Ok(ExitCode::from(1));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn marker(body: &EntryBody) -> Option<String> {
    match body {
        EntryBody::TurnDispatched(d) => Some(format!("{} dispatched to {}", d.turn, d.worker)),
        EntryBody::TurnComplete(c) => {
            Some(format!("{} complete ({:?})", c.turn, c.outcome).to_lowercase())
        }
        EntryBody::TurnAmbiguous(a) => Some(format!("{} ambiguous: {}", a.turn, a.reason)),
        _ => None,
    }
}
