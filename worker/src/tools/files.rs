//! Workspace tools: read, list and write files of the turn's workspace.
//!
//! Paths are relative and checked by the reference grammar (no `..`, no absolute paths, no
//! encoded tricks); every existing component is checked not to be a symbolic link, and files
//! are opened with `O_NOFOLLOW`, so nothing reaches outside the workspace.

use std::io::{Read as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use serde_json::{json, Value};
use turnpike_schemas::RefPath;

use super::{str_arg, Tool, ToolContext, ToolOutput};
use turnpike_agent::model::ToolSpec;

/// The most of a file `read_file` returns.
const MAX_READ_BYTES: u64 = 64 * 1024;

/// Resolves a workspace-relative path, refusing anything that could leave the workspace.
pub(crate) fn workspace_path(workspace: &Path, raw: &str) -> Result<(RefPath, PathBuf), String> {
    let rel = RefPath::parse(raw).map_err(|e| format!("path {raw:?}: {e}"))?;
    let mut full = workspace.to_path_buf();
    for segment in rel.segments() {
        full.push(segment);
        match std::fs::symlink_metadata(&full) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(format!("path {raw:?} goes through a symbolic link"))
            }
            _ => {}
        }
    }
    Ok((rel, full))
}

/// Opens a workspace file for reading without following a link and without blocking (a FIFO
/// left by generated code would block an ordinary open forever), and refuses anything but a
/// regular file.
fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    ensure_regular(&file)?;
    Ok(file)
}

fn ensure_regular(file: &std::fs::File) -> std::io::Result<()> {
    if file.metadata()?.is_file() {
        return Ok(());
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        "not a regular file (a folder, FIFO, socket or device)",
    ))
}

/// Reads (the start of) a workspace file.
pub(crate) fn read_bounded(path: &Path, limit: u64) -> std::io::Result<(Vec<u8>, u64)> {
    let file = open_regular(path)?;
    let size = file.metadata()?.len();
    let mut bytes = Vec::new();
    file.take(limit).read_to_end(&mut bytes)?;
    Ok((bytes, size))
}

/// `read_file {path}`.
pub struct ReadFile;

#[async_trait]
impl Tool for ReadFile {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "read_file".into(),
            description: "Read a text file of the workspace (up to 64 KiB).".into(),
            parameters: json!({"type": "object", "properties": {
                "path": {"type": "string", "description": "workspace-relative path"}},
                "required": ["path"]}),
        }
    }

    async fn call(&self, cx: &ToolContext<'_>, args: Value) -> Result<ToolOutput, String> {
        let raw = str_arg(&args, "path")?;
        let (rel, full) = workspace_path(cx.workspace, raw)?;
        let (bytes, size) =
            tokio::task::spawn_blocking(move || read_bounded(&full, MAX_READ_BYTES))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("cannot read {rel}: {e}"))?;
        Ok(json!({
            "path": rel.to_relative_path(),
            "size": size,
            "truncated": size > MAX_READ_BYTES,
            "text": String::from_utf8_lossy(&bytes),
        })
        .into())
    }
}

/// `list_files {path?}`.
pub struct ListFiles;

#[async_trait]
impl Tool for ListFiles {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "list_files".into(),
            description: "List the files of the workspace (recursively, up to 500).".into(),
            parameters: json!({"type": "object", "properties": {
                "path": {"type": "string", "description": "a workspace-relative folder; default: the whole workspace"}}}),
        }
    }

    async fn call(&self, cx: &ToolContext<'_>, args: Value) -> Result<ToolOutput, String> {
        let root = match args.get("path").and_then(Value::as_str) {
            Some(raw) if !raw.is_empty() && raw != "." => workspace_path(cx.workspace, raw)?.1,
            _ => cx.workspace.to_path_buf(),
        };
        let base = cx.workspace.to_path_buf();
        let entries = tokio::task::spawn_blocking(move || list(&base, &root))
            .await
            .map_err(|e| e.to_string())??;
        Ok(json!({ "files": entries }).into())
    }
}

fn list(base: &Path, root: &Path) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let read = std::fs::read_dir(&dir).map_err(|e| format!("cannot list: {e}"))?;
        let mut names: Vec<_> = read.filter_map(|e| e.ok()).collect();
        names.sort_by_key(|e| e.file_name());
        for entry in names {
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            let rel = entry
                .path()
                .strip_prefix(base)
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                out.push(json!({"path": rel, "size": meta.len()}));
            }
            if out.len() >= 500 {
                return Ok(out);
            }
        }
    }
    Ok(out)
}

/// `write_file {path, content}`.
pub struct WriteFile;

#[async_trait]
impl Tool for WriteFile {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "write_file".into(),
            description: "Write a text file in the workspace (creating folders as needed).".into(),
            parameters: json!({"type": "object", "properties": {
                "path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"]}),
        }
    }

    async fn call(&self, cx: &ToolContext<'_>, args: Value) -> Result<ToolOutput, String> {
        let raw = str_arg(&args, "path")?;
        let content = str_arg(&args, "content")?.to_owned();
        let (rel, full) = workspace_path(cx.workspace, raw)?;
        let size = content.len();
        write_file(full, content.into_bytes())
            .await
            .map_err(|e| format!("cannot write {rel}: {e}"))?;
        Ok(json!({"path": rel.to_relative_path(), "size": size}).into())
    }
}

/// Writes a file (parents created, the file itself never followed if it is a link).
pub(crate) async fn write_file(full: PathBuf, bytes: Vec<u8>) -> std::io::Result<()> {
    tokio::task::spawn_blocking(move || {
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent)?;
        }
        // Refuse what is there already unless it is a regular file, before opening it: a FIFO
        // or a device must not be opened (blocking, or truncating a device) at all.
        match std::fs::symlink_metadata(&full) {
            Ok(m) if !m.is_file() => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "something other than a regular file is there",
                ))
            }
            _ => {}
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&full)?;
        ensure_regular(&file)?;
        file.write_all(&bytes)
    })
    .await
    .map_err(std::io::Error::other)?
}
