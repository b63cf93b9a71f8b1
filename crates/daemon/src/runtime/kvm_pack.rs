//! Snapshot packs on the kvm runtime: a full or live snapshot of zygote's VMM is a
//! directory that stands on its own (meta.json, state.bin, memory.bin and each device's
//! private data, the root disk's copy-on-write pages among them) but for the base image,
//! which state.bin names by path. Exported, the directory's files travel as they are;
//! imported, state.bin is rewritten to name this host's copy of the base image (its
//! checksum and CPU header made anew), and the memory's checksum is verified. A diff
//! snapshot needs its parent's memory, so it is not packed: take a full or live one.
use std::path::{Path, PathBuf};

use zygote_vmm::devices::virtio::block::DiskMode;
use zygote_vmm::devices::virtio::state::DeviceState;
use zygote_vmm::persist::snapshot_files::{read_meta, read_state, verify_memory, STATE_FILE};
use zygote_vmm::persist::{CpuIdentity, VmState};

use super::{ExportedSnapshot, RuntimeError, SnapshotData};

fn persist_err(what: &str) -> impl Fn(zygote_vmm::persist::PersistError) -> RuntimeError + '_ {
    move |e| RuntimeError::Boot(format!("{what}: {e}"))
}

/// A pack's state the VMM's reader refuses: the client's error (its messages name no
/// host path).
fn bad_pack(what: &str) -> impl Fn(zygote_vmm::persist::PersistError) -> RuntimeError + '_ {
    move |e| RuntimeError::BadPack(format!("{what}: {e}"))
}

/// The root disk's base image path in a saved state (the copy-on-write block device).
fn base_path(state: &mut VmState) -> Option<&mut PathBuf> {
    state
        .devices
        .virtio
        .iter_mut()
        .find_map(|d| match &mut d.device {
            DeviceState::Block(b) if b.config.mode == DiskMode::CopyOnWrite => {
                Some(&mut b.config.path)
            }
            _ => None,
        })
}

/// `vm_dir`'s files as (name relative to the snapshot's directory, path).
fn files_of(vm_dir: &Path, prefix: &str) -> Result<Vec<(String, PathBuf)>, RuntimeError> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(vm_dir).map_err(RuntimeError::io("listing the snapshot"))?;
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_file()) {
            let name = e.file_name().to_string_lossy().into_owned();
            out.push((format!("{prefix}/{name}"), e.path()));
        }
    }
    out.sort();
    Ok(out)
}

pub(super) fn export(
    data: &SnapshotData,
    vm_dir_name: &str,
) -> Result<ExportedSnapshot, RuntimeError> {
    let vm_dir = data.dir.join(vm_dir_name);
    let meta = read_meta(&vm_dir).map_err(persist_err("reading the snapshot's meta.json"))?;
    if meta.parent.is_some() {
        return Err(RuntimeError::Unsupported(
            "a diff snapshot needs its parent's memory and is not packed: pack a full or live \
             snapshot"
                .into(),
        ));
    }
    let mut state = read_state(&vm_dir, &CpuIdentity::host())
        .map_err(persist_err("reading the snapshot's state"))?;
    let base = base_path(&mut state)
        .ok_or_else(|| {
            RuntimeError::Unsupported("the snapshot has no copy-on-write root disk".into())
        })?
        .clone();
    let state_file = data
        .state_file
        .strip_prefix(&data.dir)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| format!("{vm_dir_name}/memory.bin"));
    Ok(ExportedSnapshot {
        base,
        disk: None,
        state: files_of(&vm_dir, vm_dir_name)?,
        state_file,
    })
}

pub(super) fn import(dir: &Path, vm_dir_name: &str, base: &Path) -> Result<(), RuntimeError> {
    let vm_dir = dir.join(vm_dir_name);
    let meta = read_meta(&vm_dir).map_err(bad_pack("the pack's meta.json"))?;
    if meta.parent.is_some() {
        return Err(RuntimeError::Unsupported(
            "the pack holds a diff snapshot".into(),
        ));
    }
    verify_memory(&vm_dir, &meta).map_err(bad_pack("the pack's memory"))?;
    let host = CpuIdentity::host();
    let mut state = read_state(&vm_dir, &host).map_err(bad_pack("the pack's state"))?;
    // The state names files the VMM opens: a pack may bring one copy-on-write root disk
    // (pointed at this host's base below) and no other disk.
    let disks = state
        .devices
        .virtio
        .iter()
        .filter(|d| matches!(d.device, DeviceState::Block(_)))
        .count();
    if disks != 1 {
        return Err(RuntimeError::BadPack(format!(
            "the pack's state has {disks} disks; a sandbox has one copy-on-write root disk"
        )));
    }
    let path = base_path(&mut state).ok_or_else(|| {
        RuntimeError::BadPack("the pack's state has no copy-on-write root disk".into())
    })?;
    *path = base.to_path_buf();
    let tmp = vm_dir.join(format!("{STATE_FILE}.tmp"));
    let mut f = std::fs::File::create(&tmp).map_err(RuntimeError::io("writing the state"))?;
    state
        .write_to(&mut f, &host)
        .map_err(persist_err("writing the state"))?;
    f.sync_all()
        .map_err(RuntimeError::io("writing the state"))?;
    std::fs::rename(&tmp, vm_dir.join(STATE_FILE)).map_err(RuntimeError::io("writing the state"))
}
