//! The guests' DNS under the egress policy (issues 33 and 39): queries to the image's
//! resolver (10.0.2.3) go to the daemon's resolver in the sandbox's namespace, which
//! asks the upstream (`--dns-upstream`, here the remote namespace's server) only for
//! names the policy allows: under an `allow_out` of addresses, none.
use std::sync::atomic::Ordering;

use zygote_daemon::client::Client;

use super::remote::{Remote, DNS_ANSWER};
use crate::common::sh;

/// Whether each sandbox resolves a name through the image's resolver: one exec per
/// sandbox, the lookups at once, each bounded to 6 s.
async fn resolves(c: &Client, ids: &[&str]) -> Vec<bool> {
    let lookups = ids.iter().map(|id| async move {
        let out = sh(
            c,
            id,
            "timeout 6 nslookup -type=a probe.zygote.test 10.0.2.3 2>&1; true",
        )
        .await
        .unwrap();
        out.contains(&DNS_ANSWER.to_string())
    });
    futures_util::future::join_all(lookups).await
}

/// `allowed`: sandboxes whose policy lets names be resolved; `blocked`: those whose
/// policy does not. The blocked ones' queries must not even reach the upstream.
pub async fn dns_obeys_the_policy(c: &Client, remote: &Remote, allowed: &[&str], blocked: &[&str]) {
    let before = remote.dns_queries.load(Ordering::SeqCst);
    let got = resolves(c, blocked).await;
    assert_eq!(
        got,
        vec![false; blocked.len()],
        "{blocked:?}: a sandbox resolved through a resolver its policy forbids"
    );
    assert_eq!(
        remote.dns_queries.load(Ordering::SeqCst),
        before,
        "a forbidden query reached the resolver"
    );
    let got = resolves(c, allowed).await;
    assert_eq!(got, vec![true; allowed.len()], "{allowed:?}: no DNS");
    assert!(remote.dns_queries.load(Ordering::SeqCst) > before);
}
