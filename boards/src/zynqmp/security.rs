//! What only the Secure world can set up on a ZynqMP before Non-secure software runs: the
//! MMU-500's Secure-only registers, the Xilinx `SMMU_REG` wrapper, the TrustZone
//! classification of the GDMA channels, the system counter's frequency, and the GIC
//! interrupts Non-secure software needs (docs/mmu500.md §7a).
//!
//! Sources: Arm IHI0062 (SMMUv2: `SMMU_sCR0`, `SMMU_sCR1`, `SMMU_IDR0`/`SMMU_IDR1`, the
//! Non-secure register aliases), Xilinx UG1087 (register reference; names as "UG1087
//! `NAME`") as transcribed by Xilinx's own QEMU fork, whose MMU-500 and `SMMU_REG` models are
//! generated from that register database (`hw/misc/arm-smmu.c` `smmu500_regs_info`,
//! `hw/misc/xilinx-smmu_reg.c` `smmu_reg_regs_info`: offsets, field positions and reset
//! values), the ZCU102 `psu_init.c` Xilinx generates for the FSBL (embeddedsw
//! `lib/sw_apps/zynqmp_fsbl/misc/zcu102/psu_init.c`), Linux
//! `drivers/iommu/arm/arm-smmu/arm-smmu-impl.c` (`arm_smmu_gr0_ns`) and
//! `arch/arm64/boot/dts/xilinx/zynqmp.dtsi`. **\[C\]** = stated by the named source,
//! **\[I\]** = inferred by us.

use super::{GDMA, Region, SMMU, UART0_IRQ};

/// A private peripheral interrupt of the GIC-400 (one per CPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ppi(pub u16);

impl Ppi {
    /// The GIC interrupt ID: PPI n is INTID n + 16 (GICv2 numbering).
    pub const fn intid(self) -> u16 {
        self.0 + 16
    }
}

/// The A53s' generic timer interrupts, in the order of zynqmp.dtsi's `timer` node
/// (`interrupts = <1 13 0xf08>, <1 14 0xf08>, <1 11 0xf08>, <1 10 0xf08>`), which the Arm
/// architected timer binding defines as Secure physical, Non-secure physical, virtual and
/// hypervisor timer **\[C\]**.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimerPpis {
    /// Secure physical timer (PPI 13): stays Group 0.
    pub secure_physical: Ppi,
    /// Non-secure physical timer (PPI 14).
    pub non_secure_physical: Ppi,
    /// Virtual timer (PPI 11): the runtime's `wfi` backstop.
    pub virtual_timer: Ppi,
    /// EL2 (hypervisor) physical timer (PPI 10).
    pub hypervisor: Ppi,
}

/// The ZynqMP's timer PPIs **\[C\]**.
pub const TIMER_PPIS: TimerPpis = TimerPpis {
    secure_physical: Ppi(13),
    non_secure_physical: Ppi(14),
    virtual_timer: Ppi(11),
    hypervisor: Ppi(10),
};

/// The interrupts a Non-secure program on the ZynqMP needs, by INTID: the SMMU's shared line
/// (SPI 155), the eight GDMA channels (SPIs 124-131), UART0 (SPI 21) and the Non-secure
/// physical, virtual and hypervisor timers. At reset every interrupt of a GIC-400 with the
/// Security Extensions is Group 0 (GICD_IGROUPRn resets to zero, IHI 0048B §4.3.4), i.e.
/// Secure; Secure software makes these Group 1 so Non-secure software can configure and
/// take them. Nothing else is regrouped.
pub const NON_SECURE_INTERRUPTS: [u16; 13] = [
    TIMER_PPIS.hypervisor.intid(),
    TIMER_PPIS.virtual_timer.intid(),
    TIMER_PPIS.non_secure_physical.intid(),
    UART0_IRQ.intid(),
    GDMA[0].interrupt.intid(),
    GDMA[1].interrupt.intid(),
    GDMA[2].interrupt.intid(),
    GDMA[3].interrupt.intid(),
    GDMA[4].interrupt.intid(),
    GDMA[5].interrupt.intid(),
    GDMA[6].interrupt.intid(),
    GDMA[7].interrupt.intid(),
    SMMU.interrupt.intid(),
];

/// Offset of the Non-secure alias of a Secure global register of GR0: a Secure access to
/// GR0 + 0x000.. reaches the Secure copies (sCR0, sGFSR, sTLBGSYNC, ...), and the Non-secure
/// copies that Non-secure software sees at those offsets are at + 0x400 (NSCR0, NSGFSR,
/// NSTLBGSYNC; UG1087 `SMMU_NSCR0` at 0xFD80_0400, `SMMU_NSTLBGSYNC` at 0xFD80_0470) **\[C\]**.
/// Linux's `arm_smmu_gr0_ns` (arm-smmu-impl.c) adds exactly this for SMMUs that are
/// configured through Secure accesses.
pub const NS_ALIAS_OFFSET: usize = 0x400;

/// sCR0 after reset: 0x0020_0001, CLIENTPD set (every stream bypasses) **\[C\]**. NSCR0
/// resets to the same value.
pub const SCR0_RESET: u32 = 0x0020_0001;
/// sCR1 after reset: 0x0201_3010, i.e. NSNUMCBO = 16 and NSNUMSMRGO = 48 (every context
/// bank and every stream-mapping group belongs to the Non-secure world), NSNUMIRPTO = 1
/// **\[C\]**.
pub const SCR1_RESET: u32 = 0x0201_3010;
/// sIDR1 of the ZynqMP's MMU-500: 0x3000_0F10 (4 KiB pages, NUMPAGENDXB = 3, SSDTP = 0,
/// NUMSSDNDXB = 15, NUMCB = 16) **\[C\]**.
pub const SIDR1_RESET: u32 = 0x3000_0f10;
/// sIDR0 of the ZynqMP's MMU-500: 0xFC01_3E30, NUMSMRG = 48 **\[C\]**.
pub const SIDR0_RESET: u32 = 0xfc01_3e30;

/// `SMMU_REG` IER_0 as the ZCU102's `psu_init.c` writes it in `init_peripheral()`: every
/// interrupt source of the wrapper enabled (bits 0-4 and 31, 0x8000_001F; "needs to be
/// written all the time to properly catch SMMU messages") **\[C\]**.
pub const SMMU_REG_IER_0_FSBL: u32 = 0x8000_001f;
/// `SMMU_REG` QREQN after reset: 0x7FFF, no low-power request on any Q-channel (the TCU and
/// every TBU powered and clocked) **\[C\]**.
pub const SMMU_REG_QREQN_RESET: u32 = 0x7fff;

/// FPD_SLCR_SECURE, the full-power domain's secure system-level control registers (UG1087
/// `FPD_SLCR_SECURE` at 0xFD69_0000) **\[C\]**; one 4 KiB page is assumed **\[I\]**.
pub const FPD_SLCR_SECURE: Region = Region {
    base: 0xfd69_0000,
    size: 0x1000,
};

/// The value the ZCU102's FSBL writes to `slcr_gdma` (0xFD69_0050): 0xFF, TrustZone
/// classification of the eight GDMA channels, all Non-secure (`psu_init.c`, the "DMA TZ"
/// block of the master TrustZone settings `psu_apply_master_tz()` applies) **\[C\]**. One bit
/// per channel, 1 = Non-secure **\[I\]**: the FSBL writes 1s to make the LPD DMA (ADMA,
/// `slcr_adma`) usable from Linux, which zynqmp.dtsi notes allows only Secure accesses by
/// default.
pub const SLCR_GDMA_ALL_NON_SECURE: u32 = 0xff;

/// IOU_SCNTRS, the system timestamp generator feeding the A53s' generic timers (UG1087
/// `IOU_SCNTRS` at 0xFF26_0000) **\[C\]**; one 4 KiB page is assumed **\[I\]**.
pub const IOU_SCNTRS: Region = Region {
    base: 0xff26_0000,
    size: 0x1000,
};

/// Register fields. Every register and field has a doc comment; the helper items
/// `register_bitfields!` generates have none, hence the `allow`.
#[allow(missing_docs)]
pub mod fields {
    use tock_registers::register_bitfields;

    register_bitfields![u32,
        /// sCR1, Secure configuration register 1 (GR0 0x004, Secure accesses only; IHI0062
        /// `SMMU_sCR1`, UG1087 `SMMU_SCR1`). Field widths as UG1087 gives them for this
        /// MMU-500 (IHI0062 reserves 8 bits for each count).
        pub SCR1 [
            /// Context banks 0..NSNUMCBO-1 belong to Non-secure software.
            NSNUMCBO OFFSET(0) NUMBITS(5) [],
            /// Stream-mapping groups 0..NSNUMSMRGO-1 belong to Non-secure software.
            NSNUMSMRGO OFFSET(8) NUMBITS(6) [],
            /// Context interrupts given to Non-secure software.
            NSNUMIRPTO OFFSET(16) NUMBITS(8) [],
            /// Global address space restricted access enable.
            GASRAE OFFSET(24) NUMBITS(1) [],
            /// Global extended fault recording only.
            GEFRO OFFSET(25) NUMBITS(1) [],
            /// Secure instruction fetch: Secure fetches from Non-secure memory fault.
            SIF OFFSET(26) NUMBITS(1) [],
            /// Secure performance monitor enable.
            SPMEN OFFSET(27) NUMBITS(1) [],
            /// Non-secure cache maintenance operations are read-only.
            NSCAFRO OFFSET(28) NUMBITS(1) []
        ],
        /// sIDR0 (GR0 0x020; IHI0062 `SMMU_IDR0`, UG1087 `SMMU_SIDR0`): the fields used here.
        pub SIDR0 [
            /// Stream-mapping register groups implemented.
            NUMSMRG OFFSET(0) NUMBITS(8) []
        ],
        /// sIDR1 (GR0 0x024; IHI0062 `SMMU_IDR1`, UG1087 `SMMU_SIDR1`): the fields used here.
        pub SIDR1 [
            /// Translation context banks implemented.
            NUMCB OFFSET(0) NUMBITS(8) [],
            /// Index bits of the Security State Determination table.
            NUMSSDNDXB OFFSET(8) NUMBITS(4) [],
            /// Security State Determination table present: 0 on the ZynqMP, where the
            /// security state of a transaction comes from its master (AxPROT\[1\]).
            SSDTP OFFSET(12) NUMBITS(1) []
        ],
        /// `SMMU_REG` QREQN (0x040; UG1087 `SMMU_REG.QREQN`): the Q-channel low-power
        /// requests of the TCU and the TBUs, active low (1 = no request: powered and
        /// clocked).
        pub QREQN [
            /// The TCU.
            TCU OFFSET(0) NUMBITS(1) [],
            /// TBU0 power-down request.
            TBU0_PD OFFSET(1) NUMBITS(1) [],
            /// TBU0 clock-gate request.
            TBU0_CG OFFSET(2) NUMBITS(1) [],
            /// TBU1 power-down request.
            TBU1_PD OFFSET(3) NUMBITS(1) [],
            /// TBU1 clock-gate request.
            TBU1_CG OFFSET(4) NUMBITS(1) [],
            /// TBU2 power-down request.
            TBU2_PD OFFSET(5) NUMBITS(1) [],
            /// TBU2 clock-gate request.
            TBU2_CG OFFSET(6) NUMBITS(1) [],
            /// TBU2's slave bridge power-down request.
            PD_SLV_BR_TBU2 OFFSET(7) NUMBITS(1) [],
            /// TBU2's master bridge power-down request.
            PD_MST_BR_TBU2 OFFSET(8) NUMBITS(1) [],
            /// TBU3 power-down request.
            TBU3_PD OFFSET(9) NUMBITS(1) [],
            /// TBU3 clock-gate request.
            TBU3_CG OFFSET(10) NUMBITS(1) [],
            /// TBU4 power-down request.
            TBU4_PD OFFSET(11) NUMBITS(1) [],
            /// TBU4 clock-gate request.
            TBU4_CG OFFSET(12) NUMBITS(1) [],
            /// TBU5 power-down request (the GDMA's TBU).
            TBU5_PD OFFSET(13) NUMBITS(1) [],
            /// TBU5 clock-gate request.
            TBU5_CG OFFSET(14) NUMBITS(1) []
        ],
        /// `SMMU_REG` interrupt bits of ISR_0 (W1C), IMR_0 (1 = masked, reset 0x8000_001F),
        /// IER_0 (write 1 to unmask) and IDR_0 (write 1 to mask) (UG1087 `SMMU_REG.ISR_0`
        /// etc.).
        pub SMMU_REG_IRQ [
            /// Combined Non-secure context interrupt.
            COMB_IRPT_NS OFFSET(0) NUMBITS(1) [],
            /// Combined Secure context interrupt.
            COMB_IRPT_S OFFSET(1) NUMBITS(1) [],
            /// Combined TBU performance interrupt.
            COMB_PERF_IRPT_TBU OFFSET(2) NUMBITS(1) [],
            /// Secure global fault interrupt.
            GBL_FLT_IRPT_S OFFSET(3) NUMBITS(1) [],
            /// Non-secure global fault interrupt.
            GBL_FLT_IRPT_NS OFFSET(4) NUMBITS(1) [],
            /// Address decode error on the wrapper's APB port.
            ADDR_DECODE_ERR OFFSET(31) NUMBITS(1) []
        ],
        /// FPD_SLCR_SECURE `slcr_gdma` (0x050; UG1087 `FPD_SLCR_SECURE.slcr_gdma`):
        /// TrustZone classification of the GDMA channels.
        pub SLCR_GDMA [
            /// One bit per channel, 1 = Non-secure **\[I\]**.
            TZ OFFSET(0) NUMBITS(8) []
        ],
        /// IOU_SCNTRS `counter_control_register` (0x000; UG1087
        /// `IOU_SCNTRS.counter_control_register`).
        pub SCNTRS_CONTROL [
            /// The counter is enabled and increments.
            EN OFFSET(0) NUMBITS(1) []
        ]
    ];
}
pub use fields::{QREQN, SCNTRS_CONTROL, SCR1, SIDR0, SIDR1, SLCR_GDMA, SMMU_REG_IRQ};

/// Every QREQN request bit: no low-power request for the TCU, any TBU or the TBU2 bridge,
/// i.e. all of the SMMU powered and clocked.
pub fn qreqn_all_powered() -> tock_registers::fields::FieldValue<u32, QREQN::Register> {
    QREQN::TCU::SET
        + QREQN::TBU0_PD::SET
        + QREQN::TBU0_CG::SET
        + QREQN::TBU1_PD::SET
        + QREQN::TBU1_CG::SET
        + QREQN::TBU2_PD::SET
        + QREQN::TBU2_CG::SET
        + QREQN::PD_SLV_BR_TBU2::SET
        + QREQN::PD_MST_BR_TBU2::SET
        + QREQN::TBU3_PD::SET
        + QREQN::TBU3_CG::SET
        + QREQN::TBU4_PD::SET
        + QREQN::TBU4_CG::SET
        + QREQN::TBU5_PD::SET
        + QREQN::TBU5_CG::SET
}

hal::register_block! {
    /// The MMU-500's global register space 0 as a Secure access sees it (the first page of
    /// [`SMMU`]'s window): the registers Secure firmware reads and writes before Non-secure
    /// software programs the SMMU through the Non-secure view.
    pub struct SmmuSecureGr0 {
        /// sCR0, the Secure copy (UG1087 `SMMU_SCR0`).
        (0x000 => pub scr0: Rw u32),
        /// sCR1, Secure only (UG1087 `SMMU_SCR1`).
        (0x004 => pub scr1: Rw u32, SCR1::Register),
        /// sIDR0 (UG1087 `SMMU_SIDR0`); not banked.
        (0x020 => pub sidr0: Ro u32, SIDR0::Register),
        /// sIDR1 (UG1087 `SMMU_SIDR1`); not banked.
        (0x024 => pub sidr1: Ro u32, SIDR1::Register),
        /// sGFSR, the Secure copy (UG1087 `SMMU_SGFSR`).
        (0x048 => pub sgfsr: Rw u32),
        /// NSCR0: sCR0 as Non-secure software sees it (UG1087 `SMMU_NSCR0`).
        (0x400 => pub nscr0: Rw u32),
        /// NSGFSR: sGFSR as Non-secure software sees it (UG1087 `SMMU_NSGFSR`).
        (0x448 => pub nsgfsr: Rw u32),
    }
    size = 0x1000;
}

hal::register_block! {
    /// The Xilinx `SMMU_REG` wrapper around the MMU-500 (UG1087 `SMMU_REG`, at
    /// [`SMMU`]`.wrapper`).
    pub struct SmmuReg {
        /// MISC_CTRL: SLVERR_ENABLE in bit 0.
        (0x000 => pub misc_ctrl: Rw u32),
        /// ISR_0, interrupt status (W1C).
        (0x010 => pub isr_0: Rw u32, SMMU_REG_IRQ::Register),
        /// IMR_0, interrupt mask (read only; 1 = masked).
        (0x014 => pub imr_0: Ro u32, SMMU_REG_IRQ::Register),
        /// IER_0, write 1 to unmask.
        (0x018 => pub ier_0: Rw u32, SMMU_REG_IRQ::Register),
        /// IDR_0, write 1 to mask.
        (0x01c => pub idr_0: Rw u32, SMMU_REG_IRQ::Register),
        /// QREQN, the Q-channel power and clock requests.
        (0x040 => pub qreqn: Rw u32, QREQN::Register),
    }
    size = 0x1000;
}

hal::register_block! {
    /// FPD_SLCR_SECURE (the registers used here).
    pub struct FpdSlcrSecure {
        /// `slcr_gdma`, the GDMA channels' TrustZone classification.
        (0x050 => pub slcr_gdma: Rw u32, SLCR_GDMA::Register),
    }
    size = 0x1000;
}

hal::register_block! {
    /// IOU_SCNTRS, the system counter (the registers used here).
    pub struct IouScntrs {
        /// `counter_control_register`.
        (0x000 => pub counter_control: Rw u32, SCNTRS_CONTROL::Register),
        /// `base_frequency_ID_register`: the counter's frequency in Hz, which firmware copies
        /// to CNTFRQ_EL0 (the ZCU102's `psu_init.c` programs 0x05F5_B9F8, 99,990,008 Hz).
        (0x020 => pub base_frequency: Rw u32),
    }
    size = 0x1000;
}

#[cfg(test)]
mod tests {
    use tock_registers::LocalRegisterCopy;

    use super::*;
    use crate::zynqmp::{AddressWindow, window_of};

    #[test]
    fn the_reset_partition_gives_everything_to_the_non_secure_world() {
        let scr1 = LocalRegisterCopy::<u32, SCR1::Register>::new(SCR1_RESET);
        let sidr0 = LocalRegisterCopy::<u32, SIDR0::Register>::new(SIDR0_RESET);
        let sidr1 = LocalRegisterCopy::<u32, SIDR1::Register>::new(SIDR1_RESET);
        assert_eq!(scr1.read(SCR1::NSNUMCBO), 16);
        assert_eq!(scr1.read(SCR1::NSNUMSMRGO), 48);
        assert_eq!(scr1.read(SCR1::NSNUMIRPTO), 1);
        assert_eq!(sidr1.read(SIDR1::NUMCB), u32::from(SMMU.context_banks));
        assert_eq!(
            sidr0.read(SIDR0::NUMSMRG),
            u32::from(SMMU.stream_match_groups)
        );
        assert_eq!(sidr1.read(SIDR1::SSDTP), 0, "no SSD table on the ZynqMP");
        // CLIENTPD, bit 0: bypass until a driver enables translation.
        assert_eq!(SCR0_RESET & 1, 1);
    }

    #[test]
    fn the_secure_registers_and_their_non_secure_aliases() {
        assert_eq!(
            SMMU.regs.base + NS_ALIAS_OFFSET as u64,
            0xfd80_0400,
            "SMMU_NSCR0"
        );
        assert_eq!(
            SMMU.regs.base + 0x70 + NS_ALIAS_OFFSET as u64,
            0xfd80_0470,
            "SMMU_NSTLBGSYNC (UG1087)"
        );
        assert_eq!(SMMU.wrapper.base + 0x40, 0xfd5f_0040, "SMMU_REG QREQN");
        assert_eq!(SMMU.wrapper.base + 0x18, 0xfd5f_0018, "SMMU_REG IER_0");
        assert_eq!(FPD_SLCR_SECURE.base + 0x50, 0xfd69_0050, "slcr_gdma");
        assert_eq!(IOU_SCNTRS.base + 0x20, 0xff26_0020);
        // QREQN's 15 request bits are exactly its reset value.
        assert_eq!(qreqn_all_powered().value, SMMU_REG_QREQN_RESET);
        let fsbl = SMMU_REG_IRQ::COMB_IRPT_NS::SET
            + SMMU_REG_IRQ::COMB_IRPT_S::SET
            + SMMU_REG_IRQ::COMB_PERF_IRPT_TBU::SET
            + SMMU_REG_IRQ::GBL_FLT_IRPT_S::SET
            + SMMU_REG_IRQ::GBL_FLT_IRPT_NS::SET
            + SMMU_REG_IRQ::ADDR_DECODE_ERR::SET;
        assert_eq!(fsbl.value, SMMU_REG_IER_0_FSBL);
        for region in [FPD_SLCR_SECURE, SMMU.wrapper] {
            assert_eq!(window_of(region), Some(AddressWindow::FpdSlaves));
        }
        assert_eq!(window_of(IOU_SCNTRS), Some(AddressWindow::LpdSlaves));
    }

    #[test]
    fn the_non_secure_interrupts() {
        assert_eq!(
            NON_SECURE_INTERRUPTS[..4],
            [26, 27, 30, 53],
            "hypervisor, virtual and NS physical timers, UART0"
        );
        assert_eq!(
            NON_SECURE_INTERRUPTS[4..12],
            [156, 157, 158, 159, 160, 161, 162, 163]
        );
        assert_eq!(NON_SECURE_INTERRUPTS[12], 187, "the SMMU, SPI 155");
        assert_eq!(TIMER_PPIS.secure_physical.intid(), 29);
        assert!(
            !NON_SECURE_INTERRUPTS.contains(&29),
            "the Secure timer stays Group 0"
        );
    }
}
