//! Snapshot packs over the API: export (a tar body), import (a tar upload), push to and
//! pull from an OCI registry (NDJSON progress).
use std::io::Write;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::ndjson::ndjson_job;
use super::{ApiJson, ApiQuery, AppState};
use crate::error::{ErrorBody, Result};
use crate::model::ImportQuery;
use crate::model::{PackEvent, PullSnapshotRequest, PushSnapshotRequest, Snapshot, Validate};

#[utoipa::path(get, path = "/v1/snapshots/{id}/export", tag = "snapshots",
    params(("id" = String, Path, description = "Snapshot id")),
    responses((status = 200, description = "The snapshot pack: an OCI image layout in a tar (the \
                 artifact `application/vnd.zygote.snapshot.v1`: base image, disk, memory and \
                 device state, each zstd-compressed and sparse). It holds the guest's memory \
                 and its agent's token: keep it as you would the sandbox.",
               content_type = "application/x-tar"),
              (status = 404, description = "No such snapshot", body = ErrorBody),
              (status = 422, description = "The runtime has no snapshot packs, or the base image is gone", body = ErrorBody)))]
pub async fn export(State(st): State<AppState>, Path(id): Path<String>) -> Result<Response> {
    let packed = st.manager.pack_snapshot(&id, Arc::new(|_| {})).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(8);
    let size = packed.size();
    tokio::task::spawn_blocking(move || {
        let mut w = ChannelWriter(tx.clone());
        if let Err(e) = zygote_oci::pack::write_archive(&packed, &id, &mut w) {
            // The client sees a cut body, never a well-formed partial pack.
            let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-tar".to_string()),
            (
                header::HeaderName::from_static("x-zygote-pack-bytes"),
                size.to_string(),
            ),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// Sends what is written as body chunks.
struct ChannelWriter(tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>);

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .blocking_send(Ok(bytes::Bytes::copy_from_slice(buf)))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client left"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[utoipa::path(post, path = "/v1/snapshots/import", tag = "snapshots",
    params(ImportQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream",
                 description = "A snapshot pack (a tar archive) made by GET /v1/snapshots/{id}/export; \
                                any content type is accepted. Its size is held to the free space of \
                                the image cache (checked from Content-Length before it is read, and \
                                as it arrives)"),
    responses((status = 201, description = "Imported: a new snapshot of this daemon", body = Snapshot),
              (status = 400, description = "Not a snapshot pack", body = ErrorBody),
              (status = 413, description = "Larger than any pack may be (payload_too_large)", body = ErrorBody),
              (status = 422, description = "A damaged pack (a digest mismatch, a malformed file), another format, runtime or CPU", body = ErrorBody),
              (status = 507, description = "Larger than the free disk space (no_space)", body = ErrorBody)))]
pub async fn import(
    State(st): State<AppState>,
    ApiQuery(q): ApiQuery<ImportQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<Snapshot>)> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let snapshot = st
        .manager
        .import_upload(body.into_data_stream(), declared, q.name)
        .await?;
    Ok((StatusCode::CREATED, Json(snapshot)))
}

#[utoipa::path(post, path = "/v1/snapshots/{id}/push", tag = "snapshots",
    params(("id" = String, Path, description = "Snapshot id")),
    request_body = PushSnapshotRequest,
    responses((status = 200, description = "NDJSON stream of PackEvent lines: `progress`, `blob` \
                 (state `cached` for blobs the registry has: nothing is sent again), then \
                 `pushed` or `error`", content_type = "application/x-ndjson", body = PackEvent),
              (status = 400, description = "Not a reference", body = ErrorBody),
              (status = 404, description = "No such snapshot", body = ErrorBody)))]
pub async fn push(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<PushSnapshotRequest>,
) -> Result<Response> {
    req.validate()?;
    st.manager.snapshot_get(&id)?;
    let m = st.manager.clone();
    let reference = req.reference.clone();
    Ok(ndjson_job(
        move |progress| async move {
            m.push_pack(&id, &req.reference, req.credentials(), progress)
                .await
        },
        move |outcome| match outcome {
            Ok((digest, size)) => PackEvent::Pushed {
                reference,
                digest,
                size,
            },
            Err(e) => {
                tracing::warn!(%reference, "push failed: {e}");
                PackEvent::error(e.body())
            }
        },
    ))
}

#[utoipa::path(post, path = "/v1/snapshots/pull", tag = "snapshots",
    request_body = PullSnapshotRequest,
    responses((status = 200, description = "NDJSON stream of PackEvent lines: `progress`, `blob`, \
                 then `done` with the imported snapshot or `error`",
               content_type = "application/x-ndjson", body = PackEvent),
              (status = 400, description = "Not a reference", body = ErrorBody)))]
pub async fn pull(
    State(st): State<AppState>,
    ApiJson(req): ApiJson<PullSnapshotRequest>,
) -> Result<Response> {
    req.validate()?;
    let m = st.manager.clone();
    let reference = req.reference.clone();
    Ok(ndjson_job(
        move |progress| async move {
            m.pull_pack(
                &req.reference,
                req.credentials(),
                req.name.clone(),
                progress,
            )
            .await
        },
        move |outcome| match outcome {
            Ok(snapshot) => PackEvent::Done {
                snapshot: Box::new(snapshot),
            },
            Err(e) => {
                tracing::warn!(%reference, "pull failed: {e}");
                PackEvent::error(e.body())
            }
        },
    ))
}
