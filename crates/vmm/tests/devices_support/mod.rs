//! Shared by the `devices_*` integration tests: boot the probe guest with virtio
//! devices attached and collect its report. Skips (with the reason on stderr) where
//! /dev/kvm is unusable.
#![allow(dead_code)] // each test binary uses a different subset

use std::io::Write;
use std::path::PathBuf;
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zygote_probe_abi as abi;
use zygote_vmm::devices::serial::CallbackWriter;
use zygote_vmm::devices::virtio::VirtioDevice;
use zygote_vmm::probe::{self, ProbeOptions};
use zygote_vmm::{VmConfig, Vmm};

pub const TIMEOUT: Duration = Duration::from_secs(120);

/// The probe ELF, or None (after printing why) when KVM cannot run it here.
pub fn probe_elf(test: &str) -> Option<PathBuf> {
    if let Err(why) = zygote_vmm::host::kvm_usable() {
        let _ = writeln!(std::io::stderr(), "skipping {test}: KVM unavailable: {why}");
        return None;
    }
    Some(probe::locate_probe(true).expect("probe guest builds"))
}

/// Boot `scenario` with `devices`; returns the transcript once the probe reported
/// `PROBE OK` and the VM exited cleanly, or the transcript as the error otherwise.
pub fn run_scenario(
    elf: &std::path::Path,
    scenario: &str,
    devices: Vec<Arc<Mutex<dyn VirtioDevice>>>,
) -> Result<Vec<String>, Vec<String>> {
    let (tx, lines) = channel::<String>();
    let mut partial = Vec::new();
    let writer = CallbackWriter(move |bytes: &[u8]| {
        for &b in bytes {
            if b == b'\n' {
                let _ = tx.send(String::from_utf8_lossy(&partial).trim_end().to_string());
                partial.clear();
            } else {
                partial.push(b);
            }
        }
    });
    let opts = ProbeOptions {
        scenario: scenario.into(),
        ..Default::default()
    };
    let mut vmm = Vmm::boot(VmConfig {
        kernel: elf.to_path_buf(),
        initrd: None,
        cmdline: probe::probe_cmdline(&opts),
        mem_mib: opts.mem_mib,
        vcpus: 1,
        serial_out: Box::new(writer),
        start_paused: false,
        virtio_devices: devices,
    })
    .expect("VM boots");
    let deadline = Instant::now() + TIMEOUT;
    let mut transcript = Vec::new();
    let mut ok = false;
    while Instant::now() < deadline {
        match lines.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => {
                eprintln!("  | {line}");
                let done = line == abi::REPORT_OK || line.starts_with(abi::REPORT_FAIL_PREFIX);
                ok |= line == abi::REPORT_OK;
                transcript.push(line);
                if done {
                    break;
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                if vmm.wait(Some(Duration::ZERO)).is_some() {
                    break;
                }
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    let exit = vmm.wait(Some(Duration::from_secs(10))).cloned();
    vmm.shutdown();
    if ok && exit.as_ref().is_some_and(|e| e.is_clean()) {
        Ok(transcript)
    } else {
        transcript.push(format!("(VM exit: {exit:?})"));
        Err(transcript)
    }
}

pub fn line_with<'a>(transcript: &'a [String], prefix: &str) -> Option<&'a str> {
    transcript
        .iter()
        .find(|l| l.starts_with(prefix))
        .map(String::as_str)
}
