//! Address-range dispatch for port I/O and MMIO exits.
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A device reachable through a bus. `offset` is relative to the device's base.
pub trait BusDevice: Send {
    fn read(&mut self, offset: u64, data: &mut [u8]);
    fn write(&mut self, offset: u64, data: &[u8]);
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    #[error("device range {base:#x}+{len:#x} overlaps an existing device")]
    Overlap { base: u64, len: u64 },
    #[error("device range at {0:#x} is empty or wraps around")]
    BadRange(u64),
}

pub type SharedDevice = Arc<Mutex<dyn BusDevice>>;

/// A set of non-overlapping device ranges. Built before vCPUs start, then only read, so
/// it is shared without a lock; each device has its own mutex.
#[derive(Default, Clone)]
pub struct Bus {
    ranges: BTreeMap<u64, (u64, SharedDevice)>,
}

impl Bus {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, base: u64, len: u64, device: SharedDevice) -> Result<(), BusError> {
        let end = base
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or(BusError::BadRange(base))?;
        let before = self.ranges.range(..end).next_back();
        if let Some((&b, &(l, _))) = before {
            if b + l > base {
                return Err(BusError::Overlap { base, len });
            }
        }
        self.ranges.insert(base, (len, device));
        Ok(())
    }

    fn find(&self, addr: u64) -> Option<(u64, &SharedDevice)> {
        let (&base, (len, dev)) = self.ranges.range(..=addr).next_back()?;
        (addr - base < *len).then_some((addr - base, dev))
    }

    /// Dispatch a read; returns false when no device claims `addr`.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr) {
            Some((offset, dev)) => {
                dev.lock().expect("device lock poisoned").read(offset, data);
                true
            }
            None => false,
        }
    }

    /// Dispatch a write; returns false when no device claims `addr`.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.find(addr) {
            Some((offset, dev)) => {
                dev.lock()
                    .expect("device lock poisoned")
                    .write(offset, data);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Recorder {
        writes: Vec<(u64, Vec<u8>)>,
    }
    impl BusDevice for Recorder {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.writes.push((offset, data.to_vec()));
        }
    }

    #[test]
    fn dispatches_by_range_with_offsets() {
        let mut bus = Bus::new();
        let dev = Arc::new(Mutex::new(Recorder::default()));
        bus.insert(0x3f8, 8, dev.clone()).unwrap();
        let mut b = [0u8; 1];
        assert!(bus.read(0x3fd, &mut b));
        assert_eq!(b[0], 5);
        assert!(bus.write(0x3f8, &[0x41]));
        assert!(!bus.write(0x400, &[0]));
        assert!(!bus.read(0x3f7, &mut b));
        assert_eq!(dev.lock().unwrap().writes, vec![(0, vec![0x41])]);
    }

    #[test]
    fn rejects_overlaps_and_empty_ranges() {
        let mut bus = Bus::new();
        let dev: SharedDevice = Arc::new(Mutex::new(Recorder::default()));
        bus.insert(0x100, 0x10, dev.clone()).unwrap();
        assert!(bus.insert(0x108, 0x10, dev.clone()).is_err());
        assert!(bus.insert(0xf8, 0x10, dev.clone()).is_err());
        assert!(bus.insert(0x110, 0x10, dev.clone()).is_ok());
        assert_eq!(
            bus.insert(0x200, 0, dev.clone()),
            Err(BusError::BadRange(0x200))
        );
        assert_eq!(
            bus.insert(u64::MAX, 2, dev),
            Err(BusError::BadRange(u64::MAX))
        );
    }
}
