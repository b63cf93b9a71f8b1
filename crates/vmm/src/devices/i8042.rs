//! Just enough of the i8042 keyboard controller for a guest to reset the machine:
//! writing 0xFE (pulse reset line) to the command port ends the VM cleanly.
use super::bus::BusDevice;

pub const I8042_DATA_PORT: u64 = 0x60;
pub const I8042_PORT_RANGE: u64 = 5; // 0x60..=0x64
const COMMAND_OFFSET: u64 = 4;
const CMD_RESET_CPU: u8 = 0xfe;

pub struct I8042 {
    on_reset: Box<dyn FnMut() + Send>,
}

impl I8042 {
    pub fn new(on_reset: Box<dyn FnMut() + Send>) -> Self {
        Self { on_reset }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        // Status 0: no data, input buffer empty, so guests never wait on us.
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset == COMMAND_OFFSET && data.first() == Some(&CMD_RESET_CPU) {
            (self.on_reset)();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn only_reset_command_triggers() {
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        let mut dev = I8042::new(Box::new(move || {
            h.fetch_add(1, Ordering::SeqCst);
        }));
        dev.write(0, &[0xfe]);
        dev.write(4, &[0xaa]);
        assert_eq!(hits.load(Ordering::SeqCst), 0);
        dev.write(4, &[0xfe]);
        assert_eq!(hits.load(Ordering::SeqCst), 1);
    }
}
