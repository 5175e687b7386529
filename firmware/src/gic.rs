//! Just enough GICv3 to wake the CPU from `wfi` when a device raises a shared peripheral
//! interrupt (SPI): find this CPU's redistributor by its affinity, route one SPI to this CPU as
//! Group 1, wake the redistributor, enable a PPI (the timer's), and enable the CPU interface.
//! Interrupts stay masked in PSTATE (DAIF.I), so no handler ever runs: a pending, enabled
//! interrupt is a WFI wake-up event whatever PSTATE.I says (Arm ARM DDI0487 D1.6.2 "Wait for
//! Interrupt"), and a level-sensitive interrupt that was never acknowledged stops being
//! pending as soon as its source drops the line (Arm IHI0069 §4.1.2, level-sensitive
//! interrupts), so nothing needs an EOI.
//!
//! Register names, offsets and bits from Arm IHI0069 (GICv3/v4 architecture specification),
//! chapter 12: `GICD_CTLR` (0x0000: EnableGrp0/EnableGrp1 or EnableGrp1NS/EnableGrp1A in
//! bits 0-1, ARE/ARE_NS bit 4, DS bit 6, RWP bit 31), `GICD_TYPER.ITLinesNumber` (bits 4:0),
//! `GICD_IGROUPR<n>` (0x0080), `GICD_ISENABLER<n>` (0x0100), `GICD_IPRIORITYR<n>` (0x0400),
//! `GICD_ICFGR<n>` (0x0C00), `GICD_IROUTER<n>` (0x6000 + 8n), `GICR_WAKER` (RD_base 0x0014:
//! ProcessorSleep bit 1, ChildrenAsleep bit 2), the SGI_base frame (RD_base + 64 KiB) with
//! `GICR_IGROUPR0` (0x0080), `GICR_ISENABLER0` (0x0100) and `GICR_IPRIORITYR<n>` (0x0400) for
//! a PE's own PPIs, and the CPU interface system registers
//! `ICC_SRE_EL1`/`ICC_SRE_EL2`, `ICC_PMR_EL1`, `ICC_IGRPEN1_EL1`.
//!
//! QEMU `virt` (7.2, `gic-version=3`): distributor at 0x0800_0000, redistributors from
//! 0x080A_0000 (`base_memmap`); PCIe INTx A-D are SPIs 3-6, swizzled by slot
//! (`hw/arm/virt.c` `create_pcie_irq_map`): edu at slot 2, pin A is SPI 5 = INTID 37.

use hal::regs::RegisterBus;
use tock_registers::interfaces::{Readable, Writeable};
use tock_registers::register_bitfields;

use crate::error::{FirmwareError, Result};

/// Distributor base on QEMU `virt`.
pub const VIRT_GICD: u64 = 0x0800_0000;
/// Size of the distributor frame.
pub const GICD_SIZE: usize = 0x1_0000;
/// CPU 0's redistributor on QEMU `virt`.
pub const VIRT_GICR: u64 = 0x080a_0000;
/// Size of one redistributor (RD_base + SGI_base frames).
pub const GICR_SIZE: usize = 0x2_0000;
/// First SPI INTID.
pub const FIRST_SPI: u32 = 32;
/// First PPI INTID (INTIDs 16-31 are PPIs).
pub const FIRST_PPI: u32 = 16;
/// Offset of a redistributor's SGI_base frame from its RD_base frame (IHI0069 §12.10).
pub const SGI_FRAME: usize = 0x1_0000;

/// The INTID of PCI INTx `pin` (1 = INTA .. 4 = INTD) of the device in `slot` on `bus`, on
/// QEMU `virt`: SPI `3 + (pin - 1 + slot) % 4` (QEMU 7.2 `create_pcie_irq_map`). That map holds
/// on the root bus only (`bus == root_bus`); behind a bridge the pin is swizzled again at each
/// bridge, which is refused rather than guessed.
pub fn virt_pci_intx(root_bus: u8, bus: u8, slot: u8, pin: u8) -> Result<u32> {
    if bus != root_bus {
        return Err(FirmwareError::PciIntxBehindBridge { bus, root_bus });
    }
    if !(1..=4).contains(&pin) || slot > 31 {
        return Err(FirmwareError::InterruptOutOfRange {
            intid: u32::from(pin),
        });
    }
    Ok(FIRST_SPI + 3 + ((u32::from(pin) - 1 + u32::from(slot)) % 4))
}

#[allow(missing_docs)]
mod fields {
    use super::register_bitfields;

    register_bitfields![u32,
        /// GICD_CTLR (IHI0069 chapter 12).
        pub GICD_CTLR [
            /// EnableGrp0 (DS = 1) / EnableGrp1NS (Non-secure view with DS = 0).
            ENABLE_0 OFFSET(0) NUMBITS(1) [],
            /// EnableGrp1 (DS = 1) / EnableGrp1A (Non-secure view with DS = 0).
            ENABLE_1 OFFSET(1) NUMBITS(1) [],
            /// Affinity routing enable (ARE / ARE_NS).
            ARE OFFSET(4) NUMBITS(1) [],
            /// Security disabled: one security state.
            DS OFFSET(6) NUMBITS(1) [],
            /// Register write pending.
            RWP OFFSET(31) NUMBITS(1) []
        ],
        /// GICR_WAKER (IHI0069 chapter 12).
        pub GICR_WAKER [
            /// The PE is asleep: the redistributor does not forward interrupts to it.
            PROCESSOR_SLEEP OFFSET(1) NUMBITS(1) [],
            /// The redistributor's interface to the PE is quiescent.
            CHILDREN_ASLEEP OFFSET(2) NUMBITS(1) []
        ]
    ];
}
pub use fields::{GICD_CTLR, GICR_WAKER};

hal::register_block! {
    /// The GICv3 distributor (the registers this module uses).
    pub struct Distributor {
        /// GICD_CTLR.
        (0x0000 => pub ctlr: Rw u32, GICD_CTLR::Register),
        /// GICD_TYPER: ITLinesNumber in bits 4:0 (32 * (N + 1) INTIDs).
        (0x0004 => pub typer: Ro u32),
        /// GICD_IGROUPR<n>: one bit per INTID, 1 = Group 1.
        (0x0080 => pub igroupr: [Rw u32; 32, stride 4]),
        /// GICD_ISENABLER<n>: write 1 to enable an INTID.
        (0x0100 => pub isenabler: [Rw u32; 32, stride 4]),
        /// GICD_IPRIORITYR<n>: one byte per INTID, lower is higher priority.
        (0x0400 => pub ipriorityr: [Rw u32; 255, stride 4]),
        /// GICD_ICFGR<n>: two bits per INTID, bit 1 of each pair = edge-triggered.
        (0x0c00 => pub icfgr: [Rw u32; 64, stride 4]),
        /// GICD_IROUTER<n>: affinity of SPI n (n >= 32), 64-bit.
        (0x6000 => pub irouter: [Rw u64; 1020, stride 8]),
    }
    size = 0x1_0000;
}

hal::register_block! {
    /// One redistributor's RD_base frame (the registers this module uses).
    pub struct Redistributor {
        /// GICR_CTLR.
        (0x0000 => pub ctlr: Rw u32),
        /// GICR_TYPER (64-bit): Affinity_Value [63:32] (Aff3.Aff2.Aff1.Aff0), Last [4] (the
        /// last frame of its region), VLPIS [1] (two more 64 KiB frames follow: VLPI_base and
        /// reserved, IHI0069 §9.1).
        (0x0008 => pub typer: Ro u64),
        /// GICR_WAKER.
        (0x0014 => pub waker: Rw u32, GICR_WAKER::Register),
    }
    size = 0x1_0000;
}

hal::register_block! {
    /// One redistributor's SGI_base frame (the registers this module uses): the SGIs and PPIs
    /// of its PE.
    pub struct RedistributorSgi {
        /// GICR_IGROUPR0: one bit per SGI/PPI, 1 = Group 1.
        (0x0080 => pub igroupr0: Rw u32),
        /// GICR_ISENABLER0: write 1 to enable an SGI/PPI.
        (0x0100 => pub isenabler0: Rw u32),
        /// GICR_IPRIORITYR<n>: one byte per SGI/PPI.
        (0x0400 => pub ipriorityr: [Rw u32; 8, stride 4]),
    }
    size = 0x1_0000;
}

/// The affinity value GICR_TYPER reports for the PE whose MPIDR_EL1 is `mpidr`: Aff3 (MPIDR
/// bits 39:32) in bits 31:24, then Aff2, Aff1 and Aff0 (MPIDR bits 23:0).
pub const fn affinity_of_mpidr(mpidr: u64) -> u32 {
    (((mpidr >> 32) & 0xff) << 24 | (mpidr & 0xff_ffff)) as u32
}

/// The offset, in a redistributor region (a device tree `reg` entry of the GIC), of the frames
/// of the PE with `affinity` ([`affinity_of_mpidr`]): walks the frames by GICR_TYPER, 128 KiB
/// each or 256 KiB with VLPIS, until its Last bit (IHI0069 §9.1, §12.11.35). On QEMU `virt`
/// CPU 0's are the first, but the order is the platform's.
pub fn find_redistributor<R: RegisterBus + ?Sized>(region: &R, affinity: u32) -> Result<usize> {
    let mut offset = 0usize;
    while offset
        .checked_add(GICR_SIZE)
        .is_some_and(|end| end <= region.size())
    {
        let typer = Redistributor::new(region, offset)?.typer().get();
        if (typer >> 32) as u32 == affinity {
            return Ok(offset);
        }
        if typer & (1 << 4) != 0 {
            break;
        }
        offset += if typer & (1 << 1) != 0 {
            2 * GICR_SIZE
        } else {
            GICR_SIZE
        };
    }
    Err(FirmwareError::GicRedistributorNotFound { affinity })
}

/// The affinity of the PE running this code (MPIDR_EL1), for [`find_redistributor`].
#[cfg(all(target_arch = "aarch64", target_os = "none"))]
pub fn current_affinity() -> u32 {
    affinity_of_mpidr(hal::sysreg::read(hal::sysreg::SysReg::MpidrEl1))
}

/// How long (polls) to wait for GICD_CTLR.RWP or GICR_WAKER.ChildrenAsleep.
const POLLS: u32 = 100_000;

fn wait(register: &'static str, mut done: impl FnMut() -> bool) -> Result<()> {
    for _ in 0..POLLS {
        if done() {
            return Ok(());
        }
        core::hint::spin_loop();
    }
    Err(FirmwareError::GicTimeout { register })
}

/// Routes SPI `intid` to the PE with `affinity` ([`affinity_of_mpidr`]) as Group 1 at priority
/// 0xa0, level- or edge-triggered, enables it, turns on affinity routing and Group 1 in the
/// distributor, and wakes that PE's redistributor `gicr` ([`find_redistributor`]). Idempotent.
pub fn route_spi<B: RegisterBus + ?Sized, R: RegisterBus + ?Sized>(
    gicd: &B,
    gicr: &R,
    intid: u32,
    level_sensitive: bool,
    affinity: u32,
) -> Result<()> {
    let dist = Distributor::new(gicd, 0)?;
    let lines = ((dist.typer().get() & 0x1f) + 1) * 32;
    if intid < FIRST_SPI || intid >= lines.min(1020) {
        return Err(FirmwareError::InterruptOutOfRange { intid });
    }
    // Affinity routing and both group enables: whichever view (DS = 1, or the Non-secure
    // view with DS = 0) the bits mean, Group 1 ends up enabled.
    let ctlr = dist.ctlr().get();
    dist.ctlr().set(
        ctlr | GICD_CTLR::ARE::SET.value
            | GICD_CTLR::ENABLE_0::SET.value
            | GICD_CTLR::ENABLE_1::SET.value,
    );
    wait("GICD_CTLR.RWP", || !dist.ctlr().is_set(GICD_CTLR::RWP))?;

    let word = (intid / 32) as usize;
    let bit = 1u32 << (intid % 32);
    let group = dist.igroupr(word)?;
    group.set(group.get() | bit);
    let priority = dist.ipriorityr((intid / 4) as usize)?;
    let shift = (intid % 4) * 8;
    priority.set((priority.get() & !(0xff << shift)) | (0xa0 << shift));
    let config = dist.icfgr((intid / 16) as usize)?;
    let edge_bit = 1u32 << ((intid % 16) * 2 + 1);
    config.set(if level_sensitive {
        config.get() & !edge_bit
    } else {
        config.get() | edge_bit
    });
    // GICD_IROUTER: Aff3 in bits 39:32, Aff2.Aff1.Aff0 in 23:0, IRM (bit 31) clear.
    let aff = u64::from(affinity);
    dist.irouter(intid as usize)?
        .set(((aff >> 24) << 32) | (aff & 0xff_ffff));
    // ISENABLER is write-1-to-set: write only our bit.
    dist.isenabler(word)?.set(bit);
    wait("GICD_CTLR.RWP", || !dist.ctlr().is_set(GICD_CTLR::RWP))?;

    let rd = Redistributor::new(gicr, 0)?;
    rd.waker()
        .set(rd.waker().get() & !GICR_WAKER::PROCESSOR_SLEEP::SET.value);
    wait("GICR_WAKER.ChildrenAsleep", || {
        !rd.waker().is_set(GICR_WAKER::CHILDREN_ASLEEP)
    })
}

/// Enables PPI `intid` (16-31) of the PE behind redistributor `gicr` (RD_base and SGI_base
/// frames) as Group 1 at priority 0xa0, e.g. a generic timer's interrupt, and wakes the
/// redistributor. Its trigger mode is left as the PE's timer wires it (level). Idempotent.
pub fn enable_ppi<R: RegisterBus + ?Sized>(gicr: &R, intid: u32) -> Result<()> {
    if !(FIRST_PPI..FIRST_SPI).contains(&intid) {
        return Err(FirmwareError::InterruptOutOfRange { intid });
    }
    let sgi = RedistributorSgi::new(gicr, SGI_FRAME)?;
    let bit = 1u32 << intid;
    sgi.igroupr0().set(sgi.igroupr0().get() | bit);
    let priority = sgi.ipriorityr((intid / 4) as usize)?;
    let shift = (intid % 4) * 8;
    priority.set((priority.get() & !(0xff << shift)) | (0xa0 << shift));
    // ISENABLER0 is write-1-to-set: write only our bit.
    sgi.isenabler0().set(bit);
    let rd = Redistributor::new(gicr, 0)?;
    rd.waker()
        .set(rd.waker().get() & !GICR_WAKER::PROCESSOR_SLEEP::SET.value);
    wait("GICR_WAKER.ChildrenAsleep", || {
        !rd.waker().is_set(GICR_WAKER::CHILDREN_ASLEEP)
    })
}

/// Enables the GICv3 CPU interface for Group 1 at the current exception level (EL1 or EL2)
/// with every priority unmasked, and keeps IRQs masked in PSTATE, so a pending interrupt
/// only ends a `wfi`.
#[cfg(all(target_arch = "aarch64", target_os = "none"))]
pub fn enable_cpu_interface(el: u8) -> Result<()> {
    use hal::barrier;
    use hal::sysreg::fields::{DAIF, ICC_SRE_EL2};
    use hal::sysreg::{self, SysReg};
    if !(1..=2).contains(&el) {
        return Err(FirmwareError::UnsupportedExceptionLevel { el });
    }
    // SAFETY: these writes only configure this core's GIC CPU interface and mask IRQs in
    // PSTATE; no memory is touched. ICC_SRE_EL2.Enable lets EL1 use the system register
    // interface when we run at EL2 (IHI0069 §12.2, ICC_SRE_EL2.SRE and .Enable).
    unsafe {
        let daif = sysreg::read(SysReg::Daif);
        sysreg::write(SysReg::Daif, daif | DAIF::I::Masked.value);
        if el == 2 {
            let sre = sysreg::read(SysReg::IccSreEl2);
            sysreg::write(
                SysReg::IccSreEl2,
                sre | (ICC_SRE_EL2::SRE::SET + ICC_SRE_EL2::ENABLE::SET).value,
            );
            barrier::isb();
        }
        // ICC_SRE_EL1.SRE (bit 0), then every priority unmasked (ICC_PMR_EL1 = 0xff) and
        // Group 1 enabled (ICC_IGRPEN1_EL1.Enable, bit 0).
        let sre = sysreg::read(SysReg::IccSreEl1);
        sysreg::write(SysReg::IccSreEl1, sre | 1);
        barrier::isb();
        sysreg::write(SysReg::IccPmrEl1, 0xff);
        sysreg::write(SysReg::IccIgrpen1El1, 1);
        barrier::isb();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use hal::model::{ModelBus, RegisterModel};
    use hal::regs::AccessWidth;

    use super::*;

    /// A distributor (and redistributor) as IHI0069 describes the bits used here: RWP reads
    /// 1 for a few reads after a CTLR write, ISENABLER is write-1-to-set, WAKER.ChildrenAsleep
    /// follows ProcessorSleep after a delay.
    struct Gic {
        ctlr: u32,
        rwp_reads: u32,
        typer: u32,
        group: [u32; 32],
        enable: [u32; 32],
        priority: [u32; 255],
        config: [u32; 64],
        router: Vec<u64>,
        waker: u32,
        asleep_reads: u32,
        ppi_group: u32,
        ppi_enable: u32,
        ppi_priority: [u32; 8],
        rd_typer: u64,
    }

    impl Gic {
        fn new() -> Self {
            Self {
                ctlr: 1 << 6, // DS, as QEMU virt without EL3
                rwp_reads: 0,
                typer: 7, // 256 INTIDs
                group: [0; 32],
                enable: [0; 32],
                priority: [0; 255],
                config: [0; 64],
                router: vec![0xdead; 1020],
                waker: 0b110, // asleep
                asleep_reads: 0,
                ppi_group: 0,
                ppi_enable: 0,
                ppi_priority: [0; 8],
                rd_typer: 1 << 4, // affinity 0, Last
            }
        }
    }

    impl RegisterModel for Gic {
        fn size(&self) -> usize {
            0x3_0000
        }
        fn read(&mut self, offset: usize, _: AccessWidth) -> u64 {
            match offset {
                0x0000 => {
                    let rwp = if self.rwp_reads > 0 {
                        self.rwp_reads -= 1;
                        1 << 31
                    } else {
                        0
                    };
                    u64::from(self.ctlr | rwp)
                }
                0x0004 => u64::from(self.typer),
                0x0080..0x0100 => u64::from(self.group[(offset - 0x80) / 4]),
                0x0100..0x0180 => u64::from(self.enable[(offset - 0x100) / 4]),
                0x0400..0x07fc => u64::from(self.priority[(offset - 0x400) / 4]),
                0x0c00..0x0d00 => u64::from(self.config[(offset - 0xc00) / 4]),
                0x6000..0x7fe0 => self.router[(offset - 0x6000) / 8],
                // The redistributor model sits at +0x1_0000 of the same window.
                0x1_0014 => {
                    let mut w = self.waker;
                    if self.waker & 2 == 0 {
                        if self.asleep_reads > 0 {
                            self.asleep_reads -= 1;
                        } else {
                            w &= !4;
                            self.waker = w;
                        }
                    }
                    u64::from(w)
                }
                0x1_0008 => self.rd_typer,
                // Its SGI_base frame follows at +0x2_0000.
                0x2_0080 => u64::from(self.ppi_group),
                0x2_0100 => u64::from(self.ppi_enable),
                0x2_0400..0x2_0420 => u64::from(self.ppi_priority[(offset - 0x2_0400) / 4]),
                _ => 0,
            }
        }
        fn write(&mut self, offset: usize, _: AccessWidth, value: u64) {
            let v = value as u32;
            match offset {
                0x0000 => {
                    self.ctlr = (v & !(1 << 31)) | (1 << 6);
                    self.rwp_reads = 3;
                }
                0x0080..0x0100 => self.group[(offset - 0x80) / 4] = v,
                0x0100..0x0180 => self.enable[(offset - 0x100) / 4] |= v,
                0x0400..0x07fc => self.priority[(offset - 0x400) / 4] = v,
                0x0c00..0x0d00 => self.config[(offset - 0xc00) / 4] = v,
                0x6000..0x7fe0 => self.router[(offset - 0x6000) / 8] = value,
                0x1_0014 => {
                    self.waker = v & 0b110;
                    self.asleep_reads = 2;
                }
                0x2_0080 => self.ppi_group = v,
                0x2_0100 => self.ppi_enable |= v,
                0x2_0400..0x2_0420 => self.ppi_priority[(offset - 0x2_0400) / 4] = v,
                _ => {}
            }
        }
    }

    struct Offset<'a, B>(&'a B, usize);
    impl<B: RegisterBus> RegisterBus for Offset<'_, B> {
        fn read(&self, offset: usize, width: AccessWidth) -> u64 {
            self.0.read(offset + self.1, width)
        }
        fn write(&self, offset: usize, width: AccessWidth, value: u64) {
            self.0.write(offset + self.1, width, value)
        }
        fn size(&self) -> usize {
            self.0.size() - self.1
        }
    }

    #[test]
    fn edu_intx_is_intid_37_on_virt() {
        // SPI 3 + (pin A = 0 + slot 2) % 4 = SPI 5 = INTID 32 + 5.
        assert_eq!(virt_pci_intx(0, 0, 2, 1), Ok(37));
        assert_eq!(virt_pci_intx(0, 0, 1, 4), Ok(35), "SPI 3 + (3 + 1) % 4");
        assert_eq!(
            virt_pci_intx(0, 0, 2, 0),
            Err(FirmwareError::InterruptOutOfRange { intid: 0 })
        );
        assert_eq!(
            virt_pci_intx(0, 0, 2, 5),
            Err(FirmwareError::InterruptOutOfRange { intid: 5 })
        );
        // A root bus that is not 0 is still the root bus.
        assert_eq!(virt_pci_intx(4, 4, 2, 1), Ok(37));
    }

    #[test]
    fn an_intx_behind_a_bridge_is_refused_not_guessed() {
        // edu at slot 0 behind a root port on bus 1: the root-bus map would say SPI 3, but
        // the pin reaching the host bridge is the port's, swizzled by its slot.
        assert_eq!(
            virt_pci_intx(0, 1, 0, 1),
            Err(FirmwareError::PciIntxBehindBridge {
                bus: 1,
                root_bus: 0
            })
        );
    }

    #[test]
    fn routes_one_spi_and_wakes_the_redistributor() {
        let bus = ModelBus::new(Gic::new());
        let gicr = Offset(&bus, 0x1_0000);
        route_spi(&bus, &gicr, 37, true, 0).unwrap();
        let g = bus.lock();
        // CTLR: ARE (bit 4), EnableGrp0/1 (bits 0, 1), DS kept: 0x53.
        assert_eq!(g.ctlr, 0x53);
        assert_eq!(g.group[1], 1 << 5, "INTID 37 = word 1, bit 5: Group 1");
        assert_eq!(g.enable[1], 1 << 5);
        assert_eq!(g.enable[0], 0);
        // IPRIORITYR9 byte 1 (37 = 4 * 9 + 1) = 0xa0.
        assert_eq!(g.priority[9], 0xa0 << 8);
        // ICFGR2 bits for INTID 37: pair (37 - 32) = 5 -> bit 11 is the edge bit; level = 0.
        assert_eq!(g.config[2] & (1 << 11), 0);
        assert_eq!(g.router[37], 0, "affinity 0.0.0.0, IRM = 0");
        drop(g);
        route_spi(&bus, &gicr, 38, true, 0x0102_0304).unwrap();
        assert_eq!(bus.lock().router[38], 0x01_0002_0304, "Aff3 in bits 39:32");
        let g = bus.lock();
        assert_eq!(g.router[36], 0xdead, "other routes untouched");
        assert_eq!(
            g.waker & 0b110,
            0,
            "ProcessorSleep and ChildrenAsleep clear"
        );
    }

    /// A redistributor region of frames with the given (affinity, VLPIS) and Last on the last.
    struct Region(Vec<(u32, bool)>, usize);
    impl RegisterModel for Region {
        fn size(&self) -> usize {
            self.1
        }
        fn read(&mut self, offset: usize, _: AccessWidth) -> u64 {
            let mut at = 0;
            for (i, &(affinity, vlpis)) in self.0.iter().enumerate() {
                if offset == at + 8 {
                    let last = u64::from(i + 1 == self.0.len()) << 4;
                    return (u64::from(affinity) << 32) | last | (u64::from(vlpis) << 1);
                }
                at += if vlpis { 0x4_0000 } else { 0x2_0000 };
            }
            0
        }
        fn write(&mut self, _: usize, _: AccessWidth, _: u64) {}
    }

    #[test]
    fn the_redistributor_is_found_by_affinity_not_assumed_first() {
        assert_eq!(
            affinity_of_mpidr(0x8000_0000),
            0,
            "the U and MT bits are not affinity"
        );
        assert_eq!(affinity_of_mpidr(0x12_0003_0201), 0x1203_0201);
        let frames = vec![(0x100, false), (0x0, true), (0x1, false)];
        let bus = ModelBus::new(Region(frames, 0x10_0000));
        assert_eq!(find_redistributor(&bus, 0x100), Ok(0));
        assert_eq!(find_redistributor(&bus, 0x0), Ok(0x2_0000));
        // After a frame with VLPIS, the next is 256 KiB on.
        assert_eq!(find_redistributor(&bus, 0x1), Ok(0x6_0000));
        assert_eq!(
            find_redistributor(&bus, 0x2),
            Err(FirmwareError::GicRedistributorNotFound { affinity: 2 })
        );
        // A region that ends before a Last bit: not found, no access past its end.
        let bus = ModelBus::new(Region(vec![(5, false), (6, false), (7, false)], 0x4_0000));
        assert_eq!(
            find_redistributor(&bus, 7),
            Err(FirmwareError::GicRedistributorNotFound { affinity: 7 })
        );
    }

    #[test]
    fn enables_one_ppi_in_the_redistributor_and_wakes_it() {
        let bus = ModelBus::new(Gic::new());
        let gicr = Offset(&bus, 0x1_0000);
        bus.lock().ppi_priority[6] = 0x1122_3344;
        enable_ppi(&gicr, 27).unwrap();
        let g = bus.lock();
        assert_eq!(g.ppi_group, 1 << 27, "Group 1");
        assert_eq!(g.ppi_enable, 1 << 27);
        // IPRIORITYR6 byte 3 (27 = 4 * 6 + 3) = 0xa0, the other bytes kept.
        assert_eq!(g.ppi_priority[6], 0xa022_3344);
        assert_eq!(g.waker & 0b110, 0, "redistributor awake");
        assert_eq!(g.enable, [0; 32], "no SPI touched");
        drop(g);
        for intid in [15, 32] {
            assert_eq!(
                enable_ppi(&gicr, intid),
                Err(FirmwareError::InterruptOutOfRange { intid })
            );
        }
    }

    #[test]
    fn edge_configuration_and_range_checks() {
        let bus = ModelBus::new(Gic::new());
        let gicr = Offset(&bus, 0x1_0000);
        route_spi(&bus, &gicr, 100, false, 0).unwrap();
        // 100 = 16 * 6 + 4: ICFGR6, pair 4 -> edge bit 9.
        assert_eq!(bus.lock().config[6], 1 << 9);
        assert_eq!(
            route_spi(&bus, &gicr, 31, true, 0),
            Err(FirmwareError::InterruptOutOfRange { intid: 31 })
        );
        assert_eq!(
            route_spi(&bus, &gicr, 256, true, 0),
            Err(FirmwareError::InterruptOutOfRange { intid: 256 })
        );
    }

    #[test]
    fn a_stuck_register_is_a_timeout() {
        let bus = ModelBus::new(Gic::new());
        bus.lock().asleep_reads = u32::MAX;
        let gicr = Offset(&bus, 0x1_0000);
        // Writing WAKER resets the countdown to 2; make it stick afterwards.
        struct Stuck<'a>(&'a ModelBus<Gic>);
        impl RegisterBus for Stuck<'_> {
            fn read(&self, offset: usize, width: AccessWidth) -> u64 {
                self.0.read(offset + 0x1_0000, width) | 0b100
            }
            fn write(&self, offset: usize, width: AccessWidth, value: u64) {
                self.0.write(offset + 0x1_0000, width, value)
            }
            fn size(&self) -> usize {
                0x2_0000
            }
        }
        let _ = gicr;
        assert_eq!(
            route_spi(&bus, &Stuck(&bus), 37, true, 0),
            Err(FirmwareError::GicTimeout {
                register: "GICR_WAKER.ChildrenAsleep"
            })
        );
    }
}
