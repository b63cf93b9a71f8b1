//! `zygote egress ID`: a sandbox's egress record, the connections its guest made
//! through the daemon's egress proxy (rules by name), one line each, oldest first
//! (`GET /v1/sandboxes/{id}/egress`); `--follow` goes on printing them as they happen.
use zygote_api::client::block_on;
use zygote_api::model::EgressEntry;

use super::daemon_client::{print_json, ApiArgs};

#[derive(clap::Args)]
pub struct EgressArgs {
    /// Sandbox id.
    id: String,
    /// At most this many (the newest ones; 1..=10000).
    #[arg(short = 'n', long, default_value_t = 100)]
    limit: u32,
    /// Keep printing new entries as they happen.
    #[arg(short, long)]
    follow: bool,
    /// Print the API's JSON (with --follow: one JSON object a line).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

pub fn run(args: EgressArgs) -> anyhow::Result<i32> {
    let client = args.api.client()?;
    if args.follow {
        let json = args.json;
        block_on(client.follow_egress(&args.id, Some(args.limit), |e| {
            if json {
                println!("{}", serde_json::to_string(&e).unwrap_or_default());
            } else {
                println!("{}", line(&e));
            }
        }))?;
        return Ok(0);
    }
    let list = block_on(client.egress(&args.id, Some(args.limit)))?;
    if args.json {
        print_json(&list)?;
    } else {
        for e in &list.entries {
            println!("{}", line(e));
        }
    }
    Ok(0)
}

/// `HH:MM:SS.mmm EVENT host address:port [METHOD path] out/in bytes reason` (UTC).
fn line(e: &EgressEntry) -> String {
    let at = e.ended_ms.unwrap_or(e.started_ms);
    let secs = at / 1000 % 86_400;
    let mut out = format!(
        "{:02}:{:02}:{:02}.{:03} {:<7} {} {}:{}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        at % 1000,
        e.event,
        e.host.as_deref().unwrap_or("-"),
        e.address,
        e.port,
    );
    if let (Some(m), Some(p)) = (&e.method, &e.path) {
        out.push_str(&format!(" {m} {p}"));
    }
    if e.event != "refused" {
        out.push_str(&format!(" out={} in={}", e.bytes_out, e.bytes_in));
    }
    if !e.secrets.is_empty() {
        out.push_str(&format!(" secrets={}", e.secrets.join(",")));
    }
    out.push_str(&format!(" ({})", e.reason));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_print_on_one_line() {
        let e = EgressEntry {
            sandbox: "sb-1".into(),
            event: "closed".into(),
            host: Some("pypi.org".into()),
            address: "192.0.2.10".into(),
            port: 80,
            protocol: "http".into(),
            method: Some("GET".into()),
            path: Some("/simple/".into()),
            reason: "allow_out names pypi.org (pypi.org)".into(),
            bytes_out: 10,
            bytes_in: 20,
            started_ms: 3_600_000,
            ended_ms: Some(3_601_500),
            secrets: Vec::new(),
        };
        assert_eq!(
            line(&e),
            "01:00:01.500 closed  pypi.org 192.0.2.10:80 GET /simple/ out=10 in=20 \
             (allow_out names pypi.org (pypi.org))"
        );
        let used = EgressEntry {
            secrets: vec!["KEY".into()],
            ..e
        };
        assert!(
            line(&used).contains("in=20 secrets=KEY ("),
            "{}",
            line(&used)
        );
    }
}
