//! The kvm runtime's device set on a real Linux guest: the `minimal` image as a
//! copy-on-write root disk plus vsock to the in-guest agent. Needs hardware
//! virtualization; elsewhere it skips with the reason printed.
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use zygote_vmm::devices::serial::CallbackWriter;
use zygote_vmm::devices::virtio::setup::for_root_image;
use zygote_vmm::{VmConfig, Vmm};

/// The agent's vsock port (zygote-proto's DEFAULT_VSOCK_PORT).
const AGENT_PORT: u32 = 1024;

fn cache_dir() -> Option<PathBuf> {
    std::env::var_os("ZYGOTE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/zygote")))
}

/// `$ZYGOTE_<VAR>`, or the newest cache entry accepted by `pick`.
fn newest(
    var: &str,
    sub: &str,
    pick: impl Fn(&std::path::Path) -> Option<PathBuf>,
) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(var) {
        return Some(PathBuf::from(p));
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(cache_dir()?.join(sub))
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| pick(&e.path()))
        .collect();
    found.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    found.pop()
}

/// Connect through the hybrid vsock socket until the agent accepts (the guest resets
/// connections to ports nobody listens on yet).
fn connect_agent(uds: &std::path::Path, deadline: Instant) -> Option<String> {
    while Instant::now() < deadline {
        if let Ok(mut s) = UnixStream::connect(uds) {
            s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
            s.write_all(format!("CONNECT {AGENT_PORT}\n").as_bytes())
                .ok()?;
            let mut line = String::new();
            if BufReader::new(&s).read_line(&mut line).is_ok() && line.starts_with("OK ") {
                return Some(line);
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    None
}

#[test]
fn minimal_image_boots_with_cow_root_and_vsock_agent() {
    if !zygote_vmm::host::hardware_virtualization() {
        let _ = writeln!(
            std::io::stderr(),
            "skipping minimal_image_boots_with_cow_root_and_vsock_agent: no hardware \
             virtualization (no vmx/svm, no kvm_intel/kvm_amd), so Linux cannot boot under \
             this host's KVM; the devices are covered here by the probe guest (devices_blk, \
             devices_vsock, devices_rng)"
        );
        return;
    }
    let kernel = newest("ZYGOTE_KERNEL", "kernel", |d| {
        Some(d.join("vmlinux")).filter(|p| p.is_file())
    })
    .expect(
        "hardware virtualization present but no kernel: build it (make guest) or set ZYGOTE_KERNEL",
    );
    let image = newest("ZYGOTE_IMAGE", "images", |p| {
        let name = p.file_name()?.to_str()?;
        (name.starts_with("minimal-") && name.ends_with(".ext4")).then(|| p.to_path_buf())
    })
    .expect("no minimal image: build it (zygote image build minimal) or set ZYGOTE_IMAGE");
    let before = std::fs::metadata(&image).unwrap().modified().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vm.vsock");
    let devices = for_root_image(&image, &uds, None).unwrap();
    let console = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = console.clone();
    let vmm = Vmm::boot(VmConfig {
        kernel,
        initrd: None,
        cmdline: format!(
            "console=ttyS0 reboot=k panic=1 pci=off nomodule i8042.noaux {}",
            devices.root_cmdline()
        ),
        mem_mib: 512,
        vcpus: 2,
        serial_out: Box::new(CallbackWriter(move |b: &[u8]| {
            sink.lock().unwrap().extend_from_slice(b)
        })),
        start_paused: false,
        virtio_devices: devices.virtio_devices(),
    })
    .expect("VM boots");
    let ok = connect_agent(&uds, Instant::now() + Duration::from_secs(90));
    let text = String::from_utf8_lossy(&console.lock().unwrap()).into_owned();
    vmm.shutdown();
    assert!(
        ok.is_some(),
        "agent never accepted over vsock; console:\n{text}"
    );
    assert_eq!(
        std::fs::metadata(&image).unwrap().modified().unwrap(),
        before,
        "the base image is never written"
    );
}
