//! `POST /v1/sandboxes`: the request (an image or a snapshot to start from, how many,
//! their resources, TTL, network, environment) and its streamed answer with
//! `"stream": true` (a fan-out's sandboxes reported one by one as they come up,
//! instead of one answer at the end).
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::limits::{MAX_FAN_OUT, MAX_MEM_MIB, MAX_VCPUS, MIN_MEM_MIB};
use super::{
    in_range, metadata, ttl, validate_name, Limits, NetworkMode, NetworkPolicy, NetworkRequest,
    Sandbox, SandboxEnv, SecretSpec, TtlAction, Validate, VolumeMountSpec,
};
use crate::error::{RequestError, Result};

#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxRequest {
    /// Image name (e.g. `minimal`) or `name-sha256` prefix; exclusive with `snapshot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 200)]
    pub image: Option<String>,
    /// Snapshot id to start from (its memory, processes and files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// Optional label; also the guest hostname (a suffix is added for n > 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")]
    pub name: Option<String>,
    /// How many sandboxes to create (fan-out), 1..=256. On the qemu runtime (each VM
    /// holds its own copy of its memory), at most as many as the host's available memory
    /// holds (422 `insufficient_memory` says how many fit). They are listed as `creating`
    /// until each runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 256)]
    pub n: Option<u32>,
    /// Guest RAM in MiB, 64..=65536 (image boots only; a snapshot keeps its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 64, maximum = 65536)]
    pub mem_mib: Option<u32>,
    /// Virtual CPUs, 1..=32 (image boots only; a snapshot keeps its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 32)]
    pub vcpus: Option<u32>,
    #[serde(default)]
    pub limits: Limits,
    /// Delete the sandbox this many seconds after it is running (1..=604800); none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 604800)]
    pub ttl_secs: Option<u64>,
    /// `egress` (default: outbound connections through NAT, never to the host, the
    /// link-local range or other sandboxes) or `none` (no traffic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkMode>,
    /// Only these IPv4 CIDRs (or single addresses) may be reached. DNS too: the guest's
    /// resolver address leads to the daemon's resolver (`network.dns` in
    /// `GET /v1/info`), which must be in this list for the sandbox to resolve names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_items = 256)]
    pub allow_out: Option<Vec<String>>,
    /// These IPv4 CIDRs are refused, even when `allow_out` contains them (the daemon's
    /// resolver included: then the sandbox gets no DNS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_items = 256)]
    pub deny_out: Option<Vec<String>>,
    /// Environment variables every exec in the sandbox gets (an exec's own `env` wins);
    /// branch children inherit them. At most 128 variables (with `secrets`), 32 KiB per
    /// value, 256 KiB in all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envs: Option<BTreeMap<String, String>>,
    /// Like `envs`, but their values are never shown by the API, and one with
    /// `"inherit": false` is not given to branch children. Neither is written into the
    /// guest: they exist only in the environment of execs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<BTreeMap<String, SecretSpec>>,
    /// Your own labels (at most 63 keys of 1-128 characters of `A-Za-z0-9._-/`, values up
    /// to 1024 bytes; keys starting `zygote.` are reserved): shown on the sandbox, kept by
    /// its branch children (which add `zygote.parent`), filterable in the list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Exec and file calls, and requests through the port proxy, on the sandbox while it
    /// is paused resume it first (without it they get 409 `sandbox_paused`, and the proxy
    /// 502). Kept by branch children.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_resume: Option<bool>,
    /// What its TTL running out does: `delete` (default) or `pause`. Kept by branch
    /// children.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_action: Option<TtlAction>,
    /// Answer at once with an NDJSON stream of CreateEvent lines (`accepted`, then one
    /// `sandbox` or `sandbox_failed` per sandbox as it comes up, then `done` or `error`)
    /// instead of `201` once all run. Checks (the request, the image or snapshot, the
    /// name, the memory a fan-out needs) answer before the stream starts. A client that
    /// goes away does not stop the create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Named volumes to mount (`{"name", "path"}`, at most 8; image boots of one sandbox
    /// only). This sandbox then writes them; its branch children and sandboxes from its
    /// snapshots see a copy-on-write view (see `/v1/volumes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_items = 8)]
    pub volumes: Option<Vec<VolumeMountSpec>>,
}

/// What validating a create finds besides "valid": the parts the daemon keeps, parsed
/// once by [`CreateSandboxRequest::check`].
#[derive(Debug, Clone)]
pub struct CheckedCreate {
    /// The network policy, as stored and enforced.
    pub policy: NetworkPolicy,
    /// The sandbox's stored environment.
    pub env: SandboxEnv,
}

impl CreateSandboxRequest {
    /// Validates the request ([`Validate`] is this without the result) and returns
    /// its network policy and environment: they are parsed here only.
    pub fn check(&self) -> Result<CheckedCreate> {
        match (&self.image, &self.snapshot) {
            (Some(_), Some(_)) => {
                return Err(RequestError::invalid(
                    "give either image or snapshot, not both",
                ))
            }
            (None, None) => {
                return Err(RequestError::invalid(
                    "give an image or a snapshot to start from",
                ))
            }
            (Some(i), None) if i.is_empty() || i.len() > 200 => {
                return Err(RequestError::invalid("image must be 1-200 characters"))
            }
            _ => {}
        }
        if let Some(name) = &self.name {
            validate_name("name", name)?;
        }
        in_range("n", self.n.unwrap_or(1), 1, MAX_FAN_OUT)?;
        if let Some(m) = self.mem_mib {
            in_range("mem_mib", m, MIN_MEM_MIB, MAX_MEM_MIB)?;
        }
        if let Some(v) = self.vcpus {
            in_range("vcpus", v, 1, MAX_VCPUS)?;
        }
        if self.snapshot.is_some() && (self.mem_mib.is_some() || self.vcpus.is_some()) {
            return Err(RequestError::invalid(
                "mem_mib and vcpus come from the snapshot; leave them out",
            ));
        }
        ttl::validate_ttl(self.ttl_secs)?;
        let policy = NetworkRequest {
            network: self.network,
            allow_out: self.allow_out.clone(),
            deny_out: self.deny_out.clone(),
        }
        .policy()?;
        let env = SandboxEnv::new(
            self.envs.as_ref().unwrap_or(&BTreeMap::new()),
            self.secrets.as_ref().unwrap_or(&BTreeMap::new()),
        )?;
        if let Some(m) = &self.metadata {
            metadata::validate_metadata(m)?;
        }
        self.limits.validate()?;
        if let Some(mounts) = self.volumes.as_deref().filter(|m| !m.is_empty()) {
            super::validate_mounts(mounts)?;
            if self.snapshot.is_some() {
                return Err(RequestError::invalid(
                    "volumes mount into sandboxes created from an image; a sandbox from a \
                     snapshot sees the snapshot's volumes copy-on-write",
                ));
            }
            if self.n.unwrap_or(1) != 1 {
                return Err(RequestError::invalid(
                    "volumes mount into one sandbox at a time: n must be 1",
                ));
            }
        }
        Ok(CheckedCreate { policy, env })
    }
}

impl Validate for CreateSandboxRequest {
    fn validate(&self) -> Result<()> {
        self.check().map(drop)
    }
}

/// One line of the NDJSON stream of `POST /v1/sandboxes` with `"stream": true`. `ms` is
/// the time since the daemon took the request.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CreateEvent {
    /// Every requested sandbox is recorded: `ids` in order, each listed as `creating`
    /// until it runs (`GET /v1/sandboxes/{id}` answers for each from now on).
    Accepted { ids: Vec<String>, ms: u64 },
    /// A sandbox runs and its agent answers (it is `running` from now on).
    Sandbox { index: u32, id: String, ms: u64 },
    /// A sandbox did not come up; nothing of it is left. A create is all or none: the
    /// others are deleted once all are done, and the stream ends with `error`.
    SandboxFailed {
        index: u32,
        id: String,
        error: String,
        ms: u64,
    },
    /// The last line when every sandbox runs: what the non-streaming request answers.
    Done { sandboxes: Vec<Sandbox> },
    /// The last line when the create failed (nothing of it is left).
    Error { code: String, message: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_lines_tagged_by_type() {
        let ev = CreateEvent::SandboxFailed {
            index: 2,
            id: "sb-x".into(),
            error: "no".into(),
            ms: 7,
        };
        let line = serde_json::to_value(&ev).unwrap();
        assert_eq!(line["type"], "sandbox_failed");
        assert_eq!(
            (line["index"].as_u64(), line["ms"].as_u64()),
            (Some(2), Some(7))
        );
        let back: CreateEvent =
            serde_json::from_str(r#"{"type":"accepted","ids":["a","b"],"ms":3}"#).unwrap();
        assert!(matches!(back, CreateEvent::Accepted { ids, ms: 3 } if ids == ["a", "b"]));
        let done = serde_json::to_value(CreateEvent::Done { sandboxes: vec![] }).unwrap();
        assert_eq!(done, serde_json::json!({"type": "done", "sandboxes": []}));
    }

    #[test]
    fn create_request_bounds() {
        let ok = CreateSandboxRequest {
            image: Some("minimal".into()),
            ..Default::default()
        };
        assert!(ok.validate().is_ok());
        let both = CreateSandboxRequest {
            snapshot: Some("snap-1".into()),
            ..ok.clone()
        };
        assert!(both.validate().is_err());
        for n in [0, MAX_FAN_OUT + 1] {
            let r = CreateSandboxRequest {
                n: Some(n),
                ..ok.clone()
            };
            assert!(r.validate().is_err(), "n={n}");
        }
        let mem = CreateSandboxRequest {
            mem_mib: Some(1),
            ..ok.clone()
        };
        assert!(mem.validate().is_err());
        let lim = CreateSandboxRequest {
            limits: Limits {
                pids: Some(1),
                ..Default::default()
            },
            ..ok
        };
        assert!(lim.validate().is_err());
    }
}
