//! `turnpike demo`: the whole system on the embedded default, start to finish.
//!
//! For now the system is the record: the demo creates a conversation under the data directory,
//! runs three turns through both batches, verifies the record and replays it. Later issues grow
//! it into the full demo (lanes, workers, the agent loop, tools).

use std::process::ExitCode;

use anyhow::Result;
use turnpike_artifactory::Transcript;
use turnpike_schemas::{Identity, TurnId};

use crate::cli::Global;
use crate::commands::conversation::{print_transcript, verify};
use crate::commands::record::{create, echo_turn};
use crate::env::Env;

pub async fn run(global: &Global) -> Result<ExitCode> {
    let env = Env::open(global)?;
    let owner: Identity = "local:demo-user".parse()?;
    println!("data directory: {}", global.data_dir.display());
    let (entry, record, mut head) = create(&env, owner.clone()).await?;
    println!("created {} for {owner}\n", entry.conversation);
    let mut turn = TurnId::FIRST;
    for text in [
        "hello, turnpike",
        "what did I say first?",
        "thanks, that's all",
    ] {
        (_, head) = echo_turn(&env, &entry, &record, head, turn, text).await?;
        turn = turn.next();
    }
    let transcript = Transcript::from_entries(&record.entries().await?);
    print_transcript(&entry, &transcript);
    println!();
    let code = verify(&env, entry.conversation, &owner, false).await?;
    println!(
        "\ntry: turnpike conversation replay {} --actor {owner}",
        entry.conversation
    );
    Ok(code)
}
