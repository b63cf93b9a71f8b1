//! Snapshot packs on the qemu runtime: a snapshot's disk is a chain of qcow2 layers
//! over the raw base image (one per snapshot the sandbox took, each naming its backing
//! file by absolute path). Exported, the chain is folded into one layer over the base
//! (`qemu-img rebase` onto the base, which writes into the copy what the intermediate
//! layers held); imported, that layer is pointed at wherever the base is on this host
//! (`qemu-img rebase -u`: only the header changes). The state file (QEMU's migration
//! stream of RAM and devices) travels as it is.
//!
//! An imported layer is the pack maker's: before qemu-img opens it, its header must be
//! a plain qcow2's (no external data file, which qemu would open, no encryption), and
//! after the rebase it must read the base alone. Neither step opens a backing file, so
//! the base need not be in place yet (it is stored only once the whole pack passed).
//! A layer refused is the client's error ([`RuntimeError::BadPack`]), told without host
//! paths; qemu-img's own words go to the log.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{ExportedSnapshot, RuntimeError, SnapshotData};

fn qemu_img(args: &[&str], what: &str) -> Result<String, RuntimeError> {
    let out = Command::new("qemu-img")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| RuntimeError::Spawn {
            program: "qemu-img".into(),
            source,
        })?;
    if !out.status.success() {
        return Err(RuntimeError::Boot(format!(
            "{what}: qemu-img {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `layer`'s backing chain as qemu-img reports it, top first.
fn chain(layer: &Path) -> Result<Vec<serde_json::Value>, RuntimeError> {
    let layer_str = layer.display().to_string();
    let info = qemu_img(
        &["info", "--backing-chain", "--output=json", "-U", &layer_str],
        "reading the disk chain",
    )?;
    serde_json::from_str(&info).map_err(|e| RuntimeError::Boot(format!("qemu-img info: {e}")))
}

/// The raw image at the bottom of `layer`'s backing chain.
fn base_of(layer: &Path) -> Result<PathBuf, RuntimeError> {
    let chain = chain(layer)?;
    let last = chain
        .last()
        .ok_or_else(|| RuntimeError::Boot("qemu-img info: an empty chain".into()))?;
    if last["format"] != "raw" {
        return Err(RuntimeError::Boot(format!(
            "the disk chain of {} ends in a {} image, not the raw base",
            layer.display(),
            last["format"]
        )));
    }
    let base = last["filename"]
        .as_str()
        .ok_or_else(|| RuntimeError::Boot("qemu-img info: no base file name".into()))?;
    Ok(PathBuf::from(base))
}

pub(super) fn export(data: &SnapshotData, work: &Path) -> Result<ExportedSnapshot, RuntimeError> {
    let io = |context: String| move |source| RuntimeError::Io { context, source };
    let base = base_of(&data.disk_layer)?;
    let disk = work.join("disk.qcow2");
    std::fs::copy(&data.disk_layer, &disk)
        .map_err(io(format!("copying {}", data.disk_layer.display())))?;
    let (disk_str, base_str) = (disk.display().to_string(), base.display().to_string());
    qemu_img(
        &[
            "rebase", "-q", "-f", "qcow2", "-b", &base_str, "-F", "raw", &disk_str,
        ],
        "folding the disk layers into one",
    )?;
    let name = data
        .state_file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "state".into());
    Ok(ExportedSnapshot {
        base,
        disk: Some(disk),
        state: vec![(name.clone(), data.state_file.clone())],
        state_file: name,
    })
}

pub(super) fn import(
    dir: &Path,
    state_file: &Path,
    disk: &Path,
    base: &Path,
    accel: &str,
) -> Result<SnapshotData, RuntimeError> {
    check_plain_qcow2(disk)?;
    let (disk_str, base_str) = (disk.display().to_string(), base.display().to_string());
    let refused = |e: RuntimeError| match e {
        RuntimeError::Boot(detail) => {
            tracing::warn!("an imported disk layer: {detail}");
            RuntimeError::BadPack(
                "the pack's disk layer is not a qcow2 image qemu-img reads".into(),
            )
        }
        e => e,
    };
    qemu_img(
        &[
            "rebase", "-q", "-u", "-f", "qcow2", "-b", &base_str, "-F", "raw", &disk_str,
        ],
        "pointing the disk layer at this host's base image",
    )
    .map_err(refused)?;
    let info = qemu_img(
        &["info", "-f", "qcow2", "--output=json", &disk_str],
        "reading the imported disk layer",
    )
    .map_err(refused)?;
    let info: serde_json::Value = serde_json::from_str(&info)
        .map_err(|e| RuntimeError::Boot(format!("qemu-img info: {e}")))?;
    let ok = info["format"] == "qcow2"
        && info["backing-filename"].as_str() == Some(base_str.as_str())
        && info["backing-filename-format"] == "raw"
        && info["format-specific"]["data"]["data-file"].is_null();
    if !ok {
        tracing::warn!("an imported disk layer: {info}");
        return Err(RuntimeError::BadPack(
            "the pack's disk layer is not a plain qcow2 over its base image alone".into(),
        ));
    }
    Ok(SnapshotData {
        dir: dir.to_path_buf(),
        state_file: state_file.to_path_buf(),
        disk_layer: disk.to_path_buf(),
        accel: accel.to_string(),
        pause_ms: None,
        volumes: Vec::new(),
        isolated_nic: false,
    })
}

/// Refuses a layer whose qcow2 header asks qemu to open another host file (an external
/// data file) or a key (encryption), or that is no qcow2 at all.
fn check_plain_qcow2(disk: &Path) -> Result<(), RuntimeError> {
    use std::io::Read;
    let bad = |m: &str| RuntimeError::BadPack(format!("the pack's disk layer {m}"));
    let mut header = [0u8; 104];
    let mut f = std::fs::File::open(disk).map_err(RuntimeError::io("opening the disk layer"))?;
    f.read_exact(&mut header)
        .map_err(|_| bad("is too short for a qcow2 image"))?;
    let be32 = |at: usize| u32::from_be_bytes(header[at..at + 4].try_into().expect("4 bytes"));
    if header[..4] != *b"QFI\xfb" {
        return Err(bad("is not a qcow2 image"));
    }
    let version = be32(4);
    if !(2..=3).contains(&version) {
        return Err(bad(&format!("is qcow2 version {version}, not 2 or 3")));
    }
    if be32(32) != 0 {
        return Err(bad("is encrypted"));
    }
    let incompatible = u64::from_be_bytes(header[72..80].try_into().expect("8 bytes"));
    // Bit 2: the guest's data lives in an external file the header names.
    if version == 3 && incompatible & (1 << 2) != 0 {
        return Err(bad("keeps its data in an external file"));
    }
    Ok(())
}
