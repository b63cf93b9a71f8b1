//! `zygote create`: start sandboxes through the daemon.
use serde_json::json;
use zygote_daemon::client::{block_on, Method};
use zygote_daemon::model::SandboxList;

use super::daemon_client::{age, expires_in, print_json, print_table, spinner, ApiArgs};

#[derive(clap::Args)]
pub struct CreateArgs {
    /// Image to boot (default: minimal).
    #[arg(long, conflicts_with = "snapshot")]
    image: Option<String>,
    /// Snapshot to start from instead of an image.
    #[arg(long)]
    snapshot: Option<String>,
    /// Name (also the guest hostname).
    #[arg(long)]
    name: Option<String>,
    /// How many sandboxes.
    #[arg(short = 'n', long, default_value_t = 1)]
    count: u32,
    #[arg(long)]
    mem_mib: Option<u32>,
    #[arg(long)]
    vcpus: Option<u32>,
    /// cgroup memory.max for the VM process, MiB.
    #[arg(long)]
    memory_limit_mib: Option<u64>,
    /// cgroup cpu.max as percent of one CPU.
    #[arg(long)]
    cpu_percent: Option<u32>,
    /// cgroup pids.max.
    #[arg(long)]
    pids_limit: Option<u64>,
    /// Delete the sandbox(es) this many seconds after they are running
    /// (change it later with `zygote ttl`).
    #[arg(long, value_name = "SECS")]
    ttl: Option<u64>,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

pub fn run(args: CreateArgs) -> anyhow::Result<i32> {
    let client = args.api.client()?;
    let mut body = json!({
        "n": args.count,
        "limits": {},
    });
    match &args.snapshot {
        Some(s) => body["snapshot"] = json!(s),
        None => body["image"] = json!(args.image.as_deref().unwrap_or("minimal")),
    }
    for (k, v) in [
        ("name", args.name.as_ref().map(|n| json!(n))),
        ("mem_mib", args.mem_mib.map(|m| json!(m))),
        ("vcpus", args.vcpus.map(|v| json!(v))),
        ("ttl_secs", args.ttl.map(|t| json!(t))),
    ] {
        if let Some(v) = v {
            body[k] = v;
        }
    }
    for (k, v) in [
        ("memory_mib", args.memory_limit_mib.map(|m| json!(m))),
        ("cpu_percent", args.cpu_percent.map(|c| json!(c))),
        ("pids", args.pids_limit.map(|p| json!(p))),
    ] {
        if let Some(v) = v {
            body["limits"][k] = v;
        }
    }
    let pb = (!args.json).then(|| spinner(&format!("starting {} sandbox(es)", args.count)));
    let made: Result<SandboxList, _> =
        block_on(client.json(Method::POST, "/v1/sandboxes", Some(&body)));
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    let made = made?;
    if args.json {
        print_json(&made)?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = made
        .sandboxes
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                s.name.clone().unwrap_or_default(),
                s.state.clone(),
                s.pid.map(|p| p.to_string()).unwrap_or_default(),
                age(s.created_at),
                expires_in(s.expires_at),
            ]
        })
        .collect();
    print_table(&["ID", "NAME", "STATE", "PID", "AGE", "EXPIRES"], &rows);
    for s in &made.sandboxes {
        for (limit, why) in &s.cgroup.not_applied {
            eprintln!("zygote: {}: {limit} not applied: {why}", s.id);
        }
    }
    Ok(0)
}
