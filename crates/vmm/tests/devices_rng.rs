//! The probe guest reads entropy from virtio-rng by polling.
mod devices_support;

use std::sync::{Arc, Mutex};

use devices_support::{line_with, probe_elf, run_scenario};
use zygote_vmm::devices::virtio::rng::Rng;

#[test]
fn probe_reads_distinct_random_bytes() {
    let Some(elf) = probe_elf("probe_reads_distinct_random_bytes") else {
        return;
    };
    let rng = Arc::new(Mutex::new(Rng::new()));
    let t = run_scenario(&elf, "rng", vec![rng.clone()]).unwrap_or_else(|t| panic!("{t:#?}"));
    assert!(
        line_with(&t, "check rng ok bytes=64 reads=2").is_some(),
        "{t:#?}"
    );
    let state = rng.lock().unwrap().save_state();
    assert_eq!(state.virtio.queues[0].next_used, 2);
}
