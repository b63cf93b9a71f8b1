//! `zygote ttl ID SECS|none`: reset or clear a sandbox's time-to-live.
use zygote_api::client::{block_on, Method};
use zygote_api::model::{Sandbox, SetTtlRequest, TtlAction};

use super::daemon_client::{expires_in, print_json, ApiArgs};

#[derive(clap::Args)]
pub struct TtlArgs {
    /// Sandbox id.
    id: String,
    /// Seconds from now until the daemon deletes the sandbox, or `none` to
    /// keep it until `zygote rm`.
    #[arg(value_name = "SECS|none", value_parser = parse_ttl)]
    ttl: Ttl,
    /// What the TTL running out does from now on: delete or pause (unchanged if absent).
    #[arg(long, value_enum, value_name = "ACTION")]
    action: Option<super::create::TtlActionArg>,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

/// `Option<u64>` as clap would read it as "the argument may be left out";
/// here the argument is required and `none` is one of its values.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Ttl(Option<u64>);

fn parse_ttl(s: &str) -> Result<Ttl, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(Ttl(None));
    }
    s.parse()
        .map(|secs| Ttl(Some(secs)))
        .map_err(|_| format!("{s:?} is neither a number of seconds nor `none`"))
}

pub fn run(args: TtlArgs) -> anyhow::Result<i32> {
    let body = SetTtlRequest {
        ttl_secs: args.ttl.0,
        ttl_action: args.action.map(super::create::TtlActionArg::action),
    };
    let sandbox: Sandbox = block_on(args.api.client()?.json(
        Method::PUT,
        &format!("/v1/sandboxes/{}/ttl", args.id),
        Some(&body),
    ))?;
    let action = match sandbox.ttl_action {
        TtlAction::Delete => "deleted",
        TtlAction::Pause => "paused",
    };
    if args.json {
        print_json(&sandbox)?;
    } else if sandbox.expires_at.is_some() {
        println!(
            "{} expires {} (then {action})",
            sandbox.id,
            expires_in(sandbox.expires_at)
        );
    } else if let (Some(left), Some(_)) = (sandbox.ttl_left_secs, sandbox.paused_at) {
        println!(
            "{} is paused; once resumed it has {left}s (then {action})",
            sandbox.id
        );
    } else {
        println!("{} has no TTL", sandbox.id);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_argument() {
        assert_eq!(parse_ttl("30"), Ok(Ttl(Some(30))));
        assert_eq!(parse_ttl("none"), Ok(Ttl(None)));
        assert_eq!(parse_ttl("NONE"), Ok(Ttl(None)));
        assert!(parse_ttl("-1").is_err());
        assert!(parse_ttl("soon").is_err());
    }
}
