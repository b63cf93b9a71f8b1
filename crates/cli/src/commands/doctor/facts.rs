//! Fact gathering: read what the host offers into plain data, with no judgement.
//! `classify` turns these facts into verdicts; keeping the two apart lets the
//! verdicts be tested with constructed hosts (VMX, PVM, no KVM, ...).
//!
//! Every probe here is read-only: nothing is created, written or loaded (the
//! network probes only list: no namespace, nftables rule or sysctl is touched),
//! except the tree-clone probe (`super::treeclone`): a scratch directory made
//! and removed inside an existing directory.
use super::parse;
use serde::Serialize;
use std::ffi::CString;
use std::fs;
use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use zygote_net::{host as net_host, plan as net_plan};

#[derive(Debug, Clone, Default, Serialize)]
pub struct Facts {
    pub kvm: KvmFacts,
    pub host: HostFacts,
    pub features: FeatureFacts,
    pub network: NetworkFacts,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct KvmFacts {
    /// /dev/kvm exists.
    pub present: bool,
    /// /dev/kvm could be opened read-write (what every KVM ioctl needs).
    pub accessible: bool,
    /// Why opening failed, e.g. "Permission denied (os error 13)".
    pub open_error: Option<String>,
    pub open_errno: Option<i32>,
    pub device: Option<DeviceNode>,
    /// KVM_GET_API_VERSION; the stable API is 12.
    pub api_version: Option<i32>,
    /// KVM modules present in /sys/module (kvm, kvm_intel, kvm_amd, kvm_pvm):
    /// the vendor module says which backend serves /dev/kvm.
    pub modules: Vec<String>,
    pub caps: Option<KvmCaps>,
}

/// Ownership of a device node, so a permission failure can say how to fix it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DeviceNode {
    /// Permission bits, e.g. "0660".
    pub mode: String,
    pub uid: u32,
    pub gid: u32,
    pub group: Option<String>,
}

/// The KVM_CHECK_EXTENSION answers (and system ioctls) zygote's VMM relies on.
#[derive(Debug, Clone, Default, Serialize)]
pub struct KvmCaps {
    pub irqchip: bool,
    pub pit2: bool,
    pub user_memory: bool,
    pub ioeventfd: bool,
    pub irqfd: bool,
    pub immediate_exit: bool,
    pub xsave: bool,
    /// KVM_CAP_XSAVE2: size in bytes of the XSAVE area (0 if unsupported).
    pub xsave2_size: i32,
    /// KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2: supported flag mask (0 if absent).
    pub manual_dirty_log_protect2: i32,
    /// KVM_CAP_DIRTY_LOG_RING: maximum ring size in bytes (0 if absent).
    pub dirty_log_ring: i32,
    pub tsc_control: bool,
    /// KVM_CAP_NR_VCPUS (recommended) and KVM_CAP_MAX_VCPUS (hard limit).
    pub nr_vcpus: i32,
    pub max_vcpus: i32,
    /// Length of KVM_GET_MSR_INDEX_LIST (None if the ioctl failed).
    pub msr_index_count: Option<usize>,
    /// Entries in KVM_GET_SUPPORTED_CPUID (None if the ioctl failed).
    pub supported_cpuid_entries: Option<usize>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct HostFacts {
    pub kernel_release: String,
    pub kernel_version: String,
    pub machine: String,
    /// Online CPUs.
    pub cores: usize,
    pub mem_total_kib: Option<u64>,
    pub mem_available_kib: Option<u64>,
    /// Effective uid 0: root passes most permission checks below.
    pub root: bool,
    pub cpu: CpuFacts,
}

/// The /proc/cpuinfo flags that matter for virtualization.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CpuFacts {
    pub vmx: bool,
    pub svm: bool,
    /// We are ourselves a guest (nested virtualization needed for VMX/SVM).
    pub hypervisor: bool,
    /// `model name` of the first CPU (QEMU's software CPU names itself "QEMU TCG CPU").
    pub model: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct FeatureFacts {
    pub thp: ThpFacts,
    pub userfaultfd: UffdFacts,
    pub ksm: KsmFacts,
    pub cgroup_v2: CgroupFacts,
    pub reflink: ReflinkFacts,
    /// Tree-clone methods per place (state directory, image cache).
    pub treeclone: Vec<super::treeclone::PlaceFacts>,
    pub loop_control: DeviceFacts,
    pub tun: DeviceFacts,
    pub vhost_vsock: DeviceFacts,
    pub vhost_net: DeviceFacts,
    pub qemu: QemuFacts,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ThpFacts {
    /// Bracketed value of transparent_hugepage/enabled (None: no THP support).
    pub enabled: Option<String>,
    pub defrag: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct UffdFacts {
    /// userfaultfd(2) returned a descriptor (which was closed at once).
    pub syscall: bool,
    pub error: Option<String>,
    pub errno: Option<i32>,
    /// /proc/sys/vm/unprivileged_userfaultfd (None if the file is absent).
    pub unprivileged: Option<bool>,
    /// /dev/userfaultfd exists (the alternative for unprivileged users).
    pub dev_userfaultfd: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct KsmFacts {
    /// /sys/kernel/mm/ksm/run exists (kernel built with CONFIG_KSM).
    pub present: bool,
    pub writable: bool,
    /// Current value of `run`: 0 stopped, 1 merging, 2 unmerging.
    pub run: Option<u32>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct CgroupFacts {
    /// A cgroup2 hierarchy is mounted somewhere.
    pub mounted: bool,
    pub mount_point: Option<String>,
    /// Mounted at /sys/fs/cgroup, i.e. the host is pure v2 rather than hybrid.
    pub unified: bool,
    /// Controllers offered at the cgroup2 root.
    pub controllers: Vec<String>,
    /// Our own cgroup2 path (from /proc/self/cgroup).
    pub own_path: Option<String>,
    /// Our cgroup directory is writable, i.e. a child cgroup could be created.
    pub writable: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ReflinkFacts {
    /// The kernel knows these reflink-capable filesystems (/proc/filesystems).
    pub kernel_xfs: bool,
    pub kernel_btrfs: bool,
    pub mkfs_xfs: bool,
    /// Where zygote keeps images and clones, and the existing directory probed
    /// for it (the cache may not have been created yet).
    pub cache_dir: String,
    pub probed_dir: Option<String>,
    /// Filesystem of `probed_dir` (statfs f_type) and whether it can reflink.
    pub cache_fs: Option<String>,
    pub cache_fs_magic: Option<u64>,
    pub cache_reflink: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct DeviceFacts {
    pub path: String,
    pub present: bool,
    /// Readable and writable by us (access(2) R_OK|W_OK).
    pub accessible: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct QemuFacts {
    /// Path of qemu-system-x86_64 if found.
    pub system: Option<String>,
    /// First line of `qemu-system-x86_64 --version`.
    pub version: Option<String>,
    pub img: Option<String>,
}

/// What the daemon's isolated network backend (a namespace per sandbox, nftables
/// rules) needs and finds on this host; root and /dev/net/tun are in `host` and
/// `features`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NetworkFacts {
    /// iproute2's `ip` and nftables' `nft`, which the daemon drives.
    pub ip: ToolFacts,
    pub nft: ToolFacts,
    /// /run/netns exists (`ip netns add` creates it on first use).
    pub netns_dir: bool,
    /// Named namespaces `zygote-*` in /run/netns: sandboxes of the daemons on this host
    /// (or what a crashed one left).
    pub namespaces: usize,
    /// /proc/sys/net/ipv4/ip_forward (None: unreadable).
    pub ip_forward: Option<u32>,
    /// Host routes overlapping the sandbox ranges (10.213.0.0/16, 10.214.0.0/16), as
    /// `ip -4 route show table all` prints them (None: that did not run).
    pub route_clashes: Option<Vec<String>>,
    /// The `nameserver` entries of /etc/resolv.conf.
    pub nameservers: Vec<String>,
    /// The first non-loopback IPv4 one: where guests' DNS is forwarded by default.
    pub dns: Option<String>,
    /// `nft list table inet zygote` succeeded: the host's rules are loaded (None: not
    /// asked, which needs root and `nft`).
    pub host_table: Option<bool>,
    /// The kernel accepts an nftables `redirect` rule (loaded for real in a throwaway
    /// network namespace: the host's rules are untouched). Rules by name and secrets bound to
    /// hosts send guests' connections to the egress proxy that way. None: not asked
    /// (needs root and `nft`).
    pub egress_redirect: Option<bool>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ToolFacts {
    pub path: Option<String>,
    /// First line of its version output (`-V`).
    pub version: Option<String>,
}

/// The sandbox address ranges (guests', host links'), as (network, prefix length).
pub const SANDBOX_NETS: [(Ipv4Addr, u8); 2] = [
    (net_plan::GUEST_NET, net_plan::GUEST_PREFIX),
    (net_plan::LINK_NET, net_plan::LINK_PREFIX),
];

/// Gather everything. Never fails: anything unreadable is recorded as absent.
pub fn gather() -> Facts {
    let host = gather_host();
    Facts {
        kvm: gather_kvm(),
        network: gather_network(host.root),
        host,
        features: FeatureFacts {
            thp: ThpFacts {
                enabled: read_bracketed("/sys/kernel/mm/transparent_hugepage/enabled"),
                defrag: read_bracketed("/sys/kernel/mm/transparent_hugepage/defrag"),
            },
            userfaultfd: gather_uffd(),
            ksm: gather_ksm(),
            cgroup_v2: gather_cgroup(),
            reflink: gather_reflink(),
            treeclone: super::treeclone::gather(),
            loop_control: device("/dev/loop-control"),
            tun: device("/dev/net/tun"),
            vhost_vsock: device("/dev/vhost-vsock"),
            vhost_net: device("/dev/vhost-net"),
            qemu: gather_qemu(),
        },
    }
}

pub const KVM_MODULES: [&str; 4] = ["kvm", "kvm_intel", "kvm_amd", "kvm_pvm"];

fn gather_network(root: bool) -> NetworkFacts {
    let ip = tool("ip", &[&["-V"]]);
    let nft = tool("nft", &[&["-V"], &["--version"]]);
    let route_clashes = ip.path.as_ref().and_then(|path| {
        let out = Command::new(path)
            .args(["-4", "route", "show", "table", "all"])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| zygote_net::route_clashes(&String::from_utf8_lossy(&out.stdout)))
    });
    // Listing a table changes nothing; without root nft cannot read the ruleset.
    let host_table = nft.path.as_ref().filter(|_| root).map(|path| {
        Command::new(path)
            .args(["list", "table", "inet", "zygote"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    let egress_redirect = nft
        .path
        .as_ref()
        .filter(|_| root)
        .map(|path| nft_accepts(path, REDIRECT_CHECK));
    let resolv = fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let namespaces = fs::read_dir(net_host::NETNS_DIR)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("zygote-"))
                .count()
        })
        .unwrap_or(0);
    NetworkFacts {
        ip,
        nft,
        netns_dir: Path::new(net_host::NETNS_DIR).is_dir(),
        namespaces,
        ip_forward: fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
            .ok()
            .and_then(|s| s.trim().parse().ok()),
        route_clashes,
        nameservers: parse::nameservers(&resolv),
        dns: net_host::upstream_dns(&resolv).map(|a| a.to_string()),
        host_table,
        egress_redirect,
    }
}

/// A table with one `redirect` rule, as the egress proxy's (crates/net plan.rs) needs.
/// `nft --check` would not do: the kernel validates chain types only at commit.
const REDIRECT_CHECK: &str = "table inet zygote_doctor_check {\n\
    chain redirect_check { type nat hook prerouting priority -100; \
    tcp dport 1 redirect to :2; }\n}\n";

/// `nft -f -` loaded `ruleset` in a network namespace of its own, which dies with it.
fn nft_accepts(nft: &str, ruleset: &str) -> bool {
    use std::io::Write;
    let Ok(mut child) = Command::new("unshare")
        .args(["--net", nft, "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        return false;
    };
    let wrote = child
        .stdin
        .take()
        .is_some_and(|mut stdin| stdin.write_all(ruleset.as_bytes()).is_ok());
    child.wait().is_ok_and(|s| s.success()) && wrote
}

/// A program found like `find_program`, and the first line its first version
/// option (of `version_args`) that succeeds prints.
fn tool(name: &str, version_args: &[&[&str]]) -> ToolFacts {
    let path = find_program(name);
    let version = path.as_ref().and_then(|path| {
        version_args.iter().find_map(|args| {
            let out = Command::new(path).args(*args).output().ok()?;
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text.lines().next()?.trim();
            (out.status.success() && !line.is_empty()).then(|| line.to_owned())
        })
    });
    ToolFacts {
        path: path.map(|p| p.display().to_string()),
        version,
    }
}

fn gather_kvm() -> KvmFacts {
    let meta = fs::metadata("/dev/kvm").ok();
    let mut facts = KvmFacts {
        present: meta.is_some(),
        device: meta.map(|m| DeviceNode {
            mode: format!("{:04o}", m.mode() & 0o7777),
            uid: m.uid(),
            gid: m.gid(),
            group: fs::read_to_string("/etc/group")
                .ok()
                .and_then(|g| parse::group_name(&g, m.gid())),
        }),
        modules: KVM_MODULES
            .iter()
            .filter(|m| Path::new("/sys/module").join(m).exists())
            .map(|m| m.to_string())
            .collect(),
        ..KvmFacts::default()
    };
    if !facts.present {
        return facts;
    }
    match kvm_ioctls::Kvm::new() {
        Ok(kvm) => {
            facts.accessible = true;
            facts.api_version = Some(kvm.get_api_version());
            facts.caps = Some(kvm_caps(&kvm));
        }
        Err(err) => {
            facts.open_error = Some(err.to_string());
            facts.open_errno = Some(err.errno());
        }
    }
    facts
}

fn kvm_caps(kvm: &kvm_ioctls::Kvm) -> KvmCaps {
    use kvm_ioctls::Cap;
    // These two have no `Cap` variant in kvm-ioctls 0.25, so ask by number.
    let raw = |cap: u32| kvm.check_extension_raw(libc::c_ulong::from(cap));
    KvmCaps {
        irqchip: kvm.check_extension(Cap::Irqchip),
        pit2: kvm.check_extension(Cap::Pit2),
        user_memory: kvm.check_extension(Cap::UserMemory),
        ioeventfd: kvm.check_extension(Cap::Ioeventfd),
        irqfd: kvm.check_extension(Cap::Irqfd),
        immediate_exit: kvm.check_extension(Cap::ImmediateExit),
        xsave: kvm.check_extension(Cap::Xsave),
        xsave2_size: kvm.check_extension_int(Cap::Xsave2).max(0),
        manual_dirty_log_protect2: raw(kvm_bindings::KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2).max(0),
        dirty_log_ring: kvm.check_extension_int(Cap::DirtyLogRing).max(0),
        tsc_control: kvm.check_extension(Cap::TscControl),
        nr_vcpus: kvm.check_extension_int(Cap::NrVcpus).max(0),
        max_vcpus: kvm.check_extension_int(Cap::MaxVcpus).max(0),
        msr_index_count: kvm.get_msr_index_list().ok().map(|l| l.as_slice().len()),
        supported_cpuid_entries: kvm
            .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
            .ok()
            .map(|c| c.as_slice().len()),
    }
}

fn gather_host() -> HostFacts {
    let (kernel_release, kernel_version, machine) = uname();
    let meminfo = fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = parse::cpu_flags(&cpuinfo);
    // SAFETY: sysconf has no memory-safety preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    HostFacts {
        kernel_release,
        kernel_version,
        machine,
        cores: usize::try_from(online).unwrap_or(0),
        mem_total_kib: parse::meminfo_kib(&meminfo, "MemTotal"),
        mem_available_kib: parse::meminfo_kib(&meminfo, "MemAvailable"),
        // SAFETY: geteuid cannot fail and has no preconditions.
        root: unsafe { libc::geteuid() } == 0,
        cpu: CpuFacts {
            vmx: flags.contains(&"vmx"),
            svm: flags.contains(&"svm"),
            hypervisor: flags.contains(&"hypervisor"),
            model: parse::cpu_model(&cpuinfo).unwrap_or_default().to_string(),
        },
    }
}

fn uname() -> (String, String, String) {
    // SAFETY: utsname is plain bytes; zeroed is a valid value and uname fills it.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `uts` is a valid, writable utsname.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return Default::default();
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    (
        field(&uts.release),
        field(&uts.version),
        field(&uts.machine),
    )
}

fn gather_uffd() -> UffdFacts {
    // Plain flags, deliberately without UFFD_USER_MODE_ONLY: KVM touches guest
    // memory from kernel mode (copy_from_user on behalf of the guest), and a
    // user-mode-only descriptor would not see those faults, so the answer we
    // need is whether a full userfaultfd is allowed.
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    // SAFETY: userfaultfd takes an int of flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    let (syscall, error, errno) = if fd >= 0 {
        // SAFETY: `fd` was just returned to us and is closed exactly once.
        unsafe { libc::close(fd as libc::c_int) };
        (true, None, None)
    } else {
        let err = std::io::Error::last_os_error();
        (false, Some(err.to_string()), err.raw_os_error())
    };
    UffdFacts {
        syscall,
        error,
        errno,
        unprivileged: fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd")
            .ok()
            .map(|s| s.trim() == "1"),
        dev_userfaultfd: Path::new("/dev/userfaultfd").exists(),
    }
}

fn gather_ksm() -> KsmFacts {
    let run = "/sys/kernel/mm/ksm/run";
    KsmFacts {
        present: Path::new(run).exists(),
        writable: access(run, libc::W_OK),
        run: fs::read_to_string(run)
            .ok()
            .and_then(|s| s.trim().parse().ok()),
    }
}

fn gather_cgroup() -> CgroupFacts {
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let all = parse::cgroup2_mounts(&mounts);
    // Prefer the canonical location when several cgroup2 mounts exist.
    let Some(mount) = all
        .iter()
        .find(|m| m.mount_point == "/sys/fs/cgroup")
        .or_else(|| all.first())
    else {
        return CgroupFacts::default();
    };
    let root = PathBuf::from(&mount.mount_point);
    let own_path = fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| parse::cgroup2_path(&t));
    let own_dir = root.join(own_path.as_deref().unwrap_or("/").trim_start_matches('/'));
    CgroupFacts {
        mounted: true,
        unified: mount.mount_point == "/sys/fs/cgroup",
        controllers: fs::read_to_string(root.join("cgroup.controllers"))
            .map(|s| s.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default(),
        writable: !mount.read_only && access(&own_dir, libc::W_OK),
        mount_point: Some(mount.mount_point.clone()),
        own_path,
    }
}

/// The cache directory zygote uses: $ZYGOTE_CACHE_DIR, else ~/.cache/zygote.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("ZYGOTE_CACHE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/".into());
    PathBuf::from(home).join(".cache/zygote")
}

fn gather_reflink() -> ReflinkFacts {
    let known = parse::filesystems(&fs::read_to_string("/proc/filesystems").unwrap_or_default());
    let cache = cache_dir();
    // The cache may not exist yet; the filesystem it will land on is that of
    // its nearest existing ancestor.
    let probed = cache
        .ancestors()
        .find(|p| p.exists())
        .map(Path::to_path_buf);
    let magic = probed.as_deref().and_then(statfs_magic);
    ReflinkFacts {
        kernel_xfs: known.iter().any(|f| f == "xfs"),
        kernel_btrfs: known.iter().any(|f| f == "btrfs"),
        mkfs_xfs: find_program("mkfs.xfs").is_some(),
        cache_dir: cache.display().to_string(),
        probed_dir: probed.map(|p| p.display().to_string()),
        cache_fs: magic.map(|m| parse::fs_name(m).to_owned()),
        cache_fs_magic: magic,
        cache_reflink: magic.is_some_and(parse::fs_reflink),
    }
}

fn statfs_magic(path: &Path) -> Option<u64> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statfs is plain data; zeroed is valid and statfs fills it.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` is writable.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    // f_type is a signed word; magics are 32-bit, so keep the low 32 bits.
    Some(st.f_type as u64 & 0xFFFF_FFFF)
}

fn gather_qemu() -> QemuFacts {
    let system = find_program("qemu-system-x86_64");
    let version = system.as_ref().and_then(|path| {
        let out = Command::new(path).arg("--version").output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().next()?.trim();
        (out.status.success() && !line.is_empty()).then(|| line.to_owned())
    });
    QemuFacts {
        system: system.map(|p| p.display().to_string()),
        version,
        img: find_program("qemu-img").map(|p| p.display().to_string()),
    }
}

/// Look a program up in $PATH, then in the sbin directories an unprivileged
/// user's PATH often lacks (mkfs.xfs lives in /usr/sbin).
fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| access(p, libc::X_OK) && p.is_file())
}

fn device(path: &str) -> DeviceFacts {
    DeviceFacts {
        path: path.to_owned(),
        present: Path::new(path).exists(),
        accessible: access(path, libc::R_OK | libc::W_OK),
    }
}

/// access(2): answers for our real uid, which is what the user will run as.
fn access(path: impl AsRef<Path>, mode: libc::c_int) -> bool {
    let Ok(c) = CString::new(path.as_ref().as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path.
    unsafe { libc::access(c.as_ptr(), mode) == 0 }
}

fn read_bracketed(path: &str) -> Option<String> {
    parse::bracketed(&fs::read_to_string(path).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check can fail: the kernel (through nft) refuses what it cannot load, and
    /// nothing checked is left behind.
    #[test]
    fn nft_check_refuses_what_the_kernel_cannot_load_and_loads_nothing() {
        let nft = tool("nft", &[&["-V"]]);
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let (Some(path), true) = (nft.path, root) else {
            eprintln!("skipped: needs root and nft");
            return;
        };
        assert!(
            nft_accepts(&path, REDIRECT_CHECK),
            "this host runs the egress proxy"
        );
        // Parses, but the kernel allows `redirect` only in nat chains.
        let filter_chain = REDIRECT_CHECK.replace(
            "type nat hook prerouting priority -100",
            "type filter hook input priority 0",
        );
        assert_ne!(filter_chain, REDIRECT_CHECK);
        assert!(!nft_accepts(&path, &filter_chain));
        let tables = Command::new(&path)
            .args(["list", "tables"])
            .output()
            .unwrap();
        let tables = String::from_utf8_lossy(&tables.stdout);
        assert!(!tables.contains("zygote_doctor_check"), "{tables}");
    }
}
