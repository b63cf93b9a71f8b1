//! `zygote cp`: copy a file into or out of a sandbox (`ID:/path` names the
//! sandbox side).
use anyhow::Context;
use zygote_api::client::{block_on, Method};

use super::daemon_client::ApiArgs;

#[derive(clap::Args)]
pub struct CpArgs {
    /// Source: a local path or ID:/path.
    src: String,
    /// Destination: a local path or ID:/path.
    dst: String,
    /// Permission bits for a file written in the sandbox (octal).
    #[arg(long)]
    mode: Option<String>,
    #[command(flatten)]
    api: ApiArgs,
}

/// `ID:/abs/path` -> (ID, path); local paths (incl. ./a:b) -> None.
fn remote(spec: &str) -> Option<(&str, &str)> {
    let (id, path) = spec.split_once(':')?;
    (!id.is_empty() && !id.contains('/') && path.starts_with('/')).then_some((id, path))
}

fn query(path: &str) -> String {
    let mut q = String::new();
    for b in path.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'-' | b'_' | b'.' | b'~' => {
                q.push(b as char)
            }
            _ => q.push_str(&format!("%{b:02X}")),
        }
    }
    q
}

pub fn run(args: CpArgs) -> anyhow::Result<i32> {
    let client = args.api.client()?;
    match (remote(&args.src), remote(&args.dst)) {
        (None, Some((id, path))) => {
            let data = std::fs::read(&args.src).with_context(|| format!("reading {}", args.src))?;
            let mut url = format!("/v1/sandboxes/{id}/files?path={}", query(path));
            if let Some(m) = &args.mode {
                url.push_str(&format!("&mode={m}"));
            }
            block_on(client.raw(
                Method::PUT,
                &url,
                Some((data.into(), "application/octet-stream")),
            ))?;
        }
        (Some((id, path)), None) => {
            let url = format!("/v1/sandboxes/{id}/files?path={}", query(path));
            let data = block_on(client.raw(Method::GET, &url, None))?;
            if args.dst == "-" {
                use std::io::Write;
                std::io::stdout().write_all(&data)?;
            } else {
                std::fs::write(&args.dst, &data)
                    .with_context(|| format!("writing {}", args.dst))?;
            }
        }
        _ => anyhow::bail!("exactly one of SRC and DST must be ID:/absolute/path"),
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_specs() {
        assert_eq!(remote("sb-1:/tmp/x"), Some(("sb-1", "/tmp/x")));
        assert_eq!(remote("./a:/b"), None);
        assert_eq!(remote("local.txt"), None);
        assert_eq!(remote("sb-1:relative"), None);
        assert_eq!(query("/a b&c"), "/a%20b%26c");
    }
}
