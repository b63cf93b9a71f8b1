//! `zygote exec ID -- CMD...`: run a program in a sandbox, output streamed.
use std::io::Write;

use zygote_daemon::client::{block_on, Method};
use zygote_daemon::model::{ExecEvent, ExecRequest};

use super::daemon_client::ApiArgs;

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
    #[arg(long)]
    cwd: Option<String>,
    #[arg(long)]
    timeout_ms: Option<u64>,
    #[command(flatten)]
    api: ApiArgs,
}

pub fn run(args: ExecArgs) -> anyhow::Result<i32> {
    let client = args.api.client()?;
    let mut req = ExecRequest {
        argv: args.argv,
        cwd: args.cwd,
        timeout_ms: args.timeout_ms,
        ..Default::default()
    };
    for kv in &args.env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--env {kv:?}: want KEY=VALUE"))?;
        req.env.insert(k.into(), v.into());
    }
    let mut code = 1;
    let mut failure = None;
    block_on(client.ndjson(
        Method::POST,
        &format!("/v1/sandboxes/{}/exec/stream", args.id),
        &req,
        |ev: ExecEvent| match ev {
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
        },
    ))?;
    if let Some(f) = failure {
        anyhow::bail!(f);
    }
    Ok(code)
}
