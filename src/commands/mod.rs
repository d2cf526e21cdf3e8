//! One module per command family.

pub(crate) mod admin;
mod bench;
mod cell;
mod chat;
mod conversation;
mod demo;
mod edge;
mod git;
mod lanes;
mod record;
pub(crate) mod reference;
mod runtime;
mod schedule;
mod search;
mod webhook;

pub use runtime::shutdown_turns;

use std::process::ExitCode;

use anyhow::Result;

use crate::cli::{Cli, Command};
use crate::env::Env;

/// Runs a parsed command line. `Ok(code)` carries the exit code of a command that ran.
pub async fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Demo(args) => demo::run(&cli.global, args).await,
        Command::Config(crate::cli::ConfigCommand::Show { command, json }) => {
            let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
            let shown = crate::config::show(&argv, &command).map_err(anyhow::Error::msg)?;
            for s in shown {
                if json {
                    println!("{}", serde_json::to_string(&s)?);
                } else {
                    let value = match s.values.as_slice() {
                        [] => "(unset)".to_owned(),
                        [one] => one.clone(),
                        many => format!("[{}]", many.join(", ")),
                    };
                    println!("{} = {value}  # {}", s.key, s.source);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Conversation(command) => {
            conversation::run(&cli.global, &Env::open(&cli.global)?, command).await
        }
        Command::Record(command) => record::run(&cli.global, command).await,
        // A bench starts servers of its own: stopped by a signal, it ends them (and removes
        // their directories) on the way out instead of leaving them running.
        Command::Bench(command) => tokio::select! {
            done = bench::run(&cli.global, command) => done,
            _ = runtime::shutdown_signal() => {
                eprintln!("bench stopped by a signal; its servers are stopped");
                Ok(ExitCode::from(130))
            }
        },
        Command::Cell(command) => cell::run(command).await,
        Command::Git(command) => git::run(&Env::open(&cli.global)?, command).await,
        Command::Serve(args) => runtime::serve(&cli.global, *args).await,
        Command::Router(args) => runtime::router(&cli.global, args).await,
        Command::Worker(args) => runtime::worker(&cli.global, args).await,
        Command::Send(args) => lanes::send(&cli.global, args).await,
        Command::Tail(args) => lanes::tail(&cli.global, args).await,
        Command::Workers(args) => lanes::workers(&cli.global, args).await,
        Command::Search(args) => search::search(&cli.global, args).await,
        Command::Chat(args) => chat::run(&cli.global, args).await,
        Command::Schedule(args) => schedule::run(&cli.global, args).await,
        Command::Webhook(args) => webhook::run(&cli.global, args).await,
        Command::Reference { page } => {
            print!("{}", reference::render(page));
            Ok(ExitCode::SUCCESS)
        }
        Command::Index(command) => search::index(&cli.global, command).await,
    }
}
