//! envd's `/files`: `GET` streams a guest file (gzipped when the client accepts it),
//! `POST` writes one or more: a `multipart/form-data` body, one part per file whose
//! filename is its path, or an `application/octet-stream` body (optionally
//! `Content-Encoding: gzip`) for the `path` parameter. Paths resolve for the acting
//! user (`username`, else the default user: [`super::users`]) and what is written is
//! theirs.
//!
//! An octet-stream body is streamed into the guest as it arrives
//! ([`Manager::write_file_stream`]: bounded, gunzipped with a bound, staged and
//! renamed). A multipart body is read whole, bounded by [`MAX_FILE_BYTES`] (what the
//! REST API's file upload takes), and its parser trusts nothing in it: part count,
//! header sizes and the boundary are all checked.
use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::users::{resolve_path, Accounts, User};
use super::EnvdError;
use crate::manager::{FileBody, Manager};
use crate::model::MAX_FILE_BYTES;

/// Parts (files) one multipart upload may carry.
const MAX_PARTS: usize = 1000;
/// Bytes of one part's headers.
const MAX_PART_HEADER_BYTES: usize = 8 * 1024;

#[derive(Debug, Deserialize)]
struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
}

/// One written file, as envd answers (`EntryInfo` of the REST API).
#[derive(Debug, Serialize)]
struct WrittenFile {
    path: String,
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
}

fn query(req: &Request) -> Result<FilesQuery, EnvdError> {
    axum::extract::Query::<FilesQuery>::try_from_uri(req.uri())
        .map(|q| q.0)
        .map_err(|_| EnvdError::BadQuery)
}

/// The user a `/files` call acts as (`username`, else the default user).
async fn user(manager: &Arc<Manager>, id: &str, q: &FilesQuery) -> Result<User, EnvdError> {
    let accounts = Accounts::load(manager, id, false).await?;
    Ok(accounts.resolve(q.username.as_deref())?)
}

/// A path as envd resolves it for `user` (relative ones under its home).
fn guest_path(path: Option<&str>, user: &User) -> Result<String, EnvdError> {
    match path {
        None | Some("") => Err(EnvdError::MissingPath),
        Some(p) => resolve_path(p, user)
            .filter(|p| p.len() <= 4096)
            .ok_or(EnvdError::BadPath),
    }
}

/// `Accept-Encoding` lists gzip (with a non-zero weight).
fn accepts_gzip(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';').map(str::trim);
            let coding = parts.next().unwrap_or("");
            let zero = parts.any(|p| {
                p.replace(' ', "").starts_with("q=0")
                    && !p.contains(|c: char| ('1'..='9').contains(&c))
            });
            coding.eq_ignore_ascii_case("gzip") && !zero
        })
}

/// `GET /files?path=`.
pub async fn read(manager: &Arc<Manager>, id: &str, req: Request) -> Result<Response, EnvdError> {
    let q = query(&req)?;
    let gzip = accepts_gzip(req.headers());
    let user = user(manager, id, &q).await?;
    let path = guest_path(q.path.as_deref(), &user)?;
    let body = manager
        .read_file(id, path.clone(), false)
        .await
        .map_err(|e| EnvdError::file(&path, e))?;
    let chunks = match body {
        FileBody::Whole(data) => {
            let (tx, rx) = mpsc::channel(1);
            let _ = tx.try_send(Ok(Bytes::from(data)));
            rx
        }
        FileBody::Stream { chunks, .. } => chunks,
    };
    let octets = (header::CONTENT_TYPE, "application/octet-stream");
    if !gzip {
        return Ok(([octets], Body::from_stream(ReceiverStream::new(chunks))).into_response());
    }
    let gz = Body::from_stream(ReceiverStream::new(gzip_stream(chunks)));
    Ok(([octets, (header::CONTENT_ENCODING, "gzip")], gz).into_response())
}

/// `POST /files`.
pub async fn write(manager: &Arc<Manager>, id: &str, req: Request) -> Result<Response, EnvdError> {
    let q = query(&req)?;
    let user = user(manager, id, &q).await?;
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let essence = content_type.split(';').next().unwrap_or("").trim();
    let encoding = req
        .headers()
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase());
    let gzip = match encoding.as_deref() {
        None | Some("identity") => false,
        Some("gzip") if essence.eq_ignore_ascii_case("application/octet-stream") => true,
        Some(_) => {
            return Err(EnvdError::Unsupported(
                "this Content-Encoding (gzip on octet-stream only)",
            ))
        }
    };
    if essence.eq_ignore_ascii_case("application/octet-stream") {
        let path = guest_path(q.path.as_deref(), &user)?;
        let body = stream_body(req);
        manager
            .write_file_stream(id, &path, Some(user.owner()), body, gzip)
            .await
            .map_err(|e| EnvdError::file(&path, e))?;
        return Ok((StatusCode::OK, axum::Json(vec![written(path)])).into_response());
    }
    let (_, body) = crate::api::read_body(req, MAX_FILE_BYTES, "a file upload")
        .await
        .map_err(|e| EnvdError::Zygote(e.status_code().0, e.to_string()))?;
    if !essence.eq_ignore_ascii_case("multipart/form-data") {
        return Err(EnvdError::BadContentType(content_type));
    }
    let boundary = boundary(&content_type).ok_or(EnvdError::BadMultipart("no boundary"))?;
    let parts = multipart(&body, &boundary)?;
    let single = parts.len() == 1;
    let files = parts
        .into_iter()
        .map(|(filename, data)| {
            // With one file, `path` names it (its filename may be a base name).
            let path = match (&q.path, single) {
                (Some(p), true) => guest_path(Some(p), &user)?,
                _ => guest_path(filename.as_deref(), &user)?,
            };
            Ok((path, data))
        })
        .collect::<Result<Vec<_>, EnvdError>>()?;
    let mut done = Vec::with_capacity(files.len());
    for (path, data) in files {
        manager
            .write_file(id, path.clone(), None, Some(user.owner()), data.to_vec())
            .await
            .map_err(|e| EnvdError::file(&path, e))?;
        done.push(written(path));
    }
    Ok((StatusCode::OK, axum::Json(done)).into_response())
}

fn written(path: String) -> WrittenFile {
    WrittenFile {
        name: path.rsplit('/').next().unwrap_or("").to_string(),
        path,
        kind: "file",
    }
}

/// The request body as chunks for [`Manager::write_file_stream`], read as the upload
/// takes them (a channel of two: the client is not read ahead of the guest).
fn stream_body(req: Request) -> mpsc::Receiver<std::io::Result<Bytes>> {
    let (tx, rx) = mpsc::channel(2);
    let mut body = req.into_body().into_data_stream();
    tokio::spawn(async move {
        while let Some(chunk) = body.next().await {
            let failed = chunk.is_err();
            if tx.send(chunk.map_err(std::io::Error::other)).await.is_err() || failed {
                return;
            }
        }
    });
    rx
}

/// `chunks` gzipped as they come (a blocking thread compresses; the stream ends early,
/// cut, if the file's does).
fn gzip_stream(
    mut chunks: mpsc::Receiver<std::io::Result<Bytes>>,
) -> mpsc::Receiver<std::io::Result<Bytes>> {
    use std::io::Write as _;
    let (tx, rx) = mpsc::channel(2);
    tokio::task::spawn_blocking(move || {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        while let Some(chunk) = chunks.blocking_recv() {
            let out = chunk
                .and_then(|c| gz.write_all(&c))
                .map(|()| std::mem::take(gz.get_mut()));
            let failed = out.is_err();
            if tx.blocking_send(out.map(Bytes::from)).is_err() || failed {
                return;
            }
        }
        let _ = tx.blocking_send(gz.finish().map(Bytes::from));
    });
    rx
}

/// The `boundary` parameter of a multipart content type (RFC 2046: 1..=70 characters).
fn boundary(content_type: &str) -> Option<String> {
    content_type.split(';').skip(1).find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        if !k.trim().eq_ignore_ascii_case("boundary") {
            return None;
        }
        let v = v.trim().trim_matches('"');
        (!v.is_empty() && v.len() <= 70).then(|| v.to_string())
    })
}

/// The parts of a multipart body: (filename, contents) of each part named `file`.
fn multipart(
    body: &[u8],
    boundary: &str,
) -> Result<Vec<(Option<String>, bytes::Bytes)>, EnvdError> {
    let bytes = bytes::Bytes::copy_from_slice(body);
    let delimiter = format!("--{boundary}");
    let next_delimiter = format!("\r\n--{boundary}");
    let mut pos = find(&bytes, delimiter.as_bytes(), 0)
        .ok_or(EnvdError::BadMultipart("no opening boundary"))?
        + delimiter.len();
    let mut parts = Vec::new();
    loop {
        let rest = &bytes[pos..];
        if rest.starts_with(b"--") {
            return Ok(parts); // the closing delimiter
        }
        if !rest.starts_with(b"\r\n") {
            return Err(EnvdError::BadMultipart("a boundary not followed by CRLF"));
        }
        pos += 2;
        let head_end = find(&bytes, b"\r\n\r\n", pos)
            .filter(|&e| e - pos <= MAX_PART_HEADER_BYTES)
            .ok_or(EnvdError::BadMultipart(
                "part headers missing or over 8 KiB",
            ))?;
        let head = std::str::from_utf8(&bytes[pos..head_end])
            .map_err(|_| EnvdError::BadMultipart("part headers are not UTF-8"))?;
        let data_start = head_end + 4;
        let data_end = find(&bytes, next_delimiter.as_bytes(), data_start)
            .ok_or(EnvdError::BadMultipart("a part without a closing boundary"))?;
        let (name, filename) = disposition(head);
        if name.as_deref() == Some("file") {
            if parts.len() == MAX_PARTS {
                return Err(EnvdError::TooManyFiles(MAX_PARTS));
            }
            parts.push((filename, bytes.slice(data_start..data_end)));
        }
        pos = data_end + next_delimiter.len();
    }
}

/// `name` and `filename` of a part's `Content-Disposition`.
fn disposition(head: &str) -> (Option<String>, Option<String>) {
    let Some(line) = head.split("\r\n").find(|l| {
        l.split_once(':')
            .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("content-disposition"))
    }) else {
        return (None, None);
    };
    let params = line.split_once(':').map_or("", |(_, v)| v);
    let value = |key: &str| {
        params.split(';').find_map(|p| {
            let (k, v) = p.trim().split_once('=')?;
            k.trim().eq_ignore_ascii_case(key).then(|| {
                // httpx escapes `"` as %22 inside the quotes (WHATWG form encoding).
                v.trim().trim_matches('"').replace("%22", "\"")
            })
        })
    };
    (value("name"), value("filename"))
}

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    haystack
        .get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|i| i + from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_httpx_style_multipart_and_refuses_broken_ones() {
        let body =
            b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/tmp/a.txt\"\r\n\
Content-Type: application/octet-stream\r\n\r\nhello\r\n--XyZ\r\nContent-Disposition: form-data; \
name=\"file\"; filename=\"/tmp/b\"\r\n\r\n\r\n--XyZ--\r\n";
        let parts = multipart(body, "XyZ").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].0.as_deref(), Some("/tmp/a.txt"));
        assert_eq!(&parts[0].1[..], b"hello");
        assert_eq!(&parts[1].1[..], b"");
        assert_eq!(
            boundary("multipart/form-data; boundary=\"XyZ\"").as_deref(),
            Some("XyZ")
        );
        for bad in [&body[..20], &body[..60], b"no boundary at all".as_slice()] {
            assert!(
                multipart(bad, "XyZ").is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
