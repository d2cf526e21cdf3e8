//! Project versions: one immutable git ref per turn, checked out anywhere, exported to plain git.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use object_store::ObjectStore;
use turnpike_artifactory::git::{export, Lineage, Project};
use turnpike_artifactory::{ConversationPrefix, ErrorKind};
use turnpike_schemas::{ConversationId, RefPath, TurnId};
use turnpike_tests::fixtures::tenant;
use turnpike_tests::stores;

fn files(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().filter_map(|e| e.ok()) {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(
                    p.strip_prefix(dir).unwrap().to_string_lossy().into_owned(),
                    std::fs::read_to_string(&p).unwrap(),
                );
            }
        }
    }
    out
}

fn turn(n: u64) -> TurnId {
    TurnId::new(n).unwrap()
}

/// Runs turns `from..=to` on a fresh directory under `root`, each editing files.
async fn run_turns(
    lineage: &Lineage,
    root: &Path,
    from: u64,
    to: u64,
) -> Vec<BTreeMap<String, String>> {
    let mut trees = Vec::new();
    for n in from..=to {
        let ws = root.join(format!("ws-{n}"));
        std::fs::create_dir_all(&ws).unwrap();
        let base = if n > 1 {
            lineage.ref_of(turn(n - 1)).await.unwrap()
        } else {
            None
        };
        let project = Project::open(lineage.clone(), &ws, base).await.unwrap();
        // Sparse: only the file this turn edits is materialised.
        if n > 1 {
            project
                .materialise(Some(&RefPath::parse("notes/log.txt").unwrap()), None)
                .await
                .unwrap();
        }
        let log = std::fs::read_to_string(ws.join("notes/log.txt")).unwrap_or_default();
        std::fs::create_dir_all(ws.join("notes")).unwrap();
        std::fs::write(ws.join("notes/log.txt"), format!("{log}turn {n}\n")).unwrap();
        std::fs::write(
            ws.join(format!("file-{n}.txt")),
            format!("made in turn {n}"),
        )
        .unwrap();
        let commit = project.commit(turn(n), &format!("turn_{n}")).await.unwrap();
        lineage.publish_ref(turn(n), commit).await.unwrap();
        project.remove();
        // What the whole version holds.
        let check = root.join(format!("check-{n}"));
        std::fs::create_dir_all(&check).unwrap();
        let p = Project::open(lineage.clone(), &check, Some(commit))
            .await
            .unwrap();
        p.materialise(None, None).await.unwrap();
        trees.push(files(&check));
        p.remove();
    }
    trees
}

#[tokio::test]
async fn five_turns_make_five_immutable_versions_that_check_out_anywhere() {
    for store in [stores::memory(), stores::local()] {
        let lineage = Lineage::new(
            store.store.clone(),
            ConversationPrefix::new(tenant(), ConversationId::new()),
        );
        let dir = tempfile::tempdir().unwrap();
        let trees = run_turns(&lineage, &dir.path().join("a"), 1, 5).await;
        assert_eq!(trees[2].len(), 4, "{:?}", trees[2]);
        assert_eq!(trees[2]["notes/log.txt"], "turn 1\nturn 2\nturn 3\n");
        assert!(!trees[2].contains_key("file-4.txt"));
        // Turn 3 on a fresh directory: exactly its tree.
        let fresh = dir.path().join("fresh");
        std::fs::create_dir_all(&fresh).unwrap();
        let commit3 = lineage.ref_of(turn(3)).await.unwrap().unwrap();
        let p = Project::open(lineage.clone(), &fresh, None).await.unwrap();
        p.materialise(None, Some(commit3)).await.unwrap();
        assert_eq!(files(&fresh), trees[2]);
        // One file of a version, by path.
        let bytes = lineage
            .read_file(commit3, &RefPath::parse("file-2.txt").unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&bytes[..], b"made in turn 2");
        // Re-publishing a turn's ref fails and changes nothing.
        let commit5 = lineage.ref_of(turn(5)).await.unwrap().unwrap();
        let err = lineage.publish_ref(turn(3), commit5).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::AlreadyExists);
        assert_eq!(lineage.ref_of(turn(3)).await.unwrap(), Some(commit3));

        // Another worker, another fresh directory, continues the lineage.
        let more = run_turns(&lineage, &dir.path().join("b"), 6, 6).await;
        assert_eq!(
            more[0]["notes/log.txt"],
            "turn 1\nturn 2\nturn 3\nturn 4\nturn 5\nturn 6\n"
        );
        assert_eq!(more[0].len(), 7);

        // An unchanged project points the next ref at the same commit.
        let ws = dir.path().join("unchanged");
        std::fs::create_dir_all(&ws).unwrap();
        let base = lineage.ref_of(turn(6)).await.unwrap();
        let p = Project::open(lineage.clone(), &ws, base).await.unwrap();
        p.materialise(Some(&RefPath::parse("file-1.txt").unwrap()), None)
            .await
            .unwrap();
        assert_eq!(p.commit(turn(7), "turn_7").await.unwrap(), base.unwrap());
    }
}

#[tokio::test]
async fn a_version_lists_its_files_and_diffs_against_another() {
    use turnpike_artifactory::git::versions::Change;
    for store in [stores::memory(), stores::local()] {
        let lineage = Lineage::new(
            store.store.clone(),
            ConversationPrefix::new(tenant(), ConversationId::new()),
        );
        let dir = tempfile::tempdir().unwrap();
        let trees = run_turns(&lineage, &dir.path().join("a"), 1, 3).await;
        let v1 = lineage.ref_of(turn(1)).await.unwrap().unwrap();
        let v3 = lineage.ref_of(turn(3)).await.unwrap().unwrap();

        // The listing is the version's tree: every path, with its size.
        let listed: BTreeMap<String, u64> = lineage
            .files(v3)
            .await
            .unwrap()
            .into_iter()
            .map(|f| (f.path, f.size))
            .collect();
        let expected: BTreeMap<String, u64> = trees[2]
            .iter()
            .map(|(p, text)| (p.clone(), text.len() as u64))
            .collect();
        assert_eq!(listed, expected);

        // Forwards: one file grew, two appeared; backwards, they disappear.
        let forwards = lineage.diff(Some(v1), v3).await.unwrap();
        let summary: Vec<(&str, Change)> = forwards
            .iter()
            .map(|c| (c.path.as_str(), c.change))
            .collect();
        assert_eq!(
            summary,
            [
                ("file-2.txt", Change::Added),
                ("file-3.txt", Change::Added),
                ("notes/log.txt", Change::Modified),
            ]
        );
        let patch = forwards[2].patch.as_deref().unwrap();
        assert!(patch.contains("+turn 2\n+turn 3"), "{patch}");
        assert!(patch.contains(" turn 1"), "{patch}");
        let backwards = lineage.diff(Some(v3), v1).await.unwrap();
        assert_eq!(backwards[0].change, Change::Removed);
        assert!(backwards[0]
            .patch
            .as_deref()
            .unwrap()
            .contains("-made in turn 2"));
        // Against nothing, everything is added; against itself, nothing changed.
        assert_eq!(lineage.diff(None, v1).await.unwrap().len(), 2);
        assert!(lineage.diff(Some(v3), v3).await.unwrap().is_empty());

        // A binary file is reported as changed, without a line diff.
        let ws = dir.path().join("binary");
        std::fs::create_dir_all(&ws).unwrap();
        let p = Project::open(lineage.clone(), &ws, Some(v3)).await.unwrap();
        std::fs::write(ws.join("image.bin"), [0u8, 159, 146, 150, 0]).unwrap();
        let v4 = p.commit(turn(4), "turn_4").await.unwrap();
        let changes = lineage.diff(Some(v3), v4).await.unwrap();
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert!(
            changes[0].binary && changes[0].patch.is_none(),
            "{changes:?}"
        );
    }
}

#[tokio::test]
async fn the_export_is_a_plain_repository_that_git_accepts() {
    let test_store = stores::memory();
    let store: Arc<dyn ObjectStore> = test_store.store.clone();
    let conv = ConversationId::new();
    let lineage = Lineage::new(store, ConversationPrefix::new(tenant(), conv));
    let dir = tempfile::tempdir().unwrap();
    run_turns(&lineage, &dir.path().join("w"), 1, 3).await;
    let bare = dir.path().join("export.git");
    assert_eq!(export(&lineage, 3, &bare).await.unwrap(), 3);
    let git = |args: &[&str]| turnpike_tests::git::git(&bare, args);
    git(&["fsck", "--full", "--strict"]);
    let log = git(&["log", "--format=%s", "main"]);
    assert_eq!(
        log.lines().collect::<Vec<_>>(),
        ["turn_3", "turn_2", "turn_1"]
    );
    assert_eq!(git(&["show", "turn_2:notes/log.txt"]), "turn 1\nturn 2\n");
    assert_eq!(git(&["show", "turn_3:file-3.txt"]), "made in turn 3");
    assert!(git(&["tag"]).lines().eq(["turn_1", "turn_2", "turn_3"]));
}

#[tokio::test]
async fn paths_outside_the_project_are_never_materialised_or_committed() {
    let test_store = stores::memory();
    let store: Arc<dyn ObjectStore> = test_store.store.clone();
    let lineage = Lineage::new(
        store,
        ConversationPrefix::new(tenant(), ConversationId::new()),
    );
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "secret").unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("ok.txt"), "ok").unwrap();
    std::os::unix::fs::symlink(outside.join("secret.txt"), ws.join("link.txt")).unwrap();
    std::os::unix::fs::symlink(&outside, ws.join("linkdir")).unwrap();
    let p = Project::open(lineage.clone(), &ws, None).await.unwrap();
    let commit = p.commit(turn(1), "turn_1").await.unwrap();
    lineage.publish_ref(turn(1), commit).await.unwrap();
    // Symbolic links were not committed, nor what they point at.
    let check = dir.path().join("check");
    std::fs::create_dir_all(&check).unwrap();
    let c = Project::open(lineage.clone(), &check, Some(commit))
        .await
        .unwrap();
    c.materialise(None, None).await.unwrap();
    assert_eq!(files(&check).into_keys().collect::<Vec<_>>(), ["ok.txt"]);
    // `..`, absolute and encoded paths never parse.
    for bad in ["../x", "/etc/passwd", "a/../../x", "%2e%2e/x"] {
        assert!(RefPath::parse(bad).is_err(), "{bad}");
    }
    // A symbolic link planted where a file would be materialised is not followed.
    let planted = dir.path().join("planted");
    std::fs::create_dir_all(&planted).unwrap();
    std::os::unix::fs::symlink(outside.join("secret.txt"), planted.join("ok.txt")).unwrap();
    let q = Project::open(lineage.clone(), &planted, Some(commit))
        .await
        .unwrap();
    let err = q.materialise(None, None).await.unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert_eq!(
        std::fs::read_to_string(outside.join("secret.txt")).unwrap(),
        "secret"
    );
}

const VERSIONS: &str = r#"
[[turn]]
when = "start"
[[turn.step]]
tool_calls = [{ name = "write_file", arguments = { path = "src/a.txt", content = "alpha" } }]
[[turn.step]]
text = "made a"

[[turn]]
when = "extend"
[[turn.step]]
tool_calls = [{ name = "checkout", arguments = { path = "src/a.txt" } }, { name = "write_file", arguments = { path = "src/b.txt", content = "beta" } }]
[[turn.step]]
text = "made b"

[[turn]]
when = "slow"
[[turn.step]]
tool_calls = [{ name = "write_file", arguments = { path = "src/c.txt", content = "gamma" } }]
[[turn.step]]
delay_ms = 600000
text = "never"

[[turn]]
when = "old"
[[turn.step]]
tool_calls = [{ name = "checkout", arguments = { turn = "turn_1" } }, { name = "list_files" }]
[[turn.step]]
text = "{last_tool}"
"#;

#[tokio::test]
async fn successful_turns_publish_versions_and_cancelled_ones_publish_nothing() {
    use turnpike_schemas::entry::TurnOutcome;
    use turnpike_schemas::EventBody;
    use turnpike_tests::turns::{replies, Rig, RigOptions};
    let mirror = tempfile::tempdir().unwrap();
    let remote = mirror.path().join("mirror.git");
    turnpike_tests::git::init_bare(&remote);
    let mut o = RigOptions::new(VERSIONS);
    o.tools.push("checkout".into());
    o.git_remote = Some(remote.to_str().unwrap().to_owned());
    let rig = Rig::with(o).await;
    let lineage = Lineage::new(rig.conversations.store().clone(), rig.prefix());
    rig.say("start the project").await;
    rig.wait_turns(1).await;
    rig.say("extend it").await;
    rig.wait_turns(2).await;
    // A turn's ref is promoted just after its commit: read refs once the worker is done.
    rig.wait_settled().await;
    let v1 = lineage.ref_of(turn(1)).await.unwrap().unwrap();
    let v2 = lineage.ref_of(turn(2)).await.unwrap().unwrap();
    assert_ne!(v1, v2);
    let head = rig.record().head().await.unwrap();
    assert_eq!(head.state().version, Some(v2));
    let read = |commit, path: &str| {
        let lineage = lineage.clone();
        let path = RefPath::parse(path).unwrap();
        async move { lineage.read_file(commit, &path).await.unwrap() }
    };
    assert_eq!(&read(v2, "src/a.txt").await.unwrap()[..], b"alpha");
    assert_eq!(&read(v2, "src/b.txt").await.unwrap()[..], b"beta");
    assert!(read(v1, "src/b.txt").await.is_none());
    // The worker mirrored both versions into the bare repository.
    let show = turnpike_tests::git::git(
        &remote,
        &[
            "show",
            &format!("refs/turnpike/{}/turn_2:src/b.txt", rig.conv),
        ],
    );
    assert_eq!(show, "beta");

    // A cancelled turn publishes nothing.
    rig.say("slow work").await;
    rig.wait_dispatched(3).await;
    rig.send(EventBody::Stop { reason: None }).await;
    rig.wait_turns(3).await;
    rig.wait_settled().await;
    assert_eq!(rig.log(3).await.outcome, TurnOutcome::Cancelled);
    assert_eq!(lineage.ref_of(turn(3)).await.unwrap(), None);

    // A later turn checks out an old version.
    rig.say("show the old version").await;
    rig.wait_turns(4).await;
    rig.wait_settled().await;
    let listing = replies(&rig.log(4).await).join("");
    assert!(
        listing.contains("src/a.txt") && !listing.contains("src/b.txt"),
        "{listing}"
    );
    // Turn 4 changed nothing (turn 1's file is the same in turn 2's version): its ref points at
    // the existing commit.
    assert_eq!(lineage.ref_of(turn(4)).await.unwrap(), Some(v2));

    // `conv:gi:` references resolve through the resolver, for the owner only.
    let resolver = turnpike_resolver::Resolver::standard(
        rig.conversations.directory().clone(),
        rig.conversations.store().clone(),
    );
    let owner = turnpike_tests::fixtures::owner();
    let text = format!("conv:gi:{}/turn_2/src/b.txt", rig.conv);
    assert_eq!(
        &resolver.resolve_str(&owner, &text).await.unwrap().bytes[..],
        b"beta"
    );
    let stranger: turnpike_schemas::Identity = "oidc:acme:u-99".parse().unwrap();
    let theirs = resolver
        .resolve_str(&stranger, &text)
        .await
        .unwrap_err()
        .to_string();
    let missing = resolver
        .resolve_str(&owner, &format!("conv:gi:{}/turn_2/src/zzz.txt", rig.conv))
        .await
        .unwrap_err()
        .to_string();
    assert!(theirs.starts_with("not found") && missing.starts_with("not found"));
    rig.stop().await;
}

#[tokio::test]
async fn versions_push_to_an_ordinary_git_remote_and_never_overwrite_a_ref() {
    let test_store = stores::memory();
    let conv = ConversationId::new();
    let lineage = Lineage::new(
        test_store.store.clone(),
        ConversationPrefix::new(tenant(), conv),
    );
    let dir = tempfile::tempdir().unwrap();
    run_turns(&lineage, &dir.path().join("w"), 1, 3).await;
    let remote = dir.path().join("remote.git");
    turnpike_tests::git::init_bare(&remote);
    let url = remote.to_str().unwrap();
    for n in 1..=2 {
        turnpike_artifactory::git::push_to_remote(&lineage, url, turn(n))
            .await
            .unwrap();
    }
    let git = |args: &[&str]| turnpike_tests::git::git(&remote, args);
    let name = |n: u64| format!("refs/turnpike/{conv}/turn_{n}");
    assert_eq!(
        git(&["show", &format!("{}:notes/log.txt", name(2))]),
        "turn 1\nturn 2\n"
    );
    git(&["fsck", "--full"]);
    // Pushing a turn again is refused.
    let err = turnpike_artifactory::git::push_to_remote(&lineage, url, turn(2))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
    // A ref someone else made under turn 3's name is not overwritten either.
    let one = git(&["rev-parse", &name(1)]).trim().to_owned();
    git(&["update-ref", &name(3), &one]);
    let err = turnpike_artifactory::git::push_to_remote(&lineage, url, turn(3))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
    assert_eq!(git(&["rev-parse", &name(3)]).trim(), one);
}
