//! PCI configuration through an ECAM window: enumeration, BAR sizing and assignment.
//!
//! Sources: PCI Express Base Specification 4.0, 7.2.2 (ECAM: function `b:d.f` at offset
//! `(b - first_bus) << 20 | d << 15 | f << 12`) and 7.5.1 (type 0 and type 1 configuration
//! headers); PCI Local Bus Specification 3.0, 6.2.5.1 (BAR sizing: write all-ones, read back
//! the size mask, with decoding disabled meanwhile); PCI-to-PCI Bridge Architecture
//! Specification 1.2, 3.2.5 (bus numbers, memory base/limit in 1 MiB units); IEEE 1275 PCI
//! bus binding 2.2.1.1 (device-tree `ranges` phys.hi: space code in bits 25:24, prefetchable
//! bit 30); Linux `Documentation/devicetree/bindings/pci/host-generic-pci.yaml` for the
//! `pci-host-ecam-generic` node (`reg` = ECAM, `bus-range`, `ranges`).
//!
//! All accesses go through the hal register seam, so the logic here runs unchanged against
//! `hal::model::ModelBus` config-space models on the host.

use core::fmt;

use hal::regs::RegisterBus;
use tock_registers::interfaces::{ReadWriteable, Readable, Writeable};

use crate::error::{FirmwareError, Result};
use crate::fdt::{Fdt, read_cells};
use crate::platform::MemRegion;

/// Bytes of configuration space per function in ECAM.
pub const FUNCTION_CONFIG_SIZE: usize = 4096;
/// Bytes of ECAM per bus (32 devices x 8 functions x 4 KiB).
pub const BUS_CONFIG_SIZE: usize = 1 << 20;
/// Vendor ID read from a function that does not exist.
pub const NO_DEVICE: u16 = 0xffff;
/// How many functions [`enumerate`] keeps.
pub const MAX_FUNCTIONS: usize = 64;

/// A bus/device/function address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bdf {
    bus: u8,
    device: u8,
    function: u8,
}

impl Bdf {
    /// `bus:device.function`; `None` if device > 31 or function > 7.
    pub const fn new(bus: u8, device: u8, function: u8) -> Option<Self> {
        if device < 32 && function < 8 {
            Some(Self {
                bus,
                device,
                function,
            })
        } else {
            None
        }
    }

    /// Bus number.
    pub const fn bus(&self) -> u8 {
        self.bus
    }

    /// Device number (0-31).
    pub const fn device(&self) -> u8 {
        self.device
    }

    /// Function number (0-7).
    pub const fn function(&self) -> u8 {
        self.function
    }

    /// The requester ID `bus << 8 | device << 3 | function`, which is also the SMMU StreamID
    /// of the function on QEMU `virt`.
    pub const fn requester_id(&self) -> u16 {
        ((self.bus as u16) << 8) | ((self.device as u16) << 3) | self.function as u16
    }
}

#[cfg(target_os = "none")]
impl defmt::Format for Bdf {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(
            f,
            "{=u8:02x}:{=u8:02x}.{=u8:x}",
            self.bus,
            self.device,
            self.function
        )
    }
}

impl fmt::Display for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:02x}:{:02x}.{:x}",
            self.bus, self.device, self.function
        )
    }
}

/// Register fields (tock-registers `register_bitfields!`). Every register and field has a
/// doc comment; the helper items the macro generates have none, hence the `allow`.
#[allow(missing_docs)]
pub mod fields {
    use tock_registers::register_bitfields;

    register_bitfields![u16,
        /// Command register (PCIe 7.5.1.1.3).
        pub COMMAND [
            /// Respond to I/O space accesses.
            IO_SPACE OFFSET(0) NUMBITS(1) [],
            /// Respond to memory space accesses (BARs decode).
            MEMORY_SPACE OFFSET(1) NUMBITS(1) [],
            /// Allow the function to issue memory requests (DMA).
            BUS_MASTER OFFSET(2) NUMBITS(1) [],
            /// Disable INTx assertion.
            INTX_DISABLE OFFSET(10) NUMBITS(1) [],
        ],
    ];

    register_bitfields![u8,
        /// Header Type register (PCIe 7.5.1.1.9).
        pub HEADER_TYPE [
            /// Header layout.
            LAYOUT OFFSET(0) NUMBITS(7) [
                /// Type 0: an endpoint.
                Endpoint = 0,
                /// Type 1: a PCI-to-PCI bridge (or root/switch port).
                Bridge = 1,
            ],
            /// Function 0 of a multi-function device.
            MULTI_FUNCTION OFFSET(7) NUMBITS(1) [],
        ],
    ];
}
pub use fields::{COMMAND, HEADER_TYPE};

hal::register_block! {
    /// The header fields common to all functions, plus the six BARs of a type-0 header
    /// (PCIe 7.5.1.1 and 7.5.1.2). For a type-1 header only BAR0/1 are BARs; use
    /// [`BridgeHeader`] for the rest.
    pub struct ConfigHeader {
        /// Vendor ID (0xffff: no function here).
        (0x00 => pub vendor_id: Ro u16),
        /// Device ID.
        (0x02 => pub device_id: Ro u16),
        /// Command.
        (0x04 => pub command: Rw u16, COMMAND::Register),
        /// Status (error bits are write-1-to-clear).
        (0x06 => pub status: Rw u16),
        /// Revision ID.
        (0x08 => pub revision: Ro u8),
        /// Class code: programming interface.
        (0x09 => pub prog_if: Ro u8),
        /// Class code: sub-class.
        (0x0a => pub subclass: Ro u8),
        /// Class code: base class.
        (0x0b => pub class: Ro u8),
        /// Header type.
        (0x0e => pub header_type: Ro u8, HEADER_TYPE::Register),
        /// Base address registers 0-5.
        (0x10 => pub bar: [Rw u32; 6, stride 4]),
        /// Capabilities pointer.
        (0x34 => pub capabilities: Ro u8),
        /// Interrupt line (for software).
        (0x3c => pub interrupt_line: Rw u8),
        /// Interrupt pin (1 = INTA).
        (0x3d => pub interrupt_pin: Ro u8),
    }
    size = 0x40;
}

hal::register_block! {
    /// The type-1 (bridge) header fields (PCIe 7.5.1.3).
    pub struct BridgeHeader {
        /// Primary bus number (the bus the bridge sits on).
        (0x18 => pub primary_bus: Rw u8),
        /// Secondary bus number (directly below the bridge).
        (0x19 => pub secondary_bus: Rw u8),
        /// Subordinate bus number (highest bus below the bridge).
        (0x1a => pub subordinate_bus: Rw u8),
        /// Memory base: address bits 31:20 in bits 15:4.
        (0x20 => pub memory_base: Rw u16),
        /// Memory limit: address bits 31:20 in bits 15:4 (the window ends at limit|0xfffff).
        (0x22 => pub memory_limit: Rw u16),
        /// Prefetchable memory base.
        (0x24 => pub prefetchable_base: Rw u16),
        /// Prefetchable memory limit.
        (0x26 => pub prefetchable_limit: Rw u16),
        /// Bridge control.
        (0x3e => pub bridge_control: Rw u16),
    }
    size = 0x40;
}

/// A short name for a class/sub-class pair (PCI Code and ID Assignment Specification 1.x,
/// chapter 1), for log lines.
pub const fn class_name(class: u8, subclass: u8) -> &'static str {
    match (class, subclass) {
        (0x00, _) => "unclassified",
        (0x01, _) => "mass storage",
        (0x02, _) => "network",
        (0x03, _) => "display",
        (0x04, _) => "multimedia",
        (0x05, _) => "memory controller",
        (0x06, 0x00) => "host bridge",
        (0x06, 0x04) => "PCI-to-PCI bridge",
        (0x06, _) => "bridge",
        (0x0c, 0x03) => "USB controller",
        (0xff, _) => "vendor specific",
        _ => "other",
    }
}

/// An ECAM window covering buses `first_bus..=last_bus`.
#[derive(Debug)]
pub struct Ecam<'a, B: RegisterBus + ?Sized> {
    bus: &'a B,
    first_bus: u8,
    last_bus: u8,
}

impl<'a, B: RegisterBus + ?Sized> Ecam<'a, B> {
    /// The ECAM window `bus` for the bus range `first_bus..=last_bus`. If the window is too
    /// small for the whole range, the range is cut to what the window holds (as Linux does);
    /// a window smaller than one bus or an empty range is an error.
    pub fn new(bus: &'a B, first_bus: u8, last_bus: u8) -> Result<Self> {
        let buses_in_window = bus.size() / BUS_CONFIG_SIZE;
        if last_bus < first_bus || buses_in_window == 0 {
            return Err(FirmwareError::PciAddressOutOfRange {
                bus: u16::from(first_bus),
                device: 0,
                function: 0,
            });
        }
        let fits = u16::from(first_bus) + buses_in_window.min(256) as u16 - 1;
        let last_bus = last_bus.min(fits.min(255) as u8);
        Ok(Self {
            bus,
            first_bus,
            last_bus,
        })
    }

    /// First bus number (the root bus).
    pub fn first_bus(&self) -> u8 {
        self.first_bus
    }

    /// Last bus number decoded.
    pub fn last_bus(&self) -> u8 {
        self.last_bus
    }

    /// Byte offset of a function's configuration space in the window.
    pub fn offset(&self, bdf: Bdf) -> Result<usize> {
        if bdf.bus < self.first_bus || bdf.bus > self.last_bus {
            return Err(FirmwareError::PciAddressOutOfRange {
                bus: u16::from(bdf.bus),
                device: bdf.device,
                function: bdf.function,
            });
        }
        Ok((usize::from(bdf.bus - self.first_bus) << 20)
            | (usize::from(bdf.device) << 15)
            | (usize::from(bdf.function) << 12))
    }

    /// The common header of a function.
    pub fn header(&self, bdf: Bdf) -> Result<ConfigHeader<'a, B>> {
        Ok(ConfigHeader::new(self.bus, self.offset(bdf)?)?)
    }

    /// The bridge header of a (type-1) function.
    pub fn bridge(&self, bdf: Bdf) -> Result<BridgeHeader<'a, B>> {
        Ok(BridgeHeader::new(self.bus, self.offset(bdf)?)?)
    }
}

/// A function found by [`enumerate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Function {
    /// Its address.
    pub bdf: Bdf,
    /// Vendor ID.
    pub vendor_id: u16,
    /// Device ID.
    pub device_id: u16,
    /// Base class.
    pub class: u8,
    /// Sub-class.
    pub subclass: u8,
    /// Programming interface.
    pub prog_if: u8,
    /// Revision ID.
    pub revision: u8,
    /// Header layout (0 endpoint, 1 bridge, 2 CardBus).
    pub header_layout: u8,
    /// Index (in the enumeration list) of the bridge this function sits behind.
    pub upstream: Option<usize>,
    /// For a bridge: the secondary and subordinate bus numbers assigned to it.
    pub buses: Option<(u8, u8)>,
}

impl fmt::Display for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:04x}:{:04x} class {:02x}{:02x}{:02x} ({}) rev {:02x}",
            self.bdf,
            self.vendor_id,
            self.device_id,
            self.class,
            self.subclass,
            self.prog_if,
            class_name(self.class, self.subclass),
            self.revision
        )?;
        if let Some((secondary, subordinate)) = self.buses {
            write!(f, ", buses {secondary:02x}-{subordinate:02x}")?;
        }
        Ok(())
    }
}

/// The same line as [`fmt::Display`]'s, for defmt (one `write!` per value: the decoder reads
/// one format string for it).
#[cfg(target_os = "none")]
impl defmt::Format for Function {
    fn format(&self, f: defmt::Formatter<'_>) {
        let class = class_name(self.class, self.subclass);
        match self.buses {
            None => defmt::write!(
                f,
                "{} {=u16:04x}:{=u16:04x} class {=u8:02x}{=u8:02x}{=u8:02x} ({=str}) rev {=u8:02x}",
                self.bdf,
                self.vendor_id,
                self.device_id,
                self.class,
                self.subclass,
                self.prog_if,
                class,
                self.revision
            ),
            Some((secondary, subordinate)) => defmt::write!(
                f,
                "{} {=u16:04x}:{=u16:04x} class {=u8:02x}{=u8:02x}{=u8:02x} ({=str}) rev \
                 {=u8:02x}, buses {=u8:02x}-{=u8:02x}",
                self.bdf,
                self.vendor_id,
                self.device_id,
                self.class,
                self.subclass,
                self.prog_if,
                class,
                self.revision,
                secondary,
                subordinate
            ),
        }
    }
}

/// The functions found, in scan order.
pub type FunctionList = heapless::Vec<Function, MAX_FUNCTIONS>;

/// Scans the root bus and, depth first, every bridge's secondary bus. Bridges get bus numbers
/// in scan order (secondary = next free bus; subordinate = the last bus found below them).
/// Only function 0 is probed unless it reports a multi-function device.
pub fn enumerate<B: RegisterBus + ?Sized>(ecam: &Ecam<'_, B>) -> Result<FunctionList> {
    let mut found = FunctionList::new();
    let mut next_bus = u16::from(ecam.first_bus) + 1;
    scan_bus(ecam, ecam.first_bus, None, &mut next_bus, &mut found)?;
    Ok(found)
}

fn scan_bus<B: RegisterBus + ?Sized>(
    ecam: &Ecam<'_, B>,
    bus: u8,
    upstream: Option<usize>,
    next_bus: &mut u16,
    found: &mut FunctionList,
) -> Result {
    for device in 0..32 {
        let Some(bdf0) = Bdf::new(bus, device, 0) else {
            continue;
        };
        let header0 = ecam.header(bdf0)?;
        if header0.vendor_id().get() == NO_DEVICE {
            continue;
        }
        let functions = if header0.header_type().is_set(HEADER_TYPE::MULTI_FUNCTION) {
            8
        } else {
            1
        };
        for function in 0..functions {
            let Some(bdf) = Bdf::new(bus, device, function) else {
                continue;
            };
            let header = ecam.header(bdf)?;
            let vendor_id = header.vendor_id().get();
            if vendor_id == NO_DEVICE {
                continue;
            }
            let layout = header.header_type().read(HEADER_TYPE::LAYOUT);
            let index = found.len();
            let entry = Function {
                bdf,
                vendor_id,
                device_id: header.device_id().get(),
                class: header.class().get(),
                subclass: header.subclass().get(),
                prog_if: header.prog_if().get(),
                revision: header.revision().get(),
                header_layout: layout,
                upstream,
                buses: None,
            };
            found
                .push(entry)
                .map_err(|_| FirmwareError::PciTooManyFunctions {
                    capacity: MAX_FUNCTIONS,
                })?;
            if layout == HEADER_TYPE::LAYOUT::Bridge.value {
                let buses = scan_bridge(ecam, bdf, index, next_bus, found)?;
                if let Some(f) = found.get_mut(index) {
                    f.buses = Some(buses);
                }
            }
        }
    }
    Ok(())
}

/// Numbers a bridge's buses and scans below it. While scanning, subordinate is the last bus
/// of the ECAM so that configuration requests for any deeper bus are forwarded; afterwards
/// it is narrowed to the last bus actually used.
fn scan_bridge<B: RegisterBus + ?Sized>(
    ecam: &Ecam<'_, B>,
    bdf: Bdf,
    index: usize,
    next_bus: &mut u16,
    found: &mut FunctionList,
) -> Result<(u8, u8)> {
    if *next_bus > u16::from(ecam.last_bus) {
        return Err(FirmwareError::PciBusNumbersExhausted { bridge: bdf });
    }
    let secondary = *next_bus as u8;
    *next_bus += 1;
    let bridge = ecam.bridge(bdf)?;
    bridge.primary_bus().set(bdf.bus);
    bridge.secondary_bus().set(secondary);
    bridge.subordinate_bus().set(ecam.last_bus);
    scan_bus(ecam, secondary, Some(index), next_bus, found)?;
    let subordinate = (*next_bus - 1) as u8;
    bridge.subordinate_bus().set(subordinate);
    Ok((secondary, subordinate))
}

/// What a BAR decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarKind {
    /// 32-bit memory.
    Memory32 {
        /// Prefetchable.
        prefetchable: bool,
    },
    /// 64-bit memory (this BAR and the next one).
    Memory64 {
        /// Prefetchable.
        prefetchable: bool,
    },
    /// Legacy memory below 1 MiB (type 01, PCI 2.x only).
    MemoryBelow1M,
    /// I/O space.
    Io,
}

impl BarKind {
    /// A name for messages.
    pub const fn name(&self) -> &'static str {
        match self {
            BarKind::Memory32 { .. } => "32-bit memory",
            BarKind::Memory64 { .. } => "64-bit memory",
            BarKind::MemoryBelow1M => "legacy below-1MiB memory",
            BarKind::Io => "I/O",
        }
    }
}

/// A sized BAR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bar {
    /// BAR index (0-5).
    pub index: u8,
    /// What it decodes.
    pub kind: BarKind,
    /// Size in bytes (a power of two).
    pub size: u64,
}

/// Lowest set bit: the size a BAR mask encodes (robust against masks with stray bits).
const fn size_from_mask(mask: u64) -> u64 {
    mask & mask.wrapping_neg()
}

/// Writes all-ones to a BAR register and returns what reads back, restoring the original.
fn probe_register<B: RegisterBus + ?Sized>(header: &ConfigHeader<'_, B>, index: u8) -> Result<u32> {
    let reg = header.bar(usize::from(index))?;
    let original = reg.get();
    reg.set(u32::MAX);
    let probed = reg.get();
    reg.set(original);
    Ok(probed)
}

/// Sizes BAR `index` of a type-0 function: memory and I/O decoding are turned off while
/// all-ones is written (so the device does not decode a bogus range meanwhile), the original
/// BAR and command values are restored. `Ok(None)` if the BAR is not implemented.
pub fn size_bar<B: RegisterBus + ?Sized>(
    header: &ConfigHeader<'_, B>,
    bdf: Bdf,
    index: u8,
) -> Result<Option<Bar>> {
    if index >= 6 {
        return Err(FirmwareError::PciBarIndex { bdf, index });
    }
    let command = header.command().get();
    header
        .command()
        .set(command & !(COMMAND::MEMORY_SPACE::SET.value | COMMAND::IO_SPACE::SET.value));
    let sized = size_bar_decoding_off(header, bdf, index);
    header.command().set(command);
    sized
}

fn size_bar_decoding_off<B: RegisterBus + ?Sized>(
    header: &ConfigHeader<'_, B>,
    bdf: Bdf,
    index: u8,
) -> Result<Option<Bar>> {
    let probed = probe_register(header, index)?;
    if probed == 0 {
        return Ok(None);
    }
    if probed & 1 == 1 {
        // I/O: bits 1:0 are flags; a 16-bit decoder hard-wires the upper half to zero. With no
        // writable address bit at all there is no range to decode: not implemented.
        let mut mask = probed & !0b11;
        if mask == 0 {
            return Ok(None);
        }
        if mask >> 16 == 0 {
            mask |= 0xffff_0000;
        }
        return Ok(Some(Bar {
            index,
            kind: BarKind::Io,
            size: size_from_mask(u64::from(mask)),
        }));
    }
    let prefetchable = probed & 0b1000 != 0;
    let low_mask = u64::from(probed & !0xf);
    let (kind, mask) = match (probed >> 1) & 0b11 {
        // Only type bits read back: the address bits are not implemented.
        0b00 | 0b01 if low_mask == 0 => return Ok(None),
        0b00 => (BarKind::Memory32 { prefetchable }, low_mask),
        0b01 => (BarKind::MemoryBelow1M, low_mask),
        0b10 => {
            let upper = index + 1;
            if upper >= 6 {
                return Err(FirmwareError::PciBarIndex { bdf, index: upper });
            }
            let high = probe_register(header, upper)?;
            (
                BarKind::Memory64 { prefetchable },
                (u64::from(high) << 32) | low_mask,
            )
        }
        _ => {
            return Err(FirmwareError::PciUnexpectedBarKind {
                bdf,
                index,
                found: "reserved memory type",
            });
        }
    };
    if mask == 0 {
        return Ok(None);
    }
    Ok(Some(Bar {
        index,
        kind,
        size: size_from_mask(mask),
    }))
}

/// An address window from a host bridge's `ranges`: CPU addresses
/// `cpu_base..cpu_base + size` reach PCI bus addresses `pci_base..`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciWindow {
    /// CPU physical address of the window.
    pub cpu_base: u64,
    /// PCI bus address of the window (what BARs are programmed with).
    pub pci_base: u64,
    /// Size in bytes.
    pub size: u64,
    /// Marked prefetchable.
    pub prefetchable: bool,
}

/// Where an allocation landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// PCI bus address (the BAR value).
    pub pci: u64,
    /// CPU physical address (where the CPU reaches it).
    pub cpu: u64,
}

/// A bump allocator of naturally aligned BAR ranges in a [`PciWindow`].
#[derive(Clone, Debug)]
pub struct MmioAllocator {
    window: PciWindow,
    used: u64,
}

impl MmioAllocator {
    /// An allocator over `window`, starting at its base.
    pub fn new(window: PciWindow) -> Self {
        Self { window, used: 0 }
    }

    /// The window.
    pub fn window(&self) -> PciWindow {
        self.window
    }

    /// Allocates `size` bytes aligned to `size` (rounded up to a power of two, as BAR sizes
    /// are). Fails without changing anything if the window is full.
    pub fn allocate(&mut self, size: u64) -> Result<Allocation> {
        let exhausted = FirmwareError::PciWindowExhausted { size };
        let align = size.checked_next_power_of_two().ok_or(exhausted)?.max(1);
        let next = self
            .window
            .pci_base
            .checked_add(self.used)
            .ok_or(exhausted)?;
        let start = next.checked_next_multiple_of(align).ok_or(exhausted)?;
        let end = start.checked_add(size).ok_or(exhausted)?;
        let window_end = self
            .window
            .pci_base
            .checked_add(self.window.size)
            .ok_or(exhausted)?;
        if end > window_end {
            return Err(exhausted);
        }
        self.used = end - self.window.pci_base;
        let offset = start - self.window.pci_base;
        Ok(Allocation {
            pci: start,
            cpu: self.window.cpu_base.checked_add(offset).ok_or(exhausted)?,
        })
    }
}

/// A BAR with an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AssignedBar {
    /// The BAR as sized.
    pub bar: Bar,
    /// Where it was placed.
    pub at: Allocation,
}

/// Sizes a 32-bit memory BAR, gives it a naturally aligned range from `allocator` and
/// programs it, checking the read-back. Memory decoding stays as it was (see [`enable`]).
pub fn assign_bar32<B: RegisterBus + ?Sized>(
    header: &ConfigHeader<'_, B>,
    bdf: Bdf,
    index: u8,
    allocator: &mut MmioAllocator,
) -> Result<AssignedBar> {
    let bar =
        size_bar(header, bdf, index)?.ok_or(FirmwareError::PciBarNotImplemented { bdf, index })?;
    if !matches!(bar.kind, BarKind::Memory32 { .. }) {
        return Err(FirmwareError::PciUnexpectedBarKind {
            bdf,
            index,
            found: bar.kind.name(),
        });
    }
    let mut trial = allocator.clone();
    let at = trial.allocate(bar.size)?;
    let value =
        u32::try_from(at.pci).map_err(|_| FirmwareError::PciWindowExhausted { size: bar.size })?;
    let reg = header.bar(usize::from(index))?;
    reg.set(value);
    let read = reg.get();
    if read & !0xf != value {
        return Err(FirmwareError::PciBarReadback {
            bdf,
            index,
            wrote: value,
            read,
        });
    }
    *allocator = trial;
    Ok(AssignedBar { bar, at })
}

/// Turns on memory decoding and bus mastering, checking that the bits stuck.
pub fn enable<B: RegisterBus + ?Sized>(header: &ConfigHeader<'_, B>, bdf: Bdf) -> Result<u16> {
    header
        .command()
        .modify(COMMAND::MEMORY_SPACE::SET + COMMAND::BUS_MASTER::SET);
    let wanted = COMMAND::MEMORY_SPACE::SET.value | COMMAND::BUS_MASTER::SET.value;
    let read = header.command().get();
    if read & wanted != wanted {
        return Err(FirmwareError::PciCommandReadback { bdf, wanted, read });
    }
    Ok(read)
}

/// Opens the memory windows of every bridge between the root bus and function
/// `functions[index]` so that `range` (PCI bus addresses) is forwarded down to it, and lets
/// the bridges forward memory and DMA. The windows cover only this range (1 MiB granules):
/// enough for one device per bridge, which is what the probe programs need.
pub fn route_to<B: RegisterBus + ?Sized>(
    ecam: &Ecam<'_, B>,
    functions: &[Function],
    index: usize,
    base: u64,
    size: u64,
) -> Result {
    let last = base
        .checked_add(size.saturating_sub(1))
        .filter(|&l| l <= u64::from(u32::MAX) && size > 0)
        .ok_or(FirmwareError::PciWindowExhausted { size })?;
    let mut upstream = functions.get(index).and_then(|f| f.upstream);
    // A chain longer than the list would mean a cycle in corrupt input.
    for _ in 0..functions.len() {
        let Some(bridge_index) = upstream else {
            return Ok(());
        };
        let Some(bridge) = functions.get(bridge_index) else {
            return Ok(());
        };
        let regs = ecam.bridge(bridge.bdf)?;
        regs.memory_base().set(((base >> 16) & 0xfff0) as u16);
        regs.memory_limit().set(((last >> 16) & 0xfff0) as u16);
        enable(&ecam.header(bridge.bdf)?, bridge.bdf)?;
        upstream = bridge.upstream;
    }
    Ok(())
}

/// A `pci-host-ecam-generic` host bridge as the device tree describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciHost {
    /// The ECAM window.
    pub ecam: MemRegion,
    /// First bus number (`bus-range`, default 0).
    pub first_bus: u8,
    /// Last bus number (`bus-range`, default 255).
    pub last_bus: u8,
    /// The first non-prefetchable 32-bit memory window in `ranges` (else the first
    /// prefetchable one).
    pub mmio32: Option<PciWindow>,
    /// The 64-bit memory window in `ranges` (the same preference).
    pub mmio64: Option<PciWindow>,
    /// The I/O window in `ranges`.
    pub io: Option<PciWindow>,
}

impl PciHost {
    /// QEMU `virt`'s host bridge as documented (high ECAM, all 256 buses, the 32-bit MMIO
    /// window identity-mapped), for when no device tree is available.
    pub const fn virt_default() -> Self {
        use crate::platform::virt;
        PciHost {
            ecam: virt::HIGH_ECAM,
            first_bus: 0,
            last_bus: 255,
            mmio32: Some(PciWindow {
                cpu_base: virt::PCIE_MMIO32.base,
                pci_base: virt::PCIE_MMIO32.base,
                size: virt::PCIE_MMIO32.size,
                prefetchable: false,
            }),
            mmio64: None,
            io: None,
        }
    }
}

/// Finds the first `pci-host-ecam-generic` node and decodes its `reg`, `bus-range` and
/// `ranges`. `Ok(None)` if the tree has no such node.
pub fn host_from_fdt(fdt: &Fdt<'_>) -> Result<Option<PciHost>> {
    let Some(node) = fdt.find_compatible("pci-host-ecam-generic")? else {
        return Ok(None);
    };
    let ecam = node
        .reg()?
        .next()
        .ok_or(FirmwareError::FdtBadProperty { name: "reg" })??;
    let (first_bus, last_bus) = match node.property("bus-range") {
        None => (0, 255),
        Some(v) => match (read_cells(v, 0, 1), read_cells(v, 4, 1), v.len()) {
            (Some(first), Some(last), 8) if first <= last && last <= 255 => {
                (first as u8, last as u8)
            }
            _ => return Err(FirmwareError::FdtBadProperty { name: "bus-range" }),
        },
    };
    let bad_ranges = FirmwareError::FdtBadProperty { name: "ranges" };
    let child = node.cells();
    let parent = node.parent_cells();
    if child.address != 3 || !(1..=2).contains(&parent.address) || !(1..=2).contains(&child.size) {
        return Err(bad_ranges);
    }
    let entry = (3 + parent.address as usize + child.size as usize) * 4;
    let ranges = node.property("ranges").unwrap_or_default();
    if !ranges.len().is_multiple_of(entry) {
        return Err(bad_ranges);
    }
    let mut host = PciHost {
        ecam,
        first_bus,
        last_bus,
        mmio32: None,
        mmio64: None,
        io: None,
    };
    for at in (0..ranges.len()).step_by(entry) {
        let phys_hi = read_cells(ranges, at, 1).ok_or(bad_ranges)?;
        let pci_base = read_cells(ranges, at + 4, 2).ok_or(bad_ranges)?;
        let cpu_at = at + 12;
        let cpu_base = read_cells(ranges, cpu_at, parent.address).ok_or(bad_ranges)?;
        let size_at = cpu_at + parent.address as usize * 4;
        let size = read_cells(ranges, size_at, child.size).ok_or(bad_ranges)?;
        let window = PciWindow {
            cpu_base,
            pci_base,
            size,
            prefetchable: (phys_hi >> 30) & 1 == 1,
        };
        let slot = match (phys_hi >> 24) & 0b11 {
            0b01 => &mut host.io,
            0b10 => &mut host.mmio32,
            0b11 => &mut host.mmio64,
            _ => continue, // configuration space: not a window
        };
        // Keep the first window of each kind, but prefer a non-prefetchable one: BARs that
        // are not prefetchable (like edu's) must not be placed in a prefetchable window.
        if slot.is_none_or(|w| w.prefetchable && !window.prefetchable) {
            *slot = Some(window);
        }
    }
    Ok(Some(host))
}

#[cfg(test)]
pub(crate) mod tests;
