//! The Cadence UART (the ZynqMP's UART0/UART1, `cdns,uart-r1p12`) as a transmit-only console.
//!
//! Registers and bits from the *Zynq UltraScale+ Device TRM* (UG1085), chapter "UART
//! Controller" (programming model), and the *Register Reference* (UG1087), UART module. UG1087
//! names are long (`Control`, `mode`, `Channel_sts`, `TX_RX_FIFO`, ...); the fields use the
//! short names of Xilinx's `xuartps_hw.h` and Linux's `xilinx_uartps.c` (CR, MR, SR, FIFO).
//! Only what a polled console needs is declared.
//!
//! The line rate is left as the previous stage set it: baud = sel_clk / (CD * (BDIV + 1))
//! (UG1085, "Baud Rate Generator"; CD in `Baud_rate_gen`, BDIV in `Baud_rate_divider`,
//! sel_clk = UART_REF_CLK, or UART_REF_CLK / 8 with MR.CLKS), and UART_REF_CLK is set up in
//! CRL_APB by the FSBL / `psu_init` for the board. Without knowing that clock no divisor here
//! could be right, so the driver never writes them (nor MR.CLKS).

use core::fmt;

use hal::regs::RegisterBus;
use tock_registers::interfaces::{ReadWriteable, Readable, Writeable};

use crate::error::Result;

/// Register fields (tock-registers `register_bitfields!`). Every register and field has a
/// doc comment; the helper items the macro generates have none, hence the `allow`.
#[allow(missing_docs)]
pub mod fields {
    use tock_registers::register_bitfields;

    register_bitfields![u32,
        /// CR, UG1087 `Control` (offset 0x00; reset 0x128: TX/RX disabled, STPBRK).
        pub CR [
            /// RXRST: reset the receive path; self-clearing.
            RXRST OFFSET(0) NUMBITS(1) [],
            /// TXRST: reset the transmit path (and empty the TX FIFO); self-clearing.
            TXRST OFFSET(1) NUMBITS(1) [],
            /// RX_EN: receiver enable (effective only while RX_DIS is 0).
            RX_EN OFFSET(2) NUMBITS(1) [],
            /// RX_DIS: receiver disable (wins over RX_EN).
            RX_DIS OFFSET(3) NUMBITS(1) [],
            /// TX_EN: transmitter enable (effective only while TX_DIS is 0).
            TX_EN OFFSET(4) NUMBITS(1) [],
            /// TX_DIS: transmitter disable (wins over TX_EN).
            TX_DIS OFFSET(5) NUMBITS(1) [],
            /// STPBRK: stop transmitting a break.
            STPBRK OFFSET(8) NUMBITS(1) [],
        ],
        /// MR, UG1087 `mode` (offset 0x04; reset 0).
        pub MR [
            /// CLKS: sel_clk is UART_REF_CLK / 8 when set (part of the line rate; kept).
            CLKS OFFSET(0) NUMBITS(1) [],
            /// CHRL: character length.
            CHRL OFFSET(1) NUMBITS(2) [
                /// 8 bits (0b0x).
                Bits8 = 0b00,
                /// 7 bits.
                Bits7 = 0b10,
                /// 6 bits.
                Bits6 = 0b11,
            ],
            /// PAR: parity (0b000 even, which is the reset value; 0b1xx none).
            PAR OFFSET(3) NUMBITS(3) [
                /// Even parity.
                Even = 0b000,
                /// No parity.
                NoParity = 0b100,
            ],
            /// NBSTOP: stop bits.
            NBSTOP OFFSET(6) NUMBITS(2) [
                /// One stop bit.
                One = 0b00,
            ],
            /// CHMODE: channel mode (echo and loopback modes keep characters off the line).
            CHMODE OFFSET(8) NUMBITS(2) [
                /// Normal operation.
                Normal = 0b00,
            ],
        ],
        /// SR, UG1087 `Channel_sts` (offset 0x2C), read-only.
        pub SR [
            /// RXEMPTY: receive FIFO empty.
            RXEMPTY OFFSET(1) NUMBITS(1) [],
            /// TXEMPTY: transmit FIFO empty.
            TXEMPTY OFFSET(3) NUMBITS(1) [],
            /// TXFULL: transmit FIFO full; a byte written now is lost (TOVR).
            TXFULL OFFSET(4) NUMBITS(1) [],
            /// TACTIVE: the transmitter is shifting a character out.
            TACTIVE OFFSET(11) NUMBITS(1) [],
        ],
        /// FIFO, UG1087 `TX_RX_FIFO` (offset 0x30): a write queues a byte for transmission.
        pub FIFO [
            /// The character.
            DATA OFFSET(0) NUMBITS(8) [],
        ],
    ];
}
pub use fields::{CR, FIFO, MR, SR};

/// Every interrupt source bit of IER/IDR/IMR/ISR (bits 13:0, RXOVR .. RBRK; UG1087
/// `Intrpt_dis`).
pub const ALL_INTERRUPTS: u32 = 0x3fff;

hal::register_block! {
    /// The UART register window (4 KiB at 0xFF00_0000 for UART0, zynqmp.dtsi).
    pub struct CadenceUartRegs {
        /// CR, `Control` (0x00).
        (0x000 => pub cr: Rw u32, CR::Register),
        /// MR, `mode` (0x04).
        (0x004 => pub mr: Rw u32, MR::Register),
        /// IDR, `Intrpt_dis` (0x0C), write-only: 1 disables a source.
        (0x00c => pub idr: Wo u32),
        /// IMR, `Intrpt_mask` (0x10), read-only: enabled sources.
        (0x010 => pub imr: Ro u32),
        /// BAUDGEN, `Baud_rate_gen` (0x18): CD, bits 15:0. Read only by this driver.
        (0x018 => pub baudgen: Rw u32),
        /// SR, `Channel_sts` (0x2C), read-only.
        (0x02c => pub sr: Ro u32, SR::Register),
        /// FIFO, `TX_RX_FIFO` (0x30).
        (0x030 => pub fifo: Rw u32, FIFO::Register),
        /// BAUDDIV, `Baud_rate_divider` (0x34): BDIV, bits 7:0. Read only by this driver.
        (0x034 => pub bauddiv: Rw u32),
    }
    size = 0x1000;
}

/// How many times a full transmit FIFO (or a self-clearing reset bit, or a busy transmitter)
/// is polled before giving up: a console must never hang the program, and with it the
/// verdict, on a stuck UART. The same bound as the PL011's.
pub const TX_POLL_LIMIT: u32 = crate::pl011::TX_POLL_LIMIT;

/// A polled Cadence UART transmitter implementing [`fmt::Write`]; `\n` is sent as `\r\n`.
pub struct CadenceUart<'a, B: RegisterBus + ?Sized> {
    regs: CadenceUartRegs<'a, B>,
}

impl<'a, B: RegisterBus + ?Sized> CadenceUart<'a, B> {
    /// The UART whose 4 KiB register window is `bus` (fails if the window is smaller).
    pub fn new(bus: &'a B) -> Result<Self> {
        Ok(Self {
            regs: CadenceUartRegs::new(bus, 0)?,
        })
    }

    /// The register block.
    pub fn regs(&self) -> &CadenceUartRegs<'a, B> {
        &self.regs
    }

    /// Whether the transmitter is on: CR.TX_EN set and CR.TX_DIS clear.
    pub fn transmitter_enabled(&self) -> bool {
        let cr = self.regs.cr().extract();
        cr.is_set(CR::TX_EN) && !cr.is_set(CR::TX_DIS)
    }

    /// Makes sure the transmitter is on. If it already is (the FSBL or `psu_init` set the
    /// UART up), nothing is touched, so the previous stage's line settings stay. Otherwise,
    /// following the UG1085 UART initialisation sequence without the baud-rate step: disable
    /// TX and RX, set 8 data bits, no parity, 1 stop bit, normal mode (keeping MR.CLKS),
    /// mask every interrupt, reset both paths (waiting, bounded, for the self-clearing
    /// bits), then enable TX and RX.
    pub fn init(&self) {
        if self.transmitter_enabled() {
            return;
        }
        self.regs
            .cr()
            .write(CR::TX_DIS::SET + CR::RX_DIS::SET + CR::STPBRK::SET);
        self.regs
            .mr()
            .modify(MR::CHRL::Bits8 + MR::PAR::NoParity + MR::NBSTOP::One + MR::CHMODE::Normal);
        self.regs.idr().set(ALL_INTERRUPTS);
        self.regs.cr().write(
            CR::TX_DIS::SET + CR::RX_DIS::SET + CR::STPBRK::SET + CR::TXRST::SET + CR::RXRST::SET,
        );
        for _ in 0..TX_POLL_LIMIT {
            let cr = self.regs.cr().extract();
            if !cr.is_set(CR::TXRST) && !cr.is_set(CR::RXRST) {
                break;
            }
            core::hint::spin_loop();
        }
        self.regs
            .cr()
            .write(CR::TX_EN::SET + CR::RX_EN::SET + CR::STPBRK::SET);
    }

    /// Sends one byte, waiting (bounded by [`TX_POLL_LIMIT`]) while SR.TXFULL is set.
    /// Returns false if the byte was dropped because the FIFO stayed full.
    pub fn write_byte(&self, byte: u8) -> bool {
        for _ in 0..TX_POLL_LIMIT {
            if !self.regs.sr().is_set(SR::TXFULL) {
                self.regs.fifo().write(FIFO::DATA.val(u32::from(byte)));
                return true;
            }
            core::hint::spin_loop();
        }
        false
    }

    /// Waits (bounded) until the FIFO is empty (SR.TXEMPTY) and the last character has left
    /// the shift register (SR.TACTIVE clear), so nothing is lost when the program stops.
    pub fn wait_idle(&self) {
        for _ in 0..TX_POLL_LIMIT {
            let sr = self.regs.sr().extract();
            if sr.is_set(SR::TXEMPTY) && !sr.is_set(SR::TACTIVE) {
                return;
            }
            core::hint::spin_loop();
        }
    }
}

impl<B: RegisterBus + ?Sized> fmt::Write for CadenceUart<'_, B> {
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

    const FIFO_DEPTH: usize = 64; // UG1085: 64-byte TX and RX FIFOs

    /// A Cadence UART transmitter as UG1085/UG1087 describe it: reset values CR 0x128,
    /// MR 0, BAUDGEN 0x28B, BAUDDIV 0xF; a FIFO write is queued only while TX is enabled
    /// (TX_EN and not TX_DIS) and lost (TOVR) when the 64-byte FIFO is full; TXRST/RXRST
    /// self-clear after `reset_reads` CR reads; the line takes one character every
    /// `reads_per_char` SR reads, and TACTIVE is set while a character is being shifted.
    struct UartModel {
        cr: u32,
        mr: u32,
        imr: u32,
        baudgen: u32,
        bauddiv: u32,
        fifo: std::collections::VecDeque<u8>,
        shifting: Option<u8>,
        line: Vec<u8>,
        reads_per_char: u32,
        reads_left: u32,
        reset_reads: u32,
        reset_left: u32,
        /// The line never takes a character (a stuck transmitter).
        stuck: bool,
        sr_reads: u64,
        writes_while_full: u32,
        writes_while_disabled: u32,
        divisor_writes: u32,
        resets: u32,
    }

    impl UartModel {
        fn at_reset(reads_per_char: u32) -> Self {
            Self {
                cr: 0x128,
                mr: 0,
                imr: 0,
                baudgen: 0x28b,
                bauddiv: 0xf,
                fifo: Default::default(),
                shifting: None,
                line: Vec::new(),
                reads_per_char,
                reads_left: 0,
                reset_reads: 2,
                reset_left: 0,
                stuck: false,
                sr_reads: 0,
                writes_while_full: 0,
                writes_while_disabled: 0,
                divisor_writes: 0,
                resets: 0,
            }
        }

        /// As the FSBL leaves UART0: 115200 8N1 from a 100 MHz reference (CD 124, BDIV 6),
        /// TX and RX enabled.
        fn after_fsbl(reads_per_char: u32) -> Self {
            let mut m = Self::at_reset(reads_per_char);
            m.cr = 0x114; // TX_EN | RX_EN | STPBRK
            m.mr = 0x20; // 8 bits, no parity, 1 stop
            m.baudgen = 124;
            m.bauddiv = 6;
            m
        }

        fn tx_enabled(&self) -> bool {
            self.cr & 0x30 == 0x10
        }

        /// One SR read's worth of line time.
        fn tick(&mut self) {
            if self.stuck {
                return;
            }
            if self.reads_left > 0 {
                self.reads_left -= 1;
                return;
            }
            if let Some(c) = self.shifting.take() {
                self.line.push(c);
            }
            if let Some(c) = self.fifo.pop_front() {
                self.shifting = Some(c);
                self.reads_left = self.reads_per_char;
            }
        }
    }

    impl RegisterModel for UartModel {
        fn size(&self) -> usize {
            0x1000
        }
        fn read(&mut self, offset: usize, _width: AccessWidth) -> u64 {
            match offset {
                0x00 => {
                    if self.reset_left > 0 {
                        self.reset_left -= 1;
                        if self.reset_left == 0 {
                            self.cr &= !0b11;
                        }
                    }
                    u64::from(self.cr)
                }
                0x04 => u64::from(self.mr),
                0x10 => u64::from(self.imr),
                0x18 => u64::from(self.baudgen),
                0x2c => {
                    self.sr_reads += 1;
                    self.tick();
                    let mut sr = 0u32;
                    if self.fifo.is_empty() {
                        sr |= 1 << 3; // TXEMPTY
                    }
                    if self.fifo.len() >= FIFO_DEPTH {
                        sr |= 1 << 4; // TXFULL
                    }
                    if self.shifting.is_some() {
                        sr |= 1 << 11; // TACTIVE
                    }
                    u64::from(sr | 1 << 1) // RXEMPTY: nothing received
                }
                0x34 => u64::from(self.bauddiv),
                _ => 0,
            }
        }
        fn write(&mut self, offset: usize, _width: AccessWidth, value: u64) {
            let v = value as u32;
            match offset {
                0x00 => {
                    self.cr = v & 0x1ff;
                    if v & 0b11 != 0 {
                        self.resets += 1;
                        self.fifo.clear();
                        self.reset_left = self.reset_reads;
                    }
                }
                0x04 => self.mr = v & 0x3ff,
                0x0c => self.imr &= !v,
                0x18 | 0x34 => self.divisor_writes += 1,
                0x30 => {
                    if !self.tx_enabled() {
                        self.writes_while_disabled += 1;
                    } else if self.fifo.len() >= FIFO_DEPTH {
                        self.writes_while_full += 1;
                    } else {
                        self.fifo.push_back(v as u8);
                    }
                }
                _ => {}
            }
        }
    }

    #[test]
    fn init_from_reset_enables_8n1_and_keeps_the_baud_divisors() {
        let mut model = UartModel::at_reset(0);
        model.mr = 0x1; // CLKS set by someone: part of the line rate, must stay
        model.imr = 0x3fff;
        let bus = ModelBus::new(model);
        let uart = CadenceUart::new(&bus).unwrap();
        assert!(!uart.transmitter_enabled(), "reset value 0x128 has TX_DIS");
        uart.init();
        let m = bus.lock();
        // TX_EN (bit 4) | RX_EN (bit 2) | STPBRK (bit 8); reset bits cleared by hardware.
        assert_eq!(m.cr, 0x114);
        // CHRL 0b00 (8 bits), PAR 0b100 (none) at bits 5:3, NBSTOP 0, CHMODE 0, CLKS kept.
        assert_eq!(m.mr, 0x21);
        assert_eq!(m.imr, 0, "every interrupt masked");
        assert_eq!(m.resets, 1, "TX and RX paths reset once");
        assert_eq!(m.divisor_writes, 0, "BAUDGEN/BAUDDIV untouched");
        assert_eq!((m.baudgen, m.bauddiv), (0x28b, 0xf));
        drop(m);
        assert!(uart.transmitter_enabled());
    }

    #[test]
    fn init_keeps_a_uart_the_fsbl_enabled() {
        let bus = ModelBus::new(UartModel::after_fsbl(0));
        CadenceUart::new(&bus).unwrap().init();
        let m = bus.lock();
        assert_eq!((m.cr, m.mr, m.baudgen, m.bauddiv), (0x114, 0x20, 124, 6));
        assert_eq!((m.resets, m.divisor_writes), (0, 0));
    }

    #[test]
    fn tx_dis_wins_over_tx_en() {
        let mut model = UartModel::after_fsbl(0);
        model.cr = 0x134; // TX_EN and TX_DIS: disabled
        let bus = ModelBus::new(model);
        let uart = CadenceUart::new(&bus).unwrap();
        assert!(!uart.transmitter_enabled());
        uart.init();
        assert_eq!(bus.lock().cr, 0x114);
    }

    #[test]
    fn text_longer_than_the_fifo_waits_for_room_and_arrives_in_order() {
        // A slow line: 5 status reads per character, so the 64-byte FIFO fills up.
        let bus = ModelBus::new(UartModel::after_fsbl(5));
        let mut uart = CadenceUart::new(&bus).unwrap();
        let text: String = (0..300)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        write!(uart, "{text}\nNPRDMA-VERDICT: PASS x\n").unwrap();
        uart.wait_idle();
        let m = bus.into_inner();
        let expected = format!("{text}\r\nNPRDMA-VERDICT: PASS x\r\n");
        assert_eq!(String::from_utf8(m.line).unwrap(), expected);
        assert_eq!(m.writes_while_full, 0, "never wrote while TXFULL");
        assert_eq!(m.writes_while_disabled, 0);
        assert!(m.fifo.is_empty() && m.shifting.is_none(), "drained");
    }

    #[test]
    fn wait_idle_waits_for_the_shift_register_too() {
        let bus = ModelBus::new(UartModel::after_fsbl(3));
        let uart = CadenceUart::new(&bus).unwrap();
        assert!(uart.write_byte(b'Z'));
        uart.wait_idle();
        let m = bus.lock();
        assert_eq!(
            m.line, b"Z",
            "the last character left the line before wait_idle returned"
        );
    }

    #[test]
    fn a_stuck_fifo_drops_characters_after_a_bounded_wait() {
        let mut model = UartModel::after_fsbl(0);
        model.stuck = true;
        model.fifo.extend([b'.'; FIFO_DEPTH]);
        let bus = ModelBus::new(model);
        let uart = CadenceUart::new(&bus).unwrap();
        assert!(!uart.write_byte(b'x'));
        {
            let m = bus.lock();
            assert_eq!(
                m.sr_reads,
                u64::from(TX_POLL_LIMIT),
                "polled exactly the limit"
            );
            assert_eq!(m.writes_while_full, 0);
            assert_eq!(m.fifo.len(), FIFO_DEPTH);
        }
        uart.wait_idle(); // returns although TXEMPTY never comes
        assert_eq!(bus.lock().sr_reads, 2 * u64::from(TX_POLL_LIMIT));
    }

    #[test]
    fn window_smaller_than_the_register_block_is_an_error() {
        struct Tiny;
        impl RegisterModel for Tiny {
            fn size(&self) -> usize {
                0x20
            }
            fn read(&mut self, _: usize, _: AccessWidth) -> u64 {
                0
            }
            fn write(&mut self, _: usize, _: AccessWidth, _: u64) {}
        }
        let bus = ModelBus::new(Tiny);
        assert!(CadenceUart::new(&bus).is_err());
    }
}
