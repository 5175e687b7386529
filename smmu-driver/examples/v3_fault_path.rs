//! Benchmark: the SMMUv3 software fault path per fault, on the host, with the driver talking to
//! the register model (`smmu_driver::v3::model`) through the `hal` register seam.
//!
//! Per fault it measures what the driver and the shared fault path do when a non-stalled
//! translation fault arrives on a PCIe stream whose pager is full (the steady state of the
//! `smmuv3-faults` firmware program):
//!
//! 1. decode: EVENTQ_PROD read, the 32-byte record read and decoded into a `FaultRecord`,
//!    EVENTQ_CONS written (batched per drain, as the driver does);
//! 2. make room: the pager evicts its oldest page: unmap, `CMD_TLBI_NH_VA` + `CMD_SYNC`
//!    through the command queue (the model consumes commands when CMDQ_PROD is written, as
//!    QEMU does);
//! 3. policy and map: `Smmuv3::service_fault` = `FaultHandler::decide` (region lookup, table
//!    walk, resolver estimate, `StandardPolicy::RetransmitOnly`) + `fix` (resolve, map the
//!    4 KiB page) + its (empty) invalidation list;
//! 4. the decision: `TerminateAndRetransmit`, checked.
//!
//! Not included: producing the event (the model writes records before the timed batch) and
//! copying page data to or from a backing store (the memory manager's cost).
//!
//! Run: `cargo run --release -p smmu-driver --example v3_fault_path [faults]`
//! Instructions per fault: see docs/smmu-driver.md ("SMMUv3 fault-path benchmark"), which
//! runs it under `valgrind --tool=callgrind --toggle-collect=*timed_batch*`.

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use hal::delay::NoDelay;
use hal::dma::{DmaDirection, DmaMemory, HostDma};
use hal::model::ModelBus;
use hal::{Iova, PageSize, PhysAddr};
use smmu_driver::fault::{
    AccessKind, FaultCost, FaultDecision, FaultHandler, FaultResolver, RegionSet, RegisteredRegion,
    ResolveError, ResolveEstimate, ResolvedPage, StandardPolicy, StreamId,
};
use smmu_driver::pagetable::{Attributes, PageTable, PageTableConfig, Permissions};
use smmu_driver::v3::model::Smmuv3Model;
use smmu_driver::v3::{ContextConfig, Event, Smmuv3, Smmuv3Config};

const STREAM: StreamId = StreamId(0x10);
const WINDOW: u64 = 0x40_0000;
const WINDOW_PAGES: u64 = 1024;
const FRAMES: usize = 64;
const BATCH: usize = 1024;
const ASID: u16 = 1;

/// A pager with a fixed frame pool: resolving takes a free frame; the caller evicts the
/// oldest page first when none is free.
struct Pager {
    regions: RegionSet<1>,
    free: Vec<PhysAddr>,
    resident: VecDeque<(u64, PhysAddr)>,
}

impl FaultResolver for Pager {
    fn region(&self, stream: StreamId, iova: Iova) -> Option<RegisteredRegion> {
        self.regions.find(stream, iova)
    }
    fn estimate(&self, _: StreamId, _: Iova, _: AccessKind) -> ResolveEstimate {
        ResolveEstimate::Major
    }
    fn resolve(
        &mut self,
        _: StreamId,
        iova: Iova,
        _: AccessKind,
    ) -> Result<ResolvedPage, ResolveError> {
        let frame = self.free.pop().ok_or(ResolveError(1))?;
        self.resident
            .push_back((iova.align_down(PageSize::Size4K).as_u64(), frame));
        Ok(ResolvedPage {
            frame,
            size: PageSize::Size4K,
            attributes: Attributes::normal(Permissions::READ_WRITE),
            cost: FaultCost::Major,
        })
    }
}

type Driver<'a> = Smmuv3<'a, ModelBus<Smmuv3Model>, Arc<HostDma>, NoDelay>;

/// Services one batch of faults already in the event queue; returns how many.
#[inline(never)]
fn timed_batch(
    smmu: &mut Driver<'_>,
    handler: &mut FaultHandler<StandardPolicy>,
    pager: &mut Pager,
    table: &mut PageTable<Arc<HostDma>>,
    records: &mut Vec<smmu_driver::fault::FaultRecord>,
) -> usize {
    records.clear();
    let summary = smmu
        .drain_events(|e| {
            if let Ok(Event::Fault(r)) = e {
                records.push(r);
            }
        })
        .expect("drain");
    assert!(!summary.overflow);
    for record in records.iter() {
        if pager.free.is_empty() {
            let (victim, frame) = pager.resident.pop_front().expect("a resident page");
            let changed = table
                .unmap(Iova::new(victim), 4096, &mut smmu.tlb(ASID))
                .expect("unmap");
            smmu.invalidate(ASID, &changed).expect("TLBI + sync");
            pager.free.push(frame);
        }
        let outcome = smmu
            .service_fault(record, handler, pager, table)
            .expect("service");
        assert_eq!(outcome.decision, FaultDecision::TerminateAndRetransmit);
        black_box(&outcome);
    }
    records.len()
}

/// CPU time of this thread in ns (Linux `/proc/thread-self/schedstat`, first field), so a
/// loaded machine does not inflate the result the way wall time does.
fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn main() {
    let faults: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let mem = Arc::new(HostDma::new(PhysAddr::new(0x4000_0000), 4096).expect("arena"));
    let bus = ModelBus::new(Smmuv3Model::qemu(mem.clone()));
    let mut smmu: Driver<'_> = Smmuv3::new(
        &bus,
        mem.clone(),
        NoDelay::default(),
        Smmuv3Config {
            eventq_log2: 11,
            ..Smmuv3Config::default()
        },
    )
    .expect("SMMU");
    let mut table = PageTable::new(
        mem.clone(),
        PageTableConfig {
            output_bits: 44,
            ..PageTableConfig::default()
        },
    )
    .expect("table");
    smmu.attach(STREAM, &ContextConfig::for_table(ASID, &table))
        .expect("attach");
    let frames = mem
        .allocate(FRAMES, DmaDirection::Bidirectional)
        .expect("frames");
    let mut regions = RegionSet::new();
    regions
        .register(RegisteredRegion {
            stream: STREAM,
            start: Iova::new(WINDOW),
            len: WINDOW_PAGES * 4096,
            writable: true,
        })
        .expect("region");
    let mut pager = Pager {
        regions,
        free: (0..FRAMES as u64)
            .map(|i| PhysAddr::new(frames.bus_addr().as_u64() + i * 4096))
            .collect(),
        resident: VecDeque::new(),
    };
    let mut handler = FaultHandler::new(StandardPolicy::RetransmitOnly);
    let mut records = Vec::with_capacity(BATCH);

    // Each record is an F_TRANSLATION read at a page that is not resident: walk the window
    // in order, so a page comes back only after FRAMES others pushed it out.
    let mut next_page = 0u64;
    let mut produce = |bus: &ModelBus<Smmuv3Model>, n: usize| {
        let mut m = bus.lock();
        for _ in 0..n {
            let iova = WINDOW + (next_page % WINDOW_PAGES) * 4096 + 0x10;
            next_page += 1;
            m.inject_event([0x10 | (0x10 << 32), 1 << 35, iova, 0]);
        }
    };

    // Warm up (fills the frame pool so every timed fault evicts), then measure.
    produce(&bus, BATCH);
    timed_batch(
        &mut smmu,
        &mut handler,
        &mut pager,
        &mut table,
        &mut records,
    );
    let before = *smmu.stats();
    let model_before = bus.lock().stats;
    let mut done = 0usize;
    let mut elapsed = std::time::Duration::ZERO;
    let mut cpu_ns = Some(0u64);
    while done < faults {
        let n = BATCH.min(faults - done);
        produce(&bus, n);
        let cpu_start = thread_cpu_ns();
        let start = Instant::now();
        done += timed_batch(
            &mut smmu,
            &mut handler,
            &mut pager,
            &mut table,
            &mut records,
        );
        elapsed += start.elapsed();
        cpu_ns = match (cpu_ns, cpu_start, thread_cpu_ns()) {
            (Some(total), Some(a), Some(b)) => Some(total + b.saturating_sub(a)),
            _ => None,
        };
    }
    let after = *smmu.stats();
    let model_after = bus.lock().stats;
    let per = |x: u64| x as f64 / done as f64;
    println!("SMMUv3 fault path, model-backed register seam, {done} faults:");
    match cpu_ns {
        Some(cpu) => println!(
            "  {:.0} ns/fault of CPU time (target <= 1000 ns), {:.0} ns/fault wall",
            cpu as f64 / done as f64,
            elapsed.as_nanos() as f64 / done as f64
        ),
        None => println!(
            "  {:.0} ns/fault wall (no thread CPU clock here; target <= 1000 ns of CPU)",
            elapsed.as_nanos() as f64 / done as f64
        ),
    }
    println!(
        "  per fault: {:.2} commands, {:.2} CMD_SYNC, {:.2} TLBI_NH_VA, {:.2} event records",
        per(after.commands - before.commands),
        per(after.syncs - before.syncs),
        per(after.tlbi_va - before.tlbi_va),
        per(after.events - before.events)
    );
    println!(
        "  model: {:.2} commands consumed per fault, {} TLB entries live",
        per(model_after.commands - model_before.commands),
        bus.lock().tlb_entries()
    );
    println!("  fault handler: {:?}", handler.stats());
}
