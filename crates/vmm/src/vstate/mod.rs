//! KVM state: the VM (memory slots, irqchip, PIT) and its vCPUs.
pub mod capture;
pub mod vcpu;
pub mod vcpu_loop;
pub mod vm;
