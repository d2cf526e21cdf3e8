//! Attachments in (multipart uploads, stored in the artifactory), files out (downloads through
//! the resolver as the caller, and short-lived signed links).

use axum::body::Body as HttpBody;
use axum::extract::{Multipart, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use turnpike_schemas::event::{MAX_ATTACHMENT_BYTES, MAX_PREVIEW_BYTES};
use turnpike_schemas::{EventBody, Identity, TenantId, TurnId};

use super::error::{ApiError, ApiResult, ErrorBody};
use super::model::{AttachmentView, FileQuery, LinkInput, LinkView};
use crate::extract::{Body, Caller, Params};
use crate::state::Edge;
use turnpike_router::bus::now_ms;

/// The largest multipart body: one attachment at its limit plus room for the form around it.
pub const MAX_UPLOAD_BODY: usize = MAX_ATTACHMENT_BYTES as usize + 64 * 1024;
/// How long a signed link works by default, and at most.
const DEFAULT_LINK_TTL_S: u64 = 300;
const MAX_LINK_TTL_S: u64 = 3600;

/// Uploads one file (form field `file`, with a file name): an image (PNG, JPEG, GIF, WebP), a
/// PDF or plain text, at most 8 MiB. The type is checked against the bytes. It is stored, and an
/// `attachment` event with its reference and a preview goes on the lane.
#[utoipa::path(post, path = "/v1/conversations/{id}/attachments", tag = "files",
    params(("id" = String, Path, description = "conv_<ulid>"),
           ("Idempotency-Key" = Option<String>, Header, description = "see messages")),
    request_body(content_type = "multipart/form-data", description = "a form with one `file` field"),
    responses((status = 202, body = AttachmentView), (status = 404, body = ErrorBody),
              (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
              (status = 422, body = ErrorBody)))]
pub async fn upload(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> ApiResult<(StatusCode, Json<AttachmentView>)> {
    let entry = edge.visible(&caller, &id).await?;
    let mut multipart = multipart.map_err(|e| ApiError::from_status(e.status(), e.body_text()))?;
    let mut file: Option<(String, Option<String>, Vec<u8>)> = None;
    while let Some(mut field) = multipart.next_field().await.map_err(multipart_error)? {
        if field.name() != Some("file") {
            return Err(ApiError::invalid(
                "the form holds one field, `file`, and nothing else",
            ));
        }
        if file.is_some() {
            return Err(ApiError::invalid("one file per upload"));
        }
        let name = field
            .file_name()
            .map(str::to_owned)
            .ok_or_else(|| ApiError::invalid("the `file` field needs a file name"))?;
        let declared = field.content_type().map(str::to_owned);
        let mut bytes = Vec::new();
        while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
            if (bytes.len() + chunk.len()) as u64 > MAX_ATTACHMENT_BYTES {
                return Err(ApiError::too_large(
                    format!(
                        "the attachment is larger than the limit of {} MiB ({MAX_ATTACHMENT_BYTES} bytes)", MAX_ATTACHMENT_BYTES >> 20
                    ),
                    MAX_ATTACHMENT_BYTES,
                ));
            }
            bytes.extend_from_slice(&chunk);
        }
        file = Some((name, declared, bytes));
    }
    let Some((name, declared, bytes)) = file else {
        return Err(ApiError::invalid("the form has no `file` field"));
    };
    let view = edge
        .attach(&caller, &entry, &headers, name, declared.as_deref(), bytes)
        .await?;
    Ok((StatusCode::ACCEPTED, Json(view)))
}

impl Edge {
    /// Attaches one file to conversation `entry` as `caller`: the name and the type (checked
    /// against the bytes) are checked, the bytes stored, and an `attachment` event with its
    /// reference and a preview goes on the lane. The upload endpoint and A2A file parts.
    pub(crate) async fn attach(
        &self,
        caller: &crate::auth::Principal,
        entry: &turnpike_artifactory::DirectoryEntry,
        headers: &HeaderMap,
        name: String,
        declared: Option<&str>,
        bytes: Vec<u8>,
    ) -> ApiResult<AttachmentView> {
        if name.is_empty()
            || name.len() > 255
            || name.contains(['/', '\\'])
            || name == "."
            || name == ".."
        {
            return Err(ApiError::invalid(
                "the file name must be 1–255 bytes without slashes",
            ));
        }
        if bytes.is_empty() {
            return Err(ApiError::invalid("the file is empty"));
        }
        if bytes.len() as u64 > MAX_ATTACHMENT_BYTES {
            return Err(ApiError::too_large(
                format!(
                    "the attachment is larger than the limit of {} MiB ({MAX_ATTACHMENT_BYTES} bytes)",
                    MAX_ATTACHMENT_BYTES >> 20
                ),
                MAX_ATTACHMENT_BYTES,
            ));
        }
        let media_type = media_type_of(&bytes, declared)?;
        let preview = preview(media_type, &bytes);
        // The attachment belongs to the next turn: the one its event will open or join.
        let head = self.record(entry).head().await?;
        let turn = TurnId::new(head.state().last_turn + 1).unwrap_or(TurnId::FIRST);
        let size = bytes.len() as u64;
        let reference = self
            .inner
            .files
            .attach(&entry.prefix(), turn, &name, bytes.into())
            .await?;
        let (_, Json(accepted)) = self
            .submit(
                caller,
                &entry.conversation.to_string(),
                headers,
                EventBody::Attachment {
                    name: name.clone(),
                    media_type: media_type.to_owned(),
                    size,
                    reference: reference.clone(),
                    preview: Some(preview.clone()),
                },
            )
            .await?;
        Ok(AttachmentView {
            reference: reference.to_string(),
            name,
            media_type: media_type.to_owned(),
            size,
            preview,
            accepted,
        })
    }
}

fn multipart_error(e: axum::extract::multipart::MultipartError) -> ApiError {
    let status = e.status();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::too_large(
            format!(
                "the upload is larger than the limit of {} MiB ({MAX_ATTACHMENT_BYTES} bytes)",
                MAX_ATTACHMENT_BYTES >> 20
            ),
            MAX_ATTACHMENT_BYTES,
        );
    }
    ApiError::from_status(status, e.body_text())
}

/// The media type the bytes really have, if it is one we accept; else `415`.
fn media_type_of(bytes: &[u8], declared: Option<&str>) -> ApiResult<&'static str> {
    let sniffed = if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else if bytes.starts_with(b"%PDF-") {
        Some("application/pdf")
    } else if std::str::from_utf8(bytes).is_ok() && !bytes.contains(&0) {
        Some("text/plain")
    } else {
        None
    };
    let declared = declared.map(|d| d.split(';').next().unwrap_or(d).trim().to_ascii_lowercase());
    match (sniffed, declared.as_deref()) {
        (Some(s), None | Some("application/octet-stream")) => Ok(s),
        (Some(s), Some(d)) if d == s => Ok(s),
        (Some(s), Some(d)) => Err(ApiError::new(
            crate::error::ErrorCode::UnsupportedMediaType,
            format!("the file says it is {d} but its content is {s}"),
        )),
        (None, d) => Err(ApiError::new(
            crate::error::ErrorCode::UnsupportedMediaType,
            format!(
                "{} is not accepted: attach a PNG, JPEG, GIF or WebP image, a PDF, or plain text",
                d.unwrap_or("this content")
            ),
        )),
    }
}

/// A bounded description of an attachment's content.
pub fn preview(media_type: &str, bytes: &[u8]) -> String {
    let size = bytes.len();
    let text = match media_type {
        "image/png" if bytes.len() >= 24 => {
            let w = u32::from_be_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
            let h = u32::from_be_bytes([bytes[20], bytes[21], bytes[22], bytes[23]]);
            format!("PNG image, {w}×{h} px, {size} bytes")
        }
        "image/gif" if bytes.len() >= 10 => {
            let w = u16::from_le_bytes([bytes[6], bytes[7]]);
            let h = u16::from_le_bytes([bytes[8], bytes[9]]);
            format!("GIF image, {w}×{h} px, {size} bytes")
        }
        "image/jpeg" => match jpeg_size(bytes) {
            Some((w, h)) => format!("JPEG image, {w}×{h} px, {size} bytes"),
            None => format!("JPEG image, {size} bytes"),
        },
        "image/webp" => format!("WebP image, {size} bytes"),
        "application/pdf" => {
            let version = bytes
                .get(5..8)
                .and_then(|v| std::str::from_utf8(v).ok())
                .unwrap_or("?");
            let pages = count_pages(bytes);
            format!("PDF {version} document, {pages} page(s), {size} bytes")
        }
        _ => {
            let text = String::from_utf8_lossy(&bytes[..bytes.len().min(600)]);
            let lines: Vec<&str> = text.lines().take(8).collect();
            format!("text, {size} bytes:\n{}", lines.join("\n"))
        }
    };
    truncate(text, MAX_PREVIEW_BYTES)
}

fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let cut = (0..=max - 3)
            .rev()
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(0);
        text.truncate(cut);
        text.push('…');
    }
    text
}

/// Width and height from a JPEG's start-of-frame segment.
fn jpeg_size(bytes: &[u8]) -> Option<(u16, u16)> {
    let mut i = 2;
    while i + 9 < bytes.len() {
        if bytes[i] != 0xFF {
            i += 1;
            continue;
        }
        let marker = bytes[i + 1];
        let len = u16::from_be_bytes([bytes[i + 2], bytes[i + 3]]) as usize;
        if (0xC0..=0xCF).contains(&marker) && ![0xC4, 0xC8, 0xCC].contains(&marker) {
            let h = u16::from_be_bytes([bytes[i + 5], bytes[i + 6]]);
            let w = u16::from_be_bytes([bytes[i + 7], bytes[i + 8]]);
            return Some((w, h));
        }
        i += 2 + len;
    }
    None
}

/// Page objects in a PDF (`/Type /Page`, not `/Pages`): a cheap count, good for a preview.
fn count_pages(bytes: &[u8]) -> usize {
    let mut n = 0;
    for needle in [&b"/Type /Page"[..], &b"/Type/Page"[..]] {
        let mut at = 0;
        while let Some(pos) = find(&bytes[at..], needle) {
            let end = at + pos + needle.len();
            if bytes.get(end) != Some(&b's') {
                n += 1;
            }
            at = end;
        }
    }
    n
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Downloads a file the caller may read (a hosted file `conv:fi:…` or an attachment
/// `conv:at:…`), resolved as the caller.
#[utoipa::path(get, path = "/v1/files", tag = "files",
    params(FileQuery),
    responses((status = 200, description = "the file's bytes, with the media type its name says", content_type = "*/*"),
              (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn download(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Params(query): Params<FileQuery>,
) -> ApiResult<Response> {
    fetch(&edge, &caller.tenant, &caller.identity, &query.reference).await
}

async fn fetch(
    edge: &Edge,
    tenant: &TenantId,
    identity: &Identity,
    reference: &str,
) -> ApiResult<Response> {
    // Streamed from the store as it is read: a large file is never held in memory whole.
    let resolved = edge
        .inner
        .resolver
        .in_tenant(tenant)
        .open_str(identity, reference)
        .await?;
    let name = reference
        .rsplit('/')
        .next()
        .unwrap_or("file")
        .replace('"', "");
    let mut response = (StatusCode::OK, HttpBody::from_stream(resolved.stream)).into_response();
    let headers = response.headers_mut();
    if let Some(size) = resolved.size {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    }
    if let Ok(v) = HeaderValue::from_str(&resolved.media_type) {
        headers.insert(header::CONTENT_TYPE, v);
    }
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
        headers.insert(header::CONTENT_DISPOSITION, v);
    }
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    Ok(response)
}

#[derive(Serialize, Deserialize)]
struct LinkClaims {
    /// The reference.
    r: String,
    /// The identity it resolves as.
    i: String,
    /// The tenant it resolves in.
    t: String,
    /// Expiry, ms since the epoch.
    e: u64,
}

type HmacSha256 = Hmac<Sha256>;

fn sign(key: &[u8; 32], payload: &[u8]) -> Vec<u8> {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(payload);
    mac.finalize().into_bytes().to_vec()
}

/// Makes a short-lived link to a file the caller may read. Anyone holding the link can
/// download the file until it expires; it resolves as the caller, so it reaches nothing the
/// caller could not.
#[utoipa::path(post, path = "/v1/files/links", tag = "files",
    request_body = LinkInput,
    responses((status = 201, body = LinkView), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn link(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Body(input): Body<LinkInput>,
) -> ApiResult<(StatusCode, Json<LinkView>)> {
    // Only links to what the caller can read right now.
    edge.inner
        .resolver
        .in_tenant(&caller.tenant)
        .resolve_str(&caller.identity, &input.reference)
        .await?;
    let ttl = input.ttl_seconds.unwrap_or(DEFAULT_LINK_TTL_S);
    if ttl == 0 || ttl > MAX_LINK_TTL_S {
        return Err(ApiError::invalid(format!(
            "ttl_seconds must be 1–{MAX_LINK_TTL_S}"
        )));
    }
    Ok((
        StatusCode::CREATED,
        Json(edge.signed_link(&caller, input.reference, ttl)),
    ))
}

impl Edge {
    /// A link to `reference` that works without a token for `ttl_s` seconds, as `caller` (who
    /// must be able to read it now: the caller checks; the link is checked again when followed).
    /// The URL is the path (`/v1/links/…`).
    pub(crate) fn signed_link(
        &self,
        caller: &crate::auth::Principal,
        reference: String,
        ttl_s: u64,
    ) -> LinkView {
        let expires_ms = now_ms() + ttl_s * 1000;
        let claims = LinkClaims {
            r: reference,
            i: caller.identity.to_string(),
            t: caller.tenant.to_string(),
            e: expires_ms,
        };
        let payload = serde_json::to_vec(&claims).expect("claims serialise");
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let token = format!(
            "{}.{}",
            b64.encode(&payload),
            b64.encode(sign(&self.inner.link_key, &payload))
        );
        LinkView {
            url: format!("/v1/links/{token}"),
            expires_ms,
        }
    }
}

/// Follows a signed link (no bearer token needed). An expired, altered or foreign link is
/// `404`.
#[utoipa::path(get, path = "/v1/links/{token}", tag = "files",
    params(("token" = String, Path, description = "the signed token from POST /v1/files/links")),
    security(()),
    responses((status = 200, description = "the file's bytes, with the media type its name says", content_type = "*/*"),
              (status = 404, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn follow_link(
    State(edge): State<Edge>,
    Path(token): Path<String>,
    from: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
) -> ApiResult<Response> {
    // Links carry no bearer token, so the per-identity limit does not see them: limit each
    // link, and each source address, with the same budget instead.
    if let Some(axum::Extension(axum::extract::ConnectInfo(addr))) = from {
        edge.inner.rates.check(&format!("addr:{}", addr.ip()))?;
    }
    let digest = hex::encode(&<Sha256 as sha2::Digest>::digest(token.as_bytes())[..16]);
    edge.inner.rates.check(&format!("link:{digest}"))?;
    let gone = || ApiError::not_found("this link is not valid or has expired");
    let (payload, signature) = token.split_once('.').ok_or_else(gone)?;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let payload = b64.decode(payload).map_err(|_| gone())?;
    let signature = b64.decode(signature).map_err(|_| gone())?;
    let mut mac = HmacSha256::new_from_slice(&edge.inner.link_key).expect("any key length");
    mac.update(&payload);
    mac.verify_slice(&signature).map_err(|_| gone())?;
    let claims: LinkClaims = serde_json::from_slice(&payload).map_err(|_| gone())?;
    if claims.e < now_ms() {
        return Err(gone());
    }
    let identity: Identity = claims.i.parse().map_err(|_| gone())?;
    let tenant: TenantId = claims.t.parse().map_err(|_| gone())?;
    fetch(&edge, &tenant, &identity, &claims.r).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_decides_the_media_type_and_previews_are_bounded() {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        png.extend_from_slice(&640u32.to_be_bytes());
        png.extend_from_slice(&480u32.to_be_bytes());
        png.extend_from_slice(&[8, 6, 0, 0, 0]);
        assert_eq!(media_type_of(&png, Some("image/png")).unwrap(), "image/png");
        assert_eq!(media_type_of(&png, None).unwrap(), "image/png");
        assert_eq!(
            preview("image/png", &png),
            format!("PNG image, 640×480 px, {} bytes", png.len())
        );
        let refused = media_type_of(&png, Some("application/pdf")).unwrap_err();
        assert_eq!(refused.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let exe = b"MZ\x90\0\x03\0\0\0\x04\0\0\0\xff\xff";
        assert_eq!(
            media_type_of(exe, Some("image/png")).unwrap_err().status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );
        let pdf = b"%PDF-1.7\n1 0 obj << /Type /Pages /Count 2 >>\n2 0 obj << /Type /Page >>\n3 0 obj << /Type/Page >>\n";
        assert_eq!(
            media_type_of(pdf, Some("application/pdf")).unwrap(),
            "application/pdf"
        );
        assert!(preview("application/pdf", pdf).starts_with("PDF 1.7 document, 2 page(s)"));
        let long = "é".repeat(5000);
        let p = preview("text/plain", long.as_bytes());
        assert!(p.len() <= MAX_PREVIEW_BYTES, "{}", p.len());
        let mut jpeg = vec![0xFF, 0xD8, 0xFF, 0xE0, 0, 4, 0, 0];
        jpeg.extend_from_slice(&[0xFF, 0xC0, 0, 11, 8, 0, 200, 1, 44, 3, 0, 0]);
        assert_eq!(jpeg_size(&jpeg), Some((300, 200)));
    }
}
