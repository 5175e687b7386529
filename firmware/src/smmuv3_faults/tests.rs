//! The `smmuv3-faults` logic on the host: the SMMUv3 model of `smmu-driver` and an edu model
//! that does its DMA through it, as QEMU 7.2's edu does (hw/misc/edu.c).

use std::cell::Cell;
use std::sync::Arc;
use std::vec;
use std::vec::Vec;

use hal::delay::NoDelay;
use hal::dma::HostDma;
use hal::model::{ModelBus, RegisterModel};
use hal::regs::AccessWidth;
use hal::{PageSize, PhysAddr};
use smmu_driver::fault::{FaultCost, FaultResolver, ResolveError};
use smmu_driver::v3::model::Smmuv3Model;

use super::*;

const SID: u32 = 0x10;

/// edu's DMA engine: on a write of the command register with bit 0 set, the transfer runs
/// at once through the SMMU model, RUN (bit 0) clears and, with bit 2, interrupt status
/// 0x100 is raised. While RUN is set, the address/count/command registers ignore writes.
/// The buffer-side range check is QEMU 7.2's: a transfer that reaches the last byte of the
/// buffer aborts QEMU (here: panics the test). A `stuck` edu starts a DMA and never ends it.
struct EduModel {
    smmu: Arc<ModelBus<Smmuv3Model>>,
    buffer: [u8; 4096],
    source: u64,
    destination: u64,
    count: u64,
    command: u64,
    irq: u32,
    dmas: u64,
    stuck: bool,
}

impl EduModel {
    fn run(&mut self) {
        let to_memory = self.command & 2 != 0;
        let (buffer_side, memory_side) = if to_memory {
            (self.source, self.destination)
        } else {
            (self.destination, self.source)
        };
        let offset = buffer_side.wrapping_sub(EDU_BUFFER);
        let len = self.count;
        assert!(
            offset < 4096 && offset + len < 4096,
            "EDU: DMA range {buffer_side:#x}+{len:#x} out of bounds (QEMU aborts)"
        );
        let iova = memory_side & EDU_DMA_MASK;
        let range = offset as usize..(offset + len) as usize;
        let mut smmu = self.smmu.lock();
        if to_memory {
            smmu.dma_write(SID, iova, &self.buffer[range]);
        } else {
            smmu.dma_read(SID, iova, &mut self.buffer[range]);
        }
        self.dmas += 1;
        self.command &= !1;
        if self.command & 4 != 0 {
            self.irq |= 0x100;
        }
    }
}

impl RegisterModel for EduModel {
    fn size(&self) -> usize {
        0x100
    }
    fn read(&mut self, offset: usize, _: AccessWidth) -> u64 {
        match offset {
            0x00 => 0x0100_00ed,
            0x24 => u64::from(self.irq),
            0x80 => self.source,
            0x88 => self.destination,
            0x90 => self.count,
            0x98 => self.command,
            _ => 0,
        }
    }
    fn write(&mut self, offset: usize, _: AccessWidth, value: u64) {
        let running = self.command & 1 != 0;
        match offset {
            0x60 => self.irq |= value as u32,
            0x64 => self.irq &= !(value as u32),
            0x80 if !running => self.source = value,
            0x88 if !running => self.destination = value,
            0x90 if !running => self.count = value,
            0x98 if !running => {
                self.command = value;
                if value & 1 != 0 && !self.stuck {
                    self.run();
                }
            }
            _ => {}
        }
    }
}

/// A [`DmaWait`] on a simulated 1 MHz counter that each sleep advances by its length.
fn clock_wait(clock: &Cell<u64>) -> impl DmaWait + '_ {
    CounterWait::new(
        1_000_000,
        move || clock.get(),
        move |ticks| clock.set(clock.get() + ticks),
    )
}

#[test]
fn a_dma_that_never_completes_is_lost_after_its_deadline_not_a_hang() {
    let rig = Rig::new();
    rig.edu.lock().stuck = true;
    let edu = EduDma::new(EduRegs::new(&rig.edu, 0).unwrap());
    let clock = Cell::new(5_000);
    let sleeps = Cell::new(0u64);
    let mut wait = CounterWait::new(
        1_000_000,
        || clock.get(),
        |ticks| {
            assert!(ticks <= 10_000, "a sleep longer than DMA_POLL_MS: {ticks}");
            sleeps.set(sleeps.get() + 1);
            clock.set(clock.get() + ticks);
        },
    );
    assert_eq!(
        edu.transfer(Direction::ToMemory, 0x10_0000, 0, 64, &mut wait),
        Err(FirmwareError::EduDmaTimeout)
    );
    // 2 s at 1 MHz, in 10 ms sleeps: 200 of them, and the deadline exactly.
    assert_eq!((sleeps.get(), clock.get()), (200, 5_000 + 2_000_000));
    // The next DMA gets its own deadline (edu still runs the lost one: busy).
    assert_eq!(
        edu.transfer(Direction::ToMemory, 0x10_0000, 0, 64, &mut wait),
        Err(FirmwareError::EduBusy)
    );
}

#[test]
fn each_dma_gets_its_own_deadline_and_short_sleeps_near_it() {
    let clock = Cell::new(0);
    let slept = Cell::new(Vec::new());
    let mut wait = CounterWait::new(
        1_000_000,
        || clock.get(),
        |ticks| {
            let mut s = slept.take();
            s.push(ticks);
            slept.set(s);
            clock.set(clock.get() + ticks + 2_000);
        },
    );
    wait.start();
    let mut waits = 0;
    while wait.wait() {
        waits += 1;
    }
    // Sleeps of 10 ms that each overran by 2 ms (the wake-up came late): 12 ms apart, so after
    // 166 of them 8 ms are left, and the 167th sleeps just those.
    let s = slept.take();
    assert_eq!(waits, 167);
    assert_eq!(s.last(), Some(&8_000));
    assert!(s[..166].iter().all(|&t| t == 10_000));
    clock.set(clock.get() + 123);
    wait.start();
    assert!(wait.wait(), "a new DMA starts with a full budget");
}

struct Rig {
    mem: Arc<HostDma>,
    smmu: Arc<ModelBus<Smmuv3Model>>,
    edu: ModelBus<EduModel>,
    backing: Vec<u8>,
    reference: Vec<u8>,
}

impl Rig {
    fn new() -> Self {
        let mem = Arc::new(HostDma::new(PhysAddr::new(0x4000_0000), 2048).unwrap());
        let smmu = Arc::new(ModelBus::new(Smmuv3Model::qemu(mem.clone())));
        let edu = ModelBus::new(EduModel {
            smmu: smmu.clone(),
            buffer: [0; 4096],
            source: 0,
            destination: 0,
            count: 0,
            command: 0,
            irq: 0,
            dmas: 0,
            stuck: false,
        });
        Rig {
            mem,
            smmu,
            edu,
            backing: vec![0; WINDOW_BYTES],
            reference: vec![0; WINDOW_BYTES],
        }
    }

    fn run<T>(
        &mut self,
        f: impl FnOnce(
            &mut Hardware<'_, ModelBus<Smmuv3Model>, ModelBus<EduModel>, Arc<HostDma>, NoDelay>,
            &mut Buffers<'_>,
        ) -> T,
    ) -> T {
        let clock = Cell::new(0);
        let mut wait = clock_wait(&clock);
        let mut hw = Hardware {
            smmu: &*self.smmu,
            edu: EduDma::new(EduRegs::new(&self.edu, 0).unwrap()),
            stream: StreamId(SID),
            dma: self.mem.clone(),
            delay: NoDelay::default(),
            wait: &mut wait,
        };
        let mut bufs = Buffers {
            backing: &mut self.backing,
            reference: &mut self.reference,
        };
        f(&mut hw, &mut bufs)
    }
}

#[test]
fn random_copies_with_faults_end_exact() {
    let mut rig = Rig::new();
    let idle = rig.mem.used_pages();
    let scenario = Scenario {
        copies: 120,
        ..Scenario::MAIN
    };
    let mut log = Vec::new();
    let report = rig
        .run(|hw, bufs| run_scenario(hw, bufs, &scenario, &mut |line| log.push(line)))
        .unwrap();
    assert!(report.exact(), "{report}");
    assert_eq!((report.copies, report.transfers), (120, 240));
    assert!(report.faults > 0 && report.retransmissions > 0, "{report}");
    assert!(report.fault_records >= report.faults, "{report}");
    assert_eq!(
        report.cmdq_recoveries, 1,
        "the illegal command was rejected and skipped"
    );
    assert_eq!(
        report.overflow_recoveries, 0,
        "a 4096-entry queue never fills"
    );
    assert_eq!(report.rejected_events, 0);
    assert!(report.evictions > 0 && report.tlbi.0 > 0, "{report}");
    let dmas = rig.edu.lock().dmas;
    assert_eq!(dmas, report.transfers + report.retransmissions);
    assert_eq!(rig.smmu.lock().stats.unordered_doorbells, 0);
    assert_eq!(rig.mem.used_pages(), idle, "every page returned");
    let scenario = "main";
    assert_eq!(
        log,
        [
            ScenarioLine::Up { scenario },
            ScenarioLine::Resident {
                scenario,
                pages: 256,
                free_frames: 384 - 256
            },
            ScenarioLine::Verifying { scenario },
        ],
        "no progress line below 200 copies"
    );
    assert_eq!(
        log[1].to_string(),
        "  main: 256 pages resident, 128 frames free"
    );
}

#[test]
fn a_tiny_event_queue_overflows_and_still_ends_exact() {
    let mut rig = Rig::new();
    let scenario = Scenario {
        copies: 60,
        ..Scenario::TINY_EVENT_QUEUE
    };
    let report = rig
        .run(|hw, bufs| run_scenario(hw, bufs, &scenario, &mut |_| {}))
        .unwrap();
    assert!(report.exact(), "{report}");
    assert!(report.overflow_recoveries > 0, "{report}");
    assert!(report.revalidated_pages > 0, "{report}");
    assert!(rig.smmu.lock().stats.events_lost > 0);
}

#[test]
fn the_architectural_overflow_flag_is_handled_too() {
    let mut rig = Rig::new();
    rig.smmu.lock().overflow_signal = smmu_driver::v3::model::OverflowSignal::Architectural;
    let scenario = Scenario {
        copies: 40,
        ..Scenario::TINY_EVENT_QUEUE
    };
    let report = rig
        .run(|hw, bufs| run_scenario(hw, bufs, &scenario, &mut |_| {}))
        .unwrap();
    assert!(report.exact() && report.overflow_recoveries > 0, "{report}");
}

#[test]
fn a_missing_tlbi_is_caught_by_the_final_check() {
    let mut rig = Rig::new();
    let report = rig.run(run_stale_tlb_probe).unwrap();
    assert!(report.detected(), "{report}");
    // P lost its new data and Q got it instead.
    assert_eq!(report.stale_mismatched_pages, 2, "{report}");
    // With the TLBI, the second write to P faulted on every 4-byte piece of the page part
    // it covers (0xff0 bytes = 1020 pieces).
    assert_eq!(report.control_write_faults, 1020, "{report}");
}

#[test]
fn ignoring_the_event_queue_loses_data_and_the_check_sees_it() {
    // The comparison must be able to fail: copy once into an unmapped page without
    // servicing the faults, as a driver that trusted edu's completion would.
    let mut rig = Rig::new();
    let result = rig.run(|hw, bufs| -> Result<Report> {
        let dma = hw.dma.clone();
        let mut s = Session::new(hw, bufs, 8, 12, 7, "ignore")?;
        s.make_resident(0)?;
        s.edu
            .transfer(Direction::ToDevice, iova_of(0), 0, 64, &mut *s.wait)?;
        s.edu
            .transfer(Direction::ToMemory, iova_of(5), 0, 64, &mut *s.wait)?;
        s.reference_copy(iova_of(0), iova_of(5), 64);
        s.verify()?;
        s.finish(&dma)
    });
    let report = result.unwrap();
    assert_eq!(
        (report.mismatched_pages, report.mismatched_bytes > 0),
        (1, true)
    );
}

#[test]
fn edu_transfers_are_checked_before_the_device_sees_them() {
    let rig = Rig::new();
    let edu = EduDma::new(EduRegs::new(&rig.edu, 0).unwrap());
    let clock = Cell::new(0);
    let mut wait = clock_wait(&clock);
    // Offset + length must stay below 0xfff (QEMU 7.2 aborts on 0x40000 + 0x1000).
    for (offset, len, iova) in [
        (0, 0x1000, 0x40_0000),
        (0x800, 0x800, 0x40_0000),
        (0, 0, 0x40_0000),
        (0, 16, 0x0fff_fff8),
    ] {
        assert_eq!(
            edu.transfer(Direction::ToMemory, iova, offset, len, &mut wait),
            Err(FirmwareError::EduDmaRange { offset, len, iova })
        );
    }
    assert_eq!(rig.edu.lock().dmas, 0);
    // 0xfff bytes from offset 0 is the largest transfer QEMU accepts (the model would
    // panic like QEMU aborts otherwise). The SMMU is disabled here: the bypassed address
    // is not backed by model memory, so nothing lands anywhere, which is fine.
    edu.transfer(Direction::ToMemory, 0x10_0000, 0, 0xfff, &mut wait)
        .unwrap();
    assert_eq!(rig.edu.lock().dmas, 1);
    assert_eq!(rig.edu.lock().irq, 0, "completion interrupt acknowledged");
}

#[test]
fn pager_evicts_saves_and_restores() {
    let mem = Arc::new(HostDma::new(PhysAddr::new(0x4000_0000), 256).unwrap());
    let mut backing = vec![0u8; WINDOW_BYTES];
    for (i, b) in backing.iter_mut().enumerate() {
        *b = pattern(1, i / PAGE, i % PAGE);
    }
    let mut pager = Pager::new(&*mem, 2, 500, Store::Memory(&mut backing)).unwrap();
    pager
        .add_region(
            StreamId(SID),
            Iova::new(WINDOW_BASE),
            WINDOW_PAGES,
            true,
            Fill::Unchanged,
        )
        .unwrap();
    let base = pager.frame_addr(0).unwrap();
    let mut table = PageTable::new(mem.clone(), PageTableConfig::default()).unwrap();
    struct Counting(u32);
    impl TlbMaintenance for Counting {
        fn invalidate_now(
            &mut self,
            list: &smmu_driver::pagetable::Invalidations,
        ) -> smmu_driver::Result<()> {
            self.0 += list.len() as u32;
            Ok(())
        }
    }
    let mut tlb = Counting(0);
    // Frames go out as a stack: frame 0 first.
    let page = pager
        .resolve(StreamId(SID), Iova::new(iova_of(7) + 12), AccessKind::Read)
        .unwrap();
    assert_eq!(page.frame, base);
    assert_eq!(page.cost, FaultCost::Major);
    table
        .map(
            Iova::new(iova_of(7)),
            page.frame,
            PageSize::Size4K,
            &page.attributes,
            &mut tlb,
        )
        .unwrap();
    let mut buf = [0u8; PAGE];
    pager.read(Iova::new(iova_of(7)), &mut buf).unwrap();
    assert_eq!(buf[12], pattern(1, 7, 12));
    // The device writes into the frame; eviction saves it and invalidates once.
    mem.write_phys(PhysAddr::new(base.as_u64() + 12), &[0xaa])
        .unwrap();
    pager
        .evict(Iova::new(iova_of(7)), &mut table, &mut tlb)
        .unwrap();
    assert_eq!(tlb.0, 1);
    assert_eq!(table.translate(Iova::new(iova_of(7))).unwrap(), None);
    pager.read(Iova::new(iova_of(7)), &mut buf).unwrap();
    assert_eq!(buf[12], 0xaa, "saved to the backing store");
    // The freed frame is the next one handed out.
    let again = pager
        .resolve(StreamId(SID), Iova::new(iova_of(9)), AccessKind::Write)
        .unwrap();
    assert_eq!(again.frame, base);
    // Only pinned pages left: nothing to evict.
    pager
        .resolve(StreamId(SID), Iova::new(iova_of(10)), AccessKind::Write)
        .unwrap();
    let mut rng = Rng::new(3);
    let pinned = [iova_of(9)..iova_of(10), iova_of(10)..iova_of(11)];
    assert_eq!(
        pager.ensure_free(1, || rng.below(2) as usize, &pinned, &mut table, &mut tlb),
        Err(boards::BoardError::PagerExhausted { what: "free frame" })
    );
    assert_eq!(
        pager.resolve(StreamId(SID), Iova::new(iova_of(11)), AccessKind::Read),
        Err(ResolveError(boards::pager::resolve_codes::NO_FRAME)),
        "no frame free"
    );
    assert_eq!(
        pager.resolve(StreamId(0x11), Iova::new(iova_of(11)), AccessKind::Read),
        Err(ResolveError(1)),
        "another stream"
    );
    assert_eq!(pager.stats().evictions, 1);
    drop(table);
    pager.release().unwrap();
}
