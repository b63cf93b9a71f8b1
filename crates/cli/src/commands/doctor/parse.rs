//! Pure parsers for the procfs/sysfs text formats `doctor` reads. They take the
//! file contents as a string so they can be tested with literal samples and so
//! the I/O in `facts` stays trivial.

/// The active value of a sysfs multiple-choice file such as
/// `transparent_hugepage/enabled` ("always [madvise] never"): the kernel marks
/// the selected choice with brackets.
pub fn bracketed(text: &str) -> Option<String> {
    text.split_whitespace()
        .find_map(|word| word.strip_prefix('[')?.strip_suffix(']'))
        .map(str::to_owned)
}

/// The CPU feature flags of the first processor in /proc/cpuinfo. Every
/// processor lists the same virtualization flags, so the first one suffices.
pub fn cpu_flags(cpuinfo: &str) -> Vec<&str> {
    cpuinfo
        .lines()
        .find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == "flags").then_some(value)
        })
        .map(|flags| flags.split_whitespace().collect())
        .unwrap_or_default()
}

/// The first CPU's `model name` from /proc/cpuinfo.
pub fn cpu_model(cpuinfo: &str) -> Option<&str> {
    cpuinfo.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == "model name").then_some(value.trim())
    })
}

/// A `Key:   123 kB` value from /proc/meminfo, in KiB.
pub fn meminfo_kib(meminfo: &str, key: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let (k, rest) = line.split_once(':')?;
        if k.trim() != key {
            return None;
        }
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// Filesystem type names from /proc/filesystems ("nodev\tcgroup2" or "\txfs").
pub fn filesystems(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| line.split_whitespace().last())
        .map(str::to_owned)
        .collect()
}

/// A cgroup2 mount found in /proc/self/mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup2Mount {
    pub mount_point: String,
    pub read_only: bool,
}

/// Every cgroup2 mount in /proc/self/mounts. On a hybrid (v1 + v2) host the v2
/// hierarchy usually sits at /sys/fs/cgroup/unified; on a pure v2 host at
/// /sys/fs/cgroup.
pub fn cgroup2_mounts(mounts: &str) -> Vec<Cgroup2Mount> {
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_dev, mount_point, fstype, options) = (
                fields.next()?,
                fields.next()?,
                fields.next()?,
                fields.next()?,
            );
            (fstype == "cgroup2").then(|| Cgroup2Mount {
                mount_point: unescape_mount_path(mount_point),
                read_only: options.split(',').any(|o| o == "ro"),
            })
        })
        .collect()
}

/// /proc/self/mounts escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape_mount_path(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// This process's path inside the cgroup2 hierarchy: the `0::/path` line of
/// /proc/self/cgroup (the v1 lines carry a non-zero hierarchy id).
pub fn cgroup2_path(proc_self_cgroup: &str) -> Option<String> {
    proc_self_cgroup
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(str::to_owned)
}

/// The name of group `gid` in an /etc/group-format text, so a permission hint
/// can name the group that owns /dev/kvm.
pub fn group_name(etc_group: &str, gid: u32) -> Option<String> {
    etc_group.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id = fields.nth(1)?.parse::<u32>().ok()?;
        (id == gid).then(|| name.to_owned())
    })
}

/// Human name of a `statfs` f_type magic number, for the filesystems worth
/// naming in a report.
pub fn fs_name(magic: u64) -> &'static str {
    match magic {
        0xEF53 => "ext2/3/4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0xCA45_1A4E => "bcachefs",
        0x0102_1994 => "tmpfs",
        0x794C_7630 => "overlayfs",
        0x6969 => "nfs",
        0x6573_5546 => "fuse",
        0x2FC1_2FC1 => "zfs",
        0x5346_544E => "ntfs",
        0x4D44 => "vfat",
        _ => "unknown",
    }
}

/// Whether files on a filesystem with this magic can be cloned with FICLONE.
/// XFS only when formatted with `reflink=1` (mkfs.xfs's default since
/// xfsprogs 5.1); the report says so rather than probing with a write.
pub fn fs_reflink(magic: u64) -> bool {
    matches!(fs_name(magic), "xfs" | "btrfs" | "bcachefs")
}

/// The `nameserver` entries of an /etc/resolv.conf text, in order, as written
/// (IPv4 and IPv6 alike).
pub fn nameservers(resolv_conf: &str) -> Vec<String> {
    resolv_conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The first word of a version line that carries a digit, without trailing commas:
/// "ip utility, iproute2-6.1.0, libbpf 1.1.2" -> "iproute2-6.1.0",
/// "nftables v1.0.6 (Lester Gooch #5)" -> "v1.0.6".
pub fn version_word(line: &str) -> Option<&str> {
    line.split_whitespace()
        .map(|w| w.trim_end_matches(','))
        .find(|w| w.chars().any(|c| c.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_model_name() {
        let info = "processor\t: 0\nvendor_id\t: AuthenticAMD\n\
                    model name\t: QEMU TCG CPU version 2.5+\nflags\t\t: fpu svm\n";
        assert_eq!(cpu_model(info), Some("QEMU TCG CPU version 2.5+"));
        assert_eq!(cpu_model("flags : fpu\n"), None);
    }

    #[test]
    fn bracket_picks_selected_value() {
        assert_eq!(
            bracketed("always [madvise] never\n").as_deref(),
            Some("madvise")
        );
        assert_eq!(
            bracketed("[always] madvise never").as_deref(),
            Some("always")
        );
        assert_eq!(
            bracketed("always defer defer+madvise [madvise] never").as_deref(),
            Some("madvise")
        );
        assert_eq!(
            bracketed("always madvise [never]").as_deref(),
            Some("never")
        );
        assert_eq!(bracketed("always madvise never"), None);
        assert_eq!(bracketed(""), None);
    }

    #[test]
    fn cpuinfo_flags_of_first_processor() {
        let text = "processor\t: 0\nvendor_id\t: GenuineIntel\n\
                    flags\t\t: fpu vme sse2 vmx hypervisor\nbugs\t\t: spectre\n\n\
                    processor\t: 1\nflags\t\t: fpu other\n";
        let flags = cpu_flags(text);
        assert!(flags.contains(&"vmx"));
        assert!(flags.contains(&"hypervisor"));
        assert!(!flags.contains(&"other"));
        assert!(!flags.contains(&"spectre"));
        // `vmx flags` (a separate line on newer kernels) must not be mistaken
        // for the flags line.
        let text = "vmx flags\t: ept vpid\nflags\t\t: fpu svm\n";
        assert_eq!(cpu_flags(text), vec!["fpu", "svm"]);
        assert!(cpu_flags("").is_empty());
    }

    #[test]
    fn meminfo_values() {
        let text = "MemTotal:       24684092 kB\nMemFree:  1 kB\nMemAvailable:   24306652 kB\n";
        assert_eq!(meminfo_kib(text, "MemTotal"), Some(24_684_092));
        assert_eq!(meminfo_kib(text, "MemAvailable"), Some(24_306_652));
        assert_eq!(meminfo_kib(text, "Mem"), None);
    }

    #[test]
    fn proc_filesystems() {
        let fs = filesystems("nodev\tsysfs\nnodev\tcgroup2\n\text4\n\txfs\n");
        assert_eq!(fs, vec!["sysfs", "cgroup2", "ext4", "xfs"]);
    }

    #[test]
    fn cgroup2_mount_points() {
        let text = "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n\
                    cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n\
                    cgroup2 /mnt/my\\040cg cgroup2 ro,nosuid 0 0\n";
        assert_eq!(
            cgroup2_mounts(text),
            vec![
                Cgroup2Mount {
                    mount_point: "/sys/fs/cgroup/unified".into(),
                    read_only: false
                },
                Cgroup2Mount {
                    mount_point: "/mnt/my cg".into(),
                    read_only: true
                },
            ]
        );
        let text = "9:name=systemd:/\n4:memory:/x\n0::/user.slice/a.scope\n";
        assert_eq!(cgroup2_path(text).as_deref(), Some("/user.slice/a.scope"));
        assert_eq!(cgroup2_path("4:memory:/x\n"), None);
    }

    #[test]
    fn group_lookup() {
        let text = "root:x:0:\nkvm:x:993:alice,bob\n";
        assert_eq!(group_name(text, 993).as_deref(), Some("kvm"));
        assert_eq!(group_name(text, 0).as_deref(), Some("root"));
        assert_eq!(group_name(text, 5), None);
    }

    #[test]
    fn fs_magic() {
        assert_eq!(fs_name(0xEF53), "ext2/3/4");
        assert!(fs_reflink(0x5846_5342));
        assert!(fs_reflink(0x9123_683E));
        assert!(!fs_reflink(0xEF53));
        assert!(!fs_reflink(0x0102_1994));
    }

    #[test]
    fn resolv_conf_nameservers() {
        let conf = "# x\nsearch example\nnameserver 127.0.0.53\n  nameserver ::1 \nnameserver\n";
        assert_eq!(nameservers(conf), vec!["127.0.0.53", "::1"]);
        assert!(nameservers("").is_empty());
    }

    #[test]
    fn tool_version_words() {
        let ip = "ip utility, iproute2-6.1.0, libbpf 1.1.2";
        assert_eq!(version_word(ip), Some("iproute2-6.1.0"));
        assert_eq!(
            version_word("nftables v1.0.6 (Lester Gooch #5)"),
            Some("v1.0.6")
        );
        assert_eq!(version_word("no digits"), None);
    }
}
