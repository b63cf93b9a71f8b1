//! Pushing layouts to the registry (OCI or Docker v2s2 manifests, gzip or zstd layers),
//! multi-platform indexes, docker archives and `skopeo inspect`, all through skopeo 1.9.
//!
//! skopeo 1.9.3 cannot assemble an index from separate images, so [`push_index`] pushes
//! each platform image under its own tag and PUTs the index JSON itself.

use std::path::Path;
use std::process::Command;

use super::{require_tools, run, LayoutRef, Registry};

/// Manifest flavour to push; both are common in the wild.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `application/vnd.oci.image.manifest.v1+json` (index: `...oci.image.index.v1+json`).
    Oci,
    /// `application/vnd.docker.distribution.manifest.v2+json` (list: `...manifest.list.v2+json`).
    Docker,
}

impl Format {
    fn skopeo(self) -> &'static str {
        match self {
            Format::Oci => "oci",
            Format::Docker => "v2s2",
        }
    }

    /// Media type of a single-platform manifest in this format.
    pub fn manifest_type(self) -> &'static str {
        match self {
            Format::Oci => "application/vnd.oci.image.manifest.v1+json",
            Format::Docker => "application/vnd.docker.distribution.manifest.v2+json",
        }
    }

    /// Media type of a multi-platform index in this format.
    pub fn index_type(self) -> &'static str {
        match self {
            Format::Oci => "application/vnd.oci.image.index.v1+json",
            Format::Docker => "application/vnd.docker.distribution.manifest.list.v2+json",
        }
    }
}

/// A platform entry of an index.
#[derive(Clone, Debug)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

impl Platform {
    /// `linux/<arch>` without variant.
    pub fn linux(arch: &str) -> Self {
        Platform {
            os: "linux".into(),
            architecture: arch.into(),
            variant: None,
        }
    }
}

fn skopeo() -> Result<Command, String> {
    require_tools(&["skopeo"])?;
    let mut cmd = Command::new("skopeo");
    cmd.arg("--insecure-policy");
    Ok(cmd)
}

/// `docker://127.0.0.1:PORT/<reference>`.
fn docker_ref(reg: &Registry, reference: &str) -> String {
    format!("docker://{}/{reference}", reg.host())
}

/// Copies a layout image to `repo:tag` on the registry and returns the manifest digest.
fn copy(
    layout: &LayoutRef,
    reg: &Registry,
    reference: &str,
    extra: &[&str],
) -> Result<String, String> {
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let digest_file = tmp.path().join("digest");
    let mut cmd = skopeo()?;
    cmd.args(["copy", "--quiet", "--dest-tls-verify=false"])
        .args(extra);
    match reg.creds() {
        Some(c) => cmd.args(["--dest-creds", &c]),
        None => cmd.arg("--dest-no-creds"),
    };
    cmd.arg("--digestfile").arg(&digest_file);
    run(cmd.arg(layout.transport()).arg(docker_ref(reg, reference)))?;
    std::fs::read_to_string(&digest_file)
        .map(|d| d.trim().to_owned())
        .map_err(|e| format!("digest file: {e}"))
}

/// Pushes a layout image as `repo:tag` (gzip layers); returns the manifest digest to pull by.
pub fn push(
    layout: &LayoutRef,
    reg: &Registry,
    reference: &str,
    format: Format,
) -> Result<String, String> {
    copy(layout, reg, reference, &["--format", format.skopeo()])
}

/// Pushes with zstd layers (OCI only), failing if skopeo fell back to gzip (see below).
// skopeo 1.9 silently reuses a gzip copy of a layer that its blob-info cache knows is already
// in this registry, so push zstd before (or without) the gzip variant of the same layers.
pub fn push_zstd(layout: &LayoutRef, reg: &Registry, reference: &str) -> Result<String, String> {
    let digest = copy(
        layout,
        reg,
        reference,
        &["--format", "oci", "--dest-compress-format", "zstd"],
    )?;
    let repo = reference.rsplit_once(':').map_or(reference, |(r, _)| r);
    let (_, body) = reg.get_manifest(repo, &digest)?;
    let manifest: serde_json::Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
    let layers = manifest["layers"].as_array().cloned().unwrap_or_default();
    if layers
        .iter()
        .any(|l| l["mediaType"] != "application/vnd.oci.image.layer.v1.tar+zstd")
    {
        return Err(format!(
            "skopeo kept non-zstd layers (blob reuse?): {manifest}"
        ));
    }
    Ok(digest)
}

/// Pushes each platform image as `<tag>-<os>-<arch>[-<variant>]`, then the index as `repo:tag`.
pub fn push_index(
    reg: &Registry,
    reference: &str,
    images: &[(Platform, &LayoutRef)],
    format: Format,
) -> Result<String, String> {
    let (repo, tag) = reference
        .rsplit_once(':')
        .ok_or_else(|| format!("{reference}: expected repo:tag"))?;
    let mut manifests = Vec::new();
    for (p, layout) in images {
        let suffix = [Some(&p.os), Some(&p.architecture), p.variant.as_ref()]
            .into_iter()
            .flatten();
        let child_tag = std::iter::once(tag)
            .chain(suffix.map(String::as_str))
            .collect::<Vec<_>>()
            .join("-");
        let digest = push(layout, reg, &format!("{repo}:{child_tag}"), format)?;
        let (media_type, body) = reg.get_manifest(repo, &digest)?;
        let mut platform = serde_json::json!({"os": p.os, "architecture": p.architecture});
        if let Some(v) = &p.variant {
            platform["variant"] = v.as_str().into();
        }
        manifests.push(serde_json::json!({
            "mediaType": media_type, "digest": digest, "size": body.len(), "platform": platform,
        }));
    }
    let index = serde_json::json!({
        "schemaVersion": 2, "mediaType": format.index_type(), "manifests": manifests,
    });
    reg.put_manifest(repo, tag, format.index_type(), index.to_string().as_bytes())
}

/// Writes a `docker save`-style archive (`out` must not exist) of a layout image.
// skopeo stores the tag normalized (`docker.io/<repo>:<tag>`) in RepoTags, layers uncompressed.
pub fn docker_archive(layout: &LayoutRef, out: &Path, reference: &str) -> Result<(), String> {
    let mut cmd = skopeo()?;
    cmd.args(["copy", "--quiet", &layout.transport()]);
    run(cmd.arg(format!("docker-archive:{}:{reference}", out.display()))).map(drop)
}

/// `skopeo inspect <args>` as `user:password` (`reg.creds().as_deref()`, or wrong) or anonymous.
pub fn skopeo_inspect(
    reg: &Registry,
    reference: &str,
    args: &[&str],
    creds: Option<&str>,
) -> Result<String, String> {
    let mut cmd = skopeo()?;
    cmd.args(["inspect", "--tls-verify=false", "--retry-times=0"])
        .args(args);
    match creds {
        Some(c) => cmd.args(["--creds", c]),
        None => cmd.arg("--no-creds"),
    };
    let out = run(cmd.arg(docker_ref(reg, reference)))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
