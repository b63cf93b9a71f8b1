//! Findings about the host and its optional kernel features (everything but
//! KVM and the runtime summary, which live in `classify`). Pure functions of
//! the gathered facts, like the rest of classification.
use super::classify::{Out, Status};
use super::facts::{DeviceFacts, Facts, ToolFacts, SANDBOX_NETS};
use super::parse;

fn gib(kib: u64) -> String {
    format!("{:.1} GiB", kib as f64 / (1024.0 * 1024.0))
}

pub(super) fn host_findings(facts: &Facts, out: &mut Out) {
    let h = &facts.host;
    out.add(
        "host.kernel",
        Status::Ok,
        format!("Linux {} {}", h.kernel_release, h.machine),
    );
    let virt = match (h.cpu.vmx, h.cpu.svm) {
        (true, _) => "vmx",
        (_, true) => "svm",
        _ => "no vmx/svm",
    };
    let guest = if h.cpu.hypervisor {
        ", running under a hypervisor"
    } else {
        ""
    };
    out.add(
        "host.cpu",
        Status::Ok,
        format!("{} online cores; CPU flags: {virt}{guest}", h.cores),
    );
    match (h.mem_total_kib, h.mem_available_kib) {
        (Some(total), Some(avail)) => out.ok_or_warn(
            "host.memory",
            avail >= 1024 * 1024,
            format!("{} total, {} available", gib(total), gib(avail)),
            format!(
                "{} total, only {} available: guests may fail to start",
                gib(total),
                gib(avail)
            ),
        ),
        _ => out.add("host.memory", Status::Warn, "cannot read /proc/meminfo"),
    }
}

pub(super) fn feature_findings(facts: &Facts, out: &mut Out) {
    let f = &facts.features;
    let thp_path = "/sys/kernel/mm/transparent_hugepage/enabled";
    match (f.thp.enabled.as_deref(), f.thp.defrag.as_deref()) {
        (None, _) => out.add(
            "memory.thp",
            Status::Warn,
            "no transparent huge pages: guest memory uses 4 KiB pages, so branching a VM \
             (fork) copies far more page tables",
        ),
        (Some(mode @ ("always" | "madvise")), defrag) => {
            let defrag = defrag.unwrap_or("?");
            out.ok_or_warn(
                "memory.thp",
                defrag != "never",
                format!(
                    "enabled={mode}, defrag={defrag}: zygote's MADV_HUGEPAGE guest memory gets \
                     2 MiB pages, so branching a VM is cheap"
                ),
                format!(
                    "enabled={mode}, defrag=never: huge pages only when free 2 MiB blocks are at \
                     hand; set defrag to madvise for reliably cheap branching"
                ),
            )
        }
        (Some(mode), _) => out.add(
            "memory.thp",
            Status::Warn,
            format!(
                "enabled={mode}: zygote's madvise(MADV_HUGEPAGE) is ignored, guest memory uses \
                 4 KiB pages and branching a VM gets much slower; fix: \
                 echo madvise > {thp_path}"
            ),
        ),
    }

    let u = &f.userfaultfd;
    let sysctl = match u.unprivileged {
        Some(true) => "vm.unprivileged_userfaultfd=1",
        Some(false) => "vm.unprivileged_userfaultfd=0",
        None => "no vm.unprivileged_userfaultfd sysctl",
    };
    if u.syscall {
        // Root passes regardless of the sysctl; say whether others would too.
        let who = match (facts.host.root, u.unprivileged) {
            (true, Some(false)) => format!("usable as root ({sysctl}: other users are refused)"),
            _ => format!("usable ({sysctl})"),
        };
        out.add(
            "memory.userfaultfd",
            Status::Ok,
            format!("userfaultfd(2) {who}: guest memory can be restored on demand"),
        );
    } else if u.errno == Some(libc::ENOSYS) {
        out.add(
            "memory.userfaultfd",
            Status::Warn,
            "kernel built without userfaultfd: on-demand memory restore is unavailable",
        );
    } else {
        out.add(
            "memory.userfaultfd",
            Status::Warn,
            format!(
                "userfaultfd(2) failed: {} ({sysctl}): run as root or set \
                 vm.unprivileged_userfaultfd=1 for on-demand memory restore",
                u.error.as_deref().unwrap_or("unknown error")
            ),
        );
    }

    let k = &f.ksm;
    let run = match k.run {
        Some(0) => "run=0, ksmd stopped",
        Some(1) => "run=1, ksmd merging",
        Some(2) => "run=2, unmerging",
        _ => "run=?",
    };
    if !k.present {
        out.add(
            "memory.ksm",
            Status::Warn,
            "kernel built without KSM: identical pages across sandboxes are not merged",
        );
    } else {
        out.ok_or_warn(
            "memory.ksm",
            k.writable || k.run == Some(1),
            format!("available ({run}): identical guest pages can be merged across sandboxes"),
            format!("present ({run}) but only root can start it: /sys/kernel/mm/ksm/run"),
        );
    }

    cgroup_finding(facts, out);
    reflink_finding(facts, out);
    let devices = [
        (
            "storage.loop",
            &f.loop_control,
            "loop devices (mounting image files)",
            "modprobe loop",
            "image files cannot be mounted",
        ),
        (
            "devices.tun",
            &f.tun,
            "TAP networking for guests",
            "modprobe tun",
            "QEMU user networking still works",
        ),
        (
            "devices.vhost_net",
            &f.vhost_net,
            "in-kernel virtio-net backend",
            "modprobe vhost_net",
            "network I/O is served from userspace instead",
        ),
        (
            "devices.vhost_vsock",
            &f.vhost_vsock,
            "vsock for QEMU guests",
            "modprobe vhost_vsock",
            "the qemu runtime reaches the guest agent over virtio-net instead",
        ),
    ];
    for (check, dev, purpose, load, fallback) in devices {
        device_finding(check, dev, purpose, load, fallback, out);
    }
    qemu_findings(facts, out);
}

/// `purpose` names what the device gives, `load` how to get it, `fallback`
/// what happens without it.
fn device_finding(
    check: &str,
    d: &DeviceFacts,
    purpose: &str,
    load: &str,
    fallback: &str,
    out: &mut Out,
) {
    let (status, detail) = match (d.present, d.accessible) {
        (true, true) => (Status::Ok, format!("{}: {purpose} available", d.path)),
        (true, false) => (
            Status::Warn,
            format!(
                "{} is not read-write for this user: run as root for {purpose}",
                d.path
            ),
        ),
        (false, _) => (
            Status::Warn,
            format!("no {}, so no {purpose} (`{load}`): {fallback}", d.path),
        ),
    };
    out.add(check, status, detail);
}

fn cgroup_finding(facts: &Facts, out: &mut Out) {
    let c = &facts.features.cgroup_v2;
    let check = "isolation.cgroup_v2";
    let Some(mount) = c.mount_point.as_deref().filter(|_| c.mounted) else {
        out.add(
            check,
            Status::Warn,
            "no cgroup2 hierarchy mounted: per-sandbox CPU/memory limits unavailable",
        );
        return;
    };
    let controllers = if c.controllers.is_empty() {
        "none".to_owned()
    } else {
        c.controllers.join(" ")
    };
    let kind = if c.unified {
        ""
    } else {
        " (hybrid with cgroup v1)"
    };
    let has = |name: &str| c.controllers.iter().any(|x| x == name);
    let head = format!("cgroup2 at {mount}{kind}, controllers: {controllers}");
    let own = c.own_path.as_deref().unwrap_or("/");
    if !(has("cpu") && has("memory")) {
        out.add(
            check,
            Status::Warn,
            format!(
                "{head}; no cpu/memory controller in v2, so per-sandbox limits are unavailable"
            ),
        );
    } else if !c.writable {
        out.add(
            check,
            Status::Warn,
            format!(
                "{head}; our cgroup {own} is not writable, so child cgroups need root or a \
                 delegated subtree"
            ),
        );
    } else {
        out.add(
            check,
            Status::Ok,
            format!("{head}; child cgroups can be created under {own}"),
        );
    }
}

fn reflink_finding(facts: &Facts, out: &mut Out) {
    let r = &facts.features.reflink;
    let fs = r.cache_fs.as_deref().unwrap_or("an unknown filesystem");
    let on = match r.probed_dir.as_deref() {
        Some(p) if p != r.cache_dir => format!("{} (not created yet; {p} is on {fs})", r.cache_dir),
        _ => format!("{} is on {fs}", r.cache_dir),
    };
    if r.cache_reflink {
        let note = if fs == "xfs" {
            " (XFS formatted with reflink=1, mkfs.xfs's default)"
        } else {
            ""
        };
        out.add(
            "storage.reflink",
            Status::Ok,
            format!("cache {on}: image clones are instant reflinks{note}"),
        );
        return;
    }
    let mut kernel: Vec<&str> = Vec::new();
    if r.kernel_xfs {
        kernel.push("xfs");
    }
    if r.kernel_btrfs {
        kernel.push("btrfs");
    }
    let options = match (kernel.is_empty(), r.mkfs_xfs) {
        (true, _) => "the kernel lists neither xfs nor btrfs".to_owned(),
        (false, true) => format!(
            "kernel supports {}, mkfs.xfs present: a loop-mounted XFS image works",
            kernel.join(", ")
        ),
        (false, false) => format!("kernel supports {}", kernel.join(", ")),
    };
    out.add(
        "storage.reflink",
        Status::Warn,
        format!(
            "cache {on}, no reflink: image clones are full copies; put ZYGOTE_CACHE_DIR on XFS \
             or btrfs ({options})"
        ),
    );
}

fn qemu_findings(facts: &Facts, out: &mut Out) {
    let q = &facts.features.qemu;
    match (&q.system, &q.version) {
        (Some(path), Some(version)) => {
            out.add("qemu.system", Status::Ok, format!("{version} ({path})"))
        }
        (Some(path), None) => out.add(
            "qemu.system",
            Status::Warn,
            format!("{path} found but `--version` failed"),
        ),
        (None, _) => out.add(
            "qemu.system",
            Status::Warn,
            "qemu-system-x86_64 not found: install qemu-system-x86 for the qemu runtime",
        ),
    }
    match &q.img {
        Some(path) => out.add("qemu.img", Status::Ok, format!("qemu-img at {path}")),
        None => out.add(
            "qemu.img",
            Status::Warn,
            "qemu-img not found (Debian package qemu-utils): disk images cannot be converted",
        ),
    }
}

/// The sandbox ranges, "10.213.0.0/16 and 10.214.0.0/16".
fn sandbox_ranges() -> String {
    let nets: Vec<String> = SANDBOX_NETS
        .iter()
        .map(|(net, len)| format!("{net}/{len}"))
        .collect();
    nets.join(" and ")
}

const INSTALL_NET_TOOLS: &str =
    "install iproute2 and nftables (scripts/setup.sh, or `apt-get install iproute2 nftables`)";

/// What keeps `zygote serve` from isolating sandboxes here, as (what, fix), in the
/// order the daemon checks; empty when it takes the isolated backend.
pub(super) fn isolation_blockers(facts: &Facts) -> Vec<(String, &'static str)> {
    let n = &facts.network;
    let mut missing = Vec::new();
    if !facts.host.root {
        missing.push((
            "not root (network namespaces and nftables need it)".to_owned(),
            "run `zygote serve` as root",
        ));
    }
    if n.ip.path.is_none() {
        missing.push(("no `ip` (iproute2)".to_owned(), INSTALL_NET_TOOLS));
    }
    if n.nft.path.is_none() {
        missing.push(("no `nft` (nftables)".to_owned(), INSTALL_NET_TOOLS));
    }
    if !facts.features.tun.present {
        missing.push(("no /dev/net/tun".to_owned(), "`modprobe tun`"));
    }
    if n.route_clashes.as_ref().is_some_and(|c| !c.is_empty()) {
        missing.push((
            format!(
                "a host route overlaps {} (see network.routes)",
                sandbox_ranges()
            ),
            "move that route off the sandbox ranges",
        ));
    }
    missing
}

fn tool_version(name: &str, t: &ToolFacts) -> String {
    let v = t.version.as_deref().and_then(parse::version_word);
    format!("{name} {}", v.unwrap_or("(version unknown)"))
}

pub(super) fn network_findings(facts: &Facts, out: &mut Out) {
    let n = &facts.network;
    let blockers = isolation_blockers(facts);
    let isolated = blockers.is_empty();
    if isolated {
        out.add(
            "network.isolation",
            Status::Ok,
            format!(
                "isolated: sandboxes get a network namespace each, nftables policy, no way to \
                 the host ({}, {})",
                tool_version("ip", &n.ip),
                tool_version("nft", &n.nft)
            ),
        );
    } else {
        let what: Vec<&str> = blockers.iter().map(|(w, _)| w.as_str()).collect();
        let mut fixes: Vec<&str> = Vec::new();
        for (_, fix) in &blockers {
            if !fixes.contains(fix) {
                fixes.push(fix);
            }
        }
        out.add(
            "network.isolation",
            Status::Warn,
            format!(
                "{}: `zygote serve` falls back to QEMU user networking, NOT isolated from this \
                 host (a guest can reach its loopback services; kvm-runtime guests get no NIC); \
                 fix: {}",
                what.join(", "),
                fixes.join("; ")
            ),
        );
    }

    match &n.route_clashes {
        Some(clashes) if !clashes.is_empty() => {
            let more = match clashes.len() {
                1 => String::new(),
                k => format!(" (and {} more)", k - 1),
            };
            out.add(
                "network.routes",
                Status::Warn,
                format!(
                    "this host routes `{}`{more}, overlapping the sandbox ranges {}: the daemon \
                     will not isolate sandboxes while it does",
                    clashes[0],
                    sandbox_ranges()
                ),
            );
        }
        Some(_) => out.add(
            "network.routes",
            Status::Ok,
            format!(
                "no host route overlaps the sandbox ranges {}",
                sandbox_ranges()
            ),
        ),
        None if n.ip.path.is_some() => out.add(
            "network.routes",
            Status::Warn,
            format!(
                "`ip -4 route show table all` failed: overlaps with {} unchecked",
                sandbox_ranges()
            ),
        ),
        // No `ip`: network.isolation says so.
        None => {}
    }

    match (n.ip_forward, isolated) {
        (Some(1), _) => out.add(
            "network.forwarding",
            Status::Ok,
            "net.ipv4.ip_forward=1: sandboxes' traffic is routed out",
        ),
        (Some(v), true) => out.add(
            "network.forwarding",
            Status::Ok,
            format!(
                "net.ipv4.ip_forward={v}: the daemon will enable net.ipv4.ip_forward at start \
                 (this host then routes IPv4 between its interfaces)"
            ),
        ),
        (Some(v), false) => out.add(
            "network.forwarding",
            Status::Ok,
            format!(
                "net.ipv4.ip_forward={v}: only isolated networking needs it (the daemon \
                     enables it then)"
            ),
        ),
        (None, _) => out.add(
            "network.forwarding",
            Status::Warn,
            "cannot read /proc/sys/net/ipv4/ip_forward: the daemon cannot enable forwarding, \
             so isolated networking fails at start",
        ),
    }

    match &n.dns {
        Some(dns) => out.add(
            "network.dns",
            Status::Ok,
            format!(
                "isolated guests' DNS goes to {dns} (first non-loopback nameserver in \
                 /etc/resolv.conf; `zygote serve --dns IP` overrides)"
            ),
        ),
        None => {
            let loopback = n.nameservers.iter().all(|a| {
                a.parse::<std::net::IpAddr>()
                    .is_ok_and(|a| a.is_loopback() || a.is_unspecified())
            });
            let listed = if n.nameservers.is_empty() {
                "no nameserver in /etc/resolv.conf".to_owned()
            } else if loopback {
                format!(
                    "only loopback resolvers in /etc/resolv.conf ({}), which a sandbox's \
                     namespace cannot reach",
                    n.nameservers.join(", ")
                )
            } else {
                format!(
                    "no non-loopback IPv4 nameserver in /etc/resolv.conf ({})",
                    n.nameservers.join(", ")
                )
            };
            // QEMU user networking resolves through the host, loopback included.
            let (status, consequence) = if isolated {
                (
                    Status::Warn,
                    "guests get no DNS unless `zygote serve --dns IP`",
                )
            } else {
                (
                    Status::Ok,
                    "fine for QEMU user networking; isolated guests would need \
                     `zygote serve --dns IP`",
                )
            };
            out.add("network.dns", status, format!("{listed}: {consequence}"));
        }
    }

    let ns = match n.namespaces {
        1 => "1 zygote namespace".to_owned(),
        k => format!("{k} zygote namespaces"),
    };
    match n.host_table {
        Some(true) => out.add(
            "network.rules",
            Status::Ok,
            format!("host table inet zygote loaded; {ns} in /run/netns"),
        ),
        Some(false) if n.namespaces > 0 => out.add(
            "network.rules",
            Status::Warn,
            format!(
                "{ns} in /run/netns but no host table inet zygote: their guests are not kept \
                 from this host or each other; restart `zygote serve` to load it"
            ),
        ),
        Some(false) => out.add(
            "network.rules",
            Status::Ok,
            "no host table inet zygote yet: `zygote serve` loads it at start",
        ),
        None if n.namespaces > 0 => out.add(
            "network.rules",
            Status::Ok,
            format!("{ns} in /run/netns (run as root to check the host's table inet zygote)"),
        ),
        None => {}
    }

    match n.egress_redirect {
        Some(true) => out.add(
            "network.egress_redirect",
            Status::Ok,
            "the kernel accepts nftables redirect rules (the egress proxy's)",
        ),
        Some(false) => out.add(
            "network.egress_redirect",
            Status::Warn,
            "the kernel refused an nftables `redirect` rule (CONFIG_NFT_REDIR, module \
             nft_redir): sandboxes whose egress rules name hosts or whose secrets are bound \
             to hosts will fail to start; address-only (CIDR) rules still work",
        ),
        None => {}
    }
}
