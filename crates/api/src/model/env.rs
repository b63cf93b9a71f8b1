//! A sandbox's default environment and its secrets.
//!
//! `envs` (given at create, extended per child at branch) are added to the environment
//! of every exec; an exec's own `env` wins over them. `secrets` are the same for execs
//! but never shown by the API, and one created with `"inherit": false` is not given to
//! branch children. zygote never writes either into the guest: they exist there only in
//! the environment of the processes started through the API. That is all "not
//! inherited" can mean for a fork: a process of the parent that already read a secret
//! still holds it in the child's copy of its memory.
//!
//! A secret bound to hosts (`"hosts": ["api.openai.com"]`) is stronger: execs get a
//! placeholder (`zygote-secret-<32 hex>`, made at create, the same in branch children)
//! and the sandbox's egress proxy puts the value in its place in HTTPS requests to those
//! hosts only (`zygote_net::egress::secrets`). The value never enters the guest, so no
//! snapshot, pack or branch child can hold it, and deleting the sandbox revokes it. Such
//! a sandbox's execs also get the variables that make common TLS stacks trust the
//! daemon's egress CA ([`CA_ENV`]).
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::NameRule;
use crate::error::{RequestError, Result};

/// Most variables (envs and secrets together) per sandbox.
pub const MAX_ENV_VARS: usize = 128;
/// Longest value of one variable.
pub const MAX_ENV_VALUE: usize = 32 * 1024;
/// Most bytes of names and values together.
pub const MAX_ENV_BYTES: usize = 256 * 1024;
/// Longest variable name.
pub const MAX_ENV_NAME: usize = 256;

/// Bounds of a set of environment variables (see [`validate_vars_within`]).
#[derive(Debug, Clone, Copy)]
pub struct VarLimits {
    pub vars: usize,
    pub name_bytes: usize,
    pub value_bytes: usize,
    /// Names and values together.
    pub total_bytes: usize,
}

/// A sandbox's envs and secrets (and a branch child's additions).
pub const SANDBOX_VAR_LIMITS: VarLimits = VarLimits {
    vars: MAX_ENV_VARS,
    name_bytes: MAX_ENV_NAME,
    value_bytes: MAX_ENV_VALUE,
    total_bytes: MAX_ENV_BYTES,
};

/// Where the daemon puts its egress CA in a guest whose sandbox has secrets bound to
/// hosts, and the CA bundle it adds it to.
pub const GUEST_EGRESS_CA: &str = "/etc/zygote/egress-ca.pem";
pub const GUEST_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// What such a sandbox's execs get (below its envs): OpenSSL (curl, Python's `ssl`),
/// Python's requests and Node read the CA from these.
pub const CA_ENV: [(&str, &str); 4] = [
    ("SSL_CERT_FILE", GUEST_CA_BUNDLE),
    ("REQUESTS_CA_BUNDLE", GUEST_CA_BUNDLE),
    ("CURL_CA_BUNDLE", GUEST_CA_BUNDLE),
    ("NODE_EXTRA_CA_CERTS", GUEST_EGRESS_CA),
];

/// Hosts one secret may be bound to.
pub const MAX_SECRET_HOSTS: usize = 16;

/// A secret as given at create.
#[derive(Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretSpec {
    pub value: String,
    /// Whether branch children get it too (default true).
    #[serde(default = "yes")]
    pub inherit: bool,
    /// Bind the secret to these hosts (names or `*.` wildcards, `:port` optional, 443
    /// when absent): execs then see a placeholder, and the sandbox's egress proxy puts
    /// the value in its place in the headers of HTTPS requests to these hosts only,
    /// after verifying their certificates. At most 16. Needs the isolated network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_items = 16)]
    pub hosts: Option<Vec<String>>,
}

fn yes() -> bool {
    true
}

impl std::fmt::Debug for SecretSpec {
    // Secret values stay out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SecretSpec {{ value: <{} bytes>, inherit: {}, hosts: {:?} }}",
            self.value.len(),
            self.inherit,
            self.hosts
        )
    }
}

/// What the daemon stores per sandbox (a JSON column).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxEnv {
    #[serde(default)]
    pub vars: BTreeMap<String, String>,
    #[serde(default)]
    pub secrets: BTreeMap<String, StoredSecret>,
    /// What the sandbox's OCI image says execs run with (under `vars`).
    #[serde(default, skip_serializing_if = "ImageRun::is_empty")]
    pub image: ImageRun,
}

/// An OCI image's run configuration as execs get it: its `Env` below the sandbox's
/// envs, its `WorkingDir` and `User` when the exec names none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRun {
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
}

impl ImageRun {
    pub fn is_empty(&self) -> bool {
        self == &ImageRun::default()
    }

    /// From an image's stored run config (`KEY=value` entries; malformed ones skipped).
    pub fn of(info: &zygote_images::ImageInfo) -> ImageRun {
        let Some(oci) = &info.oci else {
            return ImageRun::default();
        };
        let c = &oci.config;
        ImageRun {
            env: c
                .env
                .iter()
                .filter_map(|kv| kv.split_once('='))
                .filter(|(k, _)| valid_name(k, MAX_ENV_NAME))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cwd: c.working_dir.clone(),
            uid: c.uid,
            gid: c.gid,
        }
    }

    /// Fills what an exec left open: working directory, user and group.
    pub fn defaults_for(&self, req: &mut zygote_proto::ExecRequest) {
        if req.cwd.is_none() {
            req.cwd = self.cwd.clone();
        }
        if req.uid.is_none() && req.gid.is_none() {
            req.uid = self.uid;
            req.gid = self.gid;
        }
    }
}

#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSecret {
    pub value: String,
    pub inherit: bool,
    /// Where the value may go (empty: it is an ordinary secret, given to execs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<NameRule>,
    /// What execs see instead of the value when `hosts` is not empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placeholder: Option<String>,
}

impl StoredSecret {
    /// What an exec's environment holds for it.
    pub fn exec_value(&self) -> &str {
        self.placeholder.as_deref().unwrap_or(&self.value)
    }
}

/// A fresh placeholder: not guessable, so a guest cannot name another sandbox's secret.
fn new_placeholder() -> String {
    let mut buf = [0u8; 16];
    // SAFETY: getrandom writes at most buf.len() bytes into buf.
    let got = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    assert_eq!(got, buf.len() as isize, "getrandom failed");
    let hex: String = buf.iter().map(|b| format!("{b:02x}")).collect();
    format!("zygote-secret-{hex}")
}

impl std::fmt::Debug for SandboxEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxEnv")
            .field("vars", &self.vars.keys().collect::<Vec<_>>())
            .field("secrets", &self.secrets.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// A secret's `hosts`, checked (name rules; at most [`MAX_SECRET_HOSTS`]).
fn bound_hosts(name: &str, hosts: &[String]) -> Result<Vec<NameRule>> {
    if hosts.len() > MAX_SECRET_HOSTS {
        return Err(RequestError::invalid(format!(
            "secret {name}: {} hosts; at most {MAX_SECRET_HOSTS}",
            hosts.len()
        )));
    }
    hosts
        .iter()
        .map(|h| {
            NameRule::parse(h)
                .map_err(|e| RequestError::invalid(format!("secret {name}: hosts: {e}")))
        })
        .collect()
}

fn valid_name(k: &str, max: usize) -> bool {
    let mut b = k.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
        && k.len() <= max
}

/// Check names (`[A-Za-z_][A-Za-z0-9_]*`), values (no NUL, bounded) and the totals of a
/// sandbox's variables ([`SANDBOX_VAR_LIMITS`]).
pub fn validate_vars<'a>(
    what: &str,
    vars: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<()> {
    validate_vars_within(what, vars, &SANDBOX_VAR_LIMITS)
}

/// As [`validate_vars`], within `limits`.
pub fn validate_vars_within<'a>(
    what: &str,
    vars: impl IntoIterator<Item = (&'a String, &'a String)>,
    limits: &VarLimits,
) -> Result<()> {
    let (mut n, mut bytes) = (0usize, 0usize);
    for (k, v) in vars {
        if !valid_name(k, limits.name_bytes) {
            return Err(RequestError::invalid(format!(
                "{what}: {:?} is not a variable name (letters, digits and _, not starting with a digit, at most {})",
                k.chars().take(limits.name_bytes + 8).collect::<String>(),
                limits.name_bytes
            )));
        }
        if v.contains('\0') {
            return Err(RequestError::invalid(format!(
                "{what}: the value of {k} contains a NUL byte"
            )));
        }
        if v.len() > limits.value_bytes {
            return Err(RequestError::invalid(format!(
                "{what}: the value of {k} is {} bytes, more than {}",
                v.len(),
                limits.value_bytes
            )));
        }
        n += 1;
        bytes += k.len() + v.len();
    }
    if n > limits.vars || bytes > limits.total_bytes {
        return Err(RequestError::invalid(format!(
            "{what}: {n} variables of {bytes} bytes; at most {} variables and {} bytes",
            limits.vars, limits.total_bytes
        )));
    }
    Ok(())
}

impl SandboxEnv {
    /// From a create request's `envs` and `secrets` (validated together: a name may
    /// not be both).
    pub fn new(
        envs: &BTreeMap<String, String>,
        secrets: &BTreeMap<String, SecretSpec>,
    ) -> Result<SandboxEnv> {
        if let Some(k) = envs.keys().find(|k| secrets.contains_key(*k)) {
            return Err(RequestError::invalid(format!(
                "{k} is given both in envs and in secrets"
            )));
        }
        let env = SandboxEnv {
            image: ImageRun::default(),
            vars: envs.clone(),
            secrets: secrets
                .iter()
                .map(|(k, s)| {
                    let hosts = bound_hosts(k, s.hosts.as_deref().unwrap_or_default())?;
                    let stored = StoredSecret {
                        value: s.value.clone(),
                        inherit: s.inherit,
                        placeholder: (!hosts.is_empty()).then(new_placeholder),
                        hosts,
                    };
                    Ok((k.clone(), stored))
                })
                .collect::<Result<_>>()?,
        };
        env.validate()?;
        Ok(env)
    }

    fn validate(&self) -> Result<()> {
        let secrets = self.secrets.iter().map(|(k, s)| (k, &s.value));
        validate_vars("envs and secrets", self.vars.iter().chain(secrets))
    }

    /// A branch child's: the parent's envs with `extra` over them, and the parent's
    /// inherited secrets (a secret's name given in `extra` replaces it).
    pub fn for_child(&self, extra: Option<&BTreeMap<String, String>>) -> Result<SandboxEnv> {
        let mut child = SandboxEnv {
            image: self.image.clone(),
            vars: self.vars.clone(),
            secrets: self
                .secrets
                .iter()
                .filter(|(_, s)| s.inherit)
                .map(|(k, s)| (k.clone(), s.clone()))
                .collect(),
        };
        for (k, v) in extra.into_iter().flatten() {
            child.secrets.remove(k);
            child.vars.insert(k.clone(), v.clone());
        }
        child.validate()?;
        Ok(child)
    }

    /// What an exec's environment starts from (its own `env` goes over it).
    pub fn exec_env(&self) -> BTreeMap<String, String> {
        let mut env = self.image.env.clone();
        if self.has_bound_secrets() {
            env.extend(CA_ENV.map(|(k, v)| (k.to_string(), v.to_string())));
        }
        env.extend(self.vars.clone());
        env.extend(
            self.secrets
                .iter()
                .map(|(k, s)| (k.clone(), s.exec_value().to_string())),
        );
        env
    }

    /// Whether a secret is bound to hosts (the guest must then trust the egress CA).
    pub fn has_bound_secrets(&self) -> bool {
        self.secrets.values().any(|s| !s.hosts.is_empty())
    }

    /// The secrets bound to hosts: (name, secret).
    pub fn bound_secrets(&self) -> impl Iterator<Item = (&String, &StoredSecret)> {
        self.secrets.iter().filter(|(_, s)| !s.hosts.is_empty())
    }

    /// Names of the secrets (values are never shown).
    pub fn secret_names(&self) -> Vec<String> {
        self.secrets.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn children_get_envs_plus_their_own_and_only_inherited_secrets() {
        let secrets = BTreeMap::from([
            (
                "KEEP".to_string(),
                SecretSpec {
                    value: "k".into(),
                    inherit: true,
                    hosts: None,
                },
            ),
            (
                "DROP".to_string(),
                SecretSpec {
                    value: "d".into(),
                    inherit: false,
                    hosts: None,
                },
            ),
        ]);
        let parent = SandboxEnv::new(&map(&[("A", "1"), ("B", "2")]), &secrets).unwrap();
        assert_eq!(
            parent.exec_env(),
            map(&[("A", "1"), ("B", "2"), ("DROP", "d"), ("KEEP", "k")])
        );
        let child = parent
            .for_child(Some(&map(&[("B", "child"), ("SEED", "7")])))
            .unwrap();
        assert_eq!(
            child.exec_env(),
            map(&[("A", "1"), ("B", "child"), ("KEEP", "k"), ("SEED", "7")])
        );
        assert_eq!(child.secret_names(), ["KEEP"]);
        // Debug output names secrets but never shows their values.
        assert!(!format!("{parent:?}").contains("\"k\""));
    }

    #[test]
    fn bad_names_values_and_sizes_are_refused() {
        let none = BTreeMap::new();
        for bad in ["", "1A", "A-B", "A=B", "A B"] {
            assert!(
                SandboxEnv::new(&map(&[(bad, "x")]), &none).is_err(),
                "{bad:?}"
            );
        }
        assert!(SandboxEnv::new(&map(&[("A", "x\0y")]), &none).is_err());
        let big = "x".repeat(MAX_ENV_VALUE + 1);
        assert!(SandboxEnv::new(&map(&[("A", &big)]), &none).is_err());
        let many: BTreeMap<String, String> = (0..=MAX_ENV_VARS)
            .map(|i| (format!("V{i}"), "x".into()))
            .collect();
        assert!(SandboxEnv::new(&many, &none).is_err());
        let both = BTreeMap::from([(
            "A".to_string(),
            SecretSpec {
                value: "s".into(),
                inherit: true,
                hosts: None,
            },
        )]);
        assert!(SandboxEnv::new(&map(&[("A", "x")]), &both).is_err());
    }

    fn bound(value: &str, hosts: &[&str], inherit: bool) -> SecretSpec {
        SecretSpec {
            value: value.into(),
            inherit,
            hosts: Some(hosts.iter().map(|h| h.to_string()).collect()),
        }
    }

    #[test]
    fn secrets_bound_to_hosts_give_execs_placeholders_and_the_ca() {
        let secrets = BTreeMap::from([
            (
                "KEY".to_string(),
                bound("sk-real", &["api.openai.com"], true),
            ),
            (
                "ONCE".to_string(),
                bound("o-real", &["*.example.com:8443"], false),
            ),
        ]);
        let env = SandboxEnv::new(&map(&[("SSL_CERT_FILE", "/mine.pem")]), &secrets).unwrap();
        let exec = env.exec_env();
        let key = &exec["KEY"];
        assert!(
            key.starts_with("zygote-secret-") && key.len() == 14 + 32,
            "{key}"
        );
        assert!(!exec.values().any(|v| v.contains("real")), "{exec:?}");
        assert_eq!(exec["SSL_CERT_FILE"], "/mine.pem", "the sandbox's envs win");
        assert_eq!(exec["NODE_EXTRA_CA_CERTS"], GUEST_EGRESS_CA);
        assert_ne!(exec["KEY"], exec["ONCE"]);
        // Another sandbox made from the same request gets other placeholders.
        let other = SandboxEnv::new(&BTreeMap::new(), &secrets).unwrap();
        assert_ne!(other.exec_env()["KEY"], *key);
        // A child keeps the placeholder (its memory holds the parent's), and only the
        // inherited secrets.
        let child = env.for_child(None).unwrap();
        assert_eq!(child.exec_env()["KEY"], *key);
        assert_eq!(child.bound_secrets().count(), 1);
        // The stored form keeps value, hosts and placeholder (a daemon restart).
        let json = serde_json::to_string(&env).unwrap();
        let back: SandboxEnv = serde_json::from_str(&json).unwrap();
        assert_eq!(back, env);
        // Without hosts, nothing changes: the value itself, no CA variables.
        let plain = BTreeMap::from([(
            "P".to_string(),
            SecretSpec {
                value: "p".into(),
                inherit: true,
                hosts: None,
            },
        )]);
        let env = SandboxEnv::new(&BTreeMap::new(), &plain).unwrap();
        assert_eq!(env.exec_env(), map(&[("P", "p")]));
    }

    #[test]
    fn bad_hosts_are_refused_with_the_reason() {
        for hosts in [
            vec!["*.com"],
            vec!["bad host"],
            vec!["10.0.0.1"],
            vec!["a.example:0"],
        ] {
            let secrets = BTreeMap::from([("K".to_string(), bound("v", &hosts, true))]);
            let e = SandboxEnv::new(&BTreeMap::new(), &secrets).unwrap_err();
            assert!(e.to_string().contains("secret K: hosts"), "{e}");
        }
        let many: Vec<String> = (0..=MAX_SECRET_HOSTS)
            .map(|i| format!("h{i}.example"))
            .collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let secrets = BTreeMap::from([("K".to_string(), bound("v", &many, true))]);
        assert!(SandboxEnv::new(&BTreeMap::new(), &secrets).is_err());
    }
}
