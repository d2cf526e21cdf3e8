//! The cell's init: this binary, bound into a cell at `/run/turnpike-init` and started there as
//! `turnpike-init -- PROGRAM ARGS…` after bubblewrap has built the mounts. It restricts itself
//! with Landlock (the cell's second wall on the filesystem) and becomes PROGRAM — it never runs
//! PROGRAM when Landlock fails to apply. A mode of the one binary (chosen by the name it is
//! started as, before anything else runs), so every build that has `turnpike` has the init.

use std::os::unix::process::CommandExt as _;
use std::process::ExitCode;

/// Runs the init when this process was started as it; `None` otherwise.
pub fn run_if_invoked() -> Option<ExitCode> {
    let argv0 = std::env::args_os().next()?;
    let name = std::path::Path::new(&argv0).file_name()?;
    (name == turnpike_worker::cell::INIT_NAME).then(run)
}

fn run() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let rest = match args.first() {
        Some(a) if a == "--" => &args[1..],
        _ => &args[..],
    };
    let Some((program, program_args)) = rest.split_first() else {
        eprintln!("turnpike-init: no program to run");
        return ExitCode::from(126);
    };
    let status = match turnpike_worker::cell::landlock::restrict() {
        Ok(status) => status,
        Err(e) => {
            eprintln!("turnpike-init: {e}");
            return ExitCode::from(126);
        }
    };
    let err = std::process::Command::new(program)
        .args(program_args)
        .env("CELL_LANDLOCK", status)
        .exec();
    eprintln!(
        "turnpike-init: cannot run {}: {err}",
        program.to_string_lossy()
    );
    ExitCode::from(126)
}
