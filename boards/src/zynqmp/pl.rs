//! The programmable logic (PL) side of a ZynqMP board as our FPGA design uses it: the part,
//! the PS-PL ports, and where each NPE engine sits (register window, interrupt, SMMU
//! stream). The Vivado Tcl, the device-tree overlay and the image builder of the
//! `fpga-bitstreams` crate are all generated from [`ZCU102_PL`], so addresses, interrupts and
//! stream IDs cannot drift apart.
//!
//! **\[C\]** = stated by the named source, **\[I\]** = inferred by us, **ours** = our choice.

use smmu_driver::fault::StreamId;

use super::{PlPort, Region, Spi};
use crate::{BoardError, Result};

/// An FPGA part as Vivado names it (`<device>-<package>-<speed>-<temperature>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    /// Device, e.g. `xczu9eg`.
    pub device: &'static str,
    /// Package, e.g. `ffvb1156`.
    pub package: &'static str,
    /// Speed grade and temperature range as Vivado appends them, e.g. `2-e`.
    pub grade: &'static str,
    /// The device's JTAG IDCODE with its version (revision) field, bits \[31:28\], zero.
    /// UG570, "Device ID Check (Step 5)": version, 16-bit device code, company code, 1; the
    /// configuration data of a bitstream writes it to the configuration IDCODE register
    /// before any frame data, and the device refuses a bitstream built for another device
    /// (UG570, "IDCODE Register (01100)") **\[C\]**. Xilinx's IDCODE tables give the version
    /// as "X", a field that varies between silicon revisions of one device, so a comparison
    /// ignores it **\[I\]**.
    pub idcode: u32,
}

/// The ZCU102's device: XCZU9EG-2FFVB1156E (UG1182, ZCU102 Evaluation Board User Guide,
/// "Feature Descriptions") **\[C\]**, which Vivado spells `xczu9eg-ffvb1156-2-e`.
///
/// Its IDCODE, 0xX4738093 (X the revision field), is listed in UG1085 (Zynq UltraScale+
/// Device TRM), chapter 1, "Device ID Codes"; that table was not at hand when this was
/// written, and the value was cross-checked against Xilinx's own simulation model of the
/// device's JTAG port (unisims `JTAG_SIME2`, `PART_NAME = "XCZU9EG"`: 0x04738093) **\[C\]**.
pub const XCZU9EG_ZCU102: Part = Part {
    device: "xczu9eg",
    package: "ffvb1156",
    grade: "2-e",
    idcode: 0x0473_8093,
};

/// A PS master port into the PL (the CPU reaches PL registers through it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PsMaster {
    /// M_AXI_HPM0_FPD.
    Hpm0Fpd,
    /// M_AXI_HPM1_FPD.
    Hpm1Fpd,
}

impl PsMaster {
    /// The address window the port decodes in the low 4 GiB: HPM0_FPD 256 MiB at
    /// 0xA000_0000, HPM1_FPD 256 MiB at 0xB000_0000 (UG1085, table 10-1 "System Address
    /// Map") **\[C\]**; both inside [`super::AddressWindow::PlQspiPcie`].
    pub const fn window(self) -> Region {
        match self {
            PsMaster::Hpm0Fpd => Region {
                base: 0xa000_0000,
                size: 0x1000_0000,
            },
            PsMaster::Hpm1Fpd => Region {
                base: 0xb000_0000,
                size: 0x1000_0000,
            },
        }
    }

    /// The PS8 interface's name in Vivado's `zynq_ultra_ps_e` IP.
    pub const fn vivado_port(self) -> &'static str {
        match self {
            PsMaster::Hpm0Fpd => "M_AXI_HPM0_FPD",
            PsMaster::Hpm1Fpd => "M_AXI_HPM1_FPD",
        }
    }
}

impl PlPort {
    /// The PS8 interface's name in Vivado's `zynq_ultra_ps_e` IP.
    pub const fn vivado_port(self) -> &'static str {
        match self {
            PlPort::Hpc0 => "S_AXI_HPC0_FPD",
            PlPort::Hpc1 => "S_AXI_HPC1_FPD",
            PlPort::Hp0 => "S_AXI_HP0_FPD",
            PlPort::Hp1 => "S_AXI_HP1_FPD",
            PlPort::Hp2 => "S_AXI_HP2_FPD",
            PlPort::Hp3 => "S_AXI_HP3_FPD",
        }
    }

    /// The port's index among the PS8's `S_AXI_GPn` slave ports, which number the
    /// `PSU__USE__S_AXI_GPn` and `PSU__SAXIGPn__DATA_WIDTH` settings of Vivado's
    /// `zynq_ultra_ps_e` IP: HPC0 and HPC1 are GP0 and GP1, HP0-HP3 are GP2-GP5 **\[I\]**
    /// (Vivado's PS8 configuration names; not in UG1085).
    pub const fn vivado_gp_index(self) -> u8 {
        match self {
            PlPort::Hpc0 => 0,
            PlPort::Hpc1 => 1,
            PlPort::Hp0 => 2,
            PlPort::Hp1 => 3,
            PlPort::Hp2 => 4,
            PlPort::Hp3 => 5,
        }
    }
}

/// A PL-to-PS interrupt line: `pl_ps_irq0[n]` for n in 0..8, `pl_ps_irq1[n - 8]` for n in
/// 8..16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlIrq(pub u8);

impl PlIrq {
    /// The GIC SPI: PL_PS_IRQ0[7:0] are GIC IRQ IDs 121-128 and PL_PS_IRQ1[7:0] IDs 136-143
    /// (UG1085, table 13-1 "System Interrupts") **\[C\]**, i.e. SPIs 89-96 and 104-111.
    pub fn spi(self) -> Result<Spi> {
        match self.0 {
            n @ 0..8 => Ok(Spi(89 + u16::from(n))),
            n @ 8..16 => Ok(Spi(104 + u16::from(n - 8))),
            n => Err(BoardError::PlIrqOutOfRange { line: n }),
        }
    }
}

/// One NPE engine in the PL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NpeInstance {
    /// Instance name in the block design and the device tree (`npe_0`, ...).
    pub name: &'static str,
    /// Register window: `dma_engine::npe::regs::WINDOW_SIZE` bytes in the PS master's
    /// window (ours).
    pub regs: Region,
    /// The PS master port the registers are reached through.
    pub master: PsMaster,
    /// The PL-to-PS port of the engine's data master `m_axi_d` (user memory; ours). It has
    /// the port to itself with no interconnect in between: the AXI ID carries the protection
    /// domain (docs/dma-engine.md §3), the TBU puts it in the stream ID, and AXI SmartConnect
    /// does not pass AXI IDs through (Xilinx AR 69447).
    pub data_port: PlPort,
    /// The PL-to-PS port of the engine's queue master `m_axi_q` (rings in pinned kernel
    /// memory; AXI ID always 0, so one stream, [`queue_stream`](Self::queue_stream); ours).
    /// A port of its own too: merged with the data master, it would need an interconnect,
    /// which would lose the data master's AXI IDs.
    pub queue_port: PlPort,
    /// Its interrupt line (level, active high: docs/dma-engine.md §8).
    pub irq: PlIrq,
}

impl NpeInstance {
    /// The stream ID of AXI ID 0 on the engine's data port (a source read of PDID 0).
    pub const fn stream_base(&self) -> StreamId {
        StreamId(self.data_port.stream_base() as u32)
    }

    /// The one stream of the queue master (AXI ID 0 on its port): the stream Linux's DMA API
    /// maps the rings for, and the one the overlay's `iommus` names.
    pub const fn queue_stream(&self) -> StreamId {
        StreamId(self.queue_port.stream_base() as u32)
    }

    /// The stream a source read (`write = false`) or a destination write of protection
    /// domain `pdid` carries: AXI ID = PDID bits 4:0, bit 5 set for writes (docs/dma-engine.md
    /// §3.2).
    pub fn stream_of(&self, pdid: u16, write: bool) -> StreamId {
        let axi_id = (pdid & 0x1f) as u8 | u8::from(write) << 5;
        // AXI IDs built this way are below 64, which `stream_id` accepts.
        StreamId(u32::from(self.data_port.stream_base()) | u32::from(axi_id))
    }
}

/// A board's PL design: two NPE engines connected link to link inside the PL, the way the
/// co-simulation connects two RTL engines (ours: a ZCU102 has one MPSoC, and this puts both
/// ends of the link, and the whole protocol, on one board).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlDesign {
    /// Board name (as `Board::name`).
    pub board: &'static str,
    /// The part the bitstream must be built for.
    pub part: Part,
    /// Pattern for Vivado's board part (`get_board_parts`); the file version differs
    /// between Vivado releases, so the script takes the latest installed.
    pub vivado_board_part: &'static str,
    /// The PL clock `pl_clk0` every engine runs on, in Hz (docs/dma-engine.md §10: 128 bit at
    /// 250 MHz; ours).
    pub pl_clk0_hz: u32,
    /// The engines.
    pub npes: [NpeInstance; 2],
    /// The bitstream's file name in the target's firmware search path (`/lib/firmware`),
    /// which the overlay's `firmware-name` names.
    pub firmware_name: &'static str,
}

/// The ZCU102's design: engines at 0xA000_0000 and 0xA001_0000 behind M_AXI_HPM0_FPD; data
/// masters on S_AXI_HP0_FPD (stream base 0xE80, as `sim`'s NPE model) and S_AXI_HP1_FPD
/// (0x12C0), queue masters on S_AXI_HPC0_FPD (stream 0x200) and S_AXI_HPC1_FPD (0x240): four
/// ports, four distinct master IDs of UG1085 table 16-13, so no two masters' streams overlap;
/// interrupts `pl_ps_irq0[0]` and `[1]` (SPIs 89 and 90).
pub const ZCU102_PL: PlDesign = PlDesign {
    board: "zcu102",
    part: XCZU9EG_ZCU102,
    vivado_board_part: "*zcu102*",
    pl_clk0_hz: 250_000_000,
    npes: [
        NpeInstance {
            name: "npe_0",
            regs: Region {
                base: 0xa000_0000,
                size: 0x1_0000,
            },
            master: PsMaster::Hpm0Fpd,
            data_port: PlPort::Hp0,
            queue_port: PlPort::Hpc0,
            irq: PlIrq(0),
        },
        NpeInstance {
            name: "npe_1",
            regs: Region {
                base: 0xa001_0000,
                size: 0x1_0000,
            },
            master: PsMaster::Hpm0Fpd,
            data_port: PlPort::Hp1,
            queue_port: PlPort::Hpc1,
            irq: PlIrq(1),
        },
    ],
    firmware_name: "nprdma-zcu102.bit.bin",
};

impl Part {
    /// Writes Vivado's spelling `<device>-<package>-<grade>` into `out`; returns its length,
    /// or `None` if `out` is too short.
    pub fn write_name(&self, out: &mut [u8]) -> Option<usize> {
        let parts = [self.device, "-", self.package, "-", self.grade];
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let out = out.get_mut(..len)?;
        let mut at = 0;
        for p in parts {
            out[at..at + p.len()].copy_from_slice(p.as_bytes());
            at += p.len();
        }
        Some(len)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{AddressWindow, window_of};
    use super::*;

    #[test]
    fn engines_sit_in_the_hpm0_window_apart_and_aligned() {
        let d = ZCU102_PL;
        for n in d.npes {
            let w = n.master.window();
            assert!(w.contains(n.regs.base) && n.regs.end() <= w.end(), "{n:?}");
            assert_eq!(window_of(n.regs), Some(AddressWindow::PlQspiPcie));
            assert_eq!(n.regs.base % n.regs.size, 0, "naturally aligned");
        }
        let [a, b] = d.npes;
        assert!(a.regs.end() <= b.regs.base);
        let ports = [a.data_port, a.queue_port, b.data_port, b.queue_port];
        for (i, p) in ports.iter().enumerate() {
            assert!(
                !ports[i + 1..].contains(p),
                "every master has a port of its own"
            );
        }
        assert_ne!(a.irq, b.irq);
        assert_eq!(a.irq.spi().unwrap().intid(), 121, "UG1085 table 13-1");
        assert_eq!(b.irq.spi().unwrap(), Spi(90));
    }

    #[test]
    fn pl_irqs_map_to_both_groups_and_reject_the_rest() {
        assert_eq!(PlIrq(7).spi().unwrap().intid(), 128);
        assert_eq!(PlIrq(8).spi().unwrap().intid(), 136);
        assert_eq!(PlIrq(15).spi().unwrap().intid(), 143);
        assert_eq!(
            PlIrq(16).spi(),
            Err(BoardError::PlIrqOutOfRange { line: 16 })
        );
    }

    #[test]
    fn streams_follow_the_port_and_the_pdid() {
        let [a, b] = ZCU102_PL.npes;
        assert_eq!(a.stream_base(), StreamId(0xe80));
        assert_eq!(b.stream_base(), StreamId(0x12c0));
        assert_eq!(a.stream_of(3, false), StreamId(0xe83));
        assert_eq!(
            a.stream_of(0x23, true),
            StreamId(0xea3),
            "PDID bits 4:0 only"
        );
        for pdid in [0, 1, 31, 0xffff] {
            for w in [false, true] {
                let s = b.stream_of(pdid, w);
                let axi = (s.0 & 0x3f) as u8;
                assert_eq!(b.data_port.stream_id(axi).unwrap(), s);
            }
        }
        // The queue masters: AXI ID 0 on HPC0 and HPC1 (TBU 0, master IDs 1000b and 1001b).
        assert_eq!(
            (a.queue_stream(), b.queue_stream()),
            (StreamId(0x200), StreamId(0x240))
        );
        // No stream of one master is a stream of another (the SMMU tells them apart).
        let ranges: Vec<(u32, u32)> = ZCU102_PL
            .npes
            .iter()
            .flat_map(|n| [n.stream_base().0, n.queue_stream().0])
            .map(|base| (base, base | 0x3f))
            .collect();
        for (i, (lo, hi)) in ranges.iter().enumerate() {
            for (lo2, hi2) in &ranges[i + 1..] {
                assert!(hi < lo2 || hi2 < lo, "{ranges:x?}");
            }
        }
    }

    #[test]
    fn the_part_name_is_vivados_spelling() {
        let mut buf = [0u8; 32];
        let n = XCZU9EG_ZCU102.write_name(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"xczu9eg-ffvb1156-2-e");
        assert_eq!(XCZU9EG_ZCU102.write_name(&mut [0u8; 8]), None);
    }

    #[test]
    fn the_idcode_is_an_ieee_1149_1_xilinx_one_without_revision() {
        let id = XCZU9EG_ZCU102.idcode;
        assert_eq!(id >> 28, 0, "revision field left zero");
        assert_eq!(id & 1, 1, "IEEE 1149.1: bit 0 reads 1");
        // Xilinx's manufacturer code 00001001001b (Xilinx AR 8265).
        assert_eq!((id >> 1) & 0x7ff, 0x049);
    }
}
