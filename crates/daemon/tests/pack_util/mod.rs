//! Snapshot packs made by hand for the import tests (tests/pack_import.rs and the
//! seeded randomized tests/pack_fuzz.rs), without a VM: a base image of pseudo-random
//! bytes, a qcow2 disk layer over it (qemu-img), a state file, each encoded as the daemon
//! encodes a pack's files, with a config and a tar laid out as an export writes them.
//! Any part can be changed (a config field, a file's bytes, a role) and the digests are
//! made again on [`PackParts::tar`], so a test reaches the check it means to; or the
//! tar's bytes can be damaged after.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use hyper::Method;
use serde_json::{json, Value};
use sha2::Digest as _;
use zygote_daemon::client::{Client, ClientError};
use zygote_daemon::model::{Snapshot, SnapshotKind};
use zygote_daemon::pack_format::{PackConfig, PackImage, PackSnapshot, PACK_FORMAT};

use crate::common::{start_daemon_with_env, Daemon};

/// The seeded generator of the VMM's fuzz tests (xorshift64*), and random bytes from it.
pub use zygote_vmm::devices::virtio::fuzzing::Rng;

pub fn random_bytes(r: &mut Rng, n: usize) -> Vec<u8> {
    (0..n).map(|_| r.next_u64() as u8).collect()
}

/// The tools a hand-made pack and a qemu-runtime daemon need; Err says which is missing.
pub fn require_tools() -> Result<(), String> {
    for t in ["qemu-img", "qemu-system-x86_64"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(t).is_file()))
            .unwrap_or(false);
        if !found {
            return Err(format!("`{t}` is not in PATH"));
        }
    }
    Ok(())
}

/// A pack's parts: its config and each file's encoded blob, by role.
#[derive(Clone)]
pub struct PackParts {
    pub config: Value,
    pub files: Vec<(String, Vec<u8>)>,
    /// The decoded base image's sha256 (what the config says, unless a test changes it).
    pub base_sha256: String,
}

/// Files of a pack, as the daemon encodes them (a zygote sparse zstd blob).
pub fn encode(work: &Path, name: &str, bytes: &[u8]) -> Vec<u8> {
    let raw = work.join(format!("{name}.raw"));
    let enc = work.join(format!("{name}.enc"));
    std::fs::write(&raw, bytes).unwrap();
    zygote_oci::pack::sparse::encode_to(&raw, &enc, &mut |_| {}).unwrap();
    std::fs::read(&enc).unwrap()
}

/// A qcow2 layer (its bytes) over a raw base of `base_len` bytes at `work/base.raw`.
pub fn qcow2_layer(work: &Path, base_len: u64) -> Vec<u8> {
    let base = work.join("layer-base.raw");
    std::fs::File::create(&base)
        .unwrap()
        .set_len(base_len)
        .unwrap();
    let layer = work.join("layer.qcow2");
    let _ = std::fs::remove_file(&layer);
    let out = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(&base)
        .arg(&layer)
        .output()
        .expect("qemu-img");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(&layer).unwrap()
}

impl PackParts {
    /// A valid qemu-runtime pack: a base of `base_len` bytes (pseudo-random from `seed`
    /// in its first 256 KiB, zeros after), an empty qcow2 layer, a 64 KiB state file.
    pub fn synthetic(work: &Path, seed: u64, base_len: usize) -> PackParts {
        let mut rng = Rng(seed.wrapping_mul(2).wrapping_add(1));
        let mut base = random_bytes(&mut rng, base_len.min(256 << 10));
        base.resize(base_len, 0);
        let base_sha256 = hex::encode(sha2::Sha256::digest(&base));
        let config = PackConfig {
            format: PACK_FORMAT,
            runtime: "qemu".into(),
            accel: "tcg".into(),
            cpu: zygote_vmm::persist::CpuIdentity::host(),
            mem_mib: 256,
            vcpus: 1,
            image: PackImage {
                name: "minimal".into(),
                sha256: base_sha256.clone(),
            },
            snapshot: PackSnapshot {
                id: "snap-handmade".into(),
                name: Some("handmade".into()),
                kind: SnapshotKind::Full,
                source_sandbox: "sb-handmade".into(),
                created_at: 1,
            },
            agent_token: "0".repeat(64),
            run: Default::default(),
            state_file: "state".into(),
            isolated_nic: false,
        };
        let files = vec![
            ("image".to_string(), encode(work, "image", &base)),
            (
                "disk".to_string(),
                encode(work, "disk", &qcow2_layer(work, base_len as u64)),
            ),
            (
                "state/state".to_string(),
                encode(work, "state", &random_bytes(&mut rng, 64 << 10)),
            ),
        ];
        PackParts {
            config: serde_json::to_value(&config).unwrap(),
            files,
            base_sha256,
        }
    }

    pub fn file_mut(&mut self, role: &str) -> &mut Vec<u8> {
        &mut self
            .files
            .iter_mut()
            .find(|(r, _)| r == role)
            .unwrap_or_else(|| panic!("no {role} file"))
            .1
    }

    /// The manifest (whose digests follow the parts) and the tar an export writes.
    pub fn manifest(&self) -> Value {
        let config = serde_json::to_vec(&self.config).unwrap();
        json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "artifactType": zygote_oci::pack::ARTIFACT_TYPE,
            "config": {"mediaType": zygote_oci::pack::CONFIG_TYPE, "digest": digest(&config), "size": config.len()},
            "layers": self.files.iter().map(|(role, blob)| json!({
                "mediaType": zygote_oci::pack::FILE_TYPE,
                "digest": digest(blob),
                "size": blob.len(),
                "annotations": {"org.opencontainers.image.title": role},
            })).collect::<Vec<_>>(),
        })
    }

    pub fn tar(&self) -> Vec<u8> {
        self.tar_with_manifest(&self.manifest())
    }

    pub fn tar_with_manifest(&self, manifest: &Value) -> Vec<u8> {
        let manifest = serde_json::to_vec(manifest).unwrap();
        let index = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": digest(&manifest),
                "size": manifest.len(),
            }],
        });
        let mut entries: Vec<(String, Vec<u8>)> = vec![
            (
                "oci-layout".into(),
                br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
            ),
            ("index.json".into(), serde_json::to_vec(&index).unwrap()),
            (blob_name(&manifest), manifest.clone()),
        ];
        let config = serde_json::to_vec(&self.config).unwrap();
        entries.push((blob_name(&config), config));
        for (_, blob) in &self.files {
            if !entries.iter().any(|(n, _)| *n == blob_name(blob)) {
                entries.push((blob_name(blob), blob.clone()));
            }
        }
        tar_of(&entries)
    }
}

pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

pub fn blob_name(bytes: &[u8]) -> String {
    format!("blobs/sha256/{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// A tar of (name, bytes) entries, in order.
pub fn tar_of(entries: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for (name, data) in entries {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut h, name, &data[..]).unwrap();
    }
    tar.into_inner().unwrap()
}

/// A daemon on the qemu runtime with its own state and cache (under `root`), pulls and
/// builds off (`ZYGOTE_PREBUILT`): what it stores, it stores there, and nothing it does
/// reaches for a registry.
pub struct Host {
    pub daemon: Daemon,
    pub state: PathBuf,
    pub cache: PathBuf,
}

impl Host {
    pub fn start(root: &Path, extra_env: &[(&str, &str)]) -> Host {
        let (state, cache) = (root.join("state"), root.join("cache"));
        std::fs::create_dir_all(&cache).unwrap();
        let cache_str = cache.display().to_string();
        let mut env = vec![
            ("ZYGOTE_CACHE_DIR", cache_str.as_str()),
            ("ZYGOTE_PREBUILT", "1"),
        ];
        env.extend_from_slice(extra_env);
        let daemon = start_daemon_with_env(
            &state,
            &["--listen", "127.0.0.1:0", "--runtime", "qemu"],
            &env,
        );
        Host {
            daemon,
            state,
            cache,
        }
    }

    pub fn client(&self) -> Client {
        self.daemon.client()
    }

    /// Every file (path, size) an import could leave: the whole cache (blob store,
    /// staging, image store) and the state's snapshot, layer and scratch directories.
    /// Build locks (empty files the image store keeps) are not counted.
    pub fn footprint(&self) -> BTreeMap<PathBuf, u64> {
        let mut out = BTreeMap::new();
        let roots = [
            self.cache.clone(),
            self.state.join("snapshots"),
            self.state.join("layers"),
            self.state.join("tmp"),
        ];
        for root in roots {
            walk(&root, &mut out);
        }
        out.retain(|p, _| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(".lock-"))
        });
        out
    }

    /// Host paths an API message must never name.
    pub fn paths(&self) -> Vec<String> {
        let mut p = vec![
            "/root".to_string(),
            "/tmp".to_string(),
            "/home".to_string(),
            "/var/".to_string(),
        ];
        for d in [&self.state, &self.cache] {
            p.push(d.display().to_string());
            if let Ok(c) = d.canonicalize() {
                p.push(c.display().to_string());
            }
        }
        p
    }
}

fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, u64>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => walk(&p, out),
            _ => {
                out.insert(p, e.metadata().map(|m| m.len()).unwrap_or(0));
            }
        }
    }
}

/// Bytes and files of a footprint, for messages.
pub fn summary(f: &BTreeMap<PathBuf, u64>) -> String {
    format!("{} files, {} bytes", f.len(), f.values().sum::<u64>())
}

/// What changed between two footprints.
pub fn diff(before: &BTreeMap<PathBuf, u64>, after: &BTreeMap<PathBuf, u64>) -> Vec<String> {
    let mut out = Vec::new();
    for (p, n) in after {
        match before.get(p) {
            None => out.push(format!("+ {} ({n} bytes)", p.display())),
            Some(m) if m != n => out.push(format!("~ {} ({m} -> {n} bytes)", p.display())),
            _ => {}
        }
    }
    for p in before.keys().filter(|p| !after.contains_key(*p)) {
        out.push(format!("- {}", p.display()));
    }
    out
}

/// POST /v1/snapshots/import with `tar` as the body.
pub async fn import(c: &Client, tar: Vec<u8>) -> Result<Snapshot, ClientError> {
    let body = c
        .raw(
            Method::POST,
            "/v1/snapshots/import",
            Some((bytes::Bytes::from(tar), "application/x-tar")),
        )
        .await?;
    Ok(serde_json::from_slice(&body).expect("a snapshot"))
}

/// Names of the images the daemon lists.
pub async fn image_names(c: &Client) -> Vec<String> {
    let images: Value = c
        .json(Method::GET, "/v1/images", None::<&()>)
        .await
        .unwrap();
    images["images"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["name"].as_str().map(str::to_string))
        .collect()
}
