//! QEMU's `edu` educational PCI device, and the probe the `pci-probe` program runs on it.
//!
//! Register map and IDs from QEMU 7.2 `docs/specs/edu.txt` and `hw/misc/edu.c`: vendor
//! 0x1234, device 0x11e8; BAR0 is 1 MiB of 32-bit MMIO; offset 0x00 reads the
//! identification 0x010000ed (major 1, minor 0, constant 0xed), offset 0x04 returns the
//! bitwise NOT of the last value written ("liveness check"). Registers below 0x80 take 4-byte
//! accesses only, the DMA registers at 0x80 and above 4 or 8 bytes.

use core::fmt;

use hal::regs::RegisterBus;
use tock_registers::interfaces::{Readable, Writeable};

use crate::error::{FirmwareError, Result};
use crate::pci::{self, AssignedBar, Bdf, Ecam, Function, MmioAllocator};

/// PCI vendor ID (QEMU).
pub const VENDOR_ID: u16 = 0x1234;
/// PCI device ID of edu.
pub const DEVICE_ID: u16 = 0x11e8;
/// Value of the identification register in QEMU 7.2's edu (version 1.0).
pub const IDENTIFICATION: u32 = 0x0100_00ed;
/// Patterns written to the liveness register: zero, all-ones, alternating bits in both
/// phases, and two irregular words.
pub const LIVENESS_PATTERNS: [u32; 6] = [
    0x0000_0000,
    0xffff_ffff,
    0x5555_5555,
    0xaaaa_aaaa,
    0x1234_5678,
    0xdead_beef,
];

hal::register_block! {
    /// The edu BAR0 registers.
    pub struct EduRegs {
        /// Identification: 0xRRrr00ed (major RR, minor rr).
        (0x00 => pub identification: Ro u32),
        /// Liveness check: reads the bitwise NOT of the last write.
        (0x04 => pub liveness: Rw u32),
        /// Factorial: write n, read n! when status bit 0 clears.
        (0x08 => pub factorial: Rw u32),
        /// Status: bit 0 computing (read-only), bit 7 raise interrupt on factorial completion.
        (0x20 => pub status: Rw u32),
        /// Interrupt status (0x001 factorial, 0x100 DMA).
        (0x24 => pub interrupt_status: Ro u32),
        /// Raise interrupt: the value is ORed into the interrupt status.
        (0x60 => pub interrupt_raise: Wo u32),
        /// Acknowledge interrupt: the value is cleared from the interrupt status.
        (0x64 => pub interrupt_ack: Wo u32),
        /// DMA source address.
        (0x80 => pub dma_source: Rw u64),
        /// DMA destination address.
        (0x88 => pub dma_destination: Rw u64),
        /// DMA transfer count.
        (0x90 => pub dma_count: Rw u64),
        /// DMA command: bit 0 start/running, bit 1 direction (1 = device to RAM), bit 2
        /// raise interrupt on completion.
        (0x98 => pub dma_command: Rw u64),
    }
    size = 0x100;
}

/// Reads the identification register and checks it against [`IDENTIFICATION`].
pub fn check_identification<B: RegisterBus + ?Sized>(regs: &EduRegs<'_, B>) -> Result<u32> {
    let found = regs.identification().get();
    if found != IDENTIFICATION {
        return Err(FirmwareError::EduIdentification {
            found,
            expected: IDENTIFICATION,
        });
    }
    Ok(found)
}

/// Writes each of [`LIVENESS_PATTERNS`] to the liveness register and checks that its bitwise
/// NOT reads back. Returns how many patterns passed (all of them).
pub fn check_liveness<B: RegisterBus + ?Sized>(regs: &EduRegs<'_, B>) -> Result<usize> {
    for wrote in LIVENESS_PATTERNS {
        regs.liveness().set(wrote);
        let read = regs.liveness().get();
        if read != !wrote {
            return Err(FirmwareError::EduLiveness {
                wrote,
                read,
                expected: !wrote,
            });
        }
    }
    Ok(LIVENESS_PATTERNS.len())
}

/// What [`probe`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EduReport {
    /// The edu function.
    pub function: Function,
    /// Its BAR0 as assigned.
    pub bar0: AssignedBar,
    /// The command register after enabling.
    pub command: u16,
    /// The identification register.
    pub identification: u32,
    /// Liveness patterns checked.
    pub liveness_checks: usize,
}

impl fmt::Display for EduReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "edu {:04x}:{:04x} at {}, BAR0 {:#x} ({} KiB), id {:#010x}, liveness {}/{}",
            self.function.vendor_id,
            self.function.device_id,
            self.function.bdf,
            self.bar0.at.cpu,
            self.bar0.bar.size / 1024,
            self.identification,
            self.liveness_checks,
            LIVENESS_PATTERNS.len()
        )
    }
}

/// A progress line of [`probe`]. The target logs it through defmt (`defmt::Format`); its
/// [`fmt::Display`] is the same line as text, for host tests (nothing on the target formats it
/// with `core::fmt`). Keep the two wordings alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeLine {
    /// The buses scanned and the functions found on them.
    Enumerated {
        /// First bus of the ECAM window.
        first_bus: u8,
        /// Last bus of the ECAM window.
        last_bus: u8,
        /// Functions found.
        functions: usize,
    },
    /// One function found.
    Found(Function),
    /// edu's BAR0 as assigned.
    Bar0 {
        /// The edu function.
        bdf: Bdf,
        /// The BAR and where it went.
        bar: AssignedBar,
    },
    /// Memory decoding and bus mastering enabled.
    Enabled {
        /// The edu function.
        bdf: Bdf,
        /// The command register read back.
        command: u16,
    },
    /// Identification and liveness checked through BAR0.
    Checked {
        /// The identification register.
        identification: u32,
        /// Liveness patterns checked.
        liveness_checks: usize,
    },
}

impl fmt::Display for ProbeLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeLine::Enumerated {
                first_bus,
                last_bus,
                functions,
            } => write!(
                f,
                "buses {first_bus:02x}-{last_bus:02x}: {functions} function(s)"
            ),
            ProbeLine::Found(function) => write!(f, "  {function}"),
            ProbeLine::Bar0 { bdf, bar } => write!(
                f,
                "{bdf}: BAR0 {} {} KiB at PCI {:#x} / CPU {:#x}",
                bar.bar.kind.name(),
                bar.bar.size / 1024,
                bar.at.pci,
                bar.at.cpu
            ),
            ProbeLine::Enabled { bdf, command } => write!(
                f,
                "{bdf}: command {command:#06x} (memory space, bus master)"
            ),
            ProbeLine::Checked {
                identification,
                liveness_checks,
            } => write!(
                f,
                "edu: identification {identification:#010x}, liveness {liveness_checks} patterns"
            ),
        }
    }
}

#[cfg(target_os = "none")]
impl defmt::Format for ProbeLine {
    fn format(&self, f: defmt::Formatter<'_>) {
        match self {
            ProbeLine::Enumerated {
                first_bus,
                last_bus,
                functions,
            } => defmt::write!(
                f,
                "buses {=u8:02x}-{=u8:02x}: {=usize} function(s)",
                first_bus,
                last_bus,
                functions
            ),
            ProbeLine::Found(function) => defmt::write!(f, "  {}", function),
            ProbeLine::Bar0 { bdf, bar } => defmt::write!(
                f,
                "{}: BAR0 {=str} {=u64} KiB at PCI {=u64:#x} / CPU {=u64:#x}",
                bdf,
                bar.bar.kind.name(),
                bar.bar.size / 1024,
                bar.at.pci,
                bar.at.cpu
            ),
            ProbeLine::Enabled { bdf, command } => defmt::write!(
                f,
                "{}: command {=u16:#06x} (memory space, bus master)",
                bdf,
                command
            ),
            ProbeLine::Checked {
                identification,
                liveness_checks,
            } => defmt::write!(
                f,
                "edu: identification {=u32:#010x}, liveness {=usize} patterns",
                identification,
                liveness_checks
            ),
        }
    }
}

/// The `pci-probe` flow: enumerate, find edu, size and assign BAR0 from `allocator`, route it
/// through any bridges, enable memory decoding and bus mastering, then check identification
/// and liveness through BAR0. `open_bar(cpu_address, size)` gives a bus for the BAR's
/// registers (an MMIO window on the target, a model on the host). Progress goes to `log`, one
/// [`ProbeLine`] at a time (defmt on the target; see `firmware::logger::info`).
pub fn probe<B, E, F>(
    ecam: &Ecam<'_, B>,
    allocator: &mut MmioAllocator,
    log: &mut dyn FnMut(ProbeLine),
    open_bar: F,
) -> Result<EduReport>
where
    B: RegisterBus + ?Sized,
    E: RegisterBus,
    F: FnOnce(u64, u64) -> Result<E>,
{
    let functions = pci::enumerate(ecam)?;
    log(ProbeLine::Enumerated {
        first_bus: ecam.first_bus(),
        last_bus: ecam.last_bus(),
        functions: functions.len(),
    });
    for f in &functions {
        log(ProbeLine::Found(*f));
    }
    let (index, function) = functions
        .iter()
        .enumerate()
        .find(|(_, f)| f.vendor_id == VENDOR_ID && f.device_id == DEVICE_ID)
        .map(|(i, f)| (i, *f))
        .ok_or(FirmwareError::PciDeviceNotFound {
            vendor: VENDOR_ID,
            device: DEVICE_ID,
        })?;
    let header = ecam.header(function.bdf)?;
    let bar0 = pci::assign_bar32(&header, function.bdf, 0, allocator)?;
    log(ProbeLine::Bar0 {
        bdf: function.bdf,
        bar: bar0,
    });
    pci::route_to(ecam, &functions, index, bar0.at.pci, bar0.bar.size)?;
    let command = pci::enable(&header, function.bdf)?;
    log(ProbeLine::Enabled {
        bdf: function.bdf,
        command,
    });
    let bus = open_bar(bar0.at.cpu, bar0.bar.size)?;
    let regs = EduRegs::new(&bus, 0)?;
    let identification = check_identification(&regs)?;
    let liveness_checks = check_liveness(&regs)?;
    log(ProbeLine::Checked {
        identification,
        liveness_checks,
    });
    Ok(EduReport {
        function,
        bar0,
        command,
        identification,
        liveness_checks,
    })
}
