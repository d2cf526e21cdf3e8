//! One module per command family.

mod bench;
mod conversation;
mod demo;
mod record;

use std::process::ExitCode;

use anyhow::Result;

use crate::cli::{Cli, Command};
use crate::env::Env;

/// Runs a parsed command line. `Ok(code)` carries the exit code of a command that ran.
pub async fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Demo => demo::run(&cli.global).await,
        Command::Conversation(command) => {
            conversation::run(&Env::open(&cli.global)?, command).await
        }
        Command::Record(command) => record::run(&Env::open(&cli.global)?, command).await,
        Command::Bench(command) => bench::run(command).await,
    }
}
