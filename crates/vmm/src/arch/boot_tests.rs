use super::*;
use crate::memory::ram_ranges;

#[test]
fn e820_small_vm() {
    let map = e820_map(&ram_ranges(256 * MIB));
    let rows: Vec<(u64, u64, u32)> = map.iter().map(|e| (e.addr, e.size, e.r#type)).collect();
    assert_eq!(
        rows,
        vec![
            (0, EBDA_START, E820_RAM),
            (EBDA_START, LOW_MEMORY_END - EBDA_START, E820_RESERVED),
            (HIMEM_START, 256 * MIB - HIMEM_START, E820_RAM),
        ]
    );
}

#[test]
fn e820_large_vm_skips_the_hole() {
    let map = e820_map(&ram_ranges(4096 * MIB));
    let ram: u64 = map
        .iter()
        .filter(|e| e.r#type == E820_RAM)
        .map(|e| e.size)
        .sum();
    // Everything but the EBDA..1 MiB gap is reported as RAM.
    assert_eq!(ram, 4096 * MIB - (HIMEM_START - EBDA_START));
    for e in &map {
        let end = e.addr + e.size;
        assert!(end <= MMIO_GAP_START || e.addr >= MMIO_GAP_END, "{:#x}", {
            e.addr
        });
    }
    assert_eq!({ map.last().unwrap().addr }, MMIO_GAP_END);
    // Sorted, non-overlapping.
    for w in map.windows(2) {
        assert!(w[0].addr + w[0].size <= w[1].addr);
    }
}

#[test]
fn cmdline_limits() {
    assert!(check_cmdline("console=ttyS0").is_ok());
    assert!(matches!(check_cmdline("a\0b"), Err(BootError::CmdlineNul)));
    let long = "x".repeat(CMDLINE_MAX_SIZE);
    assert!(matches!(
        check_cmdline(&long),
        Err(BootError::CmdlineTooLong(_))
    ));
    assert!(check_cmdline(&"x".repeat(CMDLINE_MAX_SIZE - 1)).is_ok());
}

#[test]
fn initrd_goes_high_and_never_overlaps_the_kernel() {
    let addr = initrd_address(256 * MIB, 20 * MIB, 4 * MIB + 5).unwrap();
    assert_eq!(addr % 0x1000, 0);
    assert!(addr + 4 * MIB + 5 <= 256 * MIB);
    assert!(addr >= 20 * MIB);
    assert!(initrd_address(256 * MIB, 200 * MIB, 100 * MIB).is_err());
    // Never above the MMIO hole even with lots of RAM.
    let addr = initrd_address(MMIO_GAP_START, 20 * MIB, MIB).unwrap();
    assert!(addr + MIB <= MMIO_GAP_START);
}

fn test_setup<'a>(ranges: &'a [(u64, u64)], cmdline: &'a str) -> BootSetup<'a> {
    BootSetup {
        cmdline,
        num_cpus: 2,
        ram_ranges: ranges,
        kernel: LoadedKernel {
            entry: 0x100_0000,
            end: 0x200_0000,
            pvh_entry: None,
            format: KernelFormat::Elf,
        },
        setup_header: None,
        initrd: Some((0x800_0000, 0x1000)),
    }
}

#[test]
fn zero_page_fields() {
    let ranges = ram_ranges(256 * MIB);
    let zp = zero_page(&test_setup(&ranges, "console=ttyS0"));
    assert_eq!({ zp.hdr.boot_flag }, 0xaa55);
    assert_eq!({ zp.hdr.header }, 0x5372_6448);
    assert_eq!({ zp.hdr.cmd_line_ptr }, CMDLINE_START as u32);
    assert_eq!({ zp.hdr.type_of_loader }, 0xff);
    assert_eq!({ zp.hdr.ramdisk_image }, 0x800_0000);
    assert_eq!(zp.e820_entries, 3);
}

#[test]
fn boot_structures_land_in_guest_memory() {
    let ram = crate::memory::GuestRam::new(64, u64::MAX).unwrap();
    let ranges: Vec<(u64, u64)> = ram
        .ranges()
        .iter()
        .map(|r| (r.guest_addr, r.size))
        .collect();
    write_boot_structures(ram.memory(), &test_setup(&ranges, "root=/dev/vda quiet")).unwrap();
    let mut buf = [0u8; 20];
    ram.memory()
        .read_slice(&mut buf, GuestAddress(CMDLINE_START))
        .unwrap();
    assert_eq!(&buf, b"root=/dev/vda quiet\0");
    let mut mp = [0u8; 4];
    ram.memory()
        .read_slice(&mut mp, GuestAddress(EBDA_START))
        .unwrap();
    assert_eq!(&mp, b"_MP_");
    let flag: u16 = ram
        .memory()
        .read_obj(GuestAddress(ZERO_PAGE_START + 0x1fe))
        .unwrap();
    assert_eq!(flag, 0xaa55);
    let e820_count: u8 = ram
        .memory()
        .read_obj(GuestAddress(ZERO_PAGE_START + 0x1e8))
        .unwrap();
    assert_eq!(e820_count, 3);
    let pml4e: u64 = ram.memory().read_obj(GuestAddress(PML4_START)).unwrap();
    assert_eq!(pml4e & !0xfff, PDPTE_START);
}

#[test]
fn missing_and_corrupt_kernels_are_clear_errors() {
    let ram = crate::memory::GuestRam::new(64, u64::MAX).unwrap();
    let err = load_kernel(ram.memory(), Path::new("/nonexistent/vmlinux")).unwrap_err();
    assert!(matches!(err, BootError::OpenKernel { .. }), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk");
    std::fs::write(&junk, vec![0x42u8; 4096]).unwrap();
    let err = load_kernel(ram.memory(), &junk).unwrap_err();
    assert!(
        matches!(err, BootError::UnknownKernelFormat { .. }),
        "{err}"
    );
    let truncated = dir.path().join("truncated-elf");
    std::fs::write(&truncated, b"\x7fELF\x02\x01\x01").unwrap();
    let err = load_kernel(ram.memory(), &truncated).unwrap_err();
    assert!(matches!(err, BootError::LoadKernel { .. }), "{err}");
}

/// A minimal image in the bzImage format: boot sector + setup sectors with a valid
/// setup header, then the protected-mode payload.
fn fake_bzimage(setup_sects: u8, payload: &[u8]) -> Vec<u8> {
    let mut img = vec![0u8; (setup_sects as usize + 1) * 512];
    img[0x1f1] = setup_sects;
    img[0x1fe..0x200].copy_from_slice(&0xaa55u16.to_le_bytes());
    img[0x202..0x206].copy_from_slice(b"HdrS");
    img[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes()); // protocol 2.15
    img[0x211] = 1; // loadflags: LOADED_HIGH
    img[0x214..0x218].copy_from_slice(&0x10_0000u32.to_le_bytes()); // code32_start
    img.extend_from_slice(payload);
    img
}

#[test]
fn loads_a_bzimage_at_1_mib_with_its_setup_header() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bzImage");
    let payload: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, fake_bzimage(4, &payload)).unwrap();
    let ram = crate::memory::GuestRam::new(64, u64::MAX).unwrap();
    let (k, hdr) = load_kernel(ram.memory(), &path).unwrap();
    assert_eq!(k.format, KernelFormat::BzImage);
    assert_eq!(k.entry, HIMEM_START + 0x200);
    let mut loaded = vec![0u8; payload.len()];
    ram.memory()
        .read_slice(&mut loaded, GuestAddress(HIMEM_START))
        .unwrap();
    assert_eq!(loaded, payload, "protected-mode payload lands at 1 MiB");
    // The zero page repeats the image's setup header under the loader's own fields.
    let ranges = crate::memory::ram_ranges(64 * MIB);
    let mut setup = test_setup(&ranges, "console=ttyS0");
    setup.setup_header = hdr;
    let zp = zero_page(&setup);
    assert_eq!({ zp.hdr.version }, 0x020f);
    assert_eq!({ zp.hdr.code32_start }, 0x10_0000);
    assert_eq!({ zp.hdr.type_of_loader }, 0xff);
    assert_eq!({ zp.hdr.cmd_line_ptr }, CMDLINE_START as u32);
}

#[test]
fn rejects_an_old_protocol_bzimage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("zImage");
    let mut img = fake_bzimage(4, &[0u8; 1024]);
    img[0x211] = 0; // not loaded high: a zImage
    std::fs::write(&path, img).unwrap();
    let ram = crate::memory::GuestRam::new(64, u64::MAX).unwrap();
    let err = load_kernel(ram.memory(), &path).unwrap_err();
    assert!(matches!(err, BootError::LoadKernel { .. }), "{err}");
}
