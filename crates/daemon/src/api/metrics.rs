//! `GET /v1/sandboxes/{id}/metrics`: the sandbox's resource use over time, from the
//! daemon's sampler (`manager::metrics_sampler`): one sample per interval (5 s by
//! default) while it runs, the newest 720 kept, in memory only.
use axum::extract::{Path, State};
use axum::Json;

use super::{ApiQuery, AppState};
use crate::error::{ErrorBody, Result};
use crate::model::{MetricsList, MetricsQuery};

#[utoipa::path(get, path = "/v1/sandboxes/{id}/metrics", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id"), MetricsQuery),
    responses((status = 200, description = "The samples taken between start and end \
                (inclusive; unix seconds), oldest first: one per sampling interval while \
                the sandbox runs (none while it is paused), the newest 720 kept; the \
                history lives in the daemon's memory and is lost when it restarts",
                body = MetricsList),
              (status = 400, description = "start or end not a whole number of seconds, \
                or start after end (invalid_argument)", body = ErrorBody),
              (status = 404, description = "No such sandbox", body = ErrorBody)))]
pub async fn metrics(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<MetricsQuery>,
) -> Result<Json<MetricsList>> {
    Ok(Json(st.manager.metrics(&id, &q)?))
}
