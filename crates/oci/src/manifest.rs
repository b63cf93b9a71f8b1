//! The OCI (and Docker v2 schema 2) documents zygote reads: image indexes, image
//! manifests, image configs, digests. Only the fields it uses; everything read from a
//! registry or an archive is untrusted and checked here.
use serde::Deserialize;

use crate::error::{OciError, Result};

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// What a manifest request accepts, most preferred first.
pub const ACCEPT: &[&str] = &[OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST];

/// Manifests and configs are small; anything larger is not one.
pub const MAX_DOCUMENT_BYTES: u64 = 4 << 20;

/// A content digest: `sha256:` and 64 lowercase hex digits (the only algorithm
/// accepted, so that a digest is also a safe file name).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    pub fn parse(s: &str) -> Result<Digest> {
        let hex = s
            .strip_prefix("sha256:")
            .ok_or_else(|| OciError::BadImage {
                what: format!("digest {s:?}"),
                message: "only sha256 digests are supported".into(),
            })?;
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(OciError::BadImage {
                what: format!("digest {s:?}"),
                message: "not 64 lowercase hex digits".into(),
            });
        }
        Ok(Digest(s.to_string()))
    }

    pub fn of(bytes: &[u8]) -> Digest {
        use sha2::Digest as _;
        Digest(format!(
            "sha256:{}",
            hex::encode(sha2::Sha256::digest(bytes))
        ))
    }

    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Fails unless `bytes` hash to this digest.
    pub fn verify(&self, what: &str, bytes: &[u8]) -> Result<()> {
        let actual = Digest::of(bytes);
        if &actual != self {
            return Err(OciError::DigestMismatch {
                what: what.to_string(),
                expected: self.0.clone(),
                actual: actual.0,
            });
        }
        Ok(())
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: i64,
    #[serde(default)]
    pub platform: Option<Platform>,
    #[serde(default)]
    pub annotations: Option<std::collections::BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default)]
    pub variant: Option<String>,
}

impl Platform {
    fn label(&self) -> String {
        match &self.variant {
            Some(v) => format!("{}/{}/{v}", self.os, self.architecture),
            None => format!("{}/{}", self.os, self.architecture),
        }
    }
}

/// An image manifest or an index of them, told apart by media type or shape.
#[derive(Debug, Clone)]
pub enum Document {
    Index(Vec<Descriptor>),
    Manifest(ImageManifest),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    pub schema_version: i64,
    #[serde(default)]
    pub media_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Probe {
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<Vec<Descriptor>>,
}

impl Document {
    pub fn parse(what: &str, bytes: &[u8]) -> Result<Document> {
        let bad = |message: String| OciError::BadImage {
            what: what.to_string(),
            message,
        };
        let probe: Probe =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("not a manifest: {e}")))?;
        let is_index = matches!(probe.media_type.as_deref(), Some(OCI_INDEX | DOCKER_LIST))
            || (probe.media_type.is_none() && probe.manifests.is_some());
        if is_index {
            return Ok(Document::Index(probe.manifests.unwrap_or_default()));
        }
        match probe.media_type.as_deref() {
            None | Some(OCI_MANIFEST | DOCKER_MANIFEST) => {}
            Some(other) => return Err(bad(format!("unsupported manifest type {other}"))),
        }
        let m: ImageManifest = serde_json::from_slice(bytes)
            .map_err(|e| bad(format!("not an image manifest: {e}")))?;
        if m.schema_version != 2 {
            return Err(bad(format!(
                "schema version {} (only 2 is supported)",
                m.schema_version
            )));
        }
        Ok(Document::Manifest(m))
    }
}

/// The linux/amd64 entry of an index; the error lists what there is instead.
pub fn pick_amd64<'a>(reference: &str, entries: &'a [Descriptor]) -> Result<&'a Descriptor> {
    let is_manifest =
        |d: &&Descriptor| matches!(d.media_type.as_str(), OCI_MANIFEST | DOCKER_MANIFEST | "");
    entries
        .iter()
        .filter(is_manifest)
        .find(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == "amd64")
        })
        .ok_or_else(|| {
            let mut available: Vec<String> = entries
                .iter()
                .filter_map(|d| d.platform.as_ref().map(Platform::label))
                .filter(|l| !l.starts_with("unknown/"))
                .collect();
            available.dedup();
            OciError::NoPlatform {
                reference: reference.to_string(),
                available: if available.is_empty() {
                    "no platform it names".into()
                } else {
                    available.join(", ")
                },
            }
        })
}

/// A layer's media type, if zygote can apply it (the blob's compression is sniffed
/// when it is applied; this refuses what is not a filesystem layer at all).
pub fn check_layer_type(index: usize, d: &Descriptor) -> Result<()> {
    let t = d.media_type.as_str();
    let ok = t.starts_with("application/vnd.oci.image.layer.")
        || t.starts_with("application/vnd.docker.image.rootfs.")
        || t.is_empty();
    if !ok {
        return Err(OciError::BadLayer {
            layer: index,
            digest: d.digest.clone(),
            message: format!("media type {t} is not a filesystem layer"),
        });
    }
    Ok(())
}

/// The image config's fields zygote uses.
#[derive(Debug, Clone, Deserialize)]
pub struct ImageConfig {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub config: Option<ContainerConfig>,
    pub rootfs: RootFs,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ContainerConfig {
    #[serde(rename = "Env", default)]
    pub env: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    pub working_dir: Option<String>,
    #[serde(rename = "User", default)]
    pub user: Option<String>,
    #[serde(rename = "Entrypoint", default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(rename = "Cmd", default)]
    pub cmd: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RootFs {
    #[serde(rename = "type")]
    pub kind: String,
    pub diff_ids: Vec<String>,
}

impl ImageConfig {
    pub fn parse(what: &str, bytes: &[u8]) -> Result<ImageConfig> {
        let c: ImageConfig = serde_json::from_slice(bytes).map_err(|e| OciError::BadImage {
            what: what.to_string(),
            message: format!("not an image config: {e}"),
        })?;
        if c.rootfs.kind != "layers" {
            return Err(OciError::BadImage {
                what: what.to_string(),
                message: format!("rootfs type {:?} (expected \"layers\")", c.rootfs.kind),
            });
        }
        Ok(c)
    }

    /// `os/architecture`; refuses what cannot run on an x86_64 Linux guest.
    pub fn check_platform(&self, reference: &str) -> Result<String> {
        let label = format!("{}/{}", self.os, self.architecture);
        if self.os != "linux" || self.architecture != "amd64" {
            return Err(OciError::NoPlatform {
                reference: reference.to_string(),
                available: label,
            });
        }
        Ok(label)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_checked_before_use_as_file_names() {
        let good = format!("sha256:{}", "0f".repeat(32));
        assert_eq!(Digest::parse(&good).unwrap().hex(), "0f".repeat(32));
        for bad in [
            "sha256:../../etc/passwd".to_string(),
            format!("sha256:{}", "0F".repeat(32)),
            format!("sha512:{}", "0".repeat(128)),
            format!("sha256:{}/x", "0".repeat(63)),
            "0".repeat(64),
        ] {
            assert!(Digest::parse(&bad).is_err(), "{bad}");
        }
        let d = Digest::of(b"abc");
        assert!(d.verify("x", b"abc").is_ok());
        assert!(matches!(
            d.verify("x", b"abd"),
            Err(OciError::DigestMismatch { .. })
        ));
    }

    #[test]
    fn indexes_pick_linux_amd64_or_say_what_there_is() {
        let doc = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json",
          "manifests":[
            {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:aa","size":1,
             "platform":{"architecture":"arm64","os":"linux","variant":"v8"}},
            {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:bb","size":1,
             "platform":{"architecture":"amd64","os":"linux"}}]}"#;
        let Document::Index(entries) = Document::parse("t", doc).unwrap() else {
            panic!("an index")
        };
        assert_eq!(pick_amd64("t", &entries).unwrap().digest, "sha256:bb");
        let err = pick_amd64("t", &entries[..1]).unwrap_err().to_string();
        assert!(err.contains("linux/arm64/v8"), "{err}");
    }

    #[test]
    fn manifests_and_configs_parse_or_say_why_not() {
        let m = br#"{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json",
          "config":{"mediaType":"application/vnd.docker.container.image.v1+json","digest":"sha256:cc","size":2},
          "layers":[{"mediaType":"application/vnd.docker.image.rootfs.diff.tar.gzip","digest":"sha256:dd","size":3}]}"#;
        let Document::Manifest(m) = Document::parse("t", m).unwrap() else {
            panic!("a manifest")
        };
        assert_eq!(m.layers.len(), 1);
        assert!(check_layer_type(0, &m.layers[0]).is_ok());
        let mut helm = m.layers[0].clone();
        helm.media_type = "application/vnd.cncf.helm.chart.content.v1.tar+gzip".into();
        assert!(check_layer_type(0, &helm).is_err());
        assert!(Document::parse("t", b"{\"schemaVersion\":1}").is_err());
        let c = br#"{"architecture":"arm64","os":"linux","config":{"Env":["A=1"],"User":"app"},
                     "rootfs":{"type":"layers","diff_ids":["sha256:ee"]}}"#;
        let c = ImageConfig::parse("t", c).unwrap();
        assert_eq!(c.config.as_ref().unwrap().user.as_deref(), Some("app"));
        assert!(c
            .check_platform("t")
            .unwrap_err()
            .to_string()
            .contains("linux/arm64"));
    }
}
