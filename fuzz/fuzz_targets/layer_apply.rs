//! Fuzzer bytes as the decisions of the layer generator (or, after a leading 0xff, one
//! raw layer), applied next to a sentinel directory: see `zygote_oci::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zygote_oci::fuzzing::fuzz_apply;

fuzz_target!(|data: &[u8]| {
    if let Err(broken) = fuzz_apply(data).check() {
        panic!("{broken}");
    }
});
