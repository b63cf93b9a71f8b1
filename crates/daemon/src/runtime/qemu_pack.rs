//! Snapshot packs on the qemu runtime: a snapshot's disk is a chain of qcow2 layers
//! over the raw base image (one per snapshot the sandbox took, each naming its backing
//! file by absolute path). Exported, the chain is folded into one layer over the base
//! (`qemu-img rebase` onto the base, which writes into the copy what the intermediate
//! layers held); imported, that layer is pointed at wherever the base is on this host
//! (`qemu-img rebase -u`: only the header changes). The state file (QEMU's migration
//! stream of RAM and devices) travels as it is.
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
        disk,
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
    let base = base.canonicalize().map_err(|source| RuntimeError::Io {
        context: format!("base image {}", base.display()),
        source,
    })?;
    let (disk_str, base_str) = (disk.display().to_string(), base.display().to_string());
    qemu_img(
        &[
            "rebase", "-q", "-u", "-f", "qcow2", "-b", &base_str, "-F", "raw", &disk_str,
        ],
        "pointing the disk layer at this host's base image",
    )?;
    // The layer came from elsewhere: it must be a plain qcow2 that reads this base and
    // no other host file (no external data file, nothing else in its chain).
    let chain = chain(disk)?;
    let data_file = chain
        .first()
        .map(|top| &top["format-specific"]["data"]["data-file"]);
    let ok = chain.len() == 2
        && chain[0]["format"] == "qcow2"
        && data_file.is_none_or(|d| d.is_null())
        && chain[1]["format"] == "raw"
        && chain[1]["filename"].as_str() == Some(base_str.as_str());
    if !ok {
        return Err(RuntimeError::Boot(format!(
            "the imported disk layer is not a qcow2 over the base image alone: {}",
            serde_json::Value::Array(chain)
        )));
    }
    Ok(SnapshotData {
        dir: dir.to_path_buf(),
        state_file: state_file.to_path_buf(),
        disk_layer: disk.to_path_buf(),
        accel: accel.to_string(),
        pause_ms: None,
    })
}
