//! Secrets bound to hosts: the guest holds only a placeholder; the egress proxy puts
//! the real value in its place in the request headers of HTTPS connections to the
//! hosts the secret names, and nowhere else (pure; unit-tested here).
//!
//! Only over TLS whose server proved the name (`super::intercept`): in plain HTTP the
//! destination is whatever address the guest chose and the value would cross the
//! network in clear, so there the placeholder goes out literally. A response header
//! that carries a value back (an echoing server) gets the placeholder again, so the
//! value does not reach the guest by that road either (bodies are not rewritten).
use std::fmt;

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use zygote_api::model::NameRule;

/// Hosts one secret may have.
pub const MAX_SECRET_HOSTS: usize = 16;

/// One secret as the egress proxy of its sandbox holds it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretBinding {
    /// The variable's name (for the egress record; never the value).
    pub name: String,
    /// What the guest sees instead of the value.
    pub placeholder: String,
    pub value: String,
    /// Where the value may go (a name rule: name or `*.` wildcard, ports; 443 when it
    /// names none).
    pub hosts: Vec<NameRule>,
}

impl fmt::Debug for SecretBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretBinding")
            .field("name", &self.name)
            .field("value", &format_args!("<{} bytes>", self.value.len()))
            .field("hosts", &self.hosts)
            .finish()
    }
}

/// The ports a host binding covers when it names none: HTTPS only (see the module doc).
pub const DEFAULT_SECRET_PORTS: [u16; 1] = [443];

fn ports(rule: &NameRule) -> &[u16] {
    if rule.ports.is_empty() {
        &DEFAULT_SECRET_PORTS
    } else {
        &rule.ports
    }
}

impl SecretBinding {
    /// Whether the value may go to `host` on `port`.
    pub fn bound_to(&self, host: &str, port: u16) -> bool {
        self.hosts
            .iter()
            .any(|r| ports(r).contains(&port) && r.matches(host))
    }
}

/// The TCP ports whose connections the proxy must see to swap these secrets.
pub fn intercept_ports(bindings: &[SecretBinding]) -> Vec<u16> {
    let mut out: Vec<u16> = bindings
        .iter()
        .flat_map(|b| b.hosts.iter().flat_map(|r| ports(r).to_vec()))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The secrets whose value may go to `host` on `port`.
pub fn bound_for<'a>(
    bindings: &'a [SecretBinding],
    host: &str,
    port: u16,
) -> Vec<&'a SecretBinding> {
    bindings.iter().filter(|b| b.bound_to(host, port)).collect()
}

/// A request header's value with each placeholder of `secrets` replaced by its value
/// (also inside `Basic` credentials, which carry them base64-encoded); None when it
/// holds none. The names of the secrets used go to `used`.
pub fn swap_in(header: &str, secrets: &[&SecretBinding], used: &mut Vec<String>) -> Option<String> {
    let mut out = header.to_string();
    let mut changed = false;
    for s in secrets {
        if out.contains(&s.placeholder) {
            out = out.replace(&s.placeholder, &s.value);
            changed = true;
            note(used, &s.name);
        }
    }
    if let Some(basic) = basic_credentials(header) {
        let mut decoded = basic;
        let mut swapped = false;
        for s in secrets {
            if decoded.contains(&s.placeholder) {
                decoded = decoded.replace(&s.placeholder, &s.value);
                swapped = true;
                note(used, &s.name);
            }
        }
        if swapped {
            return Some(format!("Basic {}", base64_encode(decoded.as_bytes())));
        }
    }
    changed.then_some(out)
}

/// A response header's value with each secret's value replaced by its placeholder;
/// None when it holds none.
pub fn swap_out(header: &str, secrets: &[&SecretBinding]) -> Option<String> {
    let mut out = header.to_string();
    let mut changed = false;
    for s in secrets.iter().filter(|s| !s.value.is_empty()) {
        if out.contains(&s.value) {
            out = out.replace(&s.value, &s.placeholder);
            changed = true;
        }
    }
    changed.then_some(out)
}

fn note(used: &mut Vec<String>, name: &str) {
    if !used.iter().any(|u| u == name) {
        used.push(name.to_string());
    }
}

/// Standard base64 as `Basic` credentials carry it: padding optional, trailing bits
/// not checked (what a client sends is swapped if it decodes at all).
const BASIC_B64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

fn base64_encode(bytes: &[u8]) -> String {
    BASIC_B64.encode(bytes)
}

/// The decoded credentials of `Basic <base64>` (None: another scheme, or not base64 of
/// UTF-8).
fn basic_credentials(header: &str) -> Option<String> {
    let (scheme, rest) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    String::from_utf8(base64_decode(rest.trim())?).ok()
}

/// Standard base64 (padding optional); None on any other byte.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    BASIC_B64.decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(name: &str, value: &str, hosts: &[&str]) -> SecretBinding {
        SecretBinding {
            name: name.into(),
            placeholder: format!("zygote-secret-{name}-0123"),
            value: value.into(),
            hosts: hosts.iter().map(|h| NameRule::parse(h).unwrap()).collect(),
        }
    }

    #[test]
    fn a_secret_is_bound_to_exactly_its_hosts_and_ports() {
        let b = binding("K", "v", &["api.openai.com", "*.corp.example:8443"]);
        assert!(b.bound_to("api.openai.com", 443));
        assert!(b.bound_to("API.OpenAI.com.", 443));
        assert!(
            !b.bound_to("api.openai.com", 80),
            "plain HTTP by default: never"
        );
        assert!(!b.bound_to("openai.com", 443));
        assert!(!b.bound_to("api.openai.com.evil.test", 443));
        assert!(b.bound_to("x.corp.example", 8443));
        assert!(
            !b.bound_to("corp.example", 8443),
            "the wildcard needs a label"
        );
        assert!(!b.bound_to("x.corp.example", 443));
        assert_eq!(intercept_ports(&[b]), vec![443, 8443]);
    }

    #[test]
    fn placeholders_are_swapped_in_and_values_out() {
        let k = binding("K", "sk-real", &["a.example"]);
        let j = binding("J", "j-real", &["a.example"]);
        let both = [&k, &j];
        let mut used = Vec::new();
        let bearer = format!("Bearer {}", k.placeholder);
        assert_eq!(
            swap_in(&bearer, &both, &mut used).as_deref(),
            Some("Bearer sk-real")
        );
        assert_eq!(swap_in("Bearer other", &both, &mut used), None);
        assert_eq!(used, ["K"]);
        let basic = format!(
            "Basic {}",
            base64_encode(format!("u:{}", j.placeholder).as_bytes())
        );
        let swapped = swap_in(&basic, &both, &mut used).unwrap();
        assert_eq!(basic_credentials(&swapped).as_deref(), Some("u:j-real"));
        assert_eq!(used, ["K", "J"]);
        assert_eq!(
            swap_out("echo: sk-real", &both).as_deref(),
            Some(format!("echo: {}", k.placeholder).as_str())
        );
        assert_eq!(swap_out("nothing", &both), None);
        assert!(!format!("{k:?}").contains("sk-real"));
    }

    #[test]
    fn base64_round_trips_and_refuses_garbage() {
        for s in ["a", "ab", "abc", "abcd", "user:pa ss:wörd"] {
            let enc = base64_encode(s.as_bytes());
            assert_eq!(
                basic_credentials(&format!("Basic {enc}")).as_deref(),
                Some(s)
            );
        }
        assert_eq!(base64_encode(b"user:pass"), "dXNlcjpwYXNz");
        assert_eq!(basic_credentials("Basic ***"), None);
        assert_eq!(basic_credentials("Bearer dXNlcjpwYXNz"), None);
    }
}
