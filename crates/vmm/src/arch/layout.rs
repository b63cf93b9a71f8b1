//! Guest-physical memory map of a zygote x86_64 VM.
//!
//! ```text
//! 0x0000_0500  GDT                     0x0000_7000  zero page (boot_params)
//! 0x0000_9000  PML4                    0x0000_a000  PDPT
//! 0x0000_b000  page directories (one per GiB identity-mapped, at most 16)
//! 0x0002_0000  kernel command line     0x0009_fc00  EBDA: MP table
//! 0x0010_0000  high memory (bzImage)   0x0100_0000  vmlinux / probe (16 MiB)
//! 0xc000_0000 .. 0x1_0000_0000         32-bit MMIO hole (virtio-mmio, IOAPIC, LAPIC)
//! 0x1_0000_0000 ..                     RAM above 4 GiB when the VM has more than 3 GiB
//! ```

/// Global descriptor table: null, code64, data, TSS.
pub const GDT_START: u64 = 0x500;
/// Interrupt descriptor table (empty: the guest installs its own before enabling interrupts).
pub const IDT_START: u64 = 0x520;
/// Initial stack pointer handed to the kernel (the boot protocol does not require one).
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;
/// Zero page (`struct boot_params`).
pub const ZERO_PAGE_START: u64 = 0x7000;
/// Level-4 page map.
pub const PML4_START: u64 = 0x9000;
/// Page-directory-pointer table.
pub const PDPTE_START: u64 = 0xa000;
/// First page directory; directories for further GiBs follow contiguously.
pub const PDE_START: u64 = 0xb000;
/// Identity map at most this many GiB at boot (2 MiB pages); the kernel builds its own tables.
pub const MAX_IDENTITY_MAPPED_GIB: u64 = 16;
/// Kernel command line.
pub const CMDLINE_START: u64 = 0x2_0000;
/// Longest command line we accept (Linux x86 COMMAND_LINE_SIZE).
pub const CMDLINE_MAX_SIZE: usize = 2048;
/// Start of the extended BIOS data area; the MP table lives here.
pub const EBDA_START: u64 = 0x9_fc00;
/// End of conventional memory (640 KiB).
pub const LOW_MEMORY_END: u64 = 0xa_0000;
/// Start of high memory (1 MiB); bzImage protected-mode kernels load here.
pub const HIMEM_START: u64 = 0x10_0000;
/// Where vmlinux-style ELF kernels expect to be loaded.
pub const KERNEL_ELF_MIN_ADDR: u64 = HIMEM_START;

/// The 32-bit MMIO hole: no RAM between these addresses.
pub const MMIO_GAP_START: u64 = 0xc000_0000;
pub const MMIO_GAP_END: u64 = 0x1_0000_0000;
/// virtio-mmio device windows are allocated from here, one 4 KiB page each.
pub const VIRTIO_MMIO_BASE: u64 = 0xd000_0000;
pub const VIRTIO_MMIO_WINDOW: u64 = 0x1000;
/// Interrupt controllers (fixed by the x86 platform).
pub const IOAPIC_ADDR: u64 = 0xfec0_0000;
pub const APIC_ADDR: u64 = 0xfee0_0000;
/// KVM needs three pages for the TSS and one for the identity map (real-mode emulation on
/// hosts without unrestricted guest); keep them in the hole, below the IOAPIC.
pub const KVM_TSS_ADDR: u64 = 0xfffb_d000;
pub const KVM_IDENTITY_MAP_ADDR: u64 = 0xfffb_c000;

/// Legacy IRQ lines.
pub const SERIAL_IRQ: u32 = 4;
/// First GSI handed to virtio-mmio devices.
pub const VIRTIO_FIRST_IRQ: u32 = 5;
/// IOAPIC pins (and hence usable GSIs) of KVM's in-kernel IOAPIC.
pub const IOAPIC_PINS: u32 = 24;

/// One GiB, for page-table arithmetic.
pub const GIB: u64 = 1 << 30;
/// One MiB.
pub const MIB: u64 = 1 << 20;
