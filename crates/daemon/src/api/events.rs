//! `GET /v1/sandboxes/{id}/events`: a sandbox's event log ([`crate::event_log`]).
use axum::extract::{Path, State};
use axum::Json;

use super::{ApiQuery, AppState};
use crate::error::{ErrorBody, Result};
use crate::model::{EventList, EventsQuery, Validate};

#[utoipa::path(get, path = "/v1/sandboxes/{id}/events", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id"), EventsQuery),
    responses((status = 200, description = "What happened to the sandbox and in it (started, \
                branched, paused, resumed, commands started and ended, snapshots, network and \
                timeout changes, its VM stopping), oldest first unless `order=desc`. A log \
                keeps about the last 1 MiB of events and goes with its sandbox; a branch \
                child's starts at the branch", body = EventList),
              (status = 400, description = "A bound of the query broken, or an unknown parameter", body = ErrorBody),
              (status = 404, description = "No such sandbox", body = ErrorBody)))]
pub async fn events(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<EventsQuery>,
) -> Result<Json<EventList>> {
    q.validate()?;
    Ok(Json(st.manager.events(&id, &q)?))
}
