//! `zygote events ID`: what happened to a sandbox and in it (started, branched, paused,
//! commands and how they ended, snapshots, network and timeout changes, its VM
//! stopping), one line per event, oldest first (`GET /v1/sandboxes/{id}/events`).
//! `zygote events ID --follow` goes on with its events as they happen, and `zygote
//! events` alone follows every sandbox's, like `docker events` (`GET /v1/events`).
use tokio::sync::mpsc;
use zygote_api::client::{block_on, Client};
use zygote_api::event_stream_client::StreamMessage;
use zygote_api::model::{
    EventLevel, EventOrder, EventsQuery, LiveEvent, LiveEventsQuery, SandboxEvent,
};

use super::daemon_client::{print_json, ApiArgs};

#[derive(clap::Args)]
pub struct EventsArgs {
    /// Sandbox id (none: follow every sandbox's events as they happen).
    id: Option<String>,
    /// Go on printing its events as they happen (Ctrl-C ends it).
    #[arg(short = 'f', long)]
    follow: bool,
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
    let client = args.api.client()?;
    let Some(id) = args.id.clone() else {
        block_on(follow(&client, None, &args))?;
        return Ok(0);
    };
    if !args.follow {
        let list = block_on(history(&client, &id, &args))?;
        if args.json {
            print_json(&zygote_api::model::EventList { events: list })?;
        } else {
            for e in &list {
                println!("{}", line_of(None, e));
            }
        }
        return Ok(0);
    }
    block_on(follow(&client, Some(&id), &args))?;
    Ok(0)
}

fn live_query(id: Option<&str>, args: &EventsArgs) -> LiveEventsQuery {
    LiveEventsQuery {
        sandbox: id.map(String::from),
        level: args.level.map(Into::into),
    }
}

/// Follows sandbox `id` (its history first) or every sandbox (from now).
async fn follow(client: &Client, id: Option<&str>, args: &EventsArgs) -> anyhow::Result<()> {
    let (tx, rx) = mpsc::unbounded_channel();
    let q = live_query(id, args);
    let stream = {
        let client = client.clone();
        tokio::spawn(async move { client.follow_events(&q, |m| tx.send(m).is_ok()).await })
    };
    // Subscribed before the history is read, so nothing falls between the two.
    let rx = wait_ready(rx, stream).await?;
    let past = match id {
        Some(id) => history(client, id, args).await?,
        None => Vec::new(),
    };
    for e in &past {
        print_event(None, e, args.json)?;
    }
    drain(rx, &past, args.json, id.is_none()).await
}

type Messages = mpsc::UnboundedReceiver<StreamMessage>;
type StreamTask = tokio::task::JoinHandle<Result<(), zygote_api::client::ClientError>>;

/// The stream's messages once it said `ready`; its error if it ended before.
async fn wait_ready(mut rx: Messages, stream: StreamTask) -> anyhow::Result<Messages> {
    match rx.recv().await {
        Some(StreamMessage::Ready(_)) => Ok(rx),
        Some(other) => anyhow::bail!("the event stream began with {other:?}, not `ready`"),
        None => match stream.await {
            Ok(Err(e)) => Err(e.into()),
            _ => anyhow::bail!("the event stream ended before it was ready"),
        },
    }
}

/// Prints what arrives, skipping the events `past` already printed.
/// With `every`, lines name their sandbox.
async fn drain(
    mut rx: Messages,
    past: &[SandboxEvent],
    json: bool,
    every: bool,
) -> anyhow::Result<()> {
    while let Some(m) = rx.recv().await {
        match m {
            StreamMessage::Event(LiveEvent { event, sandbox, .. }) => {
                if !past.contains(&event) {
                    print_event(every.then_some(sandbox.as_str()), &event, json)?;
                }
            }
            StreamMessage::Lagged(l) => {
                eprintln!("zygote: fell behind the daemon's events: {} lost", l.missed)
            }
            StreamMessage::Ready(_) => {}
        }
    }
    anyhow::bail!("the daemon's event stream ended")
}

fn print_event(sandbox: Option<&str>, e: &SandboxEvent, json: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if json {
        let mut v = serde_json::to_value(e)?;
        if let Some(s) = sandbox {
            v["sandbox"] = s.into();
        }
        writeln!(out, "{v}")?;
    } else {
        writeln!(out, "{}", line_of(sandbox, e))?;
    }
    out.flush()?;
    Ok(())
}

/// The newest `--limit` events of `id` that the flags ask for, oldest first.
async fn history(client: &Client, id: &str, args: &EventsArgs) -> anyhow::Result<Vec<SandboxEvent>> {
    let now_ms = zygote_api::time::now() * 1000;
    let q = EventsQuery {
        since_ms: args.since.map(|s| now_ms.saturating_sub(s * 1000)),
        limit: Some(args.limit),
        // The newest `limit`, printed oldest first.
        order: Some(EventOrder::Desc),
        level: args.level.map(Into::into),
        search: args.search.clone(),
        ..Default::default()
    };
    let mut list = client.events(id, &q).await?;
    list.events.reverse();
    Ok(list.events)
}

/// `HH:MM:SS.mmm [SANDBOX] LEVEL message key=value ...` (UTC).
fn line_of(sandbox: Option<&str>, e: &SandboxEvent) -> String {
    let secs = e.ts_ms / 1000 % 86_400;
    let mut out = format!(
        "{:02}:{:02}:{:02}.{:03} ",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        e.ts_ms % 1000,
    );
    if let Some(s) = sandbox {
        out.push_str(s);
        out.push(' ');
    }
    out.push_str(&format!("{:<5} {}", e.level.as_str().to_uppercase(), e.message));
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
        assert_eq!(line_of(None, &e), "01:02:03.045 WARN  command ended exit_code=1");
        assert_eq!(
            line_of(Some("sb-1"), &e),
            "01:02:03.045 sb-1 WARN  command ended exit_code=1"
        );
    }
}
