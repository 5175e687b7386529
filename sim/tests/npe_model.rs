//! The NPE model against its specification (docs/dma-engine.md), driven register by register
//! without the driver: queue errors that must stop a queue without losing anything, ring
//! bases past the end of memory, bursts longer than one `advance`, LINK_ERROR, and the
//! channel states between descriptors.

use dma_engine::npe::desc::{
    CQ_ENTRY, CqEntry, EntryStatus, InlineMsg, RQ_ENTRY, SqEntry, SqOp, WCQ_ENTRY, WcqEntry,
    WqEntry, WqOp,
};
use hal::barrier::Barrier;
use hal::dma::HostDma;
use hal::model::RegisterModel;
use hal::regs::AccessWidth;
use hal::{Iova, PhysAddr};
use sim::axi::{AxiOutcome, AxiTranslate, StallResolution, StallToken};
use sim::des::ModelTime;
use sim::npe::{Advance, EngineCtx, Frame, NpeModel, NpeModelParams};
use smmu_driver::fault::{AccessKind, StreamId};

const DRAM: u64 = 0x1000_0000;
const W32: AccessWidth = AccessWidth::U32;
const W64: AccessWidth = AccessWidth::U64;
const CH0: usize = 0x1000;
/// Global registers (§3.1).
const NODE: usize = 0x008;
const CTRL: usize = 0x00c;
const GEVENT: usize = 0x014;
const RQ_BASE: usize = 0x020;
const RQ_CFG: usize = 0x028;
const RQ_HEAD: usize = 0x02c;
const RQ_TAIL: usize = 0x030;
const WQ_BASE: usize = 0x038;
const WQ_CFG: usize = 0x040;
const WQ_TAIL: usize = 0x044;
const WQ_HEAD: usize = 0x048;
const WCQ_BASE: usize = 0x050;
const WCQ_CFG: usize = 0x058;
const WCQ_TAIL: usize = 0x060;
/// Channel registers (§3.2), relative to the channel.
const SQ_BASE: usize = 0x00;
const SQ_CFG: usize = 0x08;
const SQ_TAIL: usize = 0x0c;
const CQ_BASE: usize = 0x18;
const CQ_CFG: usize = 0x20;
const CQ_TAIL: usize = 0x28;
const CH_CTRL: usize = 0x2c;
const CH_STATUS: usize = 0x30;
const CH_IRQ: usize = 0x34;
const FAULT_SYNDROME: usize = 0x44;
const RESUME: usize = 0x48;
const GEVENT_LINK_ERROR: u64 = 2;
const GEVENT_QUEUE_ERROR: u64 = 0x10;
const IRQ_ERROR: u64 = 4;
/// Nothing at this address: outside the test's DRAM.
const NOWHERE: u64 = 0x80;

/// Identity translation; accesses at or above `terminate_from` are terminated, and those at
/// or above `decode_error_from` pass translation but find no memory.
struct Identity {
    terminate_from: u64,
    decode_error_from: u64,
}

impl Identity {
    fn all() -> Self {
        Self {
            terminate_from: u64::MAX,
            decode_error_from: u64::MAX,
        }
    }
}

impl AxiTranslate for Identity {
    fn translate(&mut self, _: ModelTime, _: StreamId, iova: Iova, _: AccessKind) -> AxiOutcome {
        if iova.as_u64() >= self.terminate_from {
            AxiOutcome::Terminated
        } else if iova.as_u64() >= self.decode_error_from {
            AxiOutcome::Ok(PhysAddr::new(0x4_0000_0000))
        } else {
            AxiOutcome::Ok(PhysAddr::new(iova.as_u64()))
        }
    }

    fn stall_outcome(&mut self, _: StallToken) -> Option<StallResolution> {
        None
    }
}

struct Bench {
    now: ModelTime,
    npe: NpeModel,
    dram: HostDma,
    axi: Identity,
    out: Vec<Frame>,
}

impl Bench {
    /// Node 0 of 2, NODE programmed and VALID, engine enabled.
    fn new() -> Self {
        let mut npe = NpeModel::new(NpeModelParams::new(0, 2));
        npe.write(NODE, W32, 1 << 31);
        npe.write(CTRL, W32, 1);
        Self {
            now: ModelTime::ZERO,
            npe,
            dram: HostDma::new(PhysAddr::new(DRAM), 128).unwrap(),
            axi: Identity::all(),
            out: Vec::new(),
        }
    }

    /// Everything that happens now, then at each wake-up the engine asks for.
    fn advance(&mut self) -> Advance {
        loop {
            let a = self.npe.advance(&mut EngineCtx {
                now: self.now,
                dram: &self.dram,
                axi: &mut self.axi,
                out: &mut self.out,
            });
            match a.next {
                Some(t) if t > self.now => self.now = t,
                _ => return a,
            }
        }
    }

    /// One call of `advance` at the current time.
    fn advance_once(&mut self) -> Advance {
        self.npe.advance(&mut EngineCtx {
            now: self.now,
            dram: &self.dram,
            axi: &mut self.axi,
            out: &mut self.out,
        })
    }

    fn reg(&mut self, offset: usize) -> u64 {
        self.npe.read(offset, W32)
    }

    fn set(&mut self, offset: usize, value: u64) {
        self.npe.write(offset, W32, value);
    }

    fn set64(&mut self, offset: usize, value: u64) {
        self.npe.write(offset, W64, value);
    }

    /// Channel 0 with an SQ at `sq` and a CQ at `cq`, 4 entries each, enabled.
    fn channel(&mut self, sq: u64, cq: u64) {
        self.set64(CH0 + SQ_BASE, sq);
        self.set(CH0 + SQ_CFG, 2);
        self.set64(CH0 + CQ_BASE, cq);
        self.set(CH0 + CQ_CFG, 2);
        self.set(CH0 + CH_CTRL, 1);
    }

    /// RQ, WQ and WCQ of `2^log2` entries each, at DRAM + 0x8000, + 0xc000 and + 0xe000.
    fn engine_rings(&mut self, log2: u64) -> (u64, u64, u64) {
        let (rq, wq, wcq) = (DRAM + 0x8000, DRAM + 0x2_0000, DRAM + 0x3_0000);
        self.set64(RQ_BASE, rq);
        self.set(RQ_CFG, log2);
        self.set64(WQ_BASE, wq);
        self.set(WQ_CFG, log2);
        self.set64(WCQ_BASE, wcq);
        self.set(WCQ_CFG, log2);
        (rq, wq, wcq)
    }

    fn put(&self, addr: u64, bytes: &[u8]) {
        self.dram.write_phys(PhysAddr::new(addr), bytes).unwrap();
    }

    fn sq_entry(&self, sq: u64, index: u64, entry: &SqEntry) {
        self.put(sq + index * 128, &entry.encode());
    }

    fn cq_entry(&self, cq: u64, index: u64) -> CqEntry {
        let mut b = [0u8; CQ_ENTRY];
        self.dram
            .read_phys(PhysAddr::new(cq + index * CQ_ENTRY as u64), &mut b)
            .unwrap();
        CqEntry::decode(&b).unwrap()
    }

    fn wcq_entry(&self, wcq: u64, index: u64) -> WcqEntry {
        let mut b = [0u8; WCQ_ENTRY];
        self.dram
            .read_phys(PhysAddr::new(wcq + index * WCQ_ENTRY as u64), &mut b)
            .unwrap();
        WcqEntry::decode(&b).unwrap()
    }

    /// The slot of the BLOCK entry at RQ index `index` (word 0 [15:8]).
    fn rq_slot(&self, rq: u64, index: u64) -> u8 {
        let mut b = [0u8; RQ_ENTRY];
        self.dram
            .read_phys(PhysAddr::new(rq + index * RQ_ENTRY as u64), &mut b)
            .unwrap();
        b[1]
    }

    fn ring(&mut self, doorbell: usize, tail: u64) {
        self.npe.barrier(Barrier::DsbSt);
        self.set(doorbell, tail);
    }
}

fn msg() -> InlineMsg {
    InlineMsg::new(&[1u8; 32]).unwrap()
}

fn nop(cookie: u64) -> SqEntry {
    SqEntry {
        op: SqOp::Nop,
        signal: true,
        tid14: 0,
        peer: 1,
        dst_pdid: 0,
        cookie,
        msg: InlineMsg::EMPTY,
    }
}

fn send_msg(peer: u32, cookie: u64) -> SqEntry {
    SqEntry {
        op: SqOp::SendMsg,
        peer,
        msg: msg(),
        ..nop(cookie)
    }
}

fn send_block(src_va: u64, peer: u32, cookie: u64) -> SqEntry {
    SqEntry {
        op: SqOp::SendBlock {
            src_va,
            length: 4096,
            dst_va: 0,
        },
        peer,
        msg: msg(),
        ..nop(cookie)
    }
}

fn block(len: usize) -> Frame {
    Frame {
        src: 1,
        dst: 0,
        pdid: 0,
        tid14: 0,
        msg: msg(),
        payload: Some(vec![7; len]),
        crc_error: false,
    }
}

#[test]
fn a_burst_longer_than_any_fixed_number_of_rounds_is_finished_in_one_advance() {
    let mut b = Bench::new();
    let (_, wq, _) = b.engine_rings(7);
    for i in 0..100u64 {
        let e = WqEntry {
            op: WqOp::Release,
            slot: 0,
            cookie: i,
        };
        b.put(wq + i * 32, &e.encode());
    }
    b.ring(WQ_TAIL, 100);
    let a = b.advance_once();
    assert_eq!(b.reg(WQ_HEAD), 100);
    assert_eq!(a.next, None, "nothing left to do");
}

#[test]
fn forty_terminated_commits_all_complete_in_one_advance() {
    let mut b = Bench::new();
    let (rq, wq, wcq) = b.engine_rings(6);
    b.axi.terminate_from = 0x9000_0000;
    for _ in 0..40 {
        b.npe.deliver(block(4096));
    }
    b.advance();
    assert_eq!(b.npe.slots_in_use(), 40);
    for i in 0..40u64 {
        let e = WqEntry {
            op: WqOp::Commit {
                pdid: 0,
                length: 4096,
                dst_va: 0x9000_0000 + i * 4096,
            },
            slot: b.rq_slot(rq, i),
            cookie: i,
        };
        b.put(wq + i * 32, &e.encode());
    }
    b.set(RQ_HEAD, 40);
    b.ring(WQ_TAIL, 40);
    b.advance_once();
    assert_eq!(b.reg(WCQ_TAIL), 40);
    let last = b.wcq_entry(wcq, 39);
    assert_eq!((last.status, last.cookie), (EntryStatus::DstFault, 39));
    assert_eq!(b.npe.slots_in_use(), 0);
}

#[test]
fn a_cq_base_at_the_top_of_the_address_space_stops_the_channel_and_keeps_the_entry() {
    let mut b = Bench::new();
    let (sq, cq) = (DRAM, DRAM + 0x4000);
    b.channel(sq, cq);
    b.sq_entry(sq, 0, &nop(1));
    b.sq_entry(sq, 1, &nop(2));
    b.ring(CH0 + SQ_TAIL, 1);
    b.advance();
    assert_eq!(b.reg(CH0 + CQ_TAIL), 1);
    // base + index * 32 overflows: the write fails like one outside memory, no panic.
    b.set64(CH0 + CQ_BASE, 0xffff_ffff_ffff_ffe0);
    b.ring(CH0 + SQ_TAIL, 2);
    b.advance();
    assert_eq!(b.reg(CH0 + CH_STATUS) & 7, 3, "ERROR");
    assert_ne!(b.reg(CH0 + CH_IRQ) & IRQ_ERROR, 0);
    assert_eq!(b.reg(CH0 + CQ_TAIL), 1, "nothing posted");
    assert_eq!(b.npe.stats().queue_errors, 1);
    // A good base again: the kept entry is posted, in its place in the ring.
    b.set64(CH0 + CQ_BASE, cq);
    b.advance();
    assert_eq!(b.reg(CH0 + CQ_TAIL), 2);
    assert_eq!(b.cq_entry(cq, 1).cookie, 2);
    assert_eq!(b.reg(CH0 + CH_STATUS) & 7, 0, "IDLE");
}

#[test]
fn an_sq_outside_memory_stops_the_channel_without_consuming_a_descriptor() {
    let mut b = Bench::new();
    let (sq, cq) = (DRAM, DRAM + 0x4000);
    b.channel(NOWHERE, cq);
    b.sq_entry(sq, 0, &nop(7));
    b.ring(CH0 + SQ_TAIL, 1);
    b.advance();
    assert_eq!(b.reg(CH0 + CH_STATUS) & 7, 3, "ERROR");
    assert_ne!(b.reg(CH0 + CH_IRQ) & IRQ_ERROR, 0);
    assert_eq!(b.reg(CH0 + 0x10), 0, "SQ_HEAD did not move");
    b.set64(CH0 + SQ_BASE, sq);
    b.advance();
    assert_eq!(b.cq_entry(cq, 0).cookie, 7);
}

#[test]
fn an_rq_that_cannot_be_written_holds_the_block_and_leaks_no_slot() {
    let mut b = Bench::new();
    let (rq, _, _) = b.engine_rings(2);
    b.set64(RQ_BASE, NOWHERE);
    b.npe.deliver(block(4096));
    b.advance();
    assert_eq!(b.reg(RQ_TAIL), 0);
    assert_eq!((b.npe.held(), b.npe.slots_in_use()), (1, 0));
    assert_ne!(b.reg(GEVENT) & GEVENT_QUEUE_ERROR, 0);
    b.set64(RQ_BASE, rq);
    b.advance();
    assert_eq!(b.reg(RQ_TAIL), 1);
    assert_eq!((b.npe.held(), b.npe.slots_in_use()), (0, 1));
}

#[test]
fn a_wcq_that_cannot_be_written_keeps_the_commit_result_until_it_can() {
    let mut b = Bench::new();
    let (rq, wq, wcq) = b.engine_rings(2);
    b.npe.deliver(block(64));
    b.advance();
    let e = WqEntry {
        op: WqOp::Commit {
            pdid: 0,
            length: 64,
            dst_va: DRAM + 0x5_0000,
        },
        slot: b.rq_slot(rq, 0),
        cookie: 0xc0,
    };
    b.put(wq, &e.encode());
    b.set64(WCQ_BASE, NOWHERE);
    b.ring(WQ_TAIL, 1);
    b.advance();
    assert_eq!(b.reg(WCQ_TAIL), 0);
    assert_ne!(b.reg(GEVENT) & GEVENT_QUEUE_ERROR, 0);
    b.set64(WCQ_BASE, wcq);
    b.advance();
    assert_eq!(b.reg(WCQ_TAIL), 1);
    let w = b.wcq_entry(wcq, 0);
    assert_eq!((w.status, w.cookie, w.bytes), (EntryStatus::Ok, 0xc0, 64));
}

#[test]
fn an_undecodable_write_entry_is_reported_with_its_cookie_and_frees_its_slot() {
    let mut b = Bench::new();
    let (rq, wq, wcq) = b.engine_rings(2);
    b.npe.deliver(block(64));
    b.advance();
    assert_eq!(b.npe.slots_in_use(), 1);
    let mut e = WqEntry {
        op: WqOp::Commit {
            pdid: 0,
            length: 16,
            dst_va: DRAM + 0x5_0000,
        },
        slot: b.rq_slot(rq, 0),
        cookie: 0xc00c1e,
    }
    .encode();
    e[24] = 1; // reserved word 3
    b.put(wq, &e);
    b.ring(WQ_TAIL, 1);
    b.advance();
    let w = b.wcq_entry(wcq, 0);
    assert_eq!((w.status, w.cookie), (EntryStatus::BadDescriptor, 0xc00c1e));
    assert_eq!(b.npe.slots_in_use(), 0);
}

#[test]
fn a_channel_that_skipped_a_faulting_block_runs_on_and_does_not_read_as_error() {
    let mut b = Bench::new();
    let (sq, cq) = (DRAM, DRAM + 0x4000);
    b.channel(sq, cq);
    b.axi.terminate_from = 0x9000_0000;
    b.sq_entry(sq, 0, &send_block(0x9000_0000, 1, 9));
    b.sq_entry(sq, 1, &nop(2));
    b.ring(CH0 + SQ_TAIL, 1);
    b.advance();
    assert_eq!(b.reg(CH0 + CH_STATUS) & 7, 2, "FAULT_WAIT");
    assert_eq!(b.reg(CH0 + FAULT_SYNDROME), 2 | 1 << 3, "SLVERR, VALID");
    b.set(CH0 + RESUME, 2);
    b.advance();
    assert_eq!(b.cq_entry(cq, 0).status, EntryStatus::SrcFault);
    b.ring(CH0 + SQ_TAIL, 2);
    let status = b.reg(CH0 + CH_STATUS);
    assert_eq!(status & 7, 1, "RUNNING with a descriptor pending");
    assert_eq!(status >> 8 & 0xff, 1, "LAST_ERROR keeps SRC_FAULT");
}

#[test]
fn a_read_that_finds_no_memory_reports_decerr() {
    let mut b = Bench::new();
    let (sq, cq) = (DRAM, DRAM + 0x4000);
    b.channel(sq, cq);
    b.axi.decode_error_from = 0x9000_0000;
    b.sq_entry(sq, 0, &send_block(0x9000_0000, 1, 9));
    b.ring(CH0 + SQ_TAIL, 1);
    b.advance();
    assert_eq!(b.reg(CH0 + FAULT_SYNDROME), 3 | 1 << 3, "DECERR, VALID");
}

#[test]
fn sends_to_unreachable_peers_finish_with_link_error_and_send_nothing() {
    let mut b = Bench::new();
    let (sq, cq) = (DRAM, DRAM + 0x4000);
    b.channel(sq, cq);
    b.sq_entry(sq, 0, &send_msg(0x3f_ffff, 1)); // no such node
    b.sq_entry(sq, 1, &send_msg(0, 2)); // this node: no loopback route
    b.sq_entry(sq, 2, &send_block(DRAM + 0x1_0000, 5, 3)); // node 5 of 2
    b.sq_entry(sq, 3, &send_msg(1, 4)); // the other node: sent
    b.ring(CH0 + SQ_TAIL, 4);
    b.advance();
    let statuses: Vec<_> = (0..4).map(|i| b.cq_entry(cq, i).status).collect();
    assert_eq!(
        statuses,
        [
            EntryStatus::LinkError,
            EntryStatus::LinkError,
            EntryStatus::LinkError,
            EntryStatus::Ok
        ]
    );
    assert_eq!(b.out.len(), 1);
    assert_eq!((b.out[0].src, b.out[0].dst), (0, 1));
    assert_ne!(b.reg(GEVENT) & GEVENT_LINK_ERROR, 0);
    assert_eq!(b.npe.stats().link_errors, 3);
}

#[test]
fn an_engine_whose_node_is_not_valid_sends_nothing() {
    let mut b = Bench::new();
    b.set(NODE, 0);
    let (sq, cq) = (DRAM, DRAM + 0x4000);
    b.channel(sq, cq);
    b.sq_entry(sq, 0, &send_msg(1, 1));
    b.ring(CH0 + SQ_TAIL, 1);
    b.advance();
    assert_eq!(b.cq_entry(cq, 0).status, EntryStatus::LinkError);
    assert!(b.out.is_empty());
}

#[test]
fn a_second_doorbell_of_a_ring_after_one_barrier_is_unordered() {
    let mut b = Bench::new();
    b.channel(DRAM, DRAM + 0x4000);
    b.ring(CH0 + SQ_TAIL, 1);
    assert_eq!(b.npe.stats().unordered_doorbells, 0);
    // A descriptor written after the barrier, then the same ring again: not published.
    b.set(CH0 + SQ_TAIL, 2);
    assert_eq!(b.npe.stats().unordered_doorbells, 1);
    // One barrier covering the doorbells of two different rings is fine.
    b.npe.barrier(Barrier::DsbSt);
    b.set(CH0 + SQ_TAIL, 3);
    b.set(WQ_TAIL, 0);
    assert_eq!(b.npe.stats().unordered_doorbells, 1);
}

#[test]
fn a_soft_reset_keeps_the_traffic_held_in_the_network() {
    let mut b = Bench::new();
    b.npe.deliver(block(64));
    assert_eq!(b.npe.held(), 1);
    b.set(CTRL, 2);
    assert_eq!(b.npe.held(), 1);
    b.set(NODE, 1 << 31);
    b.set(CTRL, 1);
    let (rq, _, _) = b.engine_rings(0);
    b.advance();
    assert_eq!(b.reg(RQ_TAIL), 1, "a one-entry RQ receives");
    assert_eq!(b.npe.held(), 0);
    let _ = rq;
}

#[test]
fn ring_bases_and_sizes_read_back_as_implemented() {
    let mut b = Bench::new();
    b.set64(CH0 + SQ_BASE, DRAM + 0x7f);
    b.set64(CH0 + CQ_BASE, DRAM + 0x1f);
    b.set64(WQ_BASE, DRAM + 0x3f);
    b.set(CH0 + SQ_CFG, 31);
    b.set(WQ_CFG, 31);
    assert_eq!(b.npe.read(CH0 + SQ_BASE, W64), DRAM);
    assert_eq!(b.npe.read(CH0 + CQ_BASE, W64), DRAM);
    assert_eq!(b.npe.read(WQ_BASE, W64), DRAM + 0x20);
    // CAPS: SQ/CQ at most 2^6, RQ/WQ/WCQ at most 2^8.
    assert_eq!(b.reg(CH0 + SQ_CFG), 6);
    assert_eq!(b.reg(WQ_CFG), 8);
    assert_eq!(b.reg(0x004) >> 16 & 0xff, 0x86);
}
