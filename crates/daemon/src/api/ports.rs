//! Exposed-port routes: which sandbox ports the port proxy serves (`crate::proxy`).
use std::net::SocketAddr;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;

use super::{ApiJson, AppState};
use crate::db::PortRow;
use crate::error::{Error, ErrorBody, Result};
use crate::model::{ExposePortRequest, ExposedPort, PortList, Validate};
use crate::proxy;

fn view(proxy: SocketAddr, p: &PortRow) -> ExposedPort {
    let (url, path_url) = proxy::urls(proxy, &p.sandbox, p.port);
    ExposedPort {
        port: p.port,
        public: p.public,
        url,
        path_url,
    }
}

/// The proxy's address: without the proxy there is nothing to expose, nor a URL to show.
fn proxy_addr(st: &AppState) -> Result<SocketAddr> {
    st.proxy.ok_or_else(|| {
        Error::Unsupported(
            "the daemon runs without its port proxy (--proxy-listen none, or the default \
             address was taken at start-up: see its log)"
                .into(),
        )
    })
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/ports", tag = "ports",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ExposePortRequest,
    responses((status = 201, description = "Exposed: where the port proxy serves it (with the \
                API token unless public)", body = ExposedPort),
              (status = 400, description = "Port outside 1..=65535 (invalid_argument)", body = ErrorBody),
              (status = 404, description = "No such sandbox", body = ErrorBody),
              (status = 409, description = "The port is exposed already (conflict), or the \
                sandbox is not running", body = ErrorBody),
              (status = 422, description = "Ports need isolated networking (GET /v1/info: \
                network.backend) and the port proxy (proxy) (unsupported)", body = ErrorBody)))]
pub async fn expose(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<ExposePortRequest>,
) -> Result<(StatusCode, Json<ExposedPort>)> {
    req.validate()?;
    let proxy = proxy_addr(&st)?;
    let row = st.manager.expose_port(&id, &req)?;
    Ok((StatusCode::CREATED, Json(view(proxy, &row))))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports", tag = "ports",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "The sandbox's exposed ports, lowest first", body = PortList),
              (status = 404, description = "No such sandbox", body = ErrorBody),
              (status = 422, description = "The daemon runs without its port proxy (unsupported)", body = ErrorBody)))]
pub async fn list(State(st): State<AppState>, Path(id): Path<String>) -> Result<Json<PortList>> {
    let ports = st.manager.ports(&id)?;
    let proxy = proxy_addr(&st)?;
    Ok(Json(PortList {
        ports: ports.iter().map(|p| view(proxy, p)).collect(),
    }))
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}/ports/{port}", tag = "ports",
    params(("id" = String, Path, description = "Sandbox id"),
           ("port" = u16, Path, description = "The exposed port", minimum = 1, maximum = 65535)),
    responses((status = 204, description = "No longer exposed (open proxied connections stay)"),
              (status = 400, description = "Not a port number (invalid_argument)", body = ErrorBody),
              (status = 404, description = "No such sandbox, or the port is not exposed", body = ErrorBody)))]
pub async fn unexpose(
    State(st): State<AppState>,
    Path((id, port)): Path<(String, String)>,
) -> Result<StatusCode> {
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|&p| p != 0 && !port.starts_with('+'))
        .ok_or_else(|| Error::invalid(format!("port must be in 1..=65535, got {port:?}")))?;
    st.manager.unexpose_port(&id, port)?;
    Ok(StatusCode::NO_CONTENT)
}
