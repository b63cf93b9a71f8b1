//! Line-oriented text on COM1. The VMM's 16550 is always ready to accept a byte,
//! so the probe writes THR without polling LSR: each poll would be one more I/O
//! exit and one more emulated instruction.

use crate::arch::outb;
use zygote_probe_abi::COM1_PORT;

pub fn byte(b: u8) {
    outb(COM1_PORT, b);
}

pub fn bytes(s: &[u8]) {
    for &b in s {
        byte(b);
    }
}

pub fn newline() {
    byte(b'\n');
}

/// Something `say!` can print. Hand-rolled instead of core::fmt: the formatting
/// machinery costs thousands of emulated instructions per line.
pub trait Emit {
    fn emit(&self);
}

impl Emit for &str {
    fn emit(&self) {
        bytes(self.as_bytes());
    }
}

impl Emit for &[u8] {
    fn emit(&self) {
        bytes(self);
    }
}

impl Emit for u64 {
    fn emit(&self) {
        let mut buf = [0u8; 20];
        let mut i = buf.len();
        let mut v = *self;
        loop {
            i -= 1;
            buf[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        bytes(&buf[i..]);
    }
}

impl Emit for u32 {
    fn emit(&self) {
        (*self as u64).emit();
    }
}

impl Emit for usize {
    fn emit(&self) {
        (*self as u64).emit();
    }
}

/// Prints as `0x` followed by lower-case hex digits, no leading zeros.
pub struct Hex(pub u64);

impl Emit for Hex {
    fn emit(&self) {
        bytes(b"0x");
        let mut started = false;
        for shift in (0..16).rev() {
            let nibble = ((self.0 >> (shift * 4)) & 0xf) as u8;
            if nibble != 0 || started || shift == 0 {
                started = true;
                byte(if nibble < 10 {
                    b'0' + nibble
                } else {
                    b'a' + nibble - 10
                });
            }
        }
    }
}

/// Prints its arguments back to back, then a newline.
#[macro_export]
macro_rules! say {
    ($($x:expr),* $(,)?) => {{
        $( $crate::serial::Emit::emit(&$x); )*
        $crate::serial::newline();
    }};
}
