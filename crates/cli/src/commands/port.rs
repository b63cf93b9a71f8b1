//! `zygote port`: expose a sandbox's guest ports through the daemon's proxy.
use zygote_api::client::{block_on, Method};
use zygote_api::model::{ExposePortRequest, ExposedPort, PortList};

use super::daemon_client::{print_json, print_list, ApiArgs};

#[derive(clap::Subcommand)]
pub enum PortCommand {
    /// Make a guest port reachable through the daemon's proxy; prints its URL.
    Expose {
        /// Sandbox id.
        sandbox: String,
        /// Port inside the guest.
        #[arg(value_parser = clap::value_parser!(u16).range(1..))]
        port: u16,
        /// Reachable without the API token (by default the proxy wants
        /// `Authorization: Bearer <token>`, the token of the API).
        #[arg(long)]
        public: bool,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// List a sandbox's exposed ports.
    Ls {
        /// Sandbox id.
        sandbox: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Stop exposing a port.
    Rm {
        /// Sandbox id.
        sandbox: String,
        #[arg(value_parser = clap::value_parser!(u16).range(1..))]
        port: u16,
        #[command(flatten)]
        api: ApiArgs,
    },
}

pub fn run(cmd: PortCommand) -> anyhow::Result<i32> {
    match cmd {
        PortCommand::Expose {
            sandbox,
            port,
            public,
            json,
            api,
        } => {
            let exposed: ExposedPort = block_on(api.client()?.json(
                Method::POST,
                &format!("/v1/sandboxes/{sandbox}/ports"),
                Some(&ExposePortRequest {
                    port: port.into(),
                    public,
                }),
            ))?;
            if json {
                print_json(&exposed)?;
            } else {
                println!("{}", exposed.url);
                eprintln!("{}", access_note(&exposed));
            }
        }
        PortCommand::Ls { sandbox, json, api } => {
            let list: PortList = block_on(api.client()?.json(
                Method::GET,
                &format!("/v1/sandboxes/{sandbox}/ports"),
                None::<&()>,
            ))?;
            let headers = ["PORT", "PUBLIC", "URL", "PATH URL"];
            print_list(&list, json, &headers, &list.ports, |p| {
                vec![
                    p.port.to_string(),
                    if p.public { "yes" } else { "no" }.to_string(),
                    p.url.clone(),
                    p.path_url.clone(),
                ]
            })?;
        }
        PortCommand::Rm { sandbox, port, api } => {
            block_on(api.client()?.raw(
                Method::DELETE,
                &format!("/v1/sandboxes/{sandbox}/ports/{port}"),
                None,
            ))?;
        }
    }
    Ok(0)
}

/// Whether requests need the token, and where else the port answers (the path form,
/// which puts every sandbox on one browser origin: the printed URL is the one to open).
fn access_note(p: &ExposedPort) -> String {
    let access = match p.public {
        true => "public: no token needed",
        false => "requests need the API token (Authorization: Bearer <token>)",
    };
    format!(
        "{access}; also at {} for clients that cannot resolve *.localhost (one browser \
         origin shared by every sandbox: open the URL above in a browser)",
        p.path_url
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use serde_json::json;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(subcommand)]
        port: PortCommand,
    }

    #[test]
    fn ports_are_checked_by_the_parser() {
        let cli = Cli::try_parse_from(["zygote", "expose", "sb-1", "8080", "--public"]).unwrap();
        assert!(matches!(
            cli.port,
            PortCommand::Expose {
                port: 8080,
                public: true,
                ..
            }
        ));
        let cli = Cli::try_parse_from(["zygote", "rm", "sb-1", "65535"]).unwrap();
        assert!(matches!(cli.port, PortCommand::Rm { port: 65535, .. }));
        for bad in ["0", "65536", "-1", "http"] {
            assert!(
                Cli::try_parse_from(["zygote", "expose", "sb-1", bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_api_answer_parses() {
        let list: PortList = serde_json::from_value(json!({"ports": [{
            "port": 8080,
            "public": false,
            "url": "http://8080-sb-1.localhost:7421",
            "path_url": "http://127.0.0.1:7421/sandboxes/sb-1/ports/8080/",
        }]}))
        .unwrap();
        let p = &list.ports[0];
        assert_eq!((p.port, p.public), (8080, false));
        assert!(
            access_note(p).contains("need the API token"),
            "{}",
            access_note(p)
        );
    }
}
