//! defmt on the console: the transport of `hal`'s logging shim on the target.
//!
//! defmt defers formatting to the host: a log call sends the index of its format string (the
//! strings stay in the ELF's non-loaded `.defmt` section) and its arguments as raw bytes, and
//! the host formats them with the ELF's table. defmt 1 has two wire encodings, `encoding-raw`
//! and `encoding-rzcobs` (the default, framed and lightly compressed), both binary; it has no
//! text mode that a terminal could show without a decoder (defmt's Cargo features; the
//! `defmt-decoder` crate is what `defmt-print` and probe-rs use to turn frames back into text).
//!
//! A binary frame cannot share a text console as it is: an rzCOBS frame may hold any byte but
//! 0, newlines and control characters included. So each frame goes out as one text line,
//! `NPRDMA-DEFMT: <hex of the rzCOBS-encoded frame>` ([`FRAME_PREFIX`], `FrameLines`).
//! `cargo xtask qemu` decodes these lines with `defmt-decoder` and the program's ELF and prints
//! the message in their place; a capture of a board's UART can be decoded the same way. Text
//! lines (the runtime's boot lines, exception reports, the verdict) are unaffected, and a
//! frame is never split across lines because the logger holds the console for the whole
//! frame. Nothing on this path uses `core::fmt`: bytes are turned into hex digits here and
//! written to the UART as they are.
//!
//! Which levels are compiled in is chosen at build time by `DEFMT_LOG` (xtask sets `info`).

/// Prefix of a defmt frame line.
pub const FRAME_PREFIX: &str = "NPRDMA-DEFMT: ";

/// Hex digits per console write: the chunk a [`HexChunker`] collects before handing it on.
pub const HEX_CHUNK: usize = 64;

/// Collects the bytes of one encoded frame as hex text, in fixed-size chunks so no heap is
/// needed: `push` hands every full chunk to `emit`.
#[derive(Debug, Default)]
pub struct HexChunker {
    hex: heapless::String<HEX_CHUNK>,
}

impl HexChunker {
    /// An empty chunker.
    pub const fn new() -> Self {
        Self {
            hex: heapless::String::new(),
        }
    }

    /// Adds `bytes`, calling `emit` with every full chunk of hex text.
    pub fn push(&mut self, bytes: &[u8], emit: &mut impl FnMut(&str)) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for b in bytes {
            if self.hex.len() + 2 > HEX_CHUNK {
                self.flush(emit);
            }
            for digit in [b >> 4, b & 0xf] {
                // Cannot fail: a chunk is flushed above before it could overflow.
                let _ = self.hex.push(char::from(HEX[usize::from(digit)]));
            }
        }
    }

    /// Emits what is left.
    pub fn flush(&mut self, emit: &mut impl FnMut(&str)) {
        if !self.hex.is_empty() {
            emit(&self.hex);
            self.hex.clear();
        }
    }
}

/// Turns defmt frames into console lines: [`FRAME_PREFIX`], the hex of the rzCOBS-encoded
/// frame, a newline. The global logger drives one of these between defmt's `acquire` and
/// `release`; host tests drive it with hand-made frames.
#[cfg(any(test, target_os = "none"))]
pub struct FrameLines {
    encoder: defmt::Encoder,
    hex: HexChunker,
}

#[cfg(any(test, target_os = "none"))]
impl Default for FrameLines {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(any(test, target_os = "none"))]
impl FrameLines {
    /// Ready for the first frame.
    pub const fn new() -> Self {
        Self {
            encoder: defmt::Encoder::new(),
            hex: HexChunker::new(),
        }
    }

    /// Starts a frame's line.
    pub fn start(&mut self, emit: &mut impl FnMut(&str)) {
        emit(FRAME_PREFIX);
        let Self { encoder, hex } = self;
        encoder.start_frame(|bytes| hex.push(bytes, emit));
    }

    /// Adds raw frame bytes (defmt's `Logger::write`).
    pub fn write(&mut self, bytes: &[u8], emit: &mut impl FnMut(&str)) {
        let Self { encoder, hex } = self;
        encoder.write(bytes, |encoded| hex.push(encoded, emit));
    }

    /// Ends the frame and its line.
    pub fn end(&mut self, emit: &mut impl FnMut(&str)) {
        let Self { encoder, hex } = self;
        encoder.end_frame(|encoded| hex.push(encoded, emit));
        hex.flush(emit);
        emit("\n");
    }
}

/// Logs `line` at info level through defmt: the sink a program hands to the library's
/// progress reporting (`edu::probe`, `smmuv3_faults::run_scenario`, `zynqmp_zdma::run_copies`)
/// on the target. Host tests pass a closure that collects the lines instead.
#[cfg(target_os = "none")]
pub fn info<L: defmt::Format>(line: L) {
    defmt::info!("{}", line);
}

/// defmt's side of the exception decoder's types, for program logs (the runtime's exception
/// reports stay plain text, through their `fmt::Display` in `exception`). Same wording, but for
/// an exception class, which is given by number.
#[cfg(target_os = "none")]
mod exception_formats {
    use crate::exception::{FaultStatus, ProbeFault, Syndrome};

    impl defmt::Format for FaultStatus {
        fn format(&self, f: defmt::Formatter<'_>) {
            match *self {
                FaultStatus::AddressSize(l) => {
                    defmt::write!(f, "address size fault, level {=u8}", l)
                }
                FaultStatus::Translation(l) => {
                    defmt::write!(f, "translation fault, level {=u8}", l)
                }
                FaultStatus::AccessFlag(l) => defmt::write!(f, "access flag fault, level {=u8}", l),
                FaultStatus::Permission(l) => defmt::write!(f, "permission fault, level {=u8}", l),
                FaultStatus::ExternalAbort => defmt::write!(f, "synchronous external abort"),
                FaultStatus::ExternalAbortOnWalk(l) => defmt::write!(
                    f,
                    "synchronous external abort on table walk, level {=u8}",
                    l
                ),
                FaultStatus::Alignment => defmt::write!(f, "alignment fault"),
                FaultStatus::TlbConflict => defmt::write!(f, "TLB conflict abort"),
                FaultStatus::Other(code) => defmt::write!(f, "fault status {=u8:#04x}", code),
            }
        }
    }

    /// What an abort's syndrome says: its fault status, else its exception class (by number:
    /// an abort always has a fault status, and `class_name`'s table is not worth a second copy
    /// for a line that does not happen).
    struct Cause(Syndrome);

    impl defmt::Format for Cause {
        fn format(&self, f: defmt::Formatter<'_>) {
            match self.0.fault_status() {
                Some(status) => defmt::write!(f, "{}", status),
                None => defmt::write!(f, "exception class {=u8:#04x}", self.0.class()),
            }
        }
    }

    impl defmt::Format for ProbeFault {
        fn format(&self, f: defmt::Formatter<'_>) {
            match *self {
                ProbeFault::Abort { esr, far } if Syndrome(esr).far_valid() => defmt::write!(
                    f,
                    "{}, ESR {=u64:#x}, FAR {=u64:#x}",
                    Cause(Syndrome(esr)),
                    esr,
                    far
                ),
                ProbeFault::Abort { esr, .. } => {
                    defmt::write!(f, "{}, ESR {=u64:#x}", Cause(Syndrome(esr)), esr)
                }
                ProbeFault::SErrorPending => defmt::write!(f, "SError pending after the read"),
            }
        }
    }
}

#[cfg(all(target_arch = "aarch64", target_os = "none"))]
mod target {
    use core::sync::atomic::{AtomicBool, Ordering};

    use super::FrameLines;

    #[defmt::global_logger]
    struct ConsoleLogger;

    /// Whether a frame is being written (defmt forbids nested acquire).
    static TAKEN: AtomicBool = AtomicBool::new(false);
    /// Saved DAIF of the acquiring context, restored on release.
    static mut SAVED_DAIF: u64 = 0;
    static mut LINES: FrameLines = FrameLines::new();

    fn emit(s: &str) {
        crate::console::write_str(s);
    }

    /// The frame writer.
    ///
    /// # Safety
    /// Only between acquire and release, which serialise access (TAKEN, interrupts masked),
    /// and never twice at once.
    unsafe fn lines() -> &'static mut FrameLines {
        // SAFETY: the caller holds the logger, so nothing else uses `LINES` meanwhile.
        unsafe { &mut *core::ptr::addr_of_mut!(LINES) }
    }

    // SAFETY: acquire masks interrupts and refuses re-entry (TAKEN), so `LINES` is used by one
    // frame at a time, as defmt's `Logger` contract requires.
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
                lines().start(&mut emit);
            }
        }

        unsafe fn flush() {}

        unsafe fn release() {
            // SAFETY: called after acquire by defmt's contract.
            unsafe { lines().end(&mut emit) };
            TAKEN.store(false, Ordering::Release);
            // SAFETY: restores the interrupt mask saved in acquire.
            unsafe {
                let daif = SAVED_DAIF;
                core::arch::asm!("msr daif, {0}", in(reg) daif, options(nomem, nostack));
            }
        }

        unsafe fn write(bytes: &[u8]) {
            // SAFETY: called between acquire and release by defmt's contract.
            unsafe { lines().write(bytes, &mut emit) };
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

    fn unhex(hex: &str) -> Vec<u8> {
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn hex_chunks_concatenate_to_the_frame() {
        let frame: Vec<u8> = (0..=255u8).chain([0x00, 0x7f, 0x80]).collect();
        let mut out = String::new();
        let mut c = HexChunker::new();
        c.push(&frame[..10], &mut |s| out.push_str(s));
        c.push(&frame[10..], &mut |s| {
            assert!(s.len() <= HEX_CHUNK);
            out.push_str(s)
        });
        c.flush(&mut |s| out.push_str(s));
        assert_eq!(out.len(), frame.len() * 2);
        assert!(out.starts_with("000102030405"));
        assert!(out.ends_with("ff007f80"));
        assert_eq!(unhex(&out), frame);
    }

    /// A defmt table with one log string and the firmware's timestamp, as `defmt-decoder`
    /// would read it from an ELF (built through its serde form: the table's fields are private).
    fn table(index: u16, format: &str) -> defmt_decoder::Table {
        let json = serde_json::json!({
            "timestamp": {
                "string": { "tag": "Timestamp", "string": "{=u64:us}" },
                "raw_symbol": "timestamp"
            },
            "entries": {
                index.to_string(): {
                    "string": { "tag": "Info", "string": format },
                    "raw_symbol": "message"
                }
            },
            "bitflags": {},
            "encoding": "Rzcobs"
        });
        serde_json::from_value(json).unwrap()
    }

    /// The raw frame defmt writes for `info!(format, a, b)` with `{=u32}` and `{=u8:02x}`
    /// arguments: string index, timestamp, arguments, all little-endian.
    fn raw_frame(index: u16, micros: u64, a: u32, b: u8) -> Vec<u8> {
        let mut f = index.to_le_bytes().to_vec();
        f.extend_from_slice(&micros.to_le_bytes());
        f.extend_from_slice(&a.to_le_bytes());
        f.push(b);
        f
    }

    /// The console lines for `frames`, written in pieces as defmt's `Logger::write` calls come.
    fn lines_for(frames: &[Vec<u8>]) -> String {
        let mut out = String::new();
        let mut lines = FrameLines::new();
        for frame in frames {
            lines.start(&mut |s| out.push_str(s));
            for piece in frame.chunks(3) {
                lines.write(piece, &mut |s| out.push_str(s));
            }
            lines.end(&mut |s| out.push_str(s));
        }
        out
    }

    #[test]
    fn a_frame_line_decodes_back_to_its_message() {
        let format = "zDMA GDMA{=u32} copy: byte {=u8:02x} exact";
        let table = table(7, format);
        let out = lines_for(&[
            raw_frame(7, 1_500_000, 1, 0x0a),
            // Zeros everywhere: what rzCOBS compresses, and what must never end a frame early.
            raw_frame(7, 0, 0, 0),
        ]);
        let decoded: Vec<String> = out
            .lines()
            .map(|line| {
                let hex = line.strip_prefix(FRAME_PREFIX).expect("one frame per line");
                assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()), "{line}");
                let mut decoder = table.new_stream_decoder();
                decoder.received(&unhex(hex));
                let text = decoder.decode().unwrap().display(false).to_string();
                assert_eq!(
                    decoder.decode().unwrap_err(),
                    defmt_decoder::DecodeError::UnexpectedEof,
                    "one frame per line"
                );
                text
            })
            .collect();
        assert_eq!(
            decoded,
            [
                "1.500000 INFO zDMA GDMA1 copy: byte 0a exact",
                "0.000000 INFO zDMA GDMA0 copy: byte 00 exact",
            ]
        );
    }
}
