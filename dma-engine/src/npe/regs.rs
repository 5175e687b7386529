//! NPE registers (docs/dma-engine.md §3). Offsets and fields are ours: the spec is the source.

pub use fields::*;

/// Register fields. Every register and field has a doc comment; the helper items
/// `register_bitfields!` generates have none, hence the `allow`.
#[allow(missing_docs)]
pub mod fields {
    use tock_registers::register_bitfields;

    register_bitfields![u32,
        /// `ID` (0x000): identification.
        pub ID [
            /// Spec version.
            VERSION OFFSET(0) NUMBITS(8) [],
            /// Magic 0x4E5045 ("NPE").
            MAGIC OFFSET(8) NUMBITS(24) []
        ],
        /// `CAPS` (0x004): what this engine has.
        pub CAPS [
            /// Number of channels.
            CHANNELS OFFSET(0) NUMBITS(8) [],
            /// Block size as log2 − 12.
            BLOCK_SHIFT OFFSET(8) NUMBITS(4) [],
            /// log2 of the number of receive slots.
            RX_SLOTS_LOG2 OFFSET(12) NUMBITS(4) [],
            /// Largest log2 SQ/CQ size.
            SQ_MAX_LOG2 OFFSET(16) NUMBITS(4) [],
            /// Largest log2 RQ/WQ/WCQ size.
            RQ_MAX_LOG2 OFFSET(20) NUMBITS(4) [],
            /// The AXI masters tolerate SMMU stalls.
            STALL_TOLERANT OFFSET(24) NUMBITS(1) []
        ],
        /// `NODE` (0x008): this node's ExaNet coordinate.
        pub NODE [
            /// 22-bit coordinate.
            COORD OFFSET(0) NUMBITS(22) [],
            /// The coordinate is valid.
            VALID OFFSET(31) NUMBITS(1) []
        ],
        /// `CTRL` (0x00C).
        pub CTRL [
            /// Engine enabled.
            ENABLE OFFSET(0) NUMBITS(1) [],
            /// Soft reset, self-clearing.
            SOFT_RESET OFFSET(1) NUMBITS(1) [],
            /// Global interrupt enable.
            IRQ_EN OFFSET(2) NUMBITS(1) []
        ],
        /// `IRQ_STATUS` (0x010), read-only summary.
        pub IRQ_STATUS [
            /// Some channel has a `CH_IRQ` cause pending.
            CHANNEL OFFSET(0) NUMBITS(1) [],
            /// The RQ is not empty.
            RQ OFFSET(1) NUMBITS(1) [],
            /// The WCQ is not empty.
            WCQ OFFSET(2) NUMBITS(1) [],
            /// A `GEVENT` bit is set.
            GEVENT OFFSET(3) NUMBITS(1) []
        ],
        /// `GEVENT` (0x014), write-1-to-clear.
        pub GEVENT [
            /// A producer index moved past the ring size; the write was ignored.
            BAD_DOORBELL OFFSET(0) NUMBITS(1) [],
            /// A peer is unreachable.
            LINK_ERROR OFFSET(1) NUMBITS(1) [],
            /// A corrupt packet was dropped.
            CRC_DROP OFFSET(2) NUMBITS(1) [],
            /// Arriving traffic was held for lack of a slot or RQ entry.
            RX_HELD OFFSET(3) NUMBITS(1) [],
            /// An access to the RQ, WQ or WCQ failed; that ring stops until its base is
            /// written again (§4).
            QUEUE_ERROR OFFSET(4) NUMBITS(1) []
        ],
        /// Ring size registers (`*_CFG`).
        pub RING_CFG [
            /// log2 of the number of entries.
            LOG2 OFFSET(0) NUMBITS(5) []
        ],
        /// `RX_STATUS` (0x064).
        pub RX_STATUS [
            /// Free receive slots.
            FREE_SLOTS OFFSET(0) NUMBITS(16) [],
            /// Blocks held at the ingress.
            HELD OFFSET(16) NUMBITS(16) []
        ],
        /// `CH_CTRL` (channel 0x2C).
        pub CH_CTRL [
            /// Channel enabled.
            EN OFFSET(0) NUMBITS(1) [],
            /// Channel interrupt enable.
            IRQ_EN OFFSET(1) NUMBITS(1) [],
            /// Protection domain of the channel's buffers.
            PDID OFFSET(16) NUMBITS(16) []
        ],
        /// `CH_STATUS` (channel 0x30), read-only.
        pub CH_STATUS [
            /// Channel state.
            STATE OFFSET(0) NUMBITS(3) [
                /// Disabled or nothing to do.
                Idle = 0,
                /// Working.
                Running = 1,
                /// A source read was terminated; waiting for `RESUME`.
                FaultWait = 2,
                /// Stopped by an error.
                Error = 3,
                /// An access of the channel is held by the SMMU.
                Stalled = 4
            ],
            /// Last error status.
            LAST_ERROR OFFSET(8) NUMBITS(8) [],
            /// Descriptors pending (TAIL − HEAD).
            PENDING OFFSET(16) NUMBITS(16) []
        ],
        /// `CH_IRQ` (channel 0x34), write-1-to-clear.
        pub CH_IRQ [
            /// CQ entries were written.
            COMPLETION OFFSET(0) NUMBITS(1) [],
            /// The channel entered FAULT_WAIT.
            LOCAL_FAULT OFFSET(1) NUMBITS(1) [],
            /// The channel stopped with an error.
            ERROR OFFSET(2) NUMBITS(1) []
        ],
        /// `FAULT_INFO` (channel 0x40).
        pub FAULT_INFO [
            /// SQ index (mod 2^16) of the faulting descriptor.
            SQ_INDEX OFFSET(0) NUMBITS(16) []
        ],
        /// `FAULT_SYNDROME` (channel 0x44).
        pub FAULT_SYNDROME [
            /// AXI response: 2 SLVERR, 3 DECERR.
            RESP OFFSET(0) NUMBITS(2) [],
            /// The fault registers are valid.
            VALID OFFSET(3) NUMBITS(1) []
        ],
        /// `RESUME` (channel 0x48), write-only.
        pub RESUME [
            /// Re-read the faulting block and continue.
            RETRY OFFSET(0) NUMBITS(1) [],
            /// Finish the descriptor with SRC_FAULT and continue.
            SKIP OFFSET(1) NUMBITS(1) []
        ]
    ];
}

/// `ID.MAGIC` of an NPE.
pub const MAGIC: u32 = 0x4E_5045;
/// The spec version this driver implements.
pub const VERSION: u32 = 1;
/// Size of an engine's register window.
pub const WINDOW_SIZE: usize = 0x1_0000;
/// Offset of channel 0's register block.
pub const CHANNEL_BASE: usize = 0x1000;
/// Distance between channel register blocks.
pub const CHANNEL_STRIDE: usize = 0x100;
/// Most channels the register map has room for.
pub const MAX_CHANNELS: usize = 32;

hal::register_block! {
    /// The global registers at offset 0 of the engine window.
    pub struct NpeGlobal {
        /// Identification.
        (0x000 => pub id: Ro u32, ID::Register),
        /// Capabilities.
        (0x004 => pub caps: Ro u32, CAPS::Register),
        /// Node coordinate.
        (0x008 => pub node: Rw u32, NODE::Register),
        /// Control.
        (0x00c => pub ctrl: Rw u32, CTRL::Register),
        /// Interrupt summary.
        (0x010 => pub irq_status: Ro u32, IRQ_STATUS::Register),
        /// Global events (W1C).
        (0x014 => pub gevent: Rw u32, GEVENT::Register),
        /// RQ bus address.
        (0x020 => pub rq_base: Rw u64),
        /// RQ size.
        (0x028 => pub rq_cfg: Rw u32, RING_CFG::Register),
        /// RQ consumer index (driver).
        (0x02c => pub rq_head: Rw u32),
        /// RQ producer index (engine).
        (0x030 => pub rq_tail: Ro u32),
        /// WQ bus address.
        (0x038 => pub wq_base: Rw u64),
        /// WQ size.
        (0x040 => pub wq_cfg: Rw u32, RING_CFG::Register),
        /// WQ producer index: doorbell.
        (0x044 => pub wq_tail: Rw u32),
        /// WQ consumer index (engine).
        (0x048 => pub wq_head: Ro u32),
        /// WCQ bus address.
        (0x050 => pub wcq_base: Rw u64),
        /// WCQ size.
        (0x058 => pub wcq_cfg: Rw u32, RING_CFG::Register),
        /// WCQ consumer index (driver).
        (0x05c => pub wcq_head: Rw u32),
        /// WCQ producer index (engine).
        (0x060 => pub wcq_tail: Ro u32),
        /// Receive slot status.
        (0x064 => pub rx_status: Ro u32, RX_STATUS::Register),
        /// Blocks sent (wraps).
        (0x068 => pub tx_blocks: Ro u32),
        /// Blocks received (wraps).
        (0x06c => pub rx_blocks: Ro u32),
    }
    size = 0x1000;
}

hal::register_block! {
    /// One channel's registers at 0x1000 + n * 0x100.
    pub struct NpeChannel {
        /// SQ bus address.
        (0x00 => pub sq_base: Rw u64),
        /// SQ size.
        (0x08 => pub sq_cfg: Rw u32, RING_CFG::Register),
        /// SQ producer index: doorbell.
        (0x0c => pub sq_tail: Rw u32),
        /// SQ consumer index (engine).
        (0x10 => pub sq_head: Ro u32),
        /// CQ bus address.
        (0x18 => pub cq_base: Rw u64),
        /// CQ size.
        (0x20 => pub cq_cfg: Rw u32, RING_CFG::Register),
        /// CQ consumer index (driver).
        (0x24 => pub cq_head: Rw u32),
        /// CQ producer index (engine).
        (0x28 => pub cq_tail: Ro u32),
        /// Channel control.
        (0x2c => pub ctrl: Rw u32, CH_CTRL::Register),
        /// Channel status.
        (0x30 => pub status: Ro u32, CH_STATUS::Register),
        /// Interrupt causes (W1C).
        (0x34 => pub irq: Rw u32, CH_IRQ::Register),
        /// Address of the terminated read.
        (0x38 => pub fault_addr: Ro u64),
        /// Which descriptor faulted.
        (0x40 => pub fault_info: Ro u32, FAULT_INFO::Register),
        /// AXI response of the fault.
        (0x44 => pub fault_syndrome: Ro u32, FAULT_SYNDROME::Register),
        /// Resume after a fault.
        (0x48 => pub resume: Wo u32, RESUME::Register),
    }
    size = 0x100;
}

/// Offset of channel `n`'s register block in the window.
pub const fn channel_offset(n: usize) -> usize {
    CHANNEL_BASE + n * CHANNEL_STRIDE
}
