//! `zygote create`: start sandboxes through the daemon.
use std::collections::BTreeMap;

use zygote_api::client::{block_on, Client, Method};
use zygote_api::model::{
    CreateEvent, CreateSandboxRequest, Limits, SandboxList, SecretSpec, TtlAction,
};

use super::daemon_client::{age, expires_in, print_json, print_table, spinner, ApiArgs};
use super::progress::Steps;

#[derive(clap::Args)]
pub struct CreateArgs {
    /// Image to boot (default: minimal).
    #[arg(long, conflicts_with = "snapshot")]
    image: Option<String>,
    /// Snapshot to start from instead of an image.
    #[arg(long)]
    snapshot: Option<String>,
    /// Name (also the guest hostname).
    #[arg(long)]
    name: Option<String>,
    /// How many sandboxes.
    #[arg(short = 'n', long, default_value_t = 1)]
    count: u32,
    #[arg(long)]
    mem_mib: Option<u32>,
    #[arg(long)]
    vcpus: Option<u32>,
    /// cgroup memory.max for the VM process, MiB.
    #[arg(long)]
    memory_limit_mib: Option<u64>,
    /// cgroup cpu.max as percent of one CPU.
    #[arg(long)]
    cpu_percent: Option<u32>,
    /// cgroup pids.max.
    #[arg(long)]
    pids_limit: Option<u64>,
    /// Delete the sandbox(es) this many seconds after they are running
    /// (change it later with `zygote ttl`; `--ttl-action pause` pauses instead).
    #[arg(long, value_name = "SECS")]
    ttl: Option<u64>,
    /// What the TTL running out does: delete (the default) or pause (to disk; `zygote
    /// resume` brings it back with a whole TTL).
    #[arg(long, value_enum, value_name = "ACTION")]
    ttl_action: Option<TtlActionArg>,
    /// Exec and file calls on the sandbox while it is paused resume it first (without
    /// it they are refused until `zygote resume`).
    #[arg(long)]
    auto_resume: bool,
    #[command(flatten)]
    net: super::network::PolicyArgs,
    /// Environment variable for every command in the sandbox, KEY=VALUE (repeatable;
    /// `-e KEY` takes the value from this shell). Branch children inherit it.
    #[arg(short = 'e', long = "env", value_name = "KEY[=VALUE]")]
    env: Vec<String>,
    /// Like --env, but never shown by the daemon (repeatable; `--secret KEY` takes the
    /// value from this shell, keeping it off the command line). Children inherit it.
    #[arg(long = "secret", value_name = "KEY[=VALUE]")]
    secret: Vec<String>,
    /// A secret that branch children do not get (repeatable).
    #[arg(long = "secret-not-inherited", value_name = "KEY[=VALUE]")]
    secret_not_inherited: Vec<String>,
    /// Binds secret KEY to HOST (a name or `*.` wildcard, `:PORT` optional, 443 when
    /// absent; repeatable): the guest then sees a placeholder and the sandbox's egress
    /// proxy puts the value into HTTPS requests to HOST only.
    #[arg(long = "secret-host", value_name = "KEY=HOST")]
    secret_host: Vec<String>,
    /// A label on the sandbox, kept by its branch children; `zygote ps --filter
    /// KEY=VALUE` finds it (repeatable).
    #[arg(
        short = 'l',
        long = "metadata",
        visible_alias = "label",
        value_name = "KEY=VALUE"
    )]
    metadata: Vec<String>,
    /// Mount a named volume, NAME:/path (repeatable; `zygote volume create` makes one).
    /// This sandbox writes it; its branch children get a copy-on-write view.
    #[arg(short = 'v', long = "volume", value_name = "NAME:/PATH")]
    volume: Vec<String>,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

pub fn run(args: CreateArgs) -> anyhow::Result<i32> {
    let client = args.api.client()?;
    let body = request_body(&args, &|k| std::env::var(k).ok())?;
    let made = if args.count > 1 {
        create_streamed(&client, body, args.count, args.json)?
    } else {
        let pb = (!args.json).then(|| spinner("starting a sandbox"));
        let made: Result<SandboxList, _> =
            block_on(client.json(Method::POST, "/v1/sandboxes", Some(&body)));
        if let Some(pb) = pb {
            pb.finish_and_clear();
        }
        made?
    };
    if args.json {
        print_json(&made)?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = made
        .sandboxes
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                s.name.clone().unwrap_or_default(),
                s.state.clone(),
                s.pid.map(|p| p.to_string()).unwrap_or_default(),
                s.network.address.clone().unwrap_or_else(|| "-".into()),
                age(s.created_at),
                expires_in(s.expires_at),
            ]
        })
        .collect();
    print_table(
        &["ID", "NAME", "STATE", "PID", "ADDRESS", "AGE", "EXPIRES"],
        &rows,
    );
    for s in &made.sandboxes {
        for (limit, why) in &s.cgroup.not_applied {
            eprintln!("zygote: {}: {limit} not applied: {why}", s.id);
        }
    }
    Ok(0)
}

/// A fan-out through the streaming form: each sandbox is shown as it comes up (a bar on
/// a terminal, a line per sandbox otherwise); the answer is the plain request's.
fn create_streamed(
    client: &Client,
    mut body: CreateSandboxRequest,
    count: u32,
    json: bool,
) -> anyhow::Result<SandboxList> {
    body.stream = Some(true);
    let mut steps = (!json).then(|| Steps::new("sandboxes", count as usize));
    let mut outcome: Option<anyhow::Result<SandboxList>> = None;
    block_on(client.ndjson(
        Method::POST,
        "/v1/sandboxes",
        Some(&body),
        |ev: CreateEvent| match ev {
            CreateEvent::Accepted { ms, .. } => {
                if let Some(s) = &steps {
                    s.note(&format!(
                        "{count} sandboxes recorded after {ms} ms, booting"
                    ));
                }
            }
            CreateEvent::Sandbox { id, ms, .. } => {
                if let Some(s) = &mut steps {
                    s.step(format!("{id} running after {ms} ms"));
                }
            }
            CreateEvent::SandboxFailed {
                index, error, ms, ..
            } => {
                if let Some(s) = &mut steps {
                    s.step(format!("sandbox {index} failed after {ms} ms: {error}"));
                }
            }
            CreateEvent::Done { sandboxes } => outcome = Some(Ok(SandboxList { sandboxes })),
            CreateEvent::Error { code, message } => {
                outcome = Some(Err(anyhow::anyhow!("{message} ({code})")))
            }
        },
    ))?;
    if let Some(s) = steps {
        s.finish();
    }
    outcome.unwrap_or_else(|| {
        Err(anyhow::anyhow!(
            "the daemon's stream ended without an answer"
        ))
    })
}

/// `KEY=VALUE`, or `KEY` with the value from `lookup` (this process's environment).
pub(super) fn key_value(
    flag: &str,
    arg: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<(String, String)> {
    match arg.split_once('=') {
        Some((k, v)) => Ok((k.to_string(), v.to_string())),
        None => lookup(arg).map(|v| (arg.to_string(), v)).ok_or_else(|| {
            anyhow::anyhow!("{flag} {arg}: no value given and {arg} is not set in this shell")
        }),
    }
}

/// The `POST /v1/sandboxes` request: only the options given (the daemon has the
/// defaults), limits always as an object.
fn request_body(
    args: &CreateArgs,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<CreateSandboxRequest> {
    let (image, snapshot) = match &args.snapshot {
        Some(s) => (None, Some(s.clone())),
        None => (
            Some(args.image.as_deref().unwrap_or("minimal").to_string()),
            None,
        ),
    };
    let envs = args
        .env
        .iter()
        .map(|a| key_value("--env", a, lookup))
        .collect::<anyhow::Result<BTreeMap<_, _>>>()?;
    let mut secrets = (args.secret.iter().map(|a| (a, true)))
        .chain(args.secret_not_inherited.iter().map(|a| (a, false)))
        .map(|(a, inherit)| {
            let (k, value) = key_value("--secret", a, lookup)?;
            let hosts = None;
            Ok((
                k,
                SecretSpec {
                    value,
                    inherit,
                    hosts,
                },
            ))
        })
        .collect::<anyhow::Result<BTreeMap<String, SecretSpec>>>()?;
    for a in &args.secret_host {
        let (k, host) = a
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--secret-host {a:?}: want KEY=HOST"))?;
        let secret = secrets.get_mut(k).ok_or_else(|| {
            anyhow::anyhow!("--secret-host {a:?}: {k} is not given with --secret")
        })?;
        secret
            .hosts
            .get_or_insert_with(Vec::new)
            .push(host.to_string());
    }
    let metadata = args
        .metadata
        .iter()
        .map(|a| {
            a.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| anyhow::anyhow!("--metadata {a:?}: want KEY=VALUE"))
        })
        .collect::<anyhow::Result<BTreeMap<_, _>>>()?;
    let volumes = args
        .volume
        .iter()
        .map(|v| super::volume::parse_mount(v))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(CreateSandboxRequest {
        image,
        snapshot,
        name: args.name.clone(),
        n: Some(args.count),
        mem_mib: args.mem_mib,
        vcpus: args.vcpus,
        limits: Limits {
            memory_mib: args.memory_limit_mib,
            cpu_percent: args.cpu_percent,
            pids: args.pids_limit,
        },
        ttl_secs: args.ttl,
        ttl_action: args.ttl_action.map(TtlActionArg::action),
        auto_resume: args.auto_resume.then_some(true),
        network: args.net.mode(),
        allow_out: super::network::given(&args.net.allow_out),
        deny_out: super::network::given(&args.net.deny_out),
        envs: (!envs.is_empty()).then_some(envs),
        secrets: (!secrets.is_empty()).then_some(secrets),
        metadata: (!metadata.is_empty()).then_some(metadata),
        stream: None,
        volumes: (!volumes.is_empty()).then_some(volumes),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use serde_json::json;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        create: CreateArgs,
    }

    /// The request `argv` makes, as it goes on the wire.
    fn body_of(argv: &[&str]) -> serde_json::Value {
        let cli = Cli::try_parse_from(std::iter::once("zygote").chain(argv.iter().copied()))
            .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        let request = request_body(&cli.create, &|k| {
            (k == "FROM_SHELL").then(|| "shell".to_string())
        })
        .unwrap();
        serde_json::to_value(request).unwrap()
    }

    #[test]
    fn pause_options_are_sent_only_when_given() {
        let body = body_of(&["--auto-resume", "--ttl-action", "pause", "--ttl", "60"]);
        assert_eq!(body["auto_resume"], json!(true));
        assert_eq!(body["ttl_action"], json!("pause"));
        assert_eq!(body["ttl_secs"], json!(60));
        let plain = body_of(&[]);
        assert!(plain.get("auto_resume").is_none() && plain.get("ttl_action").is_none());
        assert!(Cli::try_parse_from(["zygote", "--ttl-action", "stop"]).is_err());
    }

    #[test]
    fn network_flags_are_sent_only_when_given() {
        let plain = body_of(&[]);
        assert_eq!(plain, json!({"n": 1, "limits": {}, "image": "minimal"}));
        let body = body_of(&[
            "--network",
            "egress",
            "--allow-out",
            "10.77.0.0/24",
            "--allow-out",
            "1.2.3.4",
            "--deny-out",
            "10.77.0.9/32",
        ]);
        assert_eq!(body["network"], json!("egress"));
        assert_eq!(body["allow_out"], json!(["10.77.0.0/24", "1.2.3.4"]));
        assert_eq!(body["deny_out"], json!(["10.77.0.9/32"]));
        let none = body_of(&["--network", "none", "--snapshot", "snap-1"]);
        assert_eq!(
            none,
            json!({"n": 1, "limits": {}, "snapshot": "snap-1", "network": "none"})
        );
        assert!(Cli::try_parse_from(["zygote", "--network", "bridged"]).is_err());
    }

    #[test]
    fn volume_mounts_are_name_colon_path() {
        let body = body_of(&["-v", "data:/data", "--volume", "vol-1:/mnt/x"]);
        assert_eq!(
            body["volumes"],
            json!([{"name": "data", "path": "/data"}, {"name": "vol-1", "path": "/mnt/x"}])
        );
        assert!(body_of(&[]).get("volumes").is_none());
        for bad in ["data", ":/data", "data:rel"] {
            let cli = Cli::try_parse_from(["zygote", "-v", bad]).unwrap();
            let e = request_body(&cli.create, &|_| None).unwrap_err();
            assert!(e.to_string().contains("NAME:/absolute/path"), "{bad}: {e}");
        }
    }

    #[test]
    fn metadata_labels_are_key_value_pairs() {
        let body = body_of(&["--metadata", "team=search", "-l", "q=a=b", "--label", "x="]);
        assert_eq!(
            body["metadata"],
            json!({"team": "search", "q": "a=b", "x": ""})
        );
        assert!(body_of(&[]).get("metadata").is_none());
        let cli = Cli::try_parse_from(["zygote", "--metadata", "novalue"]).unwrap();
        let e = request_body(&cli.create, &|_| None).unwrap_err();
        assert!(e.to_string().contains("want KEY=VALUE"), "{e}");
    }

    #[test]
    fn env_and_secrets_take_values_inline_or_from_the_shell() {
        let body = body_of(&[
            "-e",
            "A=1",
            "--env",
            "FROM_SHELL",
            "--secret",
            "TOKEN=t",
            "--secret-not-inherited",
            "FROM_SHELL",
        ]);
        assert_eq!(body["envs"], json!({"A": "1", "FROM_SHELL": "shell"}));
        assert_eq!(
            body["secrets"],
            json!({"TOKEN": {"value": "t", "inherit": true},
                   "FROM_SHELL": {"value": "shell", "inherit": false}})
        );
        let cli = Cli::try_parse_from(["zygote", "-e", "UNSET_ANYWHERE"]).unwrap();
        let err = request_body(&cli.create, &|_| None).unwrap_err();
        assert!(err.to_string().contains("not set in this shell"), "{err}");
    }

    #[test]
    fn secrets_are_bound_to_hosts_by_name() {
        let body = body_of(&[
            "--secret",
            "OPENAI_API_KEY=sk",
            "--secret-host",
            "OPENAI_API_KEY=api.openai.com",
            "--secret-host",
            "OPENAI_API_KEY=*.openai.azure.com:8443",
        ]);
        assert_eq!(
            body["secrets"],
            json!({"OPENAI_API_KEY": {"value": "sk", "inherit": true,
                   "hosts": ["api.openai.com", "*.openai.azure.com:8443"]}})
        );
        for bad in ["OTHER=api.openai.com", "no-equals"] {
            let cli =
                Cli::try_parse_from(["zygote", "--secret", "K=v", "--secret-host", bad]).unwrap();
            let err = request_body(&cli.create, &|_| None).unwrap_err();
            assert!(err.to_string().contains("--secret-host"), "{err}");
        }
    }
}

/// `--ttl-action`: what a TTL running out does.
#[derive(Clone, Copy, Debug, PartialEq, clap::ValueEnum)]
pub enum TtlActionArg {
    Delete,
    Pause,
}

impl TtlActionArg {
    pub fn action(self) -> TtlAction {
        match self {
            TtlActionArg::Delete => TtlAction::Delete,
            TtlActionArg::Pause => TtlAction::Pause,
        }
    }
}
