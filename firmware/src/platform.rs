//! What the runtime needs to know about a board, as data a program selects.
//!
//! A program names its [`Platform`] in [`crate::program!`]; the runtime reads the console,
//! power-off method, fallback RAM, device-tree location and non-cacheable DMA pool from it.
//! The linker script (which fixes the link address) is chosen per program in `build.rs`.
//! Adding a board means adding a constant here, a linker script, and (for a new UART) a
//! [`ConsoleKind`] variant with its driver.
//!
//! Boards: [`virt`] (QEMU, runs in CI) and [`zynqmp`] (Zynq UltraScale+ at EL3; in CI on
//! QEMU `xlnx-zcu102`).

/// A range of physical addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemRegion {
    /// First byte.
    pub base: u64,
    /// Length in bytes.
    pub size: u64,
}

impl MemRegion {
    /// A region of `size` bytes at `base`.
    pub const fn new(base: u64, size: u64) -> Self {
        Self { base, size }
    }

    /// One past the last byte, or `None` if that overflows.
    pub const fn end(&self) -> Option<u64> {
        self.base.checked_add(self.size)
    }

    /// Whether `[addr, addr + len)` lies inside the region (false on overflow).
    pub fn contains_range(&self, addr: u64, len: u64) -> bool {
        match (addr.checked_add(len), self.end()) {
            (Some(last), Some(end)) => addr >= self.base && last <= end,
            _ => false,
        }
    }
}

/// The console UART of a platform.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConsoleKind {
    /// An Arm PrimeCell PL011 ([`crate::pl011`]) with its register window at `base`.
    Pl011 {
        /// Physical base address of the register window.
        base: u64,
    },
    /// A Cadence UART ([`crate::cadence_uart`], the ZynqMP's UART0/1) with its register
    /// window at `base`.
    Cadence {
        /// Physical base address of the register window.
        base: u64,
    },
}

/// How a PSCI call reaches the firmware that implements it (Arm DEN0028, SMC Calling
/// Convention: the same function IDs over `hvc #0` or `smc #0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conduit {
    /// `hvc #0` (QEMU `virt` without EL2 emulation; device tree `method = "hvc"`).
    Hvc,
    /// `smc #0`.
    Smc,
}

/// How a program ends after printing its verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerOff {
    /// PSCI SYSTEM_OFF. The conduit comes from the device tree's `/psci` node `method` when
    /// there is one, otherwise from here.
    Psci {
        /// Conduit used when the device tree does not name one.
        default_conduit: Conduit,
    },
    /// No power-off service (e.g. ZynqMP bare metal at EL3): drain the console and wait for
    /// interrupts forever; the harness reads the verdict line from the UART.
    WaitForInterrupt,
}

/// What the runtime does when a loader enters it at EL3 (Secure state).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecureHandoff {
    /// Nothing: the program runs at the EL it was entered at (QEMU `virt`, entered at EL1).
    Stay,
    /// The ZynqMP's Secure set-up (GIC groups, `SMMU_REG`, the GDMA's TrustZone
    /// classification, the MMU-500's sCR1 partition, CNTFRQ_EL0), then an exception return
    /// to Non-secure EL2, or EL1 where EL2 is not implemented ([`crate::secure`]). Entered
    /// below EL3 (by ATF, say), the program runs where it was entered.
    ZynqMpNonSecure,
}

/// A board the runtime can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Platform {
    /// Short name, printed at boot.
    pub name: &'static str,
    /// The console UART.
    pub console: ConsoleKind,
    /// How to end the run.
    pub power_off: PowerOff,
    /// RAM that is always present. Used as the normal-memory map when the device tree has no
    /// memory node, and as the range where a device-tree pointer is believed.
    pub boot_ram: MemRegion,
    /// Where a loader leaves the device tree when `x0` does not point at one (QEMU copies it
    /// to the start of RAM for non-Linux ELF images).
    pub dtb_fallback: Option<u64>,
    /// Whether the runtime looks for a device tree at all. Without one, RAM is `boot_ram` and
    /// programs use the platform's fixed addresses; `x0` is ignored (a bare-metal loader may
    /// leave anything there, and a stale tree in DDR must not redefine RAM).
    pub uses_device_tree: bool,
    /// RAM the runtime maps Normal non-cacheable instead of write-back (2 MiB aligned, inside
    /// `boot_ram`): a DMA pool shared with masters that do not snoop the CPU caches, so that
    /// CPU writes reach memory with a barrier and no cache maintenance (what
    /// `hal::dma::PoolDma` requires). Its cache lines are invalidated before the MMU is on.
    pub non_cacheable: Option<MemRegion>,
    /// What to do when entered at EL3.
    pub secure_handoff: SecureHandoff,
}

/// QEMU `virt` (7.2) as started by `cargo xtask qemu`: `-M virt,iommu=smmuv3,gic-version=3
/// -cpu cortex-a57 -m 256M`. Addresses from the memory map in QEMU 7.2's `hw/arm/virt.c`
/// (`base_memmap` and `extended_memmap`).
pub mod virt {
    use super::{Conduit, ConsoleKind, MemRegion, Platform, PowerOff, SecureHandoff};

    /// PL011 UART0.
    pub const UART_BASE: u64 = 0x0900_0000;
    /// Start of RAM.
    pub const RAM_BASE: u64 = 0x4000_0000;
    /// QEMU's smallest and default `-m` (128 MiB): RAM that is there whatever `-m` says.
    pub const MIN_RAM_SIZE: u64 = 128 << 20;
    /// The PCIe ECAM when `highmem-ecam` is on (the default for an AArch64 CPU with less than
    /// 256 GiB of RAM): 256 buses of 1 MiB. Used only when no device tree is found.
    pub const HIGH_ECAM: MemRegion = MemRegion::new(0x40_1000_0000, 0x1000_0000);
    /// The PCIe 32-bit memory window (CPU address = PCI bus address).
    pub const PCIE_MMIO32: MemRegion = MemRegion::new(0x1000_0000, 0x2eff_0000);

    /// The platform description.
    pub const PLATFORM: Platform = Platform {
        name: "qemu-virt",
        console: ConsoleKind::Pl011 { base: UART_BASE },
        power_off: PowerOff::Psci {
            default_conduit: Conduit::Hvc,
        },
        boot_ram: MemRegion::new(RAM_BASE, MIN_RAM_SIZE),
        dtb_fallback: Some(RAM_BASE),
        uses_device_tree: true,
        // QEMU's DMA is coherent with the emulated caches.
        non_cacheable: None,
        // Entered at EL1 (no `secure=on`); nothing of the ZynqMP's applies.
        secure_handoff: SecureHandoff::Stay,
    };
}

/// The Zynq UltraScale+ MPSoC (ZCU102, one MPSoC of the ExaNeSt QFDB) running a bare-metal
/// program the FSBL (or JTAG with `psu_init`, after clocks, DDR and UART0) enters at EL3; the
/// runtime does the Secure set-up and drops to Non-secure EL2 ([`SecureHandoff::ZynqMpNonSecure`],
/// docs/mmu500.md §7a), so the SMMU driver programs the Non-secure view that governs the GDMA.
/// Addresses come from `boards::zynqmp` (Linux `zynqmp.dtsi`, UG1085); the layout of the
/// image and of the DMA pool is in `link/zynqmp.ld`, which must agree with
/// [`zynqmp::IMAGE_BASE`] and [`zynqmp::DMA_POOL`] (a host test reads the script).
///
/// No device tree (a bare-metal FSBL hand-off passes none), no PSCI (no ATF runs at EL3): the
/// run ends by printing the verdict and waiting for interrupts forever.
pub mod zynqmp {
    use super::{ConsoleKind, MemRegion, Platform, PowerOff, SecureHandoff};

    /// UART0, the ZCU102's console (Cadence UART, `boards::zynqmp::UART0`).
    pub const UART_BASE: u64 = boards::zynqmp::UART0.base;
    /// The low DDR window, 2 GiB at 0 (`boards::zynqmp::DDR_LOW`). Assumed populated
    /// (ZCU102 and QFDB have more DDR than that); the high window at 32 GiB is not used.
    pub const DDR_LOW: MemRegion =
        MemRegion::new(boards::zynqmp::DDR_LOW.base, boards::zynqmp::DDR_LOW.size);
    /// Link address of the image. Xilinx's standalone (Vitis) A53 linker script puts
    /// applications anywhere in `psu_ddr_0_MEM_0` (0x0, length 0x7FF0_0000), and the FSBL
    /// loads an ELF partition at its link address; 256 MiB keeps address 0 (a null pointer)
    /// and the usual Linux/U-Boot load addresses free, and the FSBL and ATF live in OCM
    /// (0xFFFC_0000.., embeddedsw `zynqmp_fsbl/src/lscript_a53.ld`).
    pub const IMAGE_BASE: u64 = 0x1000_0000;
    /// The DMA pool (`.dma_pool` in `link/zynqmp.ld`, 16 MiB right after the image's 16 MiB
    /// budget), mapped Normal non-cacheable: the MMU-500 driver programs non-coherent table
    /// walks (docs/mmu500.md §2), and the GDMA reaches DDR through TBU5 and a DDR port it
    /// shares with HP3 (docs/mmu500.md §8), not through the CCI, so it is treated as not
    /// snooping the A53 caches **\[I\]**. Page tables, frames and backing store must then
    /// reach DDR with only a barrier, which non-cacheable memory gives and `PoolDma`
    /// (whose `sync_for_device` is a `dsb st`, no cache clean) relies on.
    pub const DMA_POOL: MemRegion = MemRegion::new(0x1100_0000, 16 << 20);

    /// The platform description.
    pub const PLATFORM: Platform = Platform {
        name: "zynqmp",
        console: ConsoleKind::Cadence { base: UART_BASE },
        power_off: PowerOff::WaitForInterrupt,
        boot_ram: DDR_LOW,
        dtb_fallback: None,
        uses_device_tree: false,
        non_cacheable: Some(DMA_POOL),
        secure_handoff: SecureHandoff::ZynqMpNonSecure,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_containment_is_overflow_safe() {
        let r = MemRegion::new(0x4000_0000, 0x1000);
        assert!(r.contains_range(0x4000_0000, 0x1000));
        assert!(r.contains_range(0x4000_0ff8, 8));
        assert!(!r.contains_range(0x4000_0ff8, 9));
        assert!(!r.contains_range(0x3fff_ffff, 1));
        assert!(!r.contains_range(u64::MAX, 2));
        assert_eq!(MemRegion::new(u64::MAX, 1).end(), None);
        assert!(!MemRegion::new(u64::MAX, 1).contains_range(u64::MAX, 0));
    }

    /// `NAME = 0x...;` from a linker script.
    fn script_symbol(script: &str, name: &str) -> u64 {
        let line = script
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with(name) && l[name.len()..].trim_start().starts_with('='))
            .unwrap_or_else(|| panic!("{name} is not assigned in the script"));
        let value = line
            .split('=')
            .nth(1)
            .and_then(|v| v.trim().strip_suffix(';'))
            .and_then(|v| v.trim().strip_prefix("0x"))
            .unwrap_or_else(|| panic!("`{line}` is not `{name} = 0x...;`"));
        u64::from_str_radix(&value.replace('_', ""), 16).unwrap()
    }

    #[test]
    fn zynqmp_platform_matches_the_memory_map_and_its_linker_script() {
        let p = zynqmp::PLATFORM;
        // Cadence UART0 at 0xFF00_0000 (zynqmp.dtsi serial@ff000000), DDR low 0..2 GiB.
        assert_eq!(p.console, ConsoleKind::Cadence { base: 0xff00_0000 });
        assert_eq!(p.boot_ram, MemRegion::new(0, 0x8000_0000));
        assert_eq!(p.power_off, PowerOff::WaitForInterrupt);
        assert!(!p.uses_device_tree);
        assert_eq!(p.dtb_fallback, None);
        assert_eq!(p.secure_handoff, SecureHandoff::ZynqMpNonSecure);

        // The pool: 2 MiB aligned (the MMU maps it in 2 MiB blocks), in DDR, clear of the
        // image's budget and of the top 1 MiB that Xilinx's linker script leaves out.
        let pool = p.non_cacheable.unwrap();
        assert_eq!(pool, zynqmp::DMA_POOL);
        assert_eq!(pool.base % (2 << 20), 0);
        assert_eq!(pool.size % (2 << 20), 0);
        assert!(p.boot_ram.contains_range(pool.base, pool.size));
        assert!(pool.end().unwrap() <= 0x7ff0_0000);
        assert!(zynqmp::IMAGE_BASE < pool.base);

        // The linker script places the image and the pool at the same addresses.
        let script = include_str!("../link/zynqmp.ld");
        assert_eq!(script_symbol(script, "IMAGE_BASE"), zynqmp::IMAGE_BASE);
        assert_eq!(script_symbol(script, "DMA_POOL_BASE"), pool.base);
        assert_eq!(script_symbol(script, "DMA_POOL_SIZE"), pool.size);

        // Devices the program maps are outside RAM, so the runtime maps them as Device memory.
        let smmu = boards::zynqmp::SMMU.regs;
        let gdma1 = boards::zynqmp::GDMA[1].regs;
        for (base, size) in [
            (smmu.base, smmu.size),
            (gdma1.base, gdma1.size),
            (zynqmp::UART_BASE, 0x1000),
        ] {
            assert!(base >= p.boot_ram.end().unwrap(), "{base:#x}");
            assert!(base.checked_add(size).unwrap() <= 1 << 32);
        }
    }

    #[test]
    fn virt_keeps_its_device_tree_and_cacheable_ram() {
        let p = virt::PLATFORM;
        assert!(p.uses_device_tree);
        assert_eq!(p.non_cacheable, None);
        assert_eq!(p.console, ConsoleKind::Pl011 { base: 0x0900_0000 });
        assert_eq!(p.secure_handoff, SecureHandoff::Stay);
    }
}
