//! Running `ip` and `nft` (iproute2 and nftables, the tools operators read and debug
//! these objects with) on the host and inside a sandbox's namespace.
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::NetError;

/// Where `ip netns add` keeps named namespaces.
pub const NETNS_DIR: &str = "/run/netns";

pub fn netns_path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

/// Runs `program args` with `stdin` fed in; its stderr becomes the error.
pub fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<(), NetError> {
    let what = || format!("{program} {}", args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| NetError::Command {
            what: what(),
            message: e.to_string(),
        })?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A program that fails early closes its stdin; its stderr says why.
        let _ = pipe.write_all(text.as_bytes());
    }
    let out = child.wait_with_output().map_err(|e| NetError::Command {
        what: what(),
        message: e.to_string(),
    })?;
    if out.status.success() {
        return Ok(());
    }
    Err(NetError::Command {
        what: what(),
        message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}

/// `ip netns exec <ns> sh -c <script>`, with `stdin`.
pub fn in_netns(netns: &str, script: &str, stdin: Option<&str>) -> Result<(), NetError> {
    run("ip", &["netns", "exec", netns, "sh", "-c", script], stdin)
}

/// Loads an nftables ruleset inside `netns` (None: on the host).
pub fn nft(netns: Option<&str>, rules: &str) -> Result<(), NetError> {
    match netns {
        Some(ns) => in_netns(ns, "nft -f -", Some(rules)),
        None => run("nft", &["-f", "-"], Some(rules)),
    }
}

/// Names of the named network namespaces.
pub fn netns_names() -> Vec<String> {
    std::fs::read_dir(NETNS_DIR)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Names of the host's network links.
pub fn link_names() -> Vec<String> {
    std::fs::read_dir("/sys/class/net")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Deletes a namespace (its veth pair goes with it once no process holds it) and the
/// host end of its link right away. Missing pieces are not errors.
pub fn remove(netns: &str, host_link: Option<&str>) {
    if let Some(link) = host_link {
        if Path::new("/sys/class/net").join(link).exists() {
            if let Err(e) = run("ip", &["link", "del", link], None) {
                tracing::warn!("{e}");
            }
        }
    }
    if netns_path(netns).exists() {
        if let Err(e) = run("ip", &["netns", "del", netns], None) {
            tracing::warn!("{e}");
        }
    }
}

/// Gives named namespace `old` the name `new` (a spare taken by a sandbox): `new` is
/// bound to the same namespace, then `old` unmounted and unlinked (a mount under the
/// shared `/run/netns` cannot be moved). No process is run. A crash in between leaves
/// both names, and the next start's sweep removes whichever no sandbox owns.
pub fn rename_netns(old: &str, new: &str) -> Result<(), NetError> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let (from, to) = (netns_path(old), netns_path(new));
    let fail = |what: &str, e: std::io::Error| NetError::Command {
        what: format!("naming namespace {old} {new}: {what}"),
        message: e.to_string(),
    };
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).expect("no NUL in a netns path");
    let (cfrom, cto) = (c(&from), c(&to));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&to)
        .map_err(|e| fail("creating the mount point", e))?;
    // SAFETY: both paths are NUL-terminated C strings that live across the call; a bind
    // mount takes no filesystem type or data.
    let bound = unsafe {
        libc::mount(
            cfrom.as_ptr(),
            cto.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if bound != 0 {
        let e = std::io::Error::last_os_error();
        let _ = std::fs::remove_file(&to);
        return Err(fail("bind mount", e));
    }
    // SAFETY: as above; MNT_DETACH unmounts even if the name is in use.
    if unsafe { libc::umount2(cfrom.as_ptr(), libc::MNT_DETACH) } != 0 {
        tracing::warn!(
            "naming namespace {old} {new}: unmounting the old name: {}",
            std::io::Error::last_os_error()
        );
    }
    let _ = std::fs::remove_file(&from);
    Ok(())
}

/// The host's first IPv4 resolver that is not on loopback (a namespace cannot reach
/// the host's loopback), from `resolv.conf` text.
pub fn upstream_dns(resolv_conf: &str) -> Option<std::net::Ipv4Addr> {
    resolv_conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.trim().parse::<std::net::Ipv4Addr>().ok())
        .find(|a| !a.is_loopback() && !a.is_unspecified())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_resolvers_are_skipped() {
        let conf = "# x\nnameserver 127.0.0.53\nnameserver ::1\nnameserver 10.255.255.53\n";
        assert_eq!(upstream_dns(conf), Some([10, 255, 255, 53].into()));
        assert_eq!(upstream_dns("nameserver 127.0.0.53\n"), None);
    }

    #[test]
    fn failures_carry_the_tools_words() {
        let e = run("sh", &["-c", "echo nope >&2; exit 3"], None).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
        run("sh", &["-c", "read x; [ \"$x\" = hi ]"], Some("hi\n")).unwrap();
    }
}
