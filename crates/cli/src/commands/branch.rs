//! `zygote branch ID`: copy-on-write children of a running sandbox.
use std::collections::BTreeMap;

use zygote_api::client::{block_on, Method};
use zygote_api::model::{BranchEvent, BranchRequest, BranchResponse};

use super::daemon_client::{print_json, ApiArgs};
use super::progress::Steps;

#[derive(clap::Args)]
pub struct BranchArgs {
    /// Parent sandbox id.
    id: String,
    /// Number of children.
    #[arg(long, short = 'c', default_value_t = 1)]
    count: u32,
    /// Children's TTL in seconds (default: the parent's).
    #[arg(long, value_name = "SECS")]
    ttl: Option<u64>,
    /// Environment variable for every child's commands, on top of the parent's
    /// (KEY=VALUE, or KEY to pass this shell's value; repeatable).
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// One value per child: child i gets KEY=Vi (exactly --count values; repeatable).
    #[arg(long = "env-each", value_name = "KEY=V0,V1,...")]
    env_each: Vec<String>,
    /// Keep the branch point's state so the children can be merged later (`zygote
    /// merge`); the qemu runtime always does.
    #[arg(long)]
    mergeable: bool,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

/// The per-child `env` of the branch request (None when no flag sets any).
fn child_envs(
    args: &BranchArgs,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Option<Vec<BTreeMap<String, String>>>> {
    if args.env.is_empty() && args.env_each.is_empty() {
        return Ok(None);
    }
    let mut common = BTreeMap::new();
    for kv in &args.env {
        let (k, v) = super::create::key_value("--env", kv, lookup)?;
        common.insert(k, v);
    }
    let mut envs = vec![common; args.count as usize];
    for spec in &args.env_each {
        let (key, values) = spec
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--env-each {spec:?}: want KEY=V0,V1,..."))?;
        let values: Vec<&str> = values.split(',').collect();
        if values.len() != args.count as usize {
            anyhow::bail!(
                "--env-each {key}: {} value(s) for {} children: give one per child",
                values.len(),
                args.count
            );
        }
        for (env, v) in envs.iter_mut().zip(values) {
            env.insert(key.to_string(), v.to_string());
        }
    }
    Ok(Some(envs))
}

pub fn run(args: BranchArgs) -> anyhow::Result<i32> {
    let client = args.api.client()?;
    let env = child_envs(&args, &|k| std::env::var(k).ok())?;
    // The streaming form: each child is shown as it comes up (a bar on a terminal, a
    // line per child otherwise), the summary is the same as the plain request's.
    let mut steps = (!args.json).then(|| Steps::new("children", args.count as usize));
    let mut summary: Option<anyhow::Result<BranchResponse>> = None;
    block_on(client.ndjson(
        Method::POST,
        &format!("/v1/sandboxes/{}/branch", args.id),
        Some(&BranchRequest {
            count: Some(args.count),
            ttl_secs: args.ttl,
            env,
            mergeable: Some(args.mergeable),
            metadata: None,
            stream: Some(true),
        }),
        |ev: BranchEvent| match ev {
            BranchEvent::Point {
                branch_point,
                pause_ms,
                ..
            } => {
                if let Some(s) = &steps {
                    s.note(&format!(
                        "branch point {branch_point} taken (parent paused {})",
                        pause_ms.map_or("-".into(), |p| format!("{p:.1} ms"))
                    ));
                }
            }
            BranchEvent::Child { id, ms, .. } => {
                if let Some(s) = &mut steps {
                    s.step(format!("{id} ready after {ms} ms"));
                }
            }
            BranchEvent::ChildFailed {
                index, error, ms, ..
            } => {
                if let Some(s) = &mut steps {
                    s.step(format!("child {index} failed after {ms} ms: {error}"));
                }
            }
            BranchEvent::Done(r) => summary = Some(Ok(r)),
            BranchEvent::Error { code, message } => {
                summary = Some(Err(anyhow::anyhow!("{message} ({code})")))
            }
        },
    ))?;
    if let Some(s) = steps {
        s.finish();
    }
    let res = summary.unwrap_or_else(|| {
        Err(anyhow::anyhow!(
            "the daemon's stream ended without a summary"
        ))
    })?;
    if args.json {
        print_json(&res)?;
    } else {
        for c in &res.children {
            println!("{c}");
        }
        for f in &res.failed {
            eprintln!("child {} did not come up: {}", f.index, f.error);
        }
        eprintln!(
            "branched {} of {} in {} ms (branch point {})",
            res.children.len(),
            args.count,
            res.duration_ms,
            res.branch_point
        );
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        branch: BranchArgs,
    }

    fn envs(argv: &[&str]) -> anyhow::Result<Option<Vec<BTreeMap<String, String>>>> {
        let cli = Cli::try_parse_from(std::iter::once("branch").chain(argv.iter().copied()))?;
        child_envs(&cli.branch, &|k| {
            (k == "FROM_SHELL").then(|| "s".to_string())
        })
    }

    #[test]
    fn every_child_gets_the_common_env_and_its_own_values() {
        assert_eq!(envs(&["sb-1", "-c", "2"]).unwrap(), None);
        let e = envs(&[
            "sb-1",
            "-c",
            "3",
            "-e",
            "A=1",
            "-e",
            "FROM_SHELL",
            "--env-each",
            "SEED=7,8,9",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(e.len(), 3);
        for (i, env) in e.iter().enumerate() {
            assert_eq!(env["A"], "1");
            assert_eq!(env["FROM_SHELL"], "s");
            assert_eq!(env["SEED"], (7 + i).to_string());
        }
    }

    #[test]
    fn a_wrong_number_of_values_is_refused() {
        let e = envs(&["sb-1", "-c", "2", "--env-each", "SEED=1,2,3"]).unwrap_err();
        assert!(e.to_string().contains("3 value(s) for 2 children"), "{e}");
        let e = envs(&["sb-1", "--env-each", "SEED"]).unwrap_err();
        assert!(e.to_string().contains("want KEY=V0,V1"), "{e}");
        let e = envs(&["sb-1", "-e", "UNSET_IN_SHELL"]).unwrap_err();
        assert!(e.to_string().contains("not set in this shell"), "{e}");
    }
}
