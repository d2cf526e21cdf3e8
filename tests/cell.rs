//! The escape suite: generated code in a cell, trying everything it must not do. Every case is
//! contained, and the worker (this test process) is unharmed.

use std::path::Path;
use std::time::Duration;

use turnpike_worker::cell::{Cell, CellConfig, Language, Limits, RunResult};

async fn cell() -> Cell {
    let config = CellConfig {
        limits: Limits {
            wall: Duration::from_secs(6),
            cpu_seconds: 3,
            address_space_bytes: 512 << 20,
            file_size_bytes: 8 << 20,
            processes: 32,
            ..Limits::default()
        },
        init: Some(env!("CARGO_BIN_EXE_turnpike").into()),
        ..CellConfig::default()
    };
    Cell::detect(config)
        .await
        .expect("the sandbox works on this machine")
}

async fn run(cell: &Cell, workspace: &Path, code: &str) -> RunResult {
    cell.run(workspace, Language::Python, code).await.unwrap()
}

/// Runs `code`, which prints `CONTAINED` when what it tried failed as it should.
async fn contained(cell: &Cell, code: &str) {
    let ws = tempfile::tempdir().unwrap();
    let r = run(cell, ws.path(), code).await;
    assert!(
        r.stdout.contains("CONTAINED") && !r.stdout.contains("ESCAPED"),
        "{code}\n=> {r:?}"
    );
}

#[tokio::test]
async fn a_normal_script_reads_input_and_writes_a_csv_and_a_png() {
    let cell = cell().await;
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("input.txt"), "3\n4\n5\n").unwrap();
    let r = run(
        &cell,
        ws.path(),
        r#"
import csv, struct, zlib
nums = [int(x) for x in open("input.txt")]
with open("out/squares.csv", "w", newline="") if False else open("squares.csv", "w", newline="") as f:
    w = csv.writer(f); w.writerow(["n", "square"]); [w.writerow([n, n * n]) for n in nums]
def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
raw = b"".join(b"\x00" + bytes([255, 0, 0] * 2) for _ in range(2))
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
open("dot.png", "wb").write(png)
print("sum", sum(nums))
"#,
    )
    .await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert_eq!(r.stdout.trim(), "sum 12");
    let names: Vec<&str> = r.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(names, ["dot.png", "squares.csv"]);
    assert!(std::fs::read_to_string(ws.path().join("squares.csv"))
        .unwrap()
        .contains("5,25"));
    assert!(std::fs::read(ws.path().join("dot.png"))
        .unwrap()
        .starts_with(b"\x89PNG"));
}

#[tokio::test]
async fn no_network_of_any_kind() {
    let cell = cell().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let sock_dir = tempfile::tempdir_in("/tmp").unwrap();
    let sock = sock_dir.path().join("host.sock");
    let _unix = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let code = format!(
        r#"
import socket
results = []
for port in ({port}, 4222, 5432):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1); results.append("ESCAPED tcp %d" % port)
    except OSError: pass
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b"x", ("8.8.8.8", 53)); results.append("ESCAPED udp")
except OSError: pass
try:
    socket.getaddrinfo("example.com", 80); results.append("ESCAPED dns")
except OSError: pass
try:
    u = socket.socket(socket.AF_UNIX); u.connect("{sock}"); results.append("ESCAPED unix")
except OSError: pass
for fam, typ in ((socket.AF_PACKET, socket.SOCK_RAW), (socket.AF_INET, socket.SOCK_RAW), (socket.AF_NETLINK, socket.SOCK_RAW)):
    try:
        socket.socket(fam, typ, 0); results.append("ESCAPED raw %d" % fam)
    except OSError: pass
print(" ".join(results) or "CONTAINED")
"#,
        sock = sock.display()
    );
    contained(&cell, &code).await;
}

#[tokio::test]
async fn nothing_outside_the_workspace_can_be_read() {
    let cell = cell().await;
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("secret.txt"), "another conversation").unwrap();
    let key = tempfile::tempdir().unwrap();
    std::fs::write(key.path().join("record-signing.key"), "00".repeat(32)).unwrap();
    // SAFETY: set before any cell starts; read by nothing else in this test binary.
    unsafe { std::env::set_var("TURNPIKE_TEST_SECRET", "s3cr3t-token") };
    let code = format!(
        r#"
import os
found = []
for p in ("{other}/secret.txt", "/etc/shadow", "/etc/passwd", "/root", "/home", "{key}/record-signing.key"):
    if os.path.exists(p): found.append(p)
env = open("/proc/self/environ", "rb").read()
try:
    env += open("/proc/1/environ", "rb").read()
except PermissionError:
    pass
if b"s3cr3t" in env or b"TURNPIKE" in env or b"AWS_" in env: found.append("environment")
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            if b"s3cr3t" in open("/proc/%s/environ" % pid, "rb").read(): found.append("proc %s" % pid)
        except OSError: pass
print(("ESCAPED " + " ".join(found)) if found else "CONTAINED")
"#,
        other = other.path().display(),
        key = key.path().display()
    );
    contained(&cell, &code).await;
}

#[tokio::test]
async fn nothing_outside_the_workspace_can_be_written_and_symlinks_lead_nowhere() {
    let cell = cell().await;
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("target.txt"), "original").unwrap();
    let ws = tempfile::tempdir().unwrap();
    // Planted before the run.
    std::os::unix::fs::symlink(outside.path().join("target.txt"), ws.path().join("planted"))
        .unwrap();
    std::os::unix::fs::symlink("/etc/passwd", ws.path().join("passwd")).unwrap();
    let code = format!(
        r#"
import os
bad = []
for p in ("/usr/evil", "/etc/evil", "/evil", "{outside}/evil.txt"):
    try:
        open(p, "w").write("x"); bad.append(p)
    except OSError: pass
for p in ("planted", "passwd"):
    try:
        open(p).read(); bad.append("read " + p)
    except OSError: pass
    try:
        open(p, "w").write("x"); bad.append("write " + p) if os.path.exists("{outside}/target.txt") and open(p).read() == "x" and False else None
    except OSError: pass
# Planted during the run.
os.symlink("{outside}/target.txt", "during")
try:
    open("during", "w").write("overwritten")
except OSError: pass
open("/tmp/private", "w").write("only in the cell")
print(("ESCAPED " + " ".join(bad)) if bad else "CONTAINED")
"#,
        outside = outside.path().display()
    );
    let r = run(&cell, ws.path(), &code).await;
    assert!(r.stdout.contains("CONTAINED"), "{r:?}");
    assert_eq!(
        std::fs::read_to_string(outside.path().join("target.txt")).unwrap(),
        "original"
    );
    assert!(!outside.path().join("evil.txt").exists());
    assert!(!Path::new("/tmp/private").exists());
    assert!(!Path::new("/usr/evil").exists());
}

#[tokio::test]
async fn bombs_loops_and_sleepers_are_stopped_and_the_worker_goes_on() {
    let cell = cell().await;
    let ws = tempfile::tempdir().unwrap();
    // A fork bomb.
    let r = run(
        &cell,
        ws.path(),
        "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass\n",
    )
    .await;
    assert!(r.exit_code != Some(0), "{r:?}");
    // A memory bomb.
    let r = run(&cell, ws.path(), "x = bytearray(4 << 30)\nprint('ESCAPED')").await;
    assert!(!r.stdout.contains("ESCAPED"), "{r:?}");
    // Filling the disk.
    let r = run(
        &cell,
        ws.path(),
        "f = open('big', 'wb')\nfor _ in range(1024): f.write(b'x' * (1 << 20))\nprint('ESCAPED')",
    )
    .await;
    assert!(!r.stdout.contains("ESCAPED"), "{r:?}");
    assert!(
        std::fs::metadata(ws.path().join("big"))
            .map(|m| m.len())
            .unwrap_or(0)
            <= 8 << 20
    );
    // An infinite loop: the CPU limit.
    let r = run(&cell, ws.path(), "while True: pass").await;
    assert!(r.exit_code != Some(0), "{r:?}");
    // Sleeping past the timeout: killed, with everything it started.
    let r = run(&cell, ws.path(), "import os, time\nif os.fork() == 0:\n    time.sleep(30); open('late', 'w').write('x')\ntime.sleep(30)").await;
    assert!(r.timed_out, "{r:?}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!ws.path().join("late").exists());
    // Killing or signalling the worker: it is not even visible.
    let me = std::process::id();
    let code = format!("import os, signal\nfor pid in ({me}, 1, -1):\n    try: os.kill(pid, signal.SIGKILL)\n    except OSError: pass\nprint('done')");
    let _ = run(&cell, ws.path(), &code).await;
    // ptrace.
    contained(&cell, "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint('CONTAINED' if libc.ptrace(0, 0, 0, 0) != 0 else 'ESCAPED')").await;
    // Namespaces and mounts.
    contained(&cell, "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nok = libc.unshare(0x10000000) != 0 and libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) != 0\nprint('CONTAINED' if ok else 'ESCAPED')").await;
    // io_uring (I/O the seccomp filter would never see) and vsock (the hypervisor's side door).
    contained(&cell, "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nfd = libc.syscall(425, 8, ctypes.create_string_buffer(120))\nprint('CONTAINED' if fd < 0 else 'ESCAPED')").await;
    contained(&cell, "import socket\ntry:\n    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM); print('ESCAPED')\nexcept OSError: print('CONTAINED')").await;
    // The private /tmp is bounded: filling it stops at its size.
    contained(&cell, "n = 0\ntry:\n    for i in range(64):\n        open(f'/tmp/f{i}', 'wb').write(b'x' * (4 << 20)); n += 1\n    print('ESCAPED')\nexcept OSError: print('CONTAINED' if n < 20 else 'ESCAPED')").await;
    // /dev takes no files, and /dev/shm is bounded like /tmp.
    contained(&cell, "try:\n    open('/dev/filler', 'wb').write(b'x'); print('ESCAPED')\nexcept OSError: print('CONTAINED')").await;
    contained(&cell, "n = 0\ntry:\n    for i in range(64):\n        open(f'/dev/shm/f{i}', 'wb').write(b'x' * (1 << 20)); n += 1\n    print('ESCAPED')\nexcept OSError: print('CONTAINED' if n < 20 else 'ESCAPED')").await;
    // The worker is unharmed: a normal run still works.
    let r = run(&cell, ws.path(), "print(40 + 2)").await;
    assert_eq!(r.stdout.trim(), "42");
}

#[tokio::test]
async fn landlock_is_a_second_wall_inside_the_cell() {
    let cell = cell().await;
    // The init binary is mounted (bubblewrap would let it be read); Landlock does not.
    contained(
        &cell,
        "import os\nassert os.environ.get('CELL_LANDLOCK') in ('full', 'partial'), os.environ\ntry:\n    open('/run/turnpike-init', 'rb').read(1); print('ESCAPED')\nexcept PermissionError:\n    print('CONTAINED')",
    )
    .await;
}

#[tokio::test]
async fn output_is_capped() {
    let cell = cell().await;
    let ws = tempfile::tempdir().unwrap();
    let r = run(
        &cell,
        ws.path(),
        "import sys\nsys.stdout.write('x' * (1 << 20))",
    )
    .await;
    assert!(r.truncated);
    assert_eq!(r.stdout.len(), 64 * 1024);
    assert_eq!(r.exit_code, Some(0));
}

const EXEC: &str = r#"
[[turn]]
[[turn.step]]
tool_calls = [{ name = "exec", arguments = { code = "open('result.csv', 'w').write('a,b\\n1,2\\n'); print('done')" } }]
[[turn.step]]
text = "{last_tool}"
"#;

#[tokio::test]
async fn exec_runs_in_the_cell_and_its_files_become_references() {
    use turnpike_tests::turns::{replies, Rig, RigOptions};
    let mut o = RigOptions::new(EXEC);
    o.tools.push("exec".into());
    o.cell = true;
    let rig = Rig::with(o).await;
    rig.say("compute it").await;
    rig.wait_turns(1).await;
    let result: serde_json::Value = serde_json::from_str(&replies(&rig.log(1).await)[0]).unwrap();
    assert_eq!(result["exit_code"], 0, "{result}");
    assert_eq!(result["stdout"], "done\n");
    let reference = result["files"][0]["reference"].as_str().unwrap().to_owned();
    assert_eq!(reference, format!("conv:gi:{}/turn_1/result.csv", rig.conv));
    // The file is in the version the turn published (its ref is written just after the commit).
    rig.wait_settled().await;
    let resolver = turnpike_resolver::Resolver::standard(
        rig.conversations.directory().clone(),
        rig.conversations.store().clone(),
    );
    let bytes = resolver
        .resolve_str(&turnpike_tests::fixtures::owner(), &reference)
        .await
        .unwrap()
        .bytes;
    assert_eq!(&bytes[..], b"a,b\n1,2\n");
    rig.stop().await;
}

#[tokio::test]
async fn without_a_sandbox_exec_refuses_and_runs_nothing() {
    use turnpike_tests::turns::{Rig, RigOptions};
    let mut o = RigOptions::new(EXEC);
    o.tools.push("exec".into());
    let rig = Rig::with(o).await;
    rig.say("compute it").await;
    rig.wait_turns(1).await;
    let log = rig.log(1).await;
    let error = log
        .blocks
        .iter()
        .find_map(|b| match b {
            turnpike_schemas::Block::ToolResult {
                ok: false, output, ..
            } => Some(output["error"].to_string()),
            _ => None,
        })
        .unwrap();
    assert!(
        error.contains("exec is not available") && error.contains("sandbox"),
        "{error}"
    );
    // Nothing ran: no version with a result file (read once the turn is promoted).
    rig.wait_settled().await;
    let lineage =
        turnpike_artifactory::git::Lineage::new(rig.conversations.store().clone(), rig.prefix());
    assert_eq!(
        lineage
            .ref_of(turnpike_schemas::TurnId::FIRST)
            .await
            .unwrap(),
        None
    );
    rig.stop().await;

    // And a machine without bubblewrap is detected as such.
    let missing = Cell::detect(CellConfig {
        bwrap: "/nonexistent/bwrap".into(),
        ..CellConfig::default()
    })
    .await
    .unwrap_err();
    assert!(missing.contains("bubblewrap is not installed"), "{missing}");
}

const LEFTOVERS: &str = r#"
[[turn]]
when = "fifo"
[[turn.step]]
tool_calls = [{ name = "exec", arguments = { code = "import os; os.mkfifo('pipe'); print('made')" } }]
[[turn.step]]
tool_calls = [{ name = "read_file", arguments = { path = "pipe" } }, { name = "publish", arguments = { path = "pipe" } }, { name = "write_file", arguments = { path = "pipe", content = "x" } }]
[[turn.step]]
text = "done with the pipe"

[[turn]]
when = "link"
[[turn.step]]
tool_calls = [{ name = "exec", arguments = { code = "import os; os.symlink('/etc/passwd', 'link'); open('real.txt', 'w').write('x'); print('made')" } }]
[[turn.step]]
text = "done with the link"

[[turn]]
when = "many"
[[turn.step]]
tool_calls = [{ name = "exec", arguments = { code = "import os\nos.makedirs('d', exist_ok=True)\nfor i in range(10001): open(f'd/f{i}', 'w').close()\nprint('made')" } }]
[[turn.step]]
text = "done with the files"

[[turn]]
when = "big"
[[turn.step]]
tool_calls = [{ name = "exec", arguments = { code = "for i in range(5):\n    f = open(f'big{i}', 'wb'); f.truncate(60 * 1024 * 1024); f.close()\nprint('made')" } }]
[[turn.step]]
text = "done with the big files"
"#;

#[tokio::test]
async fn special_files_links_and_trees_past_the_quota_fail_the_turn_and_commit_nothing() {
    use turnpike_schemas::{Block, EntryBody, TurnId};
    use turnpike_tests::turns::{Rig, RigOptions};
    let mut o = RigOptions::new(LEFTOVERS);
    o.tools.push("exec".into());
    o.cell = true;
    let rig = Rig::with(o).await;
    let lineage =
        turnpike_artifactory::git::Lineage::new(rig.conversations.store().clone(), rig.prefix());
    let cases = [
        ("fifo", "a FIFO at pipe"),
        ("link", "a symbolic link at link"),
        ("many", "more than 10000 files"),
        ("big", "more than 268435456 bytes"),
    ];
    for (n, (word, reason)) in cases.iter().enumerate() {
        let n = n as u64 + 1;
        rig.say(word).await;
        rig.wait_turns(n).await;
        let log = rig.log(n).await;
        assert_eq!(
            log.outcome,
            turnpike_schemas::entry::TurnOutcome::Failed,
            "{word}"
        );
        let record = rig.record();
        let entries = record.entries().await.unwrap();
        let error = entries
            .iter()
            .rev()
            .find_map(|e| match &e.body {
                EntryBody::Error(err) => Some(err.message.clone()),
                _ => None,
            })
            .unwrap();
        assert!(error.contains(reason), "{word}: {error}");
        // Nothing of it was committed as a version (read once the turn is promoted).
        rig.wait_settled().await;
        assert_eq!(
            lineage.ref_of(TurnId::new(n).unwrap()).await.unwrap(),
            None,
            "{word}"
        );
        if *word == "fifo" {
            // Every tool that touched the pipe was refused at once; none blocked.
            let refused = log
                .blocks
                .iter()
                .filter(|b| matches!(b, Block::ToolResult { ok: false, .. }))
                .count();
            assert_eq!(refused, 3, "{:#?}", log.blocks);
        }
    }
    rig.stop().await;
}

/// Whether any process on this host runs as `uid`.
fn any_process_of(uid: u32) -> bool {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("status")).ok())
        .any(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().next())
                .and_then(|real| real.parse::<u32>().ok())
                == Some(uid)
        })
}

#[tokio::test]
async fn the_cell_never_runs_as_host_root_and_may_change_what_the_host_wrote() {
    let cell = cell().await;
    let ws = tempfile::tempdir().unwrap();
    // What the host (a root worker's tools) wrote before the run.
    std::fs::write(ws.path().join("notes.txt"), "from the host\n").unwrap();
    std::fs::create_dir(ws.path().join("data")).unwrap();
    let r = run(
        &cell,
        ws.path(),
        "import os\nopen('notes.txt', 'a').write('from the cell\\n')\nopen('data/out.csv', 'w').write('a\\n')\n\
         print('ok')",
    )
    .await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert_ne!(r.uid, 0, "a cell ran as host root");
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        assert!(
            turnpike_worker::cell::CELL_UIDS.contains(&r.uid),
            "{}",
            r.uid
        );
    }
    // Seen from the host, what the cell made belongs to that unprivileged uid.
    use std::os::unix::fs::MetadataExt as _;
    let made = std::fs::metadata(ws.path().join("data/out.csv")).unwrap();
    assert_eq!(made.uid(), r.uid);
    assert_eq!(
        std::fs::read_to_string(ws.path().join("notes.txt")).unwrap(),
        "from the host\nfrom the cell\n"
    );
    assert!(ws.path().join("data/out.csv").is_file());
}

fn per_cell_budget_config() -> CellConfig {
    CellConfig {
        limits: Limits {
            wall: Duration::from_secs(20),
            cpu_seconds: 5,
            processes: 24,
            ..Limits::default()
        },
        cgroups: false,
        init: Some(env!("CARGO_BIN_EXE_turnpike").into()),
        ..CellConfig::default()
    }
}

/// Item 2 of the third adversarial look: each cell's process budget is its own. Two cells of
/// two tenants at once, where no cgroup is made: the first forks until the kernel says no and
/// holds its children; the second, started only then, still forks all it asks for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_forking_to_its_limit_leaves_another_cells_budget_alone() {
    let cell = Cell::detect(per_cell_budget_config())
        .await
        .expect("the sandbox works here");
    let greedy_ws = tempfile::tempdir().unwrap();
    let greedy = {
        let (cell, ws) = (cell.clone(), greedy_ws.path().to_path_buf());
        tokio::spawn(async move {
            run(
                &cell,
                &ws,
                "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(30); os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nopen('full', 'w').write(str(n))\ntime.sleep(8)\nprint('forked', n, flush=True)\n",
            )
            .await
        })
    };
    // Until the greedy cell holds all it could get.
    let full = greedy_ws.path().join("full");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !full.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the greedy cell never filled up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held: u64 = std::fs::read_to_string(&full).unwrap().parse().unwrap();
    assert!((10..24).contains(&held), "the greedy cell forked {held}");
    let ws = tempfile::tempdir().unwrap();
    let modest = run(
        &cell,
        ws.path(),
        "import os\nkids = []\nfor _ in range(10):\n    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n    kids.append(pid)\nfor pid in kids:\n    os.waitpid(pid, 0)\nprint('forked', len(kids))\n",
    )
    .await;
    assert_eq!(modest.stdout.trim(), "forked 10", "{modest:?}");
    let greedy = greedy.await.unwrap();
    assert_ne!(greedy.uid, modest.uid, "two cells shared a uid");
    assert!(greedy.stdout.contains("forked"), "{greedy:?}");
}

/// Item 2: a worker with many threads of its own still starts cells (its threads are not in
/// any cell's budget).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_many_threads_still_starts_cells() {
    let cell = Cell::detect(per_cell_budget_config())
        .await
        .expect("the sandbox works here");
    let (stop, parked) = std::sync::mpsc::channel::<()>();
    let parked = std::sync::Arc::new(std::sync::Mutex::new(parked));
    let threads: Vec<_> = (0..200)
        .map(|_| {
            let parked = parked.clone();
            std::thread::spawn(move || {
                let _ = parked.lock().unwrap().recv_timeout(Duration::from_secs(60));
            })
        })
        .collect();
    let ws = tempfile::tempdir().unwrap();
    let r = run(
        &cell,
        ws.path(),
        "import os\nif os.fork() == 0:\n    os._exit(0)\nos.wait()\nprint(40 + 2)",
    )
    .await;
    assert_eq!(r.stdout.trim(), "42", "{r:?}");
    drop(stop);
    for t in threads {
        t.join().unwrap();
    }
}

/// Item 2: where a worker can give cells no budget of their own (not root, no cgroup it may
/// create), `exec` refuses and says why — it never runs cells on the worker's shared budget.
/// Run as an unprivileged user (nobody) through `turnpike cell run`.
#[test]
fn without_a_budget_of_its_own_a_cell_refuses_to_run() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to become another user");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let script = dir.path().join("hello.py");
    std::fs::write(&script, "print('ran')\n").unwrap();
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_turnpike"))
        .args(["cell", "run"])
        .arg(&script)
        .env("TMPDIR", dir.path())
        .env("HOME", dir.path())
        .output()
        .expect("setpriv runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    assert!(!stdout.contains("ran"), "{stdout}");
    assert!(
        stderr.contains("share one process budget") && stderr.contains("uid 65534"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_fork_bomb_is_contained_where_no_cgroup_can_be_made() {
    let config = CellConfig {
        limits: Limits {
            wall: Duration::from_secs(5),
            cpu_seconds: 3,
            processes: 24,
            ..Limits::default()
        },
        cgroups: false,
        init: Some(env!("CARGO_BIN_EXE_turnpike").into()),
        ..CellConfig::default()
    };
    let cell = Cell::detect(config).await.expect("the sandbox works here");
    let ws = tempfile::tempdir().unwrap();
    // Children that stay, forked until the kernel says no.
    let r = run(
        &cell,
        ws.path(),
        "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(60); os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nprint('forked', n, flush=True)\n",
    )
    .await;
    assert_ne!(r.uid, 0);
    let forked: u64 = r
        .stdout
        .trim()
        .strip_prefix("forked ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{r:?}"));
    assert!(
        forked < 24,
        "the process limit did not bind: {forked} forks"
    );
    // Nothing of the run outlives it.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while any_process_of(r.uid) {
        assert!(
            std::time::Instant::now() < deadline,
            "processes of uid {} outlived their cell",
            r.uid
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The bomb proper: it ends, and the next run works.
    let r = run(
        &cell,
        ws.path(),
        "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass\n",
    )
    .await;
    assert!(r.exit_code != Some(0), "{r:?}");
    let r = run(&cell, ws.path(), "print(40 + 2)").await;
    assert_eq!(r.stdout.trim(), "42");
}
