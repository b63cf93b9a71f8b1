//! `zygote ps`: list sandboxes.
use zygote_api::client::{block_on, Method};
use zygote_api::model::{Origin, SandboxList};

use super::daemon_client::{age, expires_in, print_list, ApiArgs};

#[derive(clap::Args)]
pub struct PsArgs {
    /// Only sandboxes whose metadata has KEY=VALUE (repeatable: all must match), e.g.
    /// `--filter zygote.parent=sb-...` for a sandbox's branch children.
    #[arg(long, short = 'f', value_name = "KEY=VALUE")]
    filter: Vec<String>,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

/// `/v1/sandboxes` with one `metadata=KEY=VALUE` query parameter per filter.
fn list_path(filters: &[String]) -> anyhow::Result<String> {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for f in filters {
        if !f.contains('=') {
            anyhow::bail!("--filter {f:?}: want KEY=VALUE");
        }
        query.append_pair("metadata", f);
    }
    let query = query.finish();
    Ok(if query.is_empty() {
        "/v1/sandboxes".into()
    } else {
        format!("/v1/sandboxes?{query}")
    })
}

pub fn run(args: PsArgs) -> anyhow::Result<i32> {
    let list: SandboxList = block_on(args.api.client()?.json(
        Method::GET,
        &list_path(&args.filter)?,
        None::<&()>,
    ))?;
    let headers = [
        "ID", "NAME", "RUNTIME", "PID", "ORIGIN", "AGE", "EXPIRES", "STATE",
    ];
    print_list(&list, args.json, &headers, &list.sandboxes, |s| {
        let origin = match &s.origin {
            Origin::Image { name, .. } => format!("image {name}"),
            Origin::Snapshot { id } => format!("snapshot {id}"),
            Origin::Branch { parent, .. } => format!("branch of {parent}"),
        };
        let state = match (&s.exit_reason, s.paused_at) {
            (Some(r), _) if s.state == "dead" => format!("dead: {r}"),
            (_, Some(at)) => format!("paused {} ago", age(at)),
            _ => s.state.clone(),
        };
        // A paused sandbox's TTL stands still: what it has once resumed.
        let expires = match (s.paused_at, s.ttl_left_secs) {
            (Some(_), Some(left)) => format!("{left}s after resume"),
            _ => expires_in(s.expires_at),
        };
        vec![
            s.id.clone(),
            s.name.clone().unwrap_or_default(),
            s.runtime.clone(),
            s.pid.map(|p| p.to_string()).unwrap_or_default(),
            origin,
            age(s.created_at),
            expires,
            state,
        ]
    })?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::list_path;

    #[test]
    fn filters_become_metadata_query_parameters() {
        assert_eq!(list_path(&[]).unwrap(), "/v1/sandboxes");
        assert_eq!(
            list_path(&["team=a b".into(), "zygote.parent=sb-1".into()]).unwrap(),
            "/v1/sandboxes?metadata=team%3Da+b&metadata=zygote.parent%3Dsb-1"
        );
        assert!(list_path(&["novalue".into()]).is_err());
    }
}
