//! What the daemon-backed verbs share: finding and authenticating to
//! zygoted, and printing tables or JSON.
use std::path::PathBuf;

use anyhow::Context;
use zygote_api::client::Client;
use zygote_api::time::now;

/// Connection options of every verb that talks to zygoted.
#[derive(clap::Args, Debug, Clone)]
pub struct ApiArgs {
    /// Daemon URL: http://HOST:PORT, https://HOST:PORT or unix:///PATH
    /// (default $ZYGOTE_URL, else http://127.0.0.1:7420).
    #[arg(long)]
    pub url: Option<String>,
}

impl ApiArgs {
    /// A client with the token from $ZYGOTE_TOKEN or the daemon's token file
    /// (in $ZYGOTE_STATE_DIR or ~/.local/state/zygote), trusting
    /// $ZYGOTE_CA_CERT for https.
    pub fn client(&self) -> anyhow::Result<Client> {
        let url = self
            .url
            .clone()
            .or_else(|| std::env::var("ZYGOTE_URL").ok().filter(|u| !u.is_empty()))
            .unwrap_or_else(|| format!("http://{}", zygote_api::defaults::DEFAULT_LISTEN));
        let token = match std::env::var("ZYGOTE_TOKEN").ok().filter(|t| !t.is_empty()) {
            Some(t) => Some(t),
            None => {
                let path = zygote_api::defaults::state_dir(None).join("token");
                std::fs::read_to_string(&path)
                    .ok()
                    .map(|t| t.trim().to_string())
            }
        };
        let mut client = Client::new(&url, token)?;
        if let Some(ca) = std::env::var_os("ZYGOTE_CA_CERT").filter(|c| !c.is_empty()) {
            client = client
                .with_ca_file(&PathBuf::from(&ca))
                .with_context(|| format!("ZYGOTE_CA_CERT={}", PathBuf::from(&ca).display()))?;
        }
        Ok(client)
    }
}

/// Prints `value` as pretty JSON.
pub fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// What a list verb prints (`ps`, `images`, `snapshot ls`, `port ls`, `process ls`):
/// the API's answer `list` as pretty JSON with `--json`, else a table of `headers` with
/// one `row` per item of `items` (taken from `list`).
pub fn print_list<T>(
    list: &impl serde::Serialize,
    json: bool,
    headers: &[&str],
    items: &[T],
    row: impl Fn(&T) -> Vec<String>,
) -> anyhow::Result<()> {
    if json {
        return print_json(list);
    }
    let rows: Vec<Vec<String>> = items.iter().map(row).collect();
    print_table(headers, &rows);
    Ok(())
}

/// Left-aligned columns sized to their widest cell.
pub fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// A spinner on stderr for slow operations (boots, branches, builds).
pub fn spinner(msg: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(std::time::Duration::from_millis(100));
    pb
}

/// A duration in its largest whole unit: `42s`, `5m`, `3h`, `2d`.
fn span(s: u64) -> String {
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m", s / 60),
        3600..=86399 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// "3m"-style age of a Unix timestamp.
pub fn age(unix: u64) -> String {
    span(now().saturating_sub(unix))
}

/// Time left until a sandbox's TTL deadline: `in 5m`, `due` once passed
/// (the daemon deletes it within a second or so), `-` without a TTL.
pub fn expires_in(expires_at: Option<u64>) -> String {
    let now = now();
    match expires_at {
        None => "-".into(),
        Some(t) if t <= now => "due".into(),
        Some(t) => format!("in {}", span(t - now)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_and_expiry() {
        assert_eq!(span(59), "59s");
        assert_eq!(span(60), "1m");
        assert_eq!(span(2 * 86400), "2d");
        assert_eq!(expires_in(None), "-");
        assert_eq!(expires_in(Some(1)), "due");
        assert_eq!(expires_in(Some(now() + 7200)), "in 2h");
    }
}
