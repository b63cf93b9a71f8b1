//! The probe guest opens a vsock stream to a host Unix socket through the hybrid
//! muxer and exchanges a message; other devices sit beside it on the bus.
mod devices_support;

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use devices_support::{line_with, probe_elf, run_scenario};
use zygote_probe_abi as abi;
use zygote_vmm::devices::virtio::rng::Rng;
use zygote_vmm::devices::virtio::vsock::{Vsock, VsockConfig};

#[test]
fn probe_connects_to_a_host_unix_socket() {
    let Some(elf) = probe_elf("probe_connects_to_a_host_unix_socket") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vm.vsock");
    let listener =
        UnixListener::bind(format!("{}_{}", uds.display(), abi::VSOCK_HOST_PORT)).unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut ping = vec![0u8; abi::VSOCK_PING.len()];
        s.read_exact(&mut ping).unwrap();
        s.write_all(abi::VSOCK_PONG).unwrap();
        // The guest shuts down: we see EOF.
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap();
        (ping, rest)
    });
    let vsock = Arc::new(Mutex::new(
        Vsock::new(VsockConfig {
            guest_cid: 7,
            uds_path: uds.clone(),
        })
        .unwrap(),
    ));
    // The rng first: the probe must pick the vsock window by device ID.
    let devices: Vec<Arc<Mutex<dyn zygote_vmm::devices::virtio::VirtioDevice>>> =
        vec![Arc::new(Mutex::new(Rng::new())), vsock.clone()];
    let t = run_scenario(&elf, "vsock", devices).unwrap_or_else(|t| panic!("{t:#?}"));
    let line = line_with(&t, "check vsock ok").expect("vsock line");
    assert!(line.contains("cid=7 port=5000"), "{line}");
    let (ping, rest) = server.join().unwrap();
    assert_eq!(ping, abi::VSOCK_PING);
    assert!(rest.is_empty());
    assert_eq!(vsock.lock().unwrap().connection_count(), 0);
}
