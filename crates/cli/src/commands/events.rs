//! `zygote events ID`: what happened to a sandbox and in it (started, branched, paused,
//! commands and how they ended, snapshots, network and timeout changes, its VM
//! stopping), one line per event, oldest first (`GET /v1/sandboxes/{id}/events`).
use zygote_api::client::block_on;
use zygote_api::model::{EventLevel, EventOrder, EventsQuery, SandboxEvent};

use super::daemon_client::{print_json, ApiArgs};

#[derive(clap::Args)]
pub struct EventsArgs {
    /// Sandbox id.
    id: String,
    /// Only events of the last this many seconds.
    #[arg(long, value_name = "SECS")]
    since: Option<u64>,
    /// Only events at this level or above.
    #[arg(long, value_enum)]
    level: Option<Level>,
    /// Only events whose message contains this.
    #[arg(long)]
    search: Option<String>,
    /// At most this many (the newest ones; 1..=1000).
    #[arg(short = 'n', long, default_value_t = 100)]
    limit: u32,
    /// Print the API's JSON instead.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

impl From<Level> for EventLevel {
    fn from(l: Level) -> EventLevel {
        match l {
            Level::Debug => EventLevel::Debug,
            Level::Info => EventLevel::Info,
            Level::Warn => EventLevel::Warn,
            Level::Error => EventLevel::Error,
        }
    }
}

pub fn run(args: EventsArgs) -> anyhow::Result<i32> {
    let now_ms = zygote_api::time::now() * 1000;
    let q = EventsQuery {
        since_ms: args.since.map(|s| now_ms.saturating_sub(s * 1000)),
        limit: Some(args.limit),
        // The newest `limit`, printed oldest first.
        order: Some(EventOrder::Desc),
        level: args.level.map(Into::into),
        search: args.search,
        ..Default::default()
    };
    let mut list = block_on(args.api.client()?.events(&args.id, &q))?;
    list.events.reverse();
    if args.json {
        print_json(&list)?;
    } else {
        for e in &list.events {
            println!("{}", line(e));
        }
    }
    Ok(0)
}

/// `HH:MM:SS.mmm LEVEL message key=value ...` (UTC).
fn line(e: &SandboxEvent) -> String {
    let secs = e.ts_ms / 1000 % 86_400;
    let mut out = format!(
        "{:02}:{:02}:{:02}.{:03} {:<5} {}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        e.ts_ms % 1000,
        e.level.as_str().to_uppercase(),
        e.message
    );
    for (k, v) in &e.fields {
        out.push_str(&format!(" {k}={v}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_shows_time_level_message_and_fields() {
        let e = SandboxEvent {
            ts_ms: 86_400_000 + 3_723_045,
            level: EventLevel::Warn,
            message: "command ended".into(),
            fields: [("exit_code".to_string(), "1".to_string())].into(),
        };
        assert_eq!(line(&e), "01:02:03.045 WARN  command ended exit_code=1");
    }
}
