//! `turnpike demo`: the whole system on the embedded default, start to finish.
//!
//! It creates a conversation under the data directory, starts two workers on the embedded bus,
//! sends messages through ingress onto the conversation's lane, waits until the workers have
//! committed every turn (batch one, the agent, batch two), then prints the transcript and
//! verifies the signed record. Later issues grow the agent (tools, files, a real model).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Result};
use turnpike_artifactory::Transcript;
use turnpike_router::Ingress;
use turnpike_schemas::{EventBody, Identity};

use crate::cli::Global;
use crate::commands::conversation::{print_transcript, verify};
use crate::commands::record::create;
use crate::commands::runtime::{open_bus, run_until_committed};
use crate::env::Env;

pub async fn run(global: &Global) -> Result<ExitCode> {
    if global.nats_url.is_some() {
        bail!("the demo runs on the embedded default; drop --nats-url");
    }
    let env = Env::open(global)?;
    let bus = open_bus(global, Duration::from_secs(30)).await?;
    let owner: Identity = "local:demo-user".parse()?;
    println!("data directory: {}", global.data_dir.display());
    let (entry, record, _) = create(&env, owner.clone()).await?;
    println!("created {} for {owner}", entry.conversation);

    let ingress = Ingress::new(bus.clone(), env.conversations.clone());
    let events = [
        EventBody::Message {
            text: "hello, turnpike".into(),
        },
        EventBody::FollowUp {
            text: "and a follow-up right behind it".into(),
        },
        EventBody::Message {
            text: "what did I say first?".into(),
        },
        EventBody::Message {
            text: "thanks, that's all".into(),
        },
    ];
    let mut last_seq = 0;
    for (i, body) in events.into_iter().enumerate() {
        let key = format!("demo-{i}");
        let (event, published) = ingress
            .submit(&owner, entry.conversation, body.clone(), Some(key.clone()))
            .await?;
        last_seq = published.seq;
        println!(
            "sent {} {} (lane sequence {})",
            body.kind_name(),
            event.id,
            published.seq
        );
        if i == 0 {
            // A client retrying the same request: accepted once.
            let (_, again) = ingress
                .submit(&owner, entry.conversation, body, Some(key))
                .await?;
            println!(
                "  retried with the same idempotency key: duplicate={}",
                again.duplicate
            );
        }
    }

    println!("running two workers until every event is committed");
    run_until_committed(&env, bus, &record, last_seq, 2).await?;

    println!();
    let transcript = Transcript::from_entries(&record.entries().await?);
    print_transcript(&entry, &transcript);
    println!();
    let code = verify(&env, entry.conversation, &owner, false).await?;
    println!(
        "\ntry: turnpike conversation replay {} --actor {owner}",
        entry.conversation
    );
    println!(
        "     turnpike send {} --actor {owner} --text hi && turnpike serve",
        entry.conversation
    );
    Ok(code)
}
