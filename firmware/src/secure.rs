//! From Secure EL3 to Non-secure EL2 (or EL1) on the ZynqMP: what only the Secure world can
//! set up, and the register values of the drop (docs/mmu500.md §7a).
//!
//! The Xilinx FSBL enters a bare-metal partition at EL3, in Secure state. The MMU-500 banks
//! its global registers by security state: a Secure access to GR0 + 0x000 reaches sCR0 (and
//! sGFSR, sTLBGSYNC, ...), while the GDMA channels, which the FSBL classifies Non-secure
//! (`slcr_gdma` = 0xFF), are governed by the Non-secure copy NSCR0 (at + 0x400 for a Secure
//! access), which keeps CLIENTPD = 1 (bypass) when only sCR0 is written. Linux programs the
//! SMMU from Non-secure EL1/EL2 at the base offsets, and ATF (`plat/xilinx/zynqmp`) leaves
//! the SMMU alone. So the runtime does here only what needs the Secure world, then drops to
//! Non-secure EL2, where the unchanged driver programs the Non-secure view:
//!
//! - [`group1`]: the GIC-400 interrupts Non-secure software needs become Group 1
//!   (GICD_IGROUPRn is accessible to Secure accesses only; IHI 0048B §4.3.4);
//! - [`power_smmu`]: `SMMU_REG` QREQN with no low-power request for the TCU and every TBU,
//!   and IER_0 as the FSBL's `psu_init` writes it;
//! - [`gdma_non_secure`]: the GDMA channels' TrustZone classification as the FSBL leaves it;
//! - [`smmu_partition`]: sCR1 (Secure only) must give every context bank and stream-mapping
//!   group to the Non-secure world, as it does after reset; restored if it does not;
//! - [`counter_frequency`]: CNTFRQ_EL0, writable only at the highest EL, from IOU_SCNTRS if
//!   an earlier stage left it 0 (CPTR_EL3 = 0, no FP/SIMD trap to EL3, is `_start`'s first
//!   write at EL3, before any Rust code);
//! - [`drop_target`] and [`lower_el`]: where to go and the SCR_EL3, HCR_EL2, CNTHCTL_EL2,
//!   CNTVOFF_EL2, CPTR_EL2, SCTLR, VBAR, SP and SPSR_EL3 values of the exception return.
//!
//! Register layouts from the Arm ARM (DDI 0487, D19.2: SCR_EL3, HCR_EL2, CNTHCTL_EL2,
//! CPTR_EL2, SCTLR_EL1/EL2, SPSR_EL3, ID_AA64PFR0_EL1), composed with `aarch64-cpu`'s field
//! definitions where it has them; GICv2 from IHI 0048B; the ZynqMP's registers from
//! `boards::zynqmp::security`. Everything here is portable and tested on the host; `rt`
//! applies it at EL3.

use core::fmt;

use boards::zynqmp::security::{
    IouScntrs, SCR1, SIDR0, SIDR1, SLCR_GDMA, SMMU_REG_IER_0_FSBL, SMMU_REG_QREQN_RESET, SmmuReg,
    SmmuSecureGr0, qreqn_all_powered,
};
use hal::regs::RegisterBus;
use hal::sysreg::fields::{CNTHCTL_EL2, HCR_EL2, SCR_EL3, SPSR_EL3};
use hal::sysreg::{El, SysReg};
use tock_registers::LocalRegisterCopy;
use tock_registers::interfaces::{Readable, Writeable};

use crate::error::{FirmwareError, Result};

/// The security state the program runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Security {
    /// Secure (EL3 is always Secure).
    Secure,
    /// Non-secure: the runtime dropped there from EL3 (SCR_EL3.NS = 1).
    NonSecure,
    /// Not known: entered below EL3, where no register says which state the PE is in (an
    /// earlier stage chose it; QEMU `virt` without EL3 runs Non-secure).
    Unknown,
}

impl fmt::Display for Security {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Security::Secure => "Secure",
            Security::NonSecure => "Non-secure",
            Security::Unknown => "security state set by an earlier stage",
        })
    }
}

/// Where the runtime drops from EL3.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropTarget {
    /// Non-secure EL2 (no VHE), the EL ATF hands the ZynqMP's Non-secure boot loader
    /// (`plat/xilinx/zynqmp/bl31_zynqmp_setup.c`: BL33 entered with `SPSR_64(MODE_EL2, ...)`).
    /// Nothing is virtualised: stage 2 stays off.
    El2,
    /// Non-secure EL1, where EL2 is not implemented.
    El1,
}

impl DropTarget {
    /// The EL's number.
    pub const fn el(self) -> u8 {
        match self {
            DropTarget::El2 => 2,
            DropTarget::El1 => 1,
        }
    }
}

/// ID_AA64PFR0_EL1.EL2, bits 11:8: 0 = EL2 not implemented, 1 = AArch64 only, 2 = AArch64
/// and AArch32 (Arm ARM D19.2). `aarch64-cpu` 11.2 does not describe the field.
const PFR0_EL2_SHIFT: u32 = 8;

/// EL2 when the PE implements it, else EL1. EL2 because it is what the ZynqMP's Non-secure
/// software gets from ATF, the runtime runs there with its own translation regime and
/// vectors, and the EL1 timer and the GIC's Non-secure interfaces stay reachable; EL1 is
/// only a fallback (a QEMU machine without `virtualization=on`).
pub const fn drop_target(id_aa64pfr0: u64) -> DropTarget {
    if (id_aa64pfr0 >> PFR0_EL2_SHIFT) & 0xf != 0 {
        DropTarget::El2
    } else {
        DropTarget::El1
    }
}

/// SCR_EL3 bits 5:4 are RES1 (Arm ARM D19.2 SCR_EL3).
pub const SCR_EL3_RES1: u64 = 0b11 << 4;
/// CPTR_EL2 (non-VHE) with nothing trapped: RES1 bits 13:12 and 9:0, TFP (bit 10), TTA (bit
/// 20) and TCPAC (bit 31) clear (Arm ARM D19.2 CPTR_EL2); the value `_start` writes at EL2.
pub const CPTR_EL2_NO_TRAPS: u64 = 0x33ff;
/// SCTLR_EL2 (non-VHE) with only its ARMv8.0 RES1 bits (29:28, 23:22, 18, 16, 11, 5:4):
/// MMU, caches and alignment checks off, little-endian (EE = 0) (Arm ARM D19.2 SCTLR_EL2).
/// The runtime turns the MMU on at the new EL as it does at any EL.
pub const SCTLR_EL2_RES1: u64 = 0x30c5_0830;
/// SCTLR_EL1 with only its ARMv8.0 RES1 bits (29:28, 23:22, 20, 11) (Arm ARM D19.2
/// SCTLR_EL1).
pub const SCTLR_EL1_RES1: u64 = 0x30d0_0800;

/// The register writes that prepare the lower EL, in order, and SPSR_EL3 for the exception
/// return.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LowerEl {
    /// Where to.
    pub target: DropTarget,
    /// `(register, value)` to write at EL3 before the `eret`.
    pub writes: heapless::Vec<(SysReg, u64), 10>,
    /// SPSR_EL3: the target EL on SP_EL0 (EL2t/EL1t, so the program keeps running on its
    /// stack) with D, A, I and F masked.
    pub spsr: u64,
}

/// The writes of a drop to `target` that continues with exception vectors at `vectors` and
/// the exception stack (SP_ELx) at `exception_stack_top`:
///
/// - SCR_EL3: NS = 1, RW = 1 (the next EL is AArch64), HCE = 1 when EL2 is the target (HVC
///   enabled), IRQ/FIQ/EA = 0 (not taken to EL3), SMD = 0, RES1 bits;
/// - to EL2: HCR_EL2.RW = 1 only (E2H = 0: the runtime supports EL2 without VHE; TGE = 0;
///   no stage 2), CNTHCTL_EL2.EL1PCTEN/EL1PCEN = 1 (EL1 may use the physical counter and
///   timer), CNTVOFF_EL2 = 0 (virtual count = physical count), CPTR_EL2 with no traps, SCTLR_EL2
///   RES1 only, VBAR_EL2, SP_EL2;
/// - to EL1 (no EL2): SCTLR_EL1 RES1 only, VBAR_EL1, SP_EL1 (EL2 registers are not touched:
///   they do not exist). CPACR_EL1.FPEN was set by `_start`.
pub fn lower_el(target: DropTarget, vectors: u64, exception_stack_top: u64) -> LowerEl {
    let mut writes = heapless::Vec::new();
    let scr = SCR_EL3::NS::NonSecure + SCR_EL3::RW::NextELIsAarch64;
    // 8 and 4 writes: within the capacity.
    let mode = match target {
        DropTarget::El2 => {
            writes.extend([
                (
                    SysReg::ScrEl3,
                    (scr + SCR_EL3::HCE::HvcEnabled).value | SCR_EL3_RES1,
                ),
                (SysReg::HcrEl2, HCR_EL2::RW::EL1IsAarch64.value),
                (
                    SysReg::CnthctlEl2,
                    (CNTHCTL_EL2::EL1PCTEN::SET + CNTHCTL_EL2::EL1PCEN::SET).value,
                ),
                (SysReg::CntvoffEl2, 0),
                (SysReg::CptrEl2, CPTR_EL2_NO_TRAPS),
                (SysReg::Sctlr(El::El2), SCTLR_EL2_RES1),
                (SysReg::Vbar(El::El2), vectors),
                (SysReg::SpEl2, exception_stack_top),
            ]);
            SPSR_EL3::M::EL2t
        }
        DropTarget::El1 => {
            writes.extend([
                (SysReg::ScrEl3, scr.value | SCR_EL3_RES1),
                (SysReg::Sctlr(El::El1), SCTLR_EL1_RES1),
                (SysReg::Vbar(El::El1), vectors),
                (SysReg::SpEl1, exception_stack_top),
            ]);
            SPSR_EL3::M::EL1t
        }
    };
    let spsr = SPSR_EL3::D::Masked
        + SPSR_EL3::A::Masked
        + SPSR_EL3::I::Masked
        + SPSR_EL3::F::Masked
        + mode;
    LowerEl {
        target,
        writes,
        spsr: spsr.value,
    }
}

hal::register_block! {
    /// The GIC-400 distributor (IHI 0048B, GICv2 with the Security Extensions): the
    /// registers used here.
    pub struct Gic400Distributor {
        /// GICD_CTLR.
        (0x000 => pub ctlr: Rw u32),
        /// GICD_TYPER: ITLinesNumber in bits 4:0 (32 * (N + 1) interrupt IDs).
        (0x004 => pub typer: Ro u32),
        /// GICD_IGROUPRn: one bit per INTID, 1 = Group 1 (Non-secure); Secure accesses
        /// only; GICD_IGROUPR0 is banked per CPU.
        (0x080 => pub igroupr: [Rw u32; 32, stride 4]),
    }
    size = 0x1000;
}

/// What [`group1`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupReport {
    /// INTIDs asked for.
    pub asked: usize,
    /// Of them, how many read back as Group 1.
    pub group1: usize,
    /// Interrupt IDs the distributor implements.
    pub lines: u32,
}

impl fmt::Display for GroupReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} INTIDs read back Group 1 (of {} implemented)",
            self.group1, self.asked, self.lines
        )
    }
}

/// Makes `intids` Group 1 (Non-secure) in the GIC-400 distributor `gicd` by setting their
/// GICD_IGROUPRn bits (read-modify-write: every other interrupt keeps its group), and
/// reads them back. A Secure access is needed; the distributor must implement them.
pub fn group1<B: RegisterBus + ?Sized>(gicd: &B, intids: &[u16]) -> Result<GroupReport> {
    let dist = Gic400Distributor::new(gicd, 0)?;
    let lines = ((dist.typer().get() & 0x1f) + 1) * 32;
    if let Some(&intid) = intids.iter().find(|&&i| u32::from(i) >= lines.min(1020)) {
        return Err(FirmwareError::InterruptOutOfRange {
            intid: u32::from(intid),
        });
    }
    for &intid in intids {
        let reg = dist.igroupr(usize::from(intid / 32))?;
        reg.set(reg.get() | 1 << (intid % 32));
    }
    let mut group1 = 0;
    for &intid in intids {
        if dist.igroupr(usize::from(intid / 32))?.get() & 1 << (intid % 32) != 0 {
            group1 += 1;
        }
    }
    Ok(GroupReport {
        asked: intids.len(),
        group1,
        lines,
    })
}

/// What [`power_smmu`] found and did to the `SMMU_REG` wrapper.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmmuRegReport {
    /// QREQN before.
    pub qreqn_before: u32,
    /// QREQN read back after setting every request bit.
    pub qreqn_after: u32,
    /// IMR_0 read back after IER_0 was written.
    pub imr_after: u32,
}

impl SmmuRegReport {
    /// Whether QREQN reads back with no low-power request (the TCU and every TBU powered).
    pub fn powered(&self) -> bool {
        self.qreqn_after & SMMU_REG_QREQN_RESET == SMMU_REG_QREQN_RESET
    }
}

impl fmt::Display for SmmuRegReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "QREQN {:#x}", self.qreqn_before)?;
        if self.qreqn_before != self.qreqn_after || !self.powered() {
            write!(f, " -> {:#x}", self.qreqn_after)?;
        }
        f.write_str(if self.powered() {
            " (TCU and TBU0-5 powered)"
        } else {
            " (low-power requests still read back: nothing answers there?)"
        })?;
        write!(
            f,
            ", IER_0 <- {SMMU_REG_IER_0_FSBL:#x}, IMR_0 {:#x}",
            self.imr_after
        )
    }
}

/// Sets every QREQN bit of the `SMMU_REG` wrapper `wrapper` (no low-power request: the TCU
/// and TBU0-5, TBU5 being the GDMA's, powered and clocked; reset value 0x7FFF) and writes
/// IER_0 = 0x8000_001F as the FSBL's `psu_init` does, so the wrapper's interrupt sources
/// (the combined Non-secure context interrupt, the global faults) are unmasked.
pub fn power_smmu<B: RegisterBus + ?Sized>(wrapper: &B) -> Result<SmmuRegReport> {
    let regs = SmmuReg::new(wrapper, 0)?;
    let qreqn_before = regs.qreqn().get();
    let all = qreqn_all_powered();
    if qreqn_before & all.value != all.value {
        regs.qreqn().set(qreqn_before | all.value);
    }
    regs.ier_0().set(SMMU_REG_IER_0_FSBL);
    Ok(SmmuRegReport {
        qreqn_before,
        qreqn_after: regs.qreqn().get(),
        imr_after: regs.imr_0().get(),
    })
}

/// What [`gdma_non_secure`] found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdmaTzReport {
    /// `slcr_gdma.TZ` before.
    pub before: u32,
    /// After (read back).
    pub after: u32,
    /// The channels that must be Non-secure (bit n = channel n).
    pub wanted: u32,
}

impl GdmaTzReport {
    /// Whether every wanted channel reads back Non-secure.
    pub fn non_secure(&self) -> bool {
        self.after & self.wanted == self.wanted
    }
}

impl fmt::Display for GdmaTzReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "slcr_gdma {:#04x}", self.before)?;
        if self.before != self.after || !self.non_secure() {
            write!(f, " -> {:#04x}", self.after)?;
        }
        f.write_str(if self.non_secure() {
            " (GDMA channels Non-secure)"
        } else {
            " (the GDMA channels do not read back Non-secure: nothing answers there?)"
        })
    }
}

/// Makes the GDMA channels in `channels` (bit n = channel n) Non-secure in FPD_SLCR_SECURE
/// `slcr`, as the FSBL's `psu_init` leaves them on the ZCU102 (`slcr_gdma` = 0xFF), if an
/// earlier stage left any of them Secure: their traffic must reach the SMMU as Non-secure
/// to be governed by the Non-secure view the driver programs. Other channels keep their
/// classification.
pub fn gdma_non_secure<B: RegisterBus + ?Sized>(slcr: &B, channels: u32) -> Result<GdmaTzReport> {
    let regs = boards::zynqmp::security::FpdSlcrSecure::new(slcr, 0)?;
    let wanted = channels & 0xff;
    let before = regs.slcr_gdma().read(SLCR_GDMA::TZ);
    if before & wanted != wanted {
        regs.slcr_gdma().write(SLCR_GDMA::TZ.val(before | wanted));
    }
    Ok(GdmaTzReport {
        before,
        after: regs.slcr_gdma().read(SLCR_GDMA::TZ),
        wanted,
    })
}

/// The value to write to CNTFRQ_EL0, if it must be written: when it reads 0 (an earlier
/// stage did not set it), the IOU_SCNTRS base frequency `scntrs` holds, if that is not 0
/// either. The generic timer's frequency register is writable only at the highest EL (Arm
/// ARM D11.2.1, CNTFRQ_EL0), so EL3 sets it before the drop.
pub fn counter_frequency<B: RegisterBus + ?Sized>(scntrs: &B, cntfrq: u64) -> Result<Option<u64>> {
    if cntfrq != 0 {
        return Ok(None);
    }
    let base = IouScntrs::new(scntrs, 0)?.base_frequency().get();
    Ok((base != 0).then_some(u64::from(base)))
}

/// The MMU-500's partition between the security states, from sCR1 and the ID registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partition {
    /// sCR1.NSNUMCBO: context banks given to Non-secure software.
    pub ns_banks: u32,
    /// sIDR1.NUMCB: context banks implemented.
    pub banks: u32,
    /// sCR1.NSNUMSMRGO: stream-mapping groups given to Non-secure software.
    pub ns_groups: u32,
    /// sIDR0.NUMSMRG: stream-mapping groups implemented.
    pub groups: u32,
}

impl Partition {
    /// Reads the partition out of sCR1, sIDR0 and sIDR1.
    pub fn of(scr1: u32, sidr0: u32, sidr1: u32) -> Self {
        let scr1 = LocalRegisterCopy::<u32, SCR1::Register>::new(scr1);
        let sidr0 = LocalRegisterCopy::<u32, SIDR0::Register>::new(sidr0);
        let sidr1 = LocalRegisterCopy::<u32, SIDR1::Register>::new(sidr1);
        Partition {
            ns_banks: scr1.read(SCR1::NSNUMCBO),
            banks: sidr1.read(SIDR1::NUMCB),
            ns_groups: scr1.read(SCR1::NSNUMSMRGO),
            groups: sidr0.read(SIDR0::NUMSMRG),
        }
    }

    /// Whether every context bank and every group belongs to the Non-secure world, as after
    /// reset (sCR1 = 0x0201_3010 on the ZynqMP).
    pub fn all_non_secure(&self) -> bool {
        self.ns_banks >= self.banks && self.ns_groups >= self.groups
    }

    /// sCR1 `scr1` with NSNUMCBO and NSNUMSMRGO set to every implemented bank and group, its
    /// other fields kept.
    pub fn restored(&self, scr1: u32) -> u32 {
        let mut value = LocalRegisterCopy::<u32, SCR1::Register>::new(scr1);
        value.modify(SCR1::NSNUMCBO.val(self.banks) + SCR1::NSNUMSMRGO.val(self.groups));
        value.get()
    }
}

/// What [`smmu_partition`] found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionReport {
    /// sCR1 as found.
    pub scr1_before: u32,
    /// sCR1 read back at the end.
    pub scr1_after: u32,
    /// The partition as found.
    pub found: Partition,
    /// The partition at the end.
    pub now: Partition,
    /// sCR0, the Secure copy (CLIENTPD governs Secure streams only).
    pub scr0: u32,
    /// NSCR0, what the Non-secure driver will find.
    pub nscr0: u32,
    /// sIDR1.SSDTP: whether a Security State Determination table exists.
    pub ssd_table: bool,
}

impl fmt::Display for PartitionReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.now;
        write!(f, "sCR1 {:#010x}", self.scr1_before)?;
        if self.scr1_after != self.scr1_before {
            write!(
                f,
                " gave only {} banks and {} groups to Non-secure; restored to {:#010x}",
                self.found.ns_banks, self.found.ns_groups, self.scr1_after
            )?;
        }
        write!(
            f,
            ": {} of {} context banks and {} of {} stream-mapping groups Non-secure; sCR0 \
             {:#010x}, NSCR0 {:#010x}{}; {}",
            p.ns_banks.min(p.banks),
            p.banks,
            p.ns_groups.min(p.groups),
            p.groups,
            self.scr0,
            self.nscr0,
            if self.nscr0 & 1 != 0 {
                " (CLIENTPD: bypass until the Non-secure driver enables translation)"
            } else {
                ""
            },
            if self.ssd_table {
                "an SSD table (SIDR1.SSDTP = 1)"
            } else {
                "no SSD table (SIDR1.SSDTP = 0): security from the masters' AxPROT"
            }
        )
    }
}

/// Checks, through the Secure view of the MMU-500's GR0 `gr0`, that sCR1 gives every
/// context bank and stream-mapping group to the Non-secure world (SMRs, S2CRs, GR1 and the
/// context banks are not banked: this partition decides who owns them), restores the counts
/// if an earlier stage changed them, and reports sCR0, NSCR0 and whether the SMMU has an SSD
/// table.
pub fn smmu_partition<B: RegisterBus + ?Sized>(gr0: &B) -> Result<PartitionReport> {
    let regs = SmmuSecureGr0::new(gr0, 0)?;
    let (sidr0, sidr1) = (regs.sidr0().get(), regs.sidr1().get());
    let scr1_before = regs.scr1().get();
    let found = Partition::of(scr1_before, sidr0, sidr1);
    if !found.all_non_secure() {
        regs.scr1().set(found.restored(scr1_before));
    }
    let scr1_after = regs.scr1().get();
    Ok(PartitionReport {
        scr1_before,
        scr1_after,
        found,
        now: Partition::of(scr1_after, sidr0, sidr1),
        scr0: regs.scr0().get(),
        nscr0: regs.nscr0().get(),
        ssd_table: regs.sidr1().is_set(SIDR1::SSDTP),
    })
}

#[cfg(test)]
mod tests {
    use boards::zynqmp::security::{
        NON_SECURE_INTERRUPTS, SCR0_RESET, SCR1_RESET, SIDR0_RESET, SIDR1_RESET,
    };
    use hal::model::{ModelBus, RegisterModel};
    use hal::regs::AccessWidth;

    use super::*;

    /// A page of plain 32-bit registers, with some read-only offsets.
    struct Page {
        regs: Vec<u32>,
        read_only: Vec<usize>,
    }

    impl Page {
        fn new(preset: &[(usize, u32)], read_only: &[usize]) -> Self {
            let mut regs = vec![0; 0x1000 / 4];
            for &(offset, value) in preset {
                regs[offset / 4] = value;
            }
            Page {
                regs,
                read_only: read_only.to_vec(),
            }
        }
    }

    impl RegisterModel for Page {
        fn size(&self) -> usize {
            0x1000
        }
        fn read(&mut self, offset: usize, _: AccessWidth) -> u64 {
            u64::from(self.regs[offset / 4])
        }
        fn write(&mut self, offset: usize, _: AccessWidth, value: u64) {
            if !self.read_only.contains(&offset) {
                self.regs[offset / 4] = value as u32;
            }
        }
    }

    /// ID_AA64PFR0_EL1 of the Cortex-A53 (DDI 0500: EL0-EL3 AArch64 and AArch32, FP and
    /// AdvSIMD): 0x2222.
    const A53_PFR0: u64 = 0x2222;

    #[test]
    fn the_drop_goes_to_el2_where_it_exists_and_to_el1_otherwise() {
        assert_eq!(drop_target(A53_PFR0), DropTarget::El2);
        assert_eq!(drop_target(0x1122), DropTarget::El2, "EL2 AArch64 only");
        assert_eq!(drop_target(0x2022), DropTarget::El1, "no EL2");
        assert_eq!(DropTarget::El2.el(), 2);
    }

    #[test]
    fn the_register_values_of_a_drop_to_el2() {
        let plan = lower_el(DropTarget::El2, 0x1000_0800, 0x1008_0000);
        let writes: Vec<(SysReg, u64)> = plan.writes.iter().copied().collect();
        assert_eq!(
            writes,
            [
                // NS (0), RES1 (5:4), HCE (8), RW (10).
                (SysReg::ScrEl3, 0x531),
                // RW (31): EL1 is AArch64; E2H, TGE, VM clear.
                (SysReg::HcrEl2, 0x8000_0000),
                // EL1PCTEN (0), EL1PCEN (1).
                (SysReg::CnthctlEl2, 0b11),
                (SysReg::CntvoffEl2, 0),
                (SysReg::CptrEl2, 0x33ff),
                (SysReg::Sctlr(El::El2), 0x30c5_0830),
                (SysReg::Vbar(El::El2), 0x1000_0800),
                (SysReg::SpEl2, 0x1008_0000),
            ]
        );
        // EL2t (0b1000) with D, A, I, F (bits 9:6) masked.
        assert_eq!(plan.spsr, 0x3c8);
        // SCR_EL3: IRQ, FIQ and EA not taken to EL3, SMC enabled.
        assert_eq!(0x531 & 0b1110, 0);
        assert_eq!(0x531 & (1 << 7), 0);
        // SCTLR_EL2: M (0), C (2), I (12), EE (25) clear.
        assert_eq!(SCTLR_EL2_RES1 & (1 | 1 << 2 | 1 << 12 | 1 << 25), 0);
    }

    #[test]
    fn the_register_values_of_a_drop_to_el1_touch_no_el2_register() {
        let plan = lower_el(DropTarget::El1, 0x1000_0800, 0x1008_0000);
        let writes: Vec<(SysReg, u64)> = plan.writes.iter().copied().collect();
        assert_eq!(
            writes,
            [
                // NS, RES1, RW; HVC undefined (no EL2).
                (SysReg::ScrEl3, 0x431),
                (SysReg::Sctlr(El::El1), 0x30d0_0800),
                (SysReg::Vbar(El::El1), 0x1000_0800),
                (SysReg::SpEl1, 0x1008_0000),
            ]
        );
        assert_eq!(plan.spsr, 0x3c4, "EL1t, DAIF masked");
        assert_eq!(SCTLR_EL1_RES1 & (1 | 1 << 2 | 1 << 12 | 1 << 25), 0);
    }

    /// A GIC-400 distributor with 192 interrupt IDs (ITLinesNumber = 5, the ZynqMP's: 160
    /// SPIs), as a Secure access sees it.
    fn gic400(lines_number: u32) -> ModelBus<Page> {
        ModelBus::new(Page::new(&[(0x004, lines_number)], &[0x004]))
    }

    #[test]
    fn the_non_secure_interrupts_become_group_1_and_nothing_else() {
        let bus = gic400(5);
        bus.lock().regs[0x80 / 4 + 1] = 0x8000_0000; // INTID 63 already Group 1
        let report = group1(&bus, &NON_SECURE_INTERRUPTS).unwrap();
        assert_eq!(
            report,
            GroupReport {
                asked: 13,
                group1: 13,
                lines: 192
            }
        );
        let g = bus.lock();
        let words: Vec<u32> = g.regs[0x80 / 4..0x80 / 4 + 6].to_vec();
        // Word 0: PPIs 10, 11, 14 = INTIDs 26, 27, 30. Word 1: UART0 (53) and INTID 63 kept.
        // Word 4: GDMA 156-159; word 5: GDMA 160-163 and the SMMU (187).
        assert_eq!(
            words,
            [
                1 << 26 | 1 << 27 | 1 << 30,
                1 << 21 | 1 << 31,
                0,
                0,
                0xf << 28,
                0xf | 1 << 27
            ]
        );
        drop(g);
        assert_eq!(
            report.to_string(),
            "13 of 13 INTIDs read back Group 1 (of 192 implemented)"
        );
    }

    #[test]
    fn an_intid_the_distributor_lacks_is_refused_before_anything_is_written() {
        let bus = gic400(4); // 160 IDs: GDMA 4 (160) and the SMMU (187) are beyond
        assert_eq!(
            group1(&bus, &NON_SECURE_INTERRUPTS),
            Err(FirmwareError::InterruptOutOfRange { intid: 160 })
        );
        assert!(bus.lock().regs[0x80 / 4..0x100 / 4].iter().all(|&w| w == 0));
    }

    #[test]
    fn a_distributor_whose_groups_do_not_stick_is_reported() {
        // A Non-secure access (or a GIC without the Security Extensions): IGROUPR is RAZ/WI.
        let bus = ModelBus::new(Page::new(
            &[(0x004, 5)],
            &(0x80..0x100).step_by(4).collect::<Vec<_>>(),
        ));
        let report = group1(&bus, &NON_SECURE_INTERRUPTS).unwrap();
        assert_eq!(report.group1, 0);
    }

    #[test]
    fn the_smmu_wrapper_is_powered_and_its_interrupts_enabled_as_the_fsbl_does() {
        // A TBU5 power-down request (bit 13 clear) left by an earlier stage.
        let bus = ModelBus::new(Page::new(&[(0x40, 0x5fff), (0x14, 0x8000_001f)], &[]));
        let report = power_smmu(&bus).unwrap();
        assert_eq!(report.qreqn_before, 0x5fff);
        assert_eq!(report.qreqn_after, 0x7fff);
        assert!(report.powered());
        assert_eq!(bus.lock().regs[0x18 / 4], 0x8000_001f, "IER_0");
        assert_eq!(
            report.to_string(),
            "QREQN 0x5fff -> 0x7fff (TCU and TBU0-5 powered), IER_0 <- 0x8000001f, IMR_0 \
             0x8000001f"
        );
        // At its reset value nothing is written to QREQN.
        let bus = ModelBus::new(Page::new(&[(0x40, 0x7fff)], &[0x40]));
        assert!(power_smmu(&bus).unwrap().powered());
        // Nothing there (QEMU xlnx-zcu102): reads 0 whatever is written.
        let bus = ModelBus::new(Page::new(&[], &[0x40, 0x18]));
        let report = power_smmu(&bus).unwrap();
        assert!(!report.powered());
        assert!(report.to_string().contains("nothing answers there?"));
    }

    #[test]
    fn the_gdma_channels_are_made_non_secure_only_where_they_are_not() {
        let bus = ModelBus::new(Page::new(&[(0x50, 0xff)], &[]));
        let report = gdma_non_secure(&bus, 0b11).unwrap();
        assert_eq!((report.before, report.after), (0xff, 0xff));
        assert_eq!(
            report.to_string(),
            "slcr_gdma 0xff (GDMA channels Non-secure)"
        );
        // Channel 1 left Secure, channel 5 Non-secure: channel 1 is set, 5 kept.
        let bus = ModelBus::new(Page::new(&[(0x50, 0x21)], &[]));
        let report = gdma_non_secure(&bus, 0b11).unwrap();
        assert_eq!(report.after, 0x23);
        assert!(report.non_secure());
    }

    #[test]
    fn cntfrq_is_set_from_the_system_counter_only_when_it_reads_0() {
        let bus = ModelBus::new(Page::new(&[(0x20, 0x05f5_b9f8)], &[]));
        assert_eq!(counter_frequency(&bus, 62_500_000), Ok(None));
        assert_eq!(counter_frequency(&bus, 0), Ok(Some(99_990_008)));
        let nothing = ModelBus::new(Page::new(&[], &[]));
        assert_eq!(counter_frequency(&nothing, 0), Ok(None));
    }

    fn smmu_gr0(scr1: u32) -> ModelBus<Page> {
        ModelBus::new(Page::new(
            &[
                (0x000, SCR0_RESET),
                (0x004, scr1),
                (0x020, SIDR0_RESET),
                (0x024, SIDR1_RESET),
                (0x400, SCR0_RESET),
            ],
            &[0x020, 0x024],
        ))
    }

    #[test]
    fn the_reset_partition_is_left_alone() {
        let bus = smmu_gr0(SCR1_RESET);
        let report = smmu_partition(&bus).unwrap();
        assert!(report.found.all_non_secure());
        assert_eq!(report.scr1_after, SCR1_RESET);
        assert!(!report.ssd_table);
        assert_eq!(
            report.to_string(),
            "sCR1 0x02013010: 16 of 16 context banks and 48 of 48 stream-mapping groups \
             Non-secure; sCR0 0x00200001, NSCR0 0x00200001 (CLIENTPD: bypass until the \
             Non-secure driver enables translation); no SSD table (SIDR1.SSDTP = 0): security \
             from the masters' AxPROT"
        );
    }

    #[test]
    fn a_partition_that_keeps_banks_secure_is_restored_and_said_so() {
        // 8 banks and 40 groups kept Secure by an earlier stage; NSNUMIRPTO and GEFRO kept.
        let scr1 = 0x0201_0000 | 40 << 8 | 8;
        let bus = smmu_gr0(scr1);
        let report = smmu_partition(&bus).unwrap();
        assert!(!report.found.all_non_secure());
        assert_eq!(report.scr1_after, SCR1_RESET);
        assert!(report.now.all_non_secure());
        assert!(report.to_string().starts_with(
            "sCR1 0x02012808 gave only 8 banks and 40 groups to Non-secure; \
                              restored to 0x02013010: 16 of 16"
        ));
    }
}
