//! `turnpike`: the one binary. It wires the crates together; the crates do the work.

mod cli;
mod commands;
mod config;
mod env;
mod hosted;
mod logging;
mod telemetry;

use std::process::ExitCode;

/// mimalloc, built without transparent huge pages (`no_thp`). Against glibc's allocator on this
/// workload it embeds 25–45% more documents per second and rebuilds a cold context ~20% faster
/// (`turnpike bench embed`, `bench context`). With huge pages, the kernel's `defrag=madvise`
/// default made some page faults compact memory in place: 5 ms stalls at p99 of a rebuild.
/// (`--features system-allocator` keeps the system's, for heap profilers.)
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Started inside a cell as its init: nothing else of the binary runs.
    #[cfg(unix)]
    if let Some(code) = turnpike_cell_init::run_if_invoked() {
        return code;
    }
    // The configuration file's values join the command line where neither it nor the
    // environment set one.
    let argv = match config::apply(std::env::args_os().collect()) {
        Ok((argv, _)) => argv,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let cli = {
        use clap::{CommandFactory as _, FromArgMatches as _};
        let matches = cli::with_book_pages(cli::Cli::command()).get_matches_from(argv);
        match cli::Cli::from_arg_matches(&matches) {
            Ok(cli) => cli,
            Err(e) => e.exit(),
        }
    };
    // A closed pipe (`turnpike conversation list | head`) ends a command that prints quietly,
    // as it does for other tools. Never for the long-running processes: there SIGPIPE would
    // also come from a socket whose peer went away mid-write (an HTTP client's vectored write
    // is not spared by MSG_NOSIGNAL), and kill a server that should just see the error.
    #[cfg(unix)]
    if !cli.command.is_long_running() {
        // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    // TLS (NATS, S3, model and embedding endpoints) uses one crypto provider, chosen here.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(usize::from(
            cli.global
                .blocking_threads
                .unwrap_or_else(|| cli.command.default_blocking_threads()),
        ))
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let _logging = match logging::init(&cli.global, runtime.handle()) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let outcome = runtime.block_on(commands::run(cli));
    // Turns still running on their own runtime (past their grace) end before this one.
    commands::shutdown_turns();
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
