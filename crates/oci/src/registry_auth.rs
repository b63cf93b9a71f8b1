//! Registry authentication as the distribution spec and docker do it: a request
//! answered 401 names, in `WWW-Authenticate`, either `Basic` (the credentials go with
//! every request) or `Bearer` with a token service (`realm`) to ask for a token for the
//! repository, with the credentials if there are any.
//!
//! Both the challenge and the token service's answer come from the registry, which is
//! not trusted: the challenge is only parsed (hyper bounds its size), the token answer
//! is read with a cap (`registry_http.rs`), a token that could inject headers is
//! refused, and no credential is sent in answer to a challenge that did not come from
//! the registry's own host or to a token service over plain HTTP (`registry_http.rs`).

/// Credentials for a registry.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum Credentials {
    #[default]
    Anonymous,
    Basic {
        user: String,
        password: String,
    },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Anonymous => write!(f, "Anonymous"),
            Credentials::Basic { user, .. } => write!(f, "Basic({user:?}, <password>)"),
        }
    }
}

impl Credentials {
    pub fn is_anonymous(&self) -> bool {
        matches!(self, Credentials::Anonymous)
    }
}

/// What a 401 asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
    },
}

/// The challenges of `WWW-Authenticate` values that zygote can answer, Bearer first
/// (a registry offering both prefers it).
pub(crate) fn parse_challenges<'a>(values: impl Iterator<Item = &'a str>) -> Vec<Challenge> {
    let mut out = Vec::new();
    for value in values {
        for (scheme, params) in split_challenges(value) {
            let param = |name: &str| {
                params
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.clone())
            };
            if scheme.eq_ignore_ascii_case("bearer") {
                if let Some(realm) = param("realm").filter(|r| !r.is_empty()) {
                    out.push(Challenge::Bearer {
                        realm,
                        service: param("service"),
                    });
                }
            } else if scheme.eq_ignore_ascii_case("basic") {
                out.push(Challenge::Basic);
            }
        }
    }
    out.sort_by_key(|c| matches!(c, Challenge::Basic));
    out
}

/// RFC 7235 challenges: `scheme k=v, k="quoted \" v", scheme2 k=v`.
fn split_challenges(value: &str) -> Vec<(String, Vec<(String, String)>)> {
    let mut out: Vec<(String, Vec<(String, String)>)> = Vec::new();
    let mut rest = value;
    loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        if rest.is_empty() {
            return out;
        }
        let end = rest.find([' ', '\t', ',', '=']).unwrap_or(rest.len());
        let (token, after) = rest.split_at(end);
        let after_ws = after.trim_start_matches([' ', '\t']);
        if let (Some(value_start), Some(current)) = (after_ws.strip_prefix('='), out.last_mut()) {
            // A parameter of the current challenge.
            let value_start = value_start.trim_start_matches([' ', '\t']);
            let (value, remaining) = parameter_value(value_start);
            current.1.push((token.to_string(), value));
            rest = remaining;
        } else if token.is_empty() {
            // A stray `=` with no challenge: nothing more can be understood.
            return out;
        } else {
            out.push((token.to_string(), Vec::new()));
            rest = after;
        }
    }
}

/// A quoted string (with `\` escapes) or a token; what follows it.
fn parameter_value(s: &str) -> (String, &str) {
    let Some(quoted) = s.strip_prefix('"') else {
        let end = s.find([',', ' ', '\t']).unwrap_or(s.len());
        return (s[..end].to_string(), &s[end..]);
    };
    let mut value = String::new();
    let mut chars = quoted.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return (value, &quoted[i + 1..]),
            '\\' => {
                if let Some((_, escaped)) = chars.next() {
                    value.push(escaped);
                }
            }
            c => value.push(c),
        }
    }
    (value, "")
}

/// A token service's answer (`token`, or OAuth2's `access_token`).
#[derive(serde::Deserialize)]
pub(crate) struct TokenAnswer {
    token: Option<String>,
    access_token: Option<String>,
}

impl TokenAnswer {
    pub fn into_token(self) -> Option<String> {
        self.token
            .or(self.access_token)
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_parse_as_registries_send_them() {
        let hub = r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/alpine:pull""#;
        assert_eq!(
            parse_challenges([hub].into_iter()),
            vec![Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
            }]
        );
        // Two challenges in one value, an escaped quote, a token value; Bearer first.
        let both = r#"Basic realm="x \"y\"", Bearer realm=http://t/token , service = s"#;
        assert_eq!(
            parse_challenges([both].into_iter()),
            vec![
                Challenge::Bearer {
                    realm: "http://t/token".into(),
                    service: Some("s".into()),
                },
                Challenge::Basic,
            ]
        );
        // Nothing usable: an unknown scheme, a Bearer without a realm, garbage.
        for junk in [
            "Negotiate",
            "Bearer service=x",
            "=,=",
            "",
            "\"",
            "Bearer realm=\"",
        ] {
            let got = parse_challenges([junk].into_iter());
            assert!(got.is_empty(), "{junk:?}: {got:?}");
        }
    }

    #[test]
    fn credentials_never_show_the_password() {
        let c = Credentials::Basic {
            user: "alice".into(),
            password: "s3cret".into(),
        };
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn token_answers_need_a_printable_token() {
        let parse = |s: &str| serde_json::from_str::<TokenAnswer>(s).unwrap().into_token();
        assert_eq!(parse(r#"{"token":"abc"}"#).as_deref(), Some("abc"));
        assert_eq!(parse(r#"{"access_token":"xyz"}"#).as_deref(), Some("xyz"));
        assert_eq!(parse(r#"{"token":"a\r\nInjected: 1"}"#), None);
        assert_eq!(parse(r#"{}"#), None);
    }
}
