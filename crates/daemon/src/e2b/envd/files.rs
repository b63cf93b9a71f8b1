//! envd's `/files`: `GET` streams a guest file, `POST` writes one or more (a
//! `multipart/form-data` body, one part per file whose filename is its path, or an
//! `application/octet-stream` body for the `path` parameter). Both go through the
//! manager's file calls (the agent's reads and atomic writes).
//!
//! The whole upload is bounded by [`MAX_FILE_BYTES`] (what the REST API's file upload
//! takes); the multipart parser works on that buffered body and trusts nothing in it:
//! part count, header sizes and the boundary are all checked.
use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
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

/// `GET /files?path=`.
pub async fn read(manager: &Arc<Manager>, id: &str, req: Request) -> Result<Response, EnvdError> {
    let q = query(&req)?;
    let user = user(manager, id, &q).await?;
    let path = guest_path(q.path.as_deref(), &user)?;
    let body = manager
        .read_file(id, path.clone(), false)
        .await
        .map_err(|e| EnvdError::file(&path, e))?;
    let octets = [(header::CONTENT_TYPE, "application/octet-stream")];
    Ok(match body {
        FileBody::Whole(data) => (octets, data).into_response(),
        FileBody::Stream { chunks, .. } => {
            (octets, Body::from_stream(ReceiverStream::new(chunks))).into_response()
        }
    })
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
    if req.headers().contains_key(header::CONTENT_ENCODING) {
        return Err(EnvdError::Unsupported("Content-Encoding on uploads (gzip)"));
    }
    let (_, body) = crate::api::read_body(req, MAX_FILE_BYTES, "a file upload")
        .await
        .map_err(|e| EnvdError::Zygote(e.status_code().0, e.to_string()))?;
    let essence = content_type.split(';').next().unwrap_or("").trim();
    let files: Vec<(String, bytes::Bytes)> =
        if essence.eq_ignore_ascii_case("application/octet-stream") {
            vec![(guest_path(q.path.as_deref(), &user)?, body)]
        } else if essence.eq_ignore_ascii_case("multipart/form-data") {
            let boundary = boundary(&content_type).ok_or(EnvdError::BadMultipart("no boundary"))?;
            let parts = multipart(&body, &boundary)?;
            let single = parts.len() == 1;
            parts
                .into_iter()
                .map(|(filename, data)| {
                    // With one file, `path` names it (its filename may be a base name).
                    let path = match (&q.path, single) {
                        (Some(p), true) => guest_path(Some(p), &user)?,
                        _ => guest_path(filename.as_deref(), &user)?,
                    };
                    Ok((path, data))
                })
                .collect::<Result<_, EnvdError>>()?
        } else {
            return Err(EnvdError::BadContentType(content_type));
        };
    let mut written = Vec::with_capacity(files.len());
    for (path, data) in files {
        manager
            .write_file(id, path.clone(), None, Some(user.owner()), data.to_vec())
            .await
            .map_err(|e| EnvdError::file(&path, e))?;
        let name = path.rsplit('/').next().unwrap_or("").to_string();
        written.push(WrittenFile {
            path,
            name,
            kind: "file",
        });
    }
    Ok((StatusCode::OK, axum::Json(written)).into_response())
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
