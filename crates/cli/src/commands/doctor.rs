//! `zygote doctor [--json]`: what this host can run, and why.
//!
//! Three stages, each in its own module: `facts` reads the host into plain
//! data (read-only: nothing is created or loaded, except the scratch
//! directory `treeclone` makes and removes inside existing directories),
//! `classify` turns facts into findings and a runtime summary (pure,
//! unit-tested with constructed hosts), `render` prints a grouped table or a
//! JSON document.
//!
//! JSON document (`--json`), `schema_version` 1:
//! - `kvm`: `flavor` ("vmx" | "svm" | "pvm" | "unknown" | "none"), `present`,
//!   `accessible`, `open_error`, `open_errno`, `device{mode,uid,gid,group}`,
//!   `api_version`, `modules[]`, `caps{irqchip, pit2, user_memory, ioeventfd,
//!   irqfd, immediate_exit, xsave, xsave2_size, manual_dirty_log_protect2,
//!   dirty_log_ring, tsc_control, nr_vcpus, max_vcpus, msr_index_count,
//!   supported_cpuid_entries}` (null when /dev/kvm cannot be opened).
//! - `host`: `kernel_release`, `kernel_version`, `machine`, `cores`,
//!   `mem_total_kib`, `mem_available_kib`, `root`, `cpu{vmx,svm,hypervisor}`.
//! - `features`: `thp{enabled,defrag}`, `userfaultfd{syscall,error,errno,
//!   unprivileged,dev_userfaultfd}`, `ksm{present,writable,run}`,
//!   `cgroup_v2{mounted,mount_point,unified,controllers,own_path,writable}`,
//!   `reflink{kernel_xfs,kernel_btrfs,mkfs_xfs,cache_dir,probed_dir,cache_fs,
//!   cache_fs_magic,cache_reflink}`, `treeclone[]` (`{place: "state"|"images",
//!   dir,probed_dir,fs,methods[{method,available,detail}]}`: which tree-clone
//!   methods work in the daemon's state directory and the image cache),
//!   `loop_control`/`tun`/`vhost_vsock`/`vhost_net` as
//!   `{path,present,accessible}`, `qemu{system,version,img}`.
//! - `network`: `backend` ("isolated" | "user": what `zygote serve` run by this
//!   user would take), `ip{path,version}`, `nft{path,version}`, `netns_dir`,
//!   `namespaces` (count of /run/netns/zygote-*), `ip_forward`, `route_clashes[]`
//!   (host routes overlapping 10.213.0.0/16 or 10.214.0.0/16; null when `ip` did
//!   not run), `nameservers[]`, `dns` (first non-loopback IPv4 nameserver),
//!   `host_table` (`nft list table inet zygote` succeeded; null unless root),
//!   `egress_redirect` (`nft --check` accepted a `redirect` rule, which the egress
//!   proxy needs; null unless root).
//! - `runtimes`: `kvm`, `probe`, `qemu` (booleans), `qemu_accel` ("kvm" |
//!   "tcg" | null), `default_runtime` ("kvm" | "qemu" | null: null when no
//!   runtime can boot Linux guests).
//! - `findings[]`: `{check: "group.name", status: "ok"|"warn"|"fail", detail}`.
//! - `exit_code`: the process exit status (see below).
//!
//! Exit status: 1 only when nothing can run (no usable KVM and no QEMU);
//! warnings and missing optional features still exit 0.
mod classify;
mod facts;
mod host_checks;
mod parse;
mod render;
mod treeclone;

use std::io::Write as _;

#[derive(clap::Args)]
pub struct DoctorArgs {
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: DoctorArgs) -> anyhow::Result<i32> {
    let facts = facts::gather();
    let report = classify::classify(&facts);
    let text = if args.json {
        render::json(&facts, &report)
    } else {
        render::human(&facts, &report)
    };
    // `zygote doctor --json | head` must not panic when the reader goes away.
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{}", text.trim_end()).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e.into()),
        _ => {}
    }
    Ok(report.exit_code())
}

#[cfg(test)]
mod tests {
    //! Runs the real gathering on whatever host runs the tests and checks the
    //! facts against what the host shows through independent reads.
    use super::classify::{classify, Flavor};
    use super::facts;
    use std::path::Path;
    use std::process::Command;

    fn cpu_flag(flag: &str) -> bool {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        cpuinfo
            .lines()
            .find(|l| l.starts_with("flags"))
            .is_some_and(|l| l.split_whitespace().any(|w| w == flag))
    }

    #[test]
    fn host_facts_match_the_host() {
        let f = facts::gather();
        let r = classify(&f);
        let module = |m: &str| Path::new("/sys/module").join(m).exists();
        let kvm_dev = Path::new("/dev/kvm").exists();

        assert_eq!(f.kvm.present, kvm_dev);
        assert_eq!(f.host.cpu.vmx, cpu_flag("vmx"));
        assert_eq!(f.host.cpu.svm, cpu_flag("svm"));
        if !kvm_dev {
            assert_eq!(r.flavor, Flavor::None);
        }
        // PVM iff kvm_pvm serves /dev/kvm (no hardware vendor module loaded)...
        let pvm_serves = kvm_dev && module("kvm_pvm") && !module("kvm_intel") && !module("kvm_amd");
        assert_eq!(r.flavor == Flavor::Pvm, pvm_serves, "{:?}", r.flavor);
        // ...and in particular a kvm_pvm host without VMX/SVM is PVM.
        if kvm_dev && module("kvm_pvm") && !cpu_flag("vmx") && !cpu_flag("svm") {
            assert_eq!(r.flavor, Flavor::Pvm);
            assert!(
                !r.runtimes.kvm,
                "no Linux guests without hardware virtualization"
            );
        }
        if r.flavor == Flavor::Vmx {
            assert!(module("kvm_intel") || cpu_flag("vmx"));
        }

        // An accessible KVM answers the basic ioctls.
        if f.kvm.accessible {
            assert_eq!(f.kvm.api_version, Some(12));
            let caps = f.kvm.caps.as_ref().expect("caps when accessible");
            assert!(caps.user_memory);
            assert!(caps.max_vcpus >= caps.nr_vcpus && caps.nr_vcpus > 0);
            assert_eq!(r.runtimes.probe, caps.irqchip);
        }

        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
        match thp {
            Ok(text) => assert!(text.contains(&format!("[{}]", f.features.thp.enabled.unwrap()))),
            Err(_) => assert!(f.features.thp.enabled.is_none()),
        }
        assert_eq!(
            f.features.ksm.present,
            Path::new("/sys/kernel/mm/ksm/run").exists()
        );
        assert_eq!(f.features.tun.present, Path::new("/dev/net/tun").exists());
        assert_eq!(
            f.features.vhost_vsock.present,
            Path::new("/dev/vhost-vsock").exists()
        );
        assert_eq!(
            f.features.loop_control.present,
            Path::new("/dev/loop-control").exists()
        );
        assert!(f.host.cores >= 1);
        assert!(f.host.mem_total_kib.unwrap() >= f.host.mem_available_kib.unwrap());
        assert!(!f.host.kernel_release.is_empty());

        // The network tools are found where a command would find them (the search
        // adds the sbin directories an unprivileged PATH may lack).
        let runs = |tool: &str| {
            let sbin = ["/usr/local/sbin", "/usr/sbin", "/sbin"].map(|d| Path::new(d).join(tool));
            std::iter::once(Path::new(tool).to_path_buf())
                .chain(sbin)
                .any(|p| Command::new(p).arg("-V").output().is_ok())
        };
        let n = &f.network;
        assert_eq!(n.ip.path.is_some(), runs("ip"), "{:?}", n.ip);
        assert_eq!(n.nft.path.is_some(), runs("nft"), "{:?}", n.nft);
        assert_eq!(n.netns_dir, Path::new("/run/netns").is_dir());
        // Asked only as root (an unprivileged nft cannot read the ruleset).
        assert_eq!(n.host_table.is_some(), f.host.root && n.nft.path.is_some());
        assert_eq!(
            n.egress_redirect.is_some(),
            f.host.root && n.nft.path.is_some()
        );
        assert_eq!(n.route_clashes.is_some(), n.ip.path.is_some());
        let forward = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").ok();
        assert_eq!(n.ip_forward, forward.and_then(|s| s.trim().parse().ok()));
        if let Some(dns) = &n.dns {
            assert!(n.nameservers.contains(dns), "{dns} in {:?}", n.nameservers);
            assert!(!dns.parse::<std::net::Ipv4Addr>().unwrap().is_loopback());
        }
        let isolated = f.host.root
            && runs("ip")
            && runs("nft")
            && Path::new("/dev/net/tun").exists()
            && n.route_clashes.as_ref().is_some_and(Vec::is_empty);
        assert_eq!(r.network_backend == "isolated", isolated);

        // QEMU counts only if it actually ran; the exit code follows the runtimes.
        assert_eq!(r.runtimes.qemu, f.features.qemu.version.is_some());
        assert_eq!(r.exit_code() == 0, r.runtimes.probe || r.runtimes.qemu);
    }
}
