//! A fleet on a 3-node JetStream cluster with `--replicas 3`: the node the router is connected
//! to is killed mid-run. The router and the workers fail over to the other nodes (they were
//! given all three), and every message a client sent — retried with its idempotency key while
//! the failover refused it — becomes exactly one turn's input, in order; none is lost.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use turnpike_edge::client::Client;
use turnpike_router::{JetStreamBus, JetStreamConfig};
use turnpike_tests::edge::wait_for_complete_turns;
use turnpike_tests::nats::NatsServer;
use turnpike_tests::process::Process;
use turnpike_tests::services::free_port;

const LONG: Duration = Duration::from_secs(120);
const CONVERSATIONS: usize = 6;
const MESSAGES: usize = 6;

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_turnpike"))
}

/// Three nodes, clustered, JetStream on each; and each one's monitoring port.
fn cluster() -> (Vec<NatsServer>, Vec<u16>) {
    let routes: Vec<u16> = (0..3).map(|_| free_port().unwrap()).collect();
    let monitors: Vec<u16> = (0..3).map(|_| free_port().unwrap()).collect();
    let nodes = (0..3)
        .map(|i| {
            let (routes, monitor) = (routes.clone(), monitors[i]);
            NatsServer::start_with_conf(move |port, store| {
                let others: Vec<String> = routes
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, p)| format!("\"nats-route://127.0.0.1:{p}\""))
                    .collect();
                format!(
                    "server_name: n{i}\nlisten: 127.0.0.1:{port}\nhttp: 127.0.0.1:{monitor}\n\
                     jetstream {{ store_dir: \"{}\" }}\n\
                     cluster {{ name: tp, listen: 127.0.0.1:{}, routes: [{}] }}\n",
                    store.display(),
                    routes[i],
                    others.join(", ")
                )
            })
            .expect("a cluster node")
        })
        .collect();
    (nodes, monitors)
}

/// The NATS connections a node holds, by name.
async fn connection_names(monitor: u16) -> Vec<String> {
    let Ok(reply) = reqwest::get(format!("http://127.0.0.1:{monitor}/connz")).await else {
        return Vec::new();
    };
    let body: Value = reply.json().await.unwrap_or(Value::Null);
    body["connections"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect()
}

/// Sends a message, retrying (same idempotency key) while the fleet refuses it.
async fn send(client: &Client, id: &str, text: &str) {
    let deadline = Instant::now() + LONG;
    loop {
        let sent = client
            .send(
                reqwest::Method::POST,
                &format!("/v1/conversations/{id}/messages"),
                Some(&json!({ "text": text })),
                Some(&text.replace(' ', "-")),
            )
            .await;
        match sent {
            Ok(reply) if reply.status == 202 => return,
            Ok(reply) if reply.status == 503 || reply.status == 429 => {}
            Ok(reply) => panic!("{text}: {} {}", reply.status, reply.body),
            Err(_) => {}
        }
        assert!(Instant::now() < deadline, "{text} was never accepted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routers_nats_node_killed_mid_run_loses_no_accepted_message() {
    let (mut nodes, monitors) = cluster();
    let urls: Vec<String> = nodes.iter().map(NatsServer::url).collect();
    let url_list = urls.join(",");
    // The cluster is ready once a replicated stream can be made.
    let deadline = Instant::now() + LONG;
    loop {
        let connected = JetStreamBus::connect(JetStreamConfig {
            url: url_list.clone(),
            replicas: 3,
            ..Default::default()
        })
        .await;
        if connected.is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no cluster: {:?}",
            connected.err()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        "[[tokens]]\ntoken = \"t\"\nidentity = \"local:ana\"\n",
    )
    .unwrap();
    let key = turnpike_artifactory::RecordSigner::from_seed([9; 32]).to_hex();
    let start = |name: &str, command: &[String], ready: &str| -> Process {
        let mut args: Vec<String> = vec![
            "--data-dir".into(),
            dir.path().join(name).display().to_string(),
            "--store".into(),
            format!("file://{}", dir.path().join("store").display()),
            "--nats-url".into(),
            url_list.clone(),
            "--replicas".into(),
            "3".into(),
        ];
        args.extend(command.iter().cloned());
        let mut p = Process::start(
            &binary(),
            &args,
            &[
                ("TURNPIKE_SIGNING_KEY", key.clone()),
                ("TURNPIKE_EMBEDDING_MODEL", "/nonexistent".into()),
            ],
        )
        .unwrap();
        p.wait_for_line(ready, LONG).unwrap();
        p
    };
    let _workers: Vec<Process> = (0..2)
        .map(|k| start(&format!("w{k}"), &["worker".into()], "ready"))
        .collect();
    let port = free_port().unwrap();
    let _router = start(
        "router",
        &[
            "router".into(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--tokens".into(),
            tokens.display().to_string(),
        ],
        "router ready",
    );
    let client = Client::new(&format!("http://127.0.0.1:{port}"), "t");
    let mut ids = Vec::new();
    for _ in 0..CONVERSATIONS {
        ids.push(turnpike_tests::edge::create(&client, "demo", "assistant").await);
    }
    let text = |c: usize, m: usize| format!("c{c} m{m}");
    // The first half of the messages, on the whole cluster.
    for m in 0..MESSAGES / 2 {
        for (c, id) in ids.iter().enumerate() {
            send(&client, id, &text(c, m)).await;
        }
    }
    // Kill the node the router is connected to.
    let mut victim = None;
    for (i, monitor) in monitors.iter().enumerate() {
        if connection_names(*monitor)
            .await
            .iter()
            .any(|n| n.starts_with("turnpike router"))
        {
            victim = Some(i);
        }
    }
    let victim = victim.expect("the router is connected to some node");
    nodes[victim].stop().unwrap();
    // The rest, while the router fails over.
    for m in MESSAGES / 2..MESSAGES {
        for (c, id) in ids.iter().enumerate() {
            send(&client, id, &text(c, m)).await;
        }
    }
    // The router moved to a surviving node.
    let deadline = Instant::now() + LONG;
    loop {
        let mut on = Vec::new();
        for (i, monitor) in monitors.iter().enumerate() {
            if i != victim
                && connection_names(*monitor)
                    .await
                    .iter()
                    .any(|n| n.starts_with("turnpike router"))
            {
                on.push(i);
            }
        }
        if !on.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "the router never reconnected");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Every message is one turn's input, once, in order; every turn replied.
    for (c, id) in ids.iter().enumerate() {
        let want: Vec<String> = (0..MESSAGES).map(|m| text(c, m)).collect();
        let deadline = Instant::now() + LONG;
        loop {
            let turns = wait_for_complete_turns(&client, id, 1, LONG).await.unwrap();
            let inputs: Vec<String> = turns.iter().flat_map(|t| t.inputs.clone()).collect();
            if inputs.len() >= want.len() {
                assert_eq!(inputs, want, "{id}: {turns:#?}");
                assert!(
                    turns
                        .iter()
                        .all(|t| t.outcome.as_deref() == Some("replied")),
                    "{turns:#?}"
                );
                break;
            }
            assert!(Instant::now() < deadline, "{id}: {inputs:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
