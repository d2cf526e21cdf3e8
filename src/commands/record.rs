//! `turnpike record append`: one message through the whole path on the embedded default —
//! ingress, the lane, a worker, both batches of the record — for checking `verify` and `replay`
//! on a record written the way `serve` writes it.

use std::process::ExitCode;

use anyhow::Result;
use turnpike_artifactory::{DirectoryEntry, Head, NewConversation, Record};
use turnpike_router::Ingress;
use turnpike_schemas::{EventBody, Identity};

use crate::cli::{Global, RecordCommand};
use crate::commands::runtime::{open_bus, run_until_committed};
use crate::env::{now_ms, Env};

pub async fn run(global: &Global, command: RecordCommand) -> Result<ExitCode> {
    let RecordCommand::Append {
        actor,
        conversation,
        message,
    } = command;
    anyhow::ensure!(
        global.nats_url.is_none(),
        "`record append` works on the embedded default; use `send` with --nats-url"
    );
    let env = Env::open(global)?;
    let bus = open_bus(global, &env, std::time::Duration::from_secs(30)).await?;
    let (entry, record) = match conversation {
        Some(id) => {
            env.conversations
                .open(id, &actor.tenant, &actor.identity)
                .await?
        }
        None => {
            let (entry, record, _) = create(&env, &actor.tenant, actor.identity.clone()).await?;
            println!("created {}", entry.conversation);
            (entry, record)
        }
    };
    let ingress = Ingress::new(bus.clone(), env.conversations.clone());
    let (_, published) = ingress
        .submit(
            &actor.tenant,
            &actor.identity,
            entry.conversation,
            EventBody::Message { text: message },
            None,
        )
        .await?;
    let head = run_until_committed(&env, bus, &record, published.seq, 1).await?;
    println!(
        "{} turn_{} committed",
        entry.conversation,
        head.state().last_turn
    );
    Ok(ExitCode::SUCCESS)
}

/// Creates a conversation owned by `owner` in `tenant`, with the demo app.
pub async fn create(
    env: &Env,
    tenant: &turnpike_schemas::TenantId,
    owner: Identity,
) -> Result<(DirectoryEntry, Record, Head)> {
    let new = NewConversation {
        tenant: tenant.clone(),
        owner,
        app: "demo".parse()?,
        agent: "echo".parse()?,
        at_ms: now_ms(),
        instructions: None,
        started_by: None,
    };
    Ok(env.conversations.create(&env.signer, new).await?)
}
