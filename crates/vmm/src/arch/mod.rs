//! x86_64 platform code: memory map, boot structures, CPU set-up.
pub mod boot;
pub mod cpuid;
pub mod gdt;
pub mod layout;
pub mod mptable;
pub mod msr;
pub mod paging;
pub mod regs;
