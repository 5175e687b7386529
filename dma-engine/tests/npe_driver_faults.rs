//! The NPE driver against engine-written trouble and misuse, on a register stub: entries the
//! engine should never write, queues the engine stopped, source reads that keep failing,
//! fatal answers that find the control queue full, and connection identities that would
//! mix two connections up. Each test names the rule of docs/dma-engine.md it checks.

use std::collections::HashMap;

use dma_engine::npe::desc::{
    EntryStatus, InlineMsg, RQ_ENTRY, RqEntry, RqKind, SQ_ENTRY, SqEntry, SqOp, WCQ_ENTRY,
    WQ_ENTRY, WcqEntry, WqEntry, WqOp,
};
use dma_engine::npe::{
    ChannelConfig, DmaError, FaultClass, MAX_PRESENT_RETRIES, Npe, NpeConfig, NpeHost, PeerConfig,
};
use hal::PhysAddr;
use hal::barrier::Barrier;
use hal::dma::HostDma;
use hal::model::{ModelBus, RegisterModel};
use hal::regs::AccessWidth;
use protocol::wire::{Abort, BlockHeader, Message};
use protocol::{
    AbortReason, Access, CompletionStatus, Envelope, FaultReason, Generation, TransferDesc,
    TransferId,
};

const CTRL: usize = 0x00c;
const GEVENT: usize = 0x014;
const RQ_BASE: usize = 0x020;
const RQ_HEAD: usize = 0x02c;
const WQ_BASE: usize = 0x038;
const WCQ_BASE: usize = 0x050;
const WCQ_HEAD: usize = 0x05c;
const CH0: usize = 0x1000;
const CONTROL: usize = 0x1000 + 15 * 0x100;
const SQ_BASE: usize = 0x00;
const SQ_TAIL: usize = 0x0c;
const SQ_HEAD: usize = 0x10;
const CQ_BASE: usize = 0x18;
const CH_STATUS: usize = 0x30;
const CH_IRQ: usize = 0x34;
const FAULT_ADDR: usize = 0x38;
const FAULT_INFO: usize = 0x40;
const FAULT_SYNDROME: usize = 0x44;
const RESUME: usize = 0x48;
/// AXI responses in FAULT_SYNDROME: the SMMU terminated the read, or nothing is there.
const SLVERR: u64 = 2;
const DECERR: u64 = 3;

/// Registers as plain storage, with the engine's side effects the driver relies on:
/// SOFT_RESET clears itself, CH_IRQ and GEVENT are write-1-to-clear. RESUME writes and
/// every write of a BASE register are logged.
#[derive(Default)]
struct Engine {
    regs: HashMap<usize, u64>,
    resumes: Vec<u64>,
    base_writes: Vec<usize>,
}

impl RegisterModel for Engine {
    fn size(&self) -> usize {
        0x1_0000
    }

    fn read(&mut self, offset: usize, _: AccessWidth) -> u64 {
        match offset {
            0x000 => 0x4E50_4501,
            // 16 channels, 4 KiB blocks, 64 slots, SQ/CQ up to 2^6, RQ/WQ/WCQ up to 2^8.
            0x004 => 16 | 6 << 12 | 6 << 16 | 8 << 20 | 1 << 24,
            _ => self.regs.get(&offset).copied().unwrap_or(0),
        }
    }

    fn write(&mut self, offset: usize, _: AccessWidth, value: u64) {
        let channel_reg = (offset >= 0x1000).then_some(offset % 0x100);
        if offset == GEVENT || channel_reg == Some(CH_IRQ) {
            *self.regs.entry(offset).or_insert(0) &= !value;
            return;
        }
        if channel_reg == Some(RESUME) {
            self.resumes.push(value);
            return;
        }
        if matches!(offset, RQ_BASE | WQ_BASE | WCQ_BASE)
            || matches!(channel_reg, Some(SQ_BASE | CQ_BASE))
        {
            self.base_writes.push(offset);
        }
        let value = if offset == CTRL { value & !2 } else { value };
        self.regs.insert(offset, value);
    }

    fn barrier(&mut self, _: Barrier) {}
}

struct Host {
    class: FaultClass,
    requests: Vec<u64>,
}

impl Host {
    fn new(class: FaultClass) -> Self {
        Self {
            class,
            requests: Vec::new(),
        }
    }
}

impl NpeHost for Host {
    fn classify(&mut self, _: u16, _: u64, _: Access) -> FaultClass {
        self.class
    }
    fn request_resolution(&mut self, _: u16, va: u64, _: Access) {
        self.requests.push(va);
    }
    fn snapshot(&self, _: u16) -> Generation {
        Generation(0)
    }
    fn check(&self, _: u16, _: u64, _: u64, _: Generation) -> Result<(), FaultReason> {
        Ok(())
    }
}

const SESSION: u32 = 0xabc;
const CHANNEL: ChannelConfig = ChannelConfig {
    peer: 3,
    pdid: 1,
    peer_key: 7,
    session: SESSION,
};
const PEER: PeerConfig = PeerConfig {
    peer: 3,
    session: SESSION,
    pdid: 7,
};

type Driver<'a> = Npe<&'a ModelBus<Engine>, 16, 4, 8, 32>;

struct Bench {
    bus: ModelBus<Engine>,
    dma: HostDma,
}

impl Bench {
    fn new() -> Self {
        Self {
            bus: ModelBus::new(Engine::default()),
            dma: HostDma::new(PhysAddr::new(0x8000_0000), 256).unwrap(),
        }
    }

    fn driver(&self) -> Driver<'_> {
        Driver::new(&self.bus, &self.dma, NpeConfig::new(2, 15)).unwrap()
    }

    fn reg(&self, offset: usize) -> u64 {
        self.bus.lock().regs.get(&offset).copied().unwrap_or(0)
    }

    fn set(&self, offset: usize, value: u64) {
        self.bus.lock().regs.insert(offset, value);
    }

    fn put(&self, addr: u64, bytes: &[u8]) {
        self.dma.write_phys(PhysAddr::new(addr), bytes).unwrap();
    }

    /// RQ entry `index` (PHASE for its pass through the driver's 64-entry RQ).
    fn rq(&self, index: u32, kind: RqKind, message: Message) {
        let bytes = Envelope::new(SESSION, message).to_bytes();
        let entry = RqEntry {
            phase: (index >> 6) & 1 == 0,
            kind,
            src: 3,
            pdid: 7,
            tid14: 0,
            msg: InlineMsg::new(&bytes).unwrap(),
        };
        let at = self.reg(RQ_BASE) + u64::from(index & 63) * RQ_ENTRY as u64;
        self.put(at, &entry.encode());
    }

    fn wcq(&self, index: u32, bytes: &[u8; WCQ_ENTRY]) {
        let at = self.reg(WCQ_BASE) + u64::from(index) * WCQ_ENTRY as u64;
        self.put(at, bytes);
    }

    fn wq(&self, index: u32) -> WqEntry {
        let mut b = [0u8; WQ_ENTRY];
        let at = self.reg(WQ_BASE) + u64::from(index) * WQ_ENTRY as u64;
        self.dma.read_phys(PhysAddr::new(at), &mut b).unwrap();
        WqEntry::decode(&b).unwrap()
    }

    /// Channel 0's read of SQ entry 0 at `addr` failed with AXI response `resp`: the
    /// channel waits in FAULT_WAIT with LOCAL_FAULT raised (§5.4).
    fn source_fault(&self, addr: u64, resp: u64) {
        self.set(CH0 + CH_STATUS, 2); // FAULT_WAIT
        self.set(CH0 + CH_IRQ, 2); // LOCAL_FAULT
        self.set(CH0 + FAULT_ADDR, addr);
        self.set(CH0 + FAULT_INFO, 0);
        self.set(CH0 + FAULT_SYNDROME, resp | 1 << 3); // VALID
    }

    fn sq(&self, channel_base: usize, index: u32) -> SqEntry {
        let mut b = [0u8; SQ_ENTRY];
        let at = self.reg(channel_base + SQ_BASE) + u64::from(index) * SQ_ENTRY as u64;
        self.dma.read_phys(PhysAddr::new(at), &mut b).unwrap();
        SqEntry::decode(&b, 4096).unwrap()
    }
}

fn header(tid: u32, attempt: u16, dest: u64) -> BlockHeader {
    BlockHeader {
        tid: TransferId(tid),
        block: 0,
        block_count: 1,
        attempt,
        oldest_open: TransferId(0),
        len: 4096,
        key: 7,
        dest,
    }
}

fn block(slot: u8) -> RqKind {
    RqKind::Block { slot, length: 4096 }
}

fn wcq_entry(status: EntryStatus, cookie: u64, fault_addr: u64) -> [u8; WCQ_ENTRY] {
    WcqEntry {
        phase: true,
        status,
        slot: 0,
        bytes: 0,
        cookie,
        fault_addr,
        axi_resp: 2,
    }
    .encode()
}

fn one_block(src: u64) -> TransferDesc {
    TransferDesc {
        src,
        dest: 0x20_0000,
        len: 4096,
        key: 7,
        tag: 0,
    }
}

/// Channel 0 open and one block of 0x10_0000 posted to it; the memory manager calls every
/// page present.
fn one_block_posted(b: &Bench) -> (Driver<'_>, Host) {
    let mut npe = b.driver();
    npe.open_channel(&b.dma, 0, CHANNEL).unwrap();
    npe.submit(0, one_block(0x10_0000)).unwrap();
    let mut host = Host::new(FaultClass::Present);
    npe.poll(0, &mut host).unwrap();
    (npe, host)
}

/// §4.1 PEER is 22 bits; answers are routed by (peer, session).
#[test]
fn connections_the_descriptors_or_the_routing_cannot_tell_apart_are_refused() {
    let b = Bench::new();
    let mut npe = b.driver();
    let wide = ChannelConfig {
        peer: 1 << 22 | 3,
        ..CHANNEL
    };
    assert!(matches!(
        npe.open_channel(&b.dma, 0, wide),
        Err(DmaError::InvalidConfig { .. })
    ));
    assert!(matches!(
        npe.open_peer(
            0,
            PeerConfig {
                peer: 1 << 22 | 3,
                ..PEER
            }
        ),
        Err(DmaError::InvalidConfig { .. })
    ));
    npe.open_channel(&b.dma, 0, CHANNEL).unwrap();
    let same_identity = ChannelConfig { pdid: 2, ..CHANNEL };
    assert!(matches!(
        npe.open_channel(&b.dma, 1, same_identity),
        Err(DmaError::InvalidConfig { .. })
    ));
    npe.open_peer(0, PEER).unwrap();
    assert_eq!(npe.open_peer(0, PEER), Err(DmaError::PeerInUse { slot: 0 }));
    let same_identity = PeerConfig { pdid: 9, ..PEER };
    assert!(matches!(
        npe.open_peer(1, same_identity),
        Err(DmaError::InvalidConfig { .. })
    ));
    // Another session to the same peer is another connection.
    npe.open_channel(
        &b.dma,
        1,
        ChannelConfig {
            session: 7,
            ..CHANNEL
        },
    )
    .unwrap();
}

/// §4.4/§4.5: a commit is named by its COOKIE; every admitted block gets a `written` (§5.2).
#[test]
fn an_undecodable_write_completion_still_finishes_its_commit_and_the_block_is_resent() {
    let b = Bench::new();
    let mut npe = b.driver();
    npe.open_peer(0, PEER).unwrap();
    let mut host = Host::new(FaultClass::Present);
    b.rq(0, block(0), Message::Block(header(0, 1, 0x20_0000)));
    npe.poll(0, &mut host).unwrap();
    let commit = b.wq(0);
    let mut bad = wcq_entry(EntryStatus::Ok, commit.cookie, 0);
    bad[24] = 0x10; // a reserved bit of word 3
    b.wcq(0, &bad);
    npe.poll(1, &mut host).unwrap();
    assert_eq!(b.reg(WCQ_HEAD), 1);
    assert_eq!(
        npe.stats().nacks_sent,
        1,
        "the block is NACKed, not left being written"
    );
    // The re-send is written again, not released as "in flight".
    b.rq(1, block(1), Message::Block(header(0, 2, 0x20_0000)));
    npe.poll(2, &mut host).unwrap();
    assert!(matches!(
        b.wq(1).op,
        WqOp::Commit {
            dst_va: 0x20_0000,
            ..
        }
    ));
}

/// §4: the driver acknowledges every entry it took, whatever handling it did.
#[test]
fn an_undecodable_receive_entry_frees_its_slot_and_the_next_entries_are_still_taken() {
    let b = Bench::new();
    let mut npe = b.driver();
    npe.open_peer(0, PEER).unwrap();
    let mut host = Host::new(FaultClass::Present);
    b.rq(0, block(5), Message::Block(header(0, 1, 0x20_0000)));
    // Reserved bits of word 3 set: undecodable, but it names slot 5.
    let at = b.reg(RQ_BASE) + 24;
    b.put(at, &[0xff]);
    b.rq(1, block(6), Message::Block(header(0, 1, 0x20_0000)));
    npe.poll(0, &mut host).unwrap();
    assert_eq!(b.reg(RQ_HEAD), 2);
    assert_eq!(
        (b.wq(0).op, b.wq(0).slot),
        (WqOp::Release, 5),
        "the slot is not lost"
    );
    assert!(matches!(b.wq(1).op, WqOp::Commit { .. }));
    assert_eq!(npe.stats().malformed, 1);
}

/// §3.2 FAULT_SYNDROME: DECERR means nothing is at the address; retrying cannot help.
#[test]
fn a_source_read_that_reaches_no_memory_aborts_its_transfer_instead_of_retrying() {
    let b = Bench::new();
    let (mut npe, mut host) = one_block_posted(&b);
    b.source_fault(0x10_0000, DECERR);
    npe.poll(1, &mut host).unwrap();
    assert_eq!(b.bus.lock().resumes, [2], "SKIP, not RETRY");
    // The transfer aborts; its ABORT notice goes out, then the completion comes.
    for t in 2..6 {
        b.set(CH0 + SQ_HEAD, b.reg(CH0 + SQ_TAIL));
        npe.poll(t, &mut host).unwrap();
    }
    assert_eq!(npe.sender_stats(0).unwrap().source_faults, 1);
    assert!(b.bus.lock().resumes.iter().all(|&r| r == 2));
    let done = npe.poll_completion(0).unwrap().unwrap();
    assert_eq!(
        done.status,
        CompletionStatus::Aborted(AbortReason::SourceFault {
            block: 0,
            reason: FaultReason::OutOfRegion
        })
    );
}

/// A page the memory manager calls present but the SMMU keeps refusing is retried a few
/// times, then handed to the fault service, not retried for ever.
#[test]
fn a_source_fault_on_a_present_page_is_retried_a_bounded_number_of_times() {
    let b = Bench::new();
    let (mut npe, mut host) = one_block_posted(&b);
    for t in 1..=20 {
        b.source_fault(0x10_0000, SLVERR);
        npe.poll(t, &mut host).unwrap();
        if !host.requests.is_empty() {
            break;
        }
    }
    let resumes = b.bus.lock().resumes.clone();
    let retries = resumes.iter().filter(|&&r| r == 1).count();
    assert_eq!(retries, usize::from(MAX_PRESENT_RETRIES));
    assert_eq!(resumes.last(), Some(&2), "then SKIP");
    assert_eq!(host.requests, [0x10_0000], "and the fault service is asked");
    assert_eq!(npe.stats().retry_limit_hits, 1);
}

/// §4: a queue the engine stopped (CH_IRQ.ERROR, GEVENT.QUEUE_ERROR) restarts when its BASE
/// is written again.
#[test]
fn queues_the_engine_stopped_are_restarted_by_writing_their_bases_again() {
    let b = Bench::new();
    let mut npe = b.driver();
    npe.open_channel(&b.dma, 0, CHANNEL).unwrap();
    let mut host = Host::new(FaultClass::Present);
    npe.poll(0, &mut host).unwrap();
    let sq_base = b.reg(CH0 + SQ_BASE);
    b.bus.lock().base_writes.clear();
    b.set(CH0 + CH_IRQ, 4); // ERROR
    b.set(GEVENT, 0x10); // QUEUE_ERROR
    npe.poll(1, &mut host).unwrap();
    let mut writes = b.bus.lock().base_writes.clone();
    writes.sort_unstable();
    assert_eq!(
        writes,
        [RQ_BASE, WQ_BASE, WCQ_BASE, CH0 + SQ_BASE, CH0 + CQ_BASE]
    );
    assert_eq!(b.reg(CH0 + SQ_BASE), sq_base, "the same ring");
    assert_eq!(npe.stats().queue_restarts, 2);
    assert_eq!((b.reg(GEVENT), b.reg(CH0 + CH_IRQ)), (0, 0), "acknowledged");
}

/// §8: the fault service reports a page once; a fatal answer that finds the control queue
/// full is sent later, not forgotten.
#[test]
fn an_unresolvable_destination_page_is_answered_even_when_the_control_queue_was_full() {
    let b = Bench::new();
    let mut npe = b.driver();
    npe.open_peer(0, PEER).unwrap();
    let mut host = Host::new(FaultClass::Resolvable);
    b.rq(0, block(0), Message::Block(header(0, 1, 0x20_0000)));
    b.rq(1, block(1), Message::Block(header(2, 1, 0x40_0000)));
    npe.poll(0, &mut host).unwrap();
    let (c0, c1) = (b.wq(0).cookie, b.wq(1).cookie);
    b.wcq(0, &wcq_entry(EntryStatus::DstFault, c0, 0x20_0000));
    npe.poll(1, &mut host).unwrap();
    assert_eq!(npe.waiting_pages(), 1);
    // Fill the control path while the engine sends nothing: ABORTs of an unknown transfer
    // each queue an ABORT_ACK (16 go into the control SQ, the rest wait in the queue).
    let abort = Message::Abort(Abort {
        tid: TransferId(1),
        oldest_open: TransferId(0),
        reason: AbortReason::Cancelled,
    });
    let mut index = 2u32;
    for n in [64u32, 64, 13] {
        for _ in 0..n {
            b.rq(index, RqKind::Msg, abort);
            index += 1;
        }
        npe.poll(2, &mut host).unwrap();
    }
    // A second DST_FAULT, its page present again: NACK + RESOLVED fill the queue.
    host.class = FaultClass::Present;
    b.wcq(1, &wcq_entry(EntryStatus::DstFault, c1, 0x40_0000));
    npe.poll(3, &mut host).unwrap();
    let nacks_before = npe.stats().nacks_sent;
    assert_eq!(
        npe.page_unresolvable(7, 0x20_0000, FaultReason::OutOfRegion)
            .unwrap(),
        1
    );
    // The engine sends the control messages from now on.
    for t in 4..40 {
        b.set(CONTROL + SQ_HEAD, b.reg(CONTROL + SQ_TAIL));
        npe.poll(t, &mut host).unwrap();
    }
    assert_eq!(npe.waiting_pages(), 0);
    assert_eq!(
        npe.stats().nacks_sent,
        nacks_before + 1,
        "the fatal NACK went out"
    );
    let sent: Vec<SqEntry> = (0..16).map(|i| b.sq(CONTROL, i)).collect();
    assert!(sent.iter().all(|e| e.op == SqOp::SendMsg));
}
