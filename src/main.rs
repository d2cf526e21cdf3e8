//! `turnpike`: the one binary. It wires the crates together; the crates do the work.

mod cli;
mod commands;
mod env;
mod logging;

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    // A closed pipe (`turnpike … | head`) ends the process quietly, as it does for other tools.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // Inside a cell: add Landlock, then become the interpreter (see `worker::cell::landlock`).
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "cell-init") {
        return cell_init(&args[2..]);
    }
    let cli = cli::Cli::parse();
    if let Err(e) = logging::init(&cli.global) {
        eprintln!("error: {e:#}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// `turnpike cell-init -- PROGRAM ARGS…`: restricts itself with Landlock and executes PROGRAM.
/// Never runs PROGRAM unrestricted when Landlock fails to apply.
fn cell_init(args: &[std::ffi::OsString]) -> ExitCode {
    use std::os::unix::process::CommandExt as _;
    let rest = match args.first() {
        Some(a) if a == "--" => &args[1..],
        _ => args,
    };
    let Some((program, program_args)) = rest.split_first() else {
        eprintln!("cell-init: no program to run");
        return ExitCode::from(126);
    };
    let status = match turnpike_worker::cell::landlock::restrict() {
        Ok(status) => status,
        Err(e) => {
            eprintln!("cell-init: {e}");
            return ExitCode::from(126);
        }
    };
    let err = std::process::Command::new(program)
        .args(program_args)
        .env("CELL_LANDLOCK", status)
        .exec();
    eprintln!("cell-init: cannot run {}: {err}", program.to_string_lossy());
    ExitCode::from(126)
}
