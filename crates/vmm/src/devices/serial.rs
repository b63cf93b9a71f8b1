//! 16550A UART on COM1 (vm-superio), interrupting through an irqfd.
use std::io::Write;

use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use super::bus::BusDevice;

pub const COM1_BASE: u64 = 0x3f8;
pub const COM_PORT_LEN: u64 = 8;

/// Raises the serial IRQ by writing to an eventfd that KVM routes to the IOAPIC.
pub struct IrqTrigger(pub EventFd);

impl Trigger for IrqTrigger {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

pub type SerialOut = Box<dyn Write + Send>;

pub struct SerialDevice {
    inner: Serial<IrqTrigger, vm_superio::serial::NoEvents, SerialOut>,
}

impl SerialDevice {
    pub fn new(irq: EventFd, out: SerialOut) -> Self {
        Self {
            inner: Serial::new(IrqTrigger(irq), out),
        }
    }

    /// Feed host input (e.g. a console) to the guest.
    pub fn enqueue_input(&mut self, bytes: &[u8]) -> usize {
        self.inner.enqueue_raw_bytes(bytes).unwrap_or(0)
    }
}

impl BusDevice for SerialDevice {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if data.len() == 1 && offset < COM_PORT_LEN {
            data[0] = self.inner.read(offset as u8);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if data.len() == 1 && offset < COM_PORT_LEN {
            if let Err(e) = self.inner.write(offset as u8, data[0]) {
                tracing::debug!("serial write failed: {e:?}");
            }
            let _ = self.inner.writer_mut().flush();
        }
    }
}

/// A `Write` that forwards serial output through a callback; used by callers that want
/// to scan the console line by line (e.g. the probe runner).
pub struct CallbackWriter<F: FnMut(&[u8]) + Send>(pub F);

impl<F: FnMut(&[u8]) + Send> Write for CallbackWriter<F> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        (self.0)(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn bytes_written_to_thr_reach_the_writer() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let evt = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut dev = SerialDevice::new(
            evt,
            Box::new(CallbackWriter(move |b: &[u8]| {
                sink.lock().unwrap().extend_from_slice(b)
            })),
        );
        for b in b"hi\n" {
            dev.write(0, &[*b]);
        }
        assert_eq!(&*seen.lock().unwrap(), b"hi\n");
        // Line status register reports an empty transmitter.
        let mut lsr = [0u8];
        dev.read(5, &mut lsr);
        assert_ne!(lsr[0] & 0x20, 0);
    }
}
