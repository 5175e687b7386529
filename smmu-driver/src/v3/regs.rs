//! SMMUv3 programming-interface registers: fields (tock-registers) and the register block.
//!
//! Sources, for every register below: Arm IHI0070 (SMMUv3 architecture, version G.b),
//! chapter 6.3 "Register formats" (section numbers in each doc comment); Linux
//! `drivers/iommu/arm/arm-smmu-v3/arm-smmu-v3.h` and FreeBSD `sys/arm64/iommu/smmureg.h`,
//! which were read to cross-check every offset and bit position; QEMU 7.2 `hw/arm/smmuv3.c`
//! for what QEMU implements.
//!
//! Access widths: QEMU 7.2 accepts 64-bit accesses only for `GERROR_IRQ_CFG0`,
//! `STRTAB_BASE`, `CMDQ_BASE` and `EVENTQ_BASE`; any other 64-bit access reads 0 and is
//! ignored (`smmu_readll`, `smmu_writell`). The driver does not use `GERROR_IRQ_CFG0` (no MSIs), so
//! only the other three are `u64` registers here, and
//! every other register (the queue PROD/CONS indexes included) is a 32-bit access.
//!
//! The generated helper items of `register_bitfields!` carry no docs, hence the `allow`.
#![allow(missing_docs)]

use tock_registers::register_bitfields;

register_bitfields![u32,
    /// SMMU_IDR0, features (IHI0070 §6.3.1).
    pub IDR0 [
        /// Stage-2 translation supported.
        S2P OFFSET(0) NUMBITS(1) [],
        /// Stage-1 translation supported.
        S1P OFFSET(1) NUMBITS(1) [],
        /// Translation table formats.
        TTF OFFSET(2) NUMBITS(2) [
            /// AArch32 (LPAE) only.
            AArch32 = 1,
            /// AArch64 only.
            AArch64 = 2,
            /// Both.
            Both = 3
        ],
        /// Coherent access to tables, queues and translations.
        COHACC OFFSET(4) NUMBITS(1) [],
        /// Broadcast TLB maintenance.
        BTM OFFSET(5) NUMBITS(1) [],
        /// Hardware access flag / dirty state updates.
        HTTU OFFSET(6) NUMBITS(2) [],
        /// Hypervisor stage-1 contexts.
        HYP OFFSET(9) NUMBITS(1) [],
        /// PCIe ATS.
        ATS OFFSET(10) NUMBITS(1) [],
        /// 16-bit ASIDs.
        ASID16 OFFSET(12) NUMBITS(1) [],
        /// Message-signalled interrupts.
        MSI OFFSET(13) NUMBITS(1) [],
        /// WFE wake-up events (CMD_SYNC SIG_SEV).
        SEV OFFSET(14) NUMBITS(1) [],
        /// PCIe PRI.
        PRI OFFSET(16) NUMBITS(1) [],
        /// 16-bit VMIDs.
        VMID16 OFFSET(18) NUMBITS(1) [],
        /// Two-level CD tables.
        CD2L OFFSET(19) NUMBITS(1) [],
        /// Endianness of table walks.
        TTENDIAN OFFSET(21) NUMBITS(2) [
            /// Mixed (CD.ENDI selects).
            Mixed = 0,
            /// Little-endian only.
            Little = 2,
            /// Big-endian only.
            Big = 3
        ],
        /// Stall model.
        STALL_MODEL OFFSET(24) NUMBITS(2) [
            /// Stall and terminate models both supported.
            StallAndTerminate = 0,
            /// Terminate model only (QEMU 7.2).
            TerminateOnly = 1,
            /// Stall is forced for every faulting transaction (CD.S must be 1).
            StallForced = 2
        ],
        /// 1: a terminated transaction always aborts (no RAZ/WI); CD.A must be 1.
        TERM_MODEL OFFSET(26) NUMBITS(1) [],
        /// Stream table levels supported.
        ST_LEVEL OFFSET(27) NUMBITS(2) [
            /// Linear only.
            Linear = 0,
            /// Linear and two-level.
            TwoLevel = 1
        ]
    ],
    /// SMMU_IDR1, table and queue sizes (IHI0070 §6.3.2).
    pub IDR1 [
        /// StreamID bits.
        SIDSIZE OFFSET(0) NUMBITS(6) [],
        /// SubstreamID bits (0: no substreams).
        SSIDSIZE OFFSET(6) NUMBITS(5) [],
        /// log2 of the largest PRI queue.
        PRIQS OFFSET(11) NUMBITS(5) [],
        /// log2 of the largest event queue.
        EVENTQS OFFSET(16) NUMBITS(5) [],
        /// log2 of the largest command queue.
        CMDQS OFFSET(21) NUMBITS(5) [],
        /// Base addresses are relative (with TABLES/QUEUES_PRESET).
        REL OFFSET(28) NUMBITS(1) [],
        /// Queue bases are fixed by the implementation.
        QUEUES_PRESET OFFSET(29) NUMBITS(1) [],
        /// Table bases are fixed by the implementation.
        TABLES_PRESET OFFSET(30) NUMBITS(1) [],
        /// Enhanced command queues.
        ECMDQ OFFSET(31) NUMBITS(1) []
    ],
    /// SMMU_IDR3 (IHI0070 §6.3.4).
    pub IDR3 [
        /// Hierarchical attribute disable.
        HAD OFFSET(2) NUMBITS(1) [],
        /// Range-based invalidation and the TTL level hint (SMMUv3.2; QEMU 7.2 sets it).
        RIL OFFSET(10) NUMBITS(1) [],
        /// Break-before-make level.
        BBML OFFSET(11) NUMBITS(2) []
    ],
    /// SMMU_IDR5, address sizes and granules (IHI0070 §6.3.6).
    pub IDR5 [
        /// Output address size (0 = 32, 1 = 36, 2 = 40, 3 = 42, 4 = 44, 5 = 48, 6 = 52 bits).
        OAS OFFSET(0) NUMBITS(3) [],
        /// 4 KiB translation granule.
        GRAN4K OFFSET(4) NUMBITS(1) [],
        /// 16 KiB translation granule.
        GRAN16K OFFSET(5) NUMBITS(1) [],
        /// 64 KiB translation granule.
        GRAN64K OFFSET(6) NUMBITS(1) [],
        /// Virtual address extension (0: 48-bit VAs).
        VAX OFFSET(10) NUMBITS(2) [],
        /// Most stalled transactions the SMMU holds at once.
        STALL_MAX OFFSET(16) NUMBITS(16) []
    ],
    /// SMMU_AIDR, architecture version (IHI0070 §6.3.8).
    pub AIDR [
        /// Minor revision (0 = SMMUv3.0, 1 = v3.1, ...).
        ARCH_MINOR_REV OFFSET(0) NUMBITS(4) [],
        /// Major revision (0 = SMMUv3).
        ARCH_MAJOR_REV OFFSET(4) NUMBITS(4) []
    ],
    /// SMMU_CR0 and SMMU_CR0ACK (IHI0070 §6.3.9, §6.3.10): write CR0, then wait for CR0ACK to
    /// show the same value.
    pub CR0 [
        /// Translation enabled (0: every transaction bypasses or aborts per GBPA).
        SMMUEN OFFSET(0) NUMBITS(1) [],
        /// PRI queue enabled.
        PRIQEN OFFSET(1) NUMBITS(1) [],
        /// Event queue enabled.
        EVENTQEN OFFSET(2) NUMBITS(1) [],
        /// Command queue processing enabled.
        CMDQEN OFFSET(3) NUMBITS(1) [],
        /// ATS safe mode.
        ATSCHK OFFSET(4) NUMBITS(1) [],
        /// VMID wildcard.
        VMW OFFSET(6) NUMBITS(3) []
    ],
    /// SMMU_CR1, memory attributes of table and queue accesses (IHI0070 §6.3.11); writable
    /// only while CR0.SMMUEN = 0.
    pub CR1 [
        /// Queue inner cacheability.
        QUEUE_IC OFFSET(0) NUMBITS(2) [NonCacheable = 0, WriteBack = 1, WriteThrough = 2],
        /// Queue outer cacheability.
        QUEUE_OC OFFSET(2) NUMBITS(2) [NonCacheable = 0, WriteBack = 1, WriteThrough = 2],
        /// Queue shareability.
        QUEUE_SH OFFSET(4) NUMBITS(2) [NonShareable = 0, Outer = 2, Inner = 3],
        /// Table inner cacheability.
        TABLE_IC OFFSET(6) NUMBITS(2) [NonCacheable = 0, WriteBack = 1, WriteThrough = 2],
        /// Table outer cacheability.
        TABLE_OC OFFSET(8) NUMBITS(2) [NonCacheable = 0, WriteBack = 1, WriteThrough = 2],
        /// Table shareability.
        TABLE_SH OFFSET(10) NUMBITS(2) [NonShareable = 0, Outer = 2, Inner = 3]
    ],
    /// SMMU_CR2 (IHI0070 §6.3.12).
    pub CR2 [
        /// EL2-E2H translation regime.
        E2H OFFSET(0) NUMBITS(1) [],
        /// Record C_BAD_STREAMID for out-of-range StreamIDs.
        RECINVSID OFFSET(1) NUMBITS(1) [],
        /// Private TLB maintenance: ignore broadcast TLB invalidations.
        PTM OFFSET(2) NUMBITS(1) []
    ],
    /// SMMU_GBPA, global bypass attributes (IHI0070 §6.3.14). Not modelled by QEMU 7.2.
    pub GBPA [
        /// Abort all incoming transactions while SMMUEN = 0.
        ABORT OFFSET(20) NUMBITS(1) [],
        /// Write 1 with new values; the update is done when it reads 0.
        UPDATE OFFSET(31) NUMBITS(1) []
    ],
    /// SMMU_IRQ_CTRL and SMMU_IRQ_CTRLACK (IHI0070 §6.3.16, §6.3.18).
    pub IRQ_CTRL [
        /// Global error interrupt enabled.
        GERROR_IRQEN OFFSET(0) NUMBITS(1) [],
        /// PRI queue interrupt enabled.
        PRIQ_IRQEN OFFSET(1) NUMBITS(1) [],
        /// Event queue interrupt enabled.
        EVENTQ_IRQEN OFFSET(2) NUMBITS(1) []
    ],
    /// SMMU_GERROR and SMMU_GERRORN (IHI0070 §6.3.19, §6.3.20): an error is active while
    /// GERROR\[x\] != GERRORN\[x\]; software acknowledges by toggling GERRORN\[x\] (and must
    /// not toggle bits of inactive errors).
    pub GERROR [
        /// Command queue error: CMDQ_CONS.ERR says why, CMDQ_CONS.RD points at the command.
        CMDQ_ERR OFFSET(0) NUMBITS(1) [],
        /// Event queue access aborted. QEMU 7.2 also toggles it when the queue is full and a
        /// record is dropped (`smmuv3_record_event`).
        EVENTQ_ABT_ERR OFFSET(2) NUMBITS(1) [],
        /// PRI queue access aborted.
        PRIQ_ABT_ERR OFFSET(3) NUMBITS(1) [],
        /// CMD_SYNC MSI write aborted.
        MSI_CMDQ_ABT_ERR OFFSET(4) NUMBITS(1) [],
        /// Event queue MSI write aborted.
        MSI_EVENTQ_ABT_ERR OFFSET(5) NUMBITS(1) [],
        /// PRI queue MSI write aborted.
        MSI_PRIQ_ABT_ERR OFFSET(6) NUMBITS(1) [],
        /// GERROR MSI write aborted.
        MSI_GERROR_ABT_ERR OFFSET(7) NUMBITS(1) [],
        /// Service failure mode.
        SFM_ERR OFFSET(8) NUMBITS(1) []
    ],
    /// SMMU_STRTAB_BASE_CFG (IHI0070 §6.3.25).
    pub STRTAB_BASE_CFG [
        /// log2 of the number of STEs (linear format).
        LOG2SIZE OFFSET(0) NUMBITS(6) [],
        /// Two-level split point.
        SPLIT OFFSET(6) NUMBITS(5) [],
        /// Table format.
        FMT OFFSET(16) NUMBITS(2) [
            /// One flat array of STEs.
            Linear = 0,
            /// Level-1 descriptors pointing at STE arrays.
            TwoLevel = 1
        ]
    ],
    /// SMMU_CMDQ_PROD (IHI0070 §6.3.27): write index, wrap flag at bit LOG2SIZE.
    pub CMDQ_PROD [
        /// Index and wrap flag.
        WR OFFSET(0) NUMBITS(20) []
    ],
    /// SMMU_CMDQ_CONS (IHI0070 §6.3.28): read index, wrap flag, and the error code of a
    /// command error (§7.1).
    pub CMDQ_CONS [
        /// Index and wrap flag.
        RD OFFSET(0) NUMBITS(20) [],
        /// Command error reason.
        ERR OFFSET(24) NUMBITS(7) [
            /// No error.
            None = 0,
            /// Illegal command (unknown opcode, reserved field, unsupported feature).
            Illegal = 1,
            /// Abort on the command fetch.
            Abort = 2,
            /// ATC invalidation timeout at a CMD_SYNC.
            AtcInvSync = 3
        ]
    ],
    /// SMMU_EVENTQ_PROD (IHI0070 §6.3, page 1 offset 0xA8): write index, wrap flag and the
    /// overflow flag (toggled when a record is lost; QEMU 7.2 never sets it).
    pub EVENTQ_PROD [
        /// Index and wrap flag.
        WR OFFSET(0) NUMBITS(20) [],
        /// Overflow flag: differs from EVENTQ_CONS.OVACKFLG after an overflow (§7.4).
        OVFLG OFFSET(31) NUMBITS(1) []
    ],
    /// SMMU_EVENTQ_CONS (IHI0070 §6.3, page 1 offset 0xAC).
    pub EVENTQ_CONS [
        /// Index and wrap flag.
        RD OFFSET(0) NUMBITS(20) [],
        /// Overflow acknowledge: software copies EVENTQ_PROD.OVFLG here (§7.4).
        OVACKFLG OFFSET(31) NUMBITS(1) []
    ]
];

register_bitfields![u64,
    /// SMMU_STRTAB_BASE (IHI0070 §6.3.24).
    pub STRTAB_BASE [
        /// Physical address bits \[55:6\] (the table is aligned to its size).
        ADDR OFFSET(6) NUMBITS(50) [],
        /// Read-allocate hint.
        RA OFFSET(62) NUMBITS(1) []
    ],
    /// SMMU_CMDQ_BASE and SMMU_EVENTQ_BASE (IHI0070 §6.3.26, §6.3.29).
    pub QUEUE_BASE [
        /// log2 of the number of entries (at most IDR1.CMDQS / EVENTQS).
        LOG2SIZE OFFSET(0) NUMBITS(5) [],
        /// Physical address bits \[55:5\]; the SMMU aligns the base to the queue size.
        ADDR OFFSET(5) NUMBITS(51) [],
        /// Read-allocate (command queue) / write-allocate (event queue) hint.
        ALLOCATE OFFSET(62) NUMBITS(1) []
    ]
];

hal::register_block! {
    /// The SMMUv3 register frame: page 0 (`SMMUv3_PAGE_0`) and the event queue indexes of
    /// page 1 (`SMMUv3_PAGE_1`, +0x1_0000). QEMU `virt` maps 0x2_0000 bytes at 0x0905_0000
    /// (`base_memmap` in QEMU `hw/arm/virt.c`).
    pub struct Smmuv3Regs {
        /// SMMU_IDR0 (§6.3.1).
        (0x00 => pub idr0: Ro u32, IDR0::Register),
        /// SMMU_IDR1 (§6.3.2).
        (0x04 => pub idr1: Ro u32, IDR1::Register),
        /// SMMU_IDR2 (§6.3.3).
        (0x08 => pub idr2: Ro u32),
        /// SMMU_IDR3 (§6.3.4).
        (0x0c => pub idr3: Ro u32, IDR3::Register),
        /// SMMU_IDR4 (§6.3.5, implementation defined).
        (0x10 => pub idr4: Ro u32),
        /// SMMU_IDR5 (§6.3.6).
        (0x14 => pub idr5: Ro u32, IDR5::Register),
        /// SMMU_IIDR (§6.3.7).
        (0x18 => pub iidr: Ro u32),
        /// SMMU_AIDR (§6.3.8).
        (0x1c => pub aidr: Ro u32, AIDR::Register),
        /// SMMU_CR0 (§6.3.9).
        (0x20 => pub cr0: Rw u32, CR0::Register),
        /// SMMU_CR0ACK (§6.3.10).
        (0x24 => pub cr0ack: Ro u32, CR0::Register),
        /// SMMU_CR1 (§6.3.11).
        (0x28 => pub cr1: Rw u32, CR1::Register),
        /// SMMU_CR2 (§6.3.12).
        (0x2c => pub cr2: Rw u32, CR2::Register),
        /// SMMU_GBPA (§6.3.14).
        (0x44 => pub gbpa: Rw u32, GBPA::Register),
        /// SMMU_IRQ_CTRL (§6.3.16).
        (0x50 => pub irq_ctrl: Rw u32, IRQ_CTRL::Register),
        /// SMMU_IRQ_CTRLACK (§6.3.18).
        (0x54 => pub irq_ctrlack: Ro u32, IRQ_CTRL::Register),
        /// SMMU_GERROR (§6.3.19).
        (0x60 => pub gerror: Ro u32, GERROR::Register),
        /// SMMU_GERRORN (§6.3.20).
        (0x64 => pub gerrorn: Rw u32, GERROR::Register),
        /// SMMU_STRTAB_BASE (§6.3.24), 64-bit.
        (0x80 => pub strtab_base: Rw u64, STRTAB_BASE::Register),
        /// SMMU_STRTAB_BASE_CFG (§6.3.25).
        (0x88 => pub strtab_base_cfg: Rw u32, STRTAB_BASE_CFG::Register),
        /// SMMU_CMDQ_BASE (§6.3.26), 64-bit.
        (0x90 => pub cmdq_base: Rw u64, QUEUE_BASE::Register),
        /// SMMU_CMDQ_PROD (§6.3.27).
        (0x98 => pub cmdq_prod: Rw u32, CMDQ_PROD::Register),
        /// SMMU_CMDQ_CONS (§6.3.28).
        (0x9c => pub cmdq_cons: Rw u32, CMDQ_CONS::Register),
        /// SMMU_EVENTQ_BASE (§6.3.29), 64-bit.
        (0xa0 => pub eventq_base: Rw u64, QUEUE_BASE::Register),
        /// SMMU_EVENTQ_PROD (page 1).
        (0x100a8 => pub eventq_prod: Rw u32, EVENTQ_PROD::Register),
        /// SMMU_EVENTQ_CONS (page 1).
        (0x100ac => pub eventq_cons: Rw u32, EVENTQ_CONS::Register),
    }
    size = 0x2_0000;
}

/// Offsets of the registers, for models and journals (the block's accessors use the same
/// numbers).
pub mod offset {
    /// SMMU_IDR0.
    pub const IDR0: usize = 0x00;
    /// SMMU_IDR1.
    pub const IDR1: usize = 0x04;
    /// SMMU_IDR2.
    pub const IDR2: usize = 0x08;
    /// SMMU_IDR3.
    pub const IDR3: usize = 0x0c;
    /// SMMU_IDR4.
    pub const IDR4: usize = 0x10;
    /// SMMU_IDR5.
    pub const IDR5: usize = 0x14;
    /// SMMU_IIDR.
    pub const IIDR: usize = 0x18;
    /// SMMU_AIDR.
    pub const AIDR: usize = 0x1c;
    /// SMMU_CR0.
    pub const CR0: usize = 0x20;
    /// SMMU_CR0ACK.
    pub const CR0ACK: usize = 0x24;
    /// SMMU_CR1.
    pub const CR1: usize = 0x28;
    /// SMMU_CR2.
    pub const CR2: usize = 0x2c;
    /// SMMU_GBPA.
    pub const GBPA: usize = 0x44;
    /// SMMU_IRQ_CTRL.
    pub const IRQ_CTRL: usize = 0x50;
    /// SMMU_IRQ_CTRLACK.
    pub const IRQ_CTRLACK: usize = 0x54;
    /// SMMU_GERROR.
    pub const GERROR: usize = 0x60;
    /// SMMU_GERRORN.
    pub const GERRORN: usize = 0x64;
    /// SMMU_STRTAB_BASE.
    pub const STRTAB_BASE: usize = 0x80;
    /// SMMU_STRTAB_BASE_CFG.
    pub const STRTAB_BASE_CFG: usize = 0x88;
    /// SMMU_CMDQ_BASE.
    pub const CMDQ_BASE: usize = 0x90;
    /// SMMU_CMDQ_PROD.
    pub const CMDQ_PROD: usize = 0x98;
    /// SMMU_CMDQ_CONS.
    pub const CMDQ_CONS: usize = 0x9c;
    /// SMMU_EVENTQ_BASE.
    pub const EVENTQ_BASE: usize = 0xa0;
    /// SMMU_EVENTQ_PROD (page 1).
    pub const EVENTQ_PROD: usize = 0x100a8;
    /// SMMU_EVENTQ_CONS (page 1).
    pub const EVENTQ_CONS: usize = 0x100ac;
    /// Size of the register frame (two 64 KiB pages).
    pub const FRAME_SIZE: usize = 0x2_0000;
}
