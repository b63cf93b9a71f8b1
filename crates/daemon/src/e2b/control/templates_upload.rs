//! The files of E2B's COPY steps. The SDK asks `GET /templates/{id}/files/{hash}`
//! whether the files with that `filesHash` are here; if not it gets an upload URL and
//! PUTs the archive there from a client **without** the API key (E2B's are S3 presigned
//! URLs). zygote's URL is its own: `/e2b/_uploads/<token>` on the API address, where
//! the token is 32 random bytes, good for one request within
//! [`upload_url_ttl_secs`], and the body at most
//! [`MAX_UPLOAD_BYTES`](super::templates_tar::MAX_UPLOAD_BYTES). The archive is checked
//! as it arrives (`templates_tar::check_archive`) and kept under the state directory
//! by its hash (`e2b-uploads/<hash>.tar`); the COPY step verifies it against the hash
//! (`templates_tar::read_entries`).
use std::path::PathBuf;

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::templates::host_of;
use super::templates_tar::{check_archive, MAX_UPLOAD_BYTES};
use super::templates_wire::FileUpload;
use super::ControlError;
use crate::api::AppState;
use crate::db::UploadRow;
use crate::error::Error;
use crate::manager::Manager;

/// How long an upload URL is good for, unless `ZYGOTE_E2B_UPLOAD_URL_TTL_SECS` says
/// otherwise (1..=3600; tests use a short one).
pub fn upload_url_ttl_secs() -> u64 {
    std::env::var("ZYGOTE_E2B_UPLOAD_URL_TTL_SECS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(600, |v| v.clamp(1, 3600))
}

/// A files hash as the SDK makes them: sha256 in lowercase hex.
fn valid_hash(h: &str) -> bool {
    h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn uploads_dir(m: &Manager) -> PathBuf {
    m.dirs.state.join("e2b-uploads")
}

/// Where the archive with files hash `hash` is kept (`hash` checked by the caller).
pub(super) fn upload_path(m: &Manager, hash: &str) -> PathBuf {
    uploads_dir(m).join(format!("{hash}.tar"))
}

/// Forgets a stored upload whose archive turned out wrong, so the SDK uploads again.
pub(super) fn forget_upload(m: &Manager, hash: &str) {
    let _ = m.db.delete_upload(hash);
    let _ = std::fs::remove_file(upload_path(m, hash));
}

/// `GET /templates/{id}/files/{hash}` → 201 `{present}` or `{present: false, url}`.
pub(super) async fn file_link(
    State(st): State<AppState>,
    Path((template, hash)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ControlError> {
    if !valid_hash(&hash) {
        return Err(ControlError::BadRequest(
            "the files hash must be 64 lowercase hex digits (sha256)".into(),
        ));
    }
    let m = &st.manager;
    if m.db.builds_of(&template)?.is_empty() {
        return Err(ControlError::TemplateNotFound(
            template.chars().take(128).collect(),
        ));
    }
    let stored = m.db.upload(&hash)?.is_some_and(|u| u.stored);
    if stored && upload_path(m, &hash).is_file() {
        let answer = FileUpload {
            present: true,
            url: None,
            headers: None,
        };
        return Ok((StatusCode::CREATED, Json(answer)).into_response());
    }
    let host = host_of(&headers)
        .ok_or_else(|| ControlError::BadRequest("the request has no usable Host".into()))?;
    let token = crate::ids::random_hex(32);
    m.db.put_upload(&UploadRow {
        hash,
        token: Some(token.clone()),
        expires_at: crate::manager::now() + upload_url_ttl_secs(),
        stored: false,
        size: 0,
    })?;
    let answer = FileUpload {
        present: false,
        url: Some(format!("http://{host}/e2b/_uploads/{token}")),
        headers: Some(Default::default()),
    };
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// `PUT /e2b/_uploads/{token}` (no API key: the token is the credential) → 200 once
/// the archive is checked and kept; 403 for a token that is unknown, used or expired;
/// 413 past the size limit; 400 for an archive the checks refuse.
pub(super) async fn upload(
    State(st): State<AppState>,
    Path(token): Path<String>,
    req: Request,
) -> Result<StatusCode, ControlError> {
    let m = st.manager.clone();
    let refused = |why: &str| ControlError::Forbidden(format!("upload URL {why}"));
    if token.len() != 64 || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(refused("is unknown or was used already"));
    }
    let row =
        m.db.take_upload_token(&token)?
            .ok_or_else(|| refused("is unknown or was used already"))?;
    if crate::manager::now() > row.expires_at {
        return Err(refused("expired"));
    }
    let (_, bytes) = crate::api::read_body(req, MAX_UPLOAD_BYTES as usize, "an upload")
        .await
        .map_err(ControlError::Zygote)?;
    let dir = uploads_dir(&m);
    let path = upload_path(&m, &row.hash);
    let size = bytes.len() as u64;
    let kept = tokio::task::spawn_blocking(move || -> Result<Result<(), String>, Error> {
        if let Err(e) = check_archive(&bytes) {
            return Ok(Err(e.to_string()));
        }
        std::fs::create_dir_all(&dir).map_err(Error::io("creating the uploads directory"))?;
        let tmp = path.with_extension(format!("tmp-{}", crate::ids::random_hex(4)));
        std::fs::write(&tmp, &bytes).map_err(Error::io("writing an upload"))?;
        std::fs::rename(&tmp, &path).map_err(Error::io("keeping an upload"))?;
        Ok(Ok(()))
    })
    .await
    .map_err(|e| Error::Internal(format!("upload task failed: {e}")))??;
    if let Err(why) = kept {
        return Err(ControlError::BadRequest(why));
    }
    m.db.put_upload(&UploadRow {
        token: None,
        stored: true,
        size,
        ..row
    })?;
    Ok(StatusCode::OK)
}
