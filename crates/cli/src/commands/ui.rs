//! `zygote ui`: opens the daemon's web console, logged in, without putting the token in
//! a URL: the daemon gives a one-time code (`POST /v1/console/login`, valid for a
//! minute) and the URL carries it in its fragment, which the browser never sends.
use anyhow::bail;
use zygote_api::client::{block_on, Method};
use zygote_api::model::ConsoleLogin;

use super::daemon_client::ApiArgs;

#[derive(clap::Args)]
pub struct UiArgs {
    /// Only print the URL (it works once, within a minute); do not start a browser.
    #[arg(long)]
    no_open: bool,
    #[command(flatten)]
    api: ApiArgs,
}

pub fn run(args: UiArgs) -> anyhow::Result<i32> {
    let client = args.api.client()?;
    // Checked before a code is made: a unix-socket daemon has no address to open.
    let base = console_base(client.url())?;
    let login: ConsoleLogin =
        block_on(client.json(Method::POST, "/v1/console/login", None::<&()>))?;
    let url = format!("{base}{}", login.path);
    println!("{url}");
    eprintln!(
        "zygote: this URL opens the console once, within {} s; `zygote ui` again for another",
        login.expires_in_secs
    );
    if !args.no_open && has_display() {
        // The browser runs on without us; what it prints is not ours to show.
        let opened = std::process::Command::new("xdg-open")
            .arg(&url)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        if let Err(e) = opened {
            eprintln!("zygote: could not start a browser (xdg-open: {e}): open the URL above");
        }
    }
    Ok(0)
}

/// Whether a graphical session is there to open a browser in.
fn has_display() -> bool {
    ["DISPLAY", "WAYLAND_DISPLAY"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|d| !d.is_empty()))
}

/// The daemon's URL without a trailing `/`, for a browser: only http(s).
fn console_base(api_url: &str) -> anyhow::Result<String> {
    let base = api_url.trim_end_matches('/');
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        bail!(
            "the console is served on the daemon's TCP address, and {api_url} is not one: \
             run zygoted with --listen HOST:PORT and pass --url http://HOST:PORT"
        );
    }
    Ok(base.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_console_needs_an_http_address() {
        assert_eq!(
            console_base("http://127.0.0.1:7420/").unwrap(),
            "http://127.0.0.1:7420"
        );
        assert_eq!(console_base("https://h:1").unwrap(), "https://h:1");
        let err = console_base("unix:///run/z.sock").unwrap_err().to_string();
        assert!(err.contains("--listen"), "{err}");
    }
}
