//! Running zygote's probe guest (`guest/probe`): a tiny freestanding program booted
//! through the same path as a Linux kernel, which checks the boot structures and reports
//! over COM1. Used by `zygote probe` and by the VMM's integration tests on hosts that
//! cannot boot Linux under KVM.
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};
use zygote_probe_abi as abi;

use crate::devices::serial::CallbackWriter;
use crate::memory::GuestRam;
use crate::{ExitReason, VmConfig, Vmm, VmmError};

pub mod progress;

/// Where the probe ELF is built by `guest/probe/build.sh`, relative to the repository.
const PROBE_REL_PATH: &str = "guest/probe/target/x86_64-unknown-none/release/zygote-probe";

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("probe guest not found; build it with guest/probe/build.sh or set ZYGOTE_PROBE")]
    NotFound,
    #[error("building the probe guest failed: {0}")]
    Build(String),
    #[error(transparent)]
    Vmm(#[from] VmmError),
    #[error("probe did not finish within {0:?}")]
    Timeout(Duration),
    #[error("probe failed: {0}")]
    Failed(String),
    #[error("reading the probe mailbox failed: {0}")]
    Mailbox(String),
    #[error(
        "the probe's heartbeat stayed at {heartbeat} for {waited:?}: the guest is not running"
    )]
    Stalled { heartbeat: u64, waited: Duration },
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Find the probe ELF: `$ZYGOTE_PROBE`, next to the running executable, or in the source
/// tree; if only the source tree has the probe's sources, build it.
pub fn locate_probe(build_if_missing: bool) -> Result<PathBuf, ProbeError> {
    if let Some(p) = std::env::var_os("ZYGOTE_PROBE") {
        return Ok(PathBuf::from(p));
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        let candidate = dir.join("zygote-probe");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    let in_tree = repo_root().join(PROBE_REL_PATH);
    let script = repo_root().join("guest/probe/build.sh");
    if build_if_missing && script.is_file() {
        // Always run the build: cargo makes it a no-op when the probe is up to date, and a
        // stale probe would test old code. The probe has its own target directory, so an
        // inherited CARGO_TARGET_DIR must not redirect it.
        let out = std::process::Command::new("bash")
            .arg(&script)
            .env_remove("CARGO_TARGET_DIR")
            .output()
            .map_err(|e| ProbeError::Build(e.to_string()))?;
        if !out.status.success() {
            return Err(ProbeError::Build(
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ));
        }
        // build.sh prints the ELF's path as its last line.
        let stdout = String::from_utf8_lossy(&out.stdout);
        if let Some(built) = stdout.lines().last().map(PathBuf::from) {
            if built.is_file() {
                return Ok(built);
            }
        }
    }
    if in_tree.is_file() {
        return Ok(in_tree);
    }
    Err(ProbeError::NotFound)
}

/// How to run the probe.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    pub mem_mib: u64,
    pub vcpus: u8,
    pub scenario: String,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        Self {
            mem_mib: 256,
            vcpus: 1,
            scenario: "boot".into(),
        }
    }
}

/// The command line the probe parses.
pub fn probe_cmdline(opts: &ProbeOptions) -> String {
    format!(
        "console=ttyS0 {}{} {}{} {}{} {}",
        abi::CMDLINE_SCENARIO,
        opts.scenario,
        abi::CMDLINE_MEM_MIB,
        opts.mem_mib,
        abi::CMDLINE_VCPUS,
        opts.vcpus,
        abi::CMDLINE_TOKEN
    )
}

/// A booted probe: the VM plus its console, line by line.
pub struct ProbeVm {
    pub vmm: Vmm,
    lines: Receiver<String>,
    pub transcript: Vec<String>,
}

/// Boot the probe ELF at `elf`.
pub fn boot_probe(elf: &Path, opts: &ProbeOptions) -> Result<ProbeVm, ProbeError> {
    boot_probe_with_devices(elf, opts, Vec::new())
}

/// Boot the probe with virtio devices attached (device scenarios find them on the
/// command line).
pub fn boot_probe_with_devices(
    elf: &Path,
    opts: &ProbeOptions,
    virtio_devices: Vec<std::sync::Arc<std::sync::Mutex<dyn crate::devices::virtio::VirtioDevice>>>,
) -> Result<ProbeVm, ProbeError> {
    let (tx, lines) = channel::<String>();
    let mut partial = Vec::new();
    let writer = CallbackWriter(move |bytes: &[u8]| {
        for &b in bytes {
            if b == b'\n' {
                let line = String::from_utf8_lossy(&partial)
                    .trim_end_matches('\r')
                    .to_string();
                let _ = tx.send(line);
                partial.clear();
            } else {
                partial.push(b);
            }
        }
    });
    let vmm = Vmm::boot(VmConfig {
        kernel: elf.to_path_buf(),
        initrd: None,
        cmdline: probe_cmdline(opts),
        mem_mib: opts.mem_mib,
        vcpus: opts.vcpus,
        serial_out: Box::new(writer),
        start_paused: false,
        virtio_devices,
    })?;
    Ok(ProbeVm {
        vmm,
        lines,
        transcript: Vec::new(),
    })
}

impl ProbeVm {
    /// Next console line, or None on timeout.
    pub fn next_line(&mut self, timeout: Duration) -> Option<String> {
        match self.lines.recv_timeout(timeout) {
            Ok(line) => {
                self.transcript.push(line.clone());
                Some(line)
            }
            Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => None,
        }
    }

    /// Read lines (passing each to `on_line`) until one satisfies `done` or the
    /// deadline passes. A `PROBE FAIL` line ends the wait with an error.
    pub fn wait_for_line(
        &mut self,
        timeout: Duration,
        mut on_line: impl FnMut(&str),
        done: impl Fn(&str) -> bool,
    ) -> Result<String, ProbeError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ProbeError::Timeout(timeout));
            }
            if let Some(line) = self.next_line(left.min(Duration::from_millis(50))) {
                on_line(&line);
                if let Some(what) = line.strip_prefix(abi::REPORT_FAIL_PREFIX) {
                    return Err(ProbeError::Failed(what.to_string()));
                }
                if done(&line) {
                    return Ok(line);
                }
            } else if let Some(exit) = self.vmm.wait(Some(Duration::ZERO)) {
                // The VM ended: drain what it printed, then report.
                let exit = exit.clone();
                while let Some(line) = self.next_line(Duration::from_millis(20)) {
                    on_line(&line);
                    if done(&line) {
                        return Ok(line);
                    }
                }
                return Err(ProbeError::Failed(format!(
                    "VM ended before the expected report: {exit}"
                )));
            }
        }
    }

    pub fn mailbox(&self) -> Result<abi::Mailbox, ProbeError> {
        read_mailbox(self.vmm.guest_ram())
    }
}

/// One u64 of the mailbox page at byte offset `off`, straight out of guest RAM.
pub fn read_mailbox_word(ram: &GuestRam, off: u64) -> Result<u64, ProbeError> {
    ram.memory()
        .read_obj::<u64>(GuestAddress(abi::MAILBOX_GPA + off))
        .map_err(|e| ProbeError::Mailbox(e.to_string()))
}

/// Read the probe's mailbox page straight out of guest RAM.
pub fn read_mailbox(ram: &GuestRam) -> Result<abi::Mailbox, ProbeError> {
    let word = |off: u64| read_mailbox_word(ram, off);
    let mut mb = abi::Mailbox {
        magic: word(abi::MAILBOX_OFF_MAGIC)?,
        status: word(abi::MAILBOX_OFF_STATUS)?,
        heartbeat: word(abi::MAILBOX_OFF_HEARTBEAT)?,
        cpus_alive: word(abi::MAILBOX_OFF_CPUS_ALIVE)?,
        scratch: [0; 12],
    };
    for (i, s) in mb.scratch.iter_mut().enumerate() {
        *s = word(abi::MAILBOX_OFF_SCRATCH + 8 * i as u64)?;
    }
    Ok(mb)
}

/// Write the u64 at byte offset `off` of the mailbox page (a host command to the probe).
pub fn write_mailbox_word(ram: &GuestRam, off: u64, value: u64) -> Result<(), ProbeError> {
    ram.memory()
        .write_obj(value, GuestAddress(abi::MAILBOX_GPA + off))
        .map_err(|e| ProbeError::Mailbox(e.to_string()))
}

/// Pages of the `spin` probe's dirty window for a guest of `mem_mib` asked to rewrite
/// `window_mib`: the window starts at [`abi::DIRTY_WINDOW_GPA`] and must end in RAM
/// below the MMIO hole. None when it does not fit.
pub fn dirty_window_pages(mem_mib: u64, window_mib: u64) -> Option<u64> {
    let end = abi::DIRTY_WINDOW_GPA.checked_add(window_mib.checked_mul(1 << 20)?)?;
    let ram_end = (mem_mib << 20).min(abi::MMIO_HOLE_START);
    (end <= ram_end).then_some(window_mib * 256)
}

/// Start (pages > 0) or stop (0) the `spin` probe's dirty window, in the VM that owns
/// `ram` (and, after a branch, in its children, which inherit the command).
pub fn set_dirty_window(ram: &GuestRam, pages: u64) -> Result<(), ProbeError> {
    write_mailbox_word(ram, abi::MAILBOX_OFF_DIRTY_WINDOW_PAGES, pages)
}

/// Passes over the dirty window the `spin` probe has finished.
pub fn dirty_passes(ram: &GuestRam) -> Result<u64, ProbeError> {
    read_mailbox_word(ram, abi::MAILBOX_OFF_DIRTY_PASSES)
}

/// Outcome of a complete probe run.
#[derive(Debug)]
pub struct ProbeOutcome {
    pub transcript: Vec<String>,
    pub exit: Option<ExitReason>,
}

/// Boot the probe, stream its report through `on_line`, and require `PROBE OK` followed
/// by a clean VM exit.
pub fn run_probe(
    elf: &Path,
    opts: &ProbeOptions,
    timeout: Duration,
    on_line: impl FnMut(&str),
) -> Result<ProbeOutcome, ProbeError> {
    let mut vm = boot_probe(elf, opts)?;
    vm.wait_for_line(timeout, on_line, |l| l == abi::REPORT_OK)?;
    let exit = vm.vmm.wait(Some(timeout)).cloned();
    match &exit {
        Some(e) if e.is_clean() => {}
        Some(e) => return Err(ProbeError::Failed(format!("after PROBE OK: {e}"))),
        None => return Err(ProbeError::Timeout(timeout)),
    }
    Ok(ProbeOutcome {
        transcript: std::mem::take(&mut vm.transcript),
        exit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirty_window_fits_between_its_start_and_the_end_of_low_ram() {
        // 1 GiB guest: 64 MiB from 128 MiB fits, 896 MiB exactly, 897 not.
        assert_eq!(dirty_window_pages(1024, 64), Some(64 * 256));
        assert_eq!(dirty_window_pages(1024, 896), Some(896 * 256));
        assert_eq!(dirty_window_pages(1024, 897), None);
        // Too small a guest for any window beyond its start.
        assert_eq!(dirty_window_pages(128, 1), None);
        // RAM above the MMIO hole does not count (the window is contiguous below it).
        assert_eq!(dirty_window_pages(8192, 3072), None);
        assert_eq!(
            dirty_window_pages(8192, 3072 - 128),
            Some((3072 - 128) * 256)
        );
        assert_eq!(dirty_window_pages(1024, u64::MAX), None);
    }
}
