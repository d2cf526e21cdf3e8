//! The book at `/book/`: the console's "Help" link. A deployment given a built book (`mdbook
//! build book`, then `--book book/book`) serves its files; one without says where the book is.
//!
//! # Contract
//! - Only regular files under the book's directory are served: a path with an empty, `.` or
//!   `..` component, a backslash or a NUL (after percent-decoding) is `404`, and so is a
//!   symbolic link anywhere on the way or anything that resolves outside the directory.
//! - A directory serves its `index.html`.
//! - Pages are served sandboxed (`Content-Security-Policy: sandbox allow-scripts …`): the
//!   book's scripts run, but in an opaque origin, so nothing on the book's pages can read the
//!   console's token or call the API as the signed-in user.
//! - No authentication: the book is the same for everybody, and holds nothing of anyone's.

use std::path::{Path, PathBuf};

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};

use crate::error::ApiError;
use crate::Edge;

/// The policy of every response under `/book/`.
pub const BOOK_POLICY: &str = "sandbox allow-scripts allow-popups allow-popups-to-escape-sandbox; \
     default-src 'self' 'unsafe-inline' data:; frame-ancestors 'none'";

/// The page `/book/` shows when the deployment serves no book.
const NO_BOOK: &str = "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Turnpike: the book</title></head><body>\
<h1>The book</h1>\
<p>This deployment does not serve the book. It is in Turnpike's sources, in <code>book/</code> \
(start at <code>book/src/SUMMARY.md</code>). Build it with <code>mdbook build book</code> and pass \
<code>--book book/book</code> to <code>turnpike serve</code> or <code>turnpike router</code> to serve it here.</p>\
<p><a href=\"/\">Back to the console</a></p></body></html>";

/// `GET /book`: to `/book/`, so the book's relative links resolve.
pub async fn root() -> Redirect {
    Redirect::permanent("/book/")
}

/// `GET /book/`: the book's first page.
pub async fn index(State(edge): State<Edge>) -> Response {
    file(&edge, "").await
}

/// `GET /book/{*path}`: a file of the book.
pub async fn page(
    State(edge): State<Edge>,
    axum::extract::Path(path): axum::extract::Path<String>,
) -> Response {
    file(&edge, &path).await
}

async fn file(edge: &Edge, path: &str) -> Response {
    let Some(dir) = &edge.inner.book else {
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
    let Some(found) = locate(dir, path) else {
        return ApiError::not_found("no such page of the book").into_response();
    };
    match tokio::fs::read(&found).await {
        Ok(bytes) => sandboxed(
            (
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(media_type(&found)),
                )],
                bytes,
            )
                .into_response(),
        ),
        Err(_) => ApiError::not_found("no such page of the book").into_response(),
    }
}

/// The regular file `path` names under `dir` (a directory: its `index.html`), or `None`.
pub fn locate(dir: &Path, path: &str) -> Option<PathBuf> {
    let mut at = dir.to_path_buf();
    let trimmed = path.strip_suffix('/').unwrap_or(path);
    if !trimmed.is_empty() {
        for part in trimmed.split('/') {
            let bad = part.is_empty()
                || part == "."
                || part == ".."
                || part.contains('\\')
                || part.contains('\0');
            if bad {
                return None;
            }
            at.push(part);
            // No symbolic link on the way: what is served is what the directory holds.
            if std::fs::symlink_metadata(&at)
                .ok()?
                .file_type()
                .is_symlink()
            {
                return None;
            }
        }
    }
    let meta = std::fs::symlink_metadata(&at).ok()?;
    if meta.is_dir() {
        at.push("index.html");
    }
    let meta = std::fs::symlink_metadata(&at).ok()?;
    if !meta.file_type().is_file() {
        return None;
    }
    // A second wall: the file resolves under the directory.
    let root = std::fs::canonicalize(dir).ok()?;
    std::fs::canonicalize(&at)
        .ok()?
        .starts_with(root)
        .then_some(at)
}

fn media_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" => "text/javascript; charset=utf-8",
        "json" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "woff" => "font/woff",
        "ttf" => "font/ttf",
        "txt" | "md" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

fn sandboxed(mut response: Response) -> Response {
    let ok = response.status() == StatusCode::OK;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(BOOK_POLICY),
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
    if ok {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_under_the_directory_are_found() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "secret").unwrap();
        let book = tempfile::tempdir().unwrap();
        let dir = book.path();
        std::fs::write(dir.join("index.html"), "home").unwrap();
        std::fs::create_dir(dir.join("guides")).unwrap();
        std::fs::write(dir.join("guides/index.html"), "guides").unwrap();
        std::fs::write(dir.join("guides/a.html"), "a").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret.txt"), dir.join("link.txt"))
            .unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.join("away")).unwrap();
        std::os::unix::net::UnixListener::bind(dir.join("socket")).unwrap();
        assert_eq!(locate(dir, ""), Some(dir.join("index.html")));
        assert_eq!(locate(dir, "guides/"), Some(dir.join("guides/index.html")));
        assert_eq!(locate(dir, "guides"), Some(dir.join("guides/index.html")));
        assert_eq!(
            locate(dir, "guides/a.html"),
            Some(dir.join("guides/a.html"))
        );
        for bad in [
            "../secret.txt",
            "guides/../../secret.txt",
            "guides/../index.html",
            "./index.html",
            "guides//a.html",
            "link.txt",
            "away/secret.txt",
            "socket",
            "guides\\a.html",
            "index.html\0",
            "missing.html",
        ] {
            assert_eq!(locate(dir, bad), None, "{bad:?}");
        }
    }
}
