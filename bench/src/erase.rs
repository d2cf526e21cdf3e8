//! `turnpike bench erase`: how fast conversations leave every store, and what the sweep costs
//! when nothing is due.
//!
//! Each conversation is written as workers write it — 10 turns (record batches, turn logs, a
//! snapshot) and 3 hosted files, with its directory entry — then deleted by the [`Eraser`]
//! under its lease on an embedded bus (lane purge included; no index). The floor, measured in
//! the same run on the same store: deleting as many plain objects by listing and deleting them.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;
use futures::TryStreamExt as _;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};
use turnpike_artifactory::{Conversations, DirectoryEntry, Files, RecordSigner};
use turnpike_lifecycle::erasure::Eraser;
use turnpike_schemas::{RefPath, TurnId};

/// Writes `n` conversations of 10 turns and 3 files each; returns their directory entries.
async fn conversations(
    store: &Arc<dyn ObjectStore>,
    signer: &RecordSigner,
    n: usize,
) -> Result<Vec<DirectoryEntry>> {
    let files = Files::new(store.clone());
    let directory = turnpike_artifactory::Directory::new(store.clone());
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let (prefix, _) = crate::context::build(store, signer, 11, None).await?;
        for (i, name) in ["notes.md", "plan.txt", "data.csv"].iter().enumerate() {
            let turn = TurnId::new(3 * i as u64 + 1).expect("non-zero");
            files
                .host(
                    &prefix,
                    turn,
                    1,
                    &RefPath::parse(name)?,
                    Bytes::from(vec![b'x'; 4096]),
                )
                .await?;
        }
        let entry = DirectoryEntry {
            conversation: prefix.conversation(),
            tenant: prefix.tenant().clone(),
            owner: "local:bench".parse()?,
            app: "bench".parse()?,
            agent: "bench".parse()?,
            created_ms: 0,
            instructions: None,
            started_by: None,
        };
        directory.create(&entry).await?;
        directory.close(entry.conversation, 0).await?;
        out.push(entry);
    }
    Ok(out)
}

async fn count(store: &Arc<dyn ObjectStore>, prefix: &str) -> Result<usize> {
    let metas: Vec<_> = store.list(Some(&Path::from(prefix))).try_collect().await?;
    Ok(metas.len())
}

/// Runs the benchmark: `n` conversations, on a local store under `dir` or at `store_url`.
pub async fn run(
    n: usize,
    dir: Option<std::path::PathBuf>,
    store_url: Option<String>,
) -> Result<ExitCode> {
    let (tmp, store, place) = crate::bench_store(dir, store_url)?;
    let bus = turnpike_router::embedded::EmbeddedBus::open(
        &tmp.path().join("bus.redb"),
        Default::default(),
    )?;
    let signer = RecordSigner::generate()?;
    println!("turnpike bench erase: {place}, {n} conversations of 10 turns and 3 files each");
    let entries = conversations(&store, &signer, n).await?;
    let objects = count(&store, "tenants").await?;
    println!(
        "written: {objects} objects ({:.1} per conversation)",
        objects as f64 / n as f64
    );

    // The floor: as many plain objects, listed and deleted.
    let floor_prefix = "bench-floor";
    for i in 0..objects {
        store
            .put(
                &Path::from(format!("{floor_prefix}/{i:08}")),
                PutPayload::from_static(b"x"),
            )
            .await?;
    }
    let t0 = Instant::now();
    let paths: Vec<Path> = store
        .list(Some(&Path::from(floor_prefix)))
        .map_ok(|m| m.location)
        .try_collect()
        .await?;
    for path in paths {
        store.delete(&path).await?;
    }
    let floor = t0.elapsed();

    let conversations = Conversations::new(store.clone());
    let eraser = Eraser::new(conversations.clone(), bus, None);
    // The sweep's cost with nothing due: every conversation is closed, none past retention.
    let t0 = Instant::now();
    let closed = conversations.directory().closed_list().await?;
    let pending = conversations.tombstones().pending().await?;
    let sweep = t0.elapsed();
    anyhow::ensure!(closed.len() == n && pending.is_empty());

    let t0 = Instant::now();
    for entry in &entries {
        eraser
            .erase(entry, "bench", "bench")
            .await
            .map_err(anyhow::Error::new)?;
    }
    let erase = t0.elapsed();
    let left = count(&store, "tenants").await?;
    anyhow::ensure!(left == 0, "{left} objects left after the deletions");
    let per_s = |d: Duration, k: usize| k as f64 / d.as_secs_f64();
    println!(
        "floor: {objects} plain objects listed and deleted in {:.1} ms: {:.0} objects/s",
        floor.as_secs_f64() * 1e3,
        per_s(floor, objects)
    );
    println!(
        "erasure: {n} conversations in {:.1} ms: {:.1} conversations/s, {:.0} objects/s (×{:.2} of the floor's time)",
        erase.as_secs_f64() * 1e3,
        per_s(erase, n),
        per_s(erase, objects),
        erase.as_secs_f64() / floor.as_secs_f64()
    );
    println!(
        "sweep with nothing due over {n} closed conversations: 2 listings, 0 object reads, {:.2} ms",
        sweep.as_secs_f64() * 1e3
    );
    Ok(ExitCode::SUCCESS)
}
