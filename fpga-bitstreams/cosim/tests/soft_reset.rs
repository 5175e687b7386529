//! CTRL.SOFT_RESET of a receiving engine with a frame on the link (docs/npe-rtl.md "Clock
//! and reset": a frame being received is discarded; "The check clock"). RTL only: the model
//! delivers a frame in one step, so it has no clock at which a reset could cut one.
//!
//! The receiver is reset, as the driver's `Npe::new` does (SOFT_RESET, wait for it to clear,
//! program, enable), before a frame reaches it and at every clock of a window that covers
//! the frame's last packets: while they are taken, with its last footer's check clock in the
//! flush clock, and after it was posted. (A footer taken in the flush clock itself, the
//! receiver's other case, cannot happen behind the register file: the write of SOFT_RESET
//! clears ENABLE a clock before the flush, so TREADY is low in it.) A frame with any flit
//! taken before the reset must not arrive (its RQ entry would name a receive slot the reset
//! freed), a frame with none arrives whole, nothing sets CRC_DROP, and the next block arrives
//! whole.

use dma_engine::npe::desc::{EntryStatus, InlineMsg, SqEntry, SqOp, WqEntry, WqOp};
use hal::PhysAddr;
use hal::regs::AccessWidth;
use npe_cosim::harness::{DST_AT, Node, SRC_AT};
use npe_cosim::rig::{Rig, RtlRig};

const PAGES: usize = 1024;
const W32: AccessWidth = AccessWidth::U32;
/// CTRL (docs/dma-engine.md §3.1) and its SOFT_RESET bit; GEVENT and its CRC_DROP bit.
const CTRL: usize = 0x00c;
const SOFT_RESET: u64 = 1 << 1;
const GEVENT: usize = 0x014;
const CRC_DROP: u64 = 1 << 2;
/// Bytes of the block in flight: with the 64-byte message a 256-byte packet and a one-flit
/// last one, so the window sees two footers.
const LEN: u32 = 200;
/// Clocks from the doorbell to the reset's register write: the whole block is in the link
/// FIFO by then.
const RESET_AT: u64 = 200;

fn fill(rig: &dyn Rig, at: u64, len: usize, seed: u8) -> Vec<u8> {
    let data: Vec<u8> = (0..len)
        .map(|i| seed.wrapping_mul(29).wrapping_add((i * 7 + i / 253) as u8))
        .collect();
    rig.dram(0)
        .write_phys(PhysAddr::new(at), &data)
        .expect("in DRAM");
    data
}

fn block(src_va: u64, length: u32, dst_va: u64, cookie: u64) -> SqEntry {
    let bytes: Vec<u8> = (0..56).map(|i| (cookie as u8) ^ (i as u8)).collect();
    SqEntry {
        op: SqOp::SendBlock {
            src_va,
            length,
            dst_va,
        },
        signal: true,
        tid14: 0x2a,
        peer: 1,
        dst_pdid: 9,
        cookie,
        msg: InlineMsg::new(&bytes).expect("56 bytes"),
    }
}

/// What one case saw.
struct Outcome {
    /// Flits of the first block node 1 had taken when its reset was done (`None`: no reset).
    taken_at_reset: Option<u64>,
    /// Flits node 1 took of the first block, in all.
    total: u64,
    /// The clock, counted from the doorbell, at which node 1 took the first block's last
    /// flit (without a reset only).
    last_flit_at: Option<u64>,
    /// What went wrong.
    fails: Vec<String>,
}

/// Records `msg` in `fails` unless `ok`.
fn check(fails: &mut Vec<String>, ok: bool, msg: impl FnOnce() -> String) {
    if !ok {
        fails.push(msg());
    }
}

/// Sends a block from node 0 to node 1 and shows node 1 its flits from `release` clocks
/// after the doorbell on (they wait in the link FIFO until then); if `reset`, soft-resets
/// node 1 `RESET_AT` clocks after the doorbell and programs it again. Then sends a second
/// block and checks what arrives. The first block has `len` bytes.
fn case(len: u32, release: u64, reset: bool) -> Outcome {
    let mut rtl = RtlRig::new(PAGES, 0, 17);
    let r: &mut dyn Rig = &mut rtl;
    let mut a = Node::setup(r, 0, 3);
    let mut b = Node::setup(r, 1, 9);
    fill(r, SRC_AT, len as usize, 1);
    a.post(r, 0, 0, &block(SRC_AT, len, DST_AT, 1));
    a.ring_all(r, 0);
    let start = rtl.system().cycles();
    rtl.system().hold_rx(1, start + release);
    let mut last_flit_at = None;
    let mut taken_at_reset = None;
    if reset {
        let at = start + RESET_AT;
        assert!(rtl.system().cycles() <= at, "the doorbell took too long");
        let now = rtl.system().cycles();
        rtl.system().run(at - now);
        let r: &mut dyn Rig = &mut rtl;
        r.write(1, CTRL, W32, SOFT_RESET);
        let mut polls = 0;
        while r.read(1, CTRL, W32) & SOFT_RESET != 0 {
            polls += 1;
            assert!(polls < 1000, "SOFT_RESET does not clear");
        }
        // The engine is disabled from the reset on: nothing more is taken until setup.
        taken_at_reset = Some(rtl.system().flits_taken(1, 0));
        let r: &mut dyn Rig = &mut rtl;
        b = Node::setup(r, 1, 9);
    } else {
        // The clock that takes the block's last flit: node 1 takes nothing else.
        let mut before = 0;
        while rtl.system().cycles() - start < release + 2_000 {
            rtl.system().step();
            let now = rtl.system().flits_taken(1, 0);
            if now != before {
                last_flit_at = Some(rtl.system().cycles() - start);
                before = now;
            }
        }
    }
    let r: &mut dyn Rig = &mut rtl;
    r.settle();
    let total = rtl.system().flits_taken(1, 0);
    let r: &mut dyn Rig = &mut rtl;
    let what = format!(
        "{len}-byte block released {release} clocks after the doorbell, reset {reset} at \
         {RESET_AT}: {taken_at_reset:?} of {total} flits taken by then"
    );
    let mut fails = Vec::new();
    let arrivals = b.drain_rq(r, 1);
    let in_flight = taken_at_reset.is_some_and(|t| t > 0);
    if in_flight {
        check(&mut fails, arrivals.is_empty(), || {
            format!("{what}: the frame in flight at the reset arrived: {arrivals:?}")
        });
    } else {
        check(
            &mut fails,
            arrivals.len() == 1 && arrivals[0].1.block_len == Some(len),
            || format!("{what}: the frame after the reset: {arrivals:?}"),
        );
    }
    for (slot, _) in &arrivals {
        free_slot(r, &mut b, *slot);
    }
    if let [(_, a)] = arrivals.as_slice()
        && !in_flight
    {
        check(&mut fails, a.entry.msg == block(0, 0, 0, 1).msg, || {
            format!("{what}: the first block's message")
        });
    }
    let gevent = r.read(1, GEVENT, W32);
    check(&mut fails, gevent & CRC_DROP == 0, || {
        format!("{what}: CRC_DROP after the reset")
    });
    r.write(1, GEVENT, W32, gevent);

    // The next block arrives whole, and the engine is quiet.
    let second = fill(r, SRC_AT + 0x1000, 4096, 2);
    a.post(r, 0, 1, &block(SRC_AT + 0x1000, 4096, DST_AT, 2));
    a.ring_all(r, 0);
    r.settle();
    let mut cqs = Vec::new();
    a.drain_cq(r, 0, &mut cqs);
    // The sender is not the one reset: both its blocks complete.
    check(
        &mut fails,
        cqs.len() == 2 && cqs.iter().all(|c| c.entry.status == EntryStatus::Ok),
        || format!("{what}: the sender's completions {cqs:?}"),
    );
    let arrivals = b.drain_rq(r, 1);
    let whole = arrivals.len() == 1
        && arrivals[0].1.block_len == Some(4096)
        && arrivals[0].1.entry.msg == block(0, 0, 0, 2).msg;
    check(&mut fails, whole, || {
        format!("{what}: the next block: {arrivals:?}")
    });
    if !whole {
        return Outcome {
            taken_at_reset,
            total,
            last_flit_at,
            fails,
        };
    }
    b.post_wq(
        r,
        1,
        &WqEntry {
            op: WqOp::Commit {
                pdid: 9,
                length: 4096,
                dst_va: DST_AT,
            },
            slot: arrivals[0].0,
            cookie: 2,
        },
    );
    b.ring_wq(r, 1);
    r.settle();
    let wcq = b.drain_wcq(r, 1);
    check(
        &mut fails,
        wcq.len() == 1 && wcq[0].status == EntryStatus::Ok,
        || format!("{what}: the commit {wcq:?}"),
    );
    let mut got = vec![0u8; 4096];
    r.dram(1)
        .read_phys(PhysAddr::new(DST_AT), &mut got)
        .expect("in DRAM");
    check(&mut fails, got == second, || {
        format!("{what}: the next block's bytes differ")
    });
    let gevent = r.read(1, GEVENT, W32);
    check(&mut fails, gevent & CRC_DROP == 0, || {
        format!("{what}: CRC_DROP with the next block")
    });
    Outcome {
        taken_at_reset,
        total,
        last_flit_at,
        fails,
    }
}

/// Frees a receive slot (a Release entry).
fn free_slot(r: &mut dyn Rig, b: &mut Node, slot: u8) {
    b.post_wq(
        r,
        1,
        &WqEntry {
            op: WqOp::Release,
            slot,
            cookie: 1,
        },
    );
    b.ring_wq(r, 1);
    r.settle();
    b.drain_wcq(r, 1);
}

#[test]
fn a_soft_reset_at_any_clock_around_a_footer_discards_the_frame_without_a_trace() {
    // Where the last flit lands with the flits released at RESET_AT, without a reset: the
    // receiver then takes them back to back (its check clocks aside).
    let clean = case(LEN, RESET_AT, false);
    assert!(clean.fails.is_empty(), "{:?}", clean.fails);
    let span = clean.last_flit_at.expect("the block reached node 1") - RESET_AT;
    let flits = clean.total;
    // The reset lands some clocks after its write starts (an AXI4-Lite write, then the
    // sequencer), on every other clock only (the AXI4-Lite slave's pace); so the reset stays
    // put and the frame moves, one clock per case: its last flit lands from 24 clocks
    // before the write to 16 after. Releasing it well after the reset sends the whole frame
    // after it.
    let window = (RESET_AT - span - 24)..(RESET_AT - span + 16);
    let mut fails = Vec::new();
    let mut taken = Vec::new();
    for d in window.clone().chain(std::iter::once(RESET_AT + 40)) {
        let o = case(LEN, d, true);
        fails.extend(o.fails);
        taken.push(o.taken_at_reset.unwrap_or(0));
    }
    eprintln!(
        "{} resets: flits of {flits} taken at the reset with the frame released at each of \
         clocks {window:?} and {}: {taken:?}",
        taken.len(),
        RESET_AT + 40
    );
    // A later release takes fewer flits before the reset. The last release whose frame was
    // taken whole puts its last footer in the last clock with TREADY high (one clock later it
    // would meet TREADY low). The write that sets SOFT_RESET clears ENABLE a clock before the
    // flush, so that footer's check clock is the flush clock; the window must hold it,
    // resets in the middle of the frame and one before it.
    assert!(taken.contains(&0), "no reset came before the frame");
    assert!(
        taken.iter().any(|&t| t > 0 && t < flits),
        "no reset came in the middle of the frame"
    );
    assert!(
        taken.windows(2).any(|w| w[0] == flits && w[1] < flits),
        "no reset came at the frame's last footer"
    );
    assert!(
        fails.is_empty(),
        "{} failures:\n{}",
        fails.len(),
        fails.join("\n")
    );
}
