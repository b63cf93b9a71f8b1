//! Fuzzer bytes as guest memory holding a virtio-blk request queue and its buffers
//! (structure-aware: see `fuzzing::blk_from_fuzz`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use zygote_vmm::devices::virtio::fuzzing::{blk_from_fuzz, fuzz_blk};

fuzz_target!(|data: &[u8]| {
    if let Some(rep) = fuzz_blk(&blk_from_fuzz(data)) {
        // Every chain with a valid head goes back to the guest, malformed or not.
        assert_eq!(rep.returned[0], rep.valid_heads[0]);
    }
});
