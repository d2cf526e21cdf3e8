//! `turnpike-cell-init`: the small init bound into every cell (see the crate docs).

fn main() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    turnpike_cell_init::run(&args)
}
