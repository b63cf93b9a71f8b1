//! Owners, modes and extended attributes set inside a packed ext4 image with
//! `debugfs -w`: how an unprivileged conversion gives files the owners (root,
//! service users) it could not give them on the host.
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use crate::apply::Fixup;
use crate::error::{IoContext, OciError, Result};

/// Applies `fixups` to `image`; `staging` is the tree it was packed from (for each
/// path's file type, which debugfs's `mode` field includes).
pub fn apply_fixups(image: &Path, staging: &Path, fixups: &[Fixup]) -> Result<()> {
    if fixups.is_empty() {
        return Ok(());
    }
    let scratch = tempfile::tempdir_in(image.parent().unwrap_or(Path::new("/tmp")))
        .ctx(|| "creating a scratch directory for debugfs".into())?;
    let mut script = String::new();
    for (i, f) in fixups.iter().enumerate() {
        if f.guest.contains(['"', '\n', '\\']) {
            return Err(OciError::BadImage {
                what: format!("path {:?}", f.guest),
                message: "its name cannot be given to debugfs; convert as root instead".into(),
            });
        }
        let q = format!("\"{}\"", f.guest);
        script.push_str(&format!("sif {q} uid {}\nsif {q} gid {}\n", f.uid, f.gid));
        if let Some(mode) = f.mode {
            let host = staging.join(f.guest.trim_start_matches('/'));
            let kind = std::fs::symlink_metadata(&host)
                .ctx(|| format!("stat {}", host.display()))?
                .mode()
                & libc::S_IFMT;
            script.push_str(&format!("sif {q} mode 0{:o}\n", kind | mode));
        }
        for (j, (name, value)) in f.xattrs.iter().enumerate() {
            if name.contains(['"', '\n', ' ', '\\']) {
                continue;
            }
            let file = scratch.path().join(format!("x{i}-{j}"));
            std::fs::write(&file, value).ctx(|| format!("writing {}", file.display()))?;
            script.push_str(&format!("ea_set -f {} {q} {name}\n", file.display()));
        }
    }
    let script_path = scratch.path().join("script");
    std::fs::File::create(&script_path)
        .and_then(|mut f| f.write_all(script.as_bytes()))
        .ctx(|| format!("writing {}", script_path.display()))?;
    let out = Command::new("debugfs")
        .arg("-w")
        .arg("-f")
        .arg(&script_path)
        .arg(image)
        .output()
        .ctx(|| "running debugfs (e2fsprogs)".into())?;
    // debugfs exits 0 whatever its commands did: its complaints are on stderr.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let complaints: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("debugfs "))
        .collect();
    if !out.status.success() || !complaints.is_empty() {
        return Err(OciError::BadImage {
            what: format!("setting owners in {}", image.display()),
            message: format!("debugfs: {}", complaints.join("; ")),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use zygote_images::pack::{mkfs_ext4, Ext4Spec};

    fn debugfs_stat(image: &Path, path: &str) -> String {
        let out = Command::new("debugfs")
            .arg("-R")
            .arg(format!("stat \"{path}\""))
            .arg(image)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn owners_modes_and_xattrs_land_in_the_image() {
        if Command::new("debugfs").arg("-V").output().is_err() {
            eprintln!("skipping: debugfs (e2fsprogs) is not installed");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("d")).unwrap();
        std::fs::write(root.join("d/file with space"), b"x").unwrap();
        std::os::unix::fs::symlink("d", root.join("ln")).unwrap();
        let image = dir.path().join("img.ext4");
        let key = "0123456789abcdef0123456789abcdef";
        let spec = Ext4Spec {
            size_mib: 8,
            label: "t",
            key,
            inodes: None,
        };
        mkfs_ext4(&root, &image, &spec).unwrap();
        let fixups = vec![
            Fixup {
                guest: "/d/file with space".into(),
                uid: 1000,
                gid: 1001,
                mode: Some(0o4750),
                xattrs: vec![("user.zygote".into(), b"yes".to_vec())],
            },
            Fixup {
                guest: "/ln".into(),
                uid: 7,
                gid: 8,
                mode: None,
                xattrs: vec![],
            },
        ];
        apply_fixups(&image, &root, &fixups).unwrap();
        let stat = debugfs_stat(&image, "/d/file with space");
        assert!(stat.contains("User:  1000"), "{stat}");
        assert!(stat.contains("Group:  1001"), "{stat}");
        assert!(stat.contains("Mode:  04750"), "{stat}");
        assert!(stat.contains("user.zygote (3) = \"yes\""), "{stat}");
        let link = debugfs_stat(&image, "/ln");
        assert!(
            link.contains("Type: symlink") && link.contains("User:     7"),
            "{link}"
        );
        let bad = vec![Fixup {
            guest: "/missing".into(),
            uid: 1,
            gid: 1,
            mode: None,
            xattrs: vec![],
        }];
        let err = apply_fixups(&image, &root, &bad).unwrap_err().to_string();
        assert!(err.contains("debugfs"), "{err}");
    }
}
