//! Read-only view of `struct boot_params` (the "zero page") as the Linux x86
//! boot protocol lays it out (Documentation/arch/x86/zero-page.rst, boot.rst).
//! Only the fields the probe checks are named.

use core::ptr::read_unaligned;

pub const OFF_EXT_CMD_LINE_PTR: usize = 0x0c8;
pub const OFF_E820_ENTRIES: usize = 0x1e8;
pub const OFF_BOOT_FLAG: usize = 0x1fe;
pub const OFF_HEADER: usize = 0x202;
pub const OFF_CMD_LINE_PTR: usize = 0x228;
pub const OFF_CMDLINE_SIZE: usize = 0x238;
pub const OFF_E820_TABLE: usize = 0x2d0;

pub const BOOT_FLAG: u16 = 0xaa55;
/// "HdrS" read as a little-endian u32.
pub const HEADER_MAGIC: u32 = u32::from_le_bytes(*b"HdrS");
/// Capacity of e820_table in the zero page (E820_MAX_ENTRIES_ZEROPAGE).
pub const E820_MAX_ENTRIES: usize = 128;
pub const E820_ENTRY_SIZE: usize = 20;
pub const E820_RAM: u32 = 1;

#[derive(Clone, Copy)]
pub struct ZeroPage(pub *const u8);

#[derive(Clone, Copy)]
pub struct E820Entry {
    pub addr: u64,
    pub size: u64,
    pub kind: u32,
}

impl E820Entry {
    /// End address (exclusive); None if addr + size overflows.
    pub fn end(&self) -> Option<u64> {
        self.addr.checked_add(self.size)
    }
    pub fn is_ram(&self) -> bool {
        self.kind == E820_RAM
    }
}

impl ZeroPage {
    // SAFETY (all readers): the caller validated that the zero page lies in
    // identity-mapped memory; offsets are within its 4 KiB.
    fn read<T: Copy>(&self, off: usize) -> T {
        unsafe { read_unaligned(self.0.add(off) as *const T) }
    }
    pub fn boot_flag(&self) -> u16 {
        self.read(OFF_BOOT_FLAG)
    }
    pub fn header(&self) -> u32 {
        self.read(OFF_HEADER)
    }
    pub fn e820_entries(&self) -> usize {
        self.read::<u8>(OFF_E820_ENTRIES) as usize
    }
    /// Entry `i` of e820_table; `i` must be < E820_MAX_ENTRIES.
    pub fn e820(&self, i: usize) -> E820Entry {
        let off = OFF_E820_TABLE + i * E820_ENTRY_SIZE;
        E820Entry {
            addr: self.read(off),
            size: self.read(off + 8),
            kind: self.read(off + 16),
        }
    }
    /// hdr.cmd_line_ptr, extended by ext_cmd_line_ptr as bits 32..63.
    pub fn cmd_line_ptr(&self) -> u64 {
        self.read::<u32>(OFF_CMD_LINE_PTR) as u64
            | (self.read::<u32>(OFF_EXT_CMD_LINE_PTR) as u64) << 32
    }
    /// Maximum command-line length, not counting the terminating NUL.
    pub fn cmdline_size(&self) -> u32 {
        self.read(OFF_CMDLINE_SIZE)
    }
}
