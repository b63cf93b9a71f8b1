//! Which of a guest's DNS questions the daemon's resolver asks upstream, from the
//! sandbox's policy (pure; unit-tested here).
//!
//! A question leaves only if *every* policy in force lets it (while a policy changes,
//! the old and the new one both are, as for the nftables rules), and a policy lets a
//! name out when:
//! - its mode is `egress` (`none` resolves nothing), and
//! - its `deny_out` names no rule matching it, and
//! - it has no `allow_out` (everything not denied may be reached, so its names may be
//!   looked up), or its `allow_out` has a name rule matching it (`pypi.org`,
//!   `*.github.com`; `NameRule::matches`). Addresses name no host, so under an
//!   `allow_out` of CIDRs only, no name resolves: a guest told "only these addresses"
//!   or "only these names" cannot carry data out in the names it looks up (the DNS
//!   tunnel).
//!
//! Refused questions get `REFUSED`, not `NXDOMAIN`: the name may well exist and the
//! resolver declines to say, which is what REFUSED means (RFC 1035 4.1.1); an NXDOMAIN
//! would be a false statement about the world that a guest's cache keeps (negative
//! caching, RFC 2308) after a policy change has allowed the name, and that tools report
//! as "no such host" where "refused" points at the policy.
//!
//! AAAA questions for a name that may be resolved get an empty answer from the
//! resolver itself: sandboxes have no IPv6 route (the namespace turns IPv6 off), so an
//! AAAA record would only send the guest to an address it cannot reach first.
use hickory_proto::rr::RecordType;
use zygote_api::model::{NetworkMode, NetworkPolicy};

use super::message::Question;

/// What the resolver does with a question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Ask upstream.
    Forward,
    /// Answer "no records of this type" without asking anyone.
    NoRecords,
    /// Answer REFUSED; the reason goes to the sandbox's event log.
    Refuse(&'static str),
}

/// The decision for `q` under every policy of `policies`.
pub fn decide(policies: &[NetworkPolicy], q: &Question) -> Decision {
    if policies.is_empty() {
        return Decision::Refuse("no policy");
    }
    for p in policies {
        if let Err(why) = name_allowed(p, &q.name) {
            return Decision::Refuse(why);
        }
    }
    if q.qtype == RecordType::AAAA {
        return Decision::NoRecords;
    }
    Decision::Forward
}

fn name_allowed(p: &NetworkPolicy, name: &str) -> Result<(), &'static str> {
    if p.mode == NetworkMode::None {
        return Err("network is \"none\"");
    }
    if p.deny_names.iter().any(|r| r.matches(name)) {
        return Err("deny_out names it");
    }
    if p.allow_out.is_some() && !p.allow_names.iter().any(|r| r.matches(name)) {
        return Err("allow_out does not name it");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use zygote_api::model::parse_cidr;

    fn policy(allow: Option<&[&str]>, deny: &[&str]) -> NetworkPolicy {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        zygote_api::model::NetworkRequest {
            network: None,
            allow_out: allow.map(own),
            deny_out: Some(own(deny)),
        }
        .policy()
        .unwrap()
    }

    fn q(name: &str, qtype: RecordType) -> Question {
        Question {
            name: name.into(),
            qtype,
        }
    }

    #[test]
    fn policies_decide_which_names_go_upstream() {
        let open = NetworkPolicy::default();
        let denying = NetworkPolicy {
            deny_out: vec![parse_cidr("10.0.0.0/8").unwrap()],
            ..Default::default()
        };
        let cidrs_only = NetworkPolicy {
            allow_out: Some(vec![parse_cidr("10.77.0.0/24").unwrap()]),
            ..Default::default()
        };
        let none = NetworkPolicy {
            mode: NetworkMode::None,
            ..Default::default()
        };
        let a = q("pypi.org", RecordType::A);
        assert_eq!(decide(std::slice::from_ref(&open), &a), Decision::Forward);
        assert_eq!(
            decide(std::slice::from_ref(&denying), &a),
            Decision::Forward
        );
        assert_eq!(
            decide(std::slice::from_ref(&cidrs_only), &a),
            Decision::Refuse("allow_out does not name it")
        );
        assert_eq!(
            decide(std::slice::from_ref(&none), &a),
            Decision::Refuse("network is \"none\"")
        );
        assert_eq!(decide(&[], &a), Decision::Refuse("no policy"));
        // During a change both policies must agree.
        assert_eq!(decide(&[open.clone(), denying], &a), Decision::Forward);
        assert!(matches!(
            decide(&[open.clone(), cidrs_only], &a),
            Decision::Refuse(_)
        ));
        assert!(matches!(
            decide(&[none, open.clone()], &a),
            Decision::Refuse(_)
        ));
        // Names and wildcards: only what they say.
        let named = policy(
            Some(&["pypi.org", "*.github.com", "10.0.0.0/8"]),
            &["bad.github.com"],
        );
        for (name, verdict) in [
            ("pypi.org", Decision::Forward),
            ("PyPI.org", Decision::Forward),
            ("api.github.com", Decision::Forward),
            ("a.b.github.com", Decision::Forward),
            ("github.com", Decision::Refuse("allow_out does not name it")),
            (
                "evilgithub.com",
                Decision::Refuse("allow_out does not name it"),
            ),
            (
                "files.pypi.org",
                Decision::Refuse("allow_out does not name it"),
            ),
            (
                "x1.tunnel.example",
                Decision::Refuse("allow_out does not name it"),
            ),
            ("bad.github.com", Decision::Refuse("deny_out names it")),
        ] {
            let question = q(&name.to_lowercase(), RecordType::A);
            assert_eq!(
                decide(std::slice::from_ref(&named), &question),
                verdict,
                "{name}"
            );
        }
        let deny_only = policy(None, &["*.tunnel.example"]);
        assert_eq!(
            decide(
                std::slice::from_ref(&deny_only),
                &q("pypi.org", RecordType::A)
            ),
            Decision::Forward
        );
        assert!(matches!(
            decide(&[deny_only], &q("a.tunnel.example", RecordType::A)),
            Decision::Refuse(_)
        ));
        // AAAA: answered empty, never forwarded.
        let aaaa = q("pypi.org", RecordType::AAAA);
        assert_eq!(decide(&[open], &aaaa), Decision::NoRecords);
    }
}
