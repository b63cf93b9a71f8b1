//! `zygote serve`: run the daemon. The daemon is the `zygoted` binary: this command
//! replaces itself with it (same pid, same arguments, same environment), so the CLI
//! does not link the daemon (and the qemu runtime's console pumps, which re-run the
//! daemon's executable, are `zygoted` too). `zygoted` is looked for next to this executable (where
//! `cargo build` and an install put both), then on `PATH`.
use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

/// The daemon's binary.
pub const DAEMON_BIN: &str = "zygoted";

/// `zygote serve [ZYGOTED OPTIONS...]`: every argument goes to `zygoted` as is
/// (`zygote serve --help` shows its options).
#[derive(clap::Args, Debug, Clone)]
#[command(disable_help_flag = true)]
pub struct ServeArgs {
    /// zygoted's options: --listen, --state-dir, --runtime, --network, ... (see
    /// `zygote serve --help`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub args: Vec<OsString>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "`zygote serve` runs the daemon binary {DAEMON_BIN}, which is neither next to this \
         program{beside} nor on PATH: install it alongside `zygote` (or build it: `cargo \
         build --release -p zygote-daemon`)"
    )]
    NotFound { beside: String },
    #[error("starting {}: {source}", path.display())]
    Exec {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub fn run(args: ServeArgs) -> anyhow::Result<i32> {
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf));
    let path_var = std::env::var_os("PATH");
    let daemon = locate(exe_dir.as_deref(), path_var.as_deref())?;
    let mut cmd = std::process::Command::new(&daemon);
    cmd.args(&args.args);
    // `zygote serve` has always logged warnings only (zygoted alone: info).
    if std::env::var_os("ZYGOTE_LOG").is_none() {
        cmd.env("ZYGOTE_LOG", "warn");
    }
    // exec returns only if it failed.
    let source = cmd.exec();
    Err(ServeError::Exec {
        path: daemon,
        source,
    }
    .into())
}

/// `zygoted` in `exe_dir`, else in the first directory of `path_var` that has it.
fn locate(exe_dir: Option<&Path>, path_var: Option<&OsStr>) -> Result<PathBuf, ServeError> {
    let on_path = path_var.into_iter().flat_map(std::env::split_paths);
    exe_dir
        .map(Path::to_path_buf)
        .into_iter()
        .chain(on_path)
        .map(|dir| dir.join(DAEMON_BIN))
        .find(|p| is_executable(p))
        .ok_or_else(|| ServeError::NotFound {
            beside: exe_dir
                .map(|d| format!(" ({})", d.join(DAEMON_BIN).display()))
                .unwrap_or_default(),
        })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn put_daemon(dir: &Path, mode: u32) -> PathBuf {
        let p = dir.join(DAEMON_BIN);
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn the_daemon_beside_the_cli_wins_then_path() {
        let beside = tempfile::tempdir().unwrap();
        let (on_path, empty) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let path_var = std::env::join_paths([empty.path(), on_path.path()]).unwrap();
        let in_path = put_daemon(on_path.path(), 0o755);
        assert_eq!(
            locate(Some(beside.path()), Some(&path_var)).unwrap(),
            in_path
        );
        let here = put_daemon(beside.path(), 0o755);
        assert_eq!(locate(Some(beside.path()), Some(&path_var)).unwrap(), here);
    }

    #[test]
    fn a_missing_daemon_is_a_clear_error() {
        let beside = tempfile::tempdir().unwrap();
        // Not executable: not a daemon to run.
        put_daemon(beside.path(), 0o644);
        let err = locate(Some(beside.path()), None).unwrap_err().to_string();
        assert!(err.contains("zygoted"), "{err}");
        assert!(err.contains(&beside.path().display().to_string()), "{err}");
        assert!(err.contains("nor on PATH"), "{err}");
    }
}
