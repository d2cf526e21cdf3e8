//! One conversation as one archive (a plain tar file), and back into another deployment.
//!
//! ```text
//! turnpike-export.json                 the manifest (ArchiveManifest), first
//! conversation/record/{batch:020}      the record's batches as stored: verifiable offline with
//!                                      the public keys the manifest carries
//! conversation/turns/turn_{n}/…        turn logs, context snapshots, hosted files
//! conversation/attachments/turn_{n}/…  attachments
//! conversation/attempts/…              what turns' attempts wrote
//! conversation/git/…                   the project's git objects and refs, as stored
//! conversation/forgotten/…             what the owner asked the index to forget
//! conversation/dead-letters/…          lane messages set aside
//! project.bundle                       the project versions as a git bundle (tags turn_n and
//!                                      main), when there are any: `git clone project.bundle`
//! ```
//!
//! An export is taken from one head: nothing of a turn after it (a turn that began while the
//! archive was written) goes in. A conversation with a turn running is not exported.
//!
//! An import checks everything before it writes anything: every path is one of the above
//! (no `..`, no links, no other kinds of files), and the record verifies against the manifest's
//! public key (or the one the operator expects) up to the manifest's root. It refuses a
//! conversation the deployment has, or once had (a tombstone). It then writes the objects, the
//! record re-signed with this deployment's key batch by batch (every entry unchanged, at the
//! same position) followed by an `imported` entry that keeps the original root, key and export
//! time as provenance, the closed marker if there was one, and last the directory entry — so a
//! half-done import is invisible, and running it again finishes it.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path as FsPath;
use std::sync::Arc;

use futures::TryStreamExt as _;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};
use serde::{Deserialize, Serialize};
use turnpike_schemas::entry::Imported;
use turnpike_schemas::EntryBody;

use crate::error::{Error, ErrorKind, Result};
use crate::keys::{RecordSigner, TrustedKeys};
use crate::record::Record;
use crate::{Conversations, DirectoryEntry};

/// The manifest's name in the archive.
pub const MANIFEST: &str = "turnpike-export.json";
/// The project bundle's name in the archive.
pub const PROJECT: &str = "project.bundle";
/// The folder of the conversation's objects in the archive.
const OBJECTS: &str = "conversation";
/// The archive format this build writes and reads.
pub const ARCHIVE_FORMAT: u16 = 1;
/// The largest manifest an import reads.
const MANIFEST_LIMIT: u64 = 1 << 20;

/// What an archive says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchiveManifest {
    pub format: u16,
    /// The conversation as the exporting directory knew it.
    pub entry: DirectoryEntry,
    /// When it was closed, if it was.
    pub closed_ms: Option<u64>,
    pub exported_ms: u64,
    pub exported_by: String,
    /// The record's batches and entries in the archive, and its last signed root (hex).
    pub batches: u64,
    pub leaves: u64,
    pub root: String,
    /// The public key (hex) of every key that signed a root of the record, by key id.
    pub keys: BTreeMap<String, String>,
    /// Whether `project.bundle` is in the archive.
    pub project: bool,
}

/// Where one of the conversation's objects goes, by its path under the conversation's folder.
#[derive(Debug, PartialEq, Eq)]
enum Place {
    /// A record batch.
    Batch(u64),
    /// Copied as it is.
    Copy,
    /// Left out: rebuilt on import (the head hint, repair leftovers) or of a turn after the
    /// exported head.
    Skip,
}

/// Where `rel` (a path under the conversation's folder) goes, or `None` when no conversation
/// has such an object (an import refuses the archive).
fn place(rel: &str, last_turn: u64) -> Option<Place> {
    let parts: Vec<&str> = rel.split('/').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || *p == "." || *p == "..")
    {
        return None;
    }
    let turn_of =
        |segment: Option<&&str>| -> Option<u64> { segment?.strip_prefix("turn_")?.parse().ok() };
    let within = |n: Option<u64>| match n {
        Some(n) if n >= 1 && n <= last_turn => Some(Place::Copy),
        Some(_) => Some(Place::Skip),
        None => None,
    };
    match parts[0] {
        "record" if parts.len() == 2 => parts[1]
            .parse()
            .ok()
            .filter(|_| parts[1].len() == 20)
            .map(Place::Batch),
        "record-head" | "record-repair-journal" if parts.len() == 1 => Some(Place::Skip),
        p if p.starts_with("record-") => Some(Place::Skip),
        "turns" | "attempts" | "attachments" if parts.len() >= 3 => within(turn_of(parts.get(1))),
        "git" if parts.len() == 3 && parts[1] == "refs" => within(turn_of(parts.get(2))),
        "git" if parts.len() == 3 && parts[1] == "objects" => Some(Place::Copy),
        "forgotten" | "dead-letters" if parts.len() >= 2 => Some(Place::Copy),
        _ => None,
    }
}

/// Writes the archive of `entry`'s conversation to `out`: its manifest, every object of it
/// up to its current head, and the project bundle (made with the `git` command). `keys` must
/// hold every key that signed the record (the deployment's trusted keys).
pub async fn export(
    conversations: &Conversations,
    entry: &DirectoryEntry,
    keys: &TrustedKeys,
    exported_by: &str,
    out: std::fs::File,
) -> Result<ArchiveManifest> {
    let prefix = entry.prefix();
    let record = conversations.record(prefix.clone());
    let head = record.head().await?;
    if head.state().turn_open {
        return Err(Error::new(
            ErrorKind::HeadMoved,
            format!(
                "turn_{} of {} is running: export it once it ends",
                head.state().last_turn,
                entry.conversation
            ),
        ));
    }
    let verdict = record.verify(keys, None).await?;
    let report = verdict.map_err(|f| {
        Error::new(
            ErrorKind::Corrupt,
            format!("{} does not verify: {f}", entry.conversation),
        )
    })?;
    let mut used = BTreeMap::new();
    for e in record.entries().await? {
        if let EntryBody::SignedRoot(root) = e.body {
            if e.position >= report.checkpoint.leaves {
                break;
            }
            let key = keys.public_key(&root.key_id).ok_or_else(|| {
                Error::new(
                    ErrorKind::Key,
                    format!("a root is signed by key {}, not trusted here", root.key_id),
                )
            })?;
            used.insert(root.key_id, hex::encode(key.as_bytes()));
        }
    }
    let root = last_root(&record, head.batches()).await?;
    let closed_ms = conversations
        .directory()
        .closed_at(entry.conversation)
        .await?;
    let last_turn = head.state().last_turn;
    let project_dir = tempfile::tempdir()
        .map_err(|e| Error::new(ErrorKind::Store, format!("a temporary folder: {e}")))?;
    let bundle = if head.state().version.is_some() {
        Some(
            bundle(
                conversations.store().clone(),
                &prefix,
                last_turn,
                project_dir.path(),
            )
            .await?,
        )
    } else {
        None
    };
    let manifest = ArchiveManifest {
        format: ARCHIVE_FORMAT,
        entry: entry.clone(),
        closed_ms,
        exported_ms: now_ms(),
        exported_by: exported_by.to_owned(),
        batches: head.batches(),
        leaves: root.leaf_count,
        root: root.root,
        keys: used,
        project: bundle.is_some(),
    };

    // A blocking thread writes the tar while this task reads objects, one at a time.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(String, bytes::Bytes)>(8);
    let manifest_bytes = serde_json::to_vec_pretty(&manifest).expect("manifests serialise");
    let writer = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        let mut tar = tar::Builder::new(std::io::BufWriter::new(out));
        append(&mut tar, MANIFEST, &manifest_bytes)?;
        while let Some((name, bytes)) = rx.blocking_recv() {
            append(&mut tar, &name, &bytes)?;
        }
        if let Some(bundle) = bundle {
            let mut file = std::fs::File::open(&bundle)?;
            let mut header = tar::Header::new_gnu();
            header.set_size(file.metadata()?.len());
            header.set_mode(0o644);
            tar.append_data(&mut header, PROJECT, &mut file)?;
        }
        tar.into_inner()?.flush()
    });
    let store = conversations.store();
    let base = prefix.dir();
    let mut listing = store.list(Some(&base));
    let sending = async {
        while let Some(meta) = listing
            .try_next()
            .await
            .map_err(|e| Error::store("listing the conversation", e))?
        {
            let Some(rel) = relative(&base, &meta.location) else {
                continue;
            };
            match place(&rel, last_turn) {
                Some(Place::Batch(seq)) if seq >= head.batches() => continue,
                Some(Place::Batch(_)) | Some(Place::Copy) => {}
                Some(Place::Skip) | None => continue,
            }
            let bytes = match store.get(&meta.location).await {
                Ok(r) => r
                    .bytes()
                    .await
                    .map_err(|e| Error::store(&format!("reading {}", meta.location), e))?,
                // Deleted while listing (a promotion's attempt clean-up): not part of it.
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(Error::store(&format!("reading {}", meta.location), e)),
            };
            if tx.send((format!("{OBJECTS}/{rel}"), bytes)).await.is_err() {
                break;
            }
        }
        drop(tx);
        Ok(())
    };
    let sent = sending.await;
    let written = writer
        .await
        .map_err(|e| Error::new(ErrorKind::Store, format!("the archive writer failed: {e}")))?;
    sent?;
    written.map_err(|e| Error::new(ErrorKind::Store, format!("writing the archive: {e}")))?;
    Ok(manifest)
}

fn append<W: Write>(tar: &mut tar::Builder<W>, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(bytes.len() as u64);
    header.set_mode(0o644);
    tar.append_data(&mut header, name, bytes)
}

/// `path` relative to `base`, as a string.
fn relative(base: &Path, path: &Path) -> Option<String> {
    let parts: Vec<String> = path
        .prefix_match(base)?
        .map(|p| p.as_ref().to_owned())
        .collect();
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// The signed root that closes batch `batches - 1`.
async fn last_root(record: &Record, batches: u64) -> Result<turnpike_schemas::entry::SignedRoot> {
    let last = batches
        .checked_sub(1)
        .ok_or_else(|| Error::new(ErrorKind::NotFound, "the record is empty"))?;
    record
        .entries_from(last)
        .await?
        .into_iter()
        .rev()
        .find_map(|e| match e.body {
            EntryBody::SignedRoot(root) => Some(root),
            _ => None,
        })
        .ok_or_else(|| Error::new(ErrorKind::Corrupt, "the last batch has no signed root"))
}

/// Writes the project's versions as a git bundle under `dir`; returns its path.
async fn bundle(
    store: Arc<dyn ObjectStore>,
    prefix: &crate::ConversationPrefix,
    last_turn: u64,
    dir: &FsPath,
) -> Result<std::path::PathBuf> {
    let repo = dir.join("project.git");
    let lineage = crate::git::Lineage::new(store, prefix.clone());
    crate::git::export(&lineage, last_turn, &repo).await?;
    let out = dir.join(PROJECT);
    let (repo, path) = (repo.clone(), out.clone());
    let status = tokio::task::spawn_blocking(move || {
        std::process::Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(["bundle", "create", "--quiet"])
            .arg(&path)
            .arg("--all")
            .stdin(std::process::Stdio::null())
            .output()
    })
    .await
    .map_err(|e| Error::new(ErrorKind::Store, format!("bundling the project: {e}")))?
    .map_err(|e| {
        Error::new(
            ErrorKind::Store,
            format!("bundling the project needs the `git` command: {e}"),
        )
    })?;
    if !status.status.success() {
        return Err(Error::new(
            ErrorKind::Store,
            format!(
                "git bundle failed: {}",
                String::from_utf8_lossy(&status.stderr).trim()
            ),
        ));
    }
    Ok(out)
}

/// What an import did.
#[derive(Debug, Clone)]
pub struct ImportReport {
    pub manifest: ArchiveManifest,
    /// Objects written besides the record.
    pub objects: u64,
    /// The record's batches here (the archive's, re-signed, and the `imported` one).
    pub batches: u64,
}

/// What the first pass over an archive found.
struct Scan {
    manifest: ArchiveManifest,
    batches: BTreeMap<u64, Vec<u8>>,
}

/// How an import goes.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// The archive's record must be signed by this public key alone (without it: by the keys
    /// its manifest names).
    pub expect_key: Option<ed25519_dalek::VerifyingKey>,
    /// Only check the archive (offline: names, signatures, root); write nothing.
    pub check_only: bool,
    /// Who imports (kept in the `imported` entry).
    pub by: String,
}

/// Imports the archive at `archive` into `conversations` (this deployment), re-signing the
/// record with `signer`. See the module's contract.
pub async fn import(
    conversations: &Conversations,
    signer: &RecordSigner,
    archive: &FsPath,
    options: ImportOptions,
) -> Result<ImportReport> {
    let ImportOptions {
        expect_key,
        check_only,
        by,
    } = options;
    let path = archive.to_path_buf();
    let scan = tokio::task::spawn_blocking(move || scan(&path))
        .await
        .map_err(|e| Error::new(ErrorKind::Store, format!("reading the archive: {e}")))??;
    let manifest = scan.manifest;
    let entry = manifest.entry.clone();
    let conversation = entry.conversation;
    let prefix = entry.prefix();

    // The record verifies, offline, up to the manifest's root.
    let keys = match expect_key {
        Some(key) => TrustedKeys::new([key]),
        None => TrustedKeys::new(
            manifest
                .keys
                .values()
                .map(|k| TrustedKeys::parse_public(k))
                .collect::<Result<Vec<_>>>()?,
        ),
    };
    let staged: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let source = Record::new(staged.clone(), prefix.clone());
    if scan.batches.len() as u64 != manifest.batches
        || scan.batches.keys().copied().ne(0..manifest.batches)
    {
        return Err(invalid(format!(
            "the archive holds {} record batches; its manifest says {}",
            scan.batches.len(),
            manifest.batches
        )));
    }
    for (seq, bytes) in scan.batches {
        staged
            .put(&prefix.record_batch(seq), PutPayload::from(bytes))
            .await
            .map_err(|e| Error::store("staging the record", e))?;
    }
    let report = source
        .verify(&keys, None)
        .await?
        .map_err(|f| invalid(format!("the archive's record does not verify: {f}")))?;
    let head = source.head().await?;
    let root = last_root(&source, head.batches()).await?;
    if root.root != manifest.root || root.leaf_count != manifest.leaves {
        return Err(invalid(
            "the archive's record does not end at the root its manifest names".into(),
        ));
    }
    if head.state().turn_open {
        return Err(invalid("the archive's record ends in an open turn".into()));
    }
    let opened = source.entries_from(0).await?;
    match opened.first().map(|e| &e.body) {
        Some(EntryBody::ConversationOpened(o))
            if o.tenant == entry.tenant && o.owner == entry.owner && o.app == entry.app => {}
        _ => {
            return Err(invalid(
                "the archive's record was not opened for the conversation its manifest names"
                    .into(),
            ))
        }
    }
    debug_assert_eq!(report.checkpoint.leaves, head.leaves());
    let original_public_key = manifest.keys.get(&root.key_id).cloned().unwrap_or_default();
    if check_only {
        return Ok(ImportReport {
            manifest,
            objects: 0,
            batches: head.batches(),
        });
    }

    // Not a conversation this deployment has, or deleted once.
    let directory = conversations.directory();
    match directory.lookup_unchecked(conversation).await {
        Ok(_) => {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("{conversation} exists here already"),
            ))
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if conversations
        .tombstones()
        .get(&entry.tenant, conversation)
        .await?
        .is_some()
    {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            format!("{conversation} was deleted here; its tombstone stays"),
        ));
    }

    // The objects, read again from the archive (one at a time), then the record, re-signed.
    let last_turn = head.state().last_turn;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(String, Vec<u8>)>(8);
    let path = archive.to_path_buf();
    let reader = tokio::task::spawn_blocking(move || -> Result<()> {
        let mut tar = tar::Archive::new(open(&path)?);
        for item in tar.entries().map_err(unreadable)? {
            let mut item = item.map_err(unreadable)?;
            let name = name_of(&item)?;
            let Some(rel) = name.strip_prefix(&format!("{OBJECTS}/")) else {
                continue;
            };
            if place(rel, last_turn) != Some(Place::Copy) {
                continue;
            }
            let rel = rel.to_owned();
            let mut bytes = Vec::with_capacity(item.size() as usize);
            item.read_to_end(&mut bytes).map_err(unreadable)?;
            if tx.blocking_send((rel, bytes)).is_err() {
                break;
            }
        }
        Ok(())
    });
    let store = conversations.store();
    let base = prefix.dir();
    let mut objects = 0;
    let mut failed = None;
    while let Some((rel, bytes)) = rx.recv().await {
        let key = Path::parse(format!("{base}/{rel}")).map_err(|e| invalid(format!("{rel}: {e}")));
        let put = match key {
            Ok(key) => store
                .put(&key, PutPayload::from(bytes))
                .await
                .map_err(|e| Error::store(&format!("writing {rel}"), e)),
            Err(e) => Err(e),
        };
        if let Err(e) = put {
            failed = Some(e);
            break;
        }
        objects += 1;
    }
    drop(rx);
    reader
        .await
        .map_err(|e| Error::new(ErrorKind::Store, format!("reading the archive: {e}")))??;
    if let Some(e) = failed {
        return Err(e);
    }
    let target = conversations.record(prefix.clone());
    let imported = EntryBody::Imported(Imported {
        original_root: root.root.clone(),
        original_leaves: root.leaf_count,
        original_key_id: root.key_id.clone(),
        original_public_key,
        exported_ms: manifest.exported_ms,
        by,
        at_ms: now_ms(),
    });
    let head = target.reseal_from(&source, signer, &[imported]).await?;
    if let Some(closed) = manifest.closed_ms {
        directory.close(conversation, closed).await?;
    }
    match directory.create(&entry).await {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    Ok(ImportReport {
        manifest,
        objects,
        batches: head.batches(),
    })
}

fn invalid(why: String) -> Error {
    Error::new(ErrorKind::InvalidInput, why)
}

fn unreadable(e: std::io::Error) -> Error {
    invalid(format!("the archive does not read as a tar file: {e}"))
}

fn open(path: &FsPath) -> Result<std::io::BufReader<std::fs::File>> {
    std::fs::File::open(path)
        .map(std::io::BufReader::new)
        .map_err(|e| invalid(format!("cannot open {}: {e}", path.display())))
}

/// An item's name, refusing anything but a regular file with a plain UTF-8 name.
fn name_of<R: Read>(item: &tar::Entry<'_, R>) -> Result<String> {
    let name = item
        .path()
        .map_err(unreadable)?
        .to_str()
        .map(str::to_owned)
        .ok_or_else(|| invalid("an archive name is not UTF-8".into()))?;
    if item.header().entry_type() != tar::EntryType::Regular {
        return Err(invalid(format!(
            "{name}: only regular files belong in an archive, not {:?}",
            item.header().entry_type()
        )));
    }
    Ok(name)
}

/// The first pass: the manifest and the record's batches; every name is checked.
fn scan(path: &FsPath) -> Result<Scan> {
    let mut tar = tar::Archive::new(open(path)?);
    let mut manifest: Option<ArchiveManifest> = None;
    let mut batches = BTreeMap::new();
    for item in tar.entries().map_err(unreadable)? {
        let mut item = item.map_err(unreadable)?;
        let name = name_of(&item)?;
        if name == MANIFEST {
            if manifest.is_some() {
                return Err(invalid(format!("{MANIFEST} is in the archive twice")));
            }
            if item.size() > MANIFEST_LIMIT {
                return Err(invalid(format!("{MANIFEST} is larger than 1 MiB")));
            }
            let mut bytes = Vec::new();
            item.read_to_end(&mut bytes).map_err(unreadable)?;
            let m: ArchiveManifest =
                serde_json::from_slice(&bytes).map_err(|e| invalid(format!("{MANIFEST}: {e}")))?;
            if m.format != ARCHIVE_FORMAT {
                return Err(invalid(format!(
                    "archive format {} is not supported (this build reads {ARCHIVE_FORMAT})",
                    m.format
                )));
            }
            manifest = Some(m);
        } else if name == PROJECT {
            continue;
        } else if let Some(rel) = name.strip_prefix(&format!("{OBJECTS}/")) {
            // Every name must be one a conversation has (turn numbers are checked on the
            // second pass, against the verified record).
            match place(rel, u64::MAX) {
                Some(Place::Batch(seq)) => {
                    let mut bytes = Vec::new();
                    item.read_to_end(&mut bytes).map_err(unreadable)?;
                    if batches.insert(seq, bytes).is_some() {
                        return Err(invalid(format!("{name} is in the archive twice")));
                    }
                }
                Some(_) => {}
                None => {
                    return Err(invalid(format!(
                        "{name} is not something a conversation holds"
                    )))
                }
            }
        } else {
            return Err(invalid(format!(
                "{name} is not something a conversation archive holds"
            )));
        }
    }
    let manifest = manifest.ok_or_else(|| invalid(format!("the archive has no {MANIFEST}")))?;
    Ok(Scan { manifest, batches })
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An archive item: a name, and its contents (`Ok`) or a link target (`Err`).
    type Item<'a> = (&'a str, std::result::Result<&'a [u8], &'a str>);

    /// Writes a tar of `items` under `dir`.
    fn tar_of(dir: &FsPath, items: &[Item<'_>]) -> std::path::PathBuf {
        let path = dir.join("a.tar");
        let mut tar = tar::Builder::new(std::fs::File::create(&path).unwrap());
        for (name, what) in items {
            match what {
                Ok(bytes) => append(&mut tar, name, bytes).unwrap(),
                Err(target) => {
                    let mut header = tar::Header::new_gnu();
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_size(0);
                    tar.append_link(&mut header, name, target).unwrap();
                }
            }
        }
        tar.into_inner().unwrap().flush().unwrap();
        path
    }

    #[tokio::test]
    async fn archives_with_links_foreign_names_or_no_manifest_are_refused_and_write_nothing() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let conversations = Conversations::new(store.clone());
        let signer = RecordSigner::from_seed([1; 32]);
        let dir = tempfile::tempdir().unwrap();
        let cases: Vec<(&str, Vec<Item<'_>>)> = vec![
            (
                "only regular files",
                vec![("conversation/turns/turn_1/log.json", Err("/etc/passwd"))],
            ),
            (
                "not something a conversation holds",
                vec![("conversation/keys/record-signing.key", Ok(b"x"))],
            ),
            (
                "not something a conversation archive holds",
                vec![("etc/cron.d/evil", Ok(b"x"))],
            ),
            ("has no turnpike-export.json", vec![]),
            (
                "turnpike-export.json:",
                vec![(MANIFEST, Ok(b"{\"format\":1}"))],
            ),
        ];
        for (why, items) in cases {
            let archive = tar_of(dir.path(), &items);
            let e = import(&conversations, &signer, &archive, ImportOptions::default())
                .await
                .expect_err(why);
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{why}: {e}");
            assert!(e.to_string().contains(why), "{why}: {e}");
            let written: Vec<_> = store.list(None).try_collect().await.unwrap();
            assert!(written.is_empty(), "{why}: {written:?}");
        }
    }

    #[test]
    fn only_what_a_conversation_holds_has_a_place() {
        assert_eq!(
            place("record/00000000000000000003", 2),
            Some(Place::Batch(3))
        );
        assert_eq!(place("record/3", 2), None);
        assert_eq!(place("record-head", 2), Some(Place::Skip));
        assert_eq!(place("turns/turn_2/log.json", 2), Some(Place::Copy));
        assert_eq!(place("turns/turn_3/log.json", 2), Some(Place::Skip));
        assert_eq!(place("turns/turn_0/log.json", 2), Some(Place::Skip));
        assert_eq!(place("attachments/turn_1/a/b.png", 2), Some(Place::Copy));
        assert_eq!(place("git/refs/turn_1", 2), Some(Place::Copy));
        assert_eq!(place("git/objects/abc", 2), Some(Place::Copy));
        assert_eq!(place("forgotten/rows/x", 2), Some(Place::Copy));
        for bad in [
            "turns/../../x",
            "turns/turn_1/../../../etc/passwd",
            "../x",
            "",
            "turns//log.json",
            "turns/banana/log.json",
            "git/hooks/post-checkout",
            "keys/record-signing.key",
            "turns",
        ] {
            assert_eq!(place(bad, 5), None, "{bad}");
        }
    }
}
