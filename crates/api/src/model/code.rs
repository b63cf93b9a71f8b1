//! The code interpreter (`POST /v1/sandboxes/{id}/code`, image `code-interpreter`):
//! stateful Python in Jupyter kernels, one per context, with rich results.
//!
//! The request is bounded here; the answer is an NDJSON stream of [`CodeEvent`]s that the
//! daemon rebuilds from what the guest's code server says, after checking every line
//! (see the daemon's `manager/code_wire.rs`): nothing a guest prints reaches a client
//! unchecked.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::env::{VarLimits, MAX_ENV_BYTES, MAX_ENV_VALUE};
use super::{in_range, validate_guest_path, validate_vars_within, Validate, MAX_EXEC_TIMEOUT_MS};
use crate::error::{RequestError, Result};

/// Most bytes of code one execution may carry (1 MiB): far more than any cell, and an
/// agent frame with room to spare. A larger one is refused before a sandbox is asked.
pub const MAX_CODE_BYTES: usize = 1 << 20;
/// The only language the image's kernels speak.
pub const CODE_LANGUAGE: &str = "python";
/// The context used when a request names none (it exists in every sandbox).
pub const DEFAULT_CONTEXT: &str = "default";
/// Timeout of an execution that names none: 5 minutes (E2B's default too).
pub const DEFAULT_CODE_TIMEOUT_MS: u64 = 300_000;
/// Bounds of an execution's `envs`: 64 variables, names of at most 128 bytes, values of
/// at most 32 KiB, 256 KiB in all (what one process environment comfortably holds).
pub const CODE_ENV_LIMITS: VarLimits = VarLimits {
    vars: 64,
    name_bytes: 128,
    value_bytes: MAX_ENV_VALUE,
    total_bytes: MAX_ENV_BYTES,
};
/// Mime types a result may carry; anything else a guest sends is dropped.
pub const RESULT_MIME_TYPES: [&str; 10] = [
    "text/plain",
    "text/html",
    "text/markdown",
    "text/latex",
    "image/png",
    "image/jpeg",
    "image/svg+xml",
    "application/json",
    "application/javascript",
    "application/pdf",
];

#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CodeRequest {
    /// Python source, 1 byte..1 MiB, not only whitespace.
    pub code: String,
    /// `python` (the default; the only one).
    #[serde(default)]
    pub language: Option<String>,
    /// Context id (`default` when absent): see `POST .../code/contexts`.
    #[serde(default)]
    pub context: Option<String>,
    /// Interrupt the execution after this many milliseconds (1..=86400000; default
    /// 300000). The context's state stays; the stream ends with a `TimeoutError`.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 86400000)]
    pub timeout_ms: Option<u64>,
    /// Environment variables for this execution only (E2B's `envs`): set in the
    /// context's kernel (`os.environ`, so also for the processes it starts) just before
    /// the code runs; afterwards, also when it raised or timed out, each name is back to
    /// what it was (removed if it did not exist). At most 64; names
    /// `[A-Za-z_][A-Za-z0-9_]*` of 1..=128 bytes, values up to 32 KiB without NUL,
    /// 256 KiB in all.
    #[serde(default)]
    pub envs: Option<BTreeMap<String, String>>,
}

impl CodeRequest {
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms.unwrap_or(DEFAULT_CODE_TIMEOUT_MS)
    }

    pub fn context(&self) -> &str {
        self.context.as_deref().unwrap_or(DEFAULT_CONTEXT)
    }
}

/// A context id: `default` or what `POST .../code/contexts` returned (1..=64 of
/// `[a-z0-9_-]`).
pub fn validate_context_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(RequestError::invalid(format!(
            "context {:?}: expected 1..=64 of a-z, 0-9, '-' and '_'",
            id.chars().take(80).collect::<String>()
        )))
    }
}

fn validate_language(language: Option<&str>) -> Result<()> {
    match language {
        None | Some(CODE_LANGUAGE) => Ok(()),
        Some(other) => Err(RequestError::invalid(format!(
            "language {:?} is not supported: the code interpreter runs {CODE_LANGUAGE}",
            other.chars().take(80).collect::<String>()
        ))),
    }
}

impl Validate for CodeRequest {
    fn validate(&self) -> Result<()> {
        if self.code.len() > MAX_CODE_BYTES {
            return Err(RequestError::invalid(format!(
                "code is {} bytes, over the limit of {MAX_CODE_BYTES} bytes (1 MiB)",
                self.code.len()
            )));
        }
        if self.code.trim().is_empty() {
            return Err(RequestError::invalid("code is empty"));
        }
        validate_language(self.language.as_deref())?;
        validate_context_id(self.context())?;
        if let Some(t) = self.timeout_ms {
            in_range("timeout_ms", t, 1, MAX_EXEC_TIMEOUT_MS)?;
        }
        if let Some(envs) = &self.envs {
            validate_vars_within("envs", envs, &CODE_ENV_LIMITS)?;
        }
        Ok(())
    }
}

/// `POST /v1/sandboxes/{id}/code/contexts`: a new kernel.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateContextRequest {
    /// `python` (the default; the only one).
    #[serde(default)]
    pub language: Option<String>,
    /// The kernel's working directory (absolute; `/home/user`, else `/root`, when absent).
    #[serde(default)]
    pub cwd: Option<String>,
}

impl Validate for CreateContextRequest {
    fn validate(&self) -> Result<()> {
        validate_language(self.language.as_deref())?;
        if let Some(cwd) = &self.cwd {
            validate_guest_path(cwd)?;
        }
        Ok(())
    }
}

/// One context (a kernel) of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CodeContext {
    pub id: String,
    pub language: String,
    pub cwd: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CodeContextList {
    pub contexts: Vec<CodeContext>,
}

/// One line of the NDJSON stream of `POST .../code`: output as it happens, results,
/// then `error` (if the code raised, timed out or its kernel died) and always `done`,
/// or a single `failure` when the execution could not run or its stream broke.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CodeEvent {
    Stdout {
        text: String,
    },
    Stderr {
        text: String,
    },
    /// A value: the cell's last expression (`main`) or something displayed (a figure).
    /// `data` maps mime types to values: text for `text/*`, `image/svg+xml` and
    /// `application/javascript`, base64 for `image/png`, `image/jpeg` and
    /// `application/pdf` (PNG and JPEG checked by the daemon), any JSON for
    /// `application/json`.
    Result {
        main: bool,
        #[schema(value_type = Object)]
        data: BTreeMap<String, serde_json::Value>,
    },
    /// The code raised (Python's exception name, value and formatted traceback), ran
    /// past its timeout (`TimeoutError`) or its kernel died (`KernelDied`).
    Error {
        name: String,
        value: String,
        traceback: Vec<String>,
    },
    /// Terminal: the execution is over (`execution_count`: Jupyter's counter).
    Done {
        execution_count: u64,
    },
    /// Terminal: the execution could not run or its stream broke (`code` as the API's
    /// error codes).
    Failure {
        code: String,
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(code: &str) -> CodeRequest {
        CodeRequest {
            code: code.into(),
            ..Default::default()
        }
    }

    #[test]
    fn code_request_bounds() {
        assert!(req("1 + 1").validate().is_ok());
        assert!(req("").validate().is_err());
        assert!(req(" \n\t").validate().is_err());
        let big = "x".repeat(MAX_CODE_BYTES + 1);
        let msg = req(&big).validate().unwrap_err().to_string();
        assert!(msg.contains("1048576"), "{msg}");
        assert!(req(&"x".repeat(MAX_CODE_BYTES)).validate().is_ok());
        let mut r = req("1");
        r.language = Some("r".into());
        assert!(r
            .validate()
            .unwrap_err()
            .to_string()
            .contains("not supported"));
        r.language = Some("python".into());
        r.context = Some("../x".into());
        assert!(r.validate().is_err());
        r.context = Some("ab12-x_".into());
        assert!(r.validate().is_ok());
        r.timeout_ms = Some(0);
        assert!(r.validate().is_err());
    }

    fn with_envs(kv: &[(&str, &str)]) -> CodeRequest {
        CodeRequest {
            envs: Some(
                kv.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..req("1")
        }
    }

    fn refusal(r: &CodeRequest) -> String {
        r.validate().unwrap_err().to_string()
    }

    #[test]
    fn code_envs_bounds() {
        assert!(with_envs(&[]).validate().is_ok());
        assert!(with_envs(&[("ZYG_A", "1"), ("_x9", ""), ("PATH", "/bin")])
            .validate()
            .is_ok());
        for bad in ["", "1A", "A-B", "A=B", "A B", "É", "A\0"] {
            let msg = refusal(&with_envs(&[(bad, "x")]));
            assert!(msg.contains("is not a variable name"), "{bad:?}: {msg}");
        }
        let name = "N".repeat(128);
        assert!(with_envs(&[(&name, "x")]).validate().is_ok());
        let long = "N".repeat(129);
        let msg = refusal(&with_envs(&[(&long, "x")]));
        assert!(msg.contains("at most 128"), "{msg}");
        let msg = refusal(&with_envs(&[("A", "x\0y")]));
        assert!(msg.contains("NUL"), "{msg}");
        let value = "v".repeat(32 * 1024);
        assert!(with_envs(&[("A", &value)]).validate().is_ok());
        let big = "v".repeat(32 * 1024 + 1);
        let msg = refusal(&with_envs(&[("A", &big)]));
        assert!(msg.contains("32769 bytes, more than 32768"), "{msg}");
        let names: Vec<String> = (0..65).map(|i| format!("V{i}")).collect();
        let vars = |n: usize| {
            names[..n]
                .iter()
                .map(|k| (k.as_str(), "x"))
                .collect::<Vec<_>>()
        };
        assert!(with_envs(&vars(64)).validate().is_ok());
        let msg = refusal(&with_envs(&vars(65)));
        assert!(
            msg.contains("65 variables") && msg.contains("at most 64"),
            "{msg}"
        );
        // Many large values: the total bounds them.
        let full: Vec<(&str, &str)> = names[..9]
            .iter()
            .map(|k| (k.as_str(), &value[..]))
            .collect();
        assert!(refusal(&with_envs(&full)).contains("262144 bytes"));
        // Absent and null are the same.
        let r: CodeRequest = serde_json::from_str(r#"{"code": "1", "envs": null}"#).unwrap();
        assert!(r.envs.is_none() && r.validate().is_ok());
        assert!(serde_json::from_str::<CodeRequest>(r#"{"code": "1", "envs": {"A": 1}}"#).is_err());
    }

    #[test]
    fn events_serialize_with_their_type() {
        let line = serde_json::to_string(&CodeEvent::Done { execution_count: 3 }).unwrap();
        assert_eq!(line, r#"{"type":"done","execution_count":3}"#);
    }
}
