//! The image and the compose file in `deploy/`, checked with the tools of the field that
//! install from the registries here: `hadolint` on the Dockerfile, `docker compose config` on
//! the compose file, and assertions on what they render (probes on the admin port, the
//! workers' grace inside the stop grace period, a non-root image, the sandbox's needs only
//! where the cell runs).

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A linter from the services' venv: `$VAR`, else where `scripts/services` puts it.
fn tool(var: &str, name: &str) -> PathBuf {
    let path: PathBuf = std::env::var(var)
        .unwrap_or_else(|_| format!("/var/tmp/turnpike-services/venv/bin/{name}"))
        .into();
    assert!(
        path.exists(),
        "{} is missing: `scripts/services install tests` installs it",
        path.display()
    );
    path
}

/// `30s`, `1m30s` → seconds.
fn seconds(text: &str) -> u64 {
    let mut total = 0;
    let mut number = String::new();
    for c in text.chars() {
        match c {
            '0'..='9' => number.push(c),
            'h' | 'm' | 's' => {
                let n: u64 = number.parse().unwrap();
                total += n * match c {
                    'h' => 3600,
                    'm' => 60,
                    _ => 1,
                };
                number.clear();
            }
            other => panic!("{other:?} in {text:?}"),
        }
    }
    total
}

#[test]
fn the_dockerfile_passes_hadolint_and_builds_a_non_root_image_with_an_init() {
    let dockerfile = root().join("deploy/Dockerfile");
    let out = Command::new(tool("TURNPIKE_HADOLINT", "hadolint"))
        .args(["--failure-threshold", "warning"])
        .arg(&dockerfile)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&dockerfile).unwrap();
    assert!(text.contains("--locked"), "a reproducible build");
    assert!(text.contains("USER 10001"), "not root");
    assert!(text.contains("tini"), "an init reaps the cells' processes");
    assert!(text.contains("bubblewrap"), "the cell's sandbox");
    assert!(text.contains("TURNPIKE_ADMIN_LISTEN=0.0.0.0:7701"));
}

#[test]
fn the_compose_file_renders_a_fleet_with_probes_and_drain_time() {
    let out = Command::new(tool("TURNPIKE_DOCKER_COMPOSE", "docker-compose"))
        .args(["-f"])
        .arg(root().join("deploy/compose.yaml"))
        .args(["config", "--format", "json"])
        .env("TURNPIKE_SIGNING_KEY", "ab".repeat(32))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config: Value = serde_json::from_slice(&out.stdout).unwrap();
    let services = config["services"].as_object().unwrap();
    for needed in [
        "nats", "postgres", "minio", "router-1", "router-2", "worker",
    ] {
        assert!(services.contains_key(needed), "{needed}");
    }
    assert_eq!(services["worker"]["deploy"]["replicas"], 2);
    for (name, service) in services {
        let command: Vec<&str> = service["command"]
            .as_array()
            .map(|c| c.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let turnpike = matches!(command.first(), Some(&"router" | &"worker"));
        if !turnpike {
            assert!(service.get("security_opt").is_none(), "{name}");
            continue;
        }
        // Probed on the admin port, at /readyz.
        let probe = service["healthcheck"]["test"].to_string();
        assert!(probe.contains("127.0.0.1:7701/readyz"), "{name}: {probe}");
        // The drain fits in the stop grace period: a worker's turns (--grace-ms), a router's
        // open streams (--ws-grace-ms, then up to 3 s for their closes and 5 s for the server).
        let stop = seconds(service["stop_grace_period"].as_str().unwrap());
        let flag = |name: &str, default: u64| -> u64 {
            command
                .iter()
                .position(|a| *a == name)
                .map(|i| command[i + 1].parse().unwrap())
                .unwrap_or(default)
        };
        let drain_ms = match command[0] {
            "worker" => flag("--grace-ms", 20_000),
            _ => flag("--ws-grace-ms", 5_000) + 3_000 + 5_000,
        };
        assert!(stop * 1000 > drain_ms, "{name}: {stop}s vs {drain_ms} ms");
        let env = &service["environment"];
        assert_eq!(env["TURNPIKE_NATS_URL"], "nats://nats:4222", "{name}");
        assert!(env["TURNPIKE_STORE"].as_str().unwrap().starts_with("s3://"));
        // The sandbox's needs on the workers only.
        let unconfined = service["security_opt"].to_string().contains("seccomp");
        assert_eq!(unconfined, command[0] == "worker", "{name}");
    }
}
