//! `zygote bench ksm`: how much memory KSM saves across sandboxes with identical pages.
//! Boots N probe VMs whose RAM is populated identically from the host, opts their RAM
//! into KSM, runs ksmd until it converges and reports the pages it shares. KSM's
//! settings are restored (and merged pages unmerged) afterwards.
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::branch_measure::boot_populated;

const KSM: &str = "/sys/kernel/mm/ksm";

#[derive(clap::Args)]
pub struct KsmBenchArgs {
    /// Number of VMs.
    #[arg(long, default_value_t = 4)]
    vms: usize,
    /// Guest memory per VM in MiB (populated identically from the host).
    #[arg(long, default_value_t = 256)]
    mem_mib: u64,
    /// Give up waiting for ksmd after this many seconds.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct KsmResult {
    vms: usize,
    mem_mib: u64,
    populated_mib_per_vm: f64,
    /// Distinct KSM pages, and the extra mappings deduplicated onto them.
    pages_shared: u64,
    pages_sharing: u64,
    saved_mib: f64,
    /// Saved memory relative to all populated guest memory.
    saved_fraction: f64,
    converge_ms: f64,
    full_scans: u64,
    mem_available_gain_mib: f64,
}

fn read(name: &str) -> anyhow::Result<u64> {
    let path = Path::new(KSM).join(name);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        anyhow::anyhow!(
            "reading {}: {e} (is KSM available? see zygote doctor)",
            path.display()
        )
    })?;
    Ok(text.trim().parse()?)
}

fn write(name: &str, value: u64) -> anyhow::Result<()> {
    let path = Path::new(KSM).join(name);
    std::fs::write(&path, value.to_string())
        .map_err(|e| anyhow::anyhow!("writing {}: {e} (needs root)", path.display()))
}

fn mem_available_mib() -> f64 {
    zygote_vmm::host::meminfo_kib("MemAvailable").map_or(0.0, |kib| kib as f64 / 1024.0)
}

/// Puts KSM's knobs back as they were, unmerging what we merged.
struct KsmSettings {
    run: u64,
    pages_to_scan: u64,
    sleep_millisecs: u64,
}

impl Drop for KsmSettings {
    fn drop(&mut self) {
        let _ = write("run", 2); // unmerge everything merged meanwhile
        let _ = write("pages_to_scan", self.pages_to_scan);
        let _ = write("sleep_millisecs", self.sleep_millisecs);
        let _ = write("run", self.run);
    }
}

pub fn run(args: KsmBenchArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(args.vms >= 2, "--vms must be at least 2 to share anything");
    let saved = KsmSettings {
        run: read("run")?,
        pages_to_scan: read("pages_to_scan")?,
        sleep_millisecs: read("sleep_millisecs")?,
    };
    anyhow::ensure!(
        saved.run == 0,
        "KSM is already running on this host; this bench needs it to itself"
    );
    eprintln!(
        "booting {} probe VMs of {} MiB with identical memory...",
        args.vms, args.mem_mib
    );
    let mut vms = Vec::new();
    let mut populated = 0;
    for _ in 0..args.vms {
        let (vm, pages) = boot_populated(args.mem_mib)?;
        populated = pages;
        vms.push(vm);
    }
    for vm in &vms {
        vm.vmm.guest_ram().enable_ksm()?;
    }
    let before = mem_available_mib();
    let scans0 = read("full_scans")?;
    write("pages_to_scan", 20_000)?;
    write("sleep_millisecs", 1)?;
    write("run", 1)?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.timeout);
    // Converged: two full scans completed and sharing stopped growing.
    let (mut last, mut reported_scans) = (0, 0);
    loop {
        std::thread::sleep(Duration::from_millis(250));
        let sharing = read("pages_sharing")?;
        let scans = read("full_scans")? - scans0;
        // A whole line per finished scan: "\r" redraws ran together in logs.
        if scans != reported_scans {
            eprintln!("ksmd: {scans} full scans, {sharing} pages sharing");
            reported_scans = scans;
        }
        if scans >= 2 && sharing == last && sharing > 0 {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "ksmd did not converge within {}s",
            args.timeout
        );
        last = sharing;
    }
    let converge = started.elapsed();
    let result = KsmResult {
        vms: args.vms,
        mem_mib: args.mem_mib,
        populated_mib_per_vm: populated as f64 * 4096.0 / (1 << 20) as f64,
        pages_shared: read("pages_shared")?,
        pages_sharing: read("pages_sharing")?,
        saved_mib: read("pages_sharing")? as f64 * 4096.0 / (1 << 20) as f64,
        saved_fraction: read("pages_sharing")? as f64 / (populated as f64 * args.vms as f64),
        converge_ms: converge.as_secs_f64() * 1e3,
        full_scans: read("full_scans")? - scans0,
        mem_available_gain_mib: mem_available_mib() - before,
    };
    drop(saved);
    for vm in vms {
        vm.vmm.shutdown();
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        println!(
            "bench ksm: {} VMs x {} MiB ({:.0} MiB populated identically per VM)",
            result.vms, result.mem_mib, result.populated_mib_per_vm
        );
        println!(
            "  merged in {:.1} s ({} full scans): {} shared pages, {} deduplicated mappings",
            result.converge_ms / 1e3,
            result.full_scans,
            result.pages_shared,
            result.pages_sharing
        );
        println!(
            "  saved {:.0} MiB = {:.0}% of populated guest memory (MemAvailable +{:.0} MiB)",
            result.saved_mib,
            result.saved_fraction * 100.0,
            result.mem_available_gain_mib
        );
    }
    Ok(0)
}
