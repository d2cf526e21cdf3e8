use std::io::BufRead as _;
use std::process::{Command, Stdio};

use futures::TryStreamExt as _;
use object_store::integration;
use object_store::ObjectStoreExt as _;

use super::*;

/// `object_store`'s own suite for a store implementation, run on every local backend.
async fn conformance(store: &dyn ObjectStore, supports_update: bool) {
    integration::put_get_delete_list(store).await;
    integration::list_with_offset_exclusivity(store).await;
    integration::get_opts(store).await;
    integration::list_uses_directories_correctly(store).await;
    integration::list_with_delimiter(store).await;
    integration::rename_and_copy(store).await;
    integration::copy_if_not_exists(store).await;
    integration::copy_rename_nonexistent_object(store).await;
    integration::stream_get(store).await;
    integration::put_opts(store, supports_update).await;
}

#[tokio::test]
async fn the_sqlite_store_passes_the_object_store_suite() {
    for fsync in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        conformance(&SqliteStore::open(dir.path(), fsync).unwrap(), true).await;
    }
}

#[tokio::test]
async fn the_synced_filesystem_store_passes_the_object_store_suite() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::synced::SyncedLocalStore::new(dir.path()).unwrap();
    conformance(&store, false).await;
}

/// Small whole objects are read on the calling thread, larger ones off it: both give the same
/// bytes, metadata and precondition checks, at either side of the limit.
#[tokio::test]
async fn whole_objects_read_alike_on_and_off_the_calling_thread() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), false).unwrap();
    let limit = INLINE_READ as usize;
    for size in [0, 1, limit - 1, limit, limit + 1, 1 << 20] {
        let path = Path::from(format!("objects/{size}"));
        let bytes: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let put = store.put(&path, bytes.clone().into()).await.unwrap();
        // Twice: the first read may open the reader the second one finds pooled.
        for _ in 0..2 {
            let got = store.get(&path).await.unwrap();
            assert_eq!(got.meta.size, size as u64);
            assert_eq!(got.meta.e_tag, put.e_tag);
            assert_eq!(got.range, 0..size as u64);
            assert_eq!(got.bytes().await.unwrap(), bytes, "{size} bytes");
            // Its metadata alone (read on the calling thread too), with its conditions.
            let meta = store.head(&path).await.unwrap();
            assert_eq!((meta.size, &meta.e_tag), (size as u64, &put.e_tag));
            let head = |if_match: Option<String>, if_none_match: Option<String>| GetOptions {
                head: true,
                if_match,
                if_none_match,
                ..Default::default()
            };
            let got = store
                .get_opts(&path, head(put.e_tag.clone(), None))
                .await
                .unwrap();
            assert_eq!(
                (got.meta.size, got.range.clone()),
                (size as u64, 0..size as u64)
            );
            assert!(got.bytes().await.unwrap().is_empty());
            for (options, why) in [
                (head(Some("not-its-etag".into()), None), "a stale version"),
                (head(None, put.e_tag.clone()), "the version held"),
            ] {
                let refused = store.get_opts(&path, options).await.unwrap_err();
                assert!(
                    matches!(
                        refused,
                        object_store::Error::Precondition { .. }
                            | object_store::Error::NotModified { .. }
                    ),
                    "{size}, {why}: {refused:?}"
                );
            }
        }
        let stale = GetOptions {
            if_match: Some("not-its-etag".into()),
            ..Default::default()
        };
        let refused = store.get_opts(&path, stale).await.unwrap_err();
        assert!(
            matches!(refused, object_store::Error::Precondition { .. }),
            "{size}: {refused:?}"
        );
        let fresh = GetOptions {
            if_match: put.e_tag.clone(),
            ..Default::default()
        };
        let got = store.get_opts(&path, fresh).await.unwrap();
        assert_eq!(got.bytes().await.unwrap().len(), size);
        // A reader holding this version is told so (its bytes are not loaded); one holding
        // another version, or asking with a list or `*`, is answered as the conditions say.
        let held = |tag: Option<String>| GetOptions {
            if_none_match: tag,
            ..Default::default()
        };
        for tag in [put.e_tag.clone(), Some("*".into())] {
            let unchanged = store.get_opts(&path, held(tag)).await.unwrap_err();
            assert!(
                matches!(unchanged, object_store::Error::NotModified { .. }),
                "{size}: {unchanged:?}"
            );
        }
        let tag = put.e_tag.clone().unwrap();
        let listed = format!("other, {tag}");
        let unchanged = store.get_opts(&path, held(Some(listed))).await.unwrap_err();
        assert!(matches!(unchanged, object_store::Error::NotModified { .. }));
        // Near misses of the ETag: "not modified", or the whole object — never a body that
        // is not the object's bytes.
        let trimmed = tag.trim_matches('"').to_owned();
        for near in [
            format!("\"{trimmed}\""),
            trimmed.clone(),
            format!("W/{tag}"),
            format!(" {tag} "),
            String::new(),
            "another-version".into(),
        ] {
            match store.get_opts(&path, held(Some(near.clone()))).await {
                Ok(got) => {
                    assert_eq!(got.meta.size, size as u64);
                    assert_eq!(got.bytes().await.unwrap(), bytes, "{size} bytes, {near:?}");
                }
                Err(object_store::Error::NotModified { .. }) => {}
                Err(e) => panic!("{size} bytes, {near:?}: {e}"),
            }
        }
    }
    let missing = store.get(&Path::from("objects/none")).await.unwrap_err();
    assert!(matches!(missing, object_store::Error::NotFound { .. }));
    let missing = store.head(&Path::from("objects/none")).await.unwrap_err();
    assert!(matches!(missing, object_store::Error::NotFound { .. }));
}

async fn keys(store: &SqliteStore, prefix: Option<&str>) -> Vec<String> {
    let prefix = prefix.map(Path::from);
    let mut out: Vec<String> = store
        .list(prefix.as_ref())
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await
        .unwrap();
    out.sort();
    out
}

#[tokio::test]
async fn a_listing_is_of_a_directory_not_of_a_string_prefix_and_pages_through_everything() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), false).unwrap();
    for key in ["a", "a/b", "a/b/c", "ab", "a0", "a.", "b/x"] {
        store
            .put(&Path::from(key), PutPayload::from_static(b"x"))
            .await
            .unwrap();
    }
    assert_eq!(keys(&store, Some("a")).await, ["a/b", "a/b/c"]);
    assert_eq!(keys(&store, None).await.len(), 7);
    // More than a page, listed whole and in key order, and from an offset.
    for i in 0..(LIST_PAGE + 7) {
        store
            .put(
                &Path::from(format!("many/{i:05}")),
                PutPayload::from_static(b"y"),
            )
            .await
            .unwrap();
    }
    let listed: Vec<String> = store
        .list(Some(&Path::from("many")))
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await
        .unwrap();
    assert_eq!(listed.len(), LIST_PAGE + 7);
    assert!(listed.windows(2).all(|w| w[0] < w[1]));
    let after: Vec<ObjectMeta> = store
        .list_with_offset(Some(&Path::from("many")), &Path::from("many/01000"))
        .try_collect()
        .await
        .unwrap();
    assert_eq!(after.len(), 6);
}

#[tokio::test]
async fn writes_waiting_together_share_one_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), true).unwrap();
    store
        .put(&Path::from("warm"), PutPayload::from_static(b"w"))
        .await
        .unwrap();
    // Another connection holds the write lock: the writer waits in its first transaction
    // while a hundred writes queue up behind it.
    let blocker = Connection::open(dir.path().join(FILE_NAME)).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let before = store.commits();
    let writes = futures::future::join_all((0..100).map(|i| {
        let store = &store;
        async move {
            store
                .put_opts(
                    &Path::from(format!("g/{i}")),
                    PutPayload::from(format!("{i}")),
                    PutMode::Create.into(),
                )
                .await
        }
    }));
    futures::pin_mut!(writes);
    // One poll sends every write to the writer.
    assert!(futures::poll!(writes.as_mut()).is_pending());
    blocker.execute_batch("COMMIT").unwrap();
    for result in writes.await {
        result.unwrap();
    }
    // The first group, stuck on the lock, and then the rest together.
    let used = store.commits() - before;
    assert!(used <= 2, "{used} commits for 100 writes");
    assert_eq!(keys(&store, Some("g")).await.len(), 100);
    let got = store
        .get(&Path::from("g/42"))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(&got[..], b"42");
}

#[tokio::test]
async fn a_failed_write_in_a_group_leaves_the_others_committed() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), false).unwrap();
    store
        .put(&Path::from("taken"), PutPayload::from_static(b"first"))
        .await
        .unwrap();
    let blocker = Connection::open(dir.path().join(FILE_NAME)).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let create = |key: &'static str, data: &'static [u8]| {
        let store = &store;
        async move {
            store
                .put_opts(
                    &Path::from(key),
                    PutPayload::from_static(data),
                    PutMode::Create.into(),
                )
                .await
        }
    };
    let writes = futures::future::join3(
        create("free-1", b"a"),
        create("taken", b"second"),
        create("free-2", b"b"),
    );
    futures::pin_mut!(writes);
    assert!(futures::poll!(writes.as_mut()).is_pending());
    blocker.execute_batch("COMMIT").unwrap();
    let (one, taken, two) = writes.await;
    one.unwrap();
    two.unwrap();
    assert!(matches!(
        taken,
        Err(object_store::Error::AlreadyExists { .. })
    ));
    let kept = store
        .get(&Path::from("taken"))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(&kept[..], b"first");
    assert_eq!(keys(&store, None).await, ["free-1", "free-2", "taken"]);
}

/// The helper process of the tests below: writes keys until it is killed, saying each one
/// it saw acknowledged (`TURNPIKE_SQLITE_CHILD=dir:mode`).
#[test]
#[ignore = "a helper process, started by the tests below"]
fn child_writer() {
    let Ok(spec) = std::env::var("TURNPIKE_SQLITE_CHILD") else {
        return;
    };
    let (dir, mode) = spec.split_once(':').unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = SqliteStore::open(dir, mode.contains("-fsync")).unwrap();
        match mode {
            // Writes forever; each acknowledged key is printed. With `-next`, every other write
            // asks to be flushed only with the next one that is.
            "endless" | "endless-fsync" | "endless-fsync-next" => {
                for i in 0u64.. {
                    let opts = if mode.ends_with("-next") && i % 2 == 0 {
                        crate::store::synced_with_next(PutMode::Create)
                    } else {
                        PutMode::Create.into()
                    };
                    store
                        .put_opts(
                            &Path::from(format!("k/{i:08}")),
                            PutPayload::from(format!("value {i}")),
                            opts,
                        )
                        .await
                        .unwrap();
                    println!("acked {i}");
                }
            }
            // Races the parent to create the same keys; prints the ones it won.
            "race" => {
                for i in 0..200u32 {
                    let created = store
                        .put_opts(
                            &Path::from(format!("race/{i:04}")),
                            PutPayload::from_static(b"child"),
                            PutMode::Create.into(),
                        )
                        .await;
                    match created {
                        Ok(_) => println!("won {i}"),
                        Err(object_store::Error::AlreadyExists { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                println!("done");
            }
            other => panic!("unknown mode {other}"),
        }
    });
}

/// What the helper said after `marker` on `line` (libtest may print its test's name first, on
/// the same line).
fn said<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    line.rsplit_once(marker).map(|(_, rest)| rest)
}

fn start_child(dir: &FsPath, mode: &str) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "sqlite_store::tests::child_writer",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            "TURNPIKE_SQLITE_CHILD",
            format!("{}:{mode}", dir.to_str().unwrap()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn every_acknowledged_write_survives_a_kill_9_of_the_writing_process() {
    for mode in ["endless", "endless-fsync", "endless-fsync-next"] {
        killed_mid_stream(mode).await;
    }
}

/// A write that asks to be flushed only with the next one that is ([`crate::SyncedWithNext`])
/// commits without a flush of the log when nothing else in its commit needs one; the next
/// write flushes again (and takes it along: the log is one sequence). Without `fsync` nothing
/// flushes. Each write reads back, and is there after the store is opened again.
#[tokio::test]
async fn a_write_synced_with_the_next_commits_without_a_flush_and_the_next_flushes() {
    for fsync in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path(), fsync).unwrap();
        let put = |key: &'static str, next: bool| {
            let store = &store;
            async move {
                let opts = if next {
                    crate::store::synced_with_next(PutMode::Overwrite)
                } else {
                    PutOptions::default()
                };
                store
                    .put_opts(&Path::from(key), PutPayload::from_static(b"v"), opts)
                    .await
                    .unwrap();
                (store.commits(), store.flushed_commits())
            }
        };
        let (commits, flushes) = put("a", false).await;
        assert_eq!(flushes, if fsync { commits } else { 0 });
        // Alone in its commit: no flush.
        assert_eq!(put("mark", true).await, (commits + 1, flushes));
        assert_eq!(put("mark-2", true).await, (commits + 2, flushes));
        // The next plain write flushes again.
        let flushed = flushes + u64::from(fsync);
        assert_eq!(put("batch", false).await, (commits + 3, flushed));
        drop(store);
        let store = SqliteStore::open(dir.path(), fsync).unwrap();
        assert_eq!(keys(&store, None).await, ["a", "batch", "mark", "mark-2"]);
    }
}

async fn killed_mid_stream(mode: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut child = start_child(dir.path(), mode);
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut acked = 0u64;
    while acked < 300 {
        let line = lines.next().expect("the writer ended early").unwrap();
        if let Some(n) = said(&line, "acked ") {
            acked = n.parse::<u64>().unwrap() + 1;
        }
    }
    // SIGKILL, mid-stream: the writer is in the middle of its next writes.
    child.kill().unwrap();
    child.wait().unwrap();
    // Whatever it printed after we stopped reading was acknowledged too.
    for line in lines.map_while(|l| l.ok()) {
        if let Some(n) = said(&line, "acked ") {
            acked = acked.max(n.parse::<u64>().unwrap() + 1);
        }
    }
    let store = SqliteStore::open(dir.path(), false).unwrap();
    for i in 0..acked {
        let got = store
            .get(&Path::from(format!("k/{i:08}")))
            .await
            .unwrap_or_else(|e| panic!("acknowledged key {i} is gone: {e}"))
            .bytes()
            .await
            .unwrap();
        assert_eq!(got, format!("value {i}").as_bytes());
    }
    let check: String = Connection::open(dir.path().join(FILE_NAME))
        .unwrap()
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}

#[tokio::test]
async fn two_processes_creating_the_same_keys_each_key_has_exactly_one_winner() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), false).unwrap();
    let child = start_child(dir.path(), "race");
    let mut mine = std::collections::BTreeSet::new();
    for i in 0..200u32 {
        let created = store
            .put_opts(
                &Path::from(format!("race/{i:04}")),
                PutPayload::from_static(b"parent"),
                PutMode::Create.into(),
            )
            .await;
        match created {
            Ok(_) => {
                mine.insert(i);
            }
            Err(object_store::Error::AlreadyExists { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let output = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.lines().any(|l| l.ends_with("done")));
    let theirs: std::collections::BTreeSet<u32> = text
        .lines()
        .filter_map(|l| said(l, "won "))
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(mine.is_disjoint(&theirs), "a key was created twice");
    assert_eq!(
        mine.len() + theirs.len(),
        200,
        "a key was created by neither"
    );
    for i in 0..200u32 {
        let got = store
            .get(&Path::from(format!("race/{i:04}")))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let want: &[u8] = if mine.contains(&i) {
            b"parent"
        } else {
            b"child"
        };
        assert_eq!(&got[..], want, "key {i}");
    }
}

#[tokio::test]
async fn the_log_is_checkpointed_into_the_database_off_the_writers_thread() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), false).unwrap();
    let db = dir.path().join(FILE_NAME);
    let size = || std::fs::metadata(&db).unwrap().len();
    let before = size();
    for i in 0..300 {
        store
            .put(
                &Path::from(format!("c/{i}")),
                PutPayload::from(vec![7u8; 4096]),
            )
            .await
            .unwrap();
    }
    // The writer never checkpoints (its automatic checkpoints are off): only the checkpointer
    // moves the log's pages into the database file.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while size() < before + 300 * 4096 {
        assert!(
            std::time::Instant::now() < deadline,
            "the log was not checkpointed: {} bytes",
            size()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let got = store
        .get(&Path::from("c/299"))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(got.len(), 4096);
}

#[tokio::test]
async fn on_a_full_disk_a_write_is_reported_written_exactly_when_it_is() {
    let dir = tempfile::tempdir().unwrap();
    // About 400 KiB of database at most.
    let store = SqliteStore::open_limited(dir.path(), false, Some(100)).unwrap();
    store
        .put(&Path::from("before"), PutPayload::from(vec![1u8; 1000]))
        .await
        .unwrap();
    // A group of writes in which one cannot fit.
    let blocker = Connection::open(dir.path().join(FILE_NAME)).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let put = |key: &'static str, size: usize, mode: PutMode| {
        let store = &store;
        async move {
            store
                .put_opts(
                    &Path::from(key),
                    PutPayload::from(vec![2u8; size]),
                    mode.into(),
                )
                .await
        }
    };
    let writes = futures::future::join4(
        put("small-1", 100, PutMode::Create),
        put("huge", 1 << 20, PutMode::Overwrite),
        put("small-2", 100, PutMode::Create),
        put("before", 100, PutMode::Overwrite),
    );
    futures::pin_mut!(writes);
    assert!(futures::poll!(writes.as_mut()).is_pending());
    blocker.execute_batch("COMMIT").unwrap();
    let (one, huge, two, over) = writes.await;
    assert!(huge.is_err(), "a megabyte fit in 400 KiB");
    // Each write is reported written exactly when it is there.
    for (key, result, size) in [
        ("small-1", &one, 100),
        ("huge", &huge, 1 << 20),
        ("small-2", &two, 100),
    ] {
        let found = store.head(&Path::from(key)).await;
        assert_eq!(
            result.is_ok(),
            found.is_ok(),
            "{key}: {result:?} / {found:?}"
        );
        if let Ok(meta) = found {
            assert_eq!(meta.size, size);
        }
    }
    let before = store.head(&Path::from("before")).await.unwrap();
    assert_eq!(before.size, if over.is_ok() { 100 } else { 1000 });
    // The writer goes on: a write that fits is written.
    store
        .put(&Path::from("after"), PutPayload::from(vec![3u8; 100]))
        .await
        .unwrap();
    assert_eq!(store.head(&Path::from("after")).await.unwrap().size, 100);
}

/// SQLite's memory has one limit for the whole process, not one cache per connection: every
/// reader's page cache filling as the database grew kept a server's memory rising long after
/// warm-up. (That the limit holds is SQLite's; `bench soak` measures the whole server.)
#[tokio::test]
async fn sqlites_memory_has_one_limit_for_the_whole_process() {
    let dir = tempfile::tempdir().unwrap();
    let _store = SqliteStore::open(dir.path(), false).unwrap();
    // Any connection of the process sees the limit the store set.
    let limit: i64 = Connection::open_in_memory()
        .unwrap()
        .query_row("PRAGMA soft_heap_limit", [], |r| r.get(0))
        .unwrap();
    assert_eq!(limit, HEAP_LIMIT_BYTES);
}
