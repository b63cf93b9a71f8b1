use super::*;
use zygote_api::model::{NetworkMode, NetworkRequest};

fn policy(allow: Option<&[&str]>, deny: &[&str]) -> NetworkPolicy {
    let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    NetworkRequest {
        network: None,
        allow_out: allow.map(own),
        deny_out: Some(own(deny)),
    }
    .policy()
    .unwrap()
}

const PYPI: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
const OTHER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);

fn attempt(addr: Ipv4Addr, port: u16, name: &str) -> Attempt<'_> {
    Attempt {
        addr,
        port,
        name: Ok(name),
    }
}

/// The book says: pypi.org answered PYPI.
fn book(addr: Ipv4Addr, name: &str) -> bool {
    addr == PYPI && name == "pypi.org"
}

fn refused(v: Verdict, why: &str) {
    match v {
        Verdict::Refused(r) => assert!(r.contains(why), "{r} (wanted {why})"),
        other => panic!("{other:?} (wanted refused: {why})"),
    }
}

#[test]
fn allowed_names_need_their_own_dns_answers() {
    let p = [policy(
        Some(&["pypi.org", "*.github.com", "10.77.0.0/24"]),
        &[],
    )];
    assert!(matches!(
        judge(&p, &attempt(PYPI, 443, "pypi.org"), book),
        Verdict::Allowed(_)
    ));
    assert!(matches!(
        judge(&p, &attempt(PYPI, 80, "PYPI.org"), |a, n| book(
            a,
            &n.to_lowercase()
        )),
        Verdict::Allowed(_)
    ));
    // Forged SNI/Host: the name is allowed, the address came from no answer for it.
    refused(
        judge(&p, &attempt(OTHER, 443, "pypi.org"), book),
        "not in this sandbox's DNS answers",
    );
    // An address from pypi.org's answer, under another (allowed) name.
    refused(
        judge(&p, &attempt(PYPI, 443, "api.github.com"), book),
        "DNS answers for api.github.com",
    );
    // Unlisted name; listed name on a port the rule does not cover.
    refused(
        judge(&p, &attempt(PYPI, 443, "evil.org"), book),
        "does not name evil.org",
    );
    refused(
        judge(&p, &attempt(PYPI, 8443, "pypi.org"), book),
        "on port 8443",
    );
    // No name at all.
    let anon = Attempt {
        addr: PYPI,
        port: 443,
        name: Err("TLS without a server name (SNI)".into()),
    };
    refused(judge(&p, &anon, book), "no host named");
    // CIDRs keep working: an address the list holds needs no name.
    let listed = Ipv4Addr::new(10, 77, 0, 5);
    let by_addr = Attempt {
        addr: listed,
        port: 443,
        name: Err("x".into()),
    };
    assert!(matches!(judge(&p, &by_addr, book), Verdict::Allowed(_)));
}

#[test]
fn denials_and_modes_come_first() {
    let p = [policy(None, &["*.evil.org", "192.0.2.0/24"])];
    refused(
        judge(&p, &attempt(OTHER, 443, "x.evil.org"), book),
        "deny_out names x.evil.org",
    );
    refused(
        judge(&p, &attempt(PYPI, 443, "pypi.org"), book),
        "deny_out lists 192.0.2.10",
    );
    assert!(matches!(
        judge(&p, &attempt(OTHER, 443, "evil.org"), book),
        Verdict::Allowed(_)
    ));
    for never in ["169.254.169.254", "10.213.0.1", "10.214.0.5", "127.0.0.1"] {
        let a = attempt(never.parse().unwrap(), 443, "pypi.org");
        refused(
            judge(&[policy(Some(&["pypi.org"]), &[])], &a, |_, _| true),
            "never reachable",
        );
    }
    let none = NetworkPolicy {
        mode: NetworkMode::None,
        ..Default::default()
    };
    refused(
        judge(&[none], &attempt(PYPI, 443, "pypi.org"), book),
        "none",
    );
    refused(
        judge(&[], &attempt(PYPI, 443, "pypi.org"), book),
        "no policy",
    );
    // During a change both must allow.
    let open = policy(None, &[]);
    let only_github = policy(Some(&["*.github.com"]), &[]);
    refused(
        judge(
            &[open.clone(), only_github.clone()],
            &attempt(PYPI, 443, "pypi.org"),
            book,
        ),
        "does not name",
    );
    assert_eq!(
        named_ports(&[open, only_github, policy(Some(&["a.org:8080"]), &[])]),
        [80, 443, 8080]
    );
}

#[test]
fn the_book_vouches_for_a_bounded_time_and_size() {
    let t0 = Instant::now();
    let mut b = AnswerBook::default();
    b.record("pypi.org", &[(PYPI, 0), (OTHER, 7200)], t0);
    assert!(b.vouches(PYPI, "pypi.org", t0 + Duration::from_secs(29)));
    assert!(!b.vouches(PYPI, "pypi.org", t0 + MIN_VOUCH));
    assert!(!b.vouches(PYPI, "files.pypi.org", t0));
    assert!(b.vouches(OTHER, "pypi.org", t0 + Duration::from_secs(3599)));
    assert!(!b.vouches(OTHER, "pypi.org", t0 + MAX_VOUCH));
    // A flood of unique answers stays bounded; the newest still vouch.
    for i in 0..(3 * MAX_ANSWERS as u32) {
        let addr = Ipv4Addr::from(0x0a00_0000 + i);
        b.record(&format!("n{i}.example"), &[(addr, 60 + i)], t0);
        assert!(b.len() <= MAX_ANSWERS);
    }
    let last = 3 * MAX_ANSWERS as u32 - 1;
    assert!(b.vouches(
        Ipv4Addr::from(0x0a00_0000 + last),
        &format!("n{last}.example"),
        t0
    ));
}
