//! One sandbox's lifecycle the E2B way: create, get_info, kill, connect (resuming a
//! paused sandbox), set_timeout, pause, update_network.
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ipnet::Ipv4Net;

use super::{answer, domain, json_body, listed, timeout_secs, visible, ControlError};
use crate::api::AppState;
use crate::e2b::model::{
    ConnectSandbox, Lifecycle, NetworkConfig, NetworkInfo, NetworkUpdate, NewSandbox,
    SandboxDetail, SetTimeout,
};
use crate::e2b::EnvdKeys;
use crate::error::Error;
use crate::model::{
    CreateSandboxRequest, NameRule, NetworkMode, NetworkView, SetNetworkRequest, SetTtlRequest,
    TtlAction, VolumeMountSpec, MAX_TTL_SECS,
};

/// `POST /v2/sandboxes`: a sandbox from the image (or snapshot) `templateID` names.
pub(super) async fn create(
    State(st): State<AppState>,
    req: Request,
) -> Result<Response, ControlError> {
    let body: NewSandbox = json_body(req).await?;
    let template = body.template_id.clone();
    let ttl = timeout_secs(body.timeout)?;
    let (allow_out, deny_out) = egress(body.allow_internet_access, body.network.as_ref())?;
    // A template built through E2B's template API (`name[:tag]`) is a snapshot with
    // defaults (its ENV steps, under the caller's envVars); else a snapshot id; else an
    // image name or reference.
    let (snapshot, mut envs) = match super::templates::resolve(&st, &template)? {
        Some(build) => (build.snapshot, template_envs(build.defaults.as_deref())),
        None => (
            st.manager
                .snapshot_get(&template)
                .is_ok()
                .then(|| template.clone()),
            Default::default(),
        ),
    };
    envs.extend(body.env_vars.unwrap_or_default());
    let request = CreateSandboxRequest {
        image: snapshot
            .is_none()
            .then(|| image_of_template(&template).to_string()),
        snapshot,
        ttl_secs: Some(ttl),
        ttl_action: body.auto_pause.unwrap_or(false).then_some(TtlAction::Pause),
        envs: (!envs.is_empty()).then_some(envs),
        metadata: body.metadata.filter(|m| !m.is_empty()),
        allow_out,
        deny_out,
        volumes: body.volume_mounts.map(|mounts| {
            mounts
                .into_iter()
                .map(|m| VolumeMountSpec {
                    name: m.name,
                    path: m.path,
                    shared: None,
                })
                .collect()
        }),
        ..Default::default()
    };
    // In tasks of their own, as the REST API's create: a client that goes away does not
    // cut a create short between its records.
    let manager = st.manager.clone();
    let job = tokio::spawn(async move { manager.begin_create(request).await })
        .await
        .map_err(|e| Error::Internal(format!("create task failed: {e}")))?
        .map_err(|e| match e {
            Error::NotFound { what: "volume", id } => ControlError::VolumeNotFound(id),
            e if e.status_code().0 == StatusCode::NOT_FOUND => {
                ControlError::TemplateNotFound(template.clone())
            }
            _ => ControlError::Zygote(e),
        })?;
    let manager = st.manager.clone();
    let made = tokio::spawn(manager.finish_create(job, None))
        .await
        .map_err(|e| Error::Internal(format!("create task failed: {e}")))??;
    let sandbox = made
        .first()
        .ok_or_else(|| Error::Internal("create made no sandbox".into()))?;
    Ok((StatusCode::CREATED, Json(answer(&st, sandbox))).into_response())
}

/// The image an E2B template name that is no built template or snapshot boots: E2B's
/// public code interpreter template (the `e2b-code-interpreter` SDKs' default) is
/// zygote's `code-interpreter` image; any other name is an image name itself.
fn image_of_template(template: &str) -> &str {
    match template {
        "code-interpreter-v1" => "code-interpreter",
        other => other,
    }
}

/// The envs a template gives its sandboxes (its build's ENV steps).
fn template_envs(defaults: Option<&str>) -> std::collections::BTreeMap<String, String> {
    defaults
        .and_then(|d| serde_json::from_str::<super::templates_wire::Defaults>(d).ok())
        .map(|d| d.envs)
        .unwrap_or_default()
}

/// E2B's egress rules as zygote's policy. E2B lets through whatever `allowOut` names
/// and whatever `denyOut` does not (`allow_internet_access: false` denies
/// `0.0.0.0/0`); zygote's `allow_out` is a list of the only reachable destinations and
/// its `deny_out` wins over it. So: everything denied → `allow_out` = E2B's allowOut,
/// CIDRs and domain names (or `deny_out` = everything when there is none; a denied
/// name under an allow list is dropped: allow wins); otherwise `deny_out` = denyOut
/// minus allowOut (split into the CIDRs that remain) plus denyOut's names. A domain
/// name in allowOut next to a partial denyOut (an exception zygote's lists cannot
/// hold: deny wins) is refused (400), as is a malformed entry.
fn egress(internet: Option<bool>, net: Option<&NetworkConfig>) -> Result<Egress, ControlError> {
    let parse = |field: &str, list: Option<&Vec<String>>| -> Result<Rules, ControlError> {
        let mut rules = Rules::default();
        for s in list.into_iter().flatten() {
            if NameRule::looks_like_name(s) {
                let rule = NameRule::parse(s)
                    .map_err(|e| ControlError::BadRequest(format!("{field}: {e}")))?;
                rules.names.push(rule.to_string());
                continue;
            }
            let net = s
                .parse::<Ipv4Net>()
                .or_else(|_| s.parse::<std::net::Ipv4Addr>().map(Ipv4Net::from))
                .map_err(|_| {
                    ControlError::BadRequest(format!(
                        "{field} entry {s:?} is not an IPv4 address or CIDR, nor a domain name"
                    ))
                })?;
            rules.cidrs.push(net);
        }
        Ok(rules)
    };
    let allow = parse("allowOut", net.and_then(|n| n.allow_out.as_ref()))?;
    let mut deny = parse("denyOut", net.and_then(|n| n.deny_out.as_ref()))?;
    if internet == Some(false) {
        deny.cidrs.push(Ipv4Net::default());
    }
    let strings = |v: Vec<Ipv4Net>| v.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    if deny.cidrs.iter().any(|d| d.prefix_len() == 0) {
        return Ok(match allow.cidrs.is_empty() && allow.names.is_empty() {
            true => (None, Some(vec![Ipv4Net::default().to_string()])),
            false => {
                let mut list = strings(allow.cidrs);
                list.extend(allow.names);
                (Some(list), None)
            }
        });
    }
    if !allow.names.is_empty() {
        return Err(ControlError::BadRequest(
            "allowOut domain names need denyOut [\"0.0.0.0/0\"] (or allow_internet_access \
             false) here: zygote cannot make a named exception to a partial denyOut"
                .into(),
        ));
    }
    let mut left = Vec::new();
    for d in deny.cidrs {
        subtract(d, &allow.cidrs, &mut left);
    }
    let mut deny_out = strings(left);
    deny_out.extend(deny.names);
    Ok((None, (!deny_out.is_empty()).then_some(deny_out)))
}

/// One E2B list: its CIDRs and its domain names (checked, in zygote's spelling).
#[derive(Default)]
struct Rules {
    cidrs: Vec<Ipv4Net>,
    names: Vec<String>,
}

/// `allow_out` and `deny_out` of a [`CreateSandboxRequest`].
type Egress = (Option<Vec<String>>, Option<Vec<String>>);

/// Adds to `out` the parts of `net` that no net of `allow` covers.
fn subtract(net: Ipv4Net, allow: &[Ipv4Net], out: &mut Vec<Ipv4Net>) {
    if allow.iter().any(|a| a.contains(&net)) {
        return;
    }
    if !allow.iter().any(|a| net.contains(a)) {
        out.push(net);
        return;
    }
    // An allowed net lies inside: split in halves (a covered /32 returned above).
    if let Ok(halves) = net.subnets(net.prefix_len() + 1) {
        for half in halves {
            subtract(half, allow, out);
        }
    }
}

/// `GET /sandboxes/{id}` (`Sandbox.get_info`).
pub(super) async fn get_info(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<SandboxDetail>, ControlError> {
    let (s, _) = visible(&st, &id)?;
    let listed = listed(&st, &s).ok_or_else(|| ControlError::SandboxNotFound(id.clone()))?;
    Ok(Json(SandboxDetail {
        listed,
        envd_access_token: EnvdKeys::new(st.token.clone()).access_token(&s.id),
        domain: domain(&st),
        network: network_info(&s.network),
        lifecycle: Lifecycle {
            on_timeout: match s.ttl_action {
                TtlAction::Pause => "pause",
                TtlAction::Delete => "kill",
            },
            auto_resume: s.auto_resume,
        },
    }))
}

/// A sandbox's egress policy in E2B's terms: `network: none` is a deny of everything.
fn network_info(view: &NetworkView) -> NetworkInfo {
    let mut deny_out = view.deny_out.clone();
    if view.mode == NetworkMode::None && !deny_out.iter().any(|d| d == ALL_TRAFFIC) {
        deny_out.push(ALL_TRAFFIC.to_string());
    }
    NetworkInfo {
        allow_out: view.allow_out.clone(),
        deny_out,
    }
}

/// E2B's name for every IPv4 destination.
const ALL_TRAFFIC: &str = "0.0.0.0/0";

/// `DELETE /sandboxes/{id}` (`Sandbox.kill`): 204, or 404 (the SDK returns False).
pub(super) async fn kill(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ControlError> {
    st.manager
        .delete(&id)
        .await
        .map_err(|e| ControlError::about_sandbox(&id, e))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v2/sandboxes/{id}/connect`: 200 for a running sandbox, 201 after resuming a
/// paused one; a `timeout` only ever extends its deadline (E2B: "TTL is only
/// extended").
pub(super) async fn connect(
    State(st): State<AppState>,
    Path(id): Path<String>,
    req: Request,
) -> Result<Response, ControlError> {
    let body: ConnectSandbox = json_body(req).await?;
    let wanted = body.timeout.map(|t| timeout_secs(Some(t))).transpose()?;
    let about = |e| ControlError::about_sandbox(&id, e);
    let mut s = st.manager.get(&id).map_err(about)?;
    let mut status = StatusCode::OK;
    if s.paused_at.is_some() {
        s = st.manager.resume(&id).await.map_err(about)?;
        status = StatusCode::CREATED;
    }
    if let Some(wanted) = wanted {
        let left = s
            .expires_at
            .map(|e| e.saturating_sub(crate::manager::now()));
        if left.is_some_and(|l| l < wanted) {
            let ttl = SetTtlRequest {
                ttl_secs: Some(wanted),
                ttl_action: None,
            };
            s = st.manager.set_ttl(&id, ttl).await.map_err(about)?;
        }
    }
    Ok((status, Json(answer(&st, &s))).into_response())
}

/// `POST /sandboxes/{id}/timeout` (`set_timeout`): the deadline becomes now +
/// `timeout`, shorter or longer than before. As E2B's, a timeout of 0 or less ends the
/// sandbox now (here: in a second, zygote's shortest TTL) and a longer one than the
/// longest is cut to it; a paused sandbox is not among the running ones (404).
pub(super) async fn set_timeout(
    State(st): State<AppState>,
    Path(id): Path<String>,
    req: Request,
) -> Result<StatusCode, ControlError> {
    let body: SetTimeout = json_body(req).await?;
    if visible(&st, &id)?.1 != "running" {
        return Err(ControlError::SandboxNotFound(id));
    }
    let ttl = SetTtlRequest {
        ttl_secs: Some(body.timeout.clamp(1, MAX_TTL_SECS as i64) as u64),
        ttl_action: None,
    };
    st.manager
        .set_ttl(&id, ttl)
        .await
        .map_err(|e| ControlError::about_sandbox(&id, e))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/pause`: 204; 409 when it is paused already (the SDK then
/// returns False). E2B's `memory: false` (files only) is served as a full pause.
pub(super) async fn pause(
    State(st): State<AppState>,
    Path(id): Path<String>,
    req: Request,
) -> Result<StatusCode, ControlError> {
    let _: serde_json::Map<String, serde_json::Value> = json_body(req).await?;
    let already = || {
        ControlError::Conflict(format!(
            "Error pausing sandbox - sandbox '{id}' is already paused"
        ))
    };
    if visible(&st, &id)?.1 == "paused" {
        return Err(already());
    }
    match st.manager.pause(&id).await {
        Ok(_) => Ok(StatusCode::NO_CONTENT),
        Err(Error::Paused(_)) => Err(already()),
        Err(Error::WrongState { state, .. } | Error::NotRunning { state, .. }) => {
            Err(ControlError::Conflict(format!(
                "Sandbox '{id}' cannot be paused while in '{state}' state"
            )))
        }
        Err(e) => Err(ControlError::about_sandbox(&id, e)),
    }
}

/// `PUT /sandboxes/{id}/network` (`update_network`): 204 once the new rules (E2B's,
/// translated as at create by [`egress`]) replace the old ones
/// ([`crate::manager::Manager::set_network`]).
pub(super) async fn update_network(
    State(st): State<AppState>,
    Path(id): Path<String>,
    req: Request,
) -> Result<StatusCode, ControlError> {
    let body: NetworkUpdate = json_body(req).await?;
    // Rules zygote cannot hold are refused before the id is looked up, as at create.
    if body.rules.as_ref().is_some_and(|r| !r.is_null()) {
        return Err(ControlError::BadRequest(
            "rules (HTTPS request transforms) are not supported by zygote".into(),
        ));
    }
    let (allow_out, deny_out) = egress(body.allow_internet_access, Some(&body.egress))?;
    visible(&st, &id)?;
    let request = SetNetworkRequest {
        network: None,
        allow_out,
        deny_out,
    };
    st.manager
        .set_network(&id, request)
        .await
        .map_err(|e| ControlError::about_sandbox(&id, e))?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(allow: &[&str], deny: &[&str]) -> NetworkConfig {
        let v = |l: &[&str]| Some(l.iter().map(|s| s.to_string()).collect());
        NetworkConfig {
            allow_out: v(allow),
            deny_out: v(deny),
        }
    }

    #[test]
    fn e2b_egress_becomes_zygote_policy() {
        assert_eq!(egress(None, None).unwrap(), (None, None));
        let all = Some(vec!["0.0.0.0/0".to_string()]);
        assert_eq!(egress(Some(false), None).unwrap(), (None, all.clone()));
        assert_eq!(
            egress(None, Some(&cfg(&["1.1.1.1"], &["0.0.0.0/0"]))).unwrap(),
            (Some(vec!["1.1.1.1/32".to_string()]), None)
        );
        assert_eq!(
            egress(None, Some(&cfg(&[], &["0.0.0.0/0"]))).unwrap(),
            (None, all)
        );
        // Allow wins: 10.0.0.0/8 minus 10.1.0.0/16 is seven CIDRs and a /16 less.
        let (allow, deny) = egress(None, Some(&cfg(&["10.1.0.0/16"], &["10.0.0.0/8"]))).unwrap();
        assert_eq!(allow, None);
        let deny: Vec<Ipv4Net> = deny.unwrap().iter().map(|s| s.parse().unwrap()).collect();
        assert_eq!(deny.len(), 8);
        let inside: Ipv4Net = "10.1.2.0/24".parse().unwrap();
        assert!(!deny.iter().any(|d| d.contains(&inside)));
        assert!(deny
            .iter()
            .any(|d| d.contains(&"10.2.0.0/16".parse::<Ipv4Net>().unwrap())));
        // A deny the allow list covers whole is gone.
        assert_eq!(
            egress(None, Some(&cfg(&["8.8.0.0/16"], &["8.8.8.8"]))).unwrap(),
            (None, None)
        );
        // Domain names: an allow list under a total deny; denied names pass on.
        assert_eq!(
            egress(
                None,
                Some(&cfg(
                    &["Example.com", "*.pypi.org", "1.1.1.1"],
                    &["0.0.0.0/0"]
                ))
            )
            .unwrap(),
            (
                Some(vec![
                    "1.1.1.1/32".to_string(),
                    "example.com".to_string(),
                    "*.pypi.org".to_string()
                ]),
                None
            )
        );
        assert_eq!(
            egress(None, Some(&cfg(&[], &["evil.org", "10.0.0.0/8"]))).unwrap(),
            (
                None,
                Some(vec!["10.0.0.0/8".to_string(), "evil.org".to_string()])
            )
        );
        let e = egress(None, Some(&cfg(&["example.com"], &[]))).unwrap_err();
        assert!(e.to_string().contains("need denyOut"), "{e}");
        let e = egress(None, Some(&cfg(&["*.com"], &["0.0.0.0/0"]))).unwrap_err();
        assert!(
            e.to_string().contains("\"*.com\" is not a name rule"),
            "{e}"
        );
        let e = egress(None, Some(&cfg(&["10.0.0.0/33"], &[]))).unwrap_err();
        assert!(e.to_string().contains("not an IPv4 address or CIDR"), "{e}");
    }
}
