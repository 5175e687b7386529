//! The Zynq UltraScale+ MPSoC (ZCU102 evaluation board; the ExaNeSt QFDB carries four).
//!
//! Sources: Linux `arch/arm64/boot/dts/xilinx/zynqmp.dtsi` (MMIO bases, sizes and SPIs),
//! Xilinx UG1085 (TRM: SMMU, TBUs, PL port master IDs in table 16-13, DMA controller) and
//! UG1087 (register reference), Xilinx AR 69447 and the "Xen and PL Masters" wiki page (stream
//! ID layout and TBU per port), and Arm DDI0517 §2.3.1 (how MMU-500 forms stream IDs).
//! **\[C\]** = stated by the named source, **\[I\]** = inferred by us.

pub mod pl;
pub mod scenario;
pub mod security;

use smmu_driver::fault::StreamId;
use smmu_driver::v2::Implementation;

use crate::{BoardError, Result};

/// A physical MMIO or memory range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    /// First byte.
    pub base: u64,
    /// Size in bytes.
    pub size: u64,
}

impl Region {
    /// One past the last byte.
    pub const fn end(&self) -> u64 {
        self.base + self.size
    }

    /// Whether `addr` is inside.
    pub const fn contains(&self, addr: u64) -> bool {
        addr >= self.base && addr - self.base < self.size
    }
}

/// A shared peripheral interrupt of the GIC-400.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Spi(pub u16);

impl Spi {
    /// The GIC interrupt ID: SPI n is INTID n + 32 (GICv2 numbering).
    pub const fn intid(self) -> u16 {
        self.0 + 32
    }
}

/// The MMU-500.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmmuInfo {
    /// Register window (zynqmp.dtsi `iommu@fd800000`, size 0x20000) **\[C\]**.
    pub regs: Region,
    /// Register page size: 4 KiB (UG1087 SMMU_SIDR1.PAGESIZE = 0) **\[C\]**.
    pub page_size: u64,
    /// Pages of global space before the context banks (NUMPAGENDXB = 3 -> 16) **\[C\]**.
    pub global_pages: u64,
    /// Context banks (UG1087 SIDR1.NUMCB = 16) **\[C\]**.
    pub context_banks: u16,
    /// Stream-match groups (48: UG1087 `SMMU_SMR0`-`SMMU_SMR47`) **\[C\]**.
    pub stream_match_groups: u16,
    /// Stream ID width (15 bits: 5 TBU + 10 master bits; AR 69447) **\[C\]**.
    pub stream_id_bits: u8,
    /// The one interrupt shared by the global fault and all 16 context banks (zynqmp.dtsi: 17
    /// entries all `<0 155 4>`, level-high) **\[C\]**.
    pub interrupt: Spi,
    /// The Xilinx wrapper registers `SMMU_REG` (ISR_0/IMR_0, QREQN; [`security::SmmuReg`])
    /// **\[C\]** base; the size of the block is not taken from a source, one 4 KiB page is
    /// assumed **\[I\]**.
    pub wrapper: Region,
    /// The implementation, for the driver's IMPLEMENTATION DEFINED set-up: an Arm CoreLink
    /// MMU-500 (zynqmp.dtsi `compatible = "arm,mmu-500"`; UG1085 "System Memory Management
    /// Unit") **\[C\]**.
    pub implementation: Implementation,
}

impl SmmuInfo {
    /// Offset of context bank `n` in the window: (global pages + n) * page size
    /// (0xFD81_0000 + n * 0x1000 on ZynqMP, UG1087) **\[C\]**.
    pub const fn context_bank_offset(&self, n: u16) -> u64 {
        (self.global_pages + n as u64) * self.page_size
    }
}

/// The ZynqMP MMU-500.
pub const SMMU: SmmuInfo = SmmuInfo {
    regs: Region {
        base: 0xfd80_0000,
        size: 0x2_0000,
    },
    page_size: 0x1000,
    global_pages: 16,
    context_banks: 16,
    stream_match_groups: 48,
    stream_id_bits: 15,
    interrupt: Spi(155),
    wrapper: Region {
        base: 0xfd5f_0000,
        size: 0x1000,
    },
    implementation: Implementation::Mmu500,
};

/// One zDMA channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZdmaInfo {
    /// Register window (4 KiB, zynqmp.dtsi) **\[C\]**.
    pub regs: Region,
    /// Stream ID of the channel's AXI master (zynqmp.dtsi `iommus`) **\[C\]**.
    pub stream: StreamId,
    /// Interrupt (zynqmp.dtsi) **\[C\]**.
    pub interrupt: Spi,
    /// Data bus width in bits (zynqmp.dtsi `xlnx,bus-width`: GDMA 128, ADMA 64) **\[C\]**.
    pub bus_width: u16,
}

const fn gdma(n: u16) -> ZdmaInfo {
    ZdmaInfo {
        regs: Region {
            base: 0xfd50_0000 + n as u64 * 0x1_0000,
            size: 0x1000,
        },
        stream: StreamId(0x14e8 + n as u32),
        interrupt: Spi(124 + n),
        bus_width: 128,
    }
}

const fn adma(n: u16) -> ZdmaInfo {
    ZdmaInfo {
        regs: Region {
            base: 0xffa8_0000 + n as u64 * 0x1_0000,
            size: 0x1000,
        },
        stream: StreamId(0x868 + n as u32),
        interrupt: Spi(77 + n),
        bus_width: 64,
    }
}

/// The FPD DMA (GDMA) channels 0-7, behind TBU5.
pub const GDMA: [ZdmaInfo; 8] = [
    gdma(0),
    gdma(1),
    gdma(2),
    gdma(3),
    gdma(4),
    gdma(5),
    gdma(6),
    gdma(7),
];

/// The LPD DMA (ADMA) channels 0-7, behind TBU2. zynqmp.dtsi notes they allow only secure
/// accesses by default.
pub const ADMA: [ZdmaInfo; 8] = [
    adma(0),
    adma(1),
    adma(2),
    adma(3),
    adma(4),
    adma(5),
    adma(6),
    adma(7),
];

/// The PCIe controller's one stream ID for every requester (zynqmp.dtsi) **\[C\]**. PCIe must
/// never stall (docs/mmu500.md §8): attach it with `StreamFaultConfig::NEVER_STALL`.
pub const PCIE_STREAM: StreamId = StreamId(0x4d0);

/// A PL-to-PS AXI port that goes through the SMMU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlPort {
    /// S_AXI_HPC0_FPD.
    Hpc0,
    /// S_AXI_HPC1_FPD.
    Hpc1,
    /// S_AXI_HP0_FPD.
    Hp0,
    /// S_AXI_HP1_FPD.
    Hp1,
    /// S_AXI_HP2_FPD.
    Hp2,
    /// S_AXI_HP3_FPD.
    Hp3,
}

impl PlPort {
    /// All six ports.
    pub const ALL: [PlPort; 6] = [
        PlPort::Hpc0,
        PlPort::Hpc1,
        PlPort::Hp0,
        PlPort::Hp1,
        PlPort::Hp2,
        PlPort::Hp3,
    ];

    /// The TBU the port's traffic goes through ("Xen and PL Masters": HPC0/1 -> TBU0, HP0 ->
    /// TBU3, HP1/HP2 -> TBU4, HP3 -> TBU5) **\[C\]**.
    pub const fn tbu(self) -> u16 {
        match self {
            PlPort::Hpc0 | PlPort::Hpc1 => 0,
            PlPort::Hp0 => 3,
            PlPort::Hp1 | PlPort::Hp2 => 4,
            PlPort::Hp3 => 5,
        }
    }

    /// The port's master ID, stream ID bits 9:6 (UG1085 table 16-13: HPC0 1000b ... HP3
    /// 1101b) **\[C\]**.
    pub const fn master_id(self) -> u16 {
        match self {
            PlPort::Hpc0 => 0b1000,
            PlPort::Hpc1 => 0b1001,
            PlPort::Hp0 => 0b1010,
            PlPort::Hp1 => 0b1011,
            PlPort::Hp2 => 0b1100,
            PlPort::Hp3 => 0b1101,
        }
    }

    /// The first stream ID of the port: TBU << 10 | master ID << 6 (AR 69447). HPC0 0x200 and
    /// HPC1 0x240 are **\[C\]** (a public ZynqMP SMMU README); HP0 0xE80, HP1 0x12C0, HP2
    /// 0x1300 and HP3 0x1740 are **\[I\]**, computed from the layout and the TBU map.
    pub const fn stream_base(self) -> u16 {
        self.tbu() << 10 | self.master_id() << 6
    }

    /// Whether [`stream_base`](Self::stream_base) is confirmed by a source (**\[C\]**) rather
    /// than computed (**\[I\]**).
    pub const fn stream_base_confirmed(self) -> bool {
        matches!(self, PlPort::Hpc0 | PlPort::Hpc1)
    }

    /// The stream ID of a PL master on this port with AXI ID `axi_id` (bits 5:0). Note that
    /// AXI SmartConnect does not pass AXI IDs through (Xilinx AR 69447).
    pub fn stream_id(self, axi_id: u8) -> Result<StreamId> {
        if axi_id >= 64 {
            return Err(BoardError::AxiIdOutOfRange { axi_id });
        }
        Ok(StreamId(u32::from(self.stream_base() | u16::from(axi_id))))
    }

    /// An SMR mask that matches every AXI ID of the port (the low 6 bits).
    pub const AXI_ID_MASK: u16 = 0x3f;
}

/// UART0, Cadence UART (zynqmp.dtsi `serial@ff000000`, `cdns,uart-r1p12`) **\[C\]**.
pub const UART0: Region = Region {
    base: 0xff00_0000,
    size: 0x1000,
};
/// UART0's interrupt (SPI 21) **\[C\]**.
pub const UART0_IRQ: Spi = Spi(21);
/// UART1 (zynqmp.dtsi `serial@ff010000`) **\[C\]**.
pub const UART1: Region = Region {
    base: 0xff01_0000,
    size: 0x1000,
};
/// UART1's interrupt (SPI 22) **\[C\]**.
pub const UART1_IRQ: Spi = Spi(22);

/// GIC-400 distributor (zynqmp.dtsi `interrupt-controller@f9010000`) **\[C\]**.
pub const GICD: Region = Region {
    base: 0xf901_0000,
    size: 0x1_0000,
};
/// GIC-400 CPU interface (zynqmp.dtsi second `reg` entry) **\[C\]**.
pub const GICC: Region = Region {
    base: 0xf902_0000,
    size: 0x2_0000,
};

/// The low DDR window of the PS: 2 GiB at 0 **\[C\]** (UG1085's system address map as
/// [`ADDRESS_MAP`] transcribes it; ZCU102's device tree uses it whole).
pub const DDR_LOW: Region = Region {
    base: 0,
    size: 0x8000_0000,
};
/// The high DDR window starts at 32 GiB (0x8_0000_0000) and is 32 GiB long **\[C\]**
/// ([`ADDRESS_MAP`]).
pub const DDR_HIGH_BASE: u64 = 0x8_0000_0000;

/// A hole in the PS address map that nothing decodes: 128 MiB at 0xF000_0000, reserved in
/// UG1085's system address map **\[C\]** ([`ADDRESS_MAP`]); U-Boot's `zynqmp_mem_map`
/// (`arch/arm/mach-zynqmp/cpu.c`) leaves it out of its Device ranges too. QEMU's
/// `xlnx-zcu102` maps nothing there either (`hw/arm/xlnx-zynqmp.c`). A DMA master sent there
/// should get a decode error response on silicon **\[I\]**.
pub const RESERVED_HOLE: Region = Region {
    base: 0xf000_0000,
    size: 0x0800_0000,
};

/// The full-power domain's peripheral window (GDMA, SMMU, SATA, DisplayPort, ...): 16 MiB
/// at 0xFD00_0000 **\[C\]** ([`ADDRESS_MAP`]).
pub const FPD_SLAVES: Region = Region {
    base: 0xfd00_0000,
    size: 0x0100_0000,
};

/// The low-power domain's peripheral window (UARTs, ADMA, ...): 28 MiB at 0xFE00_0000
/// **\[C\]** ([`ADDRESS_MAP`]).
pub const LPD_SLAVES: Region = Region {
    base: 0xfe00_0000,
    size: 0x01c0_0000,
};

/// What lies in a window of the address map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressWindow {
    /// DDR (low or high window).
    Ddr,
    /// The PL's AXI master ports, QSPI and PCIe.
    PlQspiPcie,
    /// CoreSight STM.
    CoreSight,
    /// The APU GIC and the RPU's low-latency port.
    Gic,
    /// [`FPD_SLAVES`].
    FpdSlaves,
    /// [`LPD_SLAVES`].
    LpdSlaves,
    /// CSU and PMU.
    CsuPmu,
    /// TCM and OCM.
    TcmOcm,
    /// Nothing decodes it.
    Reserved,
}

/// The ZynqMP's 40-bit system address map, window by window in address order: UG1085's
/// system address map (chapter "System Addresses") as Xilinx's own standalone BSP for the
/// A53 transcribes it in its translation table (embeddedsw
/// `lib/bsp/standalone/src/arm/ARMv8/64bit/platform/ZynqMP/translation_table.S`, the table
/// in its header and the block entries) **\[C\]**. A test checks the constants of this
/// module against it.
pub const ADDRESS_MAP: [(u64, u64, AddressWindow); 15] = [
    (0x0, 0x8000_0000, AddressWindow::Ddr),
    (0x8000_0000, 0xf000_0000, AddressWindow::PlQspiPcie),
    (0xf000_0000, 0xf800_0000, AddressWindow::Reserved),
    (0xf800_0000, 0xf900_0000, AddressWindow::CoreSight),
    (0xf900_0000, 0xf920_0000, AddressWindow::Gic),
    (0xf920_0000, 0xfd00_0000, AddressWindow::Reserved),
    (0xfd00_0000, 0xfe00_0000, AddressWindow::FpdSlaves),
    (0xfe00_0000, 0xffc0_0000, AddressWindow::LpdSlaves),
    (0xffc0_0000, 0xffe0_0000, AddressWindow::CsuPmu),
    (0xffe0_0000, 0x1_0000_0000, AddressWindow::TcmOcm),
    (0x1_0000_0000, 0x4_0000_0000, AddressWindow::Reserved),
    (0x4_0000_0000, 0x8_0000_0000, AddressWindow::PlQspiPcie),
    (0x8_0000_0000, 0x10_0000_0000, AddressWindow::Ddr),
    (0x10_0000_0000, 0xc0_0000_0000, AddressWindow::PlQspiPcie),
    (0xc0_0000_0000, 0x100_0000_0000, AddressWindow::Reserved),
];

/// The window of [`ADDRESS_MAP`] that holds all of `region`, if one does.
pub fn window_of(region: Region) -> Option<AddressWindow> {
    ADDRESS_MAP
        .iter()
        .find(|&&(start, end, _)| region.base >= start && region.end() <= end)
        .map(|&(_, _, w)| w)
}

/// A board built around one ZynqMP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Board {
    /// Name for logs.
    pub name: &'static str,
    /// DRAM the PS sees: the low window and the part of the high window populated.
    pub ddr: [Region; 2],
    /// The console UART.
    pub console: Region,
    /// MPSoCs on the board.
    pub mpsocs: u8,
}

/// ZCU102: 4 GiB of PS DDR4, 2 GiB low + 2 GiB high **\[I\]** (the board's device tree),
/// console on UART0 **\[C\]**.
pub const ZCU102: Board = Board {
    name: "zcu102",
    ddr: [
        DDR_LOW,
        Region {
            base: DDR_HIGH_BASE,
            size: 0x8000_0000,
        },
    ],
    console: UART0,
    mpsocs: 1,
};

/// One MPSoC of the ExaNeSt QFDB: 16 GiB of DDR4 **\[C\]** (Chaix et al. 2019), assumed split
/// 2 GiB low + 14 GiB high **\[I\]**; console UART0 **\[I\]**.
pub const QFDB_NODE: Board = Board {
    name: "qfdb-node",
    ddr: [
        DDR_LOW,
        Region {
            base: DDR_HIGH_BASE,
            size: 14 << 30,
        },
    ],
    console: UART0,
    mpsocs: 1,
};

/// MPSoCs on one QFDB **\[C\]**.
pub const QFDB_MPSOCS: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pl_stream_ids_follow_the_tbu_and_master_id_layout() {
        // [C]: HPC0 0x200..0x23F, HPC1 0x240..0x27F (a public ZynqMP SMMU README, see `stream_base`).
        assert_eq!(PlPort::Hpc0.stream_id(0).unwrap(), StreamId(0x200));
        assert_eq!(PlPort::Hpc0.stream_id(63).unwrap(), StreamId(0x23f));
        assert_eq!(PlPort::Hpc1.stream_id(0).unwrap(), StreamId(0x240));
        // [I] values: TBU << 10 | master ID << 6.
        let bases: Vec<u16> = PlPort::ALL.iter().map(|p| p.stream_base()).collect();
        assert_eq!(bases, [0x200, 0x240, 0xe80, 0x12c0, 0x1300, 0x1740]);
        assert!(PlPort::ALL.iter().all(|p| p.stream_base() < 1 << 15));
        assert_eq!(
            PlPort::Hp3.stream_id(64),
            Err(BoardError::AxiIdOutOfRange { axi_id: 64 })
        );
    }

    #[test]
    fn dma_channels_and_smmu_match_the_device_tree() {
        assert_eq!(GDMA[0].regs.base, 0xfd50_0000);
        assert_eq!(GDMA[7].regs.base, 0xfd57_0000);
        assert_eq!(GDMA[0].stream, StreamId(0x14e8));
        assert_eq!(GDMA[7].stream, StreamId(0x14ef));
        assert_eq!((GDMA[0].interrupt.intid(), GDMA[7].interrupt.0), (156, 131));
        assert_eq!(ADMA[7].regs.base, 0xffaf_0000);
        assert_eq!(
            (ADMA[0].stream, ADMA[0].interrupt.intid()),
            (StreamId(0x868), 109)
        );
        assert_eq!(SMMU.interrupt.intid(), 187);
        assert_eq!(SMMU.context_bank_offset(0), 0x1_0000);
        assert_eq!(
            SMMU.regs.base + SMMU.context_bank_offset(15),
            0xfd81_f000,
            "UG1087 CB15 page"
        );
        assert_eq!(
            SMMU.regs.size,
            2 * SMMU.global_pages * SMMU.page_size,
            "window = global space + as many CB pages"
        );
        // GDMA stream IDs sit in TBU5 like HP3 (zynqmp.dtsi SIDs; "Xen and PL Masters").
        assert_eq!(GDMA[0].stream.0 >> 10, 5);
        assert!(ZCU102.ddr[1].contains(DDR_HIGH_BASE) && !DDR_LOW.contains(DDR_LOW.end()));
    }

    #[test]
    fn the_constants_sit_in_their_windows_of_the_ug1085_address_map() {
        // The transcription: contiguous from 0 to the end of the 40-bit space.
        assert_eq!(ADDRESS_MAP[0].0, 0);
        for pair in ADDRESS_MAP.windows(2) {
            assert_eq!(pair[0].1, pair[1].0, "{pair:x?}");
        }
        assert_eq!(ADDRESS_MAP[ADDRESS_MAP.len() - 1].1, 1 << 40);
        assert!(ADDRESS_MAP.iter().all(|w| w.0 < w.1));

        // DDR: the low window exactly, the high one from DDR_HIGH_BASE, 32 GiB.
        let window = |start: u64| ADDRESS_MAP.iter().find(|w| w.0 == start).unwrap();
        assert_eq!(
            *window(DDR_LOW.base),
            (DDR_LOW.base, DDR_LOW.end(), AddressWindow::Ddr)
        );
        assert_eq!(
            *window(DDR_HIGH_BASE),
            (
                DDR_HIGH_BASE,
                DDR_HIGH_BASE + (32 << 30),
                AddressWindow::Ddr
            )
        );
        for board in [ZCU102, QFDB_NODE] {
            for ddr in board.ddr {
                assert_eq!(window_of(ddr), Some(AddressWindow::Ddr), "{}", board.name);
            }
        }

        // The peripheral windows and the reserved hole, exactly.
        assert_eq!(
            *window(FPD_SLAVES.base),
            (FPD_SLAVES.base, FPD_SLAVES.end(), AddressWindow::FpdSlaves)
        );
        assert_eq!(
            *window(LPD_SLAVES.base),
            (LPD_SLAVES.base, LPD_SLAVES.end(), AddressWindow::LpdSlaves)
        );
        assert_eq!(
            *window(RESERVED_HOLE.base),
            (
                RESERVED_HOLE.base,
                RESERVED_HOLE.end(),
                AddressWindow::Reserved
            )
        );

        // Every device of this module in its domain's window: the SMMU, its wrapper and the
        // GDMA in the FPD, the ADMA and the UARTs in the LPD, the GIC in its own.
        assert_eq!(window_of(SMMU.regs), Some(AddressWindow::FpdSlaves));
        assert_eq!(window_of(SMMU.wrapper), Some(AddressWindow::FpdSlaves));
        for ch in GDMA {
            assert_eq!(
                window_of(ch.regs),
                Some(AddressWindow::FpdSlaves),
                "{ch:x?}"
            );
        }
        for ch in ADMA {
            assert_eq!(
                window_of(ch.regs),
                Some(AddressWindow::LpdSlaves),
                "{ch:x?}"
            );
        }
        for uart in [UART0, UART1] {
            assert_eq!(window_of(uart), Some(AddressWindow::LpdSlaves));
        }
        for gic in [GICD, GICC] {
            assert_eq!(window_of(gic), Some(AddressWindow::Gic));
        }
        // A region across two windows belongs to none.
        let across = Region {
            base: 0xfdff_f000,
            size: 0x2000,
        };
        assert_eq!(window_of(across), None);
    }
}
