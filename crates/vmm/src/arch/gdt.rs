//! Boot GDT: the descriptors the 64-bit boot protocol requires (flat code/data), plus a
//! TSS descriptor because VMX refuses to enter a guest whose TR is unusable.
use kvm_bindings::kvm_segment;

/// Selector indices.
pub const CODE_INDEX: u16 = 1;
pub const DATA_INDEX: u16 = 2;
pub const TSS_INDEX: u16 = 3;

/// Build a legacy 8-byte segment descriptor from its flags word, base and limit.
/// `flags` packs access byte (bits 0-7) and the G/DB/L/AVL nibble (bits 12-15), the
/// layout used by the Intel SDM's figure of a descriptor's upper dword.
pub const fn descriptor(flags: u16, base: u32, limit: u32) -> u64 {
    ((base as u64 & 0xff00_0000) << 32)
        | ((flags as u64 & 0xf0ff) << 40)
        | ((limit as u64 & 0x000f_0000) << 32)
        | ((base as u64 & 0x00ff_ffff) << 16)
        | (limit as u64 & 0x0000_ffff)
}

/// The boot GDT: null, 64-bit code (present, DPL0, exec/read, L=1, G=1), data
/// (present, DPL0, read/write, DB=1, G=1), 64-bit TSS (present, busy).
pub fn boot_gdt() -> [u64; 4] {
    [
        0,
        descriptor(0xa09b, 0, 0xfffff),
        descriptor(0xc093, 0, 0xfffff),
        descriptor(0x808b, 0, 0xfffff),
    ]
}

/// Decode a descriptor into the form KVM_SET_SREGS takes.
pub fn segment_from_descriptor(entry: u64, table_index: u16) -> kvm_segment {
    let base = ((entry >> 16) & 0x00ff_ffff) | ((entry >> 32) & 0xff00_0000);
    let mut limit = ((entry & 0xffff) | ((entry >> 32) & 0x000f_0000)) as u32;
    let granularity = ((entry >> 55) & 1) as u8;
    if granularity == 1 {
        // Scaled by 4 KiB: KVM wants the byte limit.
        limit = (limit << 12) | 0xfff;
    }
    kvm_segment {
        base,
        limit,
        selector: table_index * 8,
        type_: ((entry >> 40) & 0xf) as u8,
        present: ((entry >> 47) & 1) as u8,
        dpl: ((entry >> 45) & 0x3) as u8,
        db: ((entry >> 54) & 1) as u8,
        s: ((entry >> 44) & 1) as u8,
        l: ((entry >> 53) & 1) as u8,
        g: granularity,
        avl: ((entry >> 52) & 1) as u8,
        unusable: if (entry >> 47) & 1 == 0 { 1 } else { 0 },
        padding: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_segment_is_long_mode_flat() {
        let gdt = boot_gdt();
        let cs = segment_from_descriptor(gdt[CODE_INDEX as usize], CODE_INDEX);
        assert_eq!(cs.selector, 0x8);
        assert_eq!((cs.l, cs.db, cs.present, cs.dpl, cs.s), (1, 0, 1, 0, 1));
        assert_eq!(cs.type_, 0xb);
        assert_eq!(cs.limit, 0xffff_ffff);
        assert_eq!(cs.base, 0);
    }

    #[test]
    fn data_and_tss_segments() {
        let gdt = boot_gdt();
        let ds = segment_from_descriptor(gdt[DATA_INDEX as usize], DATA_INDEX);
        assert_eq!((ds.selector, ds.type_, ds.db, ds.l), (0x10, 0x3, 1, 0));
        let tr = segment_from_descriptor(gdt[TSS_INDEX as usize], TSS_INDEX);
        assert_eq!(
            (tr.selector, tr.type_, tr.s, tr.unusable),
            (0x18, 0xb, 0, 0)
        );
    }

    #[test]
    fn descriptor_round_trips_base_and_limit() {
        let d = descriptor(0x4093, 0x1234_5678, 0xabcde);
        let seg = segment_from_descriptor(d, 5);
        assert_eq!(seg.base, 0x1234_5678);
        assert_eq!(seg.limit, 0xabcde);
        assert_eq!(seg.g, 0);
        assert_eq!(seg.db, 1);
    }
}
