//! Intel MultiProcessor Specification 1.4 tables: how a Linux guest learns the number of
//! vCPUs, their APIC ids and the IOAPIC routing (we have no ACPI).
//!
//! Layout in the EBDA: floating pointer (16 bytes), then the configuration table
//! (header, processor entries, one ISA bus, the IOAPIC, I/O interrupt entries for every
//! IOAPIC pin, and local interrupt entries wiring LINT0 to ExtINT and LINT1 to NMI).
use super::layout::{APIC_ADDR, EBDA_START, IOAPIC_ADDR, IOAPIC_PINS, LOW_MEMORY_END};

/// Largest vCPU count whose MP table fits in the 1 KiB EBDA.
pub const MAX_VCPUS: u8 = 32;

const APIC_VERSION: u8 = 0x14;
const IOAPIC_VERSION: u8 = 0x11;
const CPU_ENABLED: u8 = 1;
const CPU_BOOTSTRAP: u8 = 2;
const CPU_SIGNATURE: u32 = (6 << 8) | (1 << 4); // family 6 model 1: any modern x86 value works
const CPU_FEATURES: u32 = (1 << 0) | (1 << 9); // FPU | APIC present
const INT_TYPE_INT: u8 = 0;
const INT_TYPE_NMI: u8 = 1;
const INT_TYPE_EXTINT: u8 = 3;
const ISA_BUS_ID: u8 = 0;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MptableError {
    #[error("{0} vCPUs do not fit the MP table (at most {MAX_VCPUS})")]
    TooManyCpus(u8),
    #[error("at least one vCPU is required")]
    NoCpus,
}

fn checksum(bytes: &[u8]) -> u8 {
    let sum = bytes.iter().fold(0u8, |acc, b| acc.wrapping_add(*b));
    0u8.wrapping_sub(sum)
}

/// Build the MP floating pointer plus configuration table, to be written at
/// [`EBDA_START`]. Returns the bytes.
pub fn build(num_cpus: u8) -> Result<Vec<u8>, MptableError> {
    if num_cpus == 0 {
        return Err(MptableError::NoCpus);
    }
    if num_cpus > MAX_VCPUS {
        return Err(MptableError::TooManyCpus(num_cpus));
    }
    let table_addr = EBDA_START as u32 + 16;
    let ioapic_id = num_cpus; // APIC ids 0..n-1 belong to CPUs

    let mut entries: Vec<u8> = Vec::new();
    let mut count: u16 = 0;
    for cpu in 0..num_cpus {
        let flags = CPU_ENABLED | if cpu == 0 { CPU_BOOTSTRAP } else { 0 };
        entries.extend_from_slice(&[0, cpu, APIC_VERSION, flags]);
        entries.extend_from_slice(&CPU_SIGNATURE.to_le_bytes());
        entries.extend_from_slice(&CPU_FEATURES.to_le_bytes());
        entries.extend_from_slice(&[0; 8]);
        count += 1;
    }
    entries.extend_from_slice(&[1, ISA_BUS_ID]);
    entries.extend_from_slice(b"ISA   ");
    count += 1;
    entries.extend_from_slice(&[2, ioapic_id, IOAPIC_VERSION, CPU_ENABLED]);
    entries.extend_from_slice(&(IOAPIC_ADDR as u32).to_le_bytes());
    count += 1;
    for pin in 0..IOAPIC_PINS as u8 {
        // Conforming polarity/trigger (flags 0): ISA defaults, edge/high.
        entries.extend_from_slice(&[3, INT_TYPE_INT, 0, 0, ISA_BUS_ID, pin, ioapic_id, pin]);
        count += 1;
    }
    entries.extend_from_slice(&[4, INT_TYPE_EXTINT, 0, 0, ISA_BUS_ID, 0, 0xff, 0]);
    entries.extend_from_slice(&[4, INT_TYPE_NMI, 0, 0, ISA_BUS_ID, 0, 0xff, 1]);
    count += 2;

    let table_len = 44 + entries.len();
    let mut table = Vec::with_capacity(table_len);
    table.extend_from_slice(b"PCMP");
    table.extend_from_slice(&(table_len as u16).to_le_bytes());
    table.push(4); // spec revision 1.4
    table.push(0); // checksum, patched below
    table.extend_from_slice(b"ZYGOTE  ");
    table.extend_from_slice(b"MICROVM     ");
    table.extend_from_slice(&0u32.to_le_bytes()); // OEM table pointer
    table.extend_from_slice(&0u16.to_le_bytes()); // OEM table size
    table.extend_from_slice(&count.to_le_bytes());
    table.extend_from_slice(&(APIC_ADDR as u32).to_le_bytes());
    table.extend_from_slice(&0u16.to_le_bytes()); // extended table length
    table.push(0); // extended table checksum
    table.push(0); // reserved
    debug_assert_eq!(table.len(), 44);
    table.extend_from_slice(&entries);
    table[7] = checksum(&table);

    let mut out = Vec::with_capacity(16 + table.len());
    out.extend_from_slice(b"_MP_");
    out.extend_from_slice(&table_addr.to_le_bytes());
    out.push(1); // length in 16-byte paragraphs
    out.push(4); // spec revision
    out.push(0); // checksum, patched below
    out.extend_from_slice(&[0; 5]); // feature bytes: 0 = configuration table present
    out[10] = checksum(&out[..16]);
    out.extend_from_slice(&table);
    debug_assert!(EBDA_START + out.len() as u64 <= LOW_MEMORY_END);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b))
    }

    #[test]
    fn checksums_and_signatures() {
        let t = build(2).unwrap();
        assert_eq!(&t[0..4], b"_MP_");
        assert_eq!(sum(&t[..16]), 0);
        let ptr = u32::from_le_bytes(t[4..8].try_into().unwrap()) as u64;
        assert_eq!(ptr, EBDA_START + 16);
        let table = &t[16..];
        assert_eq!(&table[0..4], b"PCMP");
        let len = u16::from_le_bytes([table[4], table[5]]) as usize;
        assert_eq!(len, table.len());
        assert_eq!(sum(table), 0);
    }

    #[test]
    fn lists_every_cpu_once_with_one_bootstrap() {
        let t = build(4).unwrap();
        let table = &t[16..];
        let count = u16::from_le_bytes([table[34], table[35]]) as usize;
        let mut off = 44;
        let mut cpus = Vec::new();
        let mut ioapic_pins = 0;
        for _ in 0..count {
            match table[off] {
                0 => {
                    cpus.push((table[off + 1], table[off + 3]));
                    off += 20;
                }
                3 => {
                    ioapic_pins += 1;
                    off += 8;
                }
                _ => off += 8,
            }
        }
        assert_eq!(off, table.len());
        assert_eq!(cpus, vec![(0, 3), (1, 1), (2, 1), (3, 1)]);
        assert_eq!(ioapic_pins, IOAPIC_PINS);
    }

    #[test]
    fn fits_the_ebda_at_the_limit() {
        let t = build(MAX_VCPUS).unwrap();
        assert!(EBDA_START + t.len() as u64 <= LOW_MEMORY_END);
        assert_eq!(build(MAX_VCPUS + 1), Err(MptableError::TooManyCpus(33)));
        assert_eq!(build(0), Err(MptableError::NoCpus));
    }
}
