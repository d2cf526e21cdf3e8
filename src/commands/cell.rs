//! `turnpike cell run`: a script in a fresh cell, for operators checking a deployment's sandbox.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
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
