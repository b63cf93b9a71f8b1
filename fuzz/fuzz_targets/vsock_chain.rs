//! Fuzzer bytes as guest memory holding virtio-vsock TX, RX and event queues
//! (structure-aware: see `fuzzing::vsock_from_fuzz`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use zygote_vmm::devices::virtio::fuzzing::{fuzz_vsock, vsock_from_fuzz};

fuzz_target!(|data: &[u8]| {
    if let Some(rep) = fuzz_vsock(&vsock_from_fuzz(data)) {
        assert_eq!(rep.returned[0], rep.valid_heads[0]);
        assert!(rep.returned[1] <= rep.valid_heads[1]);
        assert!(rep.returned[2] <= rep.valid_heads[2].min(1));
    }
});
