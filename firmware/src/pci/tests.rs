//! Host tests of enumeration, BAR sizing/assignment and the edu probe against a model of
//! ECAM configuration space.

use std::cell::Cell;

use hal::model::{ModelBus, RegisterModel};
use hal::regs::AccessWidth;
use proptest::prelude::*;

use super::*;
use crate::edu;
use crate::fdt::tests::{Builder, VIRT_DTB};

/// One function's configuration space, as the PCI/PCIe specs define its write behaviour:
/// IDs and class read-only, command bits 0-2 and 10 writable, BARs keep their read-only type
/// bits and take only the bits of their size mask, bridge bus numbers writable, bridge memory
/// base/limit writable in bits 15:4.
#[derive(Clone)]
struct FakeFunction {
    config: [u8; 256],
    /// Writable address bits per BAR dword (0: not implemented).
    bar_masks: [u32; 6],
    /// Read-only low bits per BAR (I/O flag, memory type, prefetchable).
    bar_flags: [u32; 6],
    /// For a bridge: the model bus behind it.
    child: Option<usize>,
    /// BARs ignore writes (a broken device).
    bars_stuck: bool,
    /// Command register ignores writes.
    command_stuck: bool,
}

impl FakeFunction {
    fn new(vendor: u16, device: u16, class: [u8; 3], header_type: u8) -> Self {
        let mut config = [0u8; 256];
        config[0..2].copy_from_slice(&vendor.to_le_bytes());
        config[2..4].copy_from_slice(&device.to_le_bytes());
        config[8] = 0x10; // revision
        config[9] = class[2];
        config[10] = class[1];
        config[11] = class[0];
        config[14] = header_type;
        Self {
            config,
            bar_masks: [0; 6],
            bar_flags: [0; 6],
            child: None,
            bars_stuck: false,
            command_stuck: false,
        }
    }

    /// A 32-bit non-prefetchable memory BAR of `size` bytes.
    fn mem32(mut self, index: usize, size: u32) -> Self {
        self.bar_masks[index] = !(size - 1) & !0xf;
        self.bar_flags[index] = 0;
        self
    }

    /// A 64-bit prefetchable memory BAR of `size` bytes at `index`, `index + 1`.
    fn mem64_prefetchable(mut self, index: usize, size: u64) -> Self {
        let mask = !(size - 1);
        self.bar_masks[index] = (mask as u32) & !0xf;
        self.bar_flags[index] = 0b1100;
        self.bar_masks[index + 1] = (mask >> 32) as u32;
        self
    }

    /// An I/O BAR of `size` bytes with a 16-bit decoder.
    fn io16(mut self, index: usize, size: u32) -> Self {
        self.bar_masks[index] = !(size - 1) & 0xfffc;
        self.bar_flags[index] = 0b01;
        self
    }

    fn bar(&self, i: usize) -> u32 {
        u32::from_le_bytes(self.config[0x10 + 4 * i..0x14 + 4 * i].try_into().unwrap())
    }

    fn command(&self) -> u16 {
        u16::from_le_bytes([self.config[4], self.config[5]])
    }

    fn is_bridge(&self) -> bool {
        self.config[14] & 0x7f == 1
    }

    fn bar_count(&self) -> usize {
        if self.is_bridge() { 2 } else { 6 }
    }

    fn read(&self, reg: usize, width: AccessWidth) -> u64 {
        let mut v = 0u64;
        for i in (0..width.bytes()).rev() {
            v = (v << 8) | u64::from(*self.config.get(reg + i).unwrap_or(&0));
        }
        v
    }

    /// Applies a write; returns whether all-ones went into a BAR while it decoded.
    fn write(&mut self, reg: usize, width: AccessWidth, value: u64) -> bool {
        let mut sized_while_decoding = false;
        let mut touched_bars = [false; 6];
        let mut merged = self.config;
        for i in 0..width.bytes() {
            if let Some(b) = merged.get_mut(reg + i) {
                *b = (value >> (8 * i)) as u8;
            }
        }
        for i in 0..width.bytes() {
            let at = reg + i;
            match at {
                0x04 | 0x05 if !self.command_stuck => {
                    let writable = if at == 0x04 { 0x07 } else { 0x04 };
                    self.config[at] = merged[at] & writable;
                }
                0x18..=0x1a if self.is_bridge() => self.config[at] = merged[at],
                0x20..=0x23 if self.is_bridge() => {
                    let writable = if at.is_multiple_of(2) { 0xf0 } else { 0xff };
                    self.config[at] = merged[at] & writable;
                }
                0x10..0x28 => {
                    let bar = (at - 0x10) / 4;
                    if bar < self.bar_count() {
                        touched_bars[bar] = true;
                    }
                }
                _ => {}
            }
        }
        for (bar, touched) in touched_bars.into_iter().enumerate() {
            if !touched || self.bars_stuck {
                continue;
            }
            let at = 0x10 + 4 * bar;
            let wrote = u32::from_le_bytes(merged[at..at + 4].try_into().unwrap());
            if wrote == u32::MAX && self.command() & 0b11 != 0 {
                sized_while_decoding = true;
            }
            let stored = (wrote & self.bar_masks[bar]) | self.bar_flags[bar];
            self.config[at..at + 4].copy_from_slice(&stored.to_le_bytes());
        }
        sized_while_decoding
    }
}

/// ECAM over a tree of buses; configuration requests are routed the way bridges route them
/// (PCI-to-PCI Bridge Architecture 1.2, 3.2.5.3): bus numbers in a bridge's
/// [secondary, subordinate] go below it, the secondary bus itself gets type-0 requests.
struct FakeEcam {
    /// Model buses: (device, function) -> function.
    buses: Vec<Vec<((u8, u8), FakeFunction)>>,
    window: usize,
    bars_sized_while_decoding: u32,
}

impl FakeEcam {
    fn new(buses: usize) -> Self {
        Self {
            buses: vec![Vec::new()],
            window: buses * BUS_CONFIG_SIZE,
            bars_sized_while_decoding: 0,
        }
    }

    fn add(&mut self, bus: usize, device: u8, function: u8, f: FakeFunction) -> &mut Self {
        self.buses[bus].push(((device, function), f));
        self
    }

    /// Adds a PCI-to-PCI bridge at `bus`/`device`.0 and returns the model bus behind it.
    fn add_bridge(&mut self, bus: usize, device: u8) -> usize {
        let child = self.buses.len();
        self.buses.push(Vec::new());
        let mut f = FakeFunction::new(0x1b36, 0x0001, [0x06, 0x04, 0x00], 0x01);
        f.child = Some(child);
        self.add(bus, device, 0, f);
        child
    }

    fn route(&self, bus_number: u8) -> Option<usize> {
        let mut current = 0usize;
        let mut current_number = 0u8;
        loop {
            if bus_number == current_number {
                return Some(current);
            }
            let (next, number) = self.buses[current].iter().find_map(|(_, f)| {
                let (sec, sub) = (f.config[0x19], f.config[0x1a]);
                let child = f.child?;
                (f.is_bridge() && sec != 0 && sec <= bus_number && bus_number <= sub)
                    .then_some((child, sec))
            })?;
            current = next;
            current_number = number;
        }
    }

    fn function(&mut self, bdf: Bdf) -> Option<&mut FakeFunction> {
        let bus = self.route(bdf.bus())?;
        self.buses[bus]
            .iter_mut()
            .find(|((d, f), _)| *d == bdf.device() && *f == bdf.function())
            .map(|(_, f)| f)
    }

    fn at(&mut self, bus: u8, device: u8, function: u8) -> &mut FakeFunction {
        self.function(Bdf::new(bus, device, function).unwrap())
            .unwrap()
    }

    fn decode(offset: usize) -> (Bdf, usize) {
        let bdf = Bdf::new(
            (offset >> 20) as u8,
            ((offset >> 15) & 31) as u8,
            ((offset >> 12) & 7) as u8,
        )
        .unwrap();
        (bdf, offset & 0xfff)
    }
}

impl RegisterModel for FakeEcam {
    fn size(&self) -> usize {
        self.window
    }
    fn read(&mut self, offset: usize, width: AccessWidth) -> u64 {
        let (bdf, reg) = Self::decode(offset);
        match self.function(bdf) {
            Some(f) => f.read(reg, width),
            None => width.mask(), // master abort: all-ones
        }
    }
    fn write(&mut self, offset: usize, width: AccessWidth, value: u64) {
        let (bdf, reg) = Self::decode(offset);
        if let Some(f) = self.function(bdf)
            && f.write(reg, width, value)
        {
            self.bars_sized_while_decoding += 1;
        }
    }
}

fn host_bridge() -> FakeFunction {
    // QEMU's GPEX host bridge: Red Hat 1b36:0008, class 06 00 00.
    FakeFunction::new(0x1b36, 0x0008, [0x06, 0x00, 0x00], 0x00)
}

fn edu_function() -> FakeFunction {
    // edu: 1234:11e8, class 00 ff 00, BAR0 1 MiB 32-bit memory (edu.txt).
    FakeFunction::new(edu::VENDOR_ID, edu::DEVICE_ID, [0x00, 0xff, 0x00], 0x00).mem32(0, 1 << 20)
}

/// QEMU virt with `-nodefaults -device edu,addr=2`.
fn virt_like() -> FakeEcam {
    let mut m = FakeEcam::new(256);
    m.add(0, 0, 0, host_bridge()).add(0, 2, 0, edu_function());
    m
}

fn virt_window() -> PciWindow {
    PciWindow {
        cpu_base: 0x1000_0000,
        pci_base: 0x1000_0000,
        size: 0x2eff_0000,
        prefetchable: false,
    }
}

/// edu's BAR0 as the device behaves (edu.txt): identification, inverted liveness; only
/// 4-byte accesses are valid below 0x80.
struct EduModel {
    identification: u32,
    liveness: u32,
    inverts: bool,
    bad_width_accesses: u32,
    liveness_writes: Vec<u32>,
}

impl EduModel {
    fn new() -> Self {
        Self {
            identification: edu::IDENTIFICATION,
            liveness: 0,
            inverts: true,
            bad_width_accesses: 0,
            liveness_writes: Vec::new(),
        }
    }
}

impl RegisterModel for EduModel {
    fn size(&self) -> usize {
        1 << 20
    }
    fn read(&mut self, offset: usize, width: AccessWidth) -> u64 {
        if offset < 0x80 && width != AccessWidth::U32 {
            self.bad_width_accesses += 1;
            return width.mask();
        }
        match offset {
            0x00 => u64::from(self.identification),
            0x04 if self.inverts => u64::from(!self.liveness),
            0x04 => u64::from(self.liveness),
            _ => 0,
        }
    }
    fn write(&mut self, offset: usize, width: AccessWidth, value: u64) {
        if offset < 0x80 && width != AccessWidth::U32 {
            self.bad_width_accesses += 1;
            return;
        }
        if offset == 0x04 {
            self.liveness = value as u32;
            self.liveness_writes.push(value as u32);
        }
    }
}

fn bdf(b: u8, d: u8, f: u8) -> Bdf {
    Bdf::new(b, d, f).unwrap()
}

#[test]
fn bdf_and_ecam_offsets() {
    assert_eq!(Bdf::new(0, 32, 0), None);
    assert_eq!(Bdf::new(0, 0, 8), None);
    assert_eq!(bdf(0, 2, 0).requester_id(), 0x10); // edu,addr=2 -> StreamID 0x10 on virt
    assert_eq!(bdf(0x12, 0x1f, 7).to_string(), "12:1f.7");
    let bus = ModelBus::new(FakeEcam::new(256));
    let ecam = Ecam::new(&bus, 0, 255).unwrap();
    assert_eq!(ecam.offset(bdf(1, 2, 3)).unwrap(), 0x11_3000);
    let ecam = Ecam::new(&bus, 0x10, 0x20).unwrap();
    assert_eq!(ecam.offset(bdf(0x11, 0, 0)).unwrap(), 0x10_0000);
    assert!(matches!(
        ecam.offset(bdf(0x0f, 0, 0)),
        Err(FirmwareError::PciAddressOutOfRange { bus: 0x0f, .. })
    ));
    // A 16 MiB window decodes 16 buses whatever bus-range says (the low-ECAM case).
    let small = ModelBus::new(FakeEcam::new(16));
    let ecam = Ecam::new(&small, 0, 255).unwrap();
    assert_eq!(ecam.last_bus(), 15);
    assert!(ecam.header(bdf(16, 0, 0)).is_err());
    assert!(Ecam::new(&small, 5, 4).is_err());
}

#[test]
fn enumerates_the_virt_topology() {
    let bus = ModelBus::new(virt_like());
    let ecam = Ecam::new(&bus, 0, 255).unwrap();
    let found = enumerate(&ecam).unwrap();
    let summary: Vec<_> = found
        .iter()
        .map(|f| {
            (
                f.bdf,
                f.vendor_id,
                f.device_id,
                f.class,
                f.subclass,
                f.header_layout,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (bdf(0, 0, 0), 0x1b36, 0x0008, 0x06, 0x00, 0),
            (bdf(0, 2, 0), 0x1234, 0x11e8, 0x00, 0xff, 0),
        ]
    );
    assert_eq!(
        found[1].to_string(),
        "00:02.0 1234:11e8 class 00ff00 (unclassified) rev 10"
    );
}

#[test]
fn enumeration_follows_bridges_and_multifunction_rules() {
    let mut m = FakeEcam::new(256);
    m.add(0, 0, 0, host_bridge());
    // Multi-function device: functions 0 and 2 (function 1 absent).
    m.add(
        0,
        3,
        0,
        FakeFunction::new(0x8086, 0x1000, [0x02, 0, 0], 0x80),
    )
    .add(
        0,
        3,
        2,
        FakeFunction::new(0x8086, 0x1001, [0x02, 0, 0], 0x00),
    );
    // Single-function device that also answers on function 1: must not be listed.
    m.add(
        0,
        5,
        0,
        FakeFunction::new(0x1af4, 0x1041, [0x02, 0, 0], 0x00),
    )
    .add(
        0,
        5,
        1,
        FakeFunction::new(0x1af4, 0x1041, [0x02, 0, 0], 0x00),
    );
    let outer = m.add_bridge(0, 4);
    let inner = m.add_bridge(outer, 0);
    m.add(inner, 0, 0, edu_function());
    m.add(
        outer,
        1,
        0,
        FakeFunction::new(0x1b36, 0x000d, [0x0c, 0x03, 0x30], 0),
    );
    let bus = ModelBus::new(m);
    let ecam = Ecam::new(&bus, 0, 255).unwrap();
    let found = enumerate(&ecam).unwrap();
    let order: Vec<_> = found.iter().map(|f| (f.bdf, f.upstream, f.buses)).collect();
    assert_eq!(
        order,
        [
            (bdf(0, 0, 0), None, None),
            (bdf(0, 3, 0), None, None),
            (bdf(0, 3, 2), None, None),
            (bdf(0, 4, 0), None, Some((1, 2))),
            (bdf(1, 0, 0), Some(3), Some((2, 2))),
            (bdf(2, 0, 0), Some(4), None),
            (bdf(1, 1, 0), Some(3), None),
            (bdf(0, 5, 0), None, None),
        ]
    );
    let mut m = bus.into_inner();
    let outer = m.at(0, 4, 0).config;
    assert_eq!((outer[0x18], outer[0x19], outer[0x1a]), (0, 1, 2));
    let inner = m.at(1, 0, 0).config;
    assert_eq!((inner[0x18], inner[0x19], inner[0x1a]), (1, 2, 2));
}

#[test]
fn bus_numbers_and_list_capacity_are_bounded() {
    // Bus range 0-1 but two bridges need buses 1 and 2.
    let mut m = FakeEcam::new(2);
    m.add_bridge(0, 1);
    m.add_bridge(0, 2);
    let bus = ModelBus::new(m);
    let ecam = Ecam::new(&bus, 0, 1).unwrap();
    assert_eq!(
        enumerate(&ecam),
        Err(FirmwareError::PciBusNumbersExhausted {
            bridge: bdf(0, 2, 0)
        })
    );

    // 8 multi-function devices x 8 functions + 1 = 65 functions.
    let mut m = FakeEcam::new(1);
    for d in 0..9 {
        for f in 0..8 {
            m.add(
                0,
                d,
                f,
                FakeFunction::new(0x8086, 0x1000, [0x02, 0, 0], 0x80),
            );
        }
    }
    let bus = ModelBus::new(m);
    let ecam = Ecam::new(&bus, 0, 0).unwrap();
    assert_eq!(
        enumerate(&ecam),
        Err(FirmwareError::PciTooManyFunctions {
            capacity: MAX_FUNCTIONS
        })
    );
}

#[test]
fn bar_sizing_reads_the_mask_with_decoding_off_and_restores_state() {
    let mut m = FakeEcam::new(1);
    let f = FakeFunction::new(0x1234, 0x5678, [0xff, 0, 0], 0)
        .mem32(0, 1 << 20)
        .mem64_prefetchable(2, 1 << 34)
        .io16(4, 32);
    m.add(0, 1, 0, f);
    let bus = ModelBus::new(m);
    let ecam = Ecam::new(&bus, 0, 0).unwrap();
    let d = bdf(0, 1, 0);
    let h = ecam.header(d).unwrap();
    // Give BAR0 an address and turn decoding on first: sizing must not disturb either.
    h.bar(0).unwrap().set(0x1230_0000);
    h.command().set(0x0007);

    assert_eq!(
        size_bar(&h, d, 0).unwrap(),
        Some(Bar {
            index: 0,
            kind: BarKind::Memory32 {
                prefetchable: false
            },
            size: 1 << 20
        })
    );
    assert_eq!(
        size_bar(&h, d, 2).unwrap(),
        Some(Bar {
            index: 2,
            kind: BarKind::Memory64 { prefetchable: true },
            size: 1 << 34
        })
    );
    assert_eq!(
        size_bar(&h, d, 4).unwrap(),
        Some(Bar {
            index: 4,
            kind: BarKind::Io,
            size: 32
        })
    );
    assert_eq!(size_bar(&h, d, 1).unwrap(), None);
    assert_eq!(
        size_bar(&h, d, 6),
        Err(FirmwareError::PciBarIndex { bdf: d, index: 6 })
    );
    assert_eq!(h.bar(0).unwrap().get(), 0x1230_0000, "BAR restored");
    assert_eq!(h.command().get(), 0x0007, "command restored");
    assert_eq!(bus.lock().bars_sized_while_decoding, 0);
}

#[test]
fn an_io_bar_without_address_bits_is_not_implemented() {
    // Only the I/O flag reads back: no address bit is writable, so there is no range to
    // decode (PCI Local Bus spec 3.0 §6.2.5.1), not a 64 KiB one.
    let mut m = FakeEcam::new(1);
    let mut f = FakeFunction::new(0x1234, 0x5678, [0xff, 0, 0], 0).io16(1, 256);
    f.bar_flags[0] = 0b01;
    f.bar_masks[0] = 0;
    m.add(0, 1, 0, f);
    let bus = ModelBus::new(m);
    let ecam = Ecam::new(&bus, 0, 0).unwrap();
    let d = bdf(0, 1, 0);
    let h = ecam.header(d).unwrap();
    assert_eq!(size_bar(&h, d, 0).unwrap(), None);
    // A real 16-bit decoder beside it is still sized from its low bits.
    assert_eq!(
        size_bar(&h, d, 1).unwrap(),
        Some(Bar {
            index: 1,
            kind: BarKind::Io,
            size: 256
        })
    );
}

#[test]
fn a_64_bit_bar_in_the_last_slot_is_an_error() {
    let mut m = FakeEcam::new(1);
    let mut f = FakeFunction::new(0x1234, 0x5678, [0xff, 0, 0], 0);
    f.bar_masks[5] = 0xfff0_0000;
    f.bar_flags[5] = 0b0100;
    m.add(0, 1, 0, f);
    let bus = ModelBus::new(m);
    let ecam = Ecam::new(&bus, 0, 0).unwrap();
    let d = bdf(0, 1, 0);
    assert_eq!(
        size_bar(&ecam.header(d).unwrap(), d, 5),
        Err(FirmwareError::PciBarIndex { bdf: d, index: 6 })
    );
}

#[test]
fn assignment_is_naturally_aligned_and_checked() {
    let mut m = FakeEcam::new(1);
    m.add(
        0,
        1,
        0,
        FakeFunction::new(1, 1, [0, 0, 0], 0).mem32(0, 64 << 10),
    );
    m.add(0, 2, 0, edu_function());
    m.add(0, 3, 0, FakeFunction::new(1, 3, [0, 0, 0], 0).io16(0, 32));
    let mut stuck = edu_function();
    stuck.bars_stuck = true;
    m.add(0, 4, 0, stuck);
    let bus = ModelBus::new(m);
    let ecam = Ecam::new(&bus, 0, 0).unwrap();
    let mut alloc = MmioAllocator::new(virt_window());

    let small = assign_bar32(
        &ecam.header(bdf(0, 1, 0)).unwrap(),
        bdf(0, 1, 0),
        0,
        &mut alloc,
    )
    .unwrap();
    assert_eq!(
        small.at,
        Allocation {
            pci: 0x1000_0000,
            cpu: 0x1000_0000
        }
    );
    let big = assign_bar32(
        &ecam.header(bdf(0, 2, 0)).unwrap(),
        bdf(0, 2, 0),
        0,
        &mut alloc,
    )
    .unwrap();
    // 1 MiB must be 1 MiB aligned: after the 64 KiB BAR the next slot is 0x1010_0000.
    assert_eq!(big.at.pci, 0x1010_0000);
    assert_eq!(bus.lock().at(0, 2, 0).bar(0), 0x1010_0000);

    assert_eq!(
        assign_bar32(
            &ecam.header(bdf(0, 3, 0)).unwrap(),
            bdf(0, 3, 0),
            0,
            &mut alloc
        ),
        Err(FirmwareError::PciUnexpectedBarKind {
            bdf: bdf(0, 3, 0),
            index: 0,
            found: "I/O"
        })
    );
    let before = alloc.clone().allocate(16).unwrap();
    // The stuck BAR reads 0 after sizing (its mask never lands), so it looks unimplemented.
    assert_eq!(
        assign_bar32(
            &ecam.header(bdf(0, 4, 0)).unwrap(),
            bdf(0, 4, 0),
            0,
            &mut alloc
        ),
        Err(FirmwareError::PciBarNotImplemented {
            bdf: bdf(0, 4, 0),
            index: 0
        })
    );
    assert_eq!(
        alloc.clone().allocate(16).unwrap(),
        before,
        "failed assignment used no space"
    );
}

#[test]
fn bar_that_does_not_take_its_address_is_reported() {
    let mut m = FakeEcam::new(1);
    m.add(0, 2, 0, edu_function());
    let bus = ModelBus::new(m);
    let ecam = Ecam::new(&bus, 0, 0).unwrap();
    let d = bdf(0, 2, 0);
    let h = ecam.header(d).unwrap();
    // Shrink the mask after sizing would have seen 1 MiB: the address's bit 20 is dropped.
    let mut alloc = MmioAllocator::new(PciWindow {
        cpu_base: 0x1010_0000,
        pci_base: 0x1010_0000,
        size: 1 << 20,
        prefetchable: false,
    });
    bus.lock().at(0, 2, 0).bar_masks[0] = 0xffe0_0000;
    // Sizing now says 2 MiB, which does not fit the 1 MiB window.
    assert_eq!(
        assign_bar32(&h, d, 0, &mut alloc),
        Err(FirmwareError::PciWindowExhausted { size: 2 << 20 })
    );
    // A register that keeps fewer address bits than its size mask claims (broken device).
    bus.lock().at(0, 2, 0).bar_masks[0] = 0xfff0_0000;
    struct Lossy<'a>(&'a ModelBus<FakeEcam>, Cell<bool>);
    impl RegisterBus for Lossy<'_> {
        fn read(&self, offset: usize, width: AccessWidth) -> u64 {
            self.0.read(offset, width)
        }
        fn write(&self, offset: usize, width: AccessWidth, value: u64) {
            // After the sizing write, drop bit 20 of addresses written to BAR0.
            let value = if offset == 0x1_0000 + 0x10 && value != u64::from(u32::MAX) && self.1.get()
            {
                value & !(1 << 20)
            } else {
                value
            };
            if offset == 0x1_0000 + 0x10 && value == u64::from(u32::MAX) {
                self.1.set(true);
            }
            self.0.write(offset, width, value)
        }
        fn size(&self) -> usize {
            self.0.size()
        }
    }
    let lossy = Lossy(&bus, Cell::new(false));
    let ecam = Ecam::new(&lossy, 0, 0).unwrap();
    let h = ecam.header(d).unwrap();
    assert_eq!(
        assign_bar32(&h, d, 0, &mut alloc),
        Err(FirmwareError::PciBarReadback {
            bdf: d,
            index: 0,
            wrote: 0x1010_0000,
            read: 0x1000_0000
        })
    );
}

#[test]
fn enable_sets_memory_and_bus_master_and_checks_them() {
    let mut m = FakeEcam::new(1);
    m.add(0, 2, 0, edu_function());
    let mut deaf = edu_function();
    deaf.command_stuck = true;
    m.add(0, 3, 0, deaf);
    let bus = ModelBus::new(m);
    let ecam = Ecam::new(&bus, 0, 0).unwrap();
    assert_eq!(
        enable(&ecam.header(bdf(0, 2, 0)).unwrap(), bdf(0, 2, 0)),
        Ok(0x0006)
    );
    assert_eq!(bus.lock().at(0, 2, 0).command(), 0x0006);
    assert_eq!(
        enable(&ecam.header(bdf(0, 3, 0)).unwrap(), bdf(0, 3, 0)),
        Err(FirmwareError::PciCommandReadback {
            bdf: bdf(0, 3, 0),
            wanted: 0x0006,
            read: 0
        })
    );
}

#[test]
fn edu_probe_on_virt() {
    let bus = ModelBus::new(virt_like());
    let ecam = Ecam::new(&bus, 0, 255).unwrap();
    let mut alloc = MmioAllocator::new(virt_window());
    let edu_bus = ModelBus::new(EduModel::new());
    let mut lines = Vec::new();
    let mut opened = None;
    let report = edu::probe(&ecam, &mut alloc, &mut |l| lines.push(l), |cpu, size| {
        opened = Some((cpu, size));
        Ok(&edu_bus)
    })
    .unwrap();
    assert_eq!(opened, Some((0x1000_0000, 1 << 20)));
    assert_eq!(report.function.bdf, bdf(0, 2, 0));
    assert_eq!(report.identification, 0x0100_00ed);
    assert_eq!(report.liveness_checks, 6);
    assert_eq!(report.command & 0x6, 0x6);
    assert_eq!(
        report.to_string(),
        "edu 1234:11e8 at 00:02.0, BAR0 0x10000000 (1024 KiB), id 0x010000ed, liveness 6/6"
    );
    let edu = edu_bus.into_inner();
    assert_eq!(edu.bad_width_accesses, 0);
    assert_eq!(edu.liveness_writes, edu::LIVENESS_PATTERNS);
    let mut m = bus.into_inner();
    assert_eq!(m.at(0, 2, 0).bar(0), 0x1000_0000);
    assert_eq!(m.at(0, 2, 0).command(), 0x0006);
    let log: String = lines.iter().map(|l| format!("{l}\n")).collect();
    assert!(log.contains("00:02.0 1234:11e8 class 00ff00"), "{log}");
    assert!(
        log.contains("00:00.0 1b36:0008 class 060000 (host bridge)"),
        "{log}"
    );
    assert_eq!(lines.len(), 6, "{log}");
    assert_eq!(
        lines[5],
        edu::ProbeLine::Checked {
            identification: 0x0100_00ed,
            liveness_checks: 6
        }
    );
    assert!(
        log.ends_with("edu: identification 0x010000ed, liveness 6 patterns\n"),
        "{log}"
    );
}

#[test]
fn edu_probe_behind_bridges_opens_their_windows() {
    let mut m = FakeEcam::new(256);
    m.add(0, 0, 0, host_bridge());
    let outer = m.add_bridge(0, 1);
    let inner = m.add_bridge(outer, 0);
    m.add(inner, 0, 0, edu_function());
    let bus = ModelBus::new(m);
    let ecam = Ecam::new(&bus, 0, 255).unwrap();
    let mut alloc = MmioAllocator::new(virt_window());
    let edu_bus = ModelBus::new(EduModel::new());
    let report = edu::probe(&ecam, &mut alloc, &mut |_| {}, |_, _| Ok(&edu_bus)).unwrap();
    assert_eq!(report.function.bdf, bdf(2, 0, 0));
    assert_eq!(report.function.bdf.requester_id(), 0x200);
    let mut m = bus.into_inner();
    for (b, d) in [(0, 1), (1, 0)] {
        let c = m.at(b, d, 0).config;
        // Window 0x1000_0000..=0x100f_ffff: base and limit hold address bits 31:20.
        assert_eq!(u16::from_le_bytes([c[0x20], c[0x21]]), 0x1000, "{b}:{d}");
        assert_eq!(u16::from_le_bytes([c[0x22], c[0x23]]), 0x1000, "{b}:{d}");
        assert_eq!(m.at(b, d, 0).command() & 0x6, 0x6);
    }
}

#[test]
fn edu_probe_failures_are_typed() {
    let run = |edu: EduModel, ecam_model: FakeEcam| {
        let bus = ModelBus::new(ecam_model);
        let ecam = Ecam::new(&bus, 0, 255).unwrap();
        let mut alloc = MmioAllocator::new(virt_window());
        let edu_bus = ModelBus::new(edu);
        edu::probe(&ecam, &mut alloc, &mut |_| {}, |_, _| Ok(&edu_bus))
    };
    let mut not_inverting = EduModel::new();
    not_inverting.inverts = false;
    assert_eq!(
        run(not_inverting, virt_like()),
        Err(FirmwareError::EduLiveness {
            wrote: 0,
            read: 0,
            expected: 0xffff_ffff
        })
    );
    let mut other = EduModel::new();
    other.identification = 0x0200_00ed;
    assert_eq!(
        run(other, virt_like()),
        Err(FirmwareError::EduIdentification {
            found: 0x0200_00ed,
            expected: 0x0100_00ed
        })
    );
    let mut empty = FakeEcam::new(256);
    empty.add(0, 0, 0, host_bridge());
    assert_eq!(
        run(EduModel::new(), empty),
        Err(FirmwareError::PciDeviceNotFound {
            vendor: 0x1234,
            device: 0x11e8
        })
    );
}

#[test]
fn host_bridge_from_the_qemu_device_tree() {
    let fdt = Fdt::new(VIRT_DTB).unwrap();
    let host = host_from_fdt(&fdt).unwrap().unwrap();
    // QEMU 7.2 hw/arm/virt.c: high ECAM, 32-bit MMIO window, PIO window, high MMIO window.
    assert_eq!(host.ecam, MemRegion::new(0x40_1000_0000, 0x1000_0000));
    assert_eq!((host.first_bus, host.last_bus), (0, 255));
    assert_eq!(host.mmio32, Some(virt_window()));
    assert_eq!(
        host.io,
        Some(PciWindow {
            cpu_base: 0x3eff_0000,
            pci_base: 0,
            size: 0x1_0000,
            prefetchable: false
        })
    );
    assert_eq!(
        host.mmio64,
        Some(PciWindow {
            cpu_base: 0x80_0000_0000,
            pci_base: 0x80_0000_0000,
            size: 0x80_0000_0000,
            prefetchable: false
        })
    );
}

#[test]
fn malformed_host_bridge_nodes_are_errors() {
    let tree = |bus_range: &[u32], ranges: &[u32], address_cells: u32| {
        let mut b = Builder::default();
        b.begin("")
            .prop_cells("#address-cells", &[2])
            .prop_cells("#size-cells", &[2])
            .begin("pcie@0")
            .prop("compatible", b"pci-host-ecam-generic\0")
            .prop_cells("#address-cells", &[address_cells])
            .prop_cells("#size-cells", &[2])
            .prop_cells("reg", &[0, 0x3f00_0000, 0, 0x100_0000]);
        if !bus_range.is_empty() {
            b.prop_cells("bus-range", bus_range);
        }
        b.prop_cells("ranges", ranges).end().end().finish()
    };
    // A well-formed low-ECAM node with no bus-range, a prefetchable 32-bit window first
    // (phys.hi bit 30) and a non-identity non-prefetchable one second.
    let ok = tree(
        &[],
        &[
            0x4200_0000,
            0,
            0x3000_0000,
            0,
            0x3000_0000,
            0,
            0x100_0000, //
            0x0200_0000,
            0,
            0,
            0,
            0x2000_0000,
            0,
            0x100_0000,
        ],
        3,
    );
    let host = host_from_fdt(&Fdt::new(&ok).unwrap()).unwrap().unwrap();
    assert_eq!((host.first_bus, host.last_bus), (0, 255));
    assert_eq!(
        host.mmio32,
        Some(PciWindow {
            cpu_base: 0x2000_0000,
            pci_base: 0,
            size: 0x100_0000,
            prefetchable: false
        })
    );
    let bad_bus_range = tree(&[5, 4], &[], 3);
    assert_eq!(
        host_from_fdt(&Fdt::new(&bad_bus_range).unwrap()),
        Err(FirmwareError::FdtBadProperty { name: "bus-range" })
    );
    let short_ranges = tree(&[0, 15], &[0x0200_0000, 0, 0], 3);
    assert_eq!(
        host_from_fdt(&Fdt::new(&short_ranges).unwrap()),
        Err(FirmwareError::FdtBadProperty { name: "ranges" })
    );
    let wrong_cells = tree(&[0, 15], &[], 2);
    assert_eq!(
        host_from_fdt(&Fdt::new(&wrong_cells).unwrap()),
        Err(FirmwareError::FdtBadProperty { name: "ranges" })
    );
    let none = Builder::default().begin("").end().finish();
    assert_eq!(host_from_fdt(&Fdt::new(&none).unwrap()), Ok(None));
}

#[test]
fn allocator_maps_pci_to_cpu_addresses_and_refuses_overflow() {
    let mut alloc = MmioAllocator::new(PciWindow {
        cpu_base: 0x1_0000_0000,
        pci_base: 0x8000,
        size: 0x2_0000,
        prefetchable: false,
    });
    // Window 0x8000..0x2_8000 on the PCI side; 64 KiB alignment skips to 0x1_0000.
    let a = alloc.allocate(0x1_0000).unwrap();
    assert_eq!(
        a,
        Allocation {
            pci: 0x1_0000,
            cpu: 0x1_0000_8000
        }
    );
    assert_eq!(
        alloc.allocate(0x1_0000),
        Err(FirmwareError::PciWindowExhausted { size: 0x1_0000 })
    );
    assert_eq!(
        alloc.allocate(0x4000).unwrap(),
        Allocation {
            pci: 0x2_0000,
            cpu: 0x1_0001_8000
        }
    );
    let mut huge = MmioAllocator::new(PciWindow {
        cpu_base: 0,
        pci_base: u64::MAX - 0x10,
        size: 0x10,
        prefetchable: false,
    });
    assert!(huge.allocate(u64::MAX).is_err());
    assert!(huge.allocate(0x100).is_err());
}

proptest! {
    /// Every successful allocation is naturally aligned, inside the window and disjoint from
    /// the others; a failed one changes nothing.
    #[test]
    fn allocations_are_aligned_disjoint_and_inside(
        shifts in proptest::collection::vec(4u32..24, 1..40),
        base_mb in 0u64..64,
        size_mb in 1u64..64,
    ) {
        let window = PciWindow {
            cpu_base: 0x4000_0000 + base_mb * (1 << 20),
            pci_base: base_mb * (1 << 20),
            size: size_mb * (1 << 20),
            prefetchable: false,
        };
        let mut alloc = MmioAllocator::new(window);
        let mut taken: Vec<(u64, u64)> = Vec::new();
        for shift in shifts {
            let size = 1u64 << shift;
            let snapshot = alloc.clone();
            match alloc.allocate(size) {
                Ok(a) => {
                    prop_assert_eq!(a.pci % size, 0);
                    prop_assert!(a.pci >= window.pci_base);
                    prop_assert!(a.pci + size <= window.pci_base + window.size);
                    prop_assert_eq!(a.cpu - window.cpu_base, a.pci - window.pci_base);
                    for &(s, l) in &taken {
                        prop_assert!(a.pci + size <= s || s + l <= a.pci);
                    }
                    taken.push((a.pci, size));
                }
                Err(_) => {
                    prop_assert_eq!(alloc.clone().allocate(16).ok(), snapshot.clone().allocate(16).ok());
                }
            }
        }
    }
}
