//! Exactly-once, in-order delivery through a hostile channel (docs/protocol.md §7).
//!
//! A sender and a receiver talk through a model network that loses, duplicates, delays and
//! reorders every message (each one encoded and decoded on the wire). Destination pages are
//! absent at the start, get reclaimed at random, and can be swapped out and back in while a
//! block is being written (the write then lands on the scratch page and only the version
//! check can tell). Source reads fault at random. The reference is simple: every transfer
//! completes once, in submission order, and at that moment its destination holds exactly its
//! source bytes; no block is ever written after it was written successfully.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

use hal::{PageSize, PhysAddr, VirtAddr};
use proptest::prelude::*;
use protocol::wire::BlockHeader;
use protocol::{
    Access, Admission, BlockRange, CompletionStatus, DeliveryStatus, Envelope, FaultReason,
    Message, PageEntry, PageStateTable, Receiver, ReceiverConfig, Sender, SenderConfig,
    TransferDesc, TransferId, Transmit, WriteOutcome,
};

const BS: u32 = 1024;
const MAX_BLOCKS: usize = 16;
const WINDOW: usize = 4;
const SLOT: u64 = MAX_BLOCKS as u64 * BS as u64;
const DEST_BASE: u64 = 0x10_0000;
const SRC_BASE: u64 = 0x4000_0000;
const PAGE: u64 = 4096;
const SESSION: u32 = 0x5EED;

type Tx = Sender<WINDOW, MAX_BLOCKS>;
type Rx = Receiver<WINDOW, MAX_BLOCKS>;

/// splitmix64: small, deterministic, good enough to drive the model.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn pct(&mut self, p: u32) -> bool {
        self.below(100) < u64::from(p)
    }
}

#[derive(Clone, Copy, Debug)]
struct Params {
    seed: u64,
    transfers: usize,
    /// Percent of messages lost, and duplicated.
    loss: u32,
    dup: u32,
    /// Network delay 1..=max_delay, independently per copy (so messages reorder).
    max_delay: u64,
    /// Percent of destination pages absent at the start.
    absent: u32,
    /// Percent of block sends whose source read faults.
    src_fault: u32,
    /// Percent chance per event that a random destination page is reclaimed.
    churn: u32,
    /// Percent of block writes during which the page is swapped out and back in.
    mid_write: u32,
    /// Percent of admitted writes that land (and are reported) only 1..=max_delay later, as
    /// on the SoC where the engine writes between `admit` and `written`: other copies of the
    /// block, and the transfer's abort, can arrive meanwhile.
    defer_write: u32,
    max_attempts: u16,
}

enum Event {
    ToRx {
        bytes: Vec<u8>,
        payload: Vec<u8>,
    },
    ToTx {
        bytes: Vec<u8>,
    },
    RxResolve {
        tid: TransferId,
        block: u32,
    },
    RxWrite {
        header: BlockHeader,
        payload: Vec<u8>,
    },
    TxSourceResolve {
        tid: TransferId,
        block: u32,
    },
}

#[derive(Default, Debug)]
struct Outcome {
    /// Sender completions in the order delivered.
    completions: Vec<(u32, CompletionStatus)>,
    /// Receiver deliveries in the order delivered.
    deliveries: Vec<(u32, DeliveryStatus)>,
    retransmissions: u64,
    duplicates_dropped: u64,
    in_flight_dropped: u64,
    retired_dropped: u64,
    nacks: u64,
    page_changed_nacks: u64,
    source_faults: u64,
    duplicate_nacks: u64,
}

struct World {
    p: Params,
    rng: Rng,
    now: u64,
    seq: u64,
    events: BinaryHeap<Reverse<(u64, u64)>>,
    pending: HashMap<u64, Event>,
    tx: Tx,
    rx: Rx,
    pages: PageStateTable<Vec<PageEntry>>,
    next_frame: u64,
    dest: Vec<u8>,
    lens: Vec<u64>,
    written: HashSet<(u32, u32)>,
    /// Transfers handed to the receiver's user: no write may land in them any more.
    delivered: HashSet<u32>,
    out: Outcome,
}

fn src_byte(seed: u64, tid: u64, offset: u64) -> u8 {
    // Never zero, so an unwritten (zero) destination byte can never pass the comparison.
    1 + ((seed ^ (tid * 131 + offset * 7)) % 251) as u8
}

impl World {
    fn new(p: Params) -> Self {
        let mut rng = Rng(p.seed);
        let region = p.transfers as u64 * SLOT;
        let mut pages = PageStateTable::new(
            VirtAddr::new(DEST_BASE),
            region,
            vec![PageEntry::ABSENT; (region / PAGE) as usize],
        )
        .unwrap();
        let mut next_frame = 0x8000_0000;
        for page in 0..region / PAGE {
            if !rng.pct(p.absent) {
                pages
                    .mark_present(
                        VirtAddr::new(DEST_BASE + page * PAGE),
                        PageSize::Size4K,
                        PhysAddr::new(next_frame),
                        true,
                    )
                    .unwrap();
                next_frame += PAGE;
            }
        }
        let lens = (0..p.transfers).map(|_| 1 + rng.below(SLOT)).collect();
        let cfg = SenderConfig {
            max_attempts: p.max_attempts,
            ..SenderConfig::new(BS, 4 * p.max_delay + 20)
        };
        Self {
            p,
            rng,
            now: 0,
            seq: 0,
            events: BinaryHeap::new(),
            pending: HashMap::new(),
            tx: Tx::new(cfg).unwrap(),
            rx: Rx::new(ReceiverConfig {
                block_size: BS,
                first_tid: TransferId(0),
            })
            .unwrap(),
            pages,
            next_frame,
            dest: vec![0; region as usize],
            lens,
            written: HashSet::new(),
            delivered: HashSet::new(),
            out: Outcome::default(),
        }
    }

    fn schedule(&mut self, delay: u64, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((self.now + delay, self.seq)));
        self.pending.insert(self.seq, event);
    }

    fn send(&mut self, to_rx: bool, message: Message, payload: &[u8]) {
        let bytes = Envelope::new(SESSION, message).to_bytes().to_vec();
        if self.rng.pct(self.p.loss) {
            return;
        }
        let copies = if self.rng.pct(self.p.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let delay = 1 + self.rng.below(self.p.max_delay);
            let event = if to_rx {
                Event::ToRx {
                    bytes: bytes.clone(),
                    payload: payload.to_vec(),
                }
            } else {
                Event::ToTx {
                    bytes: bytes.clone(),
                }
            };
            self.schedule(delay, event);
        }
    }

    fn expected(&self, tid: u32) -> Vec<u8> {
        (0..self.lens[tid as usize])
            .map(|o| src_byte(self.p.seed, u64::from(tid), o))
            .collect()
    }

    fn landed(&self, tid: u32) -> &[u8] {
        let start = (u64::from(tid) * SLOT) as usize;
        &self.dest[start..start + self.lens[tid as usize] as usize]
    }

    fn transmit(&mut self, t: Transmit) {
        match t {
            Transmit::Block(b) => {
                let h = b.header;
                if self.rng.pct(self.p.src_fault) {
                    // The engine's read of the source faulted: the block is not emitted.
                    self.tx
                        .source_fault(self.now, h.tid, h.block, h.attempt, FaultReason::NotPresent)
                        .unwrap();
                    self.out.source_faults += 1;
                    let delay = 1 + self.rng.below(30);
                    self.schedule(
                        delay,
                        Event::TxSourceResolve {
                            tid: h.tid,
                            block: h.block,
                        },
                    );
                    return;
                }
                let tid = u64::from(h.tid.0);
                assert_eq!(
                    b.src - (SRC_BASE + tid * SLOT),
                    h.dest - (DEST_BASE + tid * SLOT),
                    "src and dest offsets agree"
                );
                let offset = b.src - (SRC_BASE + tid * SLOT);
                let payload: Vec<u8> = (offset..offset + u64::from(h.len))
                    .map(|o| src_byte(self.p.seed, tid, o))
                    .collect();
                self.send(true, Message::Block(h), &payload);
            }
            Transmit::Abort(a) => self.send(true, Message::Abort(a), &[]),
        }
    }

    fn arrive_at_receiver(&mut self, message: Message, payload: Vec<u8>) {
        let h = match message {
            Message::Block(h) => h,
            Message::Abort(a) => {
                if let Some(ack) = self.rx.on_abort(&a) {
                    self.send(false, Message::AbortAck(ack), &[]);
                }
                return;
            }
            other => panic!("receiver got {other:?}"),
        };
        assert_eq!(payload.len(), h.len as usize);
        match self.rx.admit(&h).unwrap() {
            Admission::Write => {
                if self.rng.pct(self.p.defer_write) {
                    let delay = 1 + self.rng.below(self.p.max_delay);
                    self.schedule(delay, Event::RxWrite { header: h, payload });
                } else {
                    self.land(h, payload);
                }
            }
            Admission::Duplicate(ack) | Admission::Retired(ack) => {
                self.send(false, Message::Ack(ack), &[])
            }
            Admission::Aborted | Admission::OutOfWindow | Admission::InFlight => {}
        }
        self.drain_deliveries();
    }

    /// What the receiver learns from the next transfer's first block: its header's
    /// `oldest_open` lies past every finished transfer, so a transfer whose ABORT notices
    /// were all lost is closed now (R6: the receiver never waits for ever). Nothing is
    /// written for the new transfer.
    fn announce_next_transfer(&mut self, n: usize) {
        let desc = TransferDesc {
            src: SRC_BASE + n as u64 * SLOT,
            dest: DEST_BASE + n as u64 * SLOT,
            len: 1,
            key: 1,
            tag: 0,
        };
        self.tx.submit(desc).expect("room after quiescence");
        let Some(Transmit::Block(send)) = self.tx.poll_transmit(self.now) else {
            panic!("the next transfer's first block is due");
        };
        assert_eq!(send.header.oldest_open.0 as usize, n);
        let _ = self.rx.admit(&send.header);
        self.drain_deliveries();
    }

    fn drain_deliveries(&mut self) {
        while let Some(d) = self.rx.poll_delivery() {
            if d.status == DeliveryStatus::Complete {
                assert_eq!(
                    self.landed(d.tid.0),
                    self.expected(d.tid.0).as_slice(),
                    "delivered {} with wrong bytes",
                    d.tid.0
                );
            }
            self.delivered.insert(d.tid.0);
            self.out.deliveries.push((d.tid.0, d.status));
        }
    }

    /// An admitted block's write lands and is reported.
    fn land(&mut self, h: BlockHeader, payload: Vec<u8>) {
        assert!(
            !self.delivered.contains(&h.tid.0),
            "a write of {}/{} landed after the transfer was delivered",
            h.tid.0,
            h.block
        );
        assert!(
            !self.written.contains(&(h.tid.0, h.block)),
            "block {}/{} written twice",
            h.tid.0,
            h.block
        );
        let page = VirtAddr::new(h.dest & !(PAGE - 1));
        let snapshot = self.pages.generation();
        let mut to_scratch = !self.pages.lookup(page).unwrap().present;
        if self.rng.pct(self.p.mid_write) {
            // Swapped out and back in during the write: the bytes went to the
            // scratch page, yet the page is present again afterwards.
            self.pages.invalidate(page, PAGE).unwrap();
            self.pages
                .mark_present(page, PageSize::Size4K, PhysAddr::new(self.next_frame), true)
                .unwrap();
            self.next_frame += PAGE;
            to_scratch = true;
        }
        if !to_scratch {
            let at = (h.dest - DEST_BASE) as usize;
            self.dest[at..at + payload.len()].copy_from_slice(&payload);
        }
        let outcome = match self.pages.check(
            VirtAddr::new(h.dest),
            u64::from(h.len),
            Access::Write,
            snapshot,
        ) {
            Ok(()) => {
                self.written.insert((h.tid.0, h.block));
                WriteOutcome::Written
            }
            Err(fault) => {
                if fault.reason == FaultReason::PageChanged {
                    self.out.page_changed_nacks += 1;
                }
                let delay = 1 + self.rng.below(40);
                self.schedule(
                    delay,
                    Event::RxResolve {
                        tid: h.tid,
                        block: h.block,
                    },
                );
                WriteOutcome::Fault {
                    reason: fault.reason,
                    fatal: false,
                }
            }
        };
        if let Some(reply) = self.rx.written(&h, outcome).unwrap() {
            self.send(false, reply, &[]);
        }
        self.drain_deliveries();
    }

    fn process(&mut self, event: Event) {
        match event {
            Event::ToRx { bytes, payload } => {
                let (envelope, used) = Envelope::decode(&bytes).unwrap();
                assert_eq!(used, bytes.len());
                self.arrive_at_receiver(envelope.expect_session(SESSION).unwrap(), payload);
            }
            Event::ToTx { bytes } => {
                let (envelope, _) = Envelope::decode(&bytes).unwrap();
                let message = envelope.expect_session(SESSION).unwrap();
                self.tx.handle(self.now, &message).unwrap();
            }
            Event::RxResolve { tid, block } => {
                let tid_u = u64::from(tid.0);
                let page = VirtAddr::new(
                    (DEST_BASE + tid_u * SLOT + u64::from(block) * u64::from(BS)) & !(PAGE - 1),
                );
                if !self.pages.lookup(page).unwrap().present {
                    self.pages
                        .mark_present(page, PageSize::Size4K, PhysAddr::new(self.next_frame), true)
                        .unwrap();
                    self.next_frame += PAGE;
                }
                let generation = self.pages.generation();
                if let Some(resolved) = self
                    .rx
                    .resolved(tid, BlockRange::single(block), generation)
                    .unwrap()
                {
                    self.send(false, Message::Resolved(resolved), &[]);
                }
            }
            Event::RxWrite { header, payload } => self.land(header, payload),
            Event::TxSourceResolve { tid, block } => {
                self.tx
                    .source_resolved(tid, BlockRange::single(block))
                    .unwrap();
            }
        }
        if self.rng.pct(self.p.churn) {
            // Reclaim a random destination page (its bytes survive in swap).
            let pages = self.dest.len() as u64 / PAGE;
            let page = self.rng.below(pages);
            self.pages
                .invalidate(VirtAddr::new(DEST_BASE + page * PAGE), PAGE)
                .unwrap();
        }
    }

    fn run(mut self) -> Outcome {
        let n = self.p.transfers;
        let mut submitted = 0;
        for _step in 0..500_000 {
            while submitted < n {
                let desc = TransferDesc {
                    src: SRC_BASE + submitted as u64 * SLOT,
                    dest: DEST_BASE + submitted as u64 * SLOT,
                    len: self.lens[submitted],
                    key: 1,
                    tag: 1000 + submitted as u64,
                };
                match self.tx.submit(desc) {
                    Ok(tid) => {
                        assert_eq!(tid.0 as usize, submitted);
                        submitted += 1;
                    }
                    Err(protocol::ProtocolError::WindowFull { .. }) => break,
                    Err(e) => panic!("submit: {e}"),
                }
            }
            while let Some(t) = self.tx.poll_transmit(self.now) {
                self.transmit(t);
            }
            while let Some(c) = self.tx.poll_completion() {
                assert_eq!(c.tag, 1000 + u64::from(c.tid.0));
                if c.status == CompletionStatus::Ok {
                    // When the user hears "done", the bytes are at the destination.
                    assert_eq!(
                        self.landed(c.tid.0),
                        self.expected(c.tid.0).as_slice(),
                        "completed {} with wrong bytes",
                        c.tid.0
                    );
                }
                self.out.completions.push((c.tid.0, c.status));
            }
            let next_event = self.events.peek().map(|Reverse((t, _))| *t);
            let next_timer = self.tx.next_deadline();
            let next = match (next_event, next_timer) {
                (None, None) if submitted == n => {
                    self.announce_next_transfer(n);
                    let s = self.tx.stats();
                    self.out.retransmissions = s.retransmissions;
                    self.out.nacks = s.nacks;
                    self.out.duplicate_nacks = s.duplicate_nacks;
                    self.out.duplicates_dropped = self.rx.stats().duplicates_dropped;
                    self.out.in_flight_dropped = self.rx.stats().in_flight_dropped;
                    self.out.retired_dropped = self.rx.stats().retired_dropped;
                    return self.out;
                }
                // Completions just made room: submit more.
                (None, None) if self.tx.open_transfers() < WINDOW => continue,
                (None, None) => panic!("stalled with {submitted} of {n} submitted"),
                (a, b) => a.unwrap_or(u64::MAX).min(b.unwrap_or(u64::MAX)),
            };
            self.now = self.now.max(next);
            while let Some(&Reverse((t, seq))) = self.events.peek() {
                if t > self.now {
                    break;
                }
                self.events.pop();
                let event = self.pending.remove(&seq).unwrap();
                self.process(event);
            }
        }
        panic!("no quiescence after 500000 steps: {:?}", self.p);
    }
}

fn in_order_once(got: &[u32], n: usize) -> bool {
    got.iter().copied().eq(0..n as u32)
}

fn params(
    max_attempts: std::ops::RangeInclusive<u16>,
    max_loss: u32,
) -> impl Strategy<Value = Params> {
    (
        any::<u64>(),
        1usize..=12,
        (0..=max_loss, 0u32..=30, 1u64..=40),
        (0u32..=50, 0u32..=20, 0u32..=10, 0u32..=15, 0u32..=60),
        max_attempts,
    )
        .prop_map(
            |(
                seed,
                transfers,
                (loss, dup, max_delay),
                (absent, src_fault, churn, mid_write, defer_write),
                max_attempts,
            )| Params {
                seed,
                transfers,
                loss,
                dup,
                max_delay,
                absent,
                src_fault,
                churn,
                mid_write,
                defer_write,
                max_attempts,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    /// With enough attempts every transfer succeeds: completions and deliveries are exactly
    /// 0..n in order, each with the right bytes (checked inside the run).
    #[test]
    fn every_transfer_completes_exactly_once_in_order(p in params(40..=40, 25)) {
        let out = World::new(p).run();
        let tids: Vec<u32> = out.completions.iter().map(|c| c.0).collect();
        prop_assert!(in_order_once(&tids, p.transfers), "completions {:?}", out.completions);
        prop_assert!(out.completions.iter().all(|c| c.1 == CompletionStatus::Ok), "{:?}", out.completions);
        let rx: Vec<u32> = out.deliveries.iter().map(|d| d.0).collect();
        prop_assert!(in_order_once(&rx, p.transfers), "deliveries {:?}", out.deliveries);
        prop_assert!(out.deliveries.iter().all(|d| d.1 == DeliveryStatus::Complete));
    }

    /// With few attempts and heavy loss, transfers may abort, but each still completes
    /// exactly once and in order; the receiver delivers a prefix in order without repeats,
    /// and never reports "aborted" for a transfer the sender completed successfully.
    #[test]
    fn aborts_keep_exactly_once_and_order(p in params(1..=3, 45)) {
        let out = World::new(p).run();
        let tids: Vec<u32> = out.completions.iter().map(|c| c.0).collect();
        prop_assert!(in_order_once(&tids, p.transfers), "completions {:?}", out.completions);
        // Every transfer is delivered once the next transfer's header has arrived: none
        // waits for ever (R6), even when all its ABORT notices were lost.
        let rx: Vec<u32> = out.deliveries.iter().map(|d| d.0).collect();
        prop_assert!(in_order_once(&rx, p.transfers), "deliveries {:?}", out.deliveries);
        for &(tid, status) in &out.deliveries {
            if matches!(status, DeliveryStatus::Aborted(_)) {
                prop_assert!(
                    !matches!(out.completions[tid as usize].1, CompletionStatus::Ok),
                    "transfer {} completed at the sender but aborted at the receiver", tid
                );
            }
        }
    }
}

/// One fixed, hostile run that must exercise every path the properties rely on.
#[test]
fn the_channel_model_exercises_every_path() {
    let p = Params {
        seed: 7,
        transfers: 12,
        loss: 20,
        dup: 30,
        max_delay: 40,
        absent: 50,
        src_fault: 15,
        churn: 10,
        mid_write: 15,
        defer_write: 40,
        max_attempts: 40,
    };
    let out = World::new(p).run();
    assert_eq!(out.completions.len(), 12);
    assert!(out.completions.iter().all(|c| c.1 == CompletionStatus::Ok));
    assert_eq!(out.deliveries.len(), 12);
    assert!(out.retransmissions > 0, "{out:?}");
    assert!(out.nacks > 0, "{out:?}");
    assert!(out.page_changed_nacks > 0, "{out:?}");
    assert!(out.source_faults > 0, "{out:?}");
    assert!(out.duplicates_dropped + out.retired_dropped > 0, "{out:?}");
    assert!(out.duplicate_nacks > 0, "{out:?}");
    assert!(out.in_flight_dropped > 0, "{out:?}");
}
