//! The register seam end to end: a driver written with tock-registers fields talks to a device
//! model through the bus, and the model implements what plain memory cannot.

use std::sync::Arc;

use hal::barrier::Barrier;
use hal::dma::{DmaDirection, DmaMemory, HostDma};
use hal::journal::{self, Event};
use hal::model::{ModelBus, RecordingBus, RegisterModel};
use hal::regs::{AccessWidth, RegisterBus};
use hal::{PhysAddr, register_block};
use tock_registers::interfaces::{ReadWriteable, Readable, Writeable};
use tock_registers::register_bitfields;

register_bitfields![u32,
    /// Control.
    CTRL [
        /// Enable.
        EN OFFSET(0) NUMBITS(1) [],
        /// Interrupt enable.
        IE OFFSET(1) NUMBITS(1) [],
    ],
    /// Status: DONE and ERR are write-1-to-clear; BUSY is read-only.
    STATUS [
        /// A copy finished.
        DONE OFFSET(0) NUMBITS(1) [],
        /// A copy failed.
        ERR OFFSET(1) NUMBITS(1) [],
        /// A copy is running (read-only).
        BUSY OFFSET(8) NUMBITS(1) [],
    ],
];

register_block! {
    /// A toy copy engine: copies LEN bytes from SRC to DST when DOORBELL is written.
    struct CopyEngine {
        /// Identification, read-only.
        (0x00 => id: Ro u32),
        /// Control.
        (0x04 => ctrl: Rw u32, CTRL::Register),
        /// Status.
        (0x08 => status: Rw u32, STATUS::Register),
        /// Source physical address.
        (0x10 => src: Rw u64),
        /// Destination physical address.
        (0x18 => dst: Rw u64),
        /// Length in bytes.
        (0x20 => len: Rw u32),
        /// Doorbell: any write starts a copy.
        (0x24 => doorbell: Wo u32),
        /// Per-channel scratch registers.
        (0x40 => scratch: [Rw u32; 4, stride 4]),
    }
    size = 0x100;
}

const ID: u32 = 0x00c0_ffee;

/// The device model.
struct CopyEngineModel {
    mem: Arc<HostDma>,
    ctrl: u32,
    status: u32,
    src: u64,
    dst: u64,
    len: u32,
    scratch: [u32; 4],
    /// Doorbells rung without a store barrier since the last one: a driver bug on silicon
    /// (the engine may read stale descriptors).
    unordered_doorbells: u32,
    barrier_since_doorbell: bool,
}

impl RegisterModel for CopyEngineModel {
    fn size(&self) -> usize {
        0x100
    }

    fn read(&mut self, offset: usize, _width: AccessWidth) -> u64 {
        match offset {
            0x00 => u64::from(ID),
            0x04 => u64::from(self.ctrl),
            0x08 => u64::from(self.status),
            0x10 => self.src,
            0x18 => self.dst,
            0x20 => u64::from(self.len),
            0x40..0x50 => u64::from(self.scratch[(offset - 0x40) / 4]),
            _ => 0,
        }
    }

    fn write(&mut self, offset: usize, _width: AccessWidth, value: u64) {
        let v = value as u32;
        match offset {
            0x04 => self.ctrl = v & 0b11,
            // W1C for DONE/ERR; BUSY is read-only.
            0x08 => self.status &= !(v & 0b11),
            0x10 => self.src = value,
            0x18 => self.dst = value,
            0x20 => self.len = v,
            0x24 => self.ring(),
            0x40..0x50 => self.scratch[(offset - 0x40) / 4] = v,
            _ => {}
        }
    }

    fn barrier(&mut self, kind: Barrier) {
        if matches!(kind, Barrier::DsbSt | Barrier::DsbSy) {
            self.barrier_since_doorbell = true;
        }
    }
}

impl CopyEngineModel {
    fn ring(&mut self) {
        if !self.barrier_since_doorbell {
            self.unordered_doorbells += 1;
        }
        self.barrier_since_doorbell = false;
        if self.ctrl & 1 == 0 {
            return;
        }
        let mut buf = vec![0u8; self.len as usize];
        let ok = self
            .mem
            .read_phys(PhysAddr::new(self.src), &mut buf)
            .is_ok()
            && self.mem.write_phys(PhysAddr::new(self.dst), &buf).is_ok();
        self.status |= if ok { 0b01 } else { 0b10 };
    }
}

fn setup() -> (Arc<HostDma>, ModelBus<CopyEngineModel>) {
    let mem = Arc::new(HostDma::new(PhysAddr::new(0x4000_0000), 64).unwrap());
    let model = CopyEngineModel {
        mem: mem.clone(),
        ctrl: 0,
        status: 0x100,
        src: 0,
        dst: 0,
        len: 0,
        scratch: [0; 4],
        unordered_doorbells: 0,
        barrier_since_doorbell: false,
    };
    (mem, ModelBus::new(model))
}

/// The "driver": publish the buffer, barrier, program the engine, ring.
fn copy<B: RegisterBus>(
    regs: &CopyEngine<'_, B>,
    src: PhysAddr,
    dst: PhysAddr,
    len: u32,
    with_barrier: bool,
) {
    regs.ctrl().modify(CTRL::EN::SET);
    regs.src().set(src.as_u64());
    regs.dst().set(dst.as_u64());
    regs.len().set(len);
    if with_barrier {
        regs.barrier(Barrier::DsbSt);
    }
    regs.doorbell().set(1);
}

#[test]
fn doorbell_triggers_work_and_status_is_w1c() {
    let (mem, bus) = setup();
    let regs = CopyEngine::new(&bus, 0).unwrap();
    assert_eq!(regs.id().get(), ID);

    let a = mem.allocate(1, DmaDirection::ToDevice).unwrap();
    let b = mem.allocate(1, DmaDirection::FromDevice).unwrap();
    a.write_bytes(0, b"through the seam").unwrap();
    copy(&regs, a.bus_addr(), b.bus_addr(), 16, true);

    let mut out = [0u8; 16];
    b.read_bytes(0, &mut out).unwrap();
    assert_eq!(&out, b"through the seam");
    assert!(regs.status().is_set(STATUS::DONE));
    assert!(regs.status().is_set(STATUS::BUSY));

    // Writing 0 to a W1C bit changes nothing; writing 1 clears it; the read-only bit survives.
    regs.status().write(STATUS::DONE::CLEAR);
    assert!(regs.status().is_set(STATUS::DONE));
    regs.status().write(STATUS::DONE::SET);
    assert!(!regs.status().is_set(STATUS::DONE));
    assert!(regs.status().is_set(STATUS::BUSY), "BUSY is read-only");
}

#[test]
fn read_modify_write_on_a_w1c_register_clears_more_than_intended() {
    // The pitfall the seam makes visible: `modify` on a W1C register writes back every bit
    // that read as 1, clearing events the driver never handled.
    let (mem, bus) = setup();
    let regs = CopyEngine::new(&bus, 0).unwrap();
    let a = mem.allocate(1, DmaDirection::Bidirectional).unwrap();
    copy(&regs, a.bus_addr(), a.bus_addr(), 8, true); // DONE
    copy(&regs, PhysAddr::new(0x1000), a.bus_addr(), 8, true); // ERR: source outside DRAM
    assert!(
        regs.status()
            .matches_all(STATUS::DONE::SET + STATUS::ERR::SET)
    );

    regs.status().modify(STATUS::DONE::SET); // meant: clear DONE only
    assert!(!regs.status().is_set(STATUS::ERR), "RMW also cleared ERR");

    copy(&regs, a.bus_addr(), a.bus_addr(), 8, true);
    copy(&regs, PhysAddr::new(0x1000), a.bus_addr(), 8, true);
    regs.status().write(STATUS::DONE::SET); // the right way: an explicit mask
    assert!(regs.status().is_set(STATUS::ERR), "plain write kept ERR");
}

#[test]
fn read_only_register_ignores_writes_and_arrays_are_bounded() {
    let (_mem, bus) = setup();
    bus.write(0x00, AccessWidth::U32, 0x1234);
    let regs = CopyEngine::new(&bus, 0).unwrap();
    assert_eq!(regs.id().get(), ID);
    regs.scratch(3).unwrap().set(0xabcd);
    assert_eq!(regs.scratch(3).unwrap().get(), 0xabcd);
    assert_eq!(bus.lock().scratch[3], 0xabcd);
    assert!(matches!(
        regs.scratch(4),
        Err(hal::HalError::RegisterIndex { index: 4, count: 4 })
    ));
}

#[test]
fn block_must_fit_its_window() {
    let (_mem, bus) = setup();
    assert!(CopyEngine::new(&bus, 0).is_ok());
    assert!(matches!(
        CopyEngine::new(&bus, 8),
        Err(hal::HalError::BlockOutsideWindow { .. })
    ));
    assert!(CopyEngine::new(&bus, usize::MAX).is_err());
}

register_block! {
    /// A 32-bit and a 64-bit register.
    struct Mixed {
        (0x00 => narrow: Rw u32),
        (0x08 => wide: Rw u64),
    }
    size = 0x10;
}

register_block! {
    /// 32-bit registers only.
    struct Narrow {
        (0x00 => first: Rw u32),
        (0x04 => second: Rw u32),
    }
    size = 0x8;
}

#[test]
fn a_base_must_keep_the_widest_register_aligned() {
    let (_mem, bus) = setup();
    assert_eq!(Mixed::<ModelBus<CopyEngineModel>>::ALIGN, 8);
    assert!(matches!(
        Mixed::new(&bus, 0x44),
        Err(hal::HalError::Misaligned {
            value: 0x44,
            align: 8
        })
    ));
    assert!(Mixed::new(&bus, 0x48).is_ok());
    // A block of 32-bit registers may sit at any 4-byte boundary.
    let narrow = Narrow::new(&bus, 0x44).unwrap();
    narrow.second().set(3);
    assert_eq!(narrow.second().get(), 3);
    assert!(matches!(
        Narrow::new(&bus, 0x42),
        Err(hal::HalError::Misaligned {
            value: 0x42,
            align: 4
        })
    ));
}

#[test]
fn journal_shows_barrier_before_doorbell() {
    let (mem, model) = setup();
    let bus = RecordingBus::new("copy", &model);
    let regs = CopyEngine::new(&bus, 0).unwrap();
    let a = mem.allocate(1, DmaDirection::Bidirectional).unwrap();

    journal::start();
    copy(&regs, a.bus_addr(), a.bus_addr(), 8, true);
    let events = journal::stop();
    let barrier = events
        .iter()
        .position(|e| *e == Event::Barrier(Barrier::DsbSt))
        .unwrap();
    let doorbell = events
        .iter()
        .position(|e| {
            matches!(
                e,
                Event::Write {
                    bus: "copy",
                    offset: 0x24,
                    ..
                }
            )
        })
        .unwrap();
    assert!(barrier < doorbell, "{events:#?}");
    assert_eq!(model.lock().unordered_doorbells, 0);

    // Without the barrier the model notices, as a stale descriptor fetch would on silicon.
    copy(&regs, a.bus_addr(), a.bus_addr(), 8, false);
    assert_eq!(model.lock().unordered_doorbells, 1);
}

#[test]
fn device_plays_in_another_thread() {
    // virtio-drivers style: the test thread drives, a device thread completes work.
    let (mem, bus) = setup();
    let bus = Arc::new(bus);
    let a = mem.allocate(1, DmaDirection::Bidirectional).unwrap();
    a.write_bytes(0, &[7u8; 64]).unwrap();
    let dst = a.bus_addr().checked_add(2048).unwrap();

    let device = {
        let bus = bus.clone();
        std::thread::spawn(move || {
            // The "hardware" clears BUSY once it is enabled.
            for _ in 0..10_000 {
                let mut m = bus.lock();
                if m.ctrl & 1 == 1 {
                    m.status &= !0x100;
                    return true;
                }
                drop(m);
                std::thread::yield_now();
            }
            false
        })
    };
    let regs = CopyEngine::new(&*bus, 0).unwrap();
    regs.ctrl().write(CTRL::EN::SET);
    let mut delay = hal::delay::NoDelay::default();
    let waited = hal::delay::poll_until(&mut delay, 10_000_000, 1, || {
        !regs.status().is_set(STATUS::BUSY)
    });
    assert!(device.join().unwrap());
    assert!(waited.is_ok());
    copy(&regs, a.bus_addr(), dst, 64, true);
    let mut out = [0u8; 64];
    a.read_bytes(2048, &mut out).unwrap();
    assert_eq!(out, [7u8; 64]);
}
