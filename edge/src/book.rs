//! The book at `/book/`: the console's "Help" link. A deployment given a built book (`mdbook
//! build book`, then `--book book/book`) serves its pages; one without says where the book is.
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
//! - Pages are served sandboxed (`Content-Security-Policy: sandbox allow-scripts …`): the
//!   book's scripts run, but in an opaque origin, so nothing on the book's pages can read the
//!   console's token or call the API as the signed-in user. Since an opaque origin makes even
//!   the book's own fonts cross-origin, responses carry `Access-Control-Allow-Origin: *` (the
//!   book is public and no request to it carries a credential).
//! - No authentication: the book is the same for everybody, and holds nothing of anyone's.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use bytes::Bytes;
use sha2::{Digest as _, Sha256};

use crate::error::ApiError;
use crate::Edge;

/// The policy of every response under `/book/`.
const BOOK_POLICY: &str = "sandbox allow-scripts allow-popups allow-popups-to-escape-sandbox \
     allow-modals; default-src 'self' 'unsafe-inline' data:; frame-ancestors 'none'";

/// The most files a book may hold.
pub const MAX_FILES: usize = 20_000;

/// The most bytes a book's files may hold in all.
pub const MAX_BYTES: u64 = 256 << 20;

/// The page `/book/` shows when the deployment serves no book.
const NO_BOOK: &str = "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Turnpike: the book</title></head><body>\
<h1>The book</h1>\
<p>This deployment does not serve the book. It is in Turnpike's sources, in <code>book/</code> \
(start at <code>book/src/SUMMARY.md</code>). Build it with <code>mdbook build book</code> and pass \
<code>--book book/book</code> to <code>turnpike serve</code> or <code>turnpike router</code> to serve it here.</p>\
<p><a href=\"/\">Back to the console</a></p></body></html>";

/// A built book, held in memory.
#[derive(Debug, Default)]
pub struct Book {
    /// By path relative to the book's directory, `/`-separated (`guides/mcp.html`).
    files: HashMap<String, Page>,
    /// The directories that hold an `index.html` (`guides`; the root is `""`).
    directories: HashSet<String>,
}

#[derive(Debug)]
struct Page {
    bytes: Bytes,
    media_type: &'static str,
    etag: String,
}

/// What a request's path names.
enum Found<'a> {
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

    fn find(&self, path: &str) -> Found<'_> {
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

/// `GET /book`: to `/book/`, so the book's relative links resolve.
pub async fn root() -> Redirect {
    Redirect::permanent("/book/")
}

/// `GET /book/`: the book's first page.
pub async fn index(State(edge): State<Edge>, headers: HeaderMap) -> Response {
    serve(&edge, "", &headers)
}

/// `GET /book/{*path}`: a file of the book.
pub async fn page(
    State(edge): State<Edge>,
    axum::extract::Path(path): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Response {
    serve(&edge, &path, &headers)
}

fn serve(edge: &Edge, path: &str, headers: &HeaderMap) -> Response {
    let Some(book) = &edge.inner.book else {
        return sandboxed(
            (
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/html; charset=utf-8"),
                )],
                NO_BOOK,
            )
                .into_response(),
        );
    };
    let page = match book.find(path) {
        Found::Page(page) => page,
        Found::Directory => return Redirect::permanent(&format!("/book/{path}/")).into_response(),
        Found::Missing => return ApiError::not_found("no such page of the book").into_response(),
    };
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == page.etag));
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(page.media_type),
            )],
            page.bytes.clone(),
        )
            .into_response()
    };
    if let Ok(etag) = HeaderValue::from_str(&page.etag) {
        response.headers_mut().insert(header::ETAG, etag);
    }
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    sandboxed(response)
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

fn sandboxed(mut response: Response) -> Response {
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(BOOK_POLICY),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
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
