//! What the runtime needs to know about a board, as data a program selects.
//!
//! A program names its [`Platform`] in [`crate::program!`]; the runtime reads the console,
//! power-off method, fallback RAM and device-tree location from it. The linker script (which
//! fixes the link address) is chosen per program in `build.rs`. Adding a board means adding a
//! constant here, a linker script, and (for a new UART) a [`ConsoleKind`] variant with its
//! driver.

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
}

/// QEMU `virt` (7.2) as started by `cargo xtask qemu`: `-M virt,iommu=smmuv3,gic-version=3
/// -cpu cortex-a57 -m 256M`. Addresses from the memory map in QEMU 7.2's `hw/arm/virt.c`
/// (`base_memmap` and `extended_memmap`).
pub mod virt {
    use super::{Conduit, ConsoleKind, MemRegion, Platform, PowerOff};

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
}
