//! `turnpike bench mcp`: an MCP tool call through Turnpike's path — the server sandboxed like
//! a cell, the official Rust SDK as the client — beside the same call made directly with the
//! Python `mcp` client to the same server program, unsandboxed, in the same run; and what
//! starting a stdio server costs a turn (cold: sandbox, initialize, list) against a call on a
//! server already started.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use serde_json::{json, Map};
use turnpike_agent::mcp::spec::RawServer;
use turnpike_agent::mcp::Session;
use turnpike_worker::cell::{Cell, CellConfig, Extra};

fn percentile(samples: &mut [Duration], p: f64) -> f64 {
    samples.sort_unstable();
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[i].as_secs_f64() * 1e3
}

/// The Python side: starts the server, times `calls` calls, prints one line of JSON.
const DIRECT: &str = r#"
import asyncio, json, sys, time
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

async def main():
    calls, starts, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    params = StdioServerParameters(command=argv[0], args=argv[1:])
    start = []
    for _ in range(starts):
        t = time.perf_counter()
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                await s.list_tools()
                start.append(time.perf_counter() - t)
    call = []
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            for _ in range(calls):
                t = time.perf_counter()
                res = await s.call_tool("get_current_time", {"timezone": "UTC"})
                assert not res.isError, res
                call.append(time.perf_counter() - t)
    print(json.dumps({"call": call, "start": start}))

asyncio.run(main())
"#;

/// `turnpike bench mcp`: `calls` calls of `mcp-server-time`'s `get_current_time` and
/// `starts` cold starts, each way; the server and its Python from the venv at `venv`.
pub async fn run(venv: PathBuf, calls: usize, starts: usize) -> Result<ExitCode> {
    let server = venv.join("bin/mcp-server-time");
    anyhow::ensure!(
        server.is_file(),
        "no mcp-server-time in {} (scripts/services install tests makes it)",
        venv.display()
    );
    let argv = vec![
        server.display().to_string(),
        "--local-timezone".into(),
        "UTC".into(),
    ];
    let spec = RawServer::stdio("time", argv.clone(), vec![venv.clone()])
        .validate()
        .map_err(anyhow::Error::msg)?;
    let cell = Cell::detect(CellConfig::default())
        .await
        .map_err(anyhow::Error::msg)?;
    let ws = tempfile::tempdir()?;
    println!(
        "turnpike bench mcp: get_current_time of mcp-server-time, {calls} calls and {starts} cold starts each way"
    );
    let direct = python(&venv, calls, starts, &argv).await?;
    // Turnpike's way: sandboxed in a cell over a workspace, rmcp as the client.
    let mut cold = Vec::new();
    for _ in 0..starts {
        let t = Instant::now();
        let (session, process) = start(&cell, ws.path(), &argv, &venv, &spec).await?;
        session.tools().await.map_err(anyhow::Error::msg)?;
        cold.push(t.elapsed());
        session.close().await;
        drop(process);
    }
    let (session, _process) = start(&cell, ws.path(), &argv, &venv, &spec).await?;
    session.tools().await.map_err(anyhow::Error::msg)?;
    let mut through = Vec::new();
    for i in 0..calls {
        let mut meta = Map::new();
        meta.insert(
            "turnpike/idempotency-key".into(),
            json!(format!("bench-{i}")),
        );
        let t = Instant::now();
        let r = session
            .call("get_current_time", json!({"timezone": "UTC"}), meta)
            .await
            .map_err(anyhow::Error::msg)?;
        through.push(t.elapsed());
        anyhow::ensure!(!r.is_error, "the server answered an error: {:?}", r.text);
    }
    session.close().await;
    let (mut direct_calls, mut direct_starts) = direct;
    let row = |name: &str, samples: &mut Vec<Duration>| {
        let (p50, p99) = (percentile(samples, 0.5), percentile(samples, 0.99));
        println!("{name:<44} p50 {p50:>8.2} ms   p99 {p99:>8.2} ms");
        (p50, p99)
    };
    let (d50, d99) = row("call, Python mcp client (the floor)", &mut direct_calls);
    let (t50, t99) = row("call, Turnpike (sandboxed, rmcp)", &mut through);
    println!(
        "{:<44} p50 {:>8.2} ms   p99 {:>8.2} ms",
        "added by Turnpike",
        t50 - d50,
        t99 - d99
    );
    let (s50, s99) = row("start + list, Python mcp client", &mut direct_starts);
    let (c50, c99) = row("start + list, Turnpike (a turn's cold cost)", &mut cold);
    println!(
        "{:<44} p50 {:>8.2} ms   p99 {:>8.2} ms",
        "cold start added by Turnpike",
        c50 - s50,
        c99 - s99
    );
    println!(
        "a turn's first call on a cold server costs {:.1}× a call on a started one (p50)",
        (c50 + t50) / t50
    );
    Ok(ExitCode::SUCCESS)
}

/// The server, started in a cell over `ws` as a turn starts it, with a session over its pipes.
async fn start(
    cell: &Cell,
    ws: &Path,
    argv: &[String],
    venv: &Path,
    spec: &turnpike_agent::mcp::ServerSpec,
) -> Result<(Session, turnpike_worker::cell::CellProcess)> {
    let read_only = [venv.to_path_buf()];
    let extra = Extra {
        read_only: &read_only,
        network: false,
        read_only_workspace: true,
    };
    let mut process = cell
        .spawn(ws, argv, &extra)
        .await
        .map_err(anyhow::Error::msg)?;
    let (stdout, stdin) = (
        process.child.stdout.take().context("stdout")?,
        process.child.stdin.take().context("stdin")?,
    );
    let session = Session::over_pipes(spec, stdout, stdin)
        .await
        .map_err(anyhow::Error::msg)?;
    Ok((session, process))
}

/// The Python client's call and start times.
async fn python(
    venv: &Path,
    calls: usize,
    starts: usize,
    argv: &[String],
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let out = tokio::process::Command::new(venv.join("bin/python"))
        .arg("-c")
        .arg(DIRECT)
        .arg(calls.to_string())
        .arg(starts.to_string())
        .args(argv)
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "the Python client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let secs = |k: &str| -> Vec<Duration> {
        v[k].as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_f64())
                    .map(Duration::from_secs_f64)
                    .collect()
            })
            .unwrap_or_default()
    };
    Ok((secs("call"), secs("start")))
}
