//! Arbitrary bytes as guest memory holding virtio-vsock TX, RX and event queues.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zygote_vmm::devices::virtio::fuzzing::fuzz_vsock;

fuzz_target!(|data: &[u8]| {
    if let Some(rep) = fuzz_vsock(data) {
        assert_eq!(rep.returned[0], rep.valid_heads[0]);
        assert!(rep.returned[1] <= rep.valid_heads[1]);
        assert!(rep.returned[2] <= rep.valid_heads[2].min(1));
    }
});
