//! `apply`: a batch of tree changes made in order (what a `merge` from another sandbox
//! comes down to). File contents arrive beforehand as staged files next to their
//! destination (`write_file`), so each `install` is one rename on one filesystem.
use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use zygote_proto::{ApplyRequest, ErrorBody, ErrorCode, Response, TreeOp, MAX_APPLY_OPS};

use crate::files::{abs_path, io_err};

type Result<T> = std::result::Result<T, ErrorBody>;

pub(crate) fn apply(req: &ApplyRequest) -> Result<Response> {
    if req.ops.len() > MAX_APPLY_OPS {
        return Err(ErrorBody::new(
            ErrorCode::BadRequest,
            format!("{} operations; at most {MAX_APPLY_OPS}", req.ops.len()),
        ));
    }
    // Checked in full first: a malformed batch changes nothing.
    for (i, op) in req.ops.iter().enumerate() {
        check(op).map_err(|e| at(i, e))?;
    }
    let mut touched = BTreeSet::new();
    for (i, op) in req.ops.iter().enumerate() {
        run(op, &mut touched).map_err(|e| at(i, e))?;
    }
    // Durable before the answer: the renames and removals are in their directories.
    for dir in &touched {
        if let Ok(f) = fs::File::open(dir) {
            let _ = f.sync_all();
        }
    }
    Ok(Response::Applied {
        done: req.ops.len() as u32,
    })
}

fn at(index: usize, e: ErrorBody) -> ErrorBody {
    ErrorBody::new(e.code, format!("operation {index}: {}", e.message))
}

fn bad(message: String) -> ErrorBody {
    ErrorBody::new(ErrorCode::BadRequest, message)
}

fn check(op: &TreeOp) -> Result<()> {
    let (paths, mode): (Vec<&str>, Option<u32>) = match op {
        TreeOp::Mkdir { path, mode } | TreeOp::Chmod { path, mode } => (vec![path], Some(*mode)),
        TreeOp::Chown { path, .. } => (vec![path], None),
        TreeOp::Symlink { path, target } => {
            if target.is_empty() || target.contains('\0') {
                return Err(bad(format!("{path}: bad symlink target {target:?}")));
            }
            (vec![path], None)
        }
        TreeOp::Install { from, to, mode } => (vec![from, to], Some(*mode)),
        TreeOp::Remove { path, .. } => (vec![path], None),
    };
    for p in paths {
        let path = abs_path(p)?;
        if path.parent().is_none() || path.file_name().is_none() {
            return Err(bad(format!("{p}: not a path below /")));
        }
    }
    match mode {
        Some(m) if m > 0o7777 => Err(bad(format!("mode {m:#o} has bits outside 0o7777"))),
        _ => Ok(()),
    }
}

fn parent(path: &Path) -> PathBuf {
    path.parent().unwrap_or(Path::new("/")).to_path_buf()
}

/// Fails if a directory is in the way of a non-directory.
fn not_a_dir(path: &Path) -> Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Err(ErrorBody::new(
            ErrorCode::BadRequest,
            format!("{}: is a directory", path.display()),
        )),
        _ => Ok(()),
    }
}

fn chmod(path: &Path, mode: u32) -> Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_err(path))
}

fn run(op: &TreeOp, touched: &mut BTreeSet<PathBuf>) -> Result<()> {
    match op {
        TreeOp::Mkdir { path, mode } => {
            let path = Path::new(path);
            match fs::symlink_metadata(path) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(bad(format!(
                        "{}: exists and is not a directory",
                        path.display()
                    )))
                }
                Err(_) => {
                    fs::DirBuilder::new()
                        .mode(*mode)
                        .create(path)
                        .map_err(io_err(path))?;
                    touched.insert(parent(path));
                }
            }
            // Explicit: the creation mode is filtered by the umask.
            chmod(path, *mode)
        }
        TreeOp::Symlink { path, target } => {
            let path = Path::new(path);
            not_a_dir(path)?;
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            let temp = parent(path).join(format!(".{name}.zygote-link-{}", std::process::id()));
            let _ = fs::remove_file(&temp);
            std::os::unix::fs::symlink(target, &temp).map_err(io_err(&temp))?;
            if let Err(e) = fs::rename(&temp, path) {
                let _ = fs::remove_file(&temp);
                return Err(io_err(path)(e));
            }
            touched.insert(parent(path));
            Ok(())
        }
        TreeOp::Install { from, to, mode } => {
            let (from, to) = (Path::new(from), Path::new(to));
            not_a_dir(to)?;
            let staged = fs::symlink_metadata(from).map_err(io_err(from))?;
            if !staged.is_file() {
                return Err(bad(format!(
                    "{}: not a staged regular file",
                    from.display()
                )));
            }
            chmod(from, *mode)?;
            fs::rename(from, to).map_err(|e| {
                ErrorBody::from_io(&format!("{} -> {}", from.display(), to.display()), &e)
            })?;
            touched.insert(parent(to));
            Ok(())
        }
        TreeOp::Remove { path, recursive } => {
            let path = Path::new(path);
            let removed = match fs::symlink_metadata(path) {
                Err(_) => return Ok(()),
                Ok(m) if m.is_dir() && *recursive => fs::remove_dir_all(path),
                Ok(m) if m.is_dir() => fs::remove_dir(path),
                Ok(_) => fs::remove_file(path),
            };
            removed.map_err(io_err(path))?;
            touched.insert(parent(path));
            Ok(())
        }
        TreeOp::Chmod { path, mode } => {
            let path = Path::new(path);
            let m = fs::symlink_metadata(path).map_err(io_err(path))?;
            if m.file_type().is_symlink() {
                return Err(bad(format!(
                    "{}: a symlink has no mode to set",
                    path.display()
                )));
            }
            chmod(path, *mode)
        }
        TreeOp::Chown { path, uid, gid } => {
            let path = Path::new(path);
            std::os::unix::fs::lchown(path, Some(*uid), Some(*gid)).map_err(io_err(path))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn s(p: &Path) -> String {
        p.to_str().unwrap().to_string()
    }

    #[test]
    fn applies_in_order_and_replaces_files_and_links() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        fs::write(root.join("old"), "x").unwrap();
        fs::write(root.join("link"), "was a file").unwrap();
        fs::write(root.join(".staged"), "new content").unwrap();
        fs::create_dir(root.join("gone")).unwrap();
        fs::write(root.join("gone/f"), "f").unwrap();
        let ops = vec![
            TreeOp::Remove {
                path: s(&root.join("gone")),
                recursive: true,
            },
            TreeOp::Mkdir {
                path: s(&root.join("d")),
                mode: 0o750,
            },
            TreeOp::Install {
                from: s(&root.join(".staged")),
                to: s(&root.join("d/file")),
                mode: 0o600,
            },
            TreeOp::Symlink {
                path: s(&root.join("link")),
                target: "d/file".into(),
            },
            TreeOp::Chmod {
                path: s(&root.join("old")),
                mode: 0o700,
            },
            TreeOp::Remove {
                path: s(&root.join("absent")),
                recursive: false,
            },
        ];
        let r = apply(&ApplyRequest { ops }).unwrap();
        assert_eq!(r, Response::Applied { done: 6 });
        assert!(!root.join("gone").exists());
        assert_eq!(fs::metadata(root.join("d")).unwrap().mode() & 0o7777, 0o750);
        assert_eq!(
            fs::read_to_string(root.join("d/file")).unwrap(),
            "new content"
        );
        assert_eq!(
            fs::metadata(root.join("d/file")).unwrap().mode() & 0o7777,
            0o600
        );
        assert!(!root.join(".staged").exists());
        assert_eq!(
            fs::read_link(root.join("link")).unwrap(),
            Path::new("d/file")
        );
        assert_eq!(
            fs::metadata(root.join("old")).unwrap().mode() & 0o7777,
            0o700
        );
    }

    #[test]
    fn a_malformed_batch_changes_nothing_and_a_failure_names_its_operation() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let made = root.join("made");
        let ops = vec![
            TreeOp::Mkdir {
                path: s(&made),
                mode: 0o755,
            },
            TreeOp::Chmod {
                path: "relative".into(),
                mode: 0o644,
            },
        ];
        let e = apply(&ApplyRequest { ops }).unwrap_err();
        assert!(e.message.starts_with("operation 1:"), "{}", e.message);
        assert!(!made.exists(), "nothing applied from a malformed batch");

        fs::create_dir(root.join("dir")).unwrap();
        fs::write(root.join(".staged"), "x").unwrap();
        let ops = vec![
            TreeOp::Mkdir {
                path: s(&made),
                mode: 0o755,
            },
            TreeOp::Install {
                from: s(&root.join(".staged")),
                to: s(&root.join("dir")),
                mode: 0o644,
            },
        ];
        let e = apply(&ApplyRequest { ops }).unwrap_err();
        assert!(e.message.starts_with("operation 1:"), "{}", e.message);
        assert!(e.message.contains("is a directory"), "{}", e.message);
        assert!(made.is_dir(), "operations before the failure stay made");
        let e = apply(&ApplyRequest {
            ops: vec![TreeOp::Mkdir {
                path: s(&root.join("x")),
                mode: 0o17777,
            }],
        })
        .unwrap_err();
        assert!(e.message.contains("outside 0o7777"), "{}", e.message);
    }
}
