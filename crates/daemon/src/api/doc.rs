//! The OpenAPI document. Responses that whole classes of operations give (401 on every
//! protected one, from the auth layer; 400 and 413 on every one with a body, from the
//! body extractors) are added by [`CommonResponses`] by the rules the router applies
//! ([`PUBLIC`]), so a new route cannot leave them out.
use utoipa::openapi::path::Operation;
use utoipa::openapi::{ContentBuilder, OpenApi as Document, Ref, ResponseBuilder};
use utoipa::OpenApi;

use super::{
    code, console_login, egress, events, guest, images, metrics, packs, pause, ports, processes,
    pty, sandboxes, snapshots, system, volumes, watch, PUBLIC,
};

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut Document) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

struct CommonResponses;

/// Adds an error response (the `ErrorBody` shape) unless the operation documents
/// that status with a more specific description already.
fn add_error(op: &mut Operation, status: u16, description: &str) {
    op.responses
        .responses
        .entry(status.to_string())
        .or_insert_with(|| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .into()
        });
}

/// Whether the operation's 502 is the guest agent's.
fn reaches_agent(op: &Operation) -> bool {
    use utoipa::openapi::RefOr;
    match op.responses.responses.get("502") {
        Some(RefOr::T(r)) => r.description.contains("agent"),
        _ => false,
    }
}

impl utoipa::Modify for CommonResponses {
    fn modify(&self, openapi: &mut Document) {
        for (path, item) in openapi.paths.paths.iter_mut() {
            let public = PUBLIC.contains(&path.as_str());
            let ops = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ];
            for op in ops.into_iter().flatten() {
                if !public {
                    add_error(op, 401, "Missing or wrong bearer token (unauthorized)");
                }
                // Whatever reaches the guest agent (it documents the agent's 502) has a
                // deadline on the daemon's side too.
                if op.responses.responses.contains_key("502") && reaches_agent(op) {
                    add_error(
                        op,
                        504,
                        "The sandbox's agent did not answer within the request's deadline \
                         (its timeout_ms plus grace, else the default): agent_timeout, or \
                         agent_unresponsive when it did not answer a health check either",
                    );
                }
                if op.request_body.is_some() {
                    add_error(
                        op,
                        400,
                        "Malformed or invalid body (malformed_body, invalid_argument)",
                    );
                    add_error(
                        op,
                        413,
                        "Body over the route's limit (payload_too_large; the message states the limit)",
                    );
                }
            }
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "zygoted",
        description = "zygote daemon: copy-on-write microVM sandboxes. Every route except \
                       /healthz and /v1/openapi.json needs `Authorization: Bearer <token>` \
                       (the token is in <state dir>/token; the scheme name is \
                       case-insensitive). Errors are `{\"error\": {\"code\", \"message\"}}` \
                       with stable codes. JSON bodies may be at most 32 MiB, file uploads \
                       64 MiB; an exec must also fit the guest agent's 16 MiB frame \
                       (argv, env, cwd and base64 stdin): larger requests get 413."
    ),
    paths(
        system::healthz, system::metrics, system::openapi, system::info, console_login::login,
        system::list_images, system::build_image, images::pull,
        sandboxes::list, sandboxes::create, sandboxes::get, sandboxes::delete,
        sandboxes::set_ttl, sandboxes::set_network, sandboxes::branch, sandboxes::restore, sandboxes::logs,
        events::events, events::live,
        egress::egress,
        metrics::metrics,
        sandboxes::tree, sandboxes::keep, sandboxes::diff, sandboxes::merge,
        pause::pause, pause::resume,
        ports::expose, ports::list, ports::unexpose,
        guest::exec, guest::exec_stream, pty::pty, guest::read_file, guest::write_file, guest::list_dir,
        watch::watch,
        code::run, code::list, code::create, code::restart, code::delete,
        processes::list, processes::get, processes::output, processes::stdin, processes::signal,
        snapshots::list, snapshots::create, snapshots::get, snapshots::delete,
        packs::export, packs::import, packs::push, packs::pull,
        volumes::list, volumes::create, volumes::get, volumes::delete,
    ),
    // Types used only in query parameters are not collected from the paths.
    components(schemas(crate::model::EventOrder)),
    modifiers(&BearerAuth, &CommonResponses),
    security(("bearer" = [])),
)]
pub struct ApiDoc;

#[cfg(test)]
#[path = "doc_tests.rs"]
mod tests;
