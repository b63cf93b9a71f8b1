//! A sandbox's default environment and its secrets.
//!
//! `envs` (given at create, extended per child at branch) are added to the environment
//! of every exec; an exec's own `env` wins over them. `secrets` are the same for execs
//! but never shown by the API, and one created with `"inherit": false` is not given to
//! branch children. zygote never writes either into the guest: they exist there only in
//! the environment of the processes started through the API. That is all "not
//! inherited" can mean for a fork: a process of the parent that already read a secret
//! still holds it in the child's copy of its memory.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::{RequestError, Result};

/// Most variables (envs and secrets together) per sandbox.
pub const MAX_ENV_VARS: usize = 128;
/// Longest value of one variable.
pub const MAX_ENV_VALUE: usize = 32 * 1024;
/// Most bytes of names and values together.
pub const MAX_ENV_BYTES: usize = 256 * 1024;

/// A secret as given at create.
#[derive(Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretSpec {
    pub value: String,
    /// Whether branch children get it too (default true).
    #[serde(default = "yes")]
    pub inherit: bool,
}

fn yes() -> bool {
    true
}

impl std::fmt::Debug for SecretSpec {
    // Secret values stay out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SecretSpec {{ value: <{} bytes>, inherit: {} }}",
            self.value.len(),
            self.inherit
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
                .filter(|(k, _)| valid_name(k))
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
}

impl std::fmt::Debug for SandboxEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxEnv")
            .field("vars", &self.vars.keys().collect::<Vec<_>>())
            .field("secrets", &self.secrets.keys().collect::<Vec<_>>())
            .finish()
    }
}

fn valid_name(k: &str) -> bool {
    let mut b = k.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
        && k.len() <= 256
}

/// Check names (`[A-Za-z_][A-Za-z0-9_]*`), values (no NUL, bounded) and the totals.
pub fn validate_vars<'a>(
    what: &str,
    vars: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<()> {
    let (mut n, mut bytes) = (0usize, 0usize);
    for (k, v) in vars {
        if !valid_name(k) {
            return Err(RequestError::invalid(format!(
                "{what}: {k:?} is not a variable name (letters, digits and _, not starting with a digit, at most 256)"
            )));
        }
        if v.contains('\0') {
            return Err(RequestError::invalid(format!(
                "{what}: the value of {k} contains a NUL byte"
            )));
        }
        if v.len() > MAX_ENV_VALUE {
            return Err(RequestError::invalid(format!(
                "{what}: the value of {k} is {} bytes, more than {MAX_ENV_VALUE}",
                v.len()
            )));
        }
        n += 1;
        bytes += k.len() + v.len();
    }
    if n > MAX_ENV_VARS || bytes > MAX_ENV_BYTES {
        return Err(RequestError::invalid(format!(
            "{what}: {n} variables of {bytes} bytes; at most {MAX_ENV_VARS} variables and {MAX_ENV_BYTES} bytes"
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
                    let stored = StoredSecret {
                        value: s.value.clone(),
                        inherit: s.inherit,
                    };
                    (k.clone(), stored)
                })
                .collect(),
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
        env.extend(self.vars.clone());
        env.extend(
            self.secrets
                .iter()
                .map(|(k, s)| (k.clone(), s.value.clone())),
        );
        env
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
                },
            ),
            (
                "DROP".to_string(),
                SecretSpec {
                    value: "d".into(),
                    inherit: false,
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
            },
        )]);
        assert!(SandboxEnv::new(&map(&[("A", "x")]), &both).is_err());
    }
}
