//! Project versions: one git lineage per conversation, one immutable ref per successful turn.
//!
//! Storage needs no git server. Objects live in the object store under the conversation's
//! prefix, one object per git object, named by its id and written create-if-absent (they are
//! content-addressed, so a second write of the same id is the same bytes):
//!
//! ```text
//! …/git/objects/{oid}     "<kind> <size>\0<data>" — git's loose-object form, uncompressed;
//!                         checked against its id on every read
//! …/git/refs/turn_{n}     the commit id of turn n, created only if absent (immutable)
//! ```
//!
//! A turn's project directory is its workspace with a git directory beside it: history is
//! available (objects are fetched on demand), the worktree holds only what the agent
//! materialises. At the end of a successful turn every regular file of the workspace is laid
//! over the previous version's tree; an unchanged project points the new ref at the previous
//! commit. Reading one file of any version is a handful of fetches (ref, commit, one tree per
//! directory level, blob): it does not grow with the number of turns. All git work runs on
//! blocking threads.

use std::collections::BTreeSet;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use git2::{ObjectType, Oid, Repository};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _, PutMode, PutOptions, PutPayload};
use turnpike_schemas::{ProjectVersion, RefPath, TurnId};

use crate::error::{Error, ErrorKind, Result};
use crate::layout::ConversationPrefix;

fn git_error(what: &str, e: git2::Error) -> Error {
    Error::new(ErrorKind::InvalidInput, format!("{what}: {}", e.message()))
}

pub mod versions;

fn join_error(e: tokio::task::JoinError) -> Error {
    Error::new(ErrorKind::Store, format!("a git task failed: {e}"))
}

/// The git commit id of a project version.
fn oid(v: ProjectVersion) -> Oid {
    Oid::from_bytes(v.as_bytes()).expect("a project version is 20 bytes")
}

/// The project version of a git commit id.
fn version(o: Oid) -> ProjectVersion {
    ProjectVersion::from_bytes(
        o.as_bytes()
            .try_into()
            .expect("a git commit id is 20 bytes"),
    )
}

/// One conversation's lineage in the object store.
#[derive(Debug, Clone)]
pub struct Lineage {
    store: Arc<dyn ObjectStore>,
    prefix: ConversationPrefix,
}

impl Lineage {
    pub fn new(store: Arc<dyn ObjectStore>, prefix: ConversationPrefix) -> Self {
        Self { store, prefix }
    }

    fn object_path(&self, oid: Oid) -> Path {
        Path::from(format!("{}/git/objects/{oid}", self.prefix.git_dir()))
    }

    fn ref_path(&self, turn: TurnId) -> Path {
        Path::from(format!("{}/git/refs/{turn}", self.prefix.git_dir()))
    }

    /// The commit a turn published, if it did.
    pub async fn ref_of(&self, turn: TurnId) -> Result<Option<ProjectVersion>> {
        let what = format!("reading the version of {turn}");
        match self.store.get(&self.ref_path(turn)).await {
            Ok(r) => {
                let bytes = r.bytes().await.map_err(|e| Error::store(&what, e))?;
                let text = String::from_utf8_lossy(&bytes);
                text.trim()
                    .parse::<ProjectVersion>()
                    .map(Some)
                    .map_err(|_| Error::new(ErrorKind::Corrupt, format!("{what}: not a commit id")))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Error::store(&what, e)),
        }
    }

    /// Publishes `commit` as `turn`'s version. A turn's ref is written once: publishing it again
    /// fails with [`ErrorKind::AlreadyExists`] and changes nothing.
    pub async fn publish_ref(&self, turn: TurnId, commit: ProjectVersion) -> Result<()> {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(
                &self.ref_path(turn),
                PutPayload::from(commit.to_string().into_bytes()),
                opts,
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("{turn} already has a published version; refs are never overwritten"),
            )),
            Err(e) => Err(Error::store(&format!("publishing {turn}"), e)),
        }
    }

    /// Publishes `commit` as `turn`'s ref unless it is published already with that commit
    /// (promotion of a committed turn may run more than once). A ref holding another commit is
    /// left alone and reported: refs are never overwritten.
    pub async fn publish_ref_once(&self, turn: TurnId, commit: ProjectVersion) -> Result<()> {
        match self.publish_ref(turn, commit).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => match self.ref_of(turn).await? {
                Some(existing) if existing == commit => Ok(()),
                _ => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// One object, checked against its id.
    pub async fn object(&self, oid: Oid) -> Result<(ObjectType, Bytes)> {
        let what = format!("reading git object {oid}");
        let bytes = self
            .store
            .get(&self.object_path(oid))
            .await
            .map_err(|e| Error::store(&what, e))?
            .bytes()
            .await
            .map_err(|e| Error::store(&what, e))?;
        let nul = bytes
            .iter()
            .position(|b| *b == 0)
            .ok_or_else(|| Error::new(ErrorKind::Corrupt, format!("{what}: no header")))?;
        let header = std::str::from_utf8(&bytes[..nul]).unwrap_or_default();
        let kind = match header.split(' ').next() {
            Some("blob") => ObjectType::Blob,
            Some("tree") => ObjectType::Tree,
            Some("commit") => ObjectType::Commit,
            _ => {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("{what}: bad header"),
                ))
            }
        };
        let data = bytes.slice(nul + 1..);
        let actual = Oid::hash_object(kind, &data).map_err(|e| git_error(&what, e))?;
        if actual != oid {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("{what}: its bytes hash to {actual}"),
            ));
        }
        Ok((kind, data))
    }

    /// Stores an object (create-if-absent: an object already there is the same object).
    pub async fn put_object(&self, oid: Oid, kind: ObjectType, data: &[u8]) -> Result<()> {
        let mut bytes = format!("{} {}\0", kind.str(), data.len()).into_bytes();
        bytes.extend_from_slice(data);
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(&self.object_path(oid), PutPayload::from(bytes), opts)
            .await
        {
            Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
            Err(e) => Err(Error::store(&format!("storing git object {oid}"), e)),
        }
    }

    /// Copies one object from the store into a local repository unless it has it; returns
    /// whether it copied.
    async fn fetch_one(&self, git_dir: &FsPath, oid: Oid) -> Result<bool> {
        if with_repo(git_dir, move |repo| Ok(has_object(repo, oid))).await? {
            return Ok(false);
        }
        let (kind, data) = self.object(oid).await?;
        with_repo(git_dir, move |repo| {
            repo.odb()
                .and_then(|odb| odb.write(kind, &data))
                .map_err(|e| git_error("writing", e))?;
            Ok(true)
        })
        .await
    }

    /// The tree and entries along `dir` (a list of segments) from `root`, fetched into the
    /// local repository. Returns the oid of the tree at `dir`, or `None` if it is missing.
    async fn fetch_path(&self, git_dir: &FsPath, root: Oid, dir: &[String]) -> Result<Option<Oid>> {
        self.fetch_one(git_dir, root).await?;
        let mut tree = root;
        for segment in dir {
            let next = entry(git_dir, tree, segment).await?;
            match next {
                Some((oid, ObjectType::Tree)) => {
                    self.fetch_one(git_dir, oid).await?;
                    tree = oid;
                }
                _ => return Ok(None),
            }
        }
        Ok(Some(tree))
    }

    /// The root tree of a commit, fetched.
    async fn root_of(&self, git_dir: &FsPath, commit: Oid) -> Result<Oid> {
        self.fetch_one(git_dir, commit).await?;
        with_repo(git_dir, move |repo| {
            let c = repo
                .find_commit(commit)
                .map_err(|e| git_error("reading a commit", e))?;
            Ok(c.tree_id())
        })
        .await
    }

    /// The bytes of `path` in `commit`, or `None` if it has no such file.
    pub async fn read_file(&self, commit: ProjectVersion, path: &RefPath) -> Result<Option<Bytes>> {
        let commit = oid(commit);
        let scratch = Scratch::new().await?;
        let git_dir = scratch.git_dir();
        let root = self.root_of(&git_dir, commit).await?;
        let segments = path.segments();
        let (name, dir) = segments.split_last().expect("paths have a segment");
        let Some(tree) = self.fetch_path(&git_dir, root, dir).await? else {
            return Ok(None);
        };
        match entry(&git_dir, tree, name).await? {
            Some((oid, ObjectType::Blob)) => Ok(Some(self.object(oid).await?.1)),
            _ => Ok(None),
        }
    }
}

/// A scratch bare repository, removed when dropped.
struct Scratch(tempfile::TempDir);

impl Scratch {
    async fn new() -> Result<Self> {
        let dir = tempfile::tempdir().map_err(|e| Error::new(ErrorKind::Store, e.to_string()))?;
        init_bare(&dir.path().join("git")).await?;
        Ok(Self(dir))
    }

    fn git_dir(&self) -> PathBuf {
        self.0.path().join("git")
    }
}

/// Runs `f` on the bare repository at `dir`, on a blocking thread.
async fn with_repo<T, F>(dir: &FsPath, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce(&Repository) -> Result<T> + Send + 'static,
{
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let repo = Repository::open_bare(&dir).map_err(|e| git_error("opening", e))?;
        f(&repo)
    })
    .await
    .map_err(join_error)?
}

/// Whether a repository holds an object.
fn has_object(repo: &Repository, oid: Oid) -> bool {
    repo.odb().map(|o| o.exists(oid)).unwrap_or(false)
}

async fn init_bare(git_dir: &FsPath) -> Result<()> {
    let dir = git_dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        Repository::init_bare(&dir)
            .map(|_| ())
            .map_err(|e| git_error("creating a repository", e))
    })
    .await
    .map_err(join_error)?
}

/// One entry of a tree in the local repository.
async fn entry(git_dir: &FsPath, tree: Oid, name: &str) -> Result<Option<(Oid, ObjectType)>> {
    let name = name.to_owned();
    with_repo(git_dir, move |repo| {
        let t = repo
            .find_tree(tree)
            .map_err(|e| git_error("reading a tree", e))?;
        Ok(t.get_name(&name)
            .and_then(|e| e.kind().map(|k| (e.id(), k))))
    })
    .await
}

/// A turn's project directory: the workspace as worktree, a git directory beside it.
pub struct Project {
    lineage: Lineage,
    workspace: PathBuf,
    git_dir: PathBuf,
    /// The version the turn started from (the last published one).
    base: Option<Oid>,
}

impl Project {
    /// Opens the project of a turn over `workspace`, starting from `base` (the last version).
    /// The worktree starts empty; history is fetched on demand.
    pub async fn open(
        lineage: Lineage,
        workspace: &FsPath,
        base: Option<ProjectVersion>,
    ) -> Result<Self> {
        let base = base.map(oid);
        let git_dir = workspace.with_extension("git");
        if !git_dir.exists() {
            init_bare(&git_dir).await?;
        }
        Ok(Self {
            lineage,
            workspace: workspace.to_path_buf(),
            git_dir,
            base,
        })
    }

    /// The version the turn started from.
    pub fn base(&self) -> Option<ProjectVersion> {
        self.base.map(version)
    }

    /// Materialises `path` (a file, or a folder and everything under it; the root when empty)
    /// of `commit` (default: the base) into the workspace. Returns the files written. Paths
    /// are checked by the reference grammar; no entry can leave the workspace.
    pub async fn materialise(
        &self,
        path: Option<&RefPath>,
        commit: Option<ProjectVersion>,
    ) -> Result<Vec<String>> {
        let Some(commit) = commit.map(oid).or(self.base) else {
            return Ok(Vec::new());
        };
        let root = self.lineage.root_of(&self.git_dir, commit).await?;
        let segments: Vec<String> = path.map(|p| p.segments().to_vec()).unwrap_or_default();
        let mut written = Vec::new();
        let (start, start_kind) = if segments.is_empty() {
            (root, ObjectType::Tree)
        } else {
            let (name, dir) = segments.split_last().expect("non-empty");
            let Some(tree) = self.lineage.fetch_path(&self.git_dir, root, dir).await? else {
                return Err(Error::new(
                    ErrorKind::NotFound,
                    format!("no {} in this version", segments.join("/")),
                ));
            };
            match entry(&self.git_dir, tree, name).await? {
                Some(found) => found,
                None => {
                    return Err(Error::new(
                        ErrorKind::NotFound,
                        format!("no {} in this version", segments.join("/")),
                    ))
                }
            }
        };
        let mut stack = vec![(segments, start, start_kind)];
        while let Some((segs, oid, kind)) = stack.pop() {
            match kind {
                ObjectType::Blob => {
                    let rel = RefPath::from_segments(segs.clone()).map_err(|e| {
                        Error::new(ErrorKind::Corrupt, format!("a stored path is unsafe: {e}"))
                    })?;
                    let (_, data) = self.lineage.object(oid).await?;
                    write_in(&self.workspace, &rel, &data)?;
                    written.push(rel.to_relative_path());
                }
                ObjectType::Tree => {
                    self.lineage.fetch_one(&self.git_dir, oid).await?;
                    let entries = with_repo(&self.git_dir, move |repo| {
                        let t = repo
                            .find_tree(oid)
                            .map_err(|e| git_error("reading a tree", e))?;
                        Ok(t.iter()
                            .filter_map(|e| Some((e.name()?.to_owned(), e.id(), e.kind()?)))
                            .collect::<Vec<(String, Oid, ObjectType)>>())
                    })
                    .await?;
                    for (name, oid, kind) in entries {
                        let mut s = segs.clone();
                        s.push(name);
                        stack.push((s, oid, kind));
                    }
                }
                _ => {}
            }
        }
        written.sort();
        Ok(written)
    }

    /// Commits the workspace over the base version and stores the new objects; returns the
    /// commit to publish (the base itself when nothing changed; `None` when there is no project
    /// at all: no base and no files). Symbolic links and anything that is not a regular file are
    /// never committed.
    pub async fn commit_if_any(
        &self,
        turn: TurnId,
        message: &str,
    ) -> Result<Option<ProjectVersion>> {
        if is_empty_dir(&self.workspace) {
            // Nothing materialised or made: the project (if any) is unchanged.
            return Ok(self.base.map(version));
        }
        self.commit(turn, message).await.map(Some)
    }

    /// [`Self::commit_if_any`], always producing a commit.
    pub async fn commit(&self, turn: TurnId, message: &str) -> Result<ProjectVersion> {
        self.commit_oid(turn, message).await.map(version)
    }

    async fn commit_oid(&self, turn: TurnId, message: &str) -> Result<Oid> {
        let _ = turn;
        // 1. Hash the workspace's files into the local repository.
        let workspace = self.workspace.clone();
        let files = with_repo(&self.git_dir, move |repo| hash_workspace(repo, &workspace)).await?;
        // 2. Fetch the base trees along every changed file's folder.
        let base_root = self.fetch_base(&files).await?;
        // 3. Lay the files over the base tree; commit if the tree changed.
        let (base, message) = (self.base, message.to_owned());
        let upload: Vec<Oid> = files.iter().map(|(_, o)| *o).collect();
        let (commit, new_trees) = with_repo(&self.git_dir, move |repo| {
            lay_over(repo, base_root, base, &files, &message)
        })
        .await?;
        if Some(commit) == self.base {
            return Ok(commit);
        }
        // 4. Store the new objects: blobs, trees, then the commit.
        let mut oids = upload;
        oids.extend(new_trees);
        oids.push(commit);
        self.store_objects(oids).await?;
        Ok(commit)
    }

    /// The base commit's root tree (none: no base), with the trees along every file's folder
    /// fetched as deep as the base has them.
    async fn fetch_base(&self, files: &[(Vec<String>, Oid)]) -> Result<Option<Oid>> {
        let Some(base) = self.base else {
            return Ok(None);
        };
        let root = self.lineage.root_of(&self.git_dir, base).await?;
        let dirs: BTreeSet<Vec<String>> = files
            .iter()
            .map(|(s, _)| s[..s.len() - 1].to_vec())
            .collect();
        for dir in dirs {
            // As deep as the base has the folder (`None`: the rest is new).
            self.lineage.fetch_path(&self.git_dir, root, &dir).await?;
        }
        Ok(Some(root))
    }

    /// Copies objects of the local repository to the lineage's store, in the order given.
    async fn store_objects(&self, oids: Vec<Oid>) -> Result<()> {
        for oid in oids {
            let (kind, data) = with_repo(&self.git_dir, move |repo| {
                let odb = repo.odb().map_err(|e| git_error("opening", e))?;
                let obj = odb
                    .read(oid)
                    .map_err(|e| git_error("reading an object", e))?;
                Ok((obj.kind(), obj.data().to_vec()))
            })
            .await?;
            self.lineage.put_object(oid, kind, &data).await?;
        }
        Ok(())
    }

    /// Removes the git directory (the workspace goes with the turn); dropping does the same.
    pub fn remove(self) {}
}

impl Drop for Project {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.git_dir);
    }
}

/// Copies every object reachable from `commit` into the bare repository at `dir`, skipping what
/// it has.
async fn copy_reachable(lineage: &Lineage, dir: &FsPath, commit: Oid) -> Result<()> {
    // Every object reachable from the commit, fetched once.
    let mut stack = vec![commit];
    while let Some(oid) = stack.pop() {
        // Already there: so is everything it reaches.
        if !lineage.fetch_one(dir, oid).await? {
            continue;
        }
        let children = with_repo(dir, move |repo| {
            let obj = repo
                .find_object(oid, None)
                .map_err(|e| git_error("reading", e))?;
            Ok(match obj.kind() {
                Some(ObjectType::Commit) => {
                    let c = obj.as_commit().expect("a commit");
                    let mut v = vec![c.tree_id()];
                    v.extend(c.parent_ids());
                    v
                }
                Some(ObjectType::Tree) => obj
                    .as_tree()
                    .expect("a tree")
                    .iter()
                    .map(|e| e.id())
                    .collect(),
                _ => Vec::new(),
            })
        })
        .await?;
        stack.extend(children);
    }
    Ok(())
}

/// Pushes the version `turn` published to an ordinary git repository outside Turnpike (a bare
/// repository path, or a `file://` URL to one) as `refs/turnpike/<conversation>/turn_<n>`. The ref
/// is created only if absent (libgit2's lock-file create): if the remote has it already, the push
/// is refused and the remote's ref is left as it was. Network transports (https, ssh) are not
/// built in: this build links libgit2 without them.
pub async fn push_to_remote(lineage: &Lineage, url: &str, turn: TurnId) -> Result<()> {
    let commit =
        lineage.ref_of(turn).await?.map(oid).ok_or_else(|| {
            Error::new(ErrorKind::NotFound, format!("{turn} published no version"))
        })?;
    let path = PathBuf::from(url.strip_prefix("file://").unwrap_or(url));
    if !path.join("HEAD").is_file() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("{url} is not a bare git repository (only local ones are supported)"),
        ));
    }
    let name = format!("refs/turnpike/{}/{turn}", lineage.prefix.conversation());
    let (p, n) = (path.clone(), name.clone());
    let exists = tokio::task::spawn_blocking(move || {
        Repository::open_bare(&p)
            .map(|r| r.find_reference(&n).is_ok())
            .map_err(|e| git_error("opening the remote", e))
    })
    .await
    .map_err(join_error)??;
    if exists {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            format!("{url} has {name} already; turn refs are never overwritten"),
        ));
    }
    copy_reachable(lineage, &path, commit).await?;
    tokio::task::spawn_blocking(move || -> Result<()> {
        let repo = Repository::open_bare(&path).map_err(|e| git_error("opening the remote", e))?;
        let created = repo
            .reference(&name, commit, false, "turnpike push")
            .map(|_| ());
        match created {
            Ok(()) => Ok(()),
            Err(e) if e.code() == git2::ErrorCode::Exists => Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("the remote has {name} already; turn refs are never overwritten"),
            )),
            Err(e) => Err(git_error("writing the remote's ref", e)),
        }
    })
    .await
    .map_err(join_error)?
}

fn is_empty_dir(dir: &FsPath) -> bool {
    std::fs::read_dir(dir).map_or(true, |mut d| d.next().is_none())
}

/// Writes `data` at `rel` inside `root`, refusing to go through a symbolic link.
fn write_in(root: &FsPath, rel: &RefPath, data: &[u8]) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut full = root.to_path_buf();
    let segments = rel.segments();
    for (i, seg) in segments.iter().enumerate() {
        full.push(seg);
        if let Ok(m) = std::fs::symlink_metadata(&full) {
            if m.file_type().is_symlink() {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!("{rel} goes through a symbolic link"),
                ));
            }
        }
        if i + 1 < segments.len() {
            std::fs::create_dir_all(&full)
                .map_err(|e| Error::new(ErrorKind::Store, e.to_string()))?;
        }
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&full)
        .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("writing {rel}: {e}")))?;
    f.write_all(data)
        .map_err(|e| Error::new(ErrorKind::Store, e.to_string()))
}

/// Writes a plain bare repository with every published version: one tag `turn_<n>` per turn and
/// `main` at the last. Returns how many versions were exported.
pub async fn export(lineage: &Lineage, last_turn: u64, dir: &FsPath) -> Result<usize> {
    init_bare(dir).await?;
    let mut exported = 0;
    let mut last = None;
    for n in 1..=last_turn {
        let turn = TurnId::new(n).expect("non-zero");
        let Some(commit) = lineage.ref_of(turn).await?.map(oid) else {
            continue;
        };
        copy_reachable(lineage, dir, commit).await?;
        with_repo(dir, move |repo| {
            repo.reference(
                &format!("refs/tags/{turn}"),
                commit,
                false,
                &format!("turnpike {turn}"),
            )
            .map_err(|e| git_error("writing a ref", e))?;
            Ok(())
        })
        .await?;
        exported += 1;
        last = Some(commit);
    }
    if let Some(commit) = last {
        with_repo(dir, move |repo| {
            repo.reference("refs/heads/main", commit, true, "turnpike export")
                .map_err(|e| git_error("writing a ref", e))?;
            repo.set_head("refs/heads/main")
                .map_err(|e| git_error("writing HEAD", e))?;
            Ok(())
        })
        .await?;
    }
    Ok(exported)
}

/// The workspace's regular files (path segments, blob), hashed into `repo`, sorted; names a
/// ref path cannot hold are skipped, symbolic links never followed, and so is a repository's
/// own `.git` directory (a turn's code may make one, e.g. for an MCP git server): a git tree
/// cannot hold an entry of that name.
fn hash_workspace(repo: &Repository, workspace: &FsPath) -> Result<Vec<(Vec<String>, Oid)>> {
    let mut out = Vec::new();
    let mut stack = vec![(workspace.to_path_buf(), Vec::<String>::new())];
    while let Some((dir, segs)) = stack.pop() {
        let Ok(read) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in read.filter_map(|e| e.ok()) {
            let Ok(meta) = e.path().symlink_metadata() else {
                continue;
            };
            let Some(name) = e.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if name.eq_ignore_ascii_case(".git") {
                continue;
            }
            let mut s = segs.clone();
            s.push(name);
            if RefPath::from_segments(s.clone()).is_err() {
                continue;
            }
            if meta.is_dir() {
                stack.push((e.path(), s));
            } else if meta.is_file() {
                let data = std::fs::read(e.path())
                    .map_err(|e| Error::new(ErrorKind::Store, e.to_string()))?;
                let oid = repo
                    .blob(&data)
                    .map_err(|e| git_error("hashing a file", e))?;
                out.push((s, oid));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Lays `files` over the base tree (an empty one without a base) and commits the result on
/// `base`: the commit and the trees along every file's folder (new or unchanged: all are
/// uploaded). An unchanged tree is no commit: the base, and no trees.
fn lay_over(
    repo: &git2::Repository,
    base_root: Option<Oid>,
    base: Option<Oid>,
    files: &[(Vec<String>, Oid)],
    message: &str,
) -> Result<(Oid, Vec<Oid>)> {
    let base_tree = match base_root {
        Some(root) => repo
            .find_tree(root)
            .map_err(|e| git_error("reading a tree", e))?,
        None => {
            let empty = repo
                .treebuilder(None)
                .and_then(|b| b.write())
                .map_err(|e| git_error("an empty tree", e))?;
            repo.find_tree(empty)
                .map_err(|e| git_error("an empty tree", e))?
        }
    };
    let mut update = git2::build::TreeUpdateBuilder::new();
    for (segs, oid) in files {
        update.upsert(segs.join("/"), *oid, git2::FileMode::Blob);
    }
    let tree = update
        .create_updated(repo, &base_tree)
        .map_err(|e| git_error("building the tree", e))?;
    if Some(tree) == base_root {
        return Ok((
            base.expect("a base tree comes from a base commit"),
            Vec::new(),
        ));
    }
    let tree = repo
        .find_tree(tree)
        .map_err(|e| git_error("reading a tree", e))?;
    let mut trees = vec![tree.id()];
    let mut seen = BTreeSet::new();
    for (segs, _) in files {
        for depth in 1..segs.len() {
            let p = segs[..depth].join("/");
            if seen.insert(p.clone()) {
                if let Ok(e) = tree.get_path(FsPath::new(&p)) {
                    trees.push(e.id());
                }
            }
        }
    }
    let sig = git2::Signature::now("turnpike", "turnpike@localhost")
        .map_err(|e| git_error("a signature", e))?;
    let parents: Vec<git2::Commit> = match base {
        Some(b) => vec![repo
            .find_commit(b)
            .map_err(|e| git_error("reading a commit", e))?],
        None => Vec::new(),
    };
    let parent_refs: Vec<&git2::Commit> = parents.iter().collect();
    let commit = repo
        .commit(None, &sig, &sig, message, &tree, &parent_refs)
        .map_err(|e| git_error("committing", e))?;
    Ok((commit, trees))
}
