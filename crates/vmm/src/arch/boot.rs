//! Loading a kernel and writing the Linux x86_64 64-bit boot protocol structures:
//! zero page (boot_params) with the e820 map, the command line, an initrd, the GDT,
//! identity page tables and the MP table.
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::memory::GuestMemoryMmap;
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params};
use linux_loader::loader::elf::PvhBootCapability;
use linux_loader::loader::{BzImage, Elf, KernelLoader};
use vm_memory::{Bytes, GuestAddress};

use super::layout::*;
use super::{gdt, mptable, paging};

pub const E820_RAM: u32 = 1;
pub const E820_RESERVED: u32 = 2;
const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
const KERNEL_HDR_MAGIC: u32 = 0x5372_6448; // "HdrS"
const KERNEL_LOADER_OTHER: u8 = 0xff;
const KERNEL_MIN_ALIGNMENT: u32 = 0x0100_0000;
/// Offset of the 64-bit entry point in a bzImage's protected-mode kernel.
const BZIMAGE_64BIT_ENTRY_OFFSET: u64 = 0x200;

#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("cannot open kernel {path}: {source}")]
    OpenKernel {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is neither an ELF vmlinux nor a bzImage")]
    UnknownKernelFormat { path: PathBuf },
    #[error("cannot load kernel {path}: {source}")]
    LoadKernel {
        path: PathBuf,
        source: linux_loader::loader::Error,
    },
    #[error("cannot read initrd {path}: {source}")]
    Initrd {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("initrd ({size} bytes) does not fit between the kernel end ({kernel_end:#x}) and the top of low memory")]
    InitrdTooLarge { size: u64, kernel_end: u64 },
    #[error("kernel command line is {0} bytes; the limit is {CMDLINE_MAX_SIZE}")]
    CmdlineTooLong(usize),
    #[error("kernel command line contains a NUL byte")]
    CmdlineNul,
    #[error("kernel image does not fit in guest memory ({0})")]
    KernelTooLarge(String),
    #[error(transparent)]
    Mptable(#[from] mptable::MptableError),
    #[error("writing boot structures to guest memory failed: {0}")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
}

/// What the loader found: where to start the boot vCPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadedKernel {
    /// 64-bit entry point (rip).
    pub entry: u64,
    /// First byte after the loaded image.
    pub end: u64,
    /// PVH entry (from the ELF note), recorded for diagnostics: zygote enters through the
    /// 64-bit Linux boot protocol, which every x86_64 vmlinux and bzImage supports.
    pub pvh_entry: Option<u64>,
    pub format: KernelFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelFormat {
    Elf,
    BzImage,
}

/// The pieces of `boot_params.hdr` a bzImage carries and the zero page must repeat.
type SetupHeader = linux_loader::loader::bootparam::setup_header;

fn sniff_format(file: &mut File, path: &Path) -> Result<KernelFormat, BootError> {
    let open_err = |source| BootError::OpenKernel {
        path: path.to_path_buf(),
        source,
    };
    let mut magic = [0u8; 4];
    file.seek(SeekFrom::Start(0)).map_err(open_err)?;
    if file.read_exact(&mut magic).is_ok() && &magic == b"\x7fELF" {
        return Ok(KernelFormat::Elf);
    }
    let mut hdrs = [0u8; 4];
    if file.seek(SeekFrom::Start(0x202)).is_ok()
        && file.read_exact(&mut hdrs).is_ok()
        && u32::from_le_bytes(hdrs) == KERNEL_HDR_MAGIC
    {
        return Ok(KernelFormat::BzImage);
    }
    Err(BootError::UnknownKernelFormat {
        path: path.to_path_buf(),
    })
}

/// Load an ELF vmlinux (at its physical addresses) or a bzImage (at 1 MiB).
pub fn load_kernel(
    mem: &GuestMemoryMmap,
    path: &Path,
) -> Result<(LoadedKernel, Option<SetupHeader>), BootError> {
    let mut file = File::open(path).map_err(|source| BootError::OpenKernel {
        path: path.to_path_buf(),
        source,
    })?;
    let format = sniff_format(&mut file, path)?;
    let load_err = |source| BootError::LoadKernel {
        path: path.to_path_buf(),
        source,
    };
    match format {
        KernelFormat::Elf => {
            let r = Elf::load(
                mem,
                None,
                &mut file,
                Some(GuestAddress(KERNEL_ELF_MIN_ADDR)),
            )
            .map_err(load_err)?;
            let pvh_entry = match r.pvh_boot_cap {
                PvhBootCapability::PvhEntryPresent(a) => Some(a.0),
                _ => None,
            };
            Ok((
                LoadedKernel {
                    entry: r.kernel_load.0,
                    end: r.kernel_end,
                    pvh_entry,
                    format,
                },
                None,
            ))
        }
        KernelFormat::BzImage => {
            let r = BzImage::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START)))
                .map_err(load_err)?;
            Ok((
                LoadedKernel {
                    entry: r.kernel_load.0 + BZIMAGE_64BIT_ENTRY_OFFSET,
                    end: r.kernel_end,
                    pvh_entry: None,
                    format,
                },
                r.setup_header,
            ))
        }
    }
}

/// Validate a command line against the boot protocol's limits.
pub fn check_cmdline(cmdline: &str) -> Result<(), BootError> {
    if cmdline.as_bytes().contains(&0) {
        return Err(BootError::CmdlineNul);
    }
    // The terminating NUL must fit too.
    if cmdline.len() + 1 > CMDLINE_MAX_SIZE {
        return Err(BootError::CmdlineTooLong(cmdline.len()));
    }
    Ok(())
}

/// The e820 map for RAM split around the MMIO hole. The EBDA (MP table) is reserved.
pub fn e820_map(ram_ranges: &[(u64, u64)]) -> Vec<boot_e820_entry> {
    let entry = |addr, size, type_| boot_e820_entry {
        addr,
        size,
        r#type: type_,
    };
    let mut map = vec![
        entry(0, EBDA_START, E820_RAM),
        entry(EBDA_START, LOW_MEMORY_END - EBDA_START, E820_RESERVED),
    ];
    for &(start, size) in ram_ranges {
        let end = start + size;
        // Skip the legacy VGA/BIOS area below 1 MiB: only conventional memory is RAM there.
        let start = start.max(HIMEM_START);
        if end > start {
            map.push(entry(start, end - start, E820_RAM));
        }
    }
    map
}

/// Where an initrd of `size` bytes goes: as high as possible in low RAM, page aligned,
/// above the kernel.
pub fn initrd_address(low_ram_end: u64, kernel_end: u64, size: u64) -> Result<u64, BootError> {
    let top = low_ram_end.min(MMIO_GAP_START);
    let addr = top
        .checked_sub(size)
        .map(|a| a & !0xfff)
        .filter(|&a| a >= kernel_end.next_multiple_of(0x1000))
        .ok_or(BootError::InitrdTooLarge { size, kernel_end })?;
    Ok(addr)
}

/// Everything `write_boot_structures` needs.
pub struct BootSetup<'a> {
    pub cmdline: &'a str,
    pub num_cpus: u8,
    pub ram_ranges: &'a [(u64, u64)],
    pub kernel: LoadedKernel,
    pub setup_header: Option<SetupHeader>,
    pub initrd: Option<(u64, u64)>,
}

/// Build the zero page contents (pure, for testing).
pub fn zero_page(setup: &BootSetup) -> boot_params {
    let mut params = boot_params::default();
    if let Some(hdr) = setup.setup_header {
        params.hdr = hdr;
    }
    params.hdr.type_of_loader = KERNEL_LOADER_OTHER;
    params.hdr.boot_flag = KERNEL_BOOT_FLAG_MAGIC;
    params.hdr.header = KERNEL_HDR_MAGIC;
    params.hdr.cmd_line_ptr = CMDLINE_START as u32;
    params.hdr.cmdline_size = CMDLINE_MAX_SIZE as u32;
    if params.hdr.kernel_alignment == 0 {
        params.hdr.kernel_alignment = KERNEL_MIN_ALIGNMENT;
    }
    if let Some((addr, size)) = setup.initrd {
        params.hdr.ramdisk_image = addr as u32;
        params.hdr.ramdisk_size = size as u32;
    }
    let map = e820_map(setup.ram_ranges);
    for (slot, e) in params.e820_table.iter_mut().zip(map.iter()) {
        *slot = *e;
    }
    params.e820_entries = map.len() as u8;
    params
}

/// Write GDT, page tables, MP table, command line and zero page into guest memory.
pub fn write_boot_structures(mem: &GuestMemoryMmap, setup: &BootSetup) -> Result<(), BootError> {
    check_cmdline(setup.cmdline)?;
    let mut cmdline = setup.cmdline.as_bytes().to_vec();
    cmdline.push(0);
    mem.write_slice(&cmdline, GuestAddress(CMDLINE_START))?;

    for (i, d) in gdt::boot_gdt().iter().enumerate() {
        mem.write_obj(*d, GuestAddress(GDT_START + i as u64 * 8))?;
    }
    mem.write_obj(0u64, GuestAddress(IDT_START))?;

    let ram_end = setup
        .ram_ranges
        .last()
        .map(|(s, l)| s + l)
        .unwrap_or_default();
    for page in paging::identity_tables(ram_end) {
        let bytes: Vec<u8> = page.entries.iter().flat_map(|e| e.to_le_bytes()).collect();
        mem.write_slice(&bytes, GuestAddress(page.guest_addr))?;
    }

    mem.write_slice(&mptable::build(setup.num_cpus)?, GuestAddress(EBDA_START))?;
    mem.write_obj(zero_page(setup), GuestAddress(ZERO_PAGE_START))?;
    Ok(())
}

/// Load an initrd file into guest memory above the kernel; returns (address, size).
pub fn load_initrd(
    mem: &GuestMemoryMmap,
    path: &Path,
    low_ram_end: u64,
    kernel_end: u64,
) -> Result<(u64, u64), BootError> {
    let err = |source| BootError::Initrd {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(err)?;
    let size = file.metadata().map_err(err)?.len();
    let addr = initrd_address(low_ram_end, kernel_end, size)?;
    mem.read_exact_volatile_from(GuestAddress(addr), &mut file, size as usize)
        .map_err(|e| BootError::KernelTooLarge(e.to_string()))?;
    Ok((addr, size))
}

#[cfg(test)]
#[path = "boot_tests.rs"]
mod tests;
