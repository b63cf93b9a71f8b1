//! Scratch XFS and btrfs filesystems on loop devices, for the bench and the
//! tests.
//!
//! The point of this crate is reflinks and snapshots, and the machines we
//! run on usually have ext4 roots, so the only honest way to exercise (and
//! measure) those paths is a real filesystem made on the spot: a sparse
//! image file, `mkfs.xfs -m reflink=1` or `mkfs.btrfs`, a loop device, a
//! mount. [`LoopFs`] owns all of that and undoes it on drop, including after
//! a failed assertion.
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Why a scratch filesystem could not be made.
#[derive(Debug, thiserror::Error)]
pub enum LoopFsError {
    /// The host cannot do this at all (not root, no loop devices, no
    /// mkfs.xfs): callers skip, printing the reason.
    #[error("{0}")]
    Unavailable(String),
    #[error("`{command}` failed: {detail}")]
    Command { command: String, detail: String },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Check the prerequisites for a loop-mounted XFS without touching anything.
pub fn xfs_availability() -> Result<(), LoopFsError> {
    availability("mkfs.xfs", "xfsprogs")
}

/// Check the prerequisites for a loop-mounted btrfs without touching anything.
pub fn btrfs_availability() -> Result<(), LoopFsError> {
    availability("mkfs.btrfs", "btrfs-progs")?;
    let fss = fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !fss
        .lines()
        .any(|l| l.split_whitespace().last() == Some("btrfs"))
    {
        return Err(LoopFsError::Unavailable(
            "the kernel has no btrfs filesystem (modprobe btrfs)".into(),
        ));
    }
    Ok(())
}

fn availability(mkfs: &str, package: &str) -> Result<(), LoopFsError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(LoopFsError::Unavailable(
            "not root: attaching loop devices and mounting need CAP_SYS_ADMIN".into(),
        ));
    }
    if !Path::new("/dev/loop-control").exists() {
        return Err(LoopFsError::Unavailable(
            "/dev/loop-control missing: no loop device support".into(),
        ));
    }
    for tool in [[mkfs, "-V"], ["losetup", "--version"]] {
        let ok = Command::new(tool[0])
            .arg(tool[1])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !ok {
            return Err(LoopFsError::Unavailable(format!(
                "`{}` not found or not working (install {package}/util-linux)",
                tool[0]
            )));
        }
    }
    Ok(())
}

/// Which filesystem a [`LoopFs`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopFsKind {
    /// XFS with reflink (`-m reflink=1`).
    Xfs,
    /// btrfs (reflinks and subvolume snapshots).
    Btrfs,
}

/// The XFS flavour, by its historical name.
pub type LoopXfs = LoopFs;

/// A mounted filesystem on a loop device, unmounted, detached and deleted on
/// drop.
pub struct LoopFs {
    // Declared (and therefore dropped) after our own Drop ran the unmount.
    dir: tempfile::TempDir,
    mountpoint: PathBuf,
    device: Option<String>,
    mounted: bool,
}

fn run(cmd: &mut Command) -> Result<String, LoopFsError> {
    let command = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| LoopFsError::Command {
        command: command.clone(),
        detail: e.to_string(),
    })?;
    if !out.status.success() {
        return Err(LoopFsError::Command {
            command,
            detail: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl LoopFs {
    /// Make a sparse XFS image of `size` bytes under `parent` and mount it.
    /// mkfs.xfs refuses filesystems under 300 MiB, so `size` is raised to
    /// 512 MiB if smaller; being sparse, unused space costs nothing.
    pub fn create(parent: &Path, size: u64) -> Result<LoopFs, LoopFsError> {
        Self::create_kind(parent, size, LoopFsKind::Xfs)
    }

    /// The same with btrfs.
    pub fn create_btrfs(parent: &Path, size: u64) -> Result<LoopFs, LoopFsError> {
        Self::create_kind(parent, size, LoopFsKind::Btrfs)
    }

    pub fn create_kind(parent: &Path, size: u64, kind: LoopFsKind) -> Result<LoopFs, LoopFsError> {
        match kind {
            LoopFsKind::Xfs => xfs_availability()?,
            LoopFsKind::Btrfs => btrfs_availability()?,
        }
        let dir = tempfile::Builder::new()
            .prefix("zygote-loopfs-")
            .tempdir_in(parent)
            .map_err(|e| LoopFsError::Io {
                what: "create temp dir in",
                path: parent.into(),
                source: e,
            })?;
        let image = dir.path().join("fs.img");
        let mountpoint = dir.path().join("mnt");
        let io = |what, path: &Path| {
            let path = path.to_path_buf();
            move |source| LoopFsError::Io { what, path, source }
        };
        fs::create_dir(&mountpoint).map_err(io("create", &mountpoint))?;
        File::create(&image)
            .and_then(|f| f.set_len(size.max(512 << 20)))
            .map_err(io("create sparse image", &image))?;
        // From here on, Drop knows how to undo whatever succeeded.
        let mut fs = LoopFs {
            dir,
            mountpoint,
            device: None,
            mounted: false,
        };
        match kind {
            LoopFsKind::Xfs => run(Command::new("mkfs.xfs")
                .args(["-q", "-f", "-m", "reflink=1"])
                .arg(&image))?,
            LoopFsKind::Btrfs => run(Command::new("mkfs.btrfs").args(["-q", "-f"]).arg(&image))?,
        };
        let device = run(Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&image))?;
        fs.device = Some(device.clone());
        let fstype = match kind {
            LoopFsKind::Xfs => "xfs",
            LoopFsKind::Btrfs => "btrfs",
        };
        run(Command::new("mount")
            .args(["-t", fstype, &device])
            .arg(&fs.mountpoint))?;
        fs.mounted = true;
        Ok(fs)
    }

    /// Root of the mounted filesystem.
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// The loop device backing it (e.g. `/dev/loop3`).
    pub fn device(&self) -> Option<&str> {
        self.device.as_deref()
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if self.mounted {
            // A lazy unmount is the fallback if something still holds a file
            // open; the loop device is then released when that goes away.
            if run(Command::new("umount").arg(&self.mountpoint)).is_err() {
                let _ = run(Command::new("umount").arg("-l").arg(&self.mountpoint));
            }
        }
        if let Some(dev) = &self.device {
            let _ = run(Command::new("losetup").args(["-d", dev]));
        }
        // self.dir (image + mountpoint) is removed when the field drops.
        let _ = &self.dir;
    }
}
