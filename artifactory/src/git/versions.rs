//! Reading project versions as a person browses them: the files of one version, and what
//! changed between two.
//!
//! Both read only trees (and, for a diff, the blobs that changed) into a scratch repository:
//! listing a version never downloads its file contents, and a blob's size comes from the
//! store's metadata of its loose object.

use std::collections::BTreeMap;

use git2::{ObjectType, Oid};
use turnpike_schemas::ProjectVersion;

use super::{oid, with_repo, Lineage, Scratch};
use crate::error::{Error, ErrorKind, Result};

/// The most files a listing or a diff walks.
pub const MAX_FILES: usize = 10_000;
/// The largest file a diff shows line by line (larger ones are reported as changed, no patch).
pub const MAX_DIFF_BYTES: u64 = 1 << 20;
/// The most file content one diff reads for patches; files past it are reported without one.
pub const MAX_DIFF_TOTAL: u64 = 8 << 20;

/// One file of a project version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionFile {
    /// `/`-separated, relative to the project's root.
    pub path: String,
    pub size: u64,
    /// The git blob id of its content.
    pub blob: String,
}

/// How a file differs between two versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Added,
    Removed,
    Modified,
}

impl Change {
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Added => "added",
            Change::Removed => "removed",
            Change::Modified => "modified",
        }
    }
}

/// One changed file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChange {
    pub path: String,
    pub change: Change,
    /// A unified diff (`---`/`+++` headers and hunks), unless the file is binary, larger than
    /// [`MAX_DIFF_BYTES`] on either side, or past the diff's [`MAX_DIFF_TOTAL`].
    pub patch: Option<String>,
    /// Either side holds a NUL byte: no line diff is shown.
    pub binary: bool,
}

impl Lineage {
    /// Every file of `commit`, sorted by path. More than [`MAX_FILES`] is refused
    /// ([`ErrorKind::InvalidInput`]).
    pub async fn files(&self, commit: ProjectVersion) -> Result<Vec<VersionFile>> {
        use futures::{StreamExt as _, TryStreamExt as _};
        let scratch = Scratch::new().await?;
        let blobs = self.blobs(&scratch, oid(commit)).await?;
        // Sizes from the store's metadata, a few requests at a time, in path order.
        futures::stream::iter(blobs)
            .map(|(path, blob)| async move {
                Ok::<_, Error>(VersionFile {
                    size: self.blob_size(blob).await?,
                    path,
                    blob: blob.to_string(),
                })
            })
            .buffered(16)
            .try_collect()
            .await
    }

    /// What changed from `from` (none: an empty project) to `to`, sorted by path.
    pub async fn diff(
        &self,
        from: Option<ProjectVersion>,
        to: ProjectVersion,
    ) -> Result<Vec<FileChange>> {
        let scratch = Scratch::new().await?;
        let before = match from {
            Some(from) => self.blobs(&scratch, oid(from)).await?,
            None => BTreeMap::new(),
        };
        let after = self.blobs(&scratch, oid(to)).await?;
        let mut paths: Vec<&String> = before.keys().chain(after.keys()).collect();
        paths.sort();
        paths.dedup();
        let mut changes = Vec::new();
        let mut budget = MAX_DIFF_TOTAL;
        for path in paths {
            let (old, new) = (before.get(path).copied(), after.get(path).copied());
            let change = match (old, new) {
                (Some(a), Some(b)) if a == b => continue,
                (Some(_), Some(_)) => Change::Modified,
                (None, Some(_)) => Change::Added,
                (Some(_), None) => Change::Removed,
                (None, None) => continue,
            };
            let (old_bytes, new_bytes) = if budget > 0 {
                (self.diffable(old).await?, self.diffable(new).await?)
            } else {
                (None, None)
            };
            let (patch, binary) = match (old_bytes, new_bytes) {
                (Some(a), Some(b)) if a.contains(&0) || b.contains(&0) => (None, true),
                (Some(a), Some(b)) => {
                    budget = budget.saturating_sub((a.len() + b.len()) as u64);
                    (Some(unified(path.clone(), old, a, new, b).await?), false)
                }
                _ => (None, false),
            };
            changes.push(FileChange {
                path: path.clone(),
                change,
                patch,
                binary,
            });
        }
        Ok(changes)
    }

    /// A blob's bytes for a diff: empty for a missing side, `None` when too large to show.
    async fn diffable(&self, blob: Option<Oid>) -> Result<Option<bytes::Bytes>> {
        let Some(blob) = blob else {
            return Ok(Some(bytes::Bytes::new()));
        };
        if self.blob_size(blob).await? > MAX_DIFF_BYTES {
            return Ok(None);
        }
        Ok(Some(self.object(blob).await?.1))
    }

    /// Every blob reachable from `commit`'s tree, by path; trees are fetched into `scratch`.
    async fn blobs(&self, scratch: &Scratch, commit: Oid) -> Result<BTreeMap<String, Oid>> {
        let git_dir = scratch.git_dir();
        let root = self.root_of(&git_dir, commit).await?;
        let mut out = BTreeMap::new();
        let mut stack = vec![(String::new(), root)];
        while let Some((prefix, tree)) = stack.pop() {
            self.fetch_one(&git_dir, tree).await?;
            let entries = with_repo(&git_dir, move |repo| {
                let t = repo
                    .find_tree(tree)
                    .map_err(|e| super::git_error("reading a tree", e))?;
                Ok(t.iter()
                    .filter_map(|e| Some((e.name()?.to_owned(), e.id(), e.kind()?)))
                    .collect::<Vec<_>>())
            })
            .await?;
            for (name, id, kind) in entries {
                let path = if prefix.is_empty() {
                    name
                } else {
                    format!("{prefix}/{name}")
                };
                match kind {
                    ObjectType::Tree => stack.push((path, id)),
                    ObjectType::Blob => {
                        out.insert(path, id);
                    }
                    _ => {}
                }
                if out.len() + stack.len() > MAX_FILES {
                    return Err(Error::new(
                        ErrorKind::InvalidInput,
                        format!("the version holds more than {MAX_FILES} files"),
                    ));
                }
            }
        }
        Ok(out)
    }

    /// A blob's size, from the stored loose object's length (`blob <n>\0` + n bytes).
    async fn blob_size(&self, blob: Oid) -> Result<u64> {
        use object_store::ObjectStoreExt as _;
        let what = format!("reading the size of git object {blob}");
        let stored = self
            .store
            .head(&self.object_path(blob))
            .await
            .map_err(|e| Error::store(&what, e))?
            .size;
        content_length(stored)
            .ok_or_else(|| Error::new(ErrorKind::Corrupt, format!("{what}: bad length {stored}")))
    }
}

/// The content length `n` of a loose blob stored as `blob <n>\0<n bytes>` in `stored` bytes.
fn content_length(stored: u64) -> Option<u64> {
    (1..=20u32).find_map(|digits| {
        let n = stored.checked_sub(6 + u64::from(digits))?;
        (n.to_string().len() == digits as usize).then_some(n)
    })
}

/// A unified diff of one file (on a blocking thread: diffing is CPU work).
async fn unified(
    path: String,
    old: Option<Oid>,
    a: bytes::Bytes,
    new: Option<Oid>,
    b: bytes::Bytes,
) -> Result<String> {
    tokio::task::spawn_blocking(move || {
        let p = std::path::Path::new(&path);
        let mut patch = git2::Patch::from_buffers(&a, old.map(|_| p), &b, new.map(|_| p), None)
            .map_err(|e| super::git_error("diffing", e))?;
        let buf = patch
            .to_buf()
            .map_err(|e| super::git_error("printing a diff", e))?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    })
    .await
    .map_err(super::join_error)?
}

#[cfg(test)]
mod tests {
    use super::content_length;

    #[test]
    fn a_loose_blobs_content_length_comes_from_its_stored_length() {
        for n in [0u64, 1, 9, 10, 99, 100, 12345, 1 << 20, 999_999_999_999] {
            let stored = 5 + n.to_string().len() as u64 + 1 + n;
            assert_eq!(content_length(stored), Some(n), "{n}");
        }
        assert_eq!(content_length(3), None);
    }
}
