//! defmt on the console: the transport of `hal`'s logging shim on the target.
//!
//! defmt frames are binary (format-string indices and raw arguments, rzCOBS-encoded), so they
//! cannot share a text console as they are. Each frame is sent as one text line:
//! `NPRDMA-DEFMT: <hex bytes of the encoded frame>`. `cargo xtask qemu` decodes these lines
//! with the program's ELF (which holds the format strings) and prints the log message in
//! their place; on a board, any serial terminal capture can be decoded the same way. Text lines
//! (`println!`, the verdict) are unaffected, and a frame is never split across lines because
//! the logger holds the console for the whole frame.
//!
//! Which levels are compiled in is chosen at build time by `DEFMT_LOG` (xtask sets `info`).

/// Prefix of a defmt frame line.
pub const FRAME_PREFIX: &str = "NPRDMA-DEFMT: ";

/// Collects the bytes of one encoded frame as hex text, in fixed-size chunks so no heap is
/// needed: `push` returns a full chunk to print whenever the buffer fills.
#[derive(Debug)]
pub struct HexChunker {
    buf: [u8; 64],
    len: usize,
}

impl Default for HexChunker {
    fn default() -> Self {
        Self::new()
    }
}

impl HexChunker {
    /// An empty chunker.
    pub const fn new() -> Self {
        Self {
            buf: [0; 64],
            len: 0,
        }
    }

    /// Adds `bytes`, calling `emit` with every full chunk of hex text.
    pub fn push(&mut self, bytes: &[u8], mut emit: impl FnMut(&str)) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for b in bytes {
            if self.len + 2 > self.buf.len() {
                self.flush(&mut emit);
            }
            self.buf[self.len] = HEX[usize::from(b >> 4)];
            self.buf[self.len + 1] = HEX[usize::from(b & 0xf)];
            self.len += 2;
        }
    }

    /// Emits what is left.
    pub fn flush(&mut self, mut emit: impl FnMut(&str)) {
        if self.len > 0 {
            // Only ASCII hex digits are ever stored.
            if let Ok(s) = core::str::from_utf8(&self.buf[..self.len]) {
                emit(s);
            }
            self.len = 0;
        }
    }
}

#[cfg(all(target_arch = "aarch64", target_os = "none"))]
mod target {
    use core::sync::atomic::{AtomicBool, Ordering};

    use super::{FRAME_PREFIX, HexChunker};

    #[defmt::global_logger]
    struct ConsoleLogger;

    /// Whether a frame is being written (defmt forbids nested acquire).
    static TAKEN: AtomicBool = AtomicBool::new(false);
    /// Saved DAIF of the acquiring context, restored on release.
    static mut SAVED_DAIF: u64 = 0;
    static mut ENCODER: defmt::Encoder = defmt::Encoder::new();
    static mut CHUNKER: HexChunker = HexChunker::new();

    fn emit(s: &str) {
        crate::console::_print(format_args!("{s}"));
    }

    fn encoded(bytes: &[u8]) {
        // SAFETY: only called between acquire and release, which serialise access.
        let chunker = unsafe { &mut *core::ptr::addr_of_mut!(CHUNKER) };
        chunker.push(bytes, emit);
    }

    // SAFETY: acquire masks interrupts and refuses re-entry (TAKEN), so `ENCODER` and
    // `CHUNKER` are used by one frame at a time, as defmt's `Logger` contract requires.
    unsafe impl defmt::Logger for ConsoleLogger {
        fn acquire() {
            let daif: u64;
            // SAFETY: reading and setting DAIF only masks interrupts on this core.
            unsafe {
                core::arch::asm!("mrs {0}, daif", "msr daifset, #0xf", out(reg) daif, options(nomem, nostack));
            }
            if TAKEN.swap(true, Ordering::Acquire) {
                // A log call from inside a log call: defmt forbids it. Fail the run in text.
                crate::rt::fail(format_args!("defmt logger re-entered"));
            }
            // SAFETY: we hold the logger (TAKEN) with interrupts masked.
            unsafe {
                SAVED_DAIF = daif;
                emit(FRAME_PREFIX);
                (*core::ptr::addr_of_mut!(ENCODER)).start_frame(encoded);
            }
        }

        unsafe fn flush() {}

        unsafe fn release() {
            // SAFETY: called after acquire by defmt's contract.
            unsafe {
                (*core::ptr::addr_of_mut!(ENCODER)).end_frame(encoded);
                (*core::ptr::addr_of_mut!(CHUNKER)).flush(emit);
            }
            emit("\n");
            TAKEN.store(false, Ordering::Release);
            // SAFETY: restores the interrupt mask saved in acquire.
            unsafe {
                let daif = SAVED_DAIF;
                core::arch::asm!("msr daif, {0}", in(reg) daif, options(nomem, nostack));
            }
        }

        unsafe fn write(bytes: &[u8]) {
            // SAFETY: called between acquire and release by defmt's contract.
            unsafe { (*core::ptr::addr_of_mut!(ENCODER)).write(bytes, encoded) };
        }
    }

    defmt::timestamp!("{=u64:us}", {
        let hz = hal::sysreg::counter_frequency().max(1);
        hal::sysreg::counter().saturating_mul(1_000_000) / hz
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_chunks_concatenate_to_the_frame() {
        let frame: Vec<u8> = (0..=255u8).chain([0x00, 0x7f, 0x80]).collect();
        let mut out = String::new();
        let mut c = HexChunker::new();
        c.push(&frame[..10], |s| out.push_str(s));
        c.push(&frame[10..], |s| {
            assert!(s.len() <= 64);
            out.push_str(s)
        });
        c.flush(|s| out.push_str(s));
        assert_eq!(out.len(), frame.len() * 2);
        assert!(out.starts_with("000102030405"));
        assert!(out.ends_with("ff007f80"));
        let back: Vec<u8> = (0..out.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&out[i..i + 2], 16).unwrap())
            .collect();
        assert_eq!(back, frame);
    }
}
