//! The unchanged NPE driver (`dma_engine::npe::Npe`) on two RTL engines connected link to
//! link, their data ports behind sim's MMU-500 model that the SMMUv2 driver programs, every
//! fault answered by the shared fault service (`npe_cosim::board`). Expected outcomes come
//! from docs/dma-engine.md, docs/protocol.md and docs/mmu500.md, not from the code under
//! test.

use std::sync::Arc;

use boards::pager::{Fill, pattern_byte};
use dma_engine::DmaError;
use hal::PhysAddr;
use hal::dma::HostDma;
use npe_cosim::CosimError;
use npe_cosim::board::{Board, DRAM_PAGES, FaultModes, Region};
use protocol::{AbortReason, CompletionStatus, DeliveryStatus, FaultReason, TransferDesc};
use smmu_driver::v2::FaultModel;

/// Engine 0's source buffers (protection domain 1) and engine 1's receive buffers (2).
const SRC: u64 = 0x1000_0000;
const DST: u64 = 0x2000_0000;
const SRC_PD: u16 = 1;
const DST_PD: u16 = 2;
const REGION_PAGES: usize = 16;
const SESSION: u32 = 0x5e55;
/// Clocks any one test phase may take (about 0.2 s of model time: no phase needs more than
/// a few ACK timeouts).
const BUDGET: u64 = 2_000_000;

fn dram() -> Arc<HostDma> {
    Arc::new(HostDma::new(PhysAddr::new(0), DRAM_PAGES).expect("host memory"))
}

/// A board with engine 0's channel 0 connected to engine 1, a source region of patterned
/// bytes and a zeroed destination region, every page absent.
fn board(dram: &Arc<HostDma>, modes: FaultModes, backpressure: u32, seed: u64) -> Board<'_> {
    let mut b = Board::new(dram, modes, backpressure, seed).expect("board");
    b.connect(0, 0, SRC_PD, 1, DST_PD, SESSION)
        .expect("connect");
    b.add_region(
        &Region {
            engine: 0,
            pdid: SRC_PD,
            write: false,
            writable: false,
            base: SRC,
            pages: REGION_PAGES,
        },
        Fill::Pattern(7),
    )
    .expect("source region");
    b.add_region(
        &Region {
            engine: 1,
            pdid: DST_PD,
            write: true,
            writable: true,
            base: DST,
            pages: REGION_PAGES,
        },
        Fill::Byte(0),
    )
    .expect("destination region");
    b
}

fn desc(src: u64, dest: u64, len: u64, tag: u64) -> TransferDesc {
    TransferDesc {
        src,
        dest,
        len,
        key: u32::from(DST_PD),
        tag,
    }
}

/// The destination holds exactly the source's bytes.
fn assert_copied(b: &Board<'_>, src: u64, dest: u64, len: u64) {
    let got = b.read(dest, len as usize).expect("destination");
    let want: Vec<u8> = (0..len).map(|i| pattern_byte(src + i, 7)).collect();
    if let Some(at) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "{len} bytes from {src:#x} to {dest:#x}: byte {at} is {:#04x}, want {:#04x}",
            got[at], want[at]
        );
    }
}

fn map_all(b: &mut Board<'_>) {
    for p in 0..REGION_PAGES as u64 {
        b.map_now(SRC + p * 4096).expect("map source");
        b.map_now(DST + p * 4096).expect("map destination");
    }
}

#[test]
fn transfers_of_several_sizes_arrive_byte_exact_in_order() {
    let dram = dram();
    let mut b = board(&dram, FaultModes::TERMINATE, 20, 11);
    map_all(&mut b);
    // (source offset, destination offset, length): a byte, unaligned, one block, one block
    // and a byte across pages, the driver's largest transfer (8 blocks).
    let cases: [(u64, u64, u64); 5] = [
        (0, 0, 1),
        (0x1005, 0x1ff3, 100),
        (0x2000, 0x3000, 4096),
        (0x3ff1, 0x5003, 4097),
        (0x6000, 0x7000, 8 * 4096),
    ];
    for (tag, &(s, d, len)) in cases.iter().enumerate() {
        b.submit(0, 0, desc(SRC + s, DST + d, len, tag as u64))
            .expect("submit");
    }
    b.run_to_completions(0, cases.len(), BUDGET).expect("run");
    let done = b.completions(0);
    for (i, (ch, c)) in done.iter().enumerate() {
        assert_eq!(
            (*ch, c.tag, c.status),
            (0, i as u64, CompletionStatus::Ok),
            "{c:?}"
        );
        assert_eq!(c.retransmissions, 0, "nothing faulted: {c:?}");
    }
    for &(s, d, len) in &cases {
        assert_copied(&b, SRC + s, DST + d, len);
    }
    b.run_until("deliveries", BUDGET, |b| {
        b.deliveries(1).len() == cases.len()
    })
    .expect("deliveries");
    for (i, (slot, d)) in b.deliveries(1).iter().enumerate() {
        assert_eq!(
            (*slot, d.tid.0, d.status),
            (0, i as u32, DeliveryStatus::Complete)
        );
    }
    assert_eq!(b.smmu_stats().context_faults, 0);
    assert_eq!(b.counts().records, 0);

    // A source page taken away and rewritten while absent: the next read faults (the
    // reading bank's TLB entry was invalidated with the unmapping), the page comes back with
    // its new bytes, and those arrive.
    b.evict(SRC + 0x2000).expect("evict");
    let fresh: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    b.write(SRC + 0x2000, &fresh).expect("write");
    b.submit(0, 0, desc(SRC + 0x2000, DST + 0xa000, 4096, 9))
        .expect("submit");
    b.run_to_completions(0, cases.len() + 1, BUDGET)
        .expect("run");
    let (_, c) = b.completions(0)[cases.len()];
    assert_eq!(c.status, CompletionStatus::Ok, "{c:?}");
    let got = b.read(DST + 0xa000, 4096).expect("read");
    let first = (0..4096).find(|&i| got[i] != fresh[i]);
    assert_eq!(first, None, "first differing byte (stale translation?)");
    assert_eq!(b.counts().records, 1, "{:?}", b.counts());
}

#[test]
fn both_engines_send_at_once() {
    let dram = dram();
    let mut b = board(&dram, FaultModes::TERMINATE, 20, 16);
    // The other way too: engine 1's sources (its domain 1) to engine 0's receive buffers
    // (its domain 2), on engine 1's channel 1, every page of both directions absent.
    const SRC1: u64 = 0x1400_0000;
    const DST0: u64 = 0x2400_0000;
    b.connect(1, 1, SRC_PD, 0, DST_PD, SESSION + 1)
        .expect("connect");
    for (engine, write, base, fill) in [
        (1, false, SRC1, Fill::Pattern(7)),
        (0, true, DST0, Fill::Byte(0)),
    ] {
        b.add_region(
            &Region {
                engine,
                pdid: if write { DST_PD } else { SRC_PD },
                write,
                writable: write,
                base,
                pages: 4,
            },
            fill,
        )
        .expect("region");
    }
    for tag in 0..3u64 {
        b.submit(
            0,
            0,
            desc(SRC + tag * 0x1010, DST + tag * 0x1100, 3000, tag),
        )
        .expect("submit");
        b.submit(
            1,
            1,
            desc(SRC1 + tag * 0x1010, DST0 + tag * 0x1100, 3000, tag),
        )
        .expect("submit");
    }
    b.run_until("both directions", BUDGET, |b| {
        b.completions(0).len() == 3 && b.completions(1).len() == 3
    })
    .expect("run");
    for (engine, channel, src, dst) in [(0, 0, SRC, DST), (1, 1, SRC1, DST0)] {
        for (i, (ch, c)) in b.completions(engine).iter().enumerate() {
            assert_eq!(
                (*ch, c.tag, c.status),
                (channel, i as u64, CompletionStatus::Ok)
            );
        }
        for tag in 0..3u64 {
            assert_copied(&b, src + tag * 0x1010, dst + tag * 0x1100, 3000);
        }
    }
}

#[test]
fn terminated_faults_at_both_ends_are_resolved_and_resent() {
    let dram = dram();
    let mut b = board(&dram, FaultModes::TERMINATE, 20, 12);
    // Every page absent at both ends: each block's source read and destination write is
    // terminated once (SLVERR), the fault service pages it in, the driver re-sends.
    b.submit(0, 0, desc(SRC + 0x10, DST + 0x20, 3 * 4096, 0))
        .expect("submit");
    b.submit(0, 0, desc(SRC + 0x8000, DST + 0x8000, 100, 1))
        .expect("submit");
    b.run_to_completions(0, 2, BUDGET).expect("run");
    let done = b.completions(0);
    assert!(
        done.iter().all(|(_, c)| c.status == CompletionStatus::Ok),
        "{done:?}"
    );
    assert_eq!(
        (done[0].1.tag, done[1].1.tag),
        (0, 1),
        "in submission order"
    );
    assert_copied(&b, SRC + 0x10, DST + 0x20, 3 * 4096);
    assert_copied(&b, SRC + 0x8000, DST + 0x8000, 100);
    let (src, dst) = (
        b.driver(0).expect("engine").stats(),
        b.driver(1).expect("engine").stats(),
    );
    assert!(src.local_faults >= 1, "source reads terminated: {src:?}");
    assert!(
        dst.dest_faults >= 1,
        "destination writes terminated: {dst:?}"
    );
    assert!(dst.nacks_sent >= 1 && dst.resolved_sent >= 1, "{dst:?}");
    let resent: u32 = done.iter().map(|(_, c)| c.retransmissions).sum();
    assert!(
        resent >= 1,
        "blocks NACKed at the destination are sent again"
    );
    let smmu = b.smmu_stats();
    assert_eq!(smmu.stalls, 0, "terminate banks never stall");
    assert!(smmu.terminated >= 2, "{smmu:?}");
    let counts = b.counts();
    assert_eq!(counts.resumed, 0);
    assert!(counts.retransmit >= 2, "{counts:?}");
    assert_eq!((counts.aborted, counts.unresolvable), (0, 0), "{counts:?}");
    // Four pages and one at each end, each paged in once.
    assert_eq!(b.pager().stats().page_ins, 10, "{:?}", b.pager().stats());
}

#[test]
fn stalled_minor_faults_resume_and_major_ones_terminate_and_retry() {
    let dram = dram();
    let modes = FaultModes {
        read: FaultModel::Stall,
        write: FaultModel::Stall,
    };
    let mut b = board(&dram, modes, 20, 13);
    // Source: page 0 resident but unmapped (minor: resumed in place), page 1 absent (major:
    // terminated, made present, the engine's read retried by the driver). Destination:
    // page 0 minor, page 1 mapped.
    b.make_resident(SRC).expect("resident");
    b.make_resident(DST).expect("resident");
    b.map_now(DST + 4096).expect("map");
    b.submit(0, 0, desc(SRC, DST, 2 * 4096, 0)).expect("submit");
    b.run_to_completions(0, 1, BUDGET).expect("run");
    let (_, c) = b.completions(0)[0];
    assert_eq!(c.status, CompletionStatus::Ok, "{c:?}");
    assert_copied(&b, SRC, DST, 2 * 4096);
    // Each of the three pages faults once; the SMMU holds every one of them (stall banks).
    let counts = b.counts();
    assert_eq!(
        (counts.records, counts.resumed, counts.retransmit),
        (3, 2, 1),
        "both minor faults resumed, the major one terminated: {counts:?}"
    );
    let smmu = b.smmu_stats();
    assert_eq!((smmu.stalls, smmu.resumes_accepted), (3, 3), "{smmu:?}");
    assert_eq!(
        b.driver(1).expect("engine").stats().dest_faults,
        0,
        "the destination's stall was resumed"
    );
    assert!(
        b.driver(0).expect("engine").stats().local_faults >= 1,
        "the terminated read reached the driver"
    );
}

#[test]
fn bad_input_gives_the_documented_status() {
    let dram = dram();
    let mut b = board(&dram, FaultModes::TERMINATE, 0, 14);
    map_all(&mut b);
    // The driver refuses an address beyond the engine's 49 bits (typed, nothing posted).
    let refused = b.submit(0, 0, desc(1 << 49, DST, 64, 9));
    assert!(
        matches!(
            refused,
            Err(CosimError::Dma(DmaError::InvalidTransfer { .. }))
        ),
        "{refused:?}"
    );
    // The board has two engines.
    assert!(matches!(
        b.submit(2, 0, desc(SRC, DST, 64, 9)),
        Err(CosimError::NoSuchEngine { engine: 2 })
    ));
    // 0: a source outside every registered region: the SMMU faults, the fault service
    // refuses it, the driver finds it outside the region (docs/dma-engine.md §5.4).
    b.submit(0, 0, desc(0x5000_0000, DST, 64, 0))
        .expect("submit");
    // 1: a source mapped to no memory: DECERR, which no resolution can help (§3.2).
    b.map_raw(0x3000_0000, 0x7000_0000, false).expect("map");
    b.add_region(
        &Region {
            engine: 0,
            pdid: SRC_PD,
            write: false,
            writable: false,
            base: 0x3000_0000,
            pages: 1,
        },
        Fill::Byte(0),
    )
    .expect("region");
    b.submit(0, 0, desc(0x3000_0000, DST, 64, 1))
        .expect("submit");
    // 2: a destination outside the receiver's regions: a fatal NACK.
    b.submit(0, 0, desc(SRC, 0x6000_0000, 64, 2))
        .expect("submit");
    // 3: a destination registered read-only and mapped so: the SMMU's permission fault, the
    // fault service refuses the write, the receiver NACKs it for good (§5.2 step 4).
    const READ_ONLY: u64 = 0x2800_0000;
    b.add_region(
        &Region {
            engine: 1,
            pdid: DST_PD,
            write: true,
            writable: false,
            base: READ_ONLY,
            pages: 1,
        },
        Fill::Byte(0),
    )
    .expect("region");
    b.map_now(READ_ONLY).expect("map");
    b.submit(0, 0, desc(SRC, READ_ONLY, 64, 3)).expect("submit");
    // 4: the channel still works.
    b.submit(0, 0, desc(SRC + 0x40, DST + 0x40, 500, 4))
        .expect("submit");
    b.run_to_completions(0, 5, BUDGET).expect("run");
    let status: Vec<CompletionStatus> = b.completions(0).iter().map(|(_, c)| c.status).collect();
    assert_eq!(
        status,
        [
            CompletionStatus::Aborted(AbortReason::SourceFault {
                block: 0,
                reason: FaultReason::OutOfRegion
            }),
            CompletionStatus::Aborted(AbortReason::SourceFault {
                block: 0,
                reason: FaultReason::OutOfRegion
            }),
            CompletionStatus::Aborted(AbortReason::RemoteRejected {
                block: 0,
                reason: FaultReason::OutOfRegion
            }),
            CompletionStatus::Aborted(AbortReason::RemoteRejected {
                block: 0,
                reason: FaultReason::Permission
            }),
            CompletionStatus::Ok,
        ]
    );
    assert_copied(&b, SRC + 0x40, DST + 0x40, 500);
    let counts = b.counts();
    // Three refused accesses of the SMMU (the DECERR one translated): each recorded and
    // refused, or lost to FSR.MULTI when the second destination write faulted before the
    // first record was taken (MMU-500 records one fault per bank, docs/mmu500.md §2.2); the
    // driver's own classification gives the status either way.
    assert_eq!(counts.aborted, counts.records, "{counts:?}");
    assert!(
        counts.records >= 2 && counts.records + counts.lost >= 3,
        "{counts:?}"
    );
    assert_eq!((counts.resolved, counts.unresolvable), (0, 0), "{counts:?}");
    assert!(b.read(READ_ONLY, 64).expect("read").iter().all(|&x| x == 0));
    let (_, data) = b.system().port_stats(0);
    assert!(
        data.errors >= 2,
        "SLVERR and DECERR on the data port: {data:?}"
    );
}

#[test]
fn a_corrupted_packet_is_dropped_and_the_block_resent_after_its_ack_timeout() {
    let dram = dram();
    let mut b = board(&dram, FaultModes::TERMINATE, 0, 15);
    map_all(&mut b);
    // One payload bit of the first data packet from engine 0 flips on the link.
    let mut armed = true;
    let mut flit = 0u32;
    b.system().set_link_hook(Box::new(move |_dst, vc, f| {
        if vc != 0 {
            return;
        }
        flit += 1;
        if armed && flit == 3 {
            f.data[1] ^= 1 << 9;
            armed = false;
        }
        if f.last {
            flit = 0;
        }
    }));
    b.submit(0, 0, desc(SRC, DST, 4096, 0)).expect("submit");
    b.run_to_completions(0, 1, BUDGET).expect("run");
    let (_, c) = b.completions(0)[0];
    assert_eq!(
        (c.status, c.retransmissions),
        (CompletionStatus::Ok, 1),
        "{c:?}"
    );
    assert_copied(&b, SRC, DST, 4096);
    assert!(
        b.driver(1).expect("engine").stats().engine_events >= 1,
        "GEVENT.CRC_DROP seen"
    );
}
