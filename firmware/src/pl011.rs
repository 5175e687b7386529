//! The Arm PrimeCell UART (PL011) as a transmit-only console.
//!
//! Registers and bits from the *PrimeCell UART (PL011) Technical Reference Manual*, r1p5
//! (Arm DDI 0183G), chapter 3 "Programmers Model"; section numbers are given per register.
//! Only what a polled console needs is declared.
//!
//! The baud-rate divisors are left as the previous boot stage (or QEMU, which ignores them)
//! set them: the reference clock is board-specific and not known here.

use core::fmt;

use hal::regs::RegisterBus;
use tock_registers::interfaces::{Readable, Writeable};

use crate::error::Result;

/// Register fields (tock-registers `register_bitfields!`). Every register and field has a
/// doc comment; the helper items the macro generates have none, hence the `allow`.
#[allow(missing_docs)]
pub mod fields {
    use tock_registers::register_bitfields;

    register_bitfields![u32,
        /// UARTDR, Data Register (3.3.1).
        pub DR [
            /// Transmit (write) / receive (read) character.
            DATA OFFSET(0) NUMBITS(8) [],
        ],
        /// UARTFR, Flag Register (3.3.3).
        pub FR [
            /// UART busy: set while a character is still being shifted out.
            BUSY OFFSET(3) NUMBITS(1) [],
            /// Receive FIFO empty.
            RXFE OFFSET(4) NUMBITS(1) [],
            /// Transmit FIFO full (with FIFOs off: the holding register is full).
            TXFF OFFSET(5) NUMBITS(1) [],
            /// Transmit FIFO empty.
            TXFE OFFSET(7) NUMBITS(1) [],
        ],
        /// UARTLCR_H, Line Control Register (3.3.7).
        pub LCR_H [
            /// Enable FIFOs.
            FEN OFFSET(4) NUMBITS(1) [],
            /// Word length.
            WLEN OFFSET(5) NUMBITS(2) [
                /// 5 data bits.
                Bits5 = 0b00,
                /// 8 data bits.
                Bits8 = 0b11,
            ],
        ],
        /// UARTCR, Control Register (3.3.8).
        pub CR [
            /// UART enable.
            UARTEN OFFSET(0) NUMBITS(1) [],
            /// Transmit enable.
            TXE OFFSET(8) NUMBITS(1) [],
            /// Receive enable.
            RXE OFFSET(9) NUMBITS(1) [],
        ],
    ];
}
pub use fields::{CR, DR, FR, LCR_H};

hal::register_block! {
    /// The PL011 register window (4 KiB; register summary in TRM 3.2).
    pub struct Pl011Regs {
        /// UARTDR, Data Register (3.3.1).
        (0x000 => pub dr: Rw u32, DR::Register),
        /// UARTFR, Flag Register (3.3.3), read-only.
        (0x018 => pub fr: Ro u32, FR::Register),
        /// UARTIBRD, Integer Baud Rate Register (3.3.5).
        (0x024 => pub ibrd: Rw u32),
        /// UARTFBRD, Fractional Baud Rate Register (3.3.6).
        (0x028 => pub fbrd: Rw u32),
        /// UARTLCR_H, Line Control Register (3.3.7).
        (0x02c => pub lcr_h: Rw u32, LCR_H::Register),
        /// UARTCR, Control Register (3.3.8).
        (0x030 => pub cr: Rw u32, CR::Register),
        /// UARTIMSC, Interrupt Mask Set/Clear Register (3.3.10).
        (0x038 => pub imsc: Rw u32),
        /// UARTICR, Interrupt Clear Register (3.3.13), write-only.
        (0x044 => pub icr: Wo u32),
    }
    size = 0x1000;
}

/// How many times a full transmit FIFO is polled before a character is dropped: a console
/// must never hang the program (and with it the verdict) on a stuck UART.
pub const TX_POLL_LIMIT: u32 = 1_000_000;

/// A polled PL011 transmitter implementing [`fmt::Write`]; `\n` is sent as `\r\n`.
pub struct Pl011<'a, B: RegisterBus + ?Sized> {
    regs: Pl011Regs<'a, B>,
}

impl<'a, B: RegisterBus + ?Sized> Pl011<'a, B> {
    /// The UART whose 4 KiB register window is `bus` (fails if the window is smaller).
    pub fn new(bus: &'a B) -> Result<Self> {
        Ok(Self {
            regs: Pl011Regs::new(bus, 0)?,
        })
    }

    /// The register block.
    pub fn regs(&self) -> &Pl011Regs<'a, B> {
        &self.regs
    }

    /// Makes sure the transmitter is on. If the UART is already enabled with TX on, nothing
    /// is touched (the previous stage's line settings stay). Otherwise it follows the
    /// sequence in TRM 3.3.8: disable, wait until not BUSY, set 8N1 with FIFOs, enable
    /// UART + TX + RX.
    pub fn init(&self) {
        if self.regs.cr().matches_all(CR::UARTEN::SET + CR::TXE::SET) {
            return;
        }
        self.regs.cr().set(0);
        self.wait_idle();
        self.regs
            .lcr_h()
            .write(LCR_H::WLEN::Bits8 + LCR_H::FEN::SET);
        self.regs.imsc().set(0);
        self.regs
            .cr()
            .write(CR::UARTEN::SET + CR::TXE::SET + CR::RXE::SET);
    }

    /// Sends one byte, waiting (bounded by [`TX_POLL_LIMIT`]) for room in the FIFO.
    /// Returns false if the byte was dropped because the FIFO stayed full.
    pub fn write_byte(&self, byte: u8) -> bool {
        for _ in 0..TX_POLL_LIMIT {
            if !self.regs.fr().is_set(FR::TXFF) {
                self.regs.dr().write(DR::DATA.val(u32::from(byte)));
                return true;
            }
            core::hint::spin_loop();
        }
        false
    }

    /// Waits (bounded) until the last character has left the shift register, so nothing is
    /// lost when the machine powers off right after.
    pub fn wait_idle(&self) {
        for _ in 0..TX_POLL_LIMIT {
            if !self.regs.fr().is_set(FR::BUSY) {
                return;
            }
            core::hint::spin_loop();
        }
    }
}

impl<B: RegisterBus + ?Sized> fmt::Write for Pl011<'_, B> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        crate::console::write_crlf(s, |b| self.write_byte(b));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use core::fmt::Write as _;

    use hal::model::{ModelBus, RegisterModel};
    use hal::regs::AccessWidth;

    use super::*;

    /// A PL011 transmitter as the TRM describes it: DR writes go to the line only when
    /// UARTEN and TXE are set (3.3.8); TXFF reads as set for `busy_reads` flag reads after
    /// each accepted character (a slow line); CR resets to TXE|RXE (3.3.8: "bits 9 and 8 are
    /// set to 1" at reset).
    struct UartModel {
        cr: u32,
        lcr_h: u32,
        line: Vec<u8>,
        busy_reads: u32,
        busy_left: u32,
        stuck_full: bool,
        dr_writes_while_full: u32,
        dr_writes_while_disabled: u32,
    }

    impl UartModel {
        fn new(busy_reads: u32) -> Self {
            Self {
                cr: 0x300,
                lcr_h: 0,
                line: Vec::new(),
                busy_reads,
                busy_left: 0,
                stuck_full: false,
                dr_writes_while_full: 0,
                dr_writes_while_disabled: 0,
            }
        }
        fn full(&self) -> bool {
            self.stuck_full || self.busy_left > 0
        }
    }

    impl RegisterModel for UartModel {
        fn size(&self) -> usize {
            0x1000
        }
        fn read(&mut self, offset: usize, _width: AccessWidth) -> u64 {
            match offset {
                0x018 => {
                    let full = self.full();
                    self.busy_left = self.busy_left.saturating_sub(1);
                    // TXFF (bit 5) and BUSY (bit 3) while the character is still going out.
                    if full { (1 << 5) | (1 << 3) } else { 1 << 7 }
                }
                0x02c => u64::from(self.lcr_h),
                0x030 => u64::from(self.cr),
                _ => 0,
            }
        }
        fn write(&mut self, offset: usize, _width: AccessWidth, value: u64) {
            let v = value as u32;
            match offset {
                0x000 => {
                    if self.full() {
                        self.dr_writes_while_full += 1;
                    } else if self.cr & 0x101 != 0x101 {
                        self.dr_writes_while_disabled += 1;
                    } else {
                        self.line.push(v as u8);
                        self.busy_left = self.busy_reads;
                    }
                }
                0x02c => self.lcr_h = v,
                0x030 => self.cr = v,
                _ => {}
            }
        }
    }

    #[test]
    fn init_enables_tx_with_8_bit_words_and_text_reaches_the_line() {
        let bus = ModelBus::new(UartModel::new(3));
        let mut uart = Pl011::new(&bus).unwrap();
        uart.init();
        {
            let m = bus.lock();
            // UARTEN (bit 0) | TXE (bit 8) | RXE (bit 9); WLEN=0b11 at bits 6:5, FEN bit 4.
            assert_eq!(m.cr, 0x301);
            assert_eq!(m.lcr_h, 0x70);
        }
        write!(uart, "PASS {}\nnext", 42).unwrap();
        let m = bus.into_inner();
        assert_eq!(m.line, b"PASS 42\r\nnext");
        assert_eq!(m.dr_writes_while_full, 0, "waited for TXFF to clear");
        assert_eq!(m.dr_writes_while_disabled, 0);
    }

    #[test]
    fn init_keeps_an_already_enabled_uart() {
        let mut model = UartModel::new(0);
        model.cr = 0x301;
        model.lcr_h = 0x60; // 8 bits, FIFOs off, as a previous stage left it
        let bus = ModelBus::new(model);
        Pl011::new(&bus).unwrap().init();
        let m = bus.lock();
        assert_eq!((m.cr, m.lcr_h), (0x301, 0x60));
    }

    #[test]
    fn stuck_fifo_drops_characters_instead_of_hanging() {
        let mut model = UartModel::new(0);
        model.cr = 0x301;
        model.stuck_full = true;
        let bus = ModelBus::new(model);
        let uart = Pl011::new(&bus).unwrap();
        assert!(!uart.write_byte(b'x'));
        uart.wait_idle();
        let m = bus.lock();
        assert!(m.line.is_empty());
        assert_eq!(m.dr_writes_while_full, 0);
    }

    #[test]
    fn window_smaller_than_the_register_block_is_an_error() {
        struct Tiny;
        impl RegisterModel for Tiny {
            fn size(&self) -> usize {
                0x100
            }
            fn read(&mut self, _: usize, _: AccessWidth) -> u64 {
                0
            }
            fn write(&mut self, _: usize, _: AccessWidth, _: u64) {}
        }
        let bus = ModelBus::new(Tiny);
        assert!(Pl011::new(&bus).is_err());
    }
}
