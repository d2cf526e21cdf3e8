//! `turnpike-cell-init -- PROGRAM ARGS…`: runs inside a cell, after bubblewrap has built its
//! mounts: restricts itself with Landlock (the cell's second wall on the filesystem) and becomes
//! PROGRAM. A separate, small binary so that a cell starts fast. It never runs PROGRAM when
//! Landlock fails to apply.

use std::os::unix::process::CommandExt as _;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let rest = match args.first() {
        Some(a) if a == "--" => &args[1..],
        _ => &args[..],
    };
    let Some((program, program_args)) = rest.split_first() else {
        eprintln!("turnpike-cell-init: no program to run");
        return ExitCode::from(126);
    };
    let status = match turnpike_worker::cell::landlock::restrict() {
        Ok(status) => status,
        Err(e) => {
            eprintln!("turnpike-cell-init: {e}");
            return ExitCode::from(126);
        }
    };
    let err = std::process::Command::new(program)
        .args(program_args)
        .env("CELL_LANDLOCK", status)
        .exec();
    eprintln!(
        "turnpike-cell-init: cannot run {}: {err}",
        program.to_string_lossy()
    );
    ExitCode::from(126)
}
