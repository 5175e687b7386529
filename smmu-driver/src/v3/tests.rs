//! The driver against the register model ([`super::model`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::vec::Vec;

use hal::delay::NoDelay;
use hal::dma::{DmaDirection, DmaMemory, DmaRegion, HostDma};
use hal::model::ModelBus;
use hal::{Iova, PageSize, PhysAddr};
use proptest::prelude::*;

use super::model::{OverflowSignal, Smmuv3Model};
use super::*;
use crate::fault::{
    AccessKind, FaultCost, FaultDecision, FaultKind, RegionSet, RegisteredRegion, ResolveError,
    ResolveEstimate, ResolvedPage, StandardPolicy,
};
use crate::pagetable::{Attributes, PageTableConfig, Permissions};

const RAM: u64 = 0x4000_0000;
const SID: StreamId = StreamId(0x10);
const WINDOW: u64 = 0x40_0000;
/// QEMU's SMMUv3 but with IDR0.STALL_MODEL = 0b00: stalls supported, CMD_RESUME exists.
const STALL_CAPABLE: IdRegisters = IdRegisters {
    idr0: IdRegisters::QEMU_7_2.idr0 & !(0b11 << 24),
    ..IdRegisters::QEMU_7_2
};

type Bus = ModelBus<Smmuv3Model>;
type Driver<'a> = Smmuv3<'a, Bus, Arc<HostDma>, NoDelay>;

fn memory() -> Arc<HostDma> {
    Arc::new(HostDma::new(PhysAddr::new(RAM), 1024).unwrap())
}

fn bus_with(mem: &Arc<HostDma>, idr: IdRegisters) -> Bus {
    ModelBus::new(Smmuv3Model::new(mem.clone(), idr))
}

fn driver<'a>(bus: &'a Bus, mem: &Arc<HostDma>, config: Smmuv3Config) -> Driver<'a> {
    Smmuv3::new(bus, mem.clone(), NoDelay::default(), config).unwrap()
}

fn table(mem: &Arc<HostDma>) -> PageTable<Arc<HostDma>> {
    PageTable::new(
        mem.clone(),
        PageTableConfig {
            output_bits: 44,
            ..PageTableConfig::default()
        },
    )
    .unwrap()
}

/// A TLB that does nothing: the "forgot the TLBI" driver bug.
struct NoTlb;
impl TlbMaintenance for NoTlb {
    fn invalidate_now(&mut self, _: &Invalidations) -> Result<()> {
        Ok(())
    }
}

/// Hands out frames from one region, one per page of the window.
struct Frames {
    regions: RegionSet<1>,
    region: DmaRegion,
    used: usize,
    pages: BTreeMap<u64, PhysAddr>,
    /// Claim resolution is cheap (a minor fault), so a stalled fault may be resumed.
    minor: bool,
}

impl Frames {
    fn new(mem: &Arc<HostDma>) -> Self {
        let mut regions = RegionSet::new();
        regions
            .register(RegisteredRegion {
                stream: SID,
                start: Iova::new(WINDOW),
                len: 0x40_0000,
                writable: true,
            })
            .unwrap();
        Frames {
            regions,
            region: mem.allocate(16, DmaDirection::Bidirectional).unwrap(),
            used: 0,
            pages: BTreeMap::new(),
            minor: false,
        }
    }
}

impl FaultResolver for Frames {
    fn region(&self, stream: StreamId, iova: Iova) -> Option<RegisteredRegion> {
        self.regions.find(stream, iova)
    }
    fn estimate(&self, _: StreamId, _: Iova, _: AccessKind) -> ResolveEstimate {
        if self.minor {
            ResolveEstimate::Minor { expected_ns: 100 }
        } else {
            ResolveEstimate::Major
        }
    }
    fn resolve(
        &mut self,
        _: StreamId,
        iova: Iova,
        _: AccessKind,
    ) -> core::result::Result<ResolvedPage, ResolveError> {
        let page = iova.align_down(PageSize::Size4K).as_u64();
        let frame = match self.pages.get(&page) {
            Some(f) => *f,
            None => {
                if self.used == 16 {
                    return Err(ResolveError(1));
                }
                let f = PhysAddr::new(self.region.bus_addr().as_u64() + self.used as u64 * 4096);
                self.used += 1;
                self.pages.insert(page, f);
                f
            }
        };
        Ok(ResolvedPage {
            frame,
            size: PageSize::Size4K,
            attributes: Attributes::normal(Permissions::READ_WRITE),
            cost: FaultCost::Major,
        })
    }
}

fn drain(smmu: &mut Driver<'_>) -> (Vec<Result<Event>>, DrainSummary) {
    let mut events = Vec::new();
    let summary = smmu.drain_events(|e| events.push(e)).unwrap();
    (events, summary)
}

fn faults(events: &[Result<Event>]) -> Vec<FaultRecord> {
    events
        .iter()
        .filter_map(|e| match e {
            Ok(Event::Fault(r)) => Some(*r),
            _ => None,
        })
        .collect()
}

fn map_page(pt: &mut PageTable<Arc<HostDma>>, iova: u64, frame: PhysAddr) {
    pt.map(
        Iova::new(iova),
        frame,
        PageSize::Size4K,
        &Attributes::normal(Permissions::READ_WRITE),
        &mut NoTlb,
    )
    .unwrap();
}

#[test]
fn reset_programs_the_smmu_and_aborts_every_stream() {
    let mem = memory();
    let bus = bus_with(&mem, IdRegisters::QEMU_7_2);
    let smmu = driver(&bus, &mem, Smmuv3Config::default());
    {
        let m = bus.lock();
        // CR0: SMMUEN (bit 0) | EVENTQEN (bit 2) | CMDQEN (bit 3) = 0xd.
        assert_eq!(m.cr0(), 0xd);
        // CMD_CFGI_ALL, CMD_TLBI_NSNH_ALL, CMD_SYNC.
        assert_eq!((m.stats.commands, m.stats.syncs), (3, 1));
        assert_eq!(
            m.stats.unordered_doorbells, 0,
            "every doorbell after a barrier"
        );
    }
    // 64 STEs, each V = 1, Config = abort: dword 0 = 1, the rest 0.
    let base = smmu.stream_table();
    for sid in 0..64u64 {
        assert_eq!(
            mem.read_phys_u64(PhysAddr::new(base.as_u64() + sid * 64))
                .unwrap(),
            1
        );
        assert_eq!(
            mem.read_phys_u64(PhysAddr::new(base.as_u64() + sid * 64 + 8))
                .unwrap(),
            0
        );
    }
    assert_eq!(base.as_u64() % 4096, 0, "a 4 KiB table aligned to its size");
    // An aborting stream: no translation, no event.
    let mut m = bus.lock();
    assert_eq!(m.translate(0x10, 0x40_0000, false), None);
    assert_eq!(m.stats.events_written, 0);
}

#[test]
fn attached_stream_translates_and_records_faults() {
    let mem = memory();
    let bus = bus_with(&mem, IdRegisters::QEMU_7_2);
    let mut smmu = driver(&bus, &mem, Smmuv3Config::default());
    let mut pt = table(&mem);
    let frame = mem.allocate(1, DmaDirection::Bidirectional).unwrap();
    frame.write_bytes(0, b"hello, smmu").unwrap();
    map_page(&mut pt, WINDOW, frame.bus_addr());
    smmu.attach(SID, &ContextConfig::for_table(7, &pt)).unwrap();

    // The STE: V | Config = S1 (0xb) in dword 0 [3:0]; dword 1 = 0xd4 (WBRA/WBRA/ISH CD
    // fetches, S1STALLD = 0: illegal on a terminate-only SMMU). The CD it points at: R, A,
    // ASET, AA64, V, EPD1, T0SZ 16, IPS 44 bits, ASID 7; TTB0 = the table root.
    let ste_at = smmu.stream_table().as_u64() + 0x10 * 64;
    let ste0 = mem.read_phys_u64(PhysAddr::new(ste_at)).unwrap();
    assert_eq!(ste0 & 0xf, 0xb);
    assert_eq!(mem.read_phys_u64(PhysAddr::new(ste_at + 8)).unwrap(), 0xd4);
    let cd_at = ste0 & 0x000f_ffff_ffff_ffc0;
    assert_eq!(
        mem.read_phys_u64(PhysAddr::new(cd_at)).unwrap(),
        0x0007_e204_c000_3510
    );
    assert_eq!(
        mem.read_phys_u64(PhysAddr::new(cd_at + 8)).unwrap(),
        pt.root().as_u64()
    );

    let mut buf = [0u8; 11];
    let out = bus.lock().dma_read(0x10, WINDOW, &mut buf);
    assert_eq!((out.transferred, out.faulted_pieces), (11, 0));
    assert_eq!(&buf, b"hello, smmu");

    // 16 bytes at an unmapped page: four 4-byte pieces, four F_TRANSLATION records.
    let mut buf = [0xffu8; 16];
    let out = bus.lock().dma_read(0x10, WINDOW + 0x1000, &mut buf);
    assert_eq!(out.faulted_pieces, 4);
    assert_eq!(buf, [0; 16], "faulting reads deliver zeros");
    let (events, summary) = drain(&mut smmu);
    assert_eq!(
        (summary.records, summary.faults, summary.overflow),
        (4, 4, false)
    );
    let records = faults(&events);
    let addrs: Vec<u64> = records.iter().map(|r| r.iova.as_u64()).collect();
    assert_eq!(addrs, [0x40_1000, 0x40_1004, 0x40_1008, 0x40_100c]);
    assert!(records.iter().all(|r| r.stream == SID
        && r.access == AccessKind::Read
        && r.kind == FaultKind::Translation
        && r.stall.is_none()));
    // The model's record, as QEMU writes it (IHI0070 §7.3): F_TRANSLATION (0x10) |
    // StreamID << 32; RnW (bit 35) | CLASS = IN (0b10 at 41:40); InputAddr; dword 3 zero.
    assert_eq!(
        records[0].syndrome.0,
        [0x0000_0010_0000_0010, 0x0000_0208_0000_0000, 0x40_1000, 0]
    );
    // A write to it: RnW = 0.
    bus.lock().dma_write(0x10, WINDOW + 0x1002, &[1, 2]);
    let (events, _) = drain(&mut smmu);
    assert_eq!(faults(&events)[0].access, AccessKind::Write);
    assert_eq!(faults(&events)[0].iova, Iova::new(WINDOW + 0x1002));
    assert_eq!(
        faults(&events)[0].syndrome.0,
        [
            0x0000_0010_0000_0010,
            0x0000_0200_0000_0000,
            WINDOW + 0x1002,
            0
        ]
    );
    assert_eq!(smmu.stats().fault_events, 5);
    assert_eq!(bus.lock().stats.unordered_doorbells, 0);
}

#[test]
fn table_walk_attributes_follow_cohacc_in_cr1_the_ste_and_the_cd() {
    // (IDR0, CR1, STE dword 1, CD dword 0) for a coherent SMMU (QEMU's, COHACC = 1) and one
    // without COHACC (bit 4): CR1 = TABLE_SH/OC/IC at 11:10/9:8/7:6 and QUEUE_SH/OC/IC at
    // 5:4/3:2/1:0 = 0xd75 (3/1/1, 3/1/1: inner, write-back) or 0x820 (2/0/0, 2/0/0: outer,
    // non-cacheable); the STE's S1CSH/S1COR/S1CIR and the CD's SH0/OR0/IR0 the same way.
    let coherent = IdRegisters::QEMU_7_2;
    let not_coherent = IdRegisters {
        idr0: coherent.idr0 & !(1 << 4),
        ..coherent
    };
    for (idr, cr1, ste1, cd0) in [
        (coherent, 0xd75, 0xd4, 0x0007_e204_c000_3510),
        (not_coherent, 0x820, 0x80, 0x0007_e204_c000_2010),
    ] {
        let mem = memory();
        let bus = bus_with(&mem, idr);
        let mut smmu = driver(&bus, &mem, Smmuv3Config::default());
        assert_eq!(smmu.capabilities().coherent, idr.idr0 & (1 << 4) != 0);
        let pt = table(&mem);
        smmu.attach(SID, &ContextConfig::for_table(7, &pt)).unwrap();
        assert_eq!(
            hal::regs::RegisterBus::read(&bus, 0x28, hal::regs::AccessWidth::U32),
            cr1
        );
        let ste_at = smmu.stream_table().as_u64() + 0x10 * 64;
        let ste0 = mem.read_phys_u64(PhysAddr::new(ste_at)).unwrap();
        assert_eq!(mem.read_phys_u64(PhysAddr::new(ste_at + 8)).unwrap(), ste1);
        let cd_at = ste0 & 0x000f_ffff_ffff_ffc0;
        assert_eq!(mem.read_phys_u64(PhysAddr::new(cd_at)).unwrap(), cd0);
    }
}

#[test]
fn service_fault_maps_the_page_and_the_retransmission_succeeds() {
    let mem = memory();
    let bus = bus_with(&mem, IdRegisters::QEMU_7_2);
    let mut smmu = driver(&bus, &mem, Smmuv3Config::default());
    let mut pt = table(&mem);
    smmu.attach(SID, &ContextConfig::for_table(3, &pt)).unwrap();
    let mut frames = Frames::new(&mem);
    let mut handler = FaultHandler::new(StandardPolicy::RetransmitOnly);

    let data = *b"0123456789abcdef";
    let out = bus.lock().dma_write(0x10, WINDOW + 0x2ff8, &data);
    assert_eq!(
        out.faulted_pieces, 4,
        "both pages unmapped: 8 bytes each side, 2 + 2 pieces"
    );
    let (events, _) = drain(&mut smmu);
    let mut pages = Vec::new();
    for r in faults(&events) {
        let outcome = smmu
            .service_fault(&r, &mut handler, &mut frames, &mut pt)
            .unwrap();
        assert_eq!(outcome.decision, FaultDecision::TerminateAndRetransmit);
        if outcome.mapped.is_some() {
            pages.push(r.iova.align_down(PageSize::Size4K).as_u64());
        }
    }
    assert_eq!(
        pages,
        [WINDOW + 0x2000, WINDOW + 0x3000],
        "one mapping per page"
    );
    assert_eq!(
        handler.stats().spurious,
        2,
        "the duplicate records found the page mapped"
    );
    let out = bus.lock().dma_write(0x10, WINDOW + 0x2ff8, &data);
    assert_eq!((out.transferred, out.faulted_pieces), (16, 0));
    let mut back = [0u8; 16];
    bus.lock().dma_read(0x10, WINDOW + 0x2ff8, &mut back);
    assert_eq!(back, data);
    assert_eq!(drain(&mut smmu).1.records, 0);

    // Outside the registered region: aborted, nothing mapped.
    bus.lock().dma_read(0x10, 0x90_0000, &mut [0u8; 4]);
    let (events, _) = drain(&mut smmu);
    let r = faults(&events)[0];
    let outcome = smmu
        .service_fault(&r, &mut handler, &mut frames, &mut pt)
        .unwrap();
    assert!(matches!(
        outcome.decision,
        FaultDecision::Abort(SmmuError::OutsideRegisteredRegion { .. })
    ));
    assert_eq!(pt.translate(Iova::new(0x90_0000)).unwrap(), None);
}

#[test]
fn a_missing_tlbi_leaves_a_stale_translation_and_the_driver_tlbi_removes_it() {
    let mem = memory();
    let bus = bus_with(&mem, IdRegisters::QEMU_7_2);
    let mut smmu = driver(&bus, &mem, Smmuv3Config::default());
    let mut pt = table(&mem);
    smmu.attach(SID, &ContextConfig::for_table(5, &pt)).unwrap();
    let frame = mem.allocate(1, DmaDirection::Bidirectional).unwrap();
    map_page(&mut pt, WINDOW, frame.bus_addr());
    let mut buf = [0u8; 4];
    bus.lock().dma_read(0x10, WINDOW, &mut buf);
    assert_eq!(bus.lock().tlb_entries(), 1);

    // Unmap without invalidation: the SMMU still writes into the old frame.
    let inv = pt.unmap(Iova::new(WINDOW), 4096, &mut NoTlb).unwrap();
    let out = bus.lock().dma_write(0x10, WINDOW, b"late");
    assert_eq!(out.faulted_pieces, 0, "stale TLB entry used");
    let mut seen = [0u8; 4];
    frame.read_bytes(0, &mut seen).unwrap();
    assert_eq!(&seen, b"late");

    // The driver's invalidation: TLBI_NH_VA (range, TTL 3) + SYNC.
    let before = bus.lock().stats;
    smmu.tlb(5).invalidate_now(&inv).unwrap();
    let after = bus.lock().stats;
    assert_eq!(
        (after.tlbi - before.tlbi, after.syncs - before.syncs),
        (1, 1)
    );
    let out = bus.lock().dma_write(0x10, WINDOW, b"gone");
    assert_eq!(out.faulted_pieces, 1);
    assert_eq!(smmu.stats().tlbi_va, 1);
}

#[test]
fn invalidation_commands_follow_ril_and_overflow() {
    for ril in [true, false] {
        let mem = memory();
        let idr = IdRegisters {
            idr3: if ril { 0x1404 } else { 0x1004 },
            ..IdRegisters::QEMU_7_2
        };
        let bus = bus_with(&mem, idr);
        let mut smmu = driver(&bus, &mem, Smmuv3Config::default());
        let mut pt = table(&mem);
        smmu.attach(SID, &ContextConfig::for_table(1, &pt)).unwrap();
        let frames = mem.allocate(3, DmaDirection::Bidirectional).unwrap();
        for i in 0..3 {
            map_page(
                &mut pt,
                WINDOW + i * 4096,
                PhysAddr::new(frames.bus_addr().as_u64() + i * 4096),
            );
            bus.lock().dma_read(0x10, WINDOW + i * 4096, &mut [0u8; 4]);
        }
        let inv = pt.unmap(Iova::new(WINDOW), 3 * 4096, &mut NoTlb).unwrap();
        let before = bus.lock().stats.tlbi;
        smmu.invalidate(1, &inv).unwrap();
        let commands = bus.lock().stats.tlbi - before;
        // One range command (NUM = 2, SCALE = 0) with RIL; one per page without.
        assert_eq!(commands, if ril { 1 } else { 3 }, "ril = {ril}");
        assert_eq!(bus.lock().tlb_entries(), 0, "ril = {ril}");
        assert_eq!(
            bus.lock().stats.rejected,
            0,
            "no RES0 range fields without RIL"
        );
    }

    // More runs than the list holds: one TLBI_NH_ASID.
    let mem = memory();
    let bus = bus_with(&mem, IdRegisters::QEMU_7_2);
    let mut smmu = driver(&bus, &mem, Smmuv3Config::default());
    let mut list = Invalidations::new();
    for i in 0..40u64 {
        list.push(crate::pagetable::TlbInvalidation {
            start: Iova::new(WINDOW + i * 0x2000),
            count: 1,
            granule: PageSize::Size4K,
            leaf_only: true,
        });
    }
    assert!(list.overflowed());
    smmu.invalidate(1, &list).unwrap();
    assert_eq!((smmu.stats().tlbi_asid, smmu.stats().tlbi_va), (1, 0));
}

#[test]
fn a_rejected_command_is_skipped_reported_and_the_queue_keeps_working() {
    let mem = memory();
    let bus = bus_with(&mem, IdRegisters::QEMU_7_2);
    let mut smmu = driver(&bus, &mem, Smmuv3Config::default());
    let index = bus.lock().cmdq_cons() & 0xff;
    smmu.submit_raw([0x99, 0]).unwrap();
    assert_eq!(
        smmu.sync(),
        Err(SmmuError::CommandRejected {
            reason: 1,
            opcode: 0x99,
            index
        })
    );
    {
        let m = bus.lock();
        let (gerror, gerrorn) = m.global_errors();
        assert_eq!(gerror & 1, 1, "CMDQ_ERR was toggled");
        assert_eq!(gerror, gerrorn, "and acknowledged");
        assert_eq!(m.stats.rejected, 1);
    }
    smmu.sync().unwrap();
    assert_eq!(smmu.stats().cmdq_errors, 1);

    // CMD_RESUME on a terminate-only SMMU: the driver refuses; pushed raw, the SMMU rejects.
    assert!(matches!(
        smmu.resume(SID, StallTag(1), ResumeAction::Retry),
        Err(SmmuError::Unsupported { .. })
    ));
    smmu.submit_raw(
        Command::Resume {
            stream: SID,
            stag: 1,
            action: ResumeAction::Retry,
        }
        .encode(),
    )
    .unwrap();
    assert!(matches!(
        smmu.sync(),
        Err(SmmuError::CommandRejected {
            reason: 1,
            opcode: 0x44,
            ..
        })
    ));
    smmu.sync().unwrap();
    assert_eq!(bus.lock().stats.unordered_doorbells, 0);
}

#[test]
fn a_full_event_queue_is_reported_as_an_overflow_and_recovers() {
    for signal in [OverflowSignal::QemuGerror, OverflowSignal::Architectural] {
        let mem = memory();
        let bus = bus_with(&mem, IdRegisters::QEMU_7_2);
        bus.lock().overflow_signal = signal;
        let mut smmu = driver(
            &bus,
            &mem,
            Smmuv3Config {
                eventq_log2: 2,
                ..Smmuv3Config::default()
            },
        );
        let pt = table(&mem);
        smmu.attach(SID, &ContextConfig::for_table(1, &pt)).unwrap();
        // 64 faulting bytes: 16 records, 4 fit.
        bus.lock().dma_read(0x10, WINDOW, &mut [0u8; 64]);
        assert_eq!(bus.lock().stats.events_lost, 12, "{signal:?}");
        let (events, summary) = drain(&mut smmu);
        assert_eq!((events.len(), summary.overflow), (4, true), "{signal:?}");
        let (events, summary) = drain(&mut smmu);
        assert_eq!(
            (events.len(), summary.overflow),
            (0, false),
            "{signal:?}: reported once"
        );
        // Recorded again after the drain and acknowledgement.
        bus.lock().dma_read(0x10, WINDOW, &mut [0u8; 8]);
        let (events, summary) = drain(&mut smmu);
        assert_eq!((events.len(), summary.overflow), (2, false), "{signal:?}");
        assert_eq!(smmu.stats().overflows, 1);
        let (gerror, gerrorn) = bus.lock().global_errors();
        assert_eq!(gerror, gerrorn);
    }
}

#[test]
fn the_models_configuration_records_carry_the_event_and_the_stream() {
    let mem = memory();
    let bus = bus_with(&mem, IdRegisters::QEMU_7_2);
    let mut smmu = driver(&bus, &mem, Smmuv3Config::default());
    let ste_at = |sid: u64| PhysAddr::new(smmu.stream_table().as_u64() + sid * 64);
    // Stream 0x11: V = 0 -> C_BAD_STE. Stream 0x12: stage 1 (0xb) through a CD of zeros
    // (V = 0) in a fresh page -> C_BAD_CD. Stream 0x4000: beyond the 64-entry table
    // with CR2.RECINVSID -> C_BAD_STREAMID. Each record is EventID | StreamID << 32 and
    // three zero dwords (IHI0070 §7.3.3, §7.3.5, §7.3.11).
    mem.write_phys_u64(ste_at(0x11), 0).unwrap();
    let cd = mem.allocate(1, DmaDirection::Bidirectional).unwrap();
    mem.write_phys_u64(ste_at(0x12), cd.bus_addr().as_u64() | 0xb)
        .unwrap();
    {
        let mut m = bus.lock();
        for sid in [0x11, 0x12, 0x4000] {
            assert_eq!(m.translate(sid, 0x1000, false), None);
        }
    }
    let (events, _) = drain(&mut smmu);
    let raw: Vec<[u64; 4]> = events
        .iter()
        .map(|e| match e {
            Ok(Event::Configuration { raw, .. }) => raw.0,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        raw,
        [
            [0x0000_0011_0000_0004, 0, 0, 0],
            [0x0000_0012_0000_000a, 0, 0, 0],
            [0x0000_4000_0000_0002, 0, 0, 0],
        ]
    );
}

#[test]
fn unknown_and_malformed_records_are_counted_and_skipped() {
    let mem = memory();
    let bus = bus_with(&mem, IdRegisters::QEMU_7_2);
    let mut smmu = driver(&bus, &mem, Smmuv3Config::default());
    {
        let mut m = bus.lock();
        m.inject_event([0x00, 0, 0, 0]);
        m.inject_event([0x10 | (1 << 11) | (0x10 << 32), 1 << 35, 0x1000, 0]);
        m.inject_event([0x10 | (0x10 << 32), 1 << 35, 0x2000, 0]);
        m.inject_event([0x04 | (0x11 << 32), 0, 0, 0]);
    }
    let (events, summary) = drain(&mut smmu);
    assert_eq!(events.len(), 4);
    assert_eq!(events[0], Err(SmmuError::UnknownEvent { id: 0 }));
    assert!(matches!(
        events[1],
        Err(SmmuError::MalformedEvent { id: 0x10, .. })
    ));
    assert!(matches!(events[2], Ok(Event::Fault(r)) if r.iova == Iova::new(0x2000)));
    assert!(matches!(
        events[3],
        Ok(Event::Configuration {
            id: 0x04,
            stream: StreamId(0x11),
            ..
        })
    ));
    assert_eq!(
        (summary.records, summary.faults, summary.rejected),
        (4, 1, 2)
    );
    let s = smmu.stats();
    assert_eq!(
        (
            s.unknown_events,
            s.malformed_events,
            s.fault_events,
            s.other_events
        ),
        (1, 1, 1, 1)
    );
}

#[test]
fn refused_configurations() {
    let mem = memory();
    let bus = bus_with(&mem, IdRegisters::QEMU_7_2);
    for bad in [
        Smmuv3Config {
            eventq_log2: 20,
            ..Smmuv3Config::default()
        },
        Smmuv3Config {
            cmdq_log2: 0,
            ..Smmuv3Config::default()
        },
        Smmuv3Config {
            stream_table_log2: 17,
            ..Smmuv3Config::default()
        },
    ] {
        assert!(matches!(
            Smmuv3::new(&bus, mem.clone(), NoDelay::default(), bad),
            Err(SmmuError::InvalidConfig { .. })
        ));
    }
    let mut smmu = driver(&bus, &mem, Smmuv3Config::default());
    let pt = table(&mem);
    let ctx = ContextConfig::for_table(1, &pt);
    let stall = ContextConfig {
        stall_on_fault: true,
        stall_tolerant: true,
        ..ctx
    };
    assert!(matches!(
        smmu.attach(SID, &stall),
        Err(SmmuError::Unsupported { .. })
    ));
    assert_eq!(
        smmu.attach(StreamId(64), &ctx),
        Err(SmmuError::StreamIdOutOfRange { id: 64, bits: 6 })
    );
    smmu.attach(SID, &ctx).unwrap();
    assert!(matches!(
        smmu.attach(SID, &ctx),
        Err(SmmuError::InvalidConfig { .. })
    ));
    assert_eq!(
        smmu.asid_of(StreamId(0x11)),
        Err(SmmuError::StreamNotAttached { stream: 0x11 })
    );

    // An SMMU that can stall: a stalling context on a stream that may not stall is refused;
    // a PCIe stream gets STE.S1STALLD.
    let mem = memory();
    let idr = STALL_CAPABLE;
    let bus = bus_with(&mem, idr);
    let mut smmu = driver(&bus, &mem, Smmuv3Config::default());
    let pt = table(&mem);
    let ctx = ContextConfig::for_table(1, &pt);
    assert_eq!(
        smmu.attach(
            SID,
            &ContextConfig {
                stall_on_fault: true,
                ..ctx
            }
        ),
        Err(SmmuError::StallOnIntolerantStream { stream: 0x10 })
    );
    smmu.attach(SID, &ctx).unwrap();
    let ste1 = mem
        .read_phys_u64(PhysAddr::new(smmu.stream_table().as_u64() + 0x10 * 64 + 8))
        .unwrap();
    assert_eq!(ste1, 0x0800_00d4, "S1STALLD (bit 27) set");
    // And CMD_RESUME exists there.
    smmu.resume(SID, StallTag(3), ResumeAction::Abort).unwrap();
}

#[test]
fn a_stalled_transaction_whose_record_is_rejected_is_still_terminated() {
    let mem = memory();
    let idr = STALL_CAPABLE;
    let bus = bus_with(&mem, idr);
    let mut smmu = driver(&bus, &mem, Smmuv3Config::default());
    // F_TRANSLATION of stream 0x10, stalled with STAG 0x55, but with the reserved CLASS.
    bus.lock().inject_event([
        0x10 | (0x10 << 32),
        (1 << 31) | 0x55 | (0b11 << 40),
        0x1000,
        0,
    ]);
    let mut seen = Vec::new();
    smmu.drain_events(|e| seen.push(e)).unwrap();
    assert!(matches!(
        seen.as_slice(),
        [Err(SmmuError::MalformedStalledEvent {
            stream: 0x10,
            stag: 0x55,
            ..
        })]
    ));
    // Answered with CMD_RESUME, abort to the master (Ac = 0, Ab = 1).
    assert_eq!(bus.lock().stats.last_resume, Some((0x10, 0x55, 0b10)));
}

#[test]
fn stalled_faults_are_resumed_or_terminated_with_cmd_resume() {
    // An SMMU with STALL_MODEL = 0b00 and a stall-tolerant platform stream that stalls.
    let mem = memory();
    let idr = STALL_CAPABLE;
    let bus = bus_with(&mem, idr);
    let mut smmu = driver(&bus, &mem, Smmuv3Config::default());
    let mut pt = table(&mem);
    let ctx = ContextConfig {
        stall_on_fault: true,
        stall_tolerant: true,
        stall_budget_ns: 10_000,
        ..ContextConfig::for_table(2, &pt)
    };
    smmu.attach(SID, &ctx).unwrap();
    // The CD asks to stall: S (bit 44) set.
    let ste0 = mem
        .read_phys_u64(PhysAddr::new(smmu.stream_table().as_u64() + 0x10 * 64))
        .unwrap();
    let cd0 = mem
        .read_phys_u64(PhysAddr::new(ste0 & 0x000f_ffff_ffff_ffc0))
        .unwrap();
    assert_ne!(cd0 & (1 << 44), 0);
    let mut frames = Frames::new(&mem);
    let mut handler = FaultHandler::new(StandardPolicy::Hybrid);
    let stalled = |iova: u64, stag: u32| FaultRecord {
        smmu: crate::fault::SmmuId {
            flavour: crate::fault::SmmuFlavour::V3,
            instance: 0,
        },
        stream: SID,
        iova: Iova::new(iova),
        access: AccessKind::Write,
        kind: FaultKind::Translation,
        level: None,
        stall: Some(StallTag(stag)),
        syndrome: crate::fault::RawSyndrome::default(),
    };

    // Minor within budget: map, then CMD_RESUME retry (Ac = 1: bits [13:12] = 0b01).
    frames.minor = true;
    let out = smmu
        .service_fault(&stalled(WINDOW, 0x77), &mut handler, &mut frames, &mut pt)
        .unwrap();
    assert_eq!(out.decision, FaultDecision::Resume);
    assert!(out.mapped.is_some());
    assert_eq!(bus.lock().stats.last_resume, Some((0x10, 0x77, 0b01)));

    // Major: terminate at once (Ab = 1: 0b10), then map for the retransmission.
    frames.minor = false;
    let out = smmu
        .service_fault(
            &stalled(WINDOW + 0x1000, 0x78),
            &mut handler,
            &mut frames,
            &mut pt,
        )
        .unwrap();
    assert_eq!(out.decision, FaultDecision::TerminateAndRetransmit);
    assert!(out.mapped.is_some());
    assert_eq!(bus.lock().stats.last_resume, Some((0x10, 0x78, 0b10)));

    // Outside every region: aborted and the stall terminated, nothing mapped.
    let out = smmu
        .service_fault(
            &stalled(0x90_0000, 0x79),
            &mut handler,
            &mut frames,
            &mut pt,
        )
        .unwrap();
    assert!(matches!(out.decision, FaultDecision::Abort(_)));
    assert_eq!(bus.lock().stats.last_resume, Some((0x10, 0x79, 0b10)));
    // An unknown stream has no region: aborted, nothing mapped, and the stall answered.
    let mut other = stalled(WINDOW, 0x7a);
    other.stream = StreamId(0x11);
    let out = smmu
        .service_fault(&other, &mut handler, &mut frames, &mut pt)
        .unwrap();
    assert_eq!(
        out.decision,
        FaultDecision::Abort(SmmuError::OutsideRegisteredRegion {
            stream: 0x11,
            iova: Iova::new(WINDOW),
        })
    );
    assert!(out.mapped.is_none());
    assert_eq!(bus.lock().stats.last_resume, Some((0x11, 0x7a, 0b10)));
    // Detaching a stalling stream ends whatever is still stalled (CMD_STALL_TERM) before
    // its CD is freed.
    smmu.detach(SID).unwrap();
    assert_eq!(bus.lock().stats.last_stall_term, Some(0x10));
}

#[test]
fn a_sync_the_smmu_never_consumes_times_out() {
    let mem = memory();
    let bus = bus_with(&mem, IdRegisters::QEMU_7_2);
    let mut smmu = driver(
        &bus,
        &mem,
        Smmuv3Config {
            sync_timeout_us: 50,
            poll_interval_us: 10,
            ..Smmuv3Config::default()
        },
    );
    bus.lock().frozen = true;
    assert_eq!(
        smmu.sync(),
        Err(SmmuError::CommandSyncTimeout { waited_us: 50 })
    );
}

#[test]
fn a_failed_attach_never_frees_a_cd_that_a_live_ste_may_point_at() {
    let mem = memory();
    let bus = bus_with(&mem, IdRegisters::QEMU_7_2);
    let mut pt = table(&mem);
    let frame = mem.allocate(1, DmaDirection::Bidirectional).unwrap();
    map_page(&mut pt, WINDOW, frame.bus_addr());
    let mut smmu = driver(&bus, &mem, Smmuv3Config::default());
    let idle = mem.used_pages();
    let context = ContextConfig::for_table(9, &pt);

    // attach: CFGI_STE, SYNC, dword 0 (V), CFGI_STE, SYNC. The second CFGI_STE is refused,
    // after the STE became valid: the driver makes it abort again before freeing the CD.
    let done = bus.lock().stats.commands;
    bus.lock().reject_after = Some(done + 2);
    let r = smmu.attach(SID, &context);
    assert!(
        matches!(r, Err(SmmuError::CommandRejected { opcode: 0x03, .. })),
        "{r:?}"
    );
    assert_eq!(
        mem.used_pages(),
        idle,
        "the CD was freed after the rollback"
    );
    assert_eq!(bus.lock().translate(0x10, WINDOW, false), None);
    assert_eq!(
        smmu.detach(SID),
        Err(SmmuError::StreamNotAttached { stream: 0x10 })
    );
    smmu.attach(SID, &context).unwrap();
    smmu.detach(SID).unwrap();

    // The last SYNC never completes, nor does the rollback's: the SMMU may still fetch the
    // CD, so it is kept and the stream stays recorded until a detach confirms the abort.
    let done = bus.lock().stats.commands;
    bus.lock().freeze_after = Some(done + 3);
    let r = smmu.attach(SID, &context);
    assert!(
        matches!(r, Err(SmmuError::CommandSyncTimeout { .. })),
        "{r:?}"
    );
    assert_eq!(mem.used_pages(), idle + 1, "the CD is kept");
    {
        let mut m = bus.lock();
        m.freeze_after = None;
        m.frozen = false;
    }
    smmu.detach(SID).unwrap();
    assert_eq!(mem.used_pages(), idle);
    assert_eq!(bus.lock().translate(0x10, WINDOW, false), None);
}

#[test]
fn streams_share_an_asid_only_with_the_same_page_table() {
    let mem = memory();
    let bus = bus_with(&mem, IdRegisters::QEMU_7_2);
    let (a, b) = (table(&mem), table(&mem));
    let mut smmu = driver(&bus, &mem, Smmuv3Config::default());
    smmu.attach(SID, &ContextConfig::for_table(9, &a)).unwrap();
    // The same table under the same ASID: the TLB entries they share are right for both.
    smmu.attach(StreamId(0x11), &ContextConfig::for_table(9, &a))
        .unwrap();
    // Another table under that ASID would hit the first one's cached translations.
    assert_eq!(
        smmu.attach(StreamId(0x12), &ContextConfig::for_table(9, &b)),
        Err(SmmuError::InvalidConfig {
            what: "ASID in use by a stream with another page table"
        })
    );
    smmu.attach(StreamId(0x12), &ContextConfig::for_table(10, &b))
        .unwrap();
    // Once no stream uses ASID 9 any more, it is free for another table.
    smmu.detach(SID).unwrap();
    smmu.detach(StreamId(0x11)).unwrap();
    smmu.attach(StreamId(0x13), &ContextConfig::for_table(9, &b))
        .unwrap();
}

#[test]
fn detach_and_shutdown_clean_up() {
    let mem = memory();
    let bus = bus_with(&mem, IdRegisters::QEMU_7_2);
    let idle = mem.used_pages();
    let mut pt = table(&mem);
    let frame = mem.allocate(1, DmaDirection::Bidirectional).unwrap();
    map_page(&mut pt, WINDOW, frame.bus_addr());
    let tables = mem.used_pages();
    let mut smmu = driver(&bus, &mem, Smmuv3Config::default());
    smmu.attach(SID, &ContextConfig::for_table(9, &pt)).unwrap();
    bus.lock().dma_read(0x10, WINDOW, &mut [0u8; 4]);
    assert_eq!(bus.lock().tlb_entries(), 1);
    smmu.detach(SID).unwrap();
    {
        let mut m = bus.lock();
        assert_eq!(m.tlb_entries(), 0, "TLBI_NH_ASID on detach");
        assert_eq!(m.translate(0x10, WINDOW, false), None);
        assert_eq!(m.stats.events_written, 0, "an aborting STE records nothing");
    }
    assert_eq!(
        smmu.detach(SID),
        Err(SmmuError::StreamNotAttached { stream: 0x10 })
    );
    smmu.attach(SID, &ContextConfig::for_table(9, &pt)).unwrap();
    smmu.shutdown().unwrap();
    assert_eq!(bus.lock().cr0(), 0);
    assert_eq!(
        mem.used_pages(),
        tables,
        "stream table, queues and CDs freed"
    );
    drop(pt);
    mem.free(frame).unwrap();
    assert_eq!(mem.used_pages(), idle);

    // A second driver over an SMMU left enabled by the first.
    let first = driver(&bus, &mem, Smmuv3Config::default());
    drop(first);
    let second = driver(&bus, &mem, Smmuv3Config::default());
    assert_eq!(bus.lock().cr0(), 0xd);
    second.shutdown().unwrap();
}

proptest! {
    /// Whatever the SMMU writes into the queue, draining neither panics nor loses count.
    #[test]
    fn arbitrary_records_never_panic(records in proptest::collection::vec(any::<[u64; 4]>(), 0..40)) {
        let mem = memory();
        let bus = bus_with(&mem, IdRegisters::QEMU_7_2);
        let mut smmu = driver(&bus, &mem, Smmuv3Config { eventq_log2: 6, ..Smmuv3Config::default() });
        for r in &records {
            bus.lock().inject_event(*r);
        }
        let mut seen = 0u32;
        let summary = smmu.drain_events(|_| seen += 1).unwrap();
        prop_assert_eq!(seen as usize, records.len());
        prop_assert_eq!(summary.records as usize, records.len());
        let s = smmu.stats();
        prop_assert_eq!(
            s.fault_events + s.other_events + s.unknown_events + s.malformed_events,
            records.len() as u64
        );
    }
}

/// Every fault `take_fault` gives until the queue is empty.
fn take_all(smmu: &mut Driver<'_>) -> Vec<crate::fault::TakenFault> {
    use crate::fault::FaultSource;
    let mut out = Vec::new();
    while let Some(f) = smmu.take_fault().unwrap() {
        out.push(f);
        assert!(out.len() < 1000, "take_fault never ran dry");
    }
    out
}

#[test]
fn take_fault_gives_the_fault_records_one_by_one_and_other_events_as_lost_ones() {
    let mem = memory();
    let bus = bus_with(&mem, IdRegisters::QEMU_7_2);
    let mut smmu = driver(&bus, &mem, Smmuv3Config::default());
    {
        let mut m = bus.lock();
        // Unknown, malformed fault, good fault, configuration event.
        m.inject_event([0x00, 0, 0, 0]);
        m.inject_event([0x10 | (1 << 11) | (0x10 << 32), 1 << 35, 0x1000, 0]);
        m.inject_event([0x10 | (0x10 << 32), 1 << 35, 0x2000, 0]);
        m.inject_event([0x04 | (0x11 << 32), 0, 0, 0]);
    }
    let taken = take_all(&mut smmu);
    // A record that does not decode may have been a fault, and a configuration event ended
    // some transaction: no record, others lost.
    assert_eq!(taken.len(), 4);
    assert_eq!((taken[0].record, taken[0].lost), (None, true));
    assert_eq!((taken[1].record, taken[1].lost), (None, true));
    let record = taken[2].record.unwrap();
    assert_eq!(
        (record.iova, record.stream, taken[2].lost),
        (Iova::new(0x2000), SID, false)
    );
    assert_eq!((taken[3].record, taken[3].lost), (None, true));
    let s = smmu.stats();
    assert_eq!(
        (
            s.unknown_events,
            s.malformed_events,
            s.fault_events,
            s.other_events
        ),
        (1, 1, 1, 1)
    );
}

#[test]
fn take_fault_reports_an_overflow_once_and_keeps_working() {
    let mem = memory();
    let bus = bus_with(&mem, IdRegisters::QEMU_7_2);
    let mut smmu = driver(
        &bus,
        &mem,
        Smmuv3Config {
            eventq_log2: 2,
            ..Smmuv3Config::default()
        },
    );
    let pt = table(&mem);
    smmu.attach(SID, &ContextConfig::for_table(1, &pt)).unwrap();
    // 64 faulting bytes: 16 records, 4 fit; the overflow shows once the queue is empty.
    bus.lock().dma_read(0x10, WINDOW, &mut [0u8; 64]);
    let taken = take_all(&mut smmu);
    assert_eq!(taken.len(), 5);
    assert!(taken[..4].iter().all(|t| t.record.is_some()));
    assert_eq!((taken[4].record, taken[4].lost), (None, true));
    assert!(take_all(&mut smmu).is_empty(), "reported once");
    bus.lock().dma_read(0x10, WINDOW, &mut [0u8; 8]);
    let taken = take_all(&mut smmu);
    assert_eq!(taken.len(), 2);
    assert!(taken.iter().all(|t| t.record.is_some() && !t.lost));
    assert_eq!(smmu.stats().overflows, 1);
}
