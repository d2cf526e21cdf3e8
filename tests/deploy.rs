//! The image, the compose file and the Helm chart in `deploy/`, checked with the tools of the
//! field that install from the registries here: `hadolint` on the Dockerfile, `docker compose
//! config` on the compose file, Helm's own engine (`scripts/render-chart`) and
//! `kubernetes-validate --strict` on the chart, and assertions on what they render (probes on
//! the admin port, the workers' grace inside the stop grace period, a non-root image, the
//! sandbox's needs only where the cell runs, disruption budgets only for several replicas).

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

/// Runs `command`, which must succeed (else its output is the failure), and returns its stdout.
fn succeeded(command: &mut Command) -> Vec<u8> {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{:?}: {}{}",
        command.get_program(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
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
    succeeded(
        Command::new(tool("TURNPIKE_HADOLINT", "hadolint"))
            .args(["--failure-threshold", "warning"])
            .arg(&dockerfile),
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
    let out = succeeded(
        Command::new(tool("TURNPIKE_DOCKER_COMPOSE", "docker-compose"))
            .args(["-f"])
            .arg(root().join("deploy/compose.yaml"))
            .args(["config", "--format", "json"])
            .env("TURNPIKE_SIGNING_KEY", "ab".repeat(32)),
    );
    let config: Value = serde_json::from_slice(&out).unwrap();
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

/// The chart rendered with `values` (a file under deploy/chart/ci): every object, and the
/// directory holding one file per object.
fn render(values: &std::path::Path) -> (Vec<Value>, tempfile::TempDir) {
    let out = tempfile::tempdir().unwrap();
    let rendered = succeeded(
        Command::new(tool("TURNPIKE_CHART_PYTHON", "python"))
            .arg(root().join("scripts/render-chart"))
            .arg(values)
            .arg(out.path()),
    );
    let objects: Vec<Value> = serde_json::from_slice(&rendered).unwrap();
    (
        objects.into_iter().map(|o| o["object"].clone()).collect(),
        out,
    )
}

fn find<'a>(objects: &'a [Value], kind: &str, suffix: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"].as_str().unwrap().ends_with(suffix))
}

/// A values file as JSON (read by the services' Python, which the renderer uses too).
fn values_of(path: &std::path::Path) -> Value {
    let out = succeeded(
        Command::new(tool("TURNPIKE_CHART_PYTHON", "python"))
            .args([
                "-c",
                "import json,sys,yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1])) or {}))",
            ])
            .arg(path),
    );
    serde_json::from_slice(&out).unwrap()
}

#[test]
fn the_chart_renders_valid_objects_with_probes_drain_budgets_and_scaling_for_each_ci_values_file() {
    let defaults = values_of(&root().join("deploy/chart/values.yaml"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("deploy/chart/ci"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    let mut saw = (false, false, false); // a PDB, none, a ScaledObject
    for file in &files {
        let values = values_of(file);
        let setting = |path: &[&str]| -> Value {
            let mut v = &values;
            let mut d = &defaults;
            for p in path {
                v = &v[*p];
                d = &d[*p];
            }
            if v.is_null() {
                d.clone()
            } else {
                v.clone()
            }
        };
        let (objects, dir) = render(file);
        let shown = file.display();
        // Every object against the Kubernetes schemas, unknown fields refused.
        let validated = Command::new(tool("TURNPIKE_KUBERNETES_VALIDATE", "kubernetes-validate"))
            .args(["--strict", "-k", "1.33.0"])
            .args(
                std::fs::read_dir(dir.path())
                    .unwrap()
                    .map(|e| e.unwrap().path()),
            )
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&validated.stdout).to_string()
            + &String::from_utf8_lossy(&validated.stderr);
        assert!(validated.status.success(), "{shown}: {said}");
        for line in said.lines().filter(|l| l.starts_with("WARN")) {
            // Only the KEDA custom resource has no schema in kubernetes-validate.
            assert!(line.contains("ScaledObject"), "{shown}: {line}");
        }

        // Disruption budgets only where there is more than one pod.
        let keda = setting(&["autoscaling", "keda", "enabled"]) == true;
        let workers = if keda {
            setting(&["autoscaling", "keda", "minReplicas"])
        } else {
            setting(&["worker", "replicas"])
        }
        .as_u64()
        .unwrap();
        let routers = setting(&["router", "replicas"]).as_u64().unwrap();
        for (suffix, replicas) in [("-router", routers), ("-worker", workers)] {
            let pdb = find(&objects, "PodDisruptionBudget", suffix);
            assert_eq!(pdb.is_some(), replicas > 1, "{shown}: {suffix} x{replicas}");
            if pdb.is_some() {
                saw.0 = true;
            } else {
                saw.1 = true;
            }
        }

        let worker = find(&objects, "Deployment", "-worker").expect("a worker Deployment");
        let router = find(&objects, "Deployment", "-router").expect("a router Deployment");
        assert!(find(&objects, "Service", "-router").is_some(), "{shown}");
        // The drain: --grace-ms is the drain timeout, inside the pod's grace.
        let drain = setting(&["worker", "drainTimeoutSeconds"])
            .as_u64()
            .unwrap();
        let pod = &worker["spec"]["template"]["spec"];
        let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
        assert!(grace > drain, "{shown}: grace {grace} vs drain {drain}");
        let args: Vec<&str> = pod["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let at = args.iter().position(|a| *a == "--grace-ms").unwrap();
        assert_eq!(args[at + 1], (drain * 1000).to_string(), "{shown}");
        // NATS credentials are passed whenever the Secret holds them.
        let creds = setting(&["secrets", "natsCreds"]) != ""
            || setting(&["secrets", "natsCredsInSecret"]) == true;
        assert_eq!(args.contains(&"--nats-creds"), creds, "{shown}");
        // HTTPS (the store and the models) is open unless CIDRs narrow it.
        if let Some(policy) = find(&objects, "NetworkPolicy", "-worker") {
            let https = policy["spec"]["egress"]
                .as_array()
                .unwrap()
                .iter()
                .find(|rule| rule["ports"][0]["port"] == 443)
                .expect("an HTTPS egress rule");
            let cidrs = setting(&["networkPolicy", "egress", "httpsCidrs"]);
            assert_eq!(
                https.get("to").is_some(),
                cidrs.as_array().is_some_and(|c| !c.is_empty()),
                "{shown}: {https}"
            );
        }
        for deployment in [worker, router] {
            let pod = &deployment["spec"]["template"]["spec"];
            assert_eq!(pod["automountServiceAccountToken"], false, "{shown}");
            let container = &pod["containers"][0];
            // Probes on the admin port, at the paths the admin listener serves.
            let admin = container["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == "admin")
                .expect("an admin port");
            assert_eq!(admin["containerPort"], 7701);
            for (probe, path) in [
                ("livenessProbe", "/livez"),
                ("readinessProbe", "/readyz"),
                ("startupProbe", "/livez"),
            ] {
                assert_eq!(container[probe]["httpGet"]["path"], path, "{shown} {probe}");
                assert_eq!(
                    container[probe]["httpGet"]["port"], "admin",
                    "{shown} {probe}"
                );
            }
            assert_eq!(
                container["securityContext"]["allowPrivilegeEscalation"],
                false
            );
            assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        }
        // Only the worker, where cells run, loosens seccomp (and only for bubblewrap).
        assert_eq!(
            router["spec"]["template"]["spec"]["containers"][0]["securityContext"]
                ["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        // An unmasked /proc for the cells' own procfs, only with user namespaces for the pod.
        let worker_container = &pod["containers"][0]["securityContext"];
        if setting(&["cell", "unmaskedProc"]) == true {
            assert_eq!(worker_container["procMount"], "Unmasked", "{shown}");
            assert_eq!(pod["hostUsers"], false, "{shown}");
        } else {
            assert!(worker_container.get("procMount").is_none(), "{shown}");
        }
        if let Some(sa) = find(&objects, "ServiceAccount", "") {
            assert_eq!(sa["automountServiceAccountToken"], false);
        }

        // The config file every process reads is one turnpike accepts, and the admin listener
        // it sets is where the probes look.
        let config = find(&objects, "ConfigMap", "-config").unwrap()["data"]["turnpike.toml"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            config.contains("admin-listen = \"0.0.0.0:7701\""),
            "{config}"
        );
        let file = dir.path().join("turnpike.toml");
        std::fs::write(&file, &config).unwrap();
        for command in ["router", "worker"] {
            succeeded(Command::new(env!("CARGO_BIN_EXE_turnpike")).args([
                "--config",
                file.to_str().unwrap(),
                "config",
                "show",
                "--for",
                command,
            ]));
        }

        // KEDA: one Prometheus trigger on the summed backlog; every metadata value a string.
        match find(&objects, "ScaledObject", "-worker") {
            Some(scaled) => {
                assert!(keda, "{shown}");
                saw.2 = true;
                assert_eq!(
                    scaled["spec"]["scaleTargetRef"]["name"],
                    worker["metadata"]["name"]
                );
                let triggers = scaled["spec"]["triggers"].as_array().unwrap();
                assert_eq!(triggers.len(), 1);
                assert_eq!(triggers[0]["type"], "prometheus");
                for (key, value) in triggers[0]["metadata"].as_object().unwrap() {
                    assert!(value.is_string(), "{shown}: KEDA metadata {key} = {value}");
                }
                let query = triggers[0]["metadata"]["query"].as_str().unwrap();
                assert!(query.contains("turnpike_lane_pending"), "{query}");
                // A fixed replica count would fight the autoscaler.
                assert!(worker["spec"].get("replicas").is_none(), "{shown}");
            }
            None => assert!(!keda, "{shown}"),
        }
    }
    assert_eq!(saw, (true, true, true), "the ci values cover each case");
}
