//! `turnpike git export`: a conversation's project versions as a plain bare git repository.

use std::process::ExitCode;

use anyhow::{Context as _, Result};
use turnpike_artifactory::git::{export, Lineage};

use crate::cli::GitCommand;
use crate::env::Env;

pub async fn run(env: &Env, command: GitCommand) -> Result<ExitCode> {
    match command {
        GitCommand::Export {
            conversation,
            dir,
            actor,
        } => {
            let (entry, record) = env
                .open_for("git export", conversation, &actor.tenant, &actor.identity)
                .await?;
            anyhow::ensure!(
                !dir.join("HEAD").exists(),
                "{} is a repository already; export into a new folder",
                dir.display()
            );
            let head = record.head().await?;
            let lineage = Lineage::new(env.conversations.store().clone(), entry.prefix());
            let n = export(&lineage, head.state().last_turn, &dir)
                .await
                .with_context(|| format!("exporting into {}", dir.display()))?;
            println!(
                "exported {n} versions of {conversation} to {} (tags turn_<n>, branch main)",
                dir.display()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
