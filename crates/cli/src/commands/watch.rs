//! `zygote watch ID PATH [-r]`: print a guest directory's changes as they happen
//! (`GET /v1/sandboxes/{id}/files/watch`), one `KIND NAME` line each (or the API's JSON
//! lines with `--json`), until Ctrl-C or the directory is removed.
use std::io::Write;

use zygote_api::client::block_on;
use zygote_api::model::FileWatchEvent;

use super::daemon_client::ApiArgs;

#[derive(clap::Args)]
pub struct WatchArgs {
    /// Sandbox id.
    id: String,
    /// Absolute path of a directory in the sandbox.
    path: String,
    /// Also watch every directory below it (new ones too).
    #[arg(short, long)]
    recursive: bool,
    /// Print the API's NDJSON lines instead.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

/// One event as the human-readable line (None: nothing to print).
fn line(ev: &FileWatchEvent) -> Option<String> {
    match ev {
        FileWatchEvent::Started | FileWatchEvent::Keepalive => None,
        FileWatchEvent::Event { name, kind } => Some(format!("{kind:<8} {name}")),
        FileWatchEvent::End => Some("(the watched directory was removed)".into()),
        FileWatchEvent::Error { code, message } => Some(format!("error: {message} ({code})")),
    }
}

pub fn run(args: WatchArgs) -> anyhow::Result<i32> {
    let client = args.api.client()?;
    let mut failed = false;
    let mut out = std::io::stdout().lock();
    block_on(
        client.watch_dir(&args.id, &args.path, args.recursive, |ev| {
            failed |= matches!(ev, FileWatchEvent::Error { .. });
            let text = if args.json {
                Some(serde_json::to_string(&ev).expect("events serialize"))
            } else {
                line(&ev)
            };
            // Stop when stdout is gone (`zygote watch ... | head`).
            text.is_none_or(|t| writeln!(out, "{t}").and_then(|()| out.flush()).is_ok())
        }),
    )?;
    Ok(if failed { 1 } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_print_as_kind_and_name() {
        let ev = FileWatchEvent::Event {
            name: "src/a.rs".into(),
            kind: "write".into(),
        };
        assert_eq!(line(&ev).unwrap(), "write    src/a.rs");
        assert_eq!(line(&FileWatchEvent::Keepalive), None);
    }
}
