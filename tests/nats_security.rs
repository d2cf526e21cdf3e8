//! The bus carries every user's messages: a fleet talks to a real nats-server that requires
//! TLS with client certificates and an nkey user. A worker and a router with the right
//! credentials run turns (the first server in their list being down); without the nkey, or
//! without the CA, a process does not start, and says why.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use turnpike_tests::edge::{create, say, wait_for_complete_turns};
use turnpike_tests::fixtures::signer;
use turnpike_tests::nats::NatsServer;
use turnpike_tests::process::Process;

const LONG: Duration = Duration::from_secs(120);

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_turnpike"))
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA.
fn certificates(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        dir,
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=turnpike-test-ca",
            ],
        ]
        .concat(),
    );
    for (name, usage, san) in [
        (
            "server",
            "serverAuth",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        ),
        ("client", "clientAuth", ""),
    ] {
        openssl(
            dir,
            &[
                &["req"][..],
                &ec,
                &[
                    "-keyout",
                    &format!("{name}.key"),
                    "-out",
                    &format!("{name}.csr"),
                    "-subj",
                    &format!("/CN=turnpike-{name}"),
                ],
            ]
            .concat(),
        );
        std::fs::write(
            dir.join(format!("{name}.ext")),
            format!("{san}extendedKeyUsage={usage}\n"),
        )
        .unwrap();
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &format!("{name}.pem"),
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
            ],
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_runs_over_tls_with_an_nkey_user_and_is_refused_without_either() {
    let certs = tempfile::tempdir().unwrap();
    certificates(certs.path());
    let user = nkeys::KeyPair::new_user();
    let seed_file = certs.path().join("user.nk");
    std::fs::write(&seed_file, user.seed().unwrap()).unwrap();
    let public = user.public_key();
    let dir = certs.path().to_path_buf();
    let nats = NatsServer::start_with_conf(|port, store| {
        format!(
            r#"listen: "127.0.0.1:{port}"
jetstream {{ store_dir: "{store}" }}
tls {{
  cert_file: "{dir}/server.pem"
  key_file: "{dir}/server.key"
  ca_file: "{dir}/ca.pem"
  verify: true
  timeout: 2
}}
authorization {{ users: [ {{ nkey: "{public}" }} ] }}
"#,
            store = store.display(),
            dir = dir.display(),
        )
    })
    .unwrap();
    let dead = turnpike_tests::services::free_port().unwrap();
    let servers = format!("nats://127.0.0.1:{dead},{}", nats.url());
    let store = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let tokens = data.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        "[[tokens]]\ntoken = \"t-ana\"\nidentity = \"oidc:acme:ana\"\ntenant = \"acme\"\n",
    )
    .unwrap();
    let path = |name: &str| certs.path().join(name).display().to_string();
    let common = |with_nkey: bool, with_ca: bool| -> Vec<String> {
        let mut args = vec![
            "--data-dir".into(),
            data.path().display().to_string(),
            "--store".into(),
            format!("file://{}", store.path().display()),
            "--nats-url".into(),
            servers.clone(),
            "--nats-cert".into(),
            path("client.pem"),
            "--nats-key".into(),
            path("client.key"),
        ];
        if with_nkey {
            args.extend(["--nats-nkey-file".into(), seed_file.display().to_string()]);
        }
        if with_ca {
            args.extend(["--nats-ca".into(), path("ca.pem")]);
        }
        args
    };
    let envs = [
        ("TURNPIKE_SIGNING_KEY", signer().to_hex()),
        ("TURNPIKE_LOG", "warn".to_owned()),
    ];
    let start = |args: Vec<String>, ready: &str| -> Process {
        let mut process = Process::start(&binary(), &args, &envs).unwrap();
        process.wait_for_line(ready, LONG).unwrap();
        process
    };

    // With everything: a worker and a router run a turn.
    let mut worker_args = common(true, true);
    worker_args.push("worker".into());
    let _worker = start(worker_args, "worker wkr_");
    let port = turnpike_tests::services::free_port().unwrap();
    let mut router_args = common(true, true);
    router_args.extend([
        "router".into(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--tokens".into(),
        tokens.display().to_string(),
    ]);
    let _router = start(router_args, "router ready");
    let client = turnpike_edge::client::Client::new(&format!("http://127.0.0.1:{port}"), "t-ana");
    let id = create(&client, "demo", "assistant").await;
    say(&client, &id, "over tls").await;
    let turns = wait_for_complete_turns(&client, &id, 1, LONG)
        .await
        .unwrap();
    assert_eq!(turns[0].outcome.as_deref(), Some("replied"), "{turns:#?}");

    // Without the nkey, or without the CA to trust the server, nothing starts.
    for (with_nkey, with_ca, why) in [
        (false, true, "uthorization"),
        (true, false, "the connection: client error"),
    ] {
        let mut args = common(with_nkey, with_ca);
        args.extend(["workers".into(), "--window-ms".into(), "100".into()]);
        let out = Command::new(binary())
            .args(&args)
            .env("TURNPIKE_SIGNING_KEY", signer().to_hex())
            .env("TURNPIKE_LOG", "warn")
            .env_remove("TURNPIKE_NATS_URL")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "nkey {with_nkey}, ca {with_ca}: {said}"
        );
        assert!(said.contains("NATS"), "{said}");
        assert!(said.contains(why), "nkey {with_nkey}, ca {with_ca}: {said}");
    }

    // A token is never sent over plaintext, even to a server that does not ask for TLS.
    let plain = NatsServer::start().unwrap();
    let out = Command::new(binary())
        .args([
            "--data-dir",
            data.path().to_str().unwrap(),
            "--store",
            &format!("file://{}", store.path().display()),
            "--nats-url",
            &plain.url(),
            "workers",
        ])
        .env("TURNPIKE_SIGNING_KEY", signer().to_hex())
        .env("TURNPIKE_NATS_TOKEN", "s3cr3t-token")
        .env("TURNPIKE_LOG", "warn")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("TLS"), "{said}");
    assert!(!said.contains("s3cr3t-token"), "{said}");
}
