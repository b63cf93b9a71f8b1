//! Fuzzer bytes as an uploaded snapshot pack: read into a staging directory, each file
//! decoded within limits (see `zygote_oci::pack::fuzzing`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use zygote_oci::pack::fuzzing::read_and_decode;

fuzz_target!(|data: &[u8]| {
    let outcome = read_and_decode(data);
    // Whatever the bytes, the import's staging is gone once it is dropped.
    assert_eq!(outcome.staging_left, 0, "{outcome:?}");
});
