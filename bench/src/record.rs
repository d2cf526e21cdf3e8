//! `turnpike bench record`: appends and verification of the signed record, beside the object
//! store's own put.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};
use turnpike_artifactory::{ConversationPrefix, Head, Record, RecordSigner, TrustedKeys};
use turnpike_schemas::entry::{AssistantMessage, ConversationOpened, TurnDispatched};
use turnpike_schemas::{ConversationId, EntryBody, TurnId, WorkerId};

use crate::Series;

fn message(i: u64) -> EntryBody {
    EntryBody::AssistantMessage(AssistantMessage {
        turn: TurnId::FIRST,
        text: format!("benchmark entry {i}: a short reply of about the size of a sentence"),
    })
}

async fn new_record(store: &Arc<dyn ObjectStore>, signer: &RecordSigner) -> Result<(Record, Head)> {
    let record = Record::new(
        store.clone(),
        ConversationPrefix::new("bench".parse()?, ConversationId::new()),
    );
    let opened = EntryBody::ConversationOpened(ConversationOpened {
        tenant: "bench".parse()?,
        owner: "local:bench".parse()?,
        app: "bench".parse()?,
        agent: "bench".parse()?,
        at_ms: 0,
    });
    // Turn 1 stays open, so the benchmark's replies belong to it.
    let dispatched = EntryBody::TurnDispatched(TurnDispatched {
        turn: TurnId::FIRST,
        worker: WorkerId::new(),
        agent: "bench".parse()?,
        epoch: turnpike_schemas::Epoch(0),
        at_ms: 0,
    });
    let head = record
        .append(signer, &record.head().await?, &[opened, dispatched])
        .await?;
    Ok((record, head))
}

async fn appends(
    record: &Record,
    signer: &RecordSigner,
    mut head: Head,
    batches: u64,
    size: u64,
) -> Result<(Series, Head)> {
    let mut samples = Vec::with_capacity(batches as usize);
    let start = Instant::now();
    for b in 0..batches {
        let bodies: Vec<EntryBody> = (0..size).map(|i| message(b * size + i)).collect();
        let t = Instant::now();
        head = record.append(signer, &head, &bodies).await?;
        samples.push(t.elapsed());
    }
    Ok((
        Series {
            samples,
            total: start.elapsed(),
        },
        head,
    ))
}

/// `turnpike bench record`: `n` appends to a signed record on the local file system (synced
/// when `fsync`) beside the store's own create-if-absent put, then verify, full and incremental.
pub async fn run(n: u64, dir: Option<std::path::PathBuf>, fsync: bool) -> Result<ExitCode> {
    let tmp = match dir {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir()?,
    };
    // The floor is the plain filesystem store's put; the record appends through the store a
    // new `turnpike serve` uses (one SQLite database, synced unless --no-fsync), so the ratio
    // includes fsync's cost.
    let floor_dir = tmp.path().join("floor");
    std::fs::create_dir(&floor_dir)?;
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&floor_dir)?);
    let record_store = turnpike_artifactory::open_local(
        tmp.path().join("record").to_str().context("a UTF-8 path")?,
        Some(turnpike_artifactory::LocalLayout::Sqlite),
        fsync,
    )?;
    let signer = RecordSigner::generate()?;
    let trusted = TrustedKeys::new([signer.verifying_key()]);
    println!(
        "turnpike bench record: floor: a file per object; record: one SQLite database; at {}, {n} appends, fsync {}",
        tmp.path().display(),
        if fsync { "on" } else { "off" }
    );

    // Baseline: the store's own create-if-absent put of objects the size of a 1-entry batch.
    let (probe, probe_head) = new_record(&store, &signer).await?;
    let probe_head = probe.append(&signer, &probe_head, &[message(0)]).await?;
    let batch_size = {
        use object_store::ObjectStoreExt as _;
        let path = probe.prefix().record_batch(probe_head.batches() - 1);
        store.head(&path).await?.size
    };
    let payload = vec![b'x'; batch_size as usize];
    let mut samples = Vec::new();
    let start = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        store
            .put_opts(
                &Path::from(format!("baseline/{i:020}")),
                PutPayload::from(payload.clone()),
                opts,
            )
            .await?;
        samples.push(t.elapsed());
    }
    let baseline = Series {
        samples,
        total: start.elapsed(),
    };

    let (record, head) = new_record(&record_store, &signer).await?;
    let (single, head) = appends(&record, &signer, head, n, 1).await?;
    let (record16, head16) = new_record(&record_store, &signer).await?;
    let (sixteen, _) = appends(&record16, &signer, head16, n / 16, 16).await?;

    println!("\nappends ({batch_size}-byte objects for 1-entry batches)");
    println!(
        "{}",
        baseline.line("baseline: raw create-if-absent put", n, "objects", n)
    );
    println!(
        "{}",
        single.line("record append, 1-entry batches", n, "entries", n)
    );
    println!(
        "{}",
        sixteen.line("record append, 16-entry batches", n / 16, "entries", n)
    );
    println!(
        "ratio to baseline (ops/s): 1-entry {:.2}, 16-entry {:.2}",
        single.per_second(n) / baseline.per_second(n),
        sixteen.per_second(n / 16) / baseline.per_second(n)
    );

    // Verify: full over the whole record, then incremental over a tenth more.
    let t = Instant::now();
    let full = record
        .verify(&trusted, None)
        .await?
        .map_err(|f| anyhow::anyhow!("{f}"))?;
    let full_time = t.elapsed();
    let (_, _) = appends(&record, &signer, head, n / 10, 1).await?;
    let t = Instant::now();
    let incremental = record
        .verify_from(&trusted, &full.checkpoint)
        .await?
        .map_err(|f| anyhow::anyhow!("{f}"))?;
    let incremental_time = t.elapsed();
    let t = Instant::now();
    let full_again = record
        .verify(&trusted, None)
        .await?
        .map_err(|f| anyhow::anyhow!("{f}"))?;
    let full_again_time = t.elapsed();
    let t = Instant::now();
    let full16 = record16
        .verify(&trusted, None)
        .await?
        .map_err(|f| anyhow::anyhow!("{f}"))?;
    let full16_time = t.elapsed();
    println!(
        "\nverify (1-entry batches: a signature per entry; 16-entry batches: one per 17 entries)"
    );
    for (name, entries, time) in [
        (
            "full, 16-entry batches",
            full16.entries_checked,
            full16_time,
        ),
        ("full", full.entries_checked, full_time),
        (
            "full, after 10% more",
            full_again.entries_checked,
            full_again_time,
        ),
        (
            "incremental, the 10% only",
            incremental.entries_checked,
            incremental_time,
        ),
    ] {
        println!(
            "{name:<34} {entries:>8} entries in {:>9.3} ms = {:>10.0} entries/s",
            time.as_secs_f64() * 1e3,
            entries as f64 / time.as_secs_f64()
        );
    }
    println!(
        "incremental verify takes {:.1}% of the time of a full verify of the same record",
        100.0 * incremental_time.as_secs_f64() / full_again_time.as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}
