//! Rules by name in `allow_out` / `deny_out`: `pypi.org`, `*.github.com`, optionally
//! with a port (`internal.example.com:8443`; default: 80 and 443).
//!
//! A name is written in ASCII (internationalized names in their `xn--` form), letters,
//! digits and `-` in labels of at most 63 characters, at most 253 in all, two labels
//! at least, the last not all digits (so a mistyped address is never read as a name).
//! `*.` may stand before it, alone: `*.github.com` matches every name under
//! `github.com` (`api.github.com`, `a.b.github.com`) but not `github.com` itself and
//! not `evilgithub.com`; no other `*` is allowed. Matching ignores case and a trailing
//! dot.
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{RequestError, Result};

/// The ports a name rule covers when it names none.
pub const DEFAULT_NAME_PORTS: [u16; 2] = [80, 443];

/// One name rule, checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameRule {
    /// Lower-case, without a trailing dot; `*.` first for a wildcard.
    pub pattern: String,
    /// Empty: [`DEFAULT_NAME_PORTS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
}

impl NameRule {
    /// Whether `s` is meant as a name rule rather than an address or CIDR: it has a
    /// letter, a `*` or a `-` outside of any `/len` (`10.0.0.1/8` and `1.2.3` are bad
    /// CIDRs, not names).
    pub fn looks_like_name(s: &str) -> bool {
        !s.contains('/')
            && s.bytes()
                .any(|b| b.is_ascii_alphabetic() || b == b'*' || b == b'-' || b == b'_')
    }

    pub fn parse(s: &str) -> Result<NameRule> {
        let bad = |why: String| RequestError::invalid(format!("{s:?} is not a name rule: {why}"));
        let lower = s.trim().to_ascii_lowercase();
        let (host, ports) = match lower.rsplit_once(':') {
            Some((host, port)) => {
                let port: u16 = port
                    .parse()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| bad(format!("{port:?} is not a port (1..=65535)")))?;
                (host, vec![port])
            }
            None => (lower.as_str(), Vec::new()),
        };
        let host = host.strip_suffix('.').unwrap_or(host);
        let (wildcard, name) = match host.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, host),
        };
        if name.contains('*') {
            return Err(bad(
                "`*` may only stand alone as the first label (`*.example.com`)".into(),
            ));
        }
        if name.len() > 253 {
            return Err(bad("longer than 253 characters".into()));
        }
        let labels: Vec<&str> = name.split('.').collect();
        if labels.len() < 2 {
            return Err(bad(
                "a name needs two labels at least (`example.com`)".into()
            ));
        }
        for label in &labels {
            let ldh = label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if label.is_empty() || label.len() > 63 || !ldh {
                return Err(bad(format!(
                    "label {label:?} must be 1 to 63 letters, digits or `-` \
                     (internationalized names in their xn-- form)"
                )));
            }
            if label.starts_with('-') || label.ends_with('-') {
                return Err(bad(format!("label {label:?} starts or ends with `-`")));
            }
        }
        if labels
            .last()
            .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(bad("the last label is all digits (an address?)".into()));
        }
        Ok(NameRule {
            pattern: if wildcard {
                format!("*.{name}")
            } else {
                name.to_string()
            },
            ports,
        })
    }

    pub fn ports(&self) -> &[u16] {
        if self.ports.is_empty() {
            &DEFAULT_NAME_PORTS
        } else {
            &self.ports
        }
    }

    /// Whether `name` (any case, trailing dot or not) is one this rule names.
    pub fn matches(&self, name: &str) -> bool {
        let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
        match self.pattern.strip_prefix("*.") {
            Some(base) => name
                .strip_suffix(base)
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            None => name == self.pattern,
        }
    }

    /// Whether this rule names `name` on `port`.
    pub fn matches_on(&self, name: &str, port: u16) -> bool {
        self.ports().contains(&port) && self.matches(name)
    }
}

impl fmt::Display for NameRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.pattern)?;
        if let [port] = self.ports.as_slice() {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_wildcards_parse_strictly() {
        let r = NameRule::parse("PyPI.org.").unwrap();
        assert_eq!(
            (r.pattern.as_str(), r.ports()),
            ("pypi.org", &[80, 443][..])
        );
        let r = NameRule::parse("*.GitHub.com:8443").unwrap();
        assert_eq!(
            (r.pattern.as_str(), r.ports()),
            ("*.github.com", &[8443][..])
        );
        assert_eq!(r.to_string(), "*.github.com:8443");
        assert_eq!(
            NameRule::parse("xn--bcher-kva.example").unwrap().pattern,
            "xn--bcher-kva.example"
        );
        for (bad, why) in [
            ("com", "two labels"),
            ("*.com", "two labels"),
            ("*", "first label"),
            ("a.*.com", "first label"),
            ("*a.com", "first label"),
            ("**.a.com", "first label"),
            ("a..com", "label \"\""),
            ("-a.com", "starts or ends"),
            ("a_b.com", "letters, digits"),
            ("bücher.de", "xn--"),
            ("a.com:0", "not a port"),
            ("a.com:65536", "not a port"),
            ("a.com:http", "not a port"),
            ("a.123", "all digits"),
        ] {
            let e = NameRule::parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let long = format!("{}.com", "a".repeat(64));
        assert!(NameRule::parse(&long)
            .unwrap_err()
            .to_string()
            .contains("63"));
        let long = format!("{}com", "abcdefghi.".repeat(26));
        assert!(NameRule::parse(&long)
            .unwrap_err()
            .to_string()
            .contains("253"));
    }

    #[test]
    fn wildcards_match_only_what_they_say() {
        let w = NameRule::parse("*.github.com").unwrap();
        for yes in ["api.github.com", "a.b.github.com", "API.GitHub.com."] {
            assert!(w.matches(yes), "{yes}");
        }
        for no in [
            "github.com",
            "evilgithub.com",
            "github.com.evil.org",
            ".github.com",
            "xgithub.com",
        ] {
            assert!(!w.matches(no), "{no}");
        }
        let exact = NameRule::parse("pypi.org").unwrap();
        assert!(exact.matches("PYPI.org.") && !exact.matches("files.pypi.org"));
        assert!(!exact.matches("pypi.org.evil.com") && !exact.matches("xpypi.org"));
        assert!(exact.matches_on("pypi.org", 443) && !exact.matches_on("pypi.org", 22));
        let port = NameRule::parse("pypi.org:8080").unwrap();
        assert!(port.matches_on("pypi.org", 8080) && !port.matches_on("pypi.org", 443));
    }

    #[test]
    fn what_looks_like_a_name() {
        for name in ["pypi.org", "*.github.com", "a-b.c", "a.com:443"] {
            assert!(NameRule::looks_like_name(name), "{name}");
        }
        for cidr in [
            "10.0.0.0/8",
            "1.2.3.4",
            "1.2.3",
            "",
            "::1/128",
            "10.0.0.1/8",
        ] {
            assert!(!NameRule::looks_like_name(cidr), "{cidr}");
        }
    }
}
