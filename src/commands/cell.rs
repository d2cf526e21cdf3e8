//! `turnpike cell run` (a script in a fresh cell: for operators checking a deployment's sandbox)
//! and `turnpike bench cell`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use tokio::io::AsyncReadExt as _;
use turnpike_worker::cell::{Cell, CellConfig, Language, Limits};

use crate::cli::CellCommand;

pub async fn run(command: CellCommand) -> Result<ExitCode> {
    let CellCommand::Run {
        file,
        workspace,
        timeout_secs,
    } = command;
    let code =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let config = CellConfig {
        limits: Limits {
            wall: Duration::from_secs(timeout_secs.max(1)),
            ..Limits::default()
        },
        init: super::runtime::cell_init_binary(),
        ..CellConfig::default()
    };
    let cell = match Cell::detect(config).await {
        Ok(cell) => cell,
        // Fail closed: never run the script some other way.
        Err(why) => bail!("cannot run {}: {why}", file.display()),
    };
    let fresh = tempfile::tempdir()?;
    let dir = workspace.unwrap_or_else(|| fresh.path().to_path_buf());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = cell
        .run(&dir, Language::Python, &code)
        .await
        .map_err(anyhow::Error::msg)?;
    println!("{}", serde_json::to_string_pretty(&result)?);
    for f in &result.files {
        println!("file: {} ({} bytes)", dir.join(&f.path).display(), f.size);
    }
    Ok(if result.exit_code == Some(0) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

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

pub async fn bench(runs: usize, landlock: bool) -> Result<ExitCode> {
    let cell = Cell::detect(CellConfig {
        init: if landlock {
            super::runtime::cell_init_binary()
        } else {
            None
        },
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
    for _ in 0..runs {
        floor.push(first_byte("/usr/bin/python3", &["-I", "-S", "-c", "print(1)"]).await?);
        // The cell's first byte: from the call (setup included) to the first byte of stdout.
        let r = cell
            .run(ws.path(), Language::Python, "print(1)")
            .await
            .map_err(anyhow::Error::msg)?;
        anyhow::ensure!(r.stdout.trim() == "1", "the cell printed {:?}", r.stdout);
        cell_times.push(Duration::from_micros(r.first_output_us.unwrap_or(0)));
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
    Ok(ExitCode::SUCCESS)
}
