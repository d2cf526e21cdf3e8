//! `turnpike bench git`: project versions on the local filesystem — the time to publish a turn
//! (commit the workspace over the last version, store the new objects, create the ref) and to
//! check out one file of turn N, along a lineage of many turns (100 files, three changed per
//! turn). The baseline is the store's own read of one object, measured in the same run.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use object_store::local::LocalFileSystem;
use object_store::{ObjectStore, ObjectStoreExt as _};
use turnpike_artifactory::git::{Lineage, Project};
use turnpike_artifactory::ConversationPrefix;
use turnpike_schemas::{ConversationId, RefPath, TurnId};

use crate::Series;

fn p50(samples: &[Duration]) -> f64 {
    Series {
        samples: samples.to_vec(),
        total: Duration::ZERO,
    }
    .percentile(0.5)
    .as_secs_f64()
        * 1e3
}

pub async fn run(turns: u64, dir: Option<std::path::PathBuf>) -> Result<ExitCode> {
    let tmp = match dir {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir()?,
    };
    std::fs::create_dir_all(tmp.path().join("store"))?;
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(tmp.path().join("store"))?);
    let lineage = Lineage::new(
        store.clone(),
        ConversationPrefix::new("bench".parse()?, ConversationId::new()),
    );
    println!(
        "turnpike bench git: local filesystem at {}, {turns} turns, 100 files, 3 changed per turn",
        tmp.path().display()
    );
    let mut publish: Vec<Duration> = Vec::new();
    let mut by_decade: Vec<(u64, f64)> = Vec::new();
    let mut base = None;
    for n in 1..=turns {
        let ws = tmp.path().join(format!("ws-{n}"));
        std::fs::create_dir_all(&ws)?;
        let project = Project::open(lineage.clone(), &ws, base).await?;
        // The first turn makes 100 files; later ones change three (materialised first).
        if n == 1 {
            for f in 0..100 {
                let sub = ws.join(format!("dir{}", f % 10));
                std::fs::create_dir_all(&sub)?;
                std::fs::write(
                    sub.join(format!("file{f}.txt")),
                    format!("file {f}, version 1\n").repeat(20),
                )?;
            }
        } else {
            for k in 0..3 {
                let f = (n * 7 + k * 31) % 100;
                let rel = RefPath::parse(&format!("dir{}/file{f}.txt", f % 10))?;
                project.materialise(Some(&rel), None).await?;
                let path = ws.join(rel.to_relative_path());
                let mut text = std::fs::read_to_string(&path)?;
                text.push_str(&format!("changed in turn {n}\n"));
                std::fs::write(&path, text)?;
            }
        }
        let t = Instant::now();
        let commit = project
            .commit(TurnId::new(n).expect("n ≥ 1"), &format!("turn_{n}"))
            .await?;
        lineage
            .publish_ref(TurnId::new(n).expect("n ≥ 1"), commit)
            .await?;
        publish.push(t.elapsed());
        base = Some(commit);
        drop(project);
        std::fs::remove_dir_all(&ws)?;
        if n % (turns / 10).max(1) == 0 || n == turns {
            let recent = &publish[publish.len().saturating_sub(50)..];
            by_decade.push((n, p50(recent)));
        }
    }
    println!("publish per turn (p50 of the 50 turns before turn N):");
    for (n, ms) in &by_decade {
        println!("  turn {n:>5}: {ms:>7.3} ms");
    }
    // Checkout of one file from turn N, and the floor: one object read from the same store.
    let floor_path = object_store::path::Path::from("floor");
    store.put(&floor_path, vec![b'x'; 400].into()).await?;
    let mut floor = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        store.get(&floor_path).await?.bytes().await?;
        floor.push(t.elapsed());
    }
    println!("one object read (the floor): p50 {:.3} ms", p50(&floor));
    println!("checkout of one file from turn N (p50 of 50):");
    for n in [1, turns / 10, turns / 2, turns] {
        let turn = TurnId::new(n.max(1)).expect("n ≥ 1");
        let commit = lineage.ref_of(turn).await?.expect("published");
        let rel = RefPath::parse("dir3/file33.txt")?;
        let mut samples = Vec::new();
        for i in 0..50 {
            let ws = tmp.path().join(format!("co-{n}-{i}"));
            std::fs::create_dir_all(&ws)?;
            let t = Instant::now();
            let p = Project::open(lineage.clone(), &ws, Some(commit)).await?;
            p.materialise(Some(&rel), None).await?;
            samples.push(t.elapsed());
            drop(p);
            std::fs::remove_dir_all(&ws)?;
        }
        println!(
            "  turn {n:>5}: p50 {:>7.3} ms ({:.1}x one object read)",
            p50(&samples),
            p50(&samples) / p50(&floor)
        );
    }
    Ok(ExitCode::SUCCESS)
}
