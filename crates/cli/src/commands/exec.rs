//! `zygote exec ID -- CMD...`: run a program in a sandbox, output streamed; with
//! `--detach`, start it in the background and print its pid.
use std::io::Write;

use zygote_api::client::{block_on, Client, Method};
use zygote_api::model::{ExecEvent, ExecRequest, Process};

use super::daemon_client::{print_json, ApiArgs};

#[derive(clap::Args)]
pub struct ExecArgs {
    /// Sandbox id.
    id: String,
    /// Program and arguments.
    #[arg(last = true, required = true)]
    argv: Vec<String>,
    /// KEY=VALUE, repeatable.
    #[arg(long = "env", short = 'e')]
    env: Vec<String>,
    #[arg(long, short = 'w', visible_alias = "workdir")]
    cwd: Option<String>,
    /// Run as root, UID or UID:GID (default: the image's User, else root).
    #[arg(long, short = 'u')]
    user: Option<String>,
    #[arg(long)]
    timeout_ms: Option<u64>,
    /// Run it in the background: print its pid and return (see `zygote process`).
    #[arg(long, short = 'd')]
    detach: bool,
    /// With --detach: print the process as JSON.
    #[arg(long, requires = "detach")]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

/// `--env KEY=VALUE` arguments as (name, value) pairs, in order.
pub(super) fn env_pairs(args: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    args.iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| anyhow::anyhow!("--env {kv:?}: want KEY=VALUE"))
        })
        .collect()
}

pub fn run(args: ExecArgs) -> anyhow::Result<i32> {
    let client = args.api.client()?;
    let mut req = ExecRequest {
        argv: args.argv,
        cwd: args.cwd,
        user: args.user,
        timeout_ms: args.timeout_ms,
        background: args.detach,
        ..Default::default()
    };
    req.env.extend(env_pairs(&args.env)?);
    if args.detach {
        let process: Process = block_on(client.json(
            Method::POST,
            &format!("/v1/sandboxes/{}/exec", args.id),
            Some(&req),
        ))?;
        if args.json {
            print_json(&process)?;
        } else {
            println!("{}", process.pid);
        }
        return Ok(0);
    }
    stream_events(
        &client,
        Method::POST,
        &format!("/v1/sandboxes/{}/exec/stream", args.id),
        Some(&req),
    )
}

/// Prints a streamed program's output as it comes (stdout and stderr to ours) and
/// returns its exit code (128 + the signal when one ended it, as shells do).
pub fn stream_events(
    client: &Client,
    method: Method,
    path: &str,
    body: Option<&ExecRequest>,
) -> anyhow::Result<i32> {
    let mut code = 1;
    let mut failure = None;
    block_on(client.ndjson(method, path, body, |ev: ExecEvent| match ev {
        ExecEvent::Output { stream, data } => {
            let bytes = zygote_proto::b64::decode(&data).unwrap_or_default();
            // Write errors (a closed pipe) only lose output; keep going to the exit.
            let _ = if stream == "stderr" {
                std::io::stderr().write_all(&bytes)
            } else {
                std::io::stdout()
                    .write_all(&bytes)
                    .and_then(|_| std::io::stdout().flush())
            };
        }
        ExecEvent::Exit {
            exit_code,
            signal,
            timed_out,
            ..
        } => {
            if timed_out {
                eprintln!("zygote: timed out");
            }
            code = exit_code.unwrap_or(128 + signal.unwrap_or(0));
        }
        ExecEvent::Error { code: c, message } => failure = Some(format!("{message} ({c})")),
        ExecEvent::Started { .. } => {}
    }))?;
    if let Some(f) = failure {
        anyhow::bail!(f);
    }
    Ok(code)
}
