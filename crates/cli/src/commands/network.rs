//! A sandbox's network policy flags (`zygote create` takes them too) and
//! `zygote network set ID ...`: replace a running or paused sandbox's policy.
use zygote_api::client::{block_on, Method};
use zygote_api::model::{NetworkMode, Sandbox, SetNetworkRequest};

use super::daemon_client::{print_json, ApiArgs};

#[derive(clap::Args, Debug, Default)]
pub struct PolicyArgs {
    /// Network: egress (the default) or none. Branch children inherit the
    /// network policy.
    #[arg(long, value_enum)]
    pub network: Option<Network>,
    /// Allow outbound traffic only to this IPv4 CIDR or address, or this domain name
    /// (`pypi.org`, `*.github.com`, optionally `:port`; TCP 80 and 443 by default)
    /// (repeatable). Only names listed here resolve.
    #[arg(long = "allow-out", value_name = "CIDR|NAME")]
    pub allow_out: Vec<String>,
    /// Refuse outbound traffic to this IPv4 CIDR or address, or this domain name, even
    /// if allowed (repeatable).
    #[arg(long = "deny-out", value_name = "CIDR|NAME")]
    pub deny_out: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Network {
    /// Outbound connections through NAT (narrowed by --allow-out / --deny-out).
    Egress,
    /// No network traffic.
    None,
}

impl PolicyArgs {
    pub fn mode(&self) -> Option<NetworkMode> {
        self.network.map(|n| match n {
            Network::Egress => NetworkMode::Egress,
            Network::None => NetworkMode::None,
        })
    }

    fn request(&self) -> SetNetworkRequest {
        SetNetworkRequest {
            network: self.mode(),
            allow_out: given(&self.allow_out),
            deny_out: given(&self.deny_out),
        }
    }
}

/// A repeatable flag's values, None when it was not given (the daemon's default).
pub fn given(v: &[String]) -> Option<Vec<String>> {
    (!v.is_empty()).then(|| v.to_vec())
}

#[derive(clap::Subcommand)]
pub enum NetworkCommand {
    /// Replace a running or paused sandbox's network policy (flags left out are the
    /// defaults: egress, no list). In force for new connections when this returns;
    /// branch children made later inherit it.
    Set {
        /// Sandbox id.
        sandbox: String,
        #[command(flatten)]
        policy: PolicyArgs,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
}

pub fn run(cmd: NetworkCommand) -> anyhow::Result<i32> {
    let NetworkCommand::Set {
        sandbox,
        policy,
        json,
        api,
    } = cmd;
    let s: Sandbox = block_on(api.client()?.json(
        Method::PUT,
        &format!("/v1/sandboxes/{sandbox}/network"),
        Some(&policy.request()),
    ))?;
    if json {
        print_json(&s)?;
    } else {
        let list = |v: &[String]| match v.is_empty() {
            true => "-".to_string(),
            false => v.join(","),
        };
        println!(
            "{}: network {}, allow-out {}, deny-out {}",
            s.id,
            s.network.mode.as_str(),
            list(&s.network.allow_out),
            list(&s.network.deny_out)
        );
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use serde_json::json;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(subcommand)]
        network: NetworkCommand,
    }

    fn body_of(args: &[&str]) -> serde_json::Value {
        let cli = Cli::try_parse_from([&["zygote", "set", "sb-1"], args].concat()).unwrap();
        let NetworkCommand::Set { policy, .. } = cli.network;
        serde_json::to_value(policy.request()).unwrap()
    }

    #[test]
    fn set_sends_only_the_flags_given() {
        assert_eq!(body_of(&[]), json!({}));
        assert_eq!(
            body_of(&["--deny-out", "10.0.0.0/8", "--deny-out", "1.2.3.4"]),
            json!({"deny_out": ["10.0.0.0/8", "1.2.3.4"]})
        );
        assert_eq!(body_of(&["--network", "none"]), json!({"network": "none"}));
        assert!(Cli::try_parse_from(["zygote", "set"]).is_err());
    }
}
