//! Load the guest kernel zygote builds (ELF vmlinux with its PVH note, and bzImage)
//! through the VMM's loader. Needs the cached kernel (`make guest` builds it); skips with
//! a reason when it has not been built.
use std::io::Write;
use std::path::PathBuf;

use zygote_vmm::arch::boot::{self, KernelFormat};
use zygote_vmm::memory::GuestRam;

fn newest_kernel_dir() -> Option<PathBuf> {
    let cache = std::env::var_os("ZYGOTE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/zygote")))?;
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(cache.join("kernel"))
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("vmlinux").is_file() && p.join("bzImage").is_file())
        .collect();
    dirs.sort_by_key(|p| {
        std::fs::metadata(p.join("vmlinux"))
            .and_then(|m| m.modified())
            .ok()
    });
    dirs.pop()
}

#[test]
fn loads_vmlinux_with_pvh_note_and_bzimage() {
    let Some(dir) = newest_kernel_dir() else {
        let _ = writeln!(
            std::io::stderr(),
            "skipping loads_vmlinux_with_pvh_note_and_bzimage: no kernel in ~/.cache/zygote/kernel (run make guest)"
        );
        return;
    };
    let ram = GuestRam::new(256, u64::MAX).unwrap();
    let (elf, hdr) = boot::load_kernel(ram.memory(), &dir.join("vmlinux")).unwrap();
    assert_eq!(elf.format, KernelFormat::Elf);
    assert!(hdr.is_none());
    assert!(elf.entry >= 0x100_0000, "vmlinux entry {:#x}", elf.entry);
    assert!(elf.end > elf.entry);
    assert!(
        elf.pvh_entry.is_some(),
        "zygote's kernel is built with CONFIG_PVH"
    );

    let ram = GuestRam::new(256, u64::MAX).unwrap();
    let (bz, hdr) = boot::load_kernel(ram.memory(), &dir.join("bzImage")).unwrap();
    assert_eq!(bz.format, KernelFormat::BzImage);
    assert_eq!(
        bz.entry,
        0x10_0000 + 0x200,
        "64-bit entry of the protected-mode kernel"
    );
    let hdr = hdr.expect("bzImage carries a setup header");
    assert_eq!({ hdr.header }, 0x5372_6448);
    assert!(
        { hdr.version } >= 0x020c,
        "64-bit boot protocol needs 2.12+"
    );
}
