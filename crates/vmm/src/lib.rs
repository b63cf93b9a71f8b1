//! zygote's VMM: a KVM virtual machine with guest RAM in private anonymous memory, the
//! x86_64 Linux boot path, vCPU threads that can be paused and resumed, and the devices a
//! microVM needs. One process runs one VM.
pub mod arch;
pub mod console_log;
pub mod control;
pub mod devices;
pub mod event_loop;
pub mod host;
pub mod memory;
pub mod persist;
pub mod probe;
pub mod vmm;
pub mod vstate;

pub use vmm::{VmConfig, Vmm, VmmError};
pub use vstate::vcpu::ExitReason;
