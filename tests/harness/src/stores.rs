//! Object store backends for the shared suites: each suite runs against every one of them.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::ObjectStore;

use crate::services::{free_port, program, Service};

/// A store under test, with whatever keeps it alive.
pub struct TestStore {
    pub store: Arc<dyn ObjectStore>,
    _dir: Option<tempfile::TempDir>,
}

/// An in-memory store.
pub fn memory() -> TestStore {
    TestStore {
        store: Arc::new(InMemory::new()),
        _dir: None,
    }
}

/// A local filesystem store in a fresh temporary directory.
pub fn local() -> TestStore {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = LocalFileSystem::new_with_prefix(dir.path()).expect("a local store");
    TestStore {
        store: Arc::new(store),
        _dir: Some(dir),
    }
}

/// The local SQLite store (the embedded default) in a fresh temporary directory, without
/// fsync (what is tested here is what it keeps, not what survives a power cut).
pub fn sqlite() -> TestStore {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = turnpike_artifactory::sqlite_store::SqliteStore::open(dir.path(), false)
        .expect("a SQLite store");
    TestStore {
        store: Arc::new(store),
        _dir: Some(dir),
    }
}

/// A fresh bucket on a real S3-compatible server (moto) on loopback, shared by the process.
pub fn s3() -> TestStore {
    let moto = moto().expect("the S3-compatible test server (moto_server)");
    static BUCKETS: AtomicU64 = AtomicU64::new(0);
    let bucket = format!(
        "tp-{}-{}",
        std::process::id(),
        BUCKETS.fetch_add(1, Ordering::Relaxed)
    );
    create_bucket(moto.addr, &bucket).expect("creating a test bucket");
    let store = AmazonS3Builder::new()
        .with_endpoint(format!("http://{}", moto.addr))
        .with_allow_http(true)
        .with_bucket_name(&bucket)
        .with_region("us-east-1")
        .with_access_key_id("test")
        .with_secret_access_key("test")
        .build()
        .expect("an S3 store");
    TestStore {
        store: Arc::new(store),
        _dir: None,
    }
}

/// The process's moto server, started on first use.
pub fn moto() -> Result<&'static Service> {
    static MOTO: OnceLock<std::result::Result<Service, String>> = OnceLock::new();
    MOTO.get_or_init(|| start_moto().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow::anyhow!("{e}"))
}

fn start_moto() -> Result<Service> {
    let program = program("moto_server", "TURNPIKE_MOTO_SERVER")?;
    let port = free_port()?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    Service::start(
        &program,
        &[
            "-H".into(),
            "127.0.0.1".into(),
            "-p".into(),
            port.to_string(),
        ],
        addr,
        Duration::from_secs(60),
    )
}

/// Creates a bucket with a plain HTTP request (moto does not check signatures).
fn create_bucket(addr: SocketAddr, bucket: &str) -> Result<()> {
    let mut stream = TcpStream::connect(addr).context("connecting to moto")?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        stream,
        "PUT /{bucket} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    if !response.starts_with("HTTP/1.1 200") {
        bail!(
            "creating bucket {bucket}: {}",
            response.lines().next().unwrap_or("")
        );
    }
    Ok(())
}
