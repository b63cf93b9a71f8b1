//! The address plan and the nftables rules, as pure functions of a sandbox's slot and
//! policy (unit-tested here; `super::host` applies them).
//!
//! Each sandbox has a host-wide *slot* k (1..=[`MAX_SLOT`]), claimed by creating the
//! host end of its veth pair, `zyv<k>`: the kernel refuses a second link of that name,
//! so two daemons on one host never share a slot. From k:
//!
//! ```text
//!  guest eth0  10.213.x.y/16 (1 + k after 10.213.0.1)      MAC 02:7a:63:00:<k>
//!     | virtio-net
//!  tap0        10.213.0.1/16   (the same in every namespace: the guest's gateway)
//!  [netns zygote-<daemon>-<sandbox>: forwarding, nftables table `inet zygote`]
//!  veth0       10.214.0.0 + 4k + 2 /30
//!     |
//!  zyv<k>      10.214.0.0 + 4k + 1 /30   (host; route to the guest's /32 via veth0)
//!  [host: table `inet zygote` masquerades 10.213.0.0/16 and drops what comes from
//!   zyv* to the host itself or to another zyv*]
//! ```
use std::fmt::Write;
use std::net::Ipv4Addr;

use zygote_api::model::{NetworkMode, NetworkPolicy};

use crate::egress::proxy::{PROXY_MARK, PROXY_PORT};

/// Guests' addresses (and every namespace's gateway, `.0.1`).
pub const GUEST_NET: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 0);
pub const GUEST_PREFIX: u8 = 16;
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 1);
/// Point-to-point links between the host and each namespace, a /30 per slot.
pub const LINK_NET: Ipv4Addr = Ipv4Addr::new(10, 214, 0, 0);
pub const LINK_PREFIX: u8 = 16;
/// Highest slot: 4k + 3 must stay inside LINK_NET's /16.
pub const MAX_SLOT: u32 = 16383;
/// The resolver address guest images are built with (QEMU user networking's): the
/// namespace forwards it to the host's resolver.
pub const GUEST_DNS: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 3);
/// Link-local addresses (cloud metadata services): never reachable.
pub const LINK_LOCAL: &str = "169.254.0.0/16";
/// Host-side veth names start with this (`zyv<k>`); the host rules match on it.
pub const HOST_LINK_PREFIX: &str = "zyv";
pub const TAP: &str = "tap0";
pub const NS_LINK: &str = "veth0";
/// Every tap has this MAC, so a branch child's guest, whose ARP cache names its
/// parent's gateway, reaches its own gateway without waiting for the cache to expire.
pub const TAP_MAC: &str = "02:7a:63:ff:ff:01";

fn offset(base: Ipv4Addr, n: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base) + n)
}

/// Everything derived from a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotPlan {
    pub slot: u32,
    pub guest: Ipv4Addr,
    pub guest_mac: String,
    /// Host end of the veth (`zyv<k>`), and its address.
    pub host_link: String,
    pub host_addr: Ipv4Addr,
    /// Namespace end of the veth.
    pub ns_addr: Ipv4Addr,
}

impl SlotPlan {
    pub fn new(slot: u32) -> SlotPlan {
        assert!((1..=MAX_SLOT).contains(&slot), "slot {slot} out of range");
        SlotPlan {
            slot,
            guest: offset(GATEWAY, slot),
            guest_mac: format!("02:7a:63:00:{:02x}:{:02x}", slot >> 8, slot & 0xff),
            host_link: format!("{HOST_LINK_PREFIX}{slot}"),
            host_addr: offset(LINK_NET, 4 * slot + 1),
            ns_addr: offset(LINK_NET, 4 * slot + 2),
        }
    }

    /// The slot a host link name belongs to (`zyv12` -> 12).
    pub fn slot_of(link: &str) -> Option<u32> {
        let n: u32 = link.strip_prefix(HOST_LINK_PREFIX)?.parse().ok()?;
        (1..=MAX_SLOT).contains(&n).then_some(n)
    }
}

/// `ip -batch` lines run on the host to create the veth pair (which claims the slot).
pub fn host_link_cmds(p: &SlotPlan, netns: &str) -> String {
    format!(
        "link add {link} type veth peer name {NS_LINK} netns {netns}\n\
         addr add {addr}/30 dev {link}\n\
         link set {link} up\n",
        link = p.host_link,
        addr = p.host_addr,
    )
}

/// The shell script run inside the namespace (shell built-ins only: a busybox `sh` runs
/// its own applets, not iproute2, for `ip`): forwarding on, IPv6 off.
pub const NS_SYSCTL_SCRIPT: &str = "echo 1 > /proc/sys/net/ipv4/ip_forward && \
     if [ -e /proc/sys/net/ipv6/conf/all/disable_ipv6 ]; then \
     echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6 && \
     echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6; fi";

/// `ip -n <namespace> -batch` lines: the namespace's links and the guest's tap.
pub fn ns_link_cmds(p: &SlotPlan) -> String {
    format!(
        "link set lo up\n\
         addr add {ns}/30 dev {NS_LINK}\n\
         link set {NS_LINK} up\n\
         route add default via {host}\n\
         tuntap add dev {TAP} mode tap\n\
         link set {TAP} address {TAP_MAC}\n\
         addr add {GATEWAY}/{GUEST_PREFIX} dev {TAP}\n\
         link set {TAP} up\n",
        ns = p.ns_addr,
        host = p.host_addr,
    )
}

/// The namespace's whole nftables ruleset for `policy` (replaces any earlier one, so a
/// restarted daemon can apply it again). `dns`: the upstream resolver the daemon's
/// resolver for this sandbox asks (None: none is configured).
///
/// DNS is not an exception to the policy: the guest's resolver (the image's
/// [`GUEST_DNS`], rewritten to [`GATEWAY`], or the gateway itself) is the daemon's own,
/// listening inside this namespace (`crate::dns`), which judges every question by the
/// policy and asks the upstream only for names it allows. The guest reaches nothing
/// else of the namespace; the namespace itself (the daemon's sockets in it, or a VM
/// process gone rogue) may open connections only to the upstream's port 53, so the
/// resolver is the only way out that is not the guest's own, policed, traffic.
///
/// `intercept`: ports whose TCP connections the egress proxy must see whatever the
/// rules (those of secrets bound to hosts, `crate::egress::secrets`).
pub fn ns_rules(
    p: &SlotPlan,
    policy: &NetworkPolicy,
    dns: Option<Ipv4Addr>,
    intercept: &[u16],
) -> String {
    ns_rules_all(p, &[policy], dns, intercept)
}

/// The namespace's ruleset while a sandbox's policy changes from `old` to `new`: a
/// packet leaves only if both would let it. Loaded
/// before the new policy is recorded, so that whichever step a crash interrupts, the
/// rules in force are never more open than the recorded policy (see
/// `Network::set_policy`).
pub fn ns_rules_between(
    p: &SlotPlan,
    old: &NetworkPolicy,
    new: &NetworkPolicy,
    dns: Option<Ipv4Addr>,
    intercept: &[u16],
) -> String {
    ns_rules_all(p, &[old, new], dns, intercept)
}

/// The ruleset letting out only what every policy of `policies` lets out.
fn ns_rules_all(
    p: &SlotPlan,
    policies: &[&NetworkPolicy],
    dns: Option<Ipv4Addr>,
    intercept: &[u16],
) -> String {
    let mut r = String::new();
    let set = |r: &mut String, name: &str, nets: &[ipnet::Ipv4Net]| {
        let _ = writeln!(r, "  set {name} {{ type ipv4_addr; flags interval;");
        if !nets.is_empty() {
            let list: Vec<String> = nets.iter().map(ToString::to_string).collect();
            let _ = writeln!(r, "    auto-merge; elements = {{ {} }}", list.join(", "));
        }
        r.push_str("  }\n");
    };
    // The sets of policy i are `deny_out`, `allow_out` (i = 0), `deny_out_1`...
    let suffix = |i: usize| {
        if i == 0 {
            String::new()
        } else {
            format!("_{i}")
        }
    };
    r.push_str("table inet zygote\ndelete table inet zygote\ntable inet zygote {\n");
    let egress = policies.iter().all(|p| p.mode == NetworkMode::Egress);
    for (i, policy) in policies.iter().enumerate() {
        set(&mut r, &format!("deny_out{}", suffix(i)), &policy.deny_out);
        if let Some(allow) = &policy.allow_out {
            set(&mut r, &format!("allow_out{}", suffix(i)), allow);
        }
    }
    r.push_str(
        "  chain prerouting {\n    type nat hook prerouting priority dstnat; policy accept;\n",
    );
    for proto in ["udp", "tcp"] {
        let _ = writeln!(
            r,
            "    iifname \"{TAP}\" ip daddr {GUEST_DNS} {proto} dport 53 dnat ip to {GATEWAY}"
        );
    }
    // Rules by name: TCP to the ports they cover goes to the egress proxy
    // (`crate::egress`), which judges the name each connection gives; so does TCP to
    // the ports of secrets bound to hosts, which it relays with the values swapped in.
    let mut named = crate::egress::judge::named_ports(policies.iter().copied());
    named.extend_from_slice(intercept);
    named.sort_unstable();
    named.dedup();
    if egress && !named.is_empty() {
        let list: Vec<String> = named.iter().map(ToString::to_string).collect();
        let _ = writeln!(
            r,
            "    iifname \"{TAP}\" tcp dport {{ {} }} redirect to :{PROXY_PORT}",
            list.join(", ")
        );
    }
    r.push_str("  }\n");
    // Of the namespace itself, the guest reaches only the daemon's resolver (ARP is not
    // filtered here).
    r.push_str(
        "  chain input {\n    type filter hook input priority filter; policy drop;\n    \
         iif \"lo\" accept\n    ct state established,related accept\n",
    );
    for proto in ["udp", "tcp"] {
        let _ = writeln!(
            r,
            "    iifname \"{TAP}\" ip daddr {GATEWAY} {proto} dport 53 accept"
        );
    }
    // The proxy only by the redirect (a connection made to it directly has no
    // destination to judge).
    let _ = writeln!(
        r,
        "    iifname \"{TAP}\" ip daddr {GATEWAY} tcp dport {PROXY_PORT} ct status dnat accept"
    );
    r.push_str("  }\n");
    // What the namespace itself sends: answers on connections made to it, and the
    // resolver's questions to the upstream.
    r.push_str(
        "  chain output {\n    type filter hook output priority filter; policy drop;\n    \
         oif \"lo\" accept\n    ct state established,related accept\n",
    );
    // The egress proxy's connections to the destinations it allowed.
    let _ = writeln!(
        r,
        "    oifname \"{NS_LINK}\" meta mark {PROXY_MARK:#x} accept"
    );
    if let Some(dns) = dns {
        for proto in ["udp", "tcp"] {
            let _ = writeln!(
                r,
                "    oifname \"{NS_LINK}\" ip daddr {dns} {proto} dport 53 accept"
            );
        }
    }
    r.push_str("  }\n");
    // Every packet the guest sends on a connection it opened (conntrack's `original`
    // direction) meets the policy, not just the first: a policy changed while the sandbox
    // runs cuts connections opened before it too. The guest's answers on connections the
    // host opened (the port proxy: `reply` direction) pass as established.
    let _ = write!(
        r,
        "  chain forward {{\n    type filter hook forward priority filter; policy drop;\n    \
         iifname \"{TAP}\" oifname \"{NS_LINK}\" ct direction original {verdict}\n    \
         ct state established,related accept\n    \
         iifname \"{NS_LINK}\" oifname \"{TAP}\" ip saddr {host} ct state new accept\n  }}\n",
        verdict = if egress { "jump egress" } else { "drop" },
        host = p.host_addr,
    );
    if egress {
        let _ = write!(
            r,
            "  chain egress {{\n    meta nfproto ipv6 drop\n    ip daddr {LINK_LOCAL} drop\n"
        );
        let last = policies.len() - 1;
        for (i, policy) in policies.iter().enumerate() {
            let s = suffix(i);
            let _ = writeln!(r, "    ip daddr @deny_out{s} drop");
            match (&policy.allow_out, i == last) {
                (Some(_), false) => {
                    let _ = writeln!(r, "    ip daddr != @allow_out{s} drop");
                }
                (Some(_), true) => {
                    let _ = writeln!(r, "    ip daddr @allow_out{s} accept\n    drop");
                }
                (None, false) => {}
                (None, true) => r.push_str("    accept\n"),
            }
        }
        r.push_str("  }\n");
    }
    r.push_str("}\n");
    r
}

/// The host's table, the same for every daemon on the host (each one writes it at
/// start-up; replacing it with identical rules is harmless to the others). Traffic from
/// a sandbox (`zyv*`) may not reach the host itself on any address, nor another
/// sandbox, nor the link-local range; nothing outside may open connections to a
/// sandbox; sandboxes' addresses are masqueraded on the way out, the guests' and the
/// namespaces' own (the daemon's resolver asks the upstream from the namespace's end
/// of its link).
pub fn host_rules() -> String {
    let z = format!("\"{HOST_LINK_PREFIX}*\"");
    format!(
        "table inet zygote\ndelete table inet zygote\ntable inet zygote {{\n  \
         chain input {{\n    type filter hook input priority filter - 10; policy accept;\n    \
         iifname {z} ct state established,related accept\n    \
         iifname {z} drop\n  }}\n  \
         chain forward {{\n    type filter hook forward priority filter - 10; policy accept;\n    \
         iifname {z} oifname {z} drop\n    \
         oifname {z} ct state established,related accept\n    \
         oifname {z} drop\n    \
         iifname {z} ip daddr {LINK_LOCAL} drop\n  }}\n  \
         chain postrouting {{\n    type nat hook postrouting priority srcnat; policy accept;\n    \
         ip saddr {GUEST_NET}/{GUEST_PREFIX} oifname != {z} masquerade\n    \
         ip saddr {LINK_NET}/{LINK_PREFIX} iifname {z} oifname != {z} masquerade\n  }}\n}}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use zygote_api::model::parse_cidr;

    #[test]
    fn slots_give_distinct_addresses_inside_the_ranges() {
        let first = SlotPlan::new(1);
        assert_eq!(first.guest, Ipv4Addr::new(10, 213, 0, 2));
        assert_eq!(first.host_addr, Ipv4Addr::new(10, 214, 0, 5));
        assert_eq!(first.ns_addr, Ipv4Addr::new(10, 214, 0, 6));
        assert_eq!(first.host_link, "zyv1");
        assert_eq!(first.guest_mac, "02:7a:63:00:00:01");
        let last = SlotPlan::new(MAX_SLOT);
        assert_eq!(last.guest, Ipv4Addr::new(10, 213, 64, 0));
        assert_eq!(last.ns_addr, Ipv4Addr::new(10, 214, 255, 254));
        assert_eq!(last.guest_mac, "02:7a:63:00:3f:ff");
        assert!(last.host_link.len() <= 15, "IFNAMSIZ");
        assert_eq!(SlotPlan::slot_of("zyv42"), Some(42));
        assert_eq!(SlotPlan::slot_of("zyv0"), None);
        assert_eq!(SlotPlan::slot_of("eth0"), None);
    }

    #[test]
    fn egress_rules_drop_metadata_and_denied_before_allowing() {
        let policy = NetworkPolicy {
            mode: NetworkMode::Egress,
            allow_out: Some(vec![parse_cidr("10.77.0.0/24").unwrap()]),
            deny_out: vec![parse_cidr("10.77.0.9").unwrap()],
            ..Default::default()
        };
        let r = ns_rules(
            &SlotPlan::new(3),
            &policy,
            Some(Ipv4Addr::new(192, 0, 2, 53)),
            &[],
        );
        let at = |needle: &str| r.find(needle).unwrap_or_else(|| panic!("{needle}: {r}"));
        assert!(at("ip daddr 169.254.0.0/16 drop") < at("ip daddr @deny_out drop"));
        assert!(at("ip daddr @deny_out drop") < at("ip daddr @allow_out accept"));
        assert!(r.contains("elements = { 10.77.0.9/32 }"), "{r}");
        // Only the host's end of this sandbox's link may open connections to the guest.
        assert!(
            r.contains("ip saddr 10.214.0.13 ct state new accept"),
            "{r}"
        );
    }

    /// The lines of chain `name` in `rules`.
    fn chain<'a>(rules: &'a str, name: &str) -> Vec<&'a str> {
        let start = format!("chain {name} {{");
        rules
            .lines()
            .skip_while(|l| l.trim() != start)
            .skip(1)
            .take_while(|l| l.trim() != "}")
            .map(str::trim)
            .collect()
    }

    /// Issue 39: the guest's DNS goes to the daemon's resolver in the namespace, in
    /// every mode (the resolver refuses what the policy forbids, `none` everything):
    /// the image's resolver address is rewritten to the gateway, the input chain lets
    /// the guest reach port 53 there and nothing else, and the namespace itself may
    /// send only to the upstream's port 53. Before issue 39 the query was rewritten to
    /// the upstream and left as the guest's own packet, so any allowed query went out.
    #[test]
    fn dns_goes_to_the_daemons_resolver_and_only_it_asks_upstream() {
        let upstream = Ipv4Addr::new(192, 0, 2, 53);
        let policies = [
            NetworkPolicy::default(),
            NetworkPolicy {
                allow_out: Some(vec![parse_cidr("10.77.0.0/24").unwrap()]),
                ..Default::default()
            },
            NetworkPolicy {
                mode: NetworkMode::None,
                ..Default::default()
            },
        ];
        for policy in &policies {
            let r = ns_rules(&SlotPlan::new(3), policy, Some(upstream), &[]);
            assert!(!r.contains(&format!("dnat ip to {upstream}")), "{r}");
            for proto in ["udp", "tcp"] {
                let dnat = format!(
                    "iifname \"tap0\" ip daddr 10.0.2.3 {proto} dport 53 dnat ip to 10.213.0.1"
                );
                assert!(chain(&r, "prerouting").contains(&dnat.as_str()), "{r}");
            }
            assert_eq!(
                chain(&r, "input")[1..],
                [
                    "iif \"lo\" accept",
                    "ct state established,related accept",
                    "iifname \"tap0\" ip daddr 10.213.0.1 udp dport 53 accept",
                    "iifname \"tap0\" ip daddr 10.213.0.1 tcp dport 53 accept",
                    "iifname \"tap0\" ip daddr 10.213.0.1 tcp dport 15080 ct status dnat accept",
                ],
                "{r}"
            );
            assert_eq!(
                chain(&r, "output"),
                [
                    "type filter hook output priority filter; policy drop;",
                    "oif \"lo\" accept",
                    "ct state established,related accept",
                    "oifname \"veth0\" meta mark 0x7a670001 accept",
                    "oifname \"veth0\" ip daddr 192.0.2.53 udp dport 53 accept",
                    "oifname \"veth0\" ip daddr 192.0.2.53 tcp dport 53 accept",
                ],
                "{r}"
            );
        }
        // No upstream: the namespace sends nothing of its own.
        let r = ns_rules(&SlotPlan::new(3), &policies[0], None, &[]);
        assert!(
            !chain(&r, "output").iter().any(|l| l.contains("dport 53")),
            "{r}"
        );
    }

    /// Issue 39: with rules by name, TCP to the ports they cover goes to the egress
    /// proxy (only then, and not under `none`); CIDR rules stay in the egress chain.
    #[test]
    fn named_ports_go_to_the_egress_proxy() {
        let req = |allow: &[&str]| {
            zygote_api::model::NetworkRequest {
                network: None,
                allow_out: Some(allow.iter().map(|s| s.to_string()).collect()),
                deny_out: None,
            }
            .policy()
            .unwrap()
        };
        let named = req(&["pypi.org", "internal.example.com:8443", "10.77.0.0/24"]);
        let r = ns_rules(&SlotPlan::new(3), &named, None, &[]);
        let redirect = "iifname \"tap0\" tcp dport { 80, 443, 8443 } redirect to :15080";
        assert!(chain(&r, "prerouting").contains(&redirect), "{r}");
        assert!(r.contains("elements = { 10.77.0.0/24 }"), "{r}");
        let cidrs = req(&["10.77.0.0/24"]);
        let r = ns_rules(&SlotPlan::new(3), &cidrs, None, &[]);
        assert!(!r.contains("redirect"), "{r}");
        // While changing from names to CIDRs, both are in force.
        let r = ns_rules_between(&SlotPlan::new(3), &named, &cidrs, None, &[]);
        assert!(r.contains("redirect to :15080"), "{r}");
        let none = NetworkPolicy {
            mode: NetworkMode::None,
            ..Default::default()
        };
        let r = ns_rules_between(&SlotPlan::new(3), &named, &none, None, &[]);
        assert!(!r.contains("redirect"), "{r}");
    }

    #[test]
    fn secret_ports_go_to_the_egress_proxy_under_any_egress_policy() {
        let open = NetworkPolicy::default();
        let r = ns_rules(&SlotPlan::new(3), &open, None, &[]);
        assert!(!r.contains("redirect"), "{r}");
        let r = ns_rules(&SlotPlan::new(3), &open, None, &[8443, 443]);
        let redirect = "iifname \"tap0\" tcp dport { 443, 8443 } redirect to :15080";
        assert!(chain(&r, "prerouting").contains(&redirect), "{r}");
        let none = NetworkPolicy {
            mode: NetworkMode::None,
            ..Default::default()
        };
        let r = ns_rules(&SlotPlan::new(3), &none, None, &[443]);
        assert!(!r.contains("redirect"), "nothing goes out under none: {r}");
    }

    #[test]
    fn none_forwards_nothing_from_the_guest() {
        let policy = NetworkPolicy {
            mode: NetworkMode::None,
            ..Default::default()
        };
        let r = ns_rules(
            &SlotPlan::new(3),
            &policy,
            Some(Ipv4Addr::new(192, 0, 2, 53)),
            &[],
        );
        assert!(!r.contains("jump egress"), "{r}");
        assert!(r.contains("policy drop"), "{r}");
    }

    #[test]
    fn host_rules_isolate_every_sandbox_link() {
        let r = host_rules();
        assert!(r.contains("iifname \"zyv*\" drop"), "{r}");
        assert!(r.contains("iifname \"zyv*\" oifname \"zyv*\" drop"), "{r}");
        assert!(
            r.contains("ip saddr 10.213.0.0/16 oifname != \"zyv*\" masquerade"),
            "{r}"
        );
        assert!(
            r.contains("ip saddr 10.214.0.0/16 iifname \"zyv*\" oifname != \"zyv*\" masquerade"),
            "{r}"
        );
    }

    /// While a policy changes, the rules let out only what both policies let out: an
    /// address allowed by one and denied (or not allowed) by the other is dropped, and
    /// DNS is served only when both are `egress`.
    #[test]
    fn the_rules_between_two_policies_are_their_intersection() {
        let old = NetworkPolicy {
            mode: NetworkMode::Egress,
            allow_out: Some(vec![parse_cidr("10.77.0.0/24").unwrap()]),
            deny_out: vec![],
            ..Default::default()
        };
        let new = NetworkPolicy {
            mode: NetworkMode::Egress,
            allow_out: None,
            deny_out: vec![parse_cidr("10.77.0.9").unwrap()],
            ..Default::default()
        };
        let resolver = Ipv4Addr::new(192, 0, 2, 53);
        let r = ns_rules_between(&SlotPlan::new(3), &old, &new, Some(resolver), &[]);
        let egress = chain(&r, "egress");
        assert_eq!(
            &egress[2..],
            [
                "ip daddr @deny_out drop",
                "ip daddr != @allow_out drop",
                "ip daddr @deny_out_1 drop",
                "accept"
            ],
            "{r}"
        );
        assert!(r.contains("set deny_out_1 {"), "{r}");
        let none = NetworkPolicy {
            mode: NetworkMode::None,
            ..Default::default()
        };
        let r = ns_rules_between(&SlotPlan::new(3), &new, &none, Some(resolver), &[]);
        assert!(!r.contains("jump egress"), "{r}");
        let r = ns_rules_between(&SlotPlan::new(3), &none, &new, Some(resolver), &[]);
        assert!(!r.contains("jump egress"), "{r}");
        // Guest-sent packets of open connections meet the policy before `established`
        // lets anything through, so a change cuts connections opened before it.
        for (policy, verdict) in [(&new, "jump egress"), (&none, "drop")] {
            let r = ns_rules(&SlotPlan::new(3), policy, Some(resolver), &[]);
            assert_eq!(
                chain(&r, "forward")[1..3],
                [
                    format!("iifname \"tap0\" oifname \"veth0\" ct direction original {verdict}"),
                    "ct state established,related accept".to_string(),
                ],
                "{r}"
            );
        }
    }
}
