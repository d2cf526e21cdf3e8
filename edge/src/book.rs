//! A built book (mdBook's output), held in memory for the edge to serve at `/book/` (its
//! `help` module serves it).
//!
//! # Contract
//! - The book is read once, when the edge is built ([`Book::load`]): its regular files, at
//!   most [`MAX_FILES`] of them and [`MAX_BYTES`] in all, each with its media type and an
//!   ETag. Symbolic links and special files (FIFOs, sockets, devices) in it are skipped, so
//!   nothing outside the directory is ever served, and a request never touches the disk. A
//!   rebuilt book shows after a restart.
//! - A request is answered from those files only: a path with an empty, `.` or `..`
//!   component, a backslash or a NUL (after percent-decoding) is `404`, as is any path the
//!   book has no file for. A directory redirects to its trailing-slash form and serves its
//!   `index.html`.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use bytes::Bytes;
use sha2::{Digest as _, Sha256};

/// The most files a book may hold.
pub const MAX_FILES: usize = 20_000;

/// The most bytes a book's files may hold in all.
pub const MAX_BYTES: u64 = 256 << 20;

/// A built book, held in memory.
#[derive(Debug, Default)]
pub struct Book {
    /// By path relative to the book's directory, `/`-separated (`guides/mcp.html`).
    files: HashMap<String, Page>,
    /// The directories that hold an `index.html` (`guides`; the root is `""`).
    directories: HashSet<String>,
}

/// One file of the book.
#[derive(Debug)]
pub(crate) struct Page {
    pub(crate) bytes: Bytes,
    pub(crate) media_type: &'static str,
    pub(crate) etag: String,
}

/// What a request's path names.
pub(crate) enum Found<'a> {
    Page(&'a Page),
    /// A directory named without its trailing slash.
    Directory,
    Missing,
}

impl Book {
    /// Reads the built book in `dir`; the error says what is wrong (no such directory, no
    /// `index.html` — not built —, too big).
    pub fn load(dir: &Path) -> Result<Self, String> {
        let mut book = Book::default();
        let mut total = 0u64;
        let mut pending = vec![(dir.to_path_buf(), String::new())];
        while let Some((at, relative)) = pending.pop() {
            let entries = std::fs::read_dir(&at)
                .map_err(|e| format!("the book: cannot read {}: {e}", at.display()))?;
            for entry in entries {
                let entry =
                    entry.map_err(|e| format!("the book: cannot read {}: {e}", at.display()))?;
                let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                    continue;
                };
                if !clean(&name) {
                    continue;
                }
                let path = if relative.is_empty() {
                    name.clone()
                } else {
                    format!("{relative}/{name}")
                };
                // Not followed: a link's type, not its target's.
                let kind = entry
                    .file_type()
                    .map_err(|e| format!("the book: cannot read {path}: {e}"))?;
                if kind.is_dir() {
                    pending.push((entry.path(), path));
                } else if kind.is_file() {
                    if book.files.len() >= MAX_FILES {
                        return Err(format!(
                            "the book in {} has more than {MAX_FILES} files",
                            dir.display()
                        ));
                    }
                    let bytes = std::fs::read(entry.path())
                        .map_err(|e| format!("the book: cannot read {path}: {e}"))?;
                    total += bytes.len() as u64;
                    if total > MAX_BYTES {
                        return Err(format!(
                            "the book in {} is larger than {} MiB",
                            dir.display(),
                            MAX_BYTES >> 20
                        ));
                    }
                    if name == "index.html" {
                        book.directories.insert(relative.clone());
                    }
                    let etag = format!("\"{}\"", hex::encode(&Sha256::digest(&bytes)[..12]));
                    book.files.insert(
                        path,
                        Page {
                            media_type: media_type(&name),
                            bytes: Bytes::from(bytes),
                            etag,
                        },
                    );
                }
            }
        }
        if !book.directories.contains("") {
            return Err(format!(
                "the book in {} has no index.html: build it first (`mdbook build book`, then `--book book/book`)",
                dir.display()
            ));
        }
        Ok(book)
    }

    /// How many files it holds.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether it holds no file.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// The file `path` names (a directory: its `index.html`), if the book holds it.
    pub(crate) fn find(&self, path: &str) -> Found<'_> {
        let (dir, slash) = match path.strip_suffix('/') {
            Some(dir) => (dir, true),
            None => (path, false),
        };
        if !dir.is_empty() && !dir.split('/').all(clean) {
            return Found::Missing;
        }
        if self.directories.contains(dir) {
            if !slash && !dir.is_empty() {
                return Found::Directory;
            }
            let index = if dir.is_empty() {
                "index.html".to_owned()
            } else {
                format!("{dir}/index.html")
            };
            return self.files.get(&index).map_or(Found::Missing, Found::Page);
        }
        match self.files.get(path) {
            Some(page) if !slash => Found::Page(page),
            _ => Found::Missing,
        }
    }
}

/// A name that may be a path component: not empty, `.` or `..`, without `\` or NUL.
fn clean(part: &str) -> bool {
    !(part.is_empty() || part == "." || part == ".." || part.contains('\\') || part.contains('\0'))
}

fn media_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map_or("", |(_, ext)| ext) {
        "html" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "json" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "avif" => "image/avif",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "woff" => "font/woff",
        "ttf" => "font/ttf",
        "otf" => "font/otf",
        "eot" => "application/vnd.ms-fontobject",
        "txt" | "md" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page<'a>(book: &'a Book, path: &str) -> Option<&'a [u8]> {
        match book.find(path) {
            Found::Page(p) => Some(&p.bytes),
            _ => None,
        }
    }

    #[test]
    fn only_regular_files_under_the_directory_are_held_and_found() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "secret").unwrap();
        let built = tempfile::tempdir().unwrap();
        let dir = built.path();
        std::fs::write(dir.join("index.html"), "home").unwrap();
        std::fs::create_dir(dir.join("guides")).unwrap();
        std::fs::write(dir.join("guides/index.html"), "guides").unwrap();
        std::fs::write(dir.join("guides/a.html"), "a").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret.txt"), dir.join("link.txt"))
            .unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.join("away")).unwrap();
        std::os::unix::net::UnixListener::bind(dir.join("socket")).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(dir.join("fifo"))
            .status()
            .unwrap();
        assert!(made.success());
        let book = Book::load(dir).unwrap();
        assert_eq!(book.len(), 3, "the three regular files only");
        assert_eq!(page(&book, ""), Some(&b"home"[..]));
        assert_eq!(page(&book, "guides/"), Some(&b"guides"[..]));
        assert!(matches!(book.find("guides"), Found::Directory));
        assert_eq!(page(&book, "guides/a.html"), Some(&b"a"[..]));
        for bad in [
            "../secret.txt",
            "guides/../../secret.txt",
            "guides/../index.html",
            "./index.html",
            "guides//a.html",
            "guides/a.html/",
            "/index.html",
            "//",
            "link.txt",
            "away/secret.txt",
            "socket",
            "fifo",
            "guides\\a.html",
            "index.html\0",
            "missing.html",
        ] {
            assert!(matches!(book.find(bad), Found::Missing), "{bad:?}");
        }
    }

    #[test]
    fn a_book_not_built_is_refused_with_what_to_do() {
        let empty = tempfile::tempdir().unwrap();
        let refused = Book::load(empty.path()).unwrap_err();
        assert!(refused.contains("mdbook build book"), "{refused}");
        assert!(Book::load(&empty.path().join("missing"))
            .unwrap_err()
            .contains("cannot read"));
    }
}
