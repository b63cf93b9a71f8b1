//! `GET /v1/sandboxes/{id}/egress`: a sandbox's egress record ([`crate::egress_log`]).
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::StreamExt;

use super::ndjson::ndjson_stream;
use super::{ApiQuery, AppState};
use crate::error::{ErrorBody, Result};
use crate::model::{EgressList, EgressQuery};

#[utoipa::path(get, path = "/v1/sandboxes/{id}/egress", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id"), EgressQuery),
    responses((status = 200, description = "The connections the sandbox's guest made through \
                the egress proxy (TCP to the ports its rules by name cover): host, address, \
                port, method and path on plain HTTP, allowed or refused and why, bytes each \
                way, start and end; oldest first. About the last 1 MiB is kept; it goes with \
                the sandbox, and a branch child has its own. With `follow=true`: NDJSON, the \
                entries so far, then each new one as it happens", body = EgressList),
              (status = 400, description = "An unknown parameter", body = ErrorBody),
              (status = 404, description = "No such sandbox", body = ErrorBody)))]
pub async fn egress(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<EgressQuery>,
) -> Result<Response> {
    let (entries, live) = st.manager.egress(&id, q.limit())?;
    if !q.follow.unwrap_or(false) {
        return Ok(Json(EgressList { entries }).into_response());
    }
    let new = BroadcastStream::new(live)
        .filter_map(|e| e.ok())
        .filter(move |e| e.sandbox == id);
    Ok(ndjson_stream(tokio_stream::iter(entries).chain(new)))
}
