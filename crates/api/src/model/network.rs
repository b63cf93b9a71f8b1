//! A sandbox's network policy as the API takes and shows it.
use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::{RequestError, Result};

/// Most CIDRs in `allow_out` plus `deny_out`: each becomes one element of an nftables
/// set, so the limit is about request sizes, not speed.
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
    /// None: every destination not denied (and not always refused).
    pub allow_out: Option<Vec<Ipv4Net>>,
    pub deny_out: Vec<Ipv4Net>,
}

impl NetworkRequest {
    pub fn policy(&self) -> Result<NetworkPolicy> {
        let allow = self.allow_out.as_deref().map(parse_cidrs).transpose()?;
        let deny = parse_cidrs(self.deny_out.as_deref().unwrap_or_default())?;
        let rules = allow.as_ref().map_or(0, Vec::len) + deny.len();
        if rules > MAX_NETWORK_RULES {
            return Err(RequestError::invalid(format!(
                "allow_out and deny_out hold {rules} entries; at most {MAX_NETWORK_RULES}"
            )));
        }
        let mode = self.network.unwrap_or_default();
        if mode == NetworkMode::None && (allow.is_some() || !deny.is_empty()) {
            return Err(RequestError::invalid(
                "allow_out and deny_out need network \"egress\" (\"none\" allows nothing)",
            ));
        }
        Ok(NetworkPolicy {
            mode,
            allow_out: allow,
            deny_out: deny,
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
    /// Only these IPv4 CIDRs (or single addresses) may be reached (DNS too, as at create).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_items = 256)]
    pub allow_out: Option<Vec<String>>,
    /// These IPv4 CIDRs are refused, even when `allow_out` contains them.
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

fn parse_cidrs(list: &[String]) -> Result<Vec<Ipv4Net>> {
    list.iter().map(|s| parse_cidr(s)).collect()
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
}

impl NetworkView {
    pub fn new(policy: &NetworkPolicy, address: Option<String>, isolated: bool) -> NetworkView {
        let show = |v: &[Ipv4Net]| v.iter().map(ToString::to_string).collect();
        NetworkView {
            mode: policy.mode,
            allow_out: policy.allow_out.as_deref().map(show).unwrap_or_default(),
            deny_out: show(&policy.deny_out),
            address,
            isolated,
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
}
