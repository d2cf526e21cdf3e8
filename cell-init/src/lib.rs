//! The init inside a cell: started by bubblewrap as `turnpike-init -- PROGRAM ARGS…` once the
//! mounts are built, it restricts itself with Landlock (the cell's second wall on the
//! filesystem; see [`landlock`]) and becomes PROGRAM. It never runs PROGRAM when Landlock fails
//! to apply.
//!
//! Two ways to get it: the `turnpike-cell-init` binary of this crate (small, so a cell starts
//! fast), or the `turnpike` binary itself when it is started under the init's name (so a build
//! of `turnpike` alone — `cargo run` — still has the full sandbox).
//!
//! The book: `book/src/operating/security.md` (and `book/src/SUMMARY.md` for the rest).

pub mod landlock;

use std::ffi::OsString;
use std::os::unix::process::CommandExt as _;
use std::process::ExitCode;

/// The name the init is started under inside a cell.
pub const INIT_NAME: &str = "turnpike-init";

/// Applies Landlock and becomes the program in `args` (after `--read PATH` options, each a
/// host path granted read and execute beside `/usr`, and an optional `--`); returns only when
/// that fails.
pub fn run(args: &[OsString]) -> ExitCode {
    let mut rest = args;
    let mut readable = Vec::new();
    while let [flag, path, more @ ..] = rest {
        if flag != "--read" {
            break;
        }
        readable.push(std::path::PathBuf::from(path));
        rest = more;
    }
    let rest = match rest.first() {
        Some(a) if a == "--" => &rest[1..],
        _ => rest,
    };
    let Some((program, program_args)) = rest.split_first() else {
        eprintln!("turnpike-init: no program to run");
        return ExitCode::from(126);
    };
    let status = match landlock::restrict(&readable) {
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

/// Runs the init when this process was started under [`INIT_NAME`]; `None` otherwise.
pub fn run_if_invoked() -> Option<ExitCode> {
    let mut args = std::env::args_os();
    let argv0 = args.next()?;
    let name = std::path::Path::new(&argv0).file_name()?;
    (name == INIT_NAME).then(|| run(&args.collect::<Vec<_>>()))
}
