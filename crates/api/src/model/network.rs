//! A sandbox's network policy as the API takes and shows it.
use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::{RequestError, Result};
pub use crate::model::network_names::NameRule;

/// Most entries (CIDRs and names) in `allow_out` plus `deny_out`: each CIDR becomes one
/// element of an nftables set, each name a pattern every DNS question and proxied
/// connection is matched against, so the limit is about request sizes, not speed.
pub const MAX_NETWORK_RULES: usize = 256;

/// What traffic a sandbox may start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// Outbound connections through NAT (narrowed by `allow_out` / `deny_out`). Never
    /// to the host itself, the link-local metadata range or another sandbox.
    #[default]
    Egress,
    /// No traffic in or out (exposed ports still reach the guest from the host).
    None,
}

impl NetworkMode {
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkMode::Egress => "egress",
            NetworkMode::None => "none",
        }
    }
}

/// The policy fields of a create request, before they are checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NetworkRequest {
    pub network: Option<NetworkMode>,
    pub allow_out: Option<Vec<String>>,
    pub deny_out: Option<Vec<String>>,
}

/// A checked policy, as stored and enforced.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NetworkPolicy {
    pub mode: NetworkMode,
    /// None: every destination not denied (and not always refused). Some: an allow
    /// list, whose CIDRs these are (possibly none) and whose names are `allow_names`.
    pub allow_out: Option<Vec<Ipv4Net>>,
    pub deny_out: Vec<Ipv4Net>,
    /// The names of the allow list (only with `allow_out` Some).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_names: Vec<NameRule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_names: Vec<NameRule>,
}

impl NetworkPolicy {
    /// Whether any rule is by name (then TCP to the ports they name goes through the
    /// daemon's egress proxy).
    pub fn has_names(&self) -> bool {
        !self.allow_names.is_empty() || !self.deny_names.is_empty()
    }
}

/// A list's CIDRs and names.
type Rules = (Vec<Ipv4Net>, Vec<NameRule>);

fn parse_rules(list: &[String]) -> Result<Rules> {
    let mut rules: Rules = Default::default();
    for s in list {
        if NameRule::looks_like_name(s) {
            rules.1.push(NameRule::parse(s)?);
        } else {
            rules.0.push(parse_cidr(s)?);
        }
    }
    Ok(rules)
}

impl NetworkRequest {
    pub fn policy(&self) -> Result<NetworkPolicy> {
        let allow = self.allow_out.as_deref().map(parse_rules).transpose()?;
        let (deny, deny_names) = parse_rules(self.deny_out.as_deref().unwrap_or_default())?;
        let (allow, allow_names) = match allow {
            Some((cidrs, names)) => (Some(cidrs), names),
            None => (None, Vec::new()),
        };
        let rules =
            allow.as_ref().map_or(0, Vec::len) + allow_names.len() + deny.len() + deny_names.len();
        if rules > MAX_NETWORK_RULES {
            return Err(RequestError::invalid(format!(
                "allow_out and deny_out hold {rules} entries; at most {MAX_NETWORK_RULES}"
            )));
        }
        let mode = self.network.unwrap_or_default();
        if mode == NetworkMode::None
            && (allow.is_some() || !deny.is_empty() || !deny_names.is_empty())
        {
            return Err(RequestError::invalid(
                "allow_out and deny_out need network \"egress\" (\"none\" allows nothing)",
            ));
        }
        Ok(NetworkPolicy {
            mode,
            allow_out: allow,
            deny_out: deny,
            allow_names,
            deny_names,
        })
    }
}

/// `PUT /v1/sandboxes/{id}/network`: the sandbox's new policy, replacing the whole old
/// one (a field left out is the create default: `egress`, no list). Checked exactly as
/// the same fields of a create request.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetNetworkRequest {
    /// `egress` (default) or `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkMode>,
    /// Only these may be reached: IPv4 CIDRs (or single addresses), and names
    /// (`pypi.org`, `*.github.com`, optionally `:port`; TCP on ports 80 and 443 by
    /// default), as at create. Names resolve only when listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_items = 256)]
    pub allow_out: Option<Vec<String>>,
    /// These IPv4 CIDRs and names are refused, even when `allow_out` contains them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_items = 256)]
    pub deny_out: Option<Vec<String>>,
}

impl SetNetworkRequest {
    pub fn policy(&self) -> Result<NetworkPolicy> {
        NetworkRequest {
            network: self.network,
            allow_out: self.allow_out.clone(),
            deny_out: self.deny_out.clone(),
        }
        .policy()
    }
}

impl crate::model::Validate for SetNetworkRequest {
    fn validate(&self) -> Result<()> {
        self.policy().map(drop)
    }
}

/// `a.b.c.d/len` or `a.b.c.d` (a /32). Host bits must be zero: `10.0.0.1/8` is almost
/// always a typo for something else, so it is refused rather than silently widened.
pub fn parse_cidr(s: &str) -> Result<Ipv4Net> {
    let bad = |why: &str| RequestError::invalid(format!("{s:?} is not an IPv4 CIDR: {why}"));
    let net: Ipv4Net = if s.contains('/') {
        s.parse().map_err(|_| bad("expected a.b.c.d/len"))?
    } else {
        let a: std::net::Ipv4Addr = s.parse().map_err(|_| bad("expected a.b.c.d/len"))?;
        Ipv4Net::from(a)
    };
    if net.trunc() != net {
        return Err(bad(&format!(
            "host bits set (did you mean {}?)",
            net.trunc()
        )));
    }
    Ok(net)
}

/// A sandbox's network as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NetworkView {
    pub mode: NetworkMode,
    pub allow_out: Vec<String>,
    pub deny_out: Vec<String>,
    /// The guest's own IPv4 address (each sandbox and branch child has its own); null
    /// when the sandbox has no isolated network.
    pub address: Option<String>,
    /// The sandbox runs in a network namespace of its own with the policy enforced by
    /// nftables (false: the daemon runs without the isolated network; see
    /// `GET /v1/info`).
    pub isolated: bool,
    /// The questions the sandbox's resolver handled since the daemon started (absent
    /// without the isolated network).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<DnsCounts>,
}

/// What a sandbox's resolver did with the guest's DNS questions (counted in memory:
/// they start again at zero with the daemon).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DnsCounts {
    /// Messages received.
    pub queries: u64,
    /// Answered from the upstream (or, for AAAA, answered empty by the resolver).
    pub forwarded: u64,
    /// Answered REFUSED (the policy forbids the name, or the query is odd).
    pub refused: u64,
    /// Answered SERVFAIL (the upstream failed or answered badly).
    pub failed: u64,
    /// Not answered: more queries or connections at once than the resolver takes.
    pub dropped: u64,
}

impl NetworkView {
    pub fn new(policy: &NetworkPolicy, address: Option<String>, isolated: bool) -> NetworkView {
        let show = |v: &[Ipv4Net], names: &[NameRule]| {
            v.iter()
                .map(ToString::to_string)
                .chain(names.iter().map(ToString::to_string))
                .collect()
        };
        NetworkView {
            mode: policy.mode,
            allow_out: policy
                .allow_out
                .as_deref()
                .map(|a| show(a, &policy.allow_names))
                .unwrap_or_default(),
            deny_out: show(&policy.deny_out, &policy.deny_names),
            address,
            isolated,
            dns: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(mode: Option<NetworkMode>, allow: Option<&[&str]>, deny: &[&str]) -> NetworkRequest {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        NetworkRequest {
            network: mode,
            allow_out: allow.map(own),
            deny_out: (!deny.is_empty()).then(|| own(deny)),
        }
    }

    #[test]
    fn cidrs_parse_strictly() {
        assert_eq!(
            parse_cidr("10.77.0.0/24").unwrap().to_string(),
            "10.77.0.0/24"
        );
        assert_eq!(parse_cidr("1.2.3.4").unwrap().to_string(), "1.2.3.4/32");
        for bad in [
            "",
            "10.0.0.0/33",
            "10.0.0.1/8",
            "::1/128",
            "a.b.c.d/8",
            "10.0.0/8",
        ] {
            let e = parse_cidr(bad).unwrap_err().to_string();
            assert!(e.contains("not an IPv4 CIDR"), "{bad}: {e}");
        }
        assert!(parse_cidr("10.0.0.1/8")
            .unwrap_err()
            .to_string()
            .contains("10.0.0.0/8"));
    }

    #[test]
    fn the_default_is_egress_without_lists() {
        let p = NetworkRequest::default().policy().unwrap();
        assert_eq!(p, NetworkPolicy::default());
        assert_eq!(p.mode, NetworkMode::Egress);
    }

    #[test]
    fn none_takes_no_lists_and_lists_are_bounded() {
        let e = req(Some(NetworkMode::None), Some(&["10.0.0.0/8"]), &[])
            .policy()
            .unwrap_err();
        assert!(e.to_string().contains("need network \"egress\""), "{e}");
        let many: Vec<String> = (0..300).map(|i| format!("10.1.{}.0/24", i % 256)).collect();
        let r = NetworkRequest {
            allow_out: Some(many),
            ..Default::default()
        };
        assert!(r.policy().unwrap_err().to_string().contains("at most 256"));
        let p = req(None, Some(&["10.77.0.0/24"]), &["10.77.0.9"])
            .policy()
            .unwrap();
        assert_eq!(p.allow_out.unwrap()[0].to_string(), "10.77.0.0/24");
        assert_eq!(p.deny_out[0].to_string(), "10.77.0.9/32");
    }

    #[test]
    fn lists_take_names_next_to_cidrs() {
        let p = req(
            None,
            Some(&["10.77.0.0/24", "PyPI.org", "*.github.com:8443"]),
            &["evil.github.com", "10.77.0.9"],
        )
        .policy()
        .unwrap();
        assert_eq!(p.allow_out.as_ref().unwrap().len(), 1);
        assert_eq!(p.allow_names[0].pattern, "pypi.org");
        assert_eq!(p.allow_names[1].ports(), [8443]);
        assert_eq!(p.deny_names[0].pattern, "evil.github.com");
        assert!(p.has_names());
        let view = NetworkView::new(&p, None, true);
        assert_eq!(
            view.allow_out,
            ["10.77.0.0/24", "pypi.org", "*.github.com:8443"]
        );
        assert_eq!(view.deny_out, ["10.77.0.9/32", "evil.github.com"]);
        // Only names: still an allow list (of no CIDR).
        let p = req(None, Some(&["pypi.org"]), &[]).policy().unwrap();
        assert_eq!(p.allow_out, Some(vec![]));
        // Bad names are the caller's 400 with the reason; bad CIDRs stay CIDR errors.
        for (bad, why) in [("*.com", "two labels"), ("a.*.b.com", "first label")] {
            let e = req(None, Some(&[bad]), &[])
                .policy()
                .unwrap_err()
                .to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let e = req(None, Some(&["10.0.0.1/8"]), &[]).policy().unwrap_err();
        assert!(e.to_string().contains("not an IPv4 CIDR"), "{e}");
        let e = req(Some(NetworkMode::None), None, &["pypi.org"])
            .policy()
            .unwrap_err();
        assert!(e.to_string().contains("need network \"egress\""), "{e}");
        // A record stored before names existed reads back.
        let old: NetworkPolicy =
            serde_json::from_str(r#"{"mode":"egress","allow_out":null,"deny_out":[]}"#).unwrap();
        assert_eq!(old, NetworkPolicy::default());
    }
}
