//! `zygote probe`: boot the probe guest through zygote's VMM and stream its report.
use std::time::Duration;

use zygote_vmm::probe::{self, ProbeError, ProbeOptions};

#[derive(clap::Args)]
pub struct ProbeArgs {
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 256)]
    mem_mib: u64,
    /// Number of vCPUs (the `smp` scenario wakes them all).
    #[arg(long, default_value_t = 1)]
    vcpus: u8,
    /// Probe scenario: boot, smp or spin.
    #[arg(long, default_value = "boot")]
    scenario: String,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
}

pub fn run(args: ProbeArgs) -> anyhow::Result<i32> {
    if args.scenario == "spin" {
        anyhow::bail!("the spin scenario never ends by itself; it is driven by tests and benches");
    }
    let elf = probe::locate_probe(true)?;
    let opts = ProbeOptions {
        mem_mib: args.mem_mib,
        vcpus: args.vcpus,
        scenario: args.scenario,
    };
    let started = std::time::Instant::now();
    match probe::run_probe(&elf, &opts, Duration::from_secs(args.timeout), |line| {
        println!("{line}")
    }) {
        Ok(_) => {
            eprintln!("probe passed in {:.2?}", started.elapsed());
            Ok(0)
        }
        Err(ProbeError::Failed(what)) => {
            eprintln!("zygote: probe failed: {what}");
            Ok(1)
        }
        Err(e) => Err(e.into()),
    }
}
