//! A minimal engine-level "driver" for tests: it programs the rings of docs/dma-engine.md §4
//! in a node's DRAM through a [`Rig`], posts descriptors and write entries, and drains the
//! completion, receive and write-completion queues into records that carry everything the
//! engine reports except what is allowed to differ between two correct engines (receive slot
//! numbers, which the engine picks).

use dma_engine::npe::desc::{
    CQ_ENTRY, CqEntry, EntryStatus, RQ_ENTRY, RqEntry, RqKind, SQ_ENTRY, SqEntry, WCQ_ENTRY,
    WQ_ENTRY, WcqEntry, WqEntry,
};
use dma_engine::npe::regs::channel_offset;
use hal::PhysAddr;
use hal::regs::AccessWidth;

use crate::node_smmu::STALL_PDID;
use crate::rig::{CHANNELS, Rig};
pub use crate::rig::{DST_AT, DST_SPAN, SRC_AT, SRC_SPAN};

/// log2 entries of each SQ and CQ.
pub const CH_LOG2: u32 = 6;
/// log2 entries of the RQ, WQ and WCQ.
pub const ENG_LOG2: u32 = 8;
const SQ_AT: u64 = 0x1_0000;
const CQ_AT: u64 = 0x2_0000;
const RQ_AT: u64 = 0x3_0000;
const WQ_AT: u64 = 0x4_0000;
const WCQ_AT: u64 = 0x4_8000;

const W32: AccessWidth = AccessWidth::U32;
const W64: AccessWidth = AccessWidth::U64;

/// A completion, as compared between engines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// Channel.
    pub channel: usize,
    /// The entry (its phase bit cleared).
    pub entry: CqEntry,
}

/// An arrival, without its slot number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// A block's length, `None` for a message.
    pub block_len: Option<u32>,
    /// The entry, with slot and phase cleared.
    pub entry: RqEntry,
}

/// The driver-side indices of one node.
#[derive(Clone, Debug, Default)]
pub struct Node {
    sq_tail: [u32; CHANNELS as usize],
    cq_head: [u32; CHANNELS as usize],
    rq_head: u32,
    wq_tail: u32,
    wcq_head: u32,
    /// Descriptors posted and not yet completed per channel (signalled or not).
    pub posted: [u32; CHANNELS as usize],
}

fn ring(base: u64, entry: usize, log2: u32, index: u32) -> PhysAddr {
    PhysAddr::new(base + u64::from(index & ((1 << log2) - 1)) * entry as u64)
}

impl Node {
    /// Programs node `n` (coordinate `n`): rings, channels 0 and 1 with `pdid` (its
    /// terminating domain: bit 4 clear), channels 2 and 3 with `pdid | STALL_PDID` (its
    /// stalling domain; `node_smmu`), enable.
    pub fn setup(rig: &mut dyn Rig, n: usize, pdid: u16) -> Self {
        rig.write(n, 0x008, W32, (1 << 31) | n as u64);
        for ch in 0..CHANNELS as usize {
            let c = channel_offset(ch);
            rig.write(n, c, W64, Self::sq_at(ch));
            rig.write(n, c + 0x08, W32, u64::from(CH_LOG2));
            rig.write(n, c + 0x18, W64, Self::cq_at(ch));
            rig.write(n, c + 0x20, W32, u64::from(CH_LOG2));
            let pdid = if ch < 2 { pdid } else { pdid | STALL_PDID };
            rig.write(n, c + 0x2c, W32, 0b11 | u64::from(pdid) << 16);
        }
        rig.write(n, 0x020, W64, RQ_AT);
        rig.write(n, 0x028, W32, u64::from(ENG_LOG2));
        rig.write(n, 0x038, W64, WQ_AT);
        rig.write(n, 0x040, W32, u64::from(ENG_LOG2));
        rig.write(n, 0x050, W64, WCQ_AT);
        rig.write(n, 0x058, W32, u64::from(ENG_LOG2));
        rig.write(n, 0x00c, W32, 0b101);
        Self::default()
    }

    fn sq_at(ch: usize) -> u64 {
        SQ_AT + (ch as u64) * (SQ_ENTRY as u64 * (1 << CH_LOG2))
    }

    fn cq_at(ch: usize) -> u64 {
        CQ_AT + (ch as u64) * (CQ_ENTRY as u64 * (1 << CH_LOG2))
    }

    /// Free SQ entries of `ch` (the engine consumes them; the CQ bounds the rest).
    pub fn sq_room(&self, rig: &mut dyn Rig, n: usize, ch: usize) -> u32 {
        let head = rig.read(n, channel_offset(ch) + 0x10, W32) as u32;
        (1 << CH_LOG2) - self.sq_tail[ch].wrapping_sub(head)
    }

    /// Writes raw SQ entry bytes on `ch` (not rung).
    pub fn post_raw(&mut self, rig: &mut dyn Rig, n: usize, ch: usize, bytes: &[u8; SQ_ENTRY]) {
        let at = ring(Self::sq_at(ch), SQ_ENTRY, CH_LOG2, self.sq_tail[ch]);
        rig.dram(n).write_phys(at, bytes).expect("SQ in DRAM");
        self.sq_tail[ch] = self.sq_tail[ch].wrapping_add(1);
        self.posted[ch] += 1;
    }

    /// Writes a descriptor on `ch` (not rung).
    pub fn post(&mut self, rig: &mut dyn Rig, n: usize, ch: usize, e: &SqEntry) {
        self.post_raw(rig, n, ch, &e.encode());
    }

    /// Rings every channel's doorbell.
    pub fn ring_all(&self, rig: &mut dyn Rig, n: usize) {
        for ch in 0..CHANNELS as usize {
            rig.write(
                n,
                channel_offset(ch) + 0x0c,
                W32,
                u64::from(self.sq_tail[ch]),
            );
        }
    }

    /// Takes every CQ entry of every channel, in order.
    pub fn drain_cq(&mut self, rig: &mut dyn Rig, n: usize, out: &mut Vec<Completion>) {
        for ch in 0..CHANNELS as usize {
            let tail = rig.read(n, channel_offset(ch) + 0x28, W32) as u32;
            while self.cq_head[ch] != tail {
                let mut b = [0u8; CQ_ENTRY];
                let at = ring(Self::cq_at(ch), CQ_ENTRY, CH_LOG2, self.cq_head[ch]);
                rig.dram(n).read_phys(at, &mut b).expect("CQ in DRAM");
                let phase = (self.cq_head[ch] >> CH_LOG2) & 1 == 0;
                let mut entry = CqEntry::decode(&b).unwrap_or_else(|e| {
                    panic!("{}: node {n} ch {ch}: bad CQ entry {e:?}", rig.name())
                });
                assert_eq!(entry.phase, phase, "{}: CQ phase", rig.name());
                entry.phase = false;
                out.push(Completion { channel: ch, entry });
                self.cq_head[ch] = self.cq_head[ch].wrapping_add(1);
            }
            rig.write(
                n,
                channel_offset(ch) + 0x24,
                W32,
                u64::from(self.cq_head[ch]),
            );
            rig.write(n, channel_offset(ch) + 0x34, W32, 7);
        }
    }

    /// Takes every RQ entry: (slot, record).
    pub fn drain_rq(&mut self, rig: &mut dyn Rig, n: usize) -> Vec<(u8, Arrival)> {
        let tail = rig.read(n, 0x030, W32) as u32;
        let mut out = Vec::new();
        while self.rq_head != tail {
            let mut b = [0u8; RQ_ENTRY];
            rig.dram(n)
                .read_phys(ring(RQ_AT, RQ_ENTRY, ENG_LOG2, self.rq_head), &mut b)
                .expect("RQ in DRAM");
            let phase = (self.rq_head >> ENG_LOG2) & 1 == 0;
            let mut entry = RqEntry::decode(&b)
                .unwrap_or_else(|e| panic!("{}: node {n}: bad RQ entry {e:?}", rig.name()));
            assert_eq!(entry.phase, phase, "{}: RQ phase", rig.name());
            entry.phase = false;
            let (slot, block_len) = match entry.kind {
                RqKind::Block { slot, length } => {
                    entry.kind = RqKind::Block { slot: 0, length };
                    (slot, Some(length))
                }
                RqKind::Msg => (0, None),
            };
            out.push((slot, Arrival { block_len, entry }));
            self.rq_head = self.rq_head.wrapping_add(1);
        }
        rig.write(n, 0x02c, W32, u64::from(self.rq_head));
        out
    }

    /// Writes a WQ entry (not rung).
    pub fn post_wq(&mut self, rig: &mut dyn Rig, n: usize, e: &WqEntry) {
        self.post_wq_raw(rig, n, &e.encode());
    }

    /// Writes raw WQ entry bytes (not rung).
    pub fn post_wq_raw(&mut self, rig: &mut dyn Rig, n: usize, b: &[u8; WQ_ENTRY]) {
        rig.dram(n)
            .write_phys(ring(WQ_AT, WQ_ENTRY, ENG_LOG2, self.wq_tail), b)
            .expect("WQ in DRAM");
        self.wq_tail = self.wq_tail.wrapping_add(1);
    }

    /// Rings the WQ doorbell.
    pub fn ring_wq(&self, rig: &mut dyn Rig, n: usize) {
        rig.write(n, 0x044, W32, u64::from(self.wq_tail));
    }

    /// Takes every WCQ entry (slot cleared).
    pub fn drain_wcq(&mut self, rig: &mut dyn Rig, n: usize) -> Vec<WcqEntry> {
        let tail = rig.read(n, 0x060, W32) as u32;
        let mut out = Vec::new();
        while self.wcq_head != tail {
            let mut b = [0u8; WCQ_ENTRY];
            rig.dram(n)
                .read_phys(ring(WCQ_AT, WCQ_ENTRY, ENG_LOG2, self.wcq_head), &mut b)
                .expect("WCQ in DRAM");
            let phase = (self.wcq_head >> ENG_LOG2) & 1 == 0;
            let mut e = WcqEntry::decode(&b)
                .unwrap_or_else(|e| panic!("{}: node {n}: bad WCQ entry {e:?}", rig.name()));
            assert_eq!(e.phase, phase, "{}: WCQ phase", rig.name());
            e.phase = false;
            e.slot = 0;
            out.push(e);
            self.wcq_head = self.wcq_head.wrapping_add(1);
        }
        rig.write(n, 0x05c, W32, u64::from(self.wcq_head));
        out
    }
}

/// Whether a status is a failure.
pub fn failed(s: EntryStatus) -> bool {
    s != EntryStatus::Ok
}
