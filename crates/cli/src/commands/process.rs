//! `zygote process`: background processes of a sandbox (started with `exec --detach`):
//! list them, print or follow their output, write to their stdin, signal them.
use std::io::{Read, Write};

use zygote_api::client::{block_on, Method};
use zygote_api::model::{
    Process, ProcessList, ProcessOutput, SignalRequest, SignalSpec, StdinRequest,
};

use super::daemon_client::{print_list, ApiArgs};
use super::exec::stream_events;

#[derive(clap::Subcommand)]
pub enum ProcessCommand {
    /// List a sandbox's background processes.
    Ls {
        /// Sandbox id.
        sandbox: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Print what a process wrote (stdout to stdout, stderr to stderr).
    Logs {
        /// Sandbox id.
        sandbox: String,
        pid: u32,
        /// Keep printing as it writes, until it ends; exit with its exit code.
        #[arg(long, short = 'f')]
        follow: bool,
        /// Start at this byte offset (stdout and stderr counted together).
        #[arg(long, default_value_t = 0)]
        offset: u64,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Write this command's stdin to the process's stdin.
    Stdin {
        /// Sandbox id.
        sandbox: String,
        pid: u32,
        /// Then close the process's stdin (it reads end of file).
        #[arg(long)]
        eof: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Send a signal to the process's group (SIGKILL unless --signal).
    Kill {
        /// Sandbox id.
        sandbox: String,
        pid: u32,
        /// A name (TERM, SIGINT, ...) or a number.
        #[arg(long, short = 's', default_value = "KILL")]
        signal: String,
        #[command(flatten)]
        api: ApiArgs,
    },
}

fn row(p: &Process) -> Vec<String> {
    let ended = match (p.exit_code, p.signal) {
        (Some(code), _) => format!("exit {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        (None, None) => String::new(),
    };
    vec![
        p.pid.to_string(),
        p.state.clone(),
        ended,
        p.output_bytes.to_string(),
        p.argv.join(" "),
    ]
}

/// `POST /v1/sandboxes/{path}` with a JSON body and no answer body.
fn post(api: &ApiArgs, path: &str, body: &impl serde::Serialize) -> anyhow::Result<i32> {
    let bytes = serde_json::to_vec(body)?.into();
    block_on(api.client()?.raw(
        Method::POST,
        &format!("/v1/sandboxes/{path}"),
        Some((bytes, "application/json")),
    ))?;
    Ok(0)
}

pub fn run(cmd: ProcessCommand) -> anyhow::Result<i32> {
    match cmd {
        ProcessCommand::Ls { sandbox, json, api } => {
            let list: ProcessList = block_on(api.client()?.json(
                Method::GET,
                &format!("/v1/sandboxes/{sandbox}/processes"),
                None::<&()>,
            ))?;
            let headers = ["PID", "STATE", "ENDED", "OUTPUT", "COMMAND"];
            print_list(&list, json, &headers, &list.processes, row)?;
            Ok(0)
        }
        ProcessCommand::Logs {
            sandbox,
            pid,
            follow,
            offset,
            api,
        } => {
            let client = api.client()?;
            let path = format!("/v1/sandboxes/{sandbox}/processes/{pid}/output?offset={offset}");
            if follow {
                return stream_events(&client, Method::GET, &format!("{path}&follow=true"), None);
            }
            let out: ProcessOutput = block_on(client.json(Method::GET, &path, None::<&()>))?;
            if out.dropped_bytes > 0 {
                eprintln!(
                    "zygote: {} earlier bytes are no longer kept",
                    out.dropped_bytes
                );
            }
            std::io::stdout().write_all(out.stdout.as_bytes())?;
            std::io::stderr().write_all(out.stderr.as_bytes())?;
            Ok(0)
        }
        ProcessCommand::Stdin {
            sandbox,
            pid,
            eof,
            api,
        } => {
            let mut data = Vec::new();
            std::io::stdin().read_to_end(&mut data)?;
            let body = StdinRequest {
                data: None,
                data_base64: Some(zygote_proto::b64::encode(&data)),
                eof,
            };
            post(&api, &format!("{sandbox}/processes/{pid}/stdin"), &body)
        }
        ProcessCommand::Kill {
            sandbox,
            pid,
            signal,
            api,
        } => {
            // A number goes as one, so "9" and "KILL" both work.
            let signal = match signal.parse::<i64>() {
                Ok(n) => SignalSpec::Number(n),
                Err(_) => SignalSpec::Name(signal),
            };
            let body = SignalRequest { signal };
            post(&api, &format!("{sandbox}/processes/{pid}/signal"), &body)
        }
    }
}
