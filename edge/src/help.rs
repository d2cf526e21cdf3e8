//! The book at `/book/`: the console's "Help" link. A deployment given a built book (`mdbook
//! build book`, then `--book book/book`, read by [`crate::book::Book::load`]) serves its pages;
//! one without says where the book is.
//!
//! # Contract
//! - Answered from the book's files in memory only (see [`crate::book`]); a directory named
//!   without its trailing slash redirects to it.
//! - Pages are served sandboxed (`Content-Security-Policy: sandbox allow-scripts …`): the
//!   book's scripts run, but in an opaque origin, so nothing on the book's pages can read the
//!   console's token or call the API as the signed-in user. Since an opaque origin makes even
//!   the book's own fonts cross-origin, responses carry `Access-Control-Allow-Origin: *` (the
//!   book is public and no request to it carries a credential).
//! - No authentication: the book is the same for everybody, and holds nothing of anyone's.

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Redirect, Response};

use crate::book::Found;
use crate::error::ApiError;
use crate::state::Edge;

/// The policy of every response under `/book/`.
const BOOK_POLICY: &str = "sandbox allow-scripts allow-popups allow-popups-to-escape-sandbox \
     allow-modals; default-src 'self' 'unsafe-inline' data:; frame-ancestors 'none'";

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
    any_origin(crate::console::static_file(
        page.media_type,
        page.bytes.clone(),
        &page.etag,
        headers,
        BOOK_POLICY,
    ))
}

/// The book's policy and headers, and `Access-Control-Allow-Origin: *` (see the contract).
fn sandboxed(mut response: Response) -> Response {
    crate::console::hardened(&mut response, BOOK_POLICY);
    any_origin(response)
}

/// `Access-Control-Allow-Origin: *`: the book's own fonts are cross-origin to its sandboxed pages.
fn any_origin(mut response: Response) -> Response {
    response.headers_mut().insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    response
}
