//! Scenarios run after the boot checks, chosen by `probe.scenario=`.
//! To add one: write a module with `pub fn run(&BootInfo) -> Result<(), Fail>`
//! and add a row to `SCENARIOS`. Returning Ok prints PROBE OK and resets the VM;
//! a scenario that must keep running (like `spin`) simply never returns.

use crate::checks::{BootInfo, Fail};

mod blk;
mod blkspin;
mod boot;
mod fault;
mod rng;
mod smp;
mod spin;
mod vsock;

pub struct Scenario {
    pub name: &'static str,
    pub run: fn(&BootInfo) -> Result<(), Fail>,
}

pub static SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "boot",
        run: boot::run,
    },
    Scenario {
        name: "smp",
        run: smp::run,
    },
    Scenario {
        name: "spin",
        run: spin::run,
    },
    Scenario {
        name: "blk",
        run: blk::run,
    },
    Scenario {
        name: "rng",
        run: rng::run,
    },
    Scenario {
        name: "blkspin",
        run: blkspin::run,
    },
    Scenario {
        name: "fault",
        run: fault::run,
    },
    Scenario {
        name: "vsock",
        run: vsock::run,
    },
];

pub fn find(name: &[u8]) -> Option<&'static Scenario> {
    SCENARIOS.iter().find(|s| s.name.as_bytes() == name)
}
