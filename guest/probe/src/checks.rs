//! The boot checks every scenario starts with: what the VMM's Linux boot path
//! must have set up. Each check prints one `check <name> ok ...` line, or returns
//! a `Fail` that main reports.

use crate::bootparams::{ZeroPage, BOOT_FLAG, E820_MAX_ENTRIES, HEADER_MAGIC};
use crate::cmdline;
use crate::serial::Hex;
use crate::{arch, say};
use core::ptr::{read_volatile, write_volatile};
use zygote_probe_abi::{
    CMDLINE_MEM_MIB, CMDLINE_SCENARIO, CMDLINE_TOKEN, CMDLINE_VCPUS, IDENTITY_MAP_MAX, MAILBOX_GPA,
    MMIO_HOLE_END, MMIO_HOLE_START, SCRATCH_EXTRA_ENTRY,
};

const MIB: u64 = 1 << 20;
const PAGE_2M: u64 = 2 * MIB;
/// Legacy low-memory limit: conventional RAM ends at 640 KiB.
const LOW_MEM_END: u64 = 0xa_0000;
/// e820 RAM may fall short of probe.mem_mib by this much (the VMM keeps the
/// 640 KiB..1 MiB legacy hole and may reserve a few pages), but never exceed it.
const RAM_SHORTFALL_MAX: u64 = 8 * MIB;

/// A failed check: which check, what went wrong, and an optional number.
pub struct Fail {
    pub check: &'static str,
    pub what: &'static str,
    pub value: Option<u64>,
}

pub fn fail(check: &'static str, what: &'static str) -> Fail {
    Fail {
        check,
        what,
        value: None,
    }
}

pub fn fail_with(check: &'static str, what: &'static str, value: u64) -> Fail {
    Fail {
        check,
        what,
        value: Some(value),
    }
}

/// What the boot checks learned, for the scenarios (not every scenario reads
/// every field yet).
#[allow(dead_code)]
pub struct BootInfo {
    pub zero_page: ZeroPage,
    pub cmdline: &'static [u8],
    /// `probe.scenario=` value, `boot` if absent.
    pub scenario: &'static [u8],
    pub mem_mib: Option<u64>,
    pub vcpus: Option<u64>,
    pub apic_id: u32,
    pub ram_bytes: u64,
    /// End of the highest e820 RAM entry.
    pub ram_top: u64,
    /// RAM below this is identity-mapped (VMM convention).
    pub mapped_limit: u64,
}

extern "C" {
    // Linker-script symbols bounding the probe's own image (code, data, bss, stack).
    static __image_start: u8;
    static __image_end: u8;
}

fn image_range() -> (u64, u64) {
    // Taking the address of an extern static is safe; only reads would not be.
    (
        core::ptr::addr_of!(__image_start) as u64,
        core::ptr::addr_of!(__image_end) as u64,
    )
}

pub fn run(zero_page: u64) -> Result<BootInfo, Fail> {
    let zp = boot_signature(zero_page)?;
    let (cmdline, scenario, mem_mib, vcpus) = cmdline_check(zp)?;
    let (ram_bytes, ram_top) = e820(zp, mem_mib)?;
    let mapped_limit = ram_top.clamp(MMIO_HOLE_END, IDENTITY_MAP_MAX);
    let apic_id = apic_id()?;
    memory(zp, mapped_limit)?;
    Ok(BootInfo {
        zero_page: zp,
        cmdline,
        scenario,
        mem_mib,
        vcpus,
        apic_id,
        ram_bytes,
        ram_top,
        mapped_limit,
    })
}

fn boot_signature(zero_page: u64) -> Result<ZeroPage, Fail> {
    const C: &str = "boot_signature";
    // The first 4 GiB are always identity-mapped: anything else (or 0) cannot be
    // read without risking a page fault, which would triple-fault.
    if zero_page == 0 || zero_page > MMIO_HOLE_END - 4096 {
        return Err(fail_with(
            C,
            "zero page pointer (rsi) out of range",
            zero_page,
        ));
    }
    let zp = ZeroPage(zero_page as *const u8);
    if zp.boot_flag() != BOOT_FLAG {
        return Err(fail_with(
            C,
            "hdr.boot_flag is not 0xaa55",
            zp.boot_flag() as u64,
        ));
    }
    if zp.header() != HEADER_MAGIC {
        return Err(fail_with(C, "hdr.header is not HdrS", zp.header() as u64));
    }
    say!(
        "check boot_signature ok zero_page=",
        Hex(zero_page),
        " boot_flag=",
        Hex(BOOT_FLAG as u64),
        " header=HdrS"
    );
    Ok(zp)
}

type CmdlineInfo = (&'static [u8], &'static [u8], Option<u64>, Option<u64>);

fn cmdline_check(zp: ZeroPage) -> Result<CmdlineInfo, Fail> {
    const C: &str = "cmdline";
    let ptr = zp.cmd_line_ptr();
    let max = zp.cmdline_size() as u64;
    if ptr == 0 {
        return Err(fail(C, "cmd_line_ptr is 0"));
    }
    if max == 0 || max > MIB {
        return Err(fail_with(C, "hdr.cmdline_size implausible", max));
    }
    if ptr
        .checked_add(max + 1)
        .is_none_or(|end| end > MMIO_HOLE_END)
    {
        return Err(fail_with(C, "command line not in the first 4 GiB", ptr));
    }
    // cmdline_size excludes the NUL, so the NUL may sit at index cmdline_size.
    // SAFETY: the range was checked to lie in identity-mapped memory below 4 GiB.
    let window = unsafe { core::slice::from_raw_parts(ptr as *const u8, max as usize + 1) };
    let Some(len) = window.iter().position(|&b| b == 0) else {
        return Err(fail_with(C, "not NUL-terminated within cmdline_size", max));
    };
    let line = &window[..len];
    say!("info cmdline ", line);
    let p = cmdline::scan(
        line,
        CMDLINE_TOKEN,
        CMDLINE_SCENARIO,
        CMDLINE_MEM_MIB,
        CMDLINE_VCPUS,
    );
    if !p.token {
        return Err(fail(C, "probe.token missing or damaged"));
    }
    let scenario = p.scenario.unwrap_or(b"boot");
    let number = |v: Option<&[u8]>, what: &'static str| -> Result<Option<u64>, Fail> {
        match v {
            None => Ok(None),
            Some(v) => cmdline::parse_u64(v).map(Some).ok_or(fail(C, what)),
        }
    };
    let mem_mib = number(p.mem_mib, "probe.mem_mib is not a number")?;
    let vcpus = number(p.vcpus, "probe.vcpus is not a number")?;
    say!(
        "check cmdline ok addr=",
        Hex(ptr),
        " len=",
        len,
        " max=",
        max
    );
    Ok((line, scenario, mem_mib, vcpus))
}

fn e820(zp: ZeroPage, mem_mib: Option<u64>) -> Result<(u64, u64), Fail> {
    const C: &str = "e820";
    let n = zp.e820_entries();
    if n == 0 || n > E820_MAX_ENTRIES {
        return Err(fail_with(C, "e820_entries out of range", n as u64));
    }
    let (img_start, img_end) = image_range();
    let (mut ram, mut top, mut prev_end) = (0u64, 0u64, 0u64);
    let (mut low_ok, mut high_ok, mut image_ok) = (false, false, false);
    for i in 0..n {
        let e = zp.e820(i);
        let Some(end) = e.end().filter(|_| e.size != 0) else {
            return Err(fail_with(C, "empty or overflowing entry", i as u64));
        };
        if i > 0 && e.addr < prev_end {
            return Err(fail_with(C, "entries unsorted or overlapping at", e.addr));
        }
        prev_end = end;
        if !e.is_ram() {
            continue;
        }
        if e.addr < MMIO_HOLE_END && end > MMIO_HOLE_START {
            return Err(fail_with(C, "RAM overlaps the MMIO hole at", e.addr));
        }
        ram += e.size;
        top = end;
        // Low RAM must hold the mailbox page (and the AP trampoline below it).
        low_ok |= e.addr <= MAILBOX_GPA && (MAILBOX_GPA + 4096..=LOW_MEM_END).contains(&end);
        high_ok |= e.addr >= MIB;
        image_ok |= e.addr <= img_start && img_end <= end;
    }
    if !low_ok {
        return Err(fail(C, "no RAM below 640 KiB holding the mailbox page"));
    }
    if !high_ok {
        return Err(fail(C, "no RAM at or above 1 MiB"));
    }
    if !image_ok {
        return Err(fail_with(
            C,
            "probe image not inside a RAM entry",
            img_start,
        ));
    }
    if let Some(m) = mem_mib {
        let want = m.saturating_mul(MIB);
        if ram > want || ram + RAM_SHORTFALL_MAX < want {
            return Err(fail_with(
                C,
                "RAM total (KiB) does not match probe.mem_mib",
                ram >> 10,
            ));
        }
    }
    say!(
        "check e820 ok entries=",
        n,
        " ram_mib=",
        (ram + MIB / 2) >> 20,
        " top_mib=",
        top >> 20
    );
    Ok((ram, top))
}

fn apic_id() -> Result<u32, Fail> {
    const C: &str = "apic_id";
    let id = arch::apic_id();
    if id != 0 {
        return Err(fail_with(C, "BSP APIC id is not 0", id as u64));
    }
    let extra = crate::mailbox::scratch(SCRATCH_EXTRA_ENTRY);
    if extra != 0 {
        return Err(fail_with(
            C,
            "APs entered the 64-bit entry point, APIC id mask",
            extra,
        ));
    }
    say!("check apic_id ok id=", id);
    Ok(id)
}

/// A distinct value per address: multiplying by an odd constant is a bijection
/// on u64, so different addresses can never produce the same pattern.
fn pattern(addr: u64) -> u64 {
    addr.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5a59_474f_5445_5052
}

/// Calls `f(page)` for every 2 MiB page of e820 RAM at or above 1 MiB, below
/// `limit`, that does not overlap the probe image.
fn for_each_test_page(zp: ZeroPage, limit: u64, mut f: impl FnMut(u64)) {
    let (img_start, img_end) = image_range();
    for i in 0..zp.e820_entries() {
        let e = zp.e820(i);
        if !e.is_ram() {
            continue;
        }
        let start = e.addr.max(MIB).next_multiple_of(PAGE_2M);
        let end = e.end().unwrap_or(u64::MAX).min(limit) & !(PAGE_2M - 1);
        let mut page = start;
        while page < end {
            if !(page < img_end && img_start < page + PAGE_2M) {
                f(page);
            }
            page += PAGE_2M;
        }
    }
}

/// Writes a pattern at the first and last u64 of each testable 2 MiB page, then
/// reads all back. Two words per page (not every 4 KiB page): the first touch of
/// a page costs ~10 us on the shadow-paging host.
fn memory(zp: ZeroPage, limit: u64) -> Result<(), Fail> {
    const C: &str = "memory";
    let mut pages = 0u64;
    for_each_test_page(zp, limit, |page| {
        let last = page + PAGE_2M - 8;
        // SAFETY: the page is e820 RAM below the identity-mapped limit and not
        // part of the probe; nothing else lives above 1 MiB.
        unsafe {
            write_volatile(page as *mut u64, pattern(page));
            write_volatile(last as *mut u64, pattern(last));
        }
        pages += 1;
    });
    if pages == 0 {
        return Err(fail(C, "no 2 MiB RAM page to test"));
    }
    let mut bad = None;
    for_each_test_page(zp, limit, |page| {
        let last = page + PAGE_2M - 8;
        // SAFETY: as above.
        let ok = unsafe {
            read_volatile(page as *const u64) == pattern(page)
                && read_volatile(last as *const u64) == pattern(last)
        };
        if !ok && bad.is_none() {
            bad = Some(page);
        }
    });
    if let Some(page) = bad {
        return Err(fail_with(C, "pattern mismatch in 2 MiB page", page));
    }
    say!("check memory ok pages=", pages, " limit_mib=", limit >> 20);
    Ok(())
}
