//! `fault`: deliberately execute an undefined instruction with no IDT installed. On
//! hardware virtualization that escalates #UD → #DF → triple fault (KVM_EXIT_SHUTDOWN);
//! under an instruction emulator it may surface as KVM_EXIT_INTERNAL_ERROR. Either way
//! the VMM must end the VM with a clear error and a register dump, never hang or crash.

use crate::checks::{BootInfo, Fail};
use crate::say;

pub fn run(_info: &BootInfo) -> Result<(), Fail> {
    say!("fault: executing ud2");
    // SAFETY: intentionally faulting; nothing runs after this in the guest.
    unsafe { core::arch::asm!("ud2", options(noreturn)) }
}
