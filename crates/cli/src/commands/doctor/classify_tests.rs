//! Verdicts for constructed hosts.
use super::*;
use crate::commands::doctor::facts::{DeviceFacts, DeviceNode, NetworkFacts, QemuFacts, ToolFacts};

fn full_caps() -> KvmCaps {
    KvmCaps {
        irqchip: true,
        pit2: true,
        user_memory: true,
        ioeventfd: true,
        irqfd: true,
        immediate_exit: true,
        xsave: true,
        xsave2_size: 4096,
        manual_dirty_log_protect2: 3,
        dirty_log_ring: 65536,
        tsc_control: true,
        nr_vcpus: 8,
        max_vcpus: 1024,
        msr_index_count: Some(80),
        supported_cpuid_entries: Some(60),
    }
}

fn kvm_host(modules: &[&str]) -> Facts {
    Facts {
        kvm: KvmFacts {
            present: true,
            accessible: true,
            api_version: Some(12),
            modules: modules.iter().map(|m| m.to_string()).collect(),
            caps: Some(full_caps()),
            ..KvmFacts::default()
        },
        ..Facts::default()
    }
}

/// A host like the CI machine: kvm_pvm, no VMX/SVM flags, minimal caps.
fn pvm_host() -> Facts {
    let mut f = kvm_host(&["kvm", "kvm_pvm"]);
    f.host.cpu.hypervisor = true;
    let caps = f.kvm.caps.as_mut().unwrap();
    caps.tsc_control = false;
    f
}

fn vmx_host() -> Facts {
    let mut f = kvm_host(&["kvm", "kvm_intel"]);
    f.host.cpu.vmx = true;
    f
}

fn with_qemu(mut f: Facts) -> Facts {
    f.features.qemu = QemuFacts {
        system: Some("/usr/bin/qemu-system-x86_64".into()),
        version: Some("QEMU emulator version 7.2.22".into()),
        img: None,
    };
    f
}

fn finding<'a>(r: &'a Report, check: &str) -> &'a Finding {
    r.findings
        .iter()
        .find(|f| f.check == check)
        .unwrap_or_else(|| panic!("no finding {check}"))
}

#[test]
fn pvm_host_runs_probes_not_linux() {
    let r = classify(&pvm_host());
    assert_eq!(r.flavor, Flavor::Pvm);
    assert!(!r.runtimes.kvm);
    assert!(r.runtimes.probe);
    assert!(!r.runtimes.qemu);
    assert_eq!(r.runtimes.default_runtime, None);
    assert_eq!(r.exit_code(), 0);
    let flavor = finding(&r, "kvm.flavor");
    assert_eq!(flavor.status, Status::Warn);
    assert!(flavor
        .detail
        .contains("Linux guests need hardware virtualization"));
    assert_eq!(finding(&r, "runtime.kvm").status, Status::Fail);
    assert_eq!(finding(&r, "runtime.default").status, Status::Warn);
    assert_eq!(finding(&r, "kvm.tsc_control").status, Status::Warn);
}

#[test]
fn pvm_host_with_qemu_defaults_to_tcg() {
    let r = classify(&with_qemu(pvm_host()));
    assert!(r.runtimes.qemu);
    assert_eq!(r.runtimes.qemu_accel, Some("tcg"));
    assert_eq!(r.runtimes.default_runtime, Some("qemu"));
}

#[test]
fn pvm_module_wins_over_cpu_flags() {
    // KVM serves one vendor module at a time: kvm_pvm on a VMX-capable CPU
    // still cannot run Linux guests through /dev/kvm.
    let mut f = pvm_host();
    f.host.cpu.vmx = true;
    assert_eq!(classify(&f).flavor, Flavor::Pvm);
    assert!(!classify(&f).runtimes.kvm);
}

#[test]
fn vmx_host_runs_linux_under_kvm() {
    let r = classify(&with_qemu(vmx_host()));
    assert_eq!(r.flavor, Flavor::Vmx);
    assert!(r.runtimes.kvm && r.runtimes.probe && r.runtimes.qemu);
    assert_eq!(r.runtimes.qemu_accel, Some("kvm"));
    assert_eq!(r.runtimes.default_runtime, Some("kvm"));
    assert_eq!(r.exit_code(), 0);
    assert!(r
        .findings
        .iter()
        .filter(|f| f.check.starts_with("kvm."))
        .all(|f| f.status == Status::Ok));
}

#[test]
fn svm_by_module_and_builtin_vmx_by_flag() {
    assert_eq!(classify(&kvm_host(&["kvm", "kvm_amd"])).flavor, Flavor::Svm);
    // KVM built into the kernel: no vendor module directory, fall back to flags.
    let mut f = kvm_host(&[]);
    f.host.cpu.vmx = true;
    assert_eq!(classify(&f).flavor, Flavor::Vmx);
    let r = classify(&kvm_host(&["kvm"]));
    assert_eq!(r.flavor, Flavor::Unknown);
    assert!(r.runtimes.probe && !r.runtimes.kvm);
}

#[test]
fn hardware_host_missing_caps_has_no_kvm_runtime() {
    let mut f = vmx_host();
    f.kvm.caps.as_mut().unwrap().irqfd = false;
    let r = classify(&f);
    assert!(!r.runtimes.kvm);
    assert!(r.runtimes.probe);
    let caps = finding(&r, "kvm.caps");
    assert_eq!(caps.status, Status::Fail);
    assert!(caps.detail.contains("irqfd"));
}

#[test]
fn no_kvm_with_qemu_runs_qemu_only() {
    let r = classify(&with_qemu(Facts::default()));
    assert_eq!(r.flavor, Flavor::None);
    assert!(!r.runtimes.kvm && !r.runtimes.probe);
    assert!(r.runtimes.qemu);
    assert_eq!(r.runtimes.default_runtime, Some("qemu"));
    assert_eq!(r.exit_code(), 0);
    assert_eq!(finding(&r, "kvm.device").status, Status::Fail);
}

#[test]
fn nothing_usable_exits_1() {
    let r = classify(&Facts::default());
    assert_eq!(r.exit_code(), 1);
    assert_eq!(r.runtimes.default_runtime, None);
    assert_eq!(finding(&r, "runtime.default").status, Status::Fail);
    // QEMU installed but broken counts as no QEMU.
    let mut f = Facts::default();
    f.features.qemu.system = Some("/usr/bin/qemu-system-x86_64".into());
    assert_eq!(classify(&f).exit_code(), 1);
}

#[test]
fn permission_denied_says_how_to_fix() {
    let mut f = vmx_host();
    f.kvm.accessible = false;
    f.kvm.api_version = None;
    f.kvm.caps = None;
    f.kvm.open_errno = Some(libc::EACCES);
    f.kvm.open_error = Some("Permission denied (os error 13)".into());
    f.kvm.device = Some(DeviceNode {
        mode: "0660".into(),
        uid: 0,
        gid: 993,
        group: Some("kvm".into()),
    });
    let r = classify(&f);
    let access = finding(&r, "kvm.access");
    assert_eq!(access.status, Status::Fail);
    assert!(
        access.detail.contains("usermod -aG kvm"),
        "{}",
        access.detail
    );
    assert!(!r.runtimes.probe && !r.runtimes.kvm);
    assert_eq!(r.exit_code(), 1);

    f.kvm.device.as_mut().unwrap().group = Some("root".into());
    let detail = classify(&f)
        .findings
        .into_iter()
        .find(|x| x.check == "kvm.access");
    assert!(detail.unwrap().detail.contains("run as root"));
}

#[test]
fn absent_kvm_hints_at_the_cause() {
    let mut f = Facts::default();
    f.host.cpu.vmx = true;
    assert!(finding(&classify(&f), "kvm.device")
        .detail
        .contains("kvm_intel"));
    f.host.cpu.vmx = false;
    f.host.cpu.hypervisor = true;
    assert!(finding(&classify(&f), "kvm.device")
        .detail
        .contains("nested"));
}

#[test]
fn thp_modes() {
    let mut f = pvm_host();
    let thp = |f: &Facts| finding(&classify(f), "memory.thp").clone();
    f.features.thp.enabled = Some("madvise".into());
    f.features.thp.defrag = Some("madvise".into());
    assert_eq!(thp(&f).status, Status::Ok);
    f.features.thp.enabled = Some("always".into());
    assert_eq!(thp(&f).status, Status::Ok);
    f.features.thp.enabled = Some("never".into());
    let never = thp(&f);
    assert_eq!(never.status, Status::Warn);
    assert!(never.detail.contains("echo madvise"));
    f.features.thp.enabled = None;
    assert_eq!(thp(&f).status, Status::Warn);
}

#[test]
fn hybrid_cgroup_without_controllers_warns() {
    let mut f = pvm_host();
    let c = &mut f.features.cgroup_v2;
    c.mounted = true;
    c.mount_point = Some("/sys/fs/cgroup/unified".into());
    c.controllers = vec!["hugetlb".into()];
    c.writable = true;
    let r = classify(&f);
    let cg = finding(&r, "isolation.cgroup_v2");
    assert_eq!(cg.status, Status::Warn);
    assert!(cg.detail.contains("hybrid"));

    let c = &mut f.features.cgroup_v2;
    c.unified = true;
    c.mount_point = Some("/sys/fs/cgroup".into());
    c.controllers = vec!["cpu".into(), "memory".into(), "io".into()];
    assert_eq!(
        finding(&classify(&f), "isolation.cgroup_v2").status,
        Status::Ok
    );
}

#[test]
fn reflink_follows_cache_filesystem() {
    let mut f = pvm_host();
    let r = &mut f.features.reflink;
    r.cache_dir = "/home/u/.cache/zygote".into();
    r.probed_dir = Some("/home/u".into());
    r.cache_fs = Some("ext2/3/4".into());
    r.kernel_xfs = true;
    r.mkfs_xfs = true;
    let w = finding(&classify(&f), "storage.reflink").clone();
    assert_eq!(w.status, Status::Warn);
    assert!(w.detail.contains("loop-mounted XFS"), "{}", w.detail);
    f.features.reflink.cache_reflink = true;
    f.features.reflink.cache_fs = Some("btrfs".into());
    assert_eq!(finding(&classify(&f), "storage.reflink").status, Status::Ok);
}

#[test]
fn json_enums_are_lowercase() {
    assert_eq!(serde_json::to_string(&Flavor::Pvm).unwrap(), "\"pvm\"");
    assert_eq!(serde_json::to_string(&Status::Warn).unwrap(), "\"warn\"");
}

#[test]
fn nested_hosts_say_whether_virtualization_is_emulated() {
    let mut f = Facts::default();
    f.kvm.present = true;
    f.kvm.modules = vec!["kvm_amd".into()];
    f.host.cpu.svm = true;
    // Bare metal: no nested finding at all.
    assert!(classify(&f)
        .findings
        .iter()
        .all(|x| x.check != "kvm.nested"));
    // A cloud VM with SVM passed through.
    f.host.cpu.hypervisor = true;
    f.host.cpu.model = "AMD EPYC 7B13".into();
    let n = finding(&classify(&f), "kvm.nested").clone();
    assert_eq!(n.status, Status::Ok);
    assert!(
        n.detail.contains("hardware virtualization passed through"),
        "{}",
        n.detail
    );
    // QEMU TCG exposing SVM: correct but slow, and said so.
    f.host.cpu.model = "QEMU TCG CPU version 2.5+".into();
    let n = finding(&classify(&f), "kvm.nested").clone();
    assert_eq!(n.status, Status::Warn);
    assert!(n.detail.contains("emulated in software"), "{}", n.detail);
    assert!(n.detail.contains("15x"), "{}", n.detail);
}

/// A root host with everything isolated networking needs.
fn isolated_host() -> Facts {
    let mut f = vmx_host();
    f.host.root = true;
    f.features.tun = DeviceFacts {
        path: "/dev/net/tun".into(),
        present: true,
        accessible: true,
    };
    let tool = |path: &str, version: &str| ToolFacts {
        path: Some(path.into()),
        version: Some(version.into()),
    };
    f.network = NetworkFacts {
        ip: tool("/usr/sbin/ip", "ip utility, iproute2-6.1.0, libbpf 1.1.2"),
        nft: tool("/usr/sbin/nft", "nftables v1.0.6 (Lester Gooch #5)"),
        netns_dir: true,
        namespaces: 2,
        ip_forward: Some(1),
        route_clashes: Some(Vec::new()),
        nameservers: vec!["10.255.255.53".into()],
        dns: Some("10.255.255.53".into()),
        host_table: Some(true),
        egress_redirect: Some(true),
    };
    f
}

#[test]
fn isolated_networking_when_everything_is_present() {
    let r = classify(&isolated_host());
    assert_eq!(r.network_backend, "isolated");
    let iso = finding(&r, "network.isolation");
    assert_eq!(iso.status, Status::Ok);
    assert!(iso.detail.contains("no way to the host"), "{}", iso.detail);
    assert!(iso.detail.contains("iproute2-6.1.0"), "{}", iso.detail);
    assert!(iso.detail.contains("nft v1.0.6"), "{}", iso.detail);
    assert!(finding(&r, "network.dns").detail.contains("10.255.255.53"));
    assert!(finding(&r, "network.rules")
        .detail
        .contains("2 zygote namespaces"));
    let net: Vec<_> = r
        .findings
        .iter()
        .filter(|f| f.check.starts_with("network."))
        .collect();
    assert_eq!(net.len(), 6, "{net:?}");
    assert!(net.iter().all(|f| f.status == Status::Ok), "{net:?}");
}

#[test]
fn not_root_falls_back_to_user_networking() {
    let mut f = isolated_host();
    f.host.root = false;
    f.network.host_table = None;
    let r = classify(&f);
    assert_eq!(r.network_backend, "user");
    let iso = finding(&r, "network.isolation");
    assert_eq!(iso.status, Status::Warn);
    assert!(
        iso.detail.contains("QEMU user networking"),
        "{}",
        iso.detail
    );
    assert!(iso.detail.starts_with("not root"), "{}", iso.detail);
    assert!(iso.detail.contains("loopback services"), "{}", iso.detail);
    // Unprivileged, the host table is not asked for; the namespaces are still counted.
    let rules = finding(&r, "network.rules");
    assert_eq!(rules.status, Status::Ok);
    assert!(rules.detail.contains("run as root"), "{}", rules.detail);
}

#[test]
fn missing_nft_is_named_with_how_to_install() {
    let mut f = isolated_host();
    f.network.nft = ToolFacts::default();
    f.network.host_table = None;
    let r = classify(&f);
    assert_eq!(r.network_backend, "user");
    let iso = finding(&r, "network.isolation");
    assert_eq!(iso.status, Status::Warn);
    assert!(iso.detail.contains("no `nft` (nftables)"), "{}", iso.detail);
    assert!(!iso.detail.contains("iproute2)"), "{}", iso.detail);
    assert!(
        iso.detail.contains("apt-get install iproute2 nftables"),
        "{}",
        iso.detail
    );
    assert!(iso.detail.contains("scripts/setup.sh"), "{}", iso.detail);
    // Both tools missing: the install hint is given once.
    f.network.ip = ToolFacts::default();
    f.network.route_clashes = None;
    let r = classify(&f);
    let iso = finding(&r, "network.isolation");
    assert_eq!(iso.detail.matches("apt-get").count(), 1, "{}", iso.detail);
    assert!(r.findings.iter().all(|x| x.check != "network.routes"));
}

#[test]
fn route_clash_is_named() {
    let mut f = isolated_host();
    let route = "10.213.0.0/16 dev wg0 proto kernel scope link src 10.213.0.9";
    f.network.route_clashes = Some(vec![route.into()]);
    let r = classify(&f);
    assert_eq!(r.network_backend, "user");
    let routes = finding(&r, "network.routes");
    assert_eq!(routes.status, Status::Warn);
    assert!(routes.detail.contains(route), "{}", routes.detail);
    assert!(
        routes.detail.contains("10.213.0.0/16 and 10.214.0.0/16"),
        "{}",
        routes.detail
    );
    let iso = finding(&r, "network.isolation");
    assert_eq!(iso.status, Status::Warn);
    assert!(iso.detail.contains("network.routes"), "{}", iso.detail);
    assert!(
        iso.detail.contains("QEMU user networking"),
        "{}",
        iso.detail
    );
}

#[test]
fn loopback_only_dns_needs_dns_flag() {
    let mut f = isolated_host();
    f.network.nameservers = vec!["127.0.0.53".into()];
    f.network.dns = None;
    let dns = finding(&classify(&f), "network.dns").clone();
    assert_eq!(dns.status, Status::Warn);
    assert!(dns.detail.contains("--dns"), "{}", dns.detail);
    assert!(dns.detail.contains("127.0.0.53"), "{}", dns.detail);
    assert!(dns.detail.contains("only loopback"), "{}", dns.detail);
    // Under QEMU user networking the host resolves, loopback included.
    f.host.root = false;
    assert_eq!(finding(&classify(&f), "network.dns").status, Status::Ok);
}

#[test]
fn forwarding_off_and_missing_host_table() {
    let mut f = isolated_host();
    f.network.ip_forward = Some(0);
    f.network.host_table = Some(false);
    let r = classify(&f);
    let fwd = finding(&r, "network.forwarding");
    assert_eq!(fwd.status, Status::Ok);
    assert!(
        fwd.detail
            .contains("will enable net.ipv4.ip_forward at start"),
        "{}",
        fwd.detail
    );
    // Sandbox namespaces without the host's rules: their guests can reach the host.
    let rules = finding(&r, "network.rules");
    assert_eq!(rules.status, Status::Warn);
    assert!(rules.detail.contains("inet zygote"), "{}", rules.detail);
    f.network.namespaces = 0;
    assert_eq!(finding(&classify(&f), "network.rules").status, Status::Ok);
}

#[test]
fn a_kernel_without_nft_redirect_is_warned_about_with_what_fails() {
    let mut f = isolated_host();
    f.network.egress_redirect = Some(false);
    let r = classify(&f);
    // Isolation itself still works: only the proxy's redirect is missing.
    assert_eq!(r.network_backend, "isolated");
    let redirect = finding(&r, "network.egress_redirect");
    assert_eq!(redirect.status, Status::Warn);
    assert!(
        redirect.detail.contains("CONFIG_NFT_REDIR"),
        "{}",
        redirect.detail
    );
    assert!(
        redirect.detail.contains("bound to hosts"),
        "{}",
        redirect.detail
    );
}
