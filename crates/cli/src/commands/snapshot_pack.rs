//! `zygote snapshot export|import|push|pull`: snapshot packs, moved as files or through
//! an OCI registry (progress on stderr: a bar per blob on a terminal, lines otherwise).
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use zygote_api::client::{block_on, Method};
use zygote_api::model::{PackEvent, PullSnapshotRequest, PushSnapshotRequest, Snapshot};

use super::daemon_client::{print_json, ApiArgs};

#[derive(clap::Subcommand)]
pub enum PackCommand {
    /// Write a snapshot as one pack file (an OCI image layout in a tar).
    Export {
        id: String,
        /// Where to write it ("-": stdout).
        #[arg(long, short = 'o')]
        output: PathBuf,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Import a pack file as a new snapshot of this daemon.
    Import {
        file: PathBuf,
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Push a snapshot to an OCI registry (blobs it has are not sent again).
    Push {
        id: String,
        reference: String,
        #[command(flatten)]
        creds: Creds,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Pull a snapshot pack from an OCI registry as a new snapshot.
    Pull {
        reference: String,
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        creds: Creds,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
}

#[derive(clap::Args)]
pub struct Creds {
    /// Registry username (the password is read from stdin); without it the daemon's
    /// docker config is used.
    #[arg(long, short = 'u', requires = "password_stdin")]
    username: Option<String>,
    #[arg(long, requires = "username")]
    password_stdin: bool,
}

impl Creds {
    /// The username and the password (read from stdin), if given.
    fn read(&self) -> anyhow::Result<(Option<String>, Option<String>)> {
        let Some(u) = &self.username else {
            return Ok((None, None));
        };
        let mut p = String::new();
        std::io::stdin()
            .read_to_string(&mut p)
            .context("reading the password from stdin")?;
        let password = p.trim_end_matches(['\n', '\r']).to_string();
        Ok((Some(u.clone()), Some(password)))
    }
}

pub fn run(cmd: PackCommand) -> anyhow::Result<i32> {
    match cmd {
        PackCommand::Export { id, output, api } => {
            let client = api.client()?;
            let bar = bytes_bar(&format!("exporting {id}"));
            let path = format!("/v1/snapshots/{id}/export");
            let total = if output.as_os_str() == "-" {
                let mut out = std::io::stdout();
                block_on(client.download(&path, &mut out, |n| bar.set_position(n)))?
            } else {
                let tmp = output.with_extension("partial");
                let mut f = std::fs::File::create(&tmp)
                    .with_context(|| format!("creating {}", tmp.display()))?;
                let res = block_on(client.download(&path, &mut f, |n| bar.set_position(n)));
                let total = res.inspect_err(|_| {
                    let _ = std::fs::remove_file(&tmp);
                })?;
                f.flush()?;
                std::fs::rename(&tmp, &output)
                    .with_context(|| format!("writing {}", output.display()))?;
                total
            };
            bar.finish_and_clear();
            eprintln!("{id}: {:.1} MiB pack", total as f64 / 1048576.0);
            Ok(0)
        }
        PackCommand::Import {
            file,
            name,
            json,
            api,
        } => {
            let client = api.client()?;
            let mut path = "/v1/snapshots/import".to_string();
            if let Some(n) = &name {
                path.push_str(&format!(
                    "?name={}",
                    form_urlencoded::byte_serialize(n.as_bytes()).collect::<String>()
                ));
            }
            // Streamed from the file: a pack can be larger than this machine's memory.
            let answer = block_on(client.upload(Method::POST, &path, &file, "application/x-tar"))?;
            let snap: Snapshot = serde_json::from_slice(&answer)?;
            report(&snap, json)
        }
        PackCommand::Push {
            id,
            reference,
            creds,
            api,
        } => {
            let (username, password) = creds.read()?;
            let body = PushSnapshotRequest {
                reference: reference.clone(),
                username,
                password,
            };
            match stream(&api, &format!("/v1/snapshots/{id}/push"), &body)? {
                PackEvent::Pushed { digest, size, .. } => {
                    eprintln!(
                        "pushed {reference} ({:.1} MiB in all)",
                        size as f64 / 1048576.0
                    );
                    println!("{digest}");
                    Ok(0)
                }
                other => anyhow::bail!("the daemon ended the push with {other:?}"),
            }
        }
        PackCommand::Pull {
            reference,
            name,
            creds,
            json,
            api,
        } => {
            let (username, password) = creds.read()?;
            let body = PullSnapshotRequest {
                reference,
                username,
                password,
                name,
            };
            match stream(&api, "/v1/snapshots/pull", &body)? {
                PackEvent::Done { snapshot } => report(&snapshot, json),
                other => anyhow::bail!("the daemon ended the pull with {other:?}"),
            }
        }
    }
}

/// Runs an NDJSON push or pull with progress; returns its last event (errors bail).
fn stream(api: &ApiArgs, path: &str, body: &impl serde::Serialize) -> anyhow::Result<PackEvent> {
    let client = api.client()?;
    let bar = bytes_bar(path.rsplit('/').next().unwrap_or("transfer"));
    let mut last = None;
    let tty = std::io::stderr().is_terminal();
    block_on(
        client.ndjson(Method::POST, path, Some(body), |ev: PackEvent| match &ev {
            PackEvent::Progress { line } => {
                if tty {
                    bar.set_message(line.clone());
                } else {
                    eprintln!("  {line}");
                }
            }
            PackEvent::Blob {
                index,
                done,
                total,
                state,
                ..
            } => {
                bar.set_length(*total);
                bar.set_position(*done);
                bar.set_message(format!("blob {index}: {state}"));
                if !tty && state != "downloading" {
                    eprintln!(
                        "  blob {index}: {state} ({:.1} MiB)",
                        *total as f64 / 1048576.0
                    );
                }
            }
            _ => last = Some(ev),
        }),
    )?;
    bar.finish_and_clear();
    match last {
        Some(PackEvent::Error { code, message }) => anyhow::bail!("{message} ({code})"),
        Some(ev) => Ok(ev),
        None => anyhow::bail!("the daemon ended the stream without a result"),
    }
}

fn report(snap: &Snapshot, json: bool) -> anyhow::Result<i32> {
    if json {
        print_json(snap)?;
    } else {
        println!("{}", snap.id);
    }
    Ok(0)
}

/// A bytes bar with rate on a terminal; hidden otherwise.
fn bytes_bar(title: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_prefix(title.to_string());
    bar
}
