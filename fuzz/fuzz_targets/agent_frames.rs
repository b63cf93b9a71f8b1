//! Fuzzer bytes as what the agent sends the host: frames decoded one after another by
//! the client's decoder until the stream ends or breaks. Any panic is a finding; run
//! with `-malloc_limit_mb` just above the 16 MiB frame limit (scripts/fuzz.sh does) so
//! an allocation beyond it is one too. The seeded test `tests/agent_frames_fuzz.rs`
//! checks the same decoder without cargo-fuzz.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zygote_proto::client::read_response;

fuzz_target!(|data: &[u8]| {
    let mut stream = data;
    for _ in 0..64 {
        match read_response(&mut stream) {
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
});
