//! `turnpike bench cell`: the cell's overhead over bare Python.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::io::AsyncReadExt as _;
use turnpike_worker::cell::{Cell, CellConfig, Language};

fn percentile(samples: &mut [Duration], p: f64) -> f64 {
    samples.sort_unstable();
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[i].as_secs_f64() * 1e3
}

/// Start → first byte of stdout of `program args`.
async fn first_byte(program: &str, args: &[&str]) -> Result<Duration> {
    let t = Instant::now();
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut out = child.stdout.take().expect("piped");
    let mut byte = [0u8; 1];
    out.read_exact(&mut byte).await?;
    let elapsed = t.elapsed();
    child.wait().await?;
    Ok(elapsed)
}

/// `turnpike bench cell`: `runs` of `print(1)` in a cell (with the Landlock init at `init`, or
/// without Landlock) beside plain `python3`, interleaved.
pub async fn run(runs: usize, init: Option<PathBuf>) -> Result<ExitCode> {
    let landlock = init.is_some();
    let cell = Cell::detect(CellConfig {
        init,
        ..CellConfig::default()
    })
    .await
    .map_err(anyhow::Error::msg)?;
    let ws = tempfile::tempdir()?;
    println!(
        "turnpike bench cell: {runs} runs of print(1), cell{} beside plain python3, interleaved",
        if landlock { "" } else { " without Landlock" }
    );
    let mut floor = Vec::new();
    let mut cell_times = Vec::new();
    let mut starts = Vec::new();
    for _ in 0..runs {
        floor.push(first_byte("/usr/bin/python3", &["-I", "-S", "-c", "print(1)"]).await?);
        // The cell's first byte: from the call (setup included) to the first byte of stdout.
        let r = cell
            .run(ws.path(), Language::Python, "print(1)")
            .await
            .map_err(anyhow::Error::msg)?;
        anyhow::ensure!(r.stdout.trim() == "1", "the cell printed {:?}", r.stdout);
        cell_times.push(Duration::from_micros(r.first_output_us.unwrap_or(0)));
        starts.push(Duration::from_micros(r.started_us));
    }
    let (f50, f99) = (percentile(&mut floor, 0.5), percentile(&mut floor, 0.99));
    let (c50, c99) = (
        percentile(&mut cell_times, 0.5),
        percentile(&mut cell_times, 0.99),
    );
    println!("python3 -c 'print(1)'   p50 {f50:>7.2} ms   p99 {f99:>7.2} ms   (the floor)");
    println!("cell print(1)           p50 {c50:>7.2} ms   p99 {c99:>7.2} ms");
    println!(
        "overhead                p50 {:>7.2} ms   p99 {:>7.2} ms",
        c50 - f50,
        c99 - f99
    );
    // The share of the overhead spent before bubblewrap runs: the host's setup, and the spawn
    // whose child joins the run's cgroup (a migration: it waits for an RCU grace period unless
    // a cgroup hierarchy is mounted with `favordynmods`, and for the kernel when it is busy).
    println!(
        "of which: until bubblewrap started   p50 {:>7.2} ms   p99 {:>7.2} ms   (cgroup joins {})",
        percentile(&mut starts, 0.5),
        percentile(&mut starts, 0.99),
        if cell.cgroup_joins_wait() {
            "wait for an RCU grace period: no hierarchy has favordynmods"
        } else {
            "do not wait: favordynmods, or no cgroups"
        }
    );
    Ok(ExitCode::SUCCESS)
}
