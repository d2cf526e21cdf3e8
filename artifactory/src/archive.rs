//! One conversation as one archive (a plain tar file), and back into another deployment.
//!
//! ```text
//! conversation/record/{batch:020}      the record's batches as stored: verifiable offline with
//!                                      the public keys the manifest carries
//! conversation/turns/turn_{n}/…        turn logs, context snapshots, hosted files
//! conversation/attachments/turn_{n}/…  attachments
//! conversation/attempts/…              what turns' attempts wrote
//! conversation/git/…                   the project's git objects and refs, as stored
//! conversation/forgotten/…             what the owner asked the index to forget
//! project.bundle                       the project versions as a git bundle (tags turn_n and
//!                                      main), when there are any: `git clone project.bundle`
//! turnpike-export.json                 the manifest (ArchiveManifest), last: the directory
//!                                      entry, the final root, the keys, the SHA-256 of every
//!                                      other file, signed by the exporting deployment's key
//! ```
//!
//! An export is taken from one head: nothing of a turn after it goes in (but attachments
//! uploaded for the next turn, which a running turn may have folded in). A conversation with a
//! turn running, or with events on its lane the record has not taken yet, is not exported.
//! Dead letters stay behind: their sequences belong to the exporting deployment's lane (the
//! record's `lane_parked` entries say what they were).
//!
//! An import checks everything before it writes anything: every name is one of the above (no
//! `..`, no links, no other kinds of files); the manifest's signature is by a key the operator
//! expects (without one, by the key the manifest names, and the import says that its origin is
//! not verified); every file's digest is the manifest's, and the manifest names no file the
//! archive lacks; the record verifies against the manifest's keys up to the manifest's root
//! and was opened for the conversation the manifest describes. It refuses a conversation the
//! deployment has, or once had (a tombstone). It then writes the objects (checking each digest
//! again as it writes), the record re-signed with this deployment's key batch by batch (every
//! entry unchanged, at the same position) followed by an `imported` entry that keeps the
//! original root, key and export time as provenance, the closed marker if there was one, and
//! last the directory entry — so a half-done import is invisible, and running it again with
//! the same archive finishes it.

use std::collections::BTreeMap;
use std::io::{Read, Seek, Write};
use std::path::Path as FsPath;
use std::sync::Arc;

use futures::TryStreamExt as _;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use turnpike_schemas::entry::Imported;
use turnpike_schemas::EntryBody;

use crate::error::{Error, ErrorKind, Result};
use crate::keys::{key_id, RecordSigner, SignatureCheck, TrustedKeys};
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
const MANIFEST_LIMIT: u64 = 64 << 20;

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
    /// Every other file of the archive, with the hex SHA-256 of its bytes.
    pub files: BTreeMap<String, String>,
    /// The exporting deployment's signature over the manifest without it.
    pub signature: Option<ArchiveSignature>,
}

/// Who signed a manifest, and the signature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchiveSignature {
    pub key_id: String,
    /// The public key, hex (its id must be `key_id`).
    pub public_key: String,
    /// ed25519 over [`crate::keys::archive_message`] of the manifest's digest, hex.
    pub signature: String,
}

impl ArchiveManifest {
    /// The SHA-256 of the manifest's JSON without its signature (what the signature covers).
    fn digest(&self) -> [u8; 32] {
        let mut unsigned = self.clone();
        unsigned.signature = None;
        Sha256::digest(serde_json::to_vec(&unsigned).expect("manifests serialise")).into()
    }
}

/// Where one of the conversation's objects goes, by its path under the conversation's folder.
#[derive(Debug, PartialEq, Eq)]
enum Place {
    /// A record batch.
    Batch(u64),
    /// Copied as it is.
    Copy,
    /// Left out: rebuilt on import (the head hint, repair leftovers), of a turn after the
    /// exported head, or of the exporting deployment's lane (dead letters).
    Skip,
}

/// Where `rel` (a path under the conversation's folder) goes, or `None` when no conversation
/// has such an object (an import refuses the archive).
fn place(rel: &str, last_turn: u64) -> Option<Place> {
    let parts: Vec<&str> = rel.split('/').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || *p == "." || *p == "..")
        || Path::parse(rel).is_err()
    {
        return None;
    }
    let turn_of =
        |segment: Option<&&str>| -> Option<u64> { segment?.strip_prefix("turn_")?.parse().ok() };
    let within = |n: Option<u64>, last: u64| match n {
        Some(n) if n >= 1 && n <= last => Some(Place::Copy),
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
        "turns" | "attempts" if parts.len() >= 3 => within(turn_of(parts.get(1)), last_turn),
        // An upload for the next turn may be folded into the last one already.
        "attachments" if parts.len() >= 3 => {
            within(turn_of(parts.get(1)), last_turn.saturating_add(1))
        }
        "git" if parts.len() == 3 && parts[1] == "refs" => within(turn_of(parts.get(2)), last_turn),
        "git" if parts.len() == 3 && parts[1] == "objects" => Some(Place::Copy),
        "forgotten" if parts.len() >= 2 => Some(Place::Copy),
        "dead-letters" if parts.len() >= 2 => Some(Place::Skip),
        _ => None,
    }
}

/// What goes to the archive writer.
enum Item {
    Object(String, bytes::Bytes),
    /// The project bundle's file, then the manifest: the end.
    End(Option<std::path::PathBuf>, Vec<u8>),
}

/// How long an export waits for the last turn's promotion before it says to come back.
const PROMOTION_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Writes the archive of `entry`'s conversation to `out`: every object of it up to its
/// current head, the project bundle (made with the `git` command), and the manifest signed by
/// `signer`. `keys` must hold every key that signed the record (the deployment's trusted keys);
/// `lane_last` is the last sequence on the conversation's lane, when the caller can read it
/// (events the record has not taken, or a turn not yet promoted, make the export wait:
/// `HeadMoved`).
pub async fn export(
    conversations: &Conversations,
    entry: &DirectoryEntry,
    keys: &TrustedKeys,
    signer: &RecordSigner,
    lane_last: Option<u64>,
    exported_by: &str,
    out: std::fs::File,
) -> Result<ArchiveManifest> {
    let prefix = entry.prefix();
    let record = conversations.record(prefix.clone());
    let head = record.head().await?;
    if head.state().turn_open || lane_last.unwrap_or(0) > head.state().lane_through {
        return Err(Error::new(
            ErrorKind::HeadMoved,
            format!(
                "{} has work in progress (a turn running, or events not taken yet): export it once it is done",
                entry.conversation
            ),
        ));
    }
    // A turn's objects (its version's ref among them) are promoted just after its commit,
    // under the open-turn mark its drain set before batch one and clears once every turn of it
    // is promoted: an export before that would miss the newest version. Read after the head,
    // an unset mark says every turn of that head is promoted.
    let marks = conversations.open_turns();
    let waited_from = std::time::Instant::now();
    while marks.is_marked(&prefix).await? {
        if waited_from.elapsed() > PROMOTION_WAIT {
            return Err(Error::new(
                ErrorKind::HeadMoved,
                format!(
                    "{} has a turn being finished (or left open by a worker that stopped): export it once it is done",
                    entry.conversation
                ),
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    if conversations
        .tombstones()
        .get(&entry.tenant, entry.conversation)
        .await?
        .is_some()
    {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!("{} is being deleted", entry.conversation),
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
    let mut files = BTreeMap::new();
    let bundle = if head.state().version.is_some() {
        let path = bundle(
            conversations.store().clone(),
            &prefix,
            last_turn,
            project_dir.path(),
        )
        .await?;
        let hashed = path.clone();
        let digest = tokio::task::spawn_blocking(move || sha256_file(&hashed))
            .await
            .map_err(|e| Error::new(ErrorKind::Store, format!("hashing the bundle: {e}")))??;
        files.insert(PROJECT.to_owned(), digest);
        Some(path)
    } else {
        None
    };

    // A blocking thread writes the tar while this task reads objects, one at a time.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Item>(8);
    let writer = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        let mut tar = tar::Builder::new(std::io::BufWriter::new(out));
        while let Some(item) = rx.blocking_recv() {
            match item {
                Item::Object(name, bytes) => append(&mut tar, &name, &bytes)?,
                Item::End(bundle, manifest) => {
                    if let Some(bundle) = bundle {
                        let mut file = std::fs::File::open(&bundle)?;
                        let mut header = tar::Header::new_gnu();
                        header.set_size(file.metadata()?.len());
                        header.set_mode(0o644);
                        tar.append_data(&mut header, PROJECT, &mut file)?;
                    }
                    append(&mut tar, MANIFEST, &manifest)?;
                    return tar.into_inner()?.flush();
                }
            }
        }
        Err(std::io::Error::other("the archive was left unfinished"))
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
            let name = format!("{OBJECTS}/{rel}");
            files.insert(name.clone(), hex::encode(Sha256::digest(&bytes)));
            if tx.send(Item::Object(name, bytes)).await.is_err() {
                return Ok(None);
            }
        }
        let mut manifest = ArchiveManifest {
            format: ARCHIVE_FORMAT,
            entry: entry.clone(),
            closed_ms,
            exported_ms: now_ms(),
            exported_by: exported_by.to_owned(),
            batches: head.batches(),
            leaves: root.leaf_count,
            root: root.root.clone(),
            keys: used,
            files: std::mem::take(&mut files),
            signature: None,
        };
        manifest.signature = Some(ArchiveSignature {
            key_id: signer.key_id().to_owned(),
            public_key: hex::encode(signer.verifying_key().as_bytes()),
            signature: hex::encode(signer.sign_archive(&manifest.digest())),
        });
        let bytes = serde_json::to_vec_pretty(&manifest).expect("manifests serialise");
        let _ = tx.send(Item::End(bundle, bytes)).await;
        Ok(Some(manifest))
    };
    let sent = sending.await;
    let written = writer
        .await
        .map_err(|e| Error::new(ErrorKind::Store, format!("the archive writer failed: {e}")))?;
    let manifest = sent?;
    written.map_err(|e| Error::new(ErrorKind::Store, format!("writing the archive: {e}")))?;
    manifest.ok_or_else(|| Error::new(ErrorKind::Store, "the archive writer stopped early"))
}

fn append<W: Write>(tar: &mut tar::Builder<W>, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(bytes.len() as u64);
    header.set_mode(0o644);
    tar.append_data(&mut header, name, bytes)
}

fn sha256_file(path: &FsPath) -> Result<String> {
    let mut file = std::fs::File::open(path)
        .map_err(|e| Error::new(ErrorKind::Store, format!("{}: {e}", path.display())))?;
    sha256_reader(&mut file)
        .map_err(|e| Error::new(ErrorKind::Store, format!("{}: {e}", path.display())))
}

/// The hex SHA-256 of everything `reader` yields.
fn sha256_reader(reader: &mut impl Read) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buffer = vec![0; 64 * 1024];
    loop {
        let n = reader.read(&mut buffer)?;
        if n == 0 {
            return Ok(hex::encode(hasher.finalize()));
        }
        hasher.update(&buffer[..n]);
    }
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
    /// Whether the manifest was signed by a key the importer expected.
    pub origin_verified: bool,
    /// Objects written besides the record.
    pub objects: u64,
    /// The record's batches here (the archive's, re-signed, and the `imported` one).
    pub batches: u64,
}

/// What the first pass over an archive found.
struct Scan {
    manifest: ArchiveManifest,
    batches: BTreeMap<u64, Vec<u8>>,
    /// Every file but the manifest, with its digest.
    digests: BTreeMap<String, String>,
}

/// How an import goes.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// The archive must be signed by one of these public keys (empty: by the key its manifest
    /// names, and the import says its origin is not verified).
    pub expect_keys: Vec<ed25519_dalek::VerifyingKey>,
    /// Only check the archive (offline: names, signatures, digests, root); write nothing.
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
        expect_keys,
        check_only,
        by,
    } = options;
    // One open file for both passes: swapping the path between them changes nothing.
    let file = std::fs::File::open(archive)
        .map_err(|e| invalid(format!("cannot open {}: {e}", archive.display())))?;
    let scanned = file
        .try_clone()
        .map_err(|e| invalid(format!("{}: {e}", archive.display())))?;
    let scan = tokio::task::spawn_blocking(move || scan(scanned))
        .await
        .map_err(|e| Error::new(ErrorKind::Store, format!("reading the archive: {e}")))??;
    let Scan {
        manifest,
        batches,
        digests,
    } = scan;

    // The manifest is signed by an expected key (or, without one, by the key it names).
    let signature = manifest
        .signature
        .clone()
        .ok_or_else(|| invalid("the archive's manifest is not signed".into()))?;
    let signed_by = TrustedKeys::parse_public(&signature.public_key)?;
    if key_id(&signed_by) != signature.key_id {
        return Err(invalid(
            "the manifest's signing key is not the key its id names".into(),
        ));
    }
    let origin_verified = !expect_keys.is_empty();
    let accepted = if origin_verified {
        TrustedKeys::new(expect_keys)
    } else {
        TrustedKeys::new([signed_by])
    };
    let raw_signature = hex::decode(&signature.signature).unwrap_or_default();
    match accepted.verify_archive(&signature.key_id, &manifest.digest(), &raw_signature) {
        SignatureCheck::Valid => {}
        SignatureCheck::UnknownKey => {
            return Err(invalid(format!(
                "the archive is signed by key {}, not by a key expected",
                signature.key_id
            )))
        }
        SignatureCheck::Invalid => {
            return Err(invalid(
                "the archive's manifest does not verify: its signature does not match".into(),
            ))
        }
    }
    // Every file is the one the manifest names, and no file is missing.
    if digests != manifest.files {
        let differ = digests
            .keys()
            .chain(manifest.files.keys())
            .find(|name| digests.get(*name) != manifest.files.get(*name))
            .cloned()
            .unwrap_or_default();
        return Err(invalid(format!(
            "the archive does not verify: {differ} is not what its manifest says"
        )));
    }
    for (id, public) in &manifest.keys {
        if key_id(&TrustedKeys::parse_public(public)?) != *id {
            return Err(invalid(format!(
                "the manifest names key {id} for a key that is not it"
            )));
        }
    }
    let entry = manifest.entry.clone();
    let conversation = entry.conversation;
    let prefix = entry.prefix();

    // The record verifies, offline, up to the manifest's root.
    let keys = TrustedKeys::new(
        manifest
            .keys
            .values()
            .map(|k| TrustedKeys::parse_public(k))
            .collect::<Result<Vec<_>>>()?,
    );
    let staged: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let source = Record::new(staged.clone(), prefix.clone());
    if batches.len() as u64 != manifest.batches || batches.keys().copied().ne(0..manifest.batches) {
        return Err(invalid(format!(
            "the archive holds {} record batches; its manifest says {}",
            batches.len(),
            manifest.batches
        )));
    }
    for (seq, bytes) in batches {
        staged
            .put(&prefix.record_batch(seq), PutPayload::from(bytes))
            .await
            .map_err(|e| Error::store("staging the record", e))?;
    }
    source
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
            if o.tenant == entry.tenant
                && o.owner == entry.owner
                && o.app == entry.app
                && o.agent == entry.agent => {}
        _ => {
            return Err(invalid(
                "the archive's record was not opened for the conversation its manifest names"
                    .into(),
            ))
        }
    }
    let original_public_key = manifest.keys.get(&root.key_id).cloned().unwrap_or_default();
    if check_only {
        return Ok(ImportReport {
            manifest,
            origin_verified,
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

    // The objects, read again from the same open file (one at a time, each digest checked
    // again), then the record, re-signed.
    let last_turn = head.state().last_turn;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(String, Vec<u8>)>(4);
    let expected = manifest.files.clone();
    let reader = tokio::task::spawn_blocking(move || -> Result<()> {
        let mut file = file;
        file.rewind().map_err(unreadable)?;
        let mut tar = tar::Archive::new(std::io::BufReader::new(file));
        for item in tar.entries().map_err(unreadable)? {
            let mut item = item.map_err(unreadable)?;
            let name = name_of(&item)?;
            let Some(rel) = name.strip_prefix(&format!("{OBJECTS}/")) else {
                continue;
            };
            if place(rel, last_turn) != Some(Place::Copy) {
                continue;
            }
            let Some(digest) = expected.get(&name) else {
                return Err(invalid(format!("{name} is not in the manifest")));
            };
            let mut bytes = Vec::new();
            item.read_to_end(&mut bytes).map_err(unreadable)?;
            if hex::encode(Sha256::digest(&bytes)) != *digest {
                return Err(invalid(format!("{name} changed while it was imported")));
            }
            if tx.blocking_send((rel.to_owned(), bytes)).is_err() {
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
        origin_verified,
        by,
        at_ms: now_ms(),
    });
    let head = target.reseal_from(&source, signer, &[imported]).await?;
    if let Some(closed) = manifest.closed_ms {
        directory.close(conversation, closed).await?;
    }
    match directory.create(&entry).await {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            // Only this import's own entry, from a run cut short, may be there.
            if directory.lookup_unchecked(conversation).await? != entry {
                return Err(Error::new(
                    ErrorKind::AlreadyExists,
                    format!("{conversation} exists here already"),
                ));
            }
        }
        Err(e) => return Err(e),
    }
    Ok(ImportReport {
        manifest,
        origin_verified,
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

/// The first pass: the manifest, the record's batches, and every file's digest; every name is
/// checked.
fn scan(file: std::fs::File) -> Result<Scan> {
    let mut tar = tar::Archive::new(std::io::BufReader::new(file));
    let mut manifest: Option<ArchiveManifest> = None;
    let mut batches = BTreeMap::new();
    let mut digests = BTreeMap::new();
    for item in tar.entries().map_err(unreadable)? {
        let mut item = item.map_err(unreadable)?;
        let name = name_of(&item)?;
        if name == MANIFEST {
            if manifest.is_some() {
                return Err(invalid(format!("{MANIFEST} is in the archive twice")));
            }
            if item.size() > MANIFEST_LIMIT {
                return Err(invalid(format!("{MANIFEST} is larger than 64 MiB")));
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
            continue;
        }
        let digest = if name == PROJECT {
            sha256_reader(&mut item).map_err(unreadable)?
        } else if let Some(rel) = name.strip_prefix(&format!("{OBJECTS}/")) {
            // Every name must be one a conversation has (turn numbers are checked on the
            // second pass, against the verified record).
            match place(rel, u64::MAX - 1) {
                Some(Place::Batch(seq)) => {
                    let mut bytes = Vec::new();
                    item.read_to_end(&mut bytes).map_err(unreadable)?;
                    let digest = hex::encode(Sha256::digest(&bytes));
                    if batches.insert(seq, bytes).is_some() {
                        return Err(invalid(format!("{name} is in the archive twice")));
                    }
                    digest
                }
                Some(_) => sha256_reader(&mut item).map_err(unreadable)?,
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
        };
        if digests.insert(name.clone(), digest).is_some() {
            return Err(invalid(format!("{name} is in the archive twice")));
        }
    }
    let manifest = manifest.ok_or_else(|| invalid(format!("the archive has no {MANIFEST}")))?;
    Ok(Scan {
        manifest,
        batches,
        digests,
    })
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
        assert_eq!(place("attachments/turn_3/a/b.png", 2), Some(Place::Copy));
        assert_eq!(place("attachments/turn_4/a/b.png", 2), Some(Place::Skip));
        assert_eq!(
            place("dead-letters/00000000000000000001", 2),
            Some(Place::Skip)
        );
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
            "turns/turn_1/a\u{1}b",
        ] {
            assert_eq!(place(bad, 5), None, "{bad}");
        }
    }
}
