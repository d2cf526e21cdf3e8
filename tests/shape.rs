//! The shape of the house: no import circles between the modules of any crate, and the crates
//! layered as DESIGN's table says (the edge depends on neither the worker nor the harness; the
//! harness on none of the stores, the bus or the worker).

use std::path::Path;
use std::process::Command;

use turnpike_tests::shape::ModuleGraph;

/// Every crate root of the workspace (libraries and the binary).
const ROOTS: &[&str] = &[
    "schemas/src/lib.rs",
    "artifactory/src/lib.rs",
    "resolver/src/lib.rs",
    "router/src/lib.rs",
    "index/src/lib.rs",
    "agent/src/lib.rs",
    "lifecycle/src/lib.rs",
    "worker/src/lib.rs",
    "edge/src/lib.rs",
    "cell-init/src/lib.rs",
    "bench/src/lib.rs",
    "tests/harness/src/lib.rs",
    "src/main.rs",
];

#[test]
fn no_crate_has_an_import_circle() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for root in ROOTS {
        let graph = ModuleGraph::read(&workspace.join(root)).unwrap();
        assert!(
            graph.modules.len() > 1 || root.starts_with("cell-init"),
            "{root}: no modules read"
        );
        for (members, ties) in graph.circles() {
            let ties: Vec<String> = ties
                .iter()
                .map(|e| format!("{} -> {} ({}:{})", e.from, e.to, e.file.display(), e.line))
                .collect();
            found.push(format!("{root}: {members:?}\n    {}", ties.join("\n    ")));
        }
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

/// The normal (non-dev) dependencies of `package` among the workspace's crates.
fn depends_on(package: &str) -> Vec<String> {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
            "-p",
            package,
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut crates: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| name.starts_with("turnpike-") && *name != package)
        .map(str::to_owned)
        .collect();
    crates.sort();
    crates.dedup();
    crates
}

#[test]
fn the_crates_are_layered_as_designed() {
    let edge = depends_on("turnpike-edge");
    assert!(
        !edge
            .iter()
            .any(|c| c == "turnpike-worker" || c == "turnpike-agent"),
        "the edge depends on {edge:?}"
    );
    assert_eq!(depends_on("turnpike-agent"), ["turnpike-schemas"]);
    let lifecycle = depends_on("turnpike-lifecycle");
    assert!(
        !lifecycle
            .iter()
            .any(|c| c == "turnpike-worker" || c == "turnpike-agent"),
        "the lifecycle depends on {lifecycle:?}"
    );
}
