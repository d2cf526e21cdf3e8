//! The web console: a page at `/` and its two assets under `/console/`, embedded in the binary
//! (`edge/console/`; plain HTML, CSS and one JavaScript module, no build step, so `cargo build`
//! needs nothing else).
//!
//! # Contract
//! - Every response carries a strict Content-Security-Policy: scripts, styles and connections
//!   only from this origin (`connect-src 'self'` covers the API and its WebSocket), images from
//!   this origin, `blob:` (attachment previews) and `data:`; no frames, no plugins, no inline
//!   script or style.
//! - The console talks to nothing but the API under `/v1` on the same origin.
//! - Assets are revalidated on every load (`no-cache` with an ETag of their content).

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::{Digest as _, Sha256};

use super::error::ApiError;

/// The policy every console response carries.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' blob: data:; connect-src 'self'; base-uri 'none'; \
     form-action 'self'; frame-ancestors 'none'";

struct Asset {
    name: &'static str,
    media_type: &'static str,
    bytes: &'static [u8],
}

const ASSETS: &[Asset] = &[
    Asset {
        name: "index.html",
        media_type: "text/html; charset=utf-8",
        bytes: include_bytes!("../console/index.html"),
    },
    Asset {
        name: "app.js",
        media_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../console/app.js"),
    },
    Asset {
        name: "app.css",
        media_type: "text/css; charset=utf-8",
        bytes: include_bytes!("../console/app.css"),
    },
];

/// The bytes a first load fetches: the page and both assets.
pub fn first_load_bytes() -> usize {
    ASSETS.iter().map(|a| a.bytes.len()).sum()
}

/// `GET /`: the console's page.
pub async fn page(headers: HeaderMap) -> Response {
    serve(&ASSETS[0], &headers)
}

/// `GET /console/{name}`: one of its assets.
pub async fn asset(Path(name): Path<String>, headers: HeaderMap) -> Response {
    match ASSETS[1..].iter().find(|a| a.name == name) {
        Some(asset) => serve(asset, &headers),
        None => ApiError::not_found("no such console asset").into_response(),
    }
}

/// An asset's ETag: a digest of its bytes, computed once.
fn etag(asset: &Asset) -> &'static str {
    static TAGS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| format!("\"{}\"", hex::encode(&Sha256::digest(a.bytes)[..12])))
            .collect()
    });
    let at = ASSETS
        .iter()
        .position(|a| a.name == asset.name)
        .expect("an asset of the list");
    &tags[at]
}

fn serve(asset: &Asset, request: &HeaderMap) -> Response {
    static_file(
        asset.media_type,
        asset.bytes.into(),
        etag(asset),
        request,
        CONTENT_SECURITY_POLICY,
    )
}

/// A file the edge serves as it is (the console's assets, the book's pages): `304` when the
/// request's `If-None-Match` names `etag`, revalidated on every load (`no-cache` with the ETag),
/// under `policy`, never sniffed, framed or sent a referrer.
pub(crate) fn static_file(
    media_type: &'static str,
    bytes: bytes::Bytes,
    etag: &str,
    request: &HeaderMap,
    policy: &'static str,
) -> Response {
    let fresh = request
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(header::CONTENT_TYPE, HeaderValue::from_static(media_type))],
            bytes,
        )
            .into_response()
    };
    hardened(&mut response, policy);
    let h = response.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(etag) {
        h.insert(header::ETAG, v);
    }
    response
}

/// Sets `policy` and the headers every page the edge serves carries: not sniffed, not framed,
/// no referrer.
pub(crate) fn hardened(response: &mut Response, policy: &'static str) {
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(policy),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_assets_and_fits_the_first_load_budget() {
        let page = std::str::from_utf8(ASSETS[0].bytes).unwrap();
        for asset in &ASSETS[1..] {
            assert!(
                page.contains(&format!("/console/{}", asset.name)),
                "{}",
                asset.name
            );
        }
        // Nothing from another origin, and no inline script or style the policy would block.
        for text in ASSETS.iter().map(|a| std::str::from_utf8(a.bytes).unwrap()) {
            assert!(!text.contains("http://") && !text.contains("https://"));
            assert!(!text.contains("style=\""));
            assert!(!text.contains("innerHTML"));
        }
        assert!(!page.contains("<script>"));
        assert!(first_load_bytes() < 200 * 1024, "{}", first_load_bytes());
    }
}
