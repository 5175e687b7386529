//! zDMA channel registers.
//!
//! Sources: Xilinx UG1085 chapter "DMA Controller" and UG1087 module `ZDMA` (register names
//! `ZDMA_CH_*`, given below without the prefix); offsets and bits checked against Linux
//! `drivers/dma/xilinx/zynqmp_dma.c` (`ZYNQMP_DMA_*`) and QEMU `hw/dma/xlnx-zdma.c`
//! (`REG32(ZDMA_CH_*)`, which also gives the access types: ISR and TOTAL_BYTE are W1C, IMR is
//! read-only and changed through IEN/IDS, IRQ_*_ACCT clear on read). The channel window is
//! 4 KiB (zynqmp.dtsi `reg = <... 0x1000>`).

pub use fields::*;

/// Register fields. Every register and field has a doc comment; the helper items
/// `register_bitfields!` generates have none, hence the `allow`.
#[allow(missing_docs)]
pub mod fields {
    use tock_registers::register_bitfields;

    register_bitfields![u32,
        /// ISR/IMR/IEN/IDS interrupt bits (`ZDMA_CH_ISR` 0x100, W1C; Linux
        /// `ZYNQMP_DMA_DONE` etc.; QEMU adds DMA_PAUSE and SRC_DSCR_DONE).
        pub INT [
            /// Invalid APB (register) access.
            INV_APB OFFSET(0) NUMBITS(1) [],
            /// A source descriptor with INTR completed.
            SRC_DSCR_DONE OFFSET(1) NUMBITS(1) [],
            /// A destination descriptor with INTR completed.
            DST_DSCR_DONE OFFSET(2) NUMBITS(1) [],
            /// TOTAL_BYTE overflowed.
            BYTE_CNT_OVRFL OFFSET(3) NUMBITS(1) [],
            /// IRQ_SRC_ACCT overflowed.
            IRQ_SRC_ACCT_ERR OFFSET(4) NUMBITS(1) [],
            /// IRQ_DST_ACCT overflowed.
            IRQ_DST_ACCT_ERR OFFSET(5) NUMBITS(1) [],
            /// AXI error reading a source descriptor.
            AXI_RD_SRC_DSCR OFFSET(6) NUMBITS(1) [],
            /// AXI error reading a destination descriptor.
            AXI_RD_DST_DSCR OFFSET(7) NUMBITS(1) [],
            /// AXI error response on a data read.
            AXI_RD_DATA OFFSET(8) NUMBITS(1) [],
            /// AXI error response on a data write.
            AXI_WR_DATA OFFSET(9) NUMBITS(1) [],
            /// The transfer completed.
            DMA_DONE OFFSET(10) NUMBITS(1) [],
            /// The channel paused (scatter-gather HALT command).
            DMA_PAUSE OFFSET(11) NUMBITS(1) []
        ],
        /// CTRL0 (`ZDMA_CH_CTRL0` 0x110, reset 0x80).
        pub CTRL0 [
            /// Continue after a pause.
            CONT OFFSET(1) NUMBITS(1) [],
            /// Continue from the start addresses.
            CONT_ADDR OFFSET(2) NUMBITS(1) [],
            /// Rate control enable.
            RATE_CTRL OFFSET(3) NUMBITS(1) [],
            /// Read/write mode: 0 both, 1 write only, 2 read only.
            MODE OFFSET(4) NUMBITS(2) [
                /// Read the source, write the destination.
                ReadWrite = 0,
                /// Write only (from WR_ONLY_WORD*).
                WriteOnly = 1,
                /// Read only.
                ReadOnly = 2
            ],
            /// Descriptor location: 0 = registers (simple mode), 1 = memory (scatter-gather).
            POINT_TYPE OFFSET(6) NUMBITS(1) [
                /// Simple mode: descriptors in the channel's registers.
                Simple = 0,
                /// Scatter-gather: descriptors in memory.
                ScatterGather = 1
            ],
            /// Descriptor over-fetch.
            OVR_FETCH OFFSET(7) NUMBITS(1) []
        ],
        /// STATUS (`ZDMA_CH_STATUS` 0x11C, read-only). STATE as Xilinx's own bare-metal
        /// driver decodes it (embeddedsw `zdma/src/xzdma_hw.h` `XZDMA_STS_*` and
        /// `XZDma_ChannelState` in `xzdma.c`): 0 done, 1 paused, 2 busy, 3 done with an error.
        /// QEMU's `xlnx-zdma` model swaps the middle two (it stores its `ENABLED = 1` /
        /// `PAUSED = 2` state there), so the driver treats both as "the channel is active" and
        /// works with either encoding.
        pub STATUS [
            /// Channel state.
            STATE OFFSET(0) NUMBITS(2) [
                /// Done without error (also the reset state).
                Done = 0,
                /// Paused (by a descriptor's PAUSE command; QEMU reports a running channel
                /// here).
                Paused = 1,
                /// Running (QEMU reports a paused channel here).
                Busy = 2,
                /// Done with an error.
                DoneWithError = 3
            ]
        ],
        /// SRC/DST_DSCR_WORD2 (0x130 / 0x140): transfer size.
        pub DSCR_SIZE [
            /// Bytes, 30 bits.
            SIZE OFFSET(0) NUMBITS(30) []
        ],
        /// SRC/DST_DSCR_WORD3 (0x134 / 0x144): descriptor control (Linux
        /// `ZYNQMP_DMA_DESC_CTRL_*`).
        pub DSCR_CTRL [
            /// Coherent (snooping) AXI transactions.
            COHRNT OFFSET(0) NUMBITS(1) [],
            /// Descriptor type (linear/linked, scatter-gather only).
            TYPE OFFSET(1) NUMBITS(1) [],
            /// Raise SRC/DST_DSCR_DONE when the descriptor completes.
            INTR OFFSET(2) NUMBITS(1) [],
            /// Command after the descriptor (source only, scatter-gather): 1 halt, 2 stop.
            CMD OFFSET(3) NUMBITS(2) []
        ],
        /// DATA_ATTR (`ZDMA_CH_DATA_ATTR` 0x120, reset 0x0483_D20F): AXI attributes of the
        /// data reads (AR*) and writes (AW*). Linux `ZYNQMP_DMA_AR*`/`AW*`.
        pub DATA_ATTR [
            /// Write burst length - 1, beats (reset 0xF).
            AWLEN OFFSET(0) NUMBITS(4) [],
            /// Write QoS.
            AWQOS OFFSET(4) NUMBITS(4) [],
            /// Write AxCACHE (reset 0b0010: normal non-cacheable, no snoop).
            AWCACHE OFFSET(8) NUMBITS(4) [],
            /// Write burst type (reset 1, INCR).
            AWBURST OFFSET(12) NUMBITS(2) [],
            /// Read burst length - 1, beats (reset 0xF).
            ARLEN OFFSET(14) NUMBITS(4) [],
            /// Read QoS.
            ARQOS OFFSET(18) NUMBITS(4) [],
            /// Read AxCACHE (reset 0b0010).
            ARCACHE OFFSET(22) NUMBITS(4) [],
            /// Read burst type (reset 1, INCR).
            ARBURST OFFSET(26) NUMBITS(2) []
        ],
        /// DSCR_ATTR (`ZDMA_CH_DSCR_ATTR` 0x124, reset 0): AXI attributes of descriptor
        /// fetches. Linux `ZYNQMP_DMA_AXQOS`, `AXCACHE`, `AXCOHRNT`.
        pub DSCR_ATTR [
            /// Descriptor QoS.
            AXQOS OFFSET(0) NUMBITS(4) [],
            /// Descriptor AxCACHE.
            AXCACHE OFFSET(4) NUMBITS(4) [],
            /// Coherent descriptor fetches.
            AXCOHRNT OFFSET(8) NUMBITS(1) []
        ],
        /// CTRL2 (`ZDMA_CH_CTRL2` 0x200).
        pub CTRL2 [
            /// Start the channel.
            EN OFFSET(0) NUMBITS(1) []
        ]
    ];
}

hal::register_block! {
    /// One zDMA channel (GDMA: 0xFD50_0000 + n * 0x1_0000; ADMA: 0xFFA8_0000 + n * 0x1_0000).
    pub struct ZdmaRegs {
        /// ERR_CTRL (`ZDMA_ERR_CTRL`).
        (0x000 => pub err_ctrl: Rw u32),
        /// ISR, W1C (`ZDMA_CH_ISR`).
        (0x100 => pub isr: Rw u32, INT::Register),
        /// IMR, read-only mask (`ZDMA_CH_IMR`, reset all masked).
        (0x104 => pub imr: Ro u32, INT::Register),
        /// IEN: write 1 to unmask (`ZDMA_CH_IEN`).
        (0x108 => pub ien: Wo u32, INT::Register),
        /// IDS: write 1 to mask (`ZDMA_CH_IDS`).
        (0x10c => pub ids: Wo u32, INT::Register),
        /// CTRL0 (`ZDMA_CH_CTRL0`).
        (0x110 => pub ctrl0: Rw u32, CTRL0::Register),
        /// CTRL1: outstanding transaction limits (`ZDMA_CH_CTRL1`).
        (0x114 => pub ctrl1: Rw u32),
        /// STATUS (`ZDMA_CH_STATUS`).
        (0x11c => pub status: Ro u32, STATUS::Register),
        /// DATA_ATTR: AXI burst, cache and QoS attributes (`ZDMA_CH_DATA_ATTR`).
        (0x120 => pub data_attr: Rw u32, DATA_ATTR::Register),
        /// DSCR_ATTR: descriptor fetch attributes (`ZDMA_CH_DSCR_ATTR`).
        (0x124 => pub dscr_attr: Rw u32, DSCR_ATTR::Register),
        /// SRC_DSCR_WORD0: source address bits 31:0.
        (0x128 => pub src_word0: Rw u32),
        /// SRC_DSCR_WORD1: source address bits 48:32 (17 bits).
        (0x12c => pub src_word1: Rw u32),
        /// SRC_DSCR_WORD2: size.
        (0x130 => pub src_word2: Rw u32, DSCR_SIZE::Register),
        /// SRC_DSCR_WORD3: control.
        (0x134 => pub src_word3: Rw u32, DSCR_CTRL::Register),
        /// DST_DSCR_WORD0: destination address bits 31:0.
        (0x138 => pub dst_word0: Rw u32),
        /// DST_DSCR_WORD1: destination address bits 48:32.
        (0x13c => pub dst_word1: Rw u32),
        /// DST_DSCR_WORD2: size (ignored in simple read/write mode; the source size counts).
        (0x140 => pub dst_word2: Rw u32, DSCR_SIZE::Register),
        /// DST_DSCR_WORD3: control.
        (0x144 => pub dst_word3: Rw u32, DSCR_CTRL::Register),
        /// TOTAL_BYTE: bytes transferred, W1C (`ZDMA_CH_TOTAL_BYTE`).
        (0x188 => pub total_byte: Rw u32),
        /// IRQ_SRC_ACCT: completed source descriptors, clear on read.
        (0x190 => pub irq_src_acct: Ro u32),
        /// IRQ_DST_ACCT: completed destination descriptors, clear on read.
        (0x194 => pub irq_dst_acct: Ro u32),
        /// CTRL2 (`ZDMA_CH_CTRL2`).
        (0x200 => pub ctrl2: Rw u32, CTRL2::Register),
    }
    size = 0x1000;
}
