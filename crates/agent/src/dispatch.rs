//! Route a validated request to its handler.

use zygote_proto::{ErrorBody, ErrorCode, HealthInfo, Request, Response, PROTOCOL_VERSION};

use crate::conn::Reply;
use crate::{exec, files, log, pty, stats, system, watch, ShutdownAction};

/// Requests cheap enough to answer on the connection's reader thread.
pub(crate) fn is_quick(r: &Request) -> bool {
    matches!(
        r,
        Request::Health
            | Request::Kill(_)
            | Request::Shutdown
            | Request::Processes
            | Request::ProcessSignal(_)
            | Request::PtyInput(_)
            | Request::PtyResize(_)
            | Request::Unwatch(_)
    )
}

pub(crate) fn handle(reply: Reply, request: Request) {
    let response = match request {
        Request::Exec(req) => return exec::run(reply, req),
        Request::PtyOpen(req) => return pty::run(reply, req),
        Request::Watch(req) => return watch::run(reply, req),
        Request::Unwatch(req) => watch::unwatch(&reply, &req),
        Request::PtyInput(req) => pty::input(&reply, &req).map(|()| Response::Ok),
        Request::PtyResize(req) => pty::resize(&reply, &req).map(|()| Response::Ok),
        Request::Health => Ok(health(&reply)),
        Request::Stats => stats::stats(),
        Request::Kill(k) => {
            if !(1..=64).contains(&k.signal) {
                Err(ErrorBody::new(
                    ErrorCode::BadRequest,
                    format!("signal {} out of range 1..=64", k.signal),
                ))
            } else {
                reply
                    .signal_exec(k.exec_id, k.signal)
                    .map(|()| Response::Ok)
            }
        }
        Request::ReadFile(r) => files::read_file(&r),
        Request::WriteFile(r) => files::write_file(&r),
        Request::ListDir(r) => files::list_dir(&r.path),
        Request::Stat(r) => files::stat(&r),
        Request::Rename(r) => files::rename(&r),
        Request::Remove(r) => files::remove(&r),
        Request::Walk(r) => crate::walk::walk(&r),
        Request::Apply(r) => crate::apply::apply(&r),
        Request::Spawn(r) => {
            let agent = reply.agent();
            agent.processes.spawn(&agent.reaper, r)
        }
        Request::Processes => Ok(reply.agent().processes.processes()),
        Request::ProcessOutput(r) => reply.agent().processes.output(&r),
        Request::ProcessStdin(r) => reply.agent().processes.stdin(&r),
        Request::ProcessSignal(r) => reply.agent().processes.signal(r.pid, r.signal),
        Request::Reidentify(r) => {
            let agent = reply.agent();
            system::reidentify(&r, agent.options.dry_run, &agent.reaper).map(Response::Reidentified)
        }
        Request::Shutdown => return shutdown(reply),
        // The connection answers it before dispatch (it changes the session).
        Request::Hello(_) => Err(ErrorBody::new(
            ErrorCode::Internal,
            "hello reached the dispatcher",
        )),
    };
    reply.finish(response.unwrap_or_else(Response::Error));
}

fn health(reply: &Reply) -> Response {
    let agent = reply.agent();
    Response::Health(HealthInfo {
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        protocol_version: PROTOCOL_VERSION,
        pid1: agent.options.pid1,
        hostname: system::hostname(),
        uptime_ms: agent.started.elapsed().as_millis() as u64,
        dry_run: agent.options.dry_run,
    })
}

fn shutdown(reply: Reply) {
    let action = reply.agent().options.shutdown;
    if action == ShutdownAction::Refuse {
        return reply.finish(Response::Error(ErrorBody::new(
            ErrorCode::Unsupported,
            "this agent does not shut down on request (--no-system-changes or embedded)",
        )));
    }
    reply.finish(Response::Ok);
    // The `ok` frame has been handed to the kernel; give it a moment to leave
    // the guest (through QEMU's slirp, say) before the VM disappears.
    std::thread::sleep(std::time::Duration::from_millis(200));
    log!("shutdown requested");
    match action {
        ShutdownAction::Reboot => system::reboot(libc::RB_AUTOBOOT),
        _ => std::process::exit(0),
    }
}
