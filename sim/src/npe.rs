//! A register-accurate model of NPE, our PL RDMA engine (docs/dma-engine.md).
//!
//! The model implements the register map (§3) as a `hal::model::RegisterModel`, so the real
//! driver (`dma_engine::npe`) runs against it unchanged; it reads and writes its queues in the
//! node's simulated DRAM by bus address, and every access to user memory goes through an
//! [`AxiTranslate`] (the SMMU), which may translate, terminate or stall it.
//!
//! Timing is modelled per block, in model time: a source read takes the AXI latency plus the
//! block at the AXI rate, the block then waits for the injection port, and a commit takes the
//! same at the destination. The model advances only when the simulation calls
//! [`NpeModel::advance`] (after the driver rang a doorbell, when a frame arrives, when a stall
//! is answered, or at the wake-up time `advance` returned); register accesses themselves only
//! record what the driver did, as on silicon where the engine acts a few cycles later.
//!
//! Behaviour per spec section: channels and SQ/CQ (§4.1, §4.2), the receive path with slots,
//! RQ, WQ and WCQ (§4.3-§4.5), back-pressure without loss (§4), source faults parking the
//! channel in FAULT_WAIT until `RESUME` (§5.4), destination faults finishing the commit with
//! DST_FAULT (§5.3), stalls holding one channel or the write engine (§6.3), queues whose
//! bus address fails stopping without loss (§4), LINK_ERROR for a peer the fabric does not
//! reach (§7), and the interrupt summary (§9).
//!
//! Not modelled: FLUSHED (a disabled channel is frozen instead, and its descriptors run when
//! it is enabled again), CRC_DROP (the modelled links do not corrupt packets).

use std::collections::VecDeque;

use dma_engine::npe::desc::{
    CQ_ENTRY, CqEntry, EntryStatus, InlineMsg, RQ_ENTRY, RqEntry, RqKind, SQ_ENTRY, SqEntry, SqOp,
    WCQ_ENTRY, WQ_ENTRY, WcqEntry, WqEntry, WqOp,
};
use dma_engine::npe::regs::{CHANNEL_BASE, CHANNEL_STRIDE, MAGIC, VERSION, WINDOW_SIZE};
use hal::dma::HostDma;
use hal::model::RegisterModel;
use hal::regs::AccessWidth;
use hal::{Iova, PhysAddr};
use smmu_driver::fault::{AccessKind, StreamId};

use crate::axi::{AxiOutcome, AxiTranslate, StallResolution, StallToken};
use crate::des::ModelTime;
use crate::link::{block_wire_bytes, message_wire_bytes};
use crate::qfdb::Vc;

/// Block size of spec version 1.
pub const BLOCK: u32 = 4096;
const PAGE: u64 = 4096;

/// Parameters of one engine instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NpeModelParams {
    /// Hardware channels (`CAPS.CHANNELS`).
    pub channels: u8,
    /// log2 of the receive slots.
    pub rx_slots_log2: u8,
    /// AXI data rate in bits per second (128 bit at 250 MHz = 32 Gb/s: ours).
    pub axi_bps: u64,
    /// Latency of an AXI read or write burst sequence (ours: 0.2 µs).
    pub axi_latency: ModelTime,
    /// Link rate the injection port serialises at (bits per second).
    pub link_bps: u64,
    /// Stream ID of AXI ID 0 on the engine's PL port. The engine's AXI ID is the PDID's low
    /// 5 bits, with bit 5 set for destination writes (§3.2).
    pub stream_base: u32,
    /// This node's index in the simulation.
    pub node: usize,
    /// Nodes the fabric connects (coordinates `0..nodes`): a frame to any other coordinate,
    /// or to this node itself (no loopback route), finishes with LINK_ERROR (§7).
    pub nodes: usize,
}

impl NpeModelParams {
    /// Defaults of docs/dma-engine.md §10 for node `node` of `nodes`, with the stream base of
    /// the HP0 port (0xE80, an \[I\] value: see `boards::zynqmp::PlPort::stream_base`).
    pub fn new(node: usize, nodes: usize) -> Self {
        Self {
            channels: 16,
            rx_slots_log2: 6,
            axi_bps: 32_000_000_000,
            axi_latency: ModelTime::from_ns(200),
            link_bps: 32_000_000_000,
            stream_base: 0xE80,
            node,
            nodes,
        }
    }

    /// The stream ID a source read (`write = false`) or destination write for `pdid` carries.
    pub fn stream_of(&self, pdid: u16, write: bool) -> StreamId {
        StreamId(self.stream_base | u32::from(pdid & 0x1f) | u32::from(write) << 5)
    }
}

/// A frame on the wire between two engines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Sending node.
    pub src: usize,
    /// Receiving node.
    pub dst: usize,
    /// PDID from the header.
    pub pdid: u16,
    /// TID14 from the footer.
    pub tid14: u16,
    /// The inline protocol message (for a block: its header area).
    pub msg: InlineMsg,
    /// The block payload (`None` for a message).
    pub payload: Option<Vec<u8>>,
}

impl Frame {
    /// Bytes on the wire.
    pub fn wire_bytes(&self) -> u64 {
        match &self.payload {
            Some(p) => block_wire_bytes(p.len() as u64),
            None => message_wire_bytes(self.msg.len() as u64),
        }
    }

    /// Its virtual channel.
    pub fn vc(&self) -> Vc {
        if self.payload.is_some() {
            Vc::Data
        } else {
            Vc::Control
        }
    }
}

/// What an RQ entry takes from a frame's header and footer (§4.3).
#[derive(Clone, Copy)]
struct RqHeader {
    src: u32,
    pdid: u16,
    tid14: u16,
    msg: InlineMsg,
}

impl RqHeader {
    fn of(frame: &Frame) -> Self {
        Self {
            src: frame.src as u32,
            pdid: frame.pdid,
            tid14: frame.tid14,
            msg: frame.msg,
        }
    }
}

/// What [`NpeModel::advance`] needs from the rest of the node.
pub struct EngineCtx<'a> {
    /// The current model time.
    pub now: ModelTime,
    /// The node's DRAM (queues and user frames).
    pub dram: &'a HostDma,
    /// The SMMU.
    pub axi: &'a mut dyn AxiTranslate,
    /// Frames the engine sent (the simulation hands them to the fabric).
    pub out: &'a mut Vec<Frame>,
}

/// What happened in [`NpeModel::advance`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Advance {
    /// When the engine next needs `advance` without an outside event.
    pub next: Option<ModelTime>,
    /// The interrupt line is asserted.
    pub irq: bool,
}

/// Counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Blocks sent.
    pub tx_blocks: u64,
    /// Messages sent.
    pub tx_msgs: u64,
    /// Blocks staged from the link.
    pub rx_blocks: u64,
    /// Messages received.
    pub rx_msgs: u64,
    /// Blocks written to memory.
    pub commits: u64,
    /// Source reads terminated.
    pub src_faults: u64,
    /// Destination writes terminated.
    pub dst_faults: u64,
    /// Model time channels spent with a stalled read.
    pub read_stall_time: ModelTime,
    /// Model time the write engine spent stalled (everything behind it waited).
    pub write_stall_time: ModelTime,
    /// Times arriving traffic started to wait for a slot or an RQ entry (episodes).
    pub rx_held: u64,
    /// Doorbells beyond the ring size (driver bugs), ignored.
    pub bad_doorbells: u64,
    /// Descriptors with BAD_DESCRIPTOR.
    pub bad_descriptors: u64,
    /// Doorbells rung without a store barrier since the last other register write, or rung
    /// twice on one ring after one barrier (driver bugs: the descriptors written in between
    /// were not published).
    pub unordered_doorbells: u64,
    /// Queue accesses that failed (a ring's bus address outside memory): the queue stops until
    /// its base is written again (§4).
    pub queue_errors: u64,
    /// Descriptors finished with LINK_ERROR (an unreachable peer, or NODE not VALID).
    pub link_errors: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct RingRegs {
    base: u64,
    log2: u8,
    head: u32,
    tail: u32,
    /// An access at this ring's bus address failed: the ring is not touched again until
    /// its base is written (§4).
    error: bool,
}

impl RingRegs {
    fn size(&self) -> u32 {
        1 << self.log2
    }
    fn used(&self) -> u32 {
        self.tail.wrapping_sub(self.head)
    }
    /// The bus address of the entry at `index`; `None` past the top of the address space
    /// (an access there fails like one outside memory).
    fn addr(&self, index: u32, entry: usize) -> Option<PhysAddr> {
        let offset = u64::from(index & (self.size() - 1)).checked_mul(entry as u64)?;
        self.base.checked_add(offset).map(PhysAddr::new)
    }
    /// A write of the BASE register: the low bits below the ring's alignment are not
    /// implemented (§3), and a new base lets a stopped ring try again.
    fn set_base(&mut self, value: u64, align: u64) {
        self.base = value & !(align - 1);
        self.error = false;
    }
    /// PHASE for the entry at `index` (§4): 1 on the first pass.
    fn phase(&self, index: u32) -> bool {
        (index >> self.log2) & 1 == 0
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChanState {
    Idle,
    Running,
    FaultWait,
    Error,
    Stalled,
}

impl ChanState {
    fn code(self) -> u32 {
        match self {
            ChanState::Idle => 0,
            ChanState::Running => 1,
            ChanState::FaultWait => 2,
            ChanState::Error => 3,
            ChanState::Stalled => 4,
        }
    }
}

#[derive(Debug)]
enum JobPhase {
    /// Translating and reading from `done` bytes on.
    Read,
    /// Read done at `ready_at`.
    Reading { ready_at: ModelTime },
    /// A read is held by the SMMU.
    Stalled { token: StallToken, since: ModelTime },
    /// A read was terminated; waiting for RESUME.
    FaultWait,
    /// Ready to go out.
    TxReady,
}

#[derive(Debug)]
struct Job {
    entry: SqEntry,
    index: u32,
    done: usize,
    payload: Vec<u8>,
    phase: JobPhase,
}

#[derive(Debug)]
struct Channel {
    en: bool,
    irq_en: bool,
    pdid: u16,
    sq: RingRegs,
    cq: RingRegs,
    irq: u32,
    last_error: u8,
    fault_addr: u64,
    fault_index: u16,
    fault_valid: bool,
    /// AXI response of the terminated read: 2 SLVERR (the SMMU terminated it), 3 DECERR
    /// (nothing at the address).
    fault_resp: u8,
    job: Option<Job>,
    resume: Option<bool>,
    /// CQ entries of finished descriptors whose write failed, posted once the CQ works again.
    pending_cq: VecDeque<CqEntry>,
}

impl Channel {
    fn new() -> Self {
        Self {
            en: false,
            irq_en: false,
            pdid: 0,
            sq: RingRegs::default(),
            cq: RingRegs::default(),
            irq: 0,
            last_error: 0,
            fault_addr: 0,
            fault_index: 0,
            fault_valid: false,
            fault_resp: 0,
            job: None,
            resume: None,
            pending_cq: VecDeque::new(),
        }
    }

    fn state(&self) -> ChanState {
        match &self.job {
            _ if !self.en => ChanState::Idle,
            Some(Job {
                phase: JobPhase::FaultWait,
                ..
            }) => ChanState::FaultWait,
            Some(Job {
                phase: JobPhase::Stalled { .. },
                ..
            }) => ChanState::Stalled,
            Some(_) => ChanState::Running,
            // A queue the channel cannot reach stops it; a failed descriptor does not (the
            // channel goes on with the next one, §5.4; LAST_ERROR keeps its status).
            None if self.sq.error || self.cq.error || !self.pending_cq.is_empty() => {
                ChanState::Error
            }
            None if self.sq.used() > 0 => ChanState::Running,
            None => ChanState::Idle,
        }
    }
}

#[derive(Debug)]
enum WritePhase {
    Write,
    Writing { ready_at: ModelTime },
    Stalled { token: StallToken, since: ModelTime },
}

#[derive(Debug)]
struct WriteJob {
    entry: WqEntry,
    done: usize,
    phase: WritePhase,
}

const IRQ_COMPLETION: u32 = 1;
const IRQ_LOCAL_FAULT: u32 = 2;
const IRQ_ERROR: u32 = 4;
const GEVENT_BAD_DOORBELL: u32 = 1;
const GEVENT_LINK_ERROR: u32 = 2;
const GEVENT_RX_HELD: u32 = 8;
const GEVENT_QUEUE_ERROR: u32 = 0x10;
const GEVENT_ALL: u32 = 0x1f;
/// Bit of the WQ doorbell in [`NpeModel::rung_since_barrier`] (channels use bits 0-31).
const WQ_DOORBELL_BIT: u64 = 1 << 32;
/// Rounds of [`NpeModel::advance`] before it hands back (asking to be called again at once).
const MAX_ROUNDS: usize = 1 << 16;
/// SQ and RQ entries are 128 B aligned, the other rings 32 B (§3).
const ALIGN_128: u64 = 128;
const ALIGN_32: u64 = 32;
/// AXI responses (§3.2 FAULT_SYNDROME, §4.5).
const AXI_SLVERR: u8 = 2;
const AXI_DECERR: u8 = 3;

/// The NPE model (see the module documentation).
#[derive(Debug)]
pub struct NpeModel {
    params: NpeModelParams,
    enabled: bool,
    irq_enabled: bool,
    node_reg: u32,
    gevent: u32,
    channels: Vec<Channel>,
    rq: RingRegs,
    wq: RingRegs,
    wcq: RingRegs,
    slots: Vec<Option<Vec<u8>>>,
    free_slots: Vec<u8>,
    ingress_data: VecDeque<Frame>,
    ingress_msgs: VecDeque<Frame>,
    /// Arriving traffic is waiting now (for counting episodes in `rx_held`).
    rx_holding: bool,
    write_job: Option<WriteJob>,
    /// WCQ entries whose write failed, posted once the WCQ works again.
    pending_wcq: VecDeque<WcqEntry>,
    tx_busy_until: ModelTime,
    next_tx_channel: usize,
    barrier_seen: bool,
    /// Doorbells rung since the last barrier, one bit per ring.
    rung_since_barrier: u64,
    stats: EngineStats,
    tx_count: u32,
    rx_count: u32,
}

impl NpeModel {
    /// An engine after reset.
    pub fn new(params: NpeModelParams) -> Self {
        let slots = 1usize << params.rx_slots_log2;
        Self {
            params,
            enabled: false,
            irq_enabled: false,
            node_reg: 0,
            gevent: 0,
            channels: (0..params.channels).map(|_| Channel::new()).collect(),
            rq: RingRegs::default(),
            wq: RingRegs::default(),
            wcq: RingRegs::default(),
            slots: vec![None; slots],
            free_slots: (0..slots as u16).rev().map(|s| s as u8).collect(),
            ingress_data: VecDeque::new(),
            ingress_msgs: VecDeque::new(),
            rx_holding: false,
            write_job: None,
            pending_wcq: VecDeque::new(),
            tx_busy_until: ModelTime::ZERO,
            next_tx_channel: 0,
            barrier_seen: false,
            rung_since_barrier: 0,
            stats: EngineStats::default(),
            tx_count: 0,
            rx_count: 0,
        }
    }

    /// The parameters.
    pub fn params(&self) -> &NpeModelParams {
        &self.params
    }

    /// Counters.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// Arriving traffic waiting for a slot or an RQ entry.
    pub fn held(&self) -> usize {
        self.ingress_data.len() + self.ingress_msgs.len()
    }

    /// Receive slots in use.
    pub fn slots_in_use(&self) -> usize {
        self.slots.len() - self.free_slots.len()
    }

    /// A frame arrived from the link. It waits at the ingress until there is room.
    pub fn deliver(&mut self, frame: Frame) {
        if frame.payload.is_some() {
            self.ingress_data.push_back(frame);
        } else {
            self.ingress_msgs.push_back(frame);
        }
    }

    /// CTRL.SOFT_RESET: channels to IDLE, indices to 0, receive slots freed. Frames held at
    /// the ingress are still in the network on silicon (link-level flow control, §4), so
    /// they stay and arrive once the engine is enabled again.
    fn soft_reset(&mut self) {
        let params = self.params;
        let stats = self.stats;
        let ingress_data = std::mem::take(&mut self.ingress_data);
        let ingress_msgs = std::mem::take(&mut self.ingress_msgs);
        *self = NpeModel::new(params);
        self.stats = stats;
        self.ingress_data = ingress_data;
        self.ingress_msgs = ingress_msgs;
    }

    /// Whether a frame to `peer` has a route: NODE is VALID, and `peer` is another node of
    /// the fabric.
    fn reachable(&self, peer: u32) -> bool {
        let valid = self.node_reg & 1 << 31 != 0;
        let own = self.node_reg & 0x3f_ffff;
        valid && peer != own && (peer as usize) < self.params.nodes
    }

    /// This node's coordinate as programmed in NODE (the frames' source, §4.3 SRC).
    fn coordinate(&self) -> usize {
        (self.node_reg & 0x3f_ffff) as usize
    }

    /// Whether the interrupt line is asserted (§9).
    pub fn irq_asserted(&self) -> bool {
        self.irq_enabled && self.irq_status() != 0
    }

    fn irq_status(&self) -> u32 {
        let mut s = 0;
        if self.channels.iter().any(|c| c.irq_en && c.irq != 0) {
            s |= 1;
        }
        if self.rq.used() != 0 {
            s |= 2;
        }
        if self.wcq.used() != 0 {
            s |= 4;
        }
        if self.gevent != 0 {
            s |= 8;
        }
        s
    }

    /// Does everything that can happen at `ctx.now`.
    pub fn advance(&mut self, ctx: &mut EngineCtx<'_>) -> Advance {
        // Until nothing more can happen at this instant. Every round that makes progress
        // consumes queue entries or moves a job on, so this ends; the bound only keeps one
        // call short, and a call that reaches it asks to be called again now.
        let mut unfinished = false;
        if self.enabled {
            unfinished = true;
            for _ in 0..MAX_ROUNDS {
                let mut progress = false;
                for ch in 0..self.channels.len() {
                    progress |= self.step_channel(ch, ctx);
                }
                progress |= self.inject(ctx);
                progress |= self.take_ingress(ctx);
                progress |= self.step_write(ctx);
                if !progress {
                    unfinished = false;
                    break;
                }
            }
        }
        Advance {
            next: if unfinished {
                Some(ctx.now)
            } else {
                self.next_wake(ctx.now)
            },
            irq: self.irq_asserted(),
        }
    }

    fn next_wake(&self, now: ModelTime) -> Option<ModelTime> {
        let mut best: Option<ModelTime> = None;
        let mut consider = |t: ModelTime| {
            let t = t.max(now);
            best = Some(best.map_or(t, |b| b.min(t)));
        };
        for ch in &self.channels {
            match ch.job.as_ref().map(|j| &j.phase) {
                Some(JobPhase::Reading { ready_at }) => consider(*ready_at),
                Some(JobPhase::TxReady) if self.tx_busy_until > now => consider(self.tx_busy_until),
                _ => {}
            }
        }
        if let Some(WriteJob {
            phase: WritePhase::Writing { ready_at },
            ..
        }) = &self.write_job
        {
            consider(*ready_at);
        }
        best
    }

    /// Posts a CQ entry, or keeps it (in order behind any kept before) when the CQ cannot
    /// be written: the channel then stops in ERROR until CQ_BASE is written again.
    fn post_cq(&mut self, ch: usize, dram: &HostDma, entry: CqEntry) {
        let Some(c) = self.channels.get_mut(ch) else {
            return;
        };
        c.pending_cq.push_back(entry);
        if Self::flush_cq(c, dram) {
            self.stats.queue_errors += 1;
        }
    }

    /// Writes the channel's kept CQ entries; returns whether a write failed just now.
    fn flush_cq(c: &mut Channel, dram: &HostDma) -> bool {
        while !c.cq.error {
            let Some(entry) = c.pending_cq.front() else {
                return false;
            };
            let e = CqEntry {
                phase: c.cq.phase(c.cq.tail),
                ..*entry
            };
            let written =
                c.cq.addr(c.cq.tail, CQ_ENTRY)
                    .is_some_and(|addr| dram.write_phys(addr, &e.encode()).is_ok());
            if !written {
                c.cq.error = true;
                c.irq |= IRQ_ERROR;
                return true;
            }
            c.pending_cq.pop_front();
            c.cq.tail = c.cq.tail.wrapping_add(1);
            c.irq |= IRQ_COMPLETION;
        }
        false
    }

    /// Finishes the channel's current descriptor.
    fn finish(&mut self, ch: usize, dram: &HostDma, status: EntryStatus, bytes: u32, fault: u64) {
        let Some(c) = self.channels.get_mut(ch) else {
            return;
        };
        let Some(job) = c.job.take() else {
            return;
        };
        c.sq.head = c.sq.head.wrapping_add(1);
        if status != EntryStatus::Ok {
            c.last_error = status.code();
            if status != EntryStatus::SrcFault {
                c.irq |= IRQ_ERROR;
            }
        }
        if job.entry.signal || status != EntryStatus::Ok {
            self.post_cq(
                ch,
                dram,
                CqEntry {
                    phase: false,
                    status,
                    sq_index: job.index as u16,
                    bytes,
                    cookie: job.entry.cookie,
                    fault_addr: fault,
                },
            );
        }
    }

    fn step_channel(&mut self, ch: usize, ctx: &mut EngineCtx<'_>) -> bool {
        let now = ctx.now;
        let Some(c) = self.channels.get_mut(ch) else {
            return false;
        };
        if !c.en {
            return false;
        }
        // CQ entries kept while the CQ could not be written go first, in order.
        if !c.pending_cq.is_empty() {
            let before = c.pending_cq.len();
            if Self::flush_cq(c, ctx.dram) {
                self.stats.queue_errors += 1;
            }
            let Some(c) = self.channels.get_mut(ch) else {
                return false;
            };
            if !c.pending_cq.is_empty() {
                return c.pending_cq.len() != before;
            }
        }
        let Some(c) = self.channels.get_mut(ch) else {
            return false;
        };
        // RESUME written while in FAULT_WAIT.
        if let Some(retry) = c.resume.take()
            && let Some(job) = c
                .job
                .as_mut()
                .filter(|j| matches!(j.phase, JobPhase::FaultWait))
        {
            {
                c.fault_valid = false;
                if retry {
                    job.done = 0;
                    job.payload.clear();
                    job.phase = JobPhase::Read;
                } else {
                    let fault = c.fault_addr;
                    self.finish(ch, ctx.dram, EntryStatus::SrcFault, 0, fault);
                }
                return true;
            }
        }
        let Some(c) = self.channels.get_mut(ch) else {
            return false;
        };
        match c.job.as_ref().map(|j| &j.phase) {
            None => {
                if c.sq.error || c.sq.used() == 0 || c.cq.used() >= c.cq.size() {
                    return false;
                }
                let index = c.sq.head;
                let mut bytes = [0u8; SQ_ENTRY];
                let read =
                    c.sq.addr(index, SQ_ENTRY)
                        .is_some_and(|addr| ctx.dram.read_phys(addr, &mut bytes).is_ok());
                if !read {
                    // Nothing consumed: the channel stops in ERROR until SQ_BASE is written.
                    c.sq.error = true;
                    c.irq |= IRQ_ERROR;
                    self.stats.queue_errors += 1;
                    return false;
                }
                match SqEntry::decode(&bytes, BLOCK) {
                    Ok(entry) => {
                        let phase = match entry.op {
                            SqOp::SendBlock { .. } => JobPhase::Read,
                            SqOp::SendMsg | SqOp::Nop => JobPhase::TxReady,
                        };
                        c.job = Some(Job {
                            entry,
                            index,
                            done: 0,
                            payload: Vec::new(),
                            phase,
                        });
                        if matches!(entry.op, SqOp::SendMsg | SqOp::Nop) {
                            // Messages use the control VC and go out at once; NOP does nothing.
                            let mut status = EntryStatus::Ok;
                            if matches!(entry.op, SqOp::SendMsg) {
                                if self.reachable(entry.peer) {
                                    ctx.out.push(Frame {
                                        src: self.coordinate(),
                                        dst: entry.peer as usize,
                                        pdid: entry.dst_pdid,
                                        tid14: entry.tid14,
                                        msg: entry.msg,
                                        payload: None,
                                    });
                                    self.stats.tx_msgs += 1;
                                } else {
                                    status = self.link_error();
                                }
                            }
                            self.finish(ch, ctx.dram, status, 0, 0);
                        }
                    }
                    Err(_) => {
                        self.stats.bad_descriptors += 1;
                        c.job = Some(Job {
                            entry: SqEntry {
                                op: SqOp::Nop,
                                signal: true,
                                tid14: 0,
                                peer: 0,
                                dst_pdid: 0,
                                cookie: u64::from_le_bytes(
                                    bytes
                                        .get(32..40)
                                        .and_then(|b| b.try_into().ok())
                                        .unwrap_or([0; 8]),
                                ),
                                msg: InlineMsg::EMPTY,
                            },
                            index,
                            done: 0,
                            payload: Vec::new(),
                            phase: JobPhase::TxReady,
                        });
                        self.finish(ch, ctx.dram, EntryStatus::BadDescriptor, 0, 0);
                    }
                }
                true
            }
            Some(JobPhase::Read) => {
                self.read_block(ch, ctx);
                true
            }
            Some(JobPhase::Reading { ready_at }) if *ready_at <= now => {
                if let Some(job) = c.job.as_mut() {
                    job.phase = JobPhase::TxReady;
                }
                true
            }
            Some(JobPhase::Stalled { token, since }) => {
                let (token, since) = (*token, *since);
                match ctx.axi.stall_outcome(token) {
                    None => false,
                    Some(resolution) => {
                        self.stats.read_stall_time =
                            self.stats.read_stall_time.after(now.since(since));
                        if let Some(job) = c.job.as_mut() {
                            match resolution {
                                StallResolution::Retry => job.phase = JobPhase::Read,
                                StallResolution::Terminate => {
                                    let va = match job.entry.op {
                                        SqOp::SendBlock { src_va, .. } => src_va + job.done as u64,
                                        _ => 0,
                                    };
                                    job.phase = JobPhase::FaultWait;
                                    c.fault_addr = va;
                                    c.fault_index = job.index as u16;
                                    c.fault_valid = true;
                                    c.fault_resp = AXI_SLVERR;
                                    c.irq |= IRQ_LOCAL_FAULT;
                                    self.stats.src_faults += 1;
                                }
                            }
                        }
                        true
                    }
                }
            }
            _ => false,
        }
    }

    /// A descriptor to an unreachable peer: nothing is sent (§7 LINK_ERROR).
    fn link_error(&mut self) -> EntryStatus {
        self.gevent |= GEVENT_LINK_ERROR;
        self.stats.link_errors += 1;
        EntryStatus::LinkError
    }

    /// Translates and reads the block of the channel's job from where it stopped.
    fn read_block(&mut self, ch: usize, ctx: &mut EngineCtx<'_>) {
        let axi_bps = self.params.axi_bps;
        let latency = self.params.axi_latency;
        let Some(c) = self.channels.get_mut(ch) else {
            return;
        };
        let stream = self.params.stream_of(c.pdid, false);
        let Some(job) = c.job.as_mut() else {
            return;
        };
        let SqOp::SendBlock { src_va, length, .. } = job.entry.op else {
            return;
        };
        let len = length as usize;
        while job.done < len {
            let va = src_va + job.done as u64;
            let chunk = ((PAGE - va % PAGE) as usize).min(len - job.done);
            match ctx
                .axi
                .translate(ctx.now, stream, Iova::new(va), AccessKind::Read)
            {
                AxiOutcome::Ok(pa) => {
                    let start = job.payload.len();
                    job.payload.resize(start + chunk, 0);
                    let dst = job.payload.get_mut(start..).unwrap_or(&mut []);
                    if ctx.dram.read_phys(pa, dst).is_err() {
                        // A decode error behind the SMMU: treat as a terminated read.
                        job.phase = JobPhase::FaultWait;
                        c.fault_addr = va;
                        c.fault_index = job.index as u16;
                        c.fault_valid = true;
                        c.fault_resp = AXI_DECERR;
                        c.irq |= IRQ_LOCAL_FAULT;
                        self.stats.src_faults += 1;
                        return;
                    }
                    job.done += chunk;
                }
                AxiOutcome::Stalled(token) => {
                    job.phase = JobPhase::Stalled {
                        token,
                        since: ctx.now,
                    };
                    return;
                }
                AxiOutcome::Terminated => {
                    job.phase = JobPhase::FaultWait;
                    c.fault_addr = va;
                    c.fault_index = job.index as u16;
                    c.fault_valid = true;
                    c.fault_resp = AXI_SLVERR;
                    c.irq |= IRQ_LOCAL_FAULT;
                    self.stats.src_faults += 1;
                    return;
                }
            }
        }
        let ready_at = ctx
            .now
            .after(latency)
            .after(ModelTime::transfer(len as u64, axi_bps));
        job.phase = JobPhase::Reading { ready_at };
    }

    /// The transmit arbiter: one block at a time on the injection port, round-robin.
    fn inject(&mut self, ctx: &mut EngineCtx<'_>) -> bool {
        if ctx.now < self.tx_busy_until {
            return false;
        }
        let n = self.channels.len();
        for step in 0..n {
            let ch = (self.next_tx_channel + step) % n;
            // A disabled channel is frozen: its block waits until it is enabled again.
            let ready = self.channels.get(ch).is_some_and(|c| {
                c.en && matches!(
                    c.job,
                    Some(Job {
                        phase: JobPhase::TxReady,
                        entry: SqEntry {
                            op: SqOp::SendBlock { .. },
                            ..
                        },
                        ..
                    })
                )
            });
            if !ready {
                continue;
            }
            let peer = self
                .channels
                .get(ch)
                .and_then(|c| c.job.as_ref())
                .map_or(0, |j| j.entry.peer);
            if !self.reachable(peer) {
                let status = self.link_error();
                self.finish(ch, ctx.dram, status, 0, 0);
                self.next_tx_channel = (ch + 1) % n;
                return true;
            }
            let src = self.coordinate();
            let Some(job) = self.channels.get_mut(ch).and_then(|c| c.job.as_mut()) else {
                continue;
            };
            let payload = std::mem::take(&mut job.payload);
            let bytes = payload.len() as u32;
            let frame = Frame {
                src,
                dst: job.entry.peer as usize,
                pdid: job.entry.dst_pdid,
                tid14: job.entry.tid14,
                msg: job.entry.msg,
                payload: Some(payload),
            };
            let ser = ModelTime::transfer(frame.wire_bytes(), self.params.link_bps);
            self.tx_busy_until = ctx.now.after(ser);
            ctx.out.push(frame);
            self.stats.tx_blocks += 1;
            self.tx_count = self.tx_count.wrapping_add(1);
            self.finish(ch, ctx.dram, EntryStatus::Ok, bytes, 0);
            self.next_tx_channel = (ch + 1) % n;
            return true;
        }
        false
    }

    /// Moves arrived frames into the RQ (messages first: their own virtual channel).
    fn take_ingress(&mut self, ctx: &mut EngineCtx<'_>) -> bool {
        let mut progress = false;
        // A frame leaves the ingress only once its RQ entry is written: with an RQ that
        // cannot be written it stays there (and the slot stays free), as on a full RQ.
        while !self.rq.error && self.rq.used() < self.rq.size() {
            let Some(head) = self.ingress_msgs.front().map(RqHeader::of) else {
                break;
            };
            if !self.post_rq(ctx.dram, RqKind::Msg, head) {
                break;
            }
            self.ingress_msgs.pop_front();
            self.stats.rx_msgs += 1;
            progress = true;
        }
        while !self.rq.error && self.rq.used() < self.rq.size() {
            let Some(slot) = self.free_slots.last().copied() else {
                break;
            };
            let Some((head, length)) = self.ingress_data.front().map(|f| {
                let length = f.payload.as_ref().map_or(0, |p| p.len() as u32);
                (RqHeader::of(f), length)
            }) else {
                break;
            };
            if !self.post_rq(ctx.dram, RqKind::Block { slot, length }, head) {
                break;
            }
            let Some(frame) = self.ingress_data.pop_front() else {
                break;
            };
            self.free_slots.pop();
            if let Some(s) = self.slots.get_mut(usize::from(slot)) {
                *s = frame.payload;
            }
            self.stats.rx_blocks += 1;
            self.rx_count = self.rx_count.wrapping_add(1);
            progress = true;
        }
        let holding = !self.ingress_data.is_empty() || !self.ingress_msgs.is_empty();
        if holding {
            if !self.rx_holding {
                self.stats.rx_held += 1;
            }
            self.gevent |= GEVENT_RX_HELD;
        }
        self.rx_holding = holding;
        progress
    }

    /// Writes an RQ entry for `frame`; returns whether it was written (a failure stops the
    /// RQ until RQ_BASE is written, with GEVENT.QUEUE_ERROR).
    fn post_rq(&mut self, dram: &HostDma, kind: RqKind, head: RqHeader) -> bool {
        let entry = RqEntry {
            phase: self.rq.phase(self.rq.tail),
            kind,
            src: head.src,
            pdid: head.pdid,
            tid14: head.tid14,
            msg: head.msg,
        };
        let written = self
            .rq
            .addr(self.rq.tail, RQ_ENTRY)
            .is_some_and(|addr| dram.write_phys(addr, &entry.encode()).is_ok());
        if written {
            self.rq.tail = self.rq.tail.wrapping_add(1);
        } else {
            self.rq.error = true;
            self.queue_error();
        }
        written
    }

    fn queue_error(&mut self) {
        self.gevent |= GEVENT_QUEUE_ERROR;
        self.stats.queue_errors += 1;
    }

    /// Posts a WCQ entry, or keeps it (in order) when the WCQ cannot be written: the write
    /// engine then stops until WCQ_BASE is written again.
    fn post_wcq(&mut self, dram: &HostDma, entry: WcqEntry) {
        self.pending_wcq.push_back(entry);
        self.flush_wcq(dram);
    }

    /// Writes the kept WCQ entries; returns whether any was written.
    fn flush_wcq(&mut self, dram: &HostDma) -> bool {
        let mut any = false;
        while !self.wcq.error {
            let Some(entry) = self.pending_wcq.front() else {
                break;
            };
            let e = WcqEntry {
                phase: self.wcq.phase(self.wcq.tail),
                ..*entry
            };
            let written = self
                .wcq
                .addr(self.wcq.tail, WCQ_ENTRY)
                .is_some_and(|addr| dram.write_phys(addr, &e.encode()).is_ok());
            if !written {
                self.wcq.error = true;
                self.queue_error();
                break;
            }
            self.pending_wcq.pop_front();
            self.wcq.tail = self.wcq.tail.wrapping_add(1);
            any = true;
        }
        any
    }

    fn free_slot(&mut self, slot: u8) {
        if let Some(s) = self.slots.get_mut(usize::from(slot))
            && s.take().is_some()
        {
            self.free_slots.push(slot);
        }
    }

    /// The write engine: one WQ entry at a time, in order.
    fn step_write(&mut self, ctx: &mut EngineCtx<'_>) -> bool {
        let now = ctx.now;
        // WCQ entries kept while the WCQ could not be written go first, in order.
        if !self.pending_wcq.is_empty() {
            let progress = self.flush_wcq(ctx.dram);
            if !self.pending_wcq.is_empty() {
                return progress;
            }
        }
        match self.write_job.as_ref().map(|j| &j.phase) {
            None => {
                if self.wq.error || self.wq.used() == 0 || self.wcq.used() >= self.wcq.size() {
                    return false;
                }
                let mut bytes = [0u8; WQ_ENTRY];
                let index = self.wq.head;
                let read = self
                    .wq
                    .addr(index, WQ_ENTRY)
                    .is_some_and(|addr| ctx.dram.read_phys(addr, &mut bytes).is_ok());
                if !read {
                    // Nothing consumed: the write engine stops until WQ_BASE is written.
                    self.wq.error = true;
                    self.queue_error();
                    return false;
                }
                self.wq.head = self.wq.head.wrapping_add(1);
                match WqEntry::decode(&bytes) {
                    Ok(entry) => match entry.op {
                        WqOp::Release => self.free_slot(entry.slot),
                        WqOp::Commit { length, .. } => {
                            let slot_len = self
                                .slots
                                .get(usize::from(entry.slot))
                                .and_then(|s| s.as_ref())
                                .map(Vec::len);
                            match slot_len {
                                Some(have) if length as usize <= have => {
                                    self.write_job = Some(WriteJob {
                                        entry,
                                        done: 0,
                                        phase: WritePhase::Write,
                                    });
                                }
                                _ => {
                                    self.stats.bad_descriptors += 1;
                                    self.post_wcq(
                                        ctx.dram,
                                        WcqEntry {
                                            phase: false,
                                            status: EntryStatus::BadDescriptor,
                                            slot: entry.slot,
                                            bytes: 0,
                                            cookie: entry.cookie,
                                            fault_addr: 0,
                                            axi_resp: 0,
                                        },
                                    );
                                    self.free_slot(entry.slot);
                                }
                            }
                        }
                    },
                    Err(_) => {
                        // Reported with the entry's own COOKIE (word 2, the driver's name
                        // for the commit, §4.4), and its slot freed if it holds a block:
                        // both operations free the slot they name.
                        self.stats.bad_descriptors += 1;
                        let cookie = bytes
                            .get(16..24)
                            .and_then(|b| b.try_into().ok())
                            .map_or(0, u64::from_le_bytes);
                        self.post_wcq(
                            ctx.dram,
                            WcqEntry {
                                phase: false,
                                status: EntryStatus::BadDescriptor,
                                slot: bytes[1],
                                bytes: 0,
                                cookie,
                                fault_addr: 0,
                                axi_resp: 0,
                            },
                        );
                        self.free_slot(bytes[1]);
                    }
                }
                true
            }
            Some(WritePhase::Write) => {
                self.write_block(ctx);
                true
            }
            Some(WritePhase::Writing { ready_at }) if *ready_at <= now => {
                if let Some(job) = self.write_job.take() {
                    let length = match job.entry.op {
                        WqOp::Commit { length, .. } => length,
                        WqOp::Release => 0,
                    };
                    self.post_wcq(
                        ctx.dram,
                        WcqEntry {
                            phase: false,
                            status: EntryStatus::Ok,
                            slot: job.entry.slot,
                            bytes: length,
                            cookie: job.entry.cookie,
                            fault_addr: 0,
                            axi_resp: 0,
                        },
                    );
                    self.free_slot(job.entry.slot);
                    self.stats.commits += 1;
                }
                true
            }
            Some(WritePhase::Stalled { token, since }) => {
                let (token, since) = (*token, *since);
                match ctx.axi.stall_outcome(token) {
                    None => false,
                    Some(resolution) => {
                        self.stats.write_stall_time =
                            self.stats.write_stall_time.after(now.since(since));
                        match resolution {
                            StallResolution::Retry => {
                                if let Some(job) = self.write_job.as_mut() {
                                    job.phase = WritePhase::Write;
                                }
                            }
                            StallResolution::Terminate => self.write_fault(ctx.dram, AXI_SLVERR),
                        }
                        true
                    }
                }
            }
            _ => false,
        }
    }

    fn write_block(&mut self, ctx: &mut EngineCtx<'_>) {
        let Some(job) = self.write_job.as_mut() else {
            return;
        };
        let WqOp::Commit {
            pdid,
            length,
            dst_va,
        } = job.entry.op
        else {
            return;
        };
        let stream = self.params.stream_of(pdid, true);
        let len = length as usize;
        let Some(data) = self
            .slots
            .get(usize::from(job.entry.slot))
            .and_then(|s| s.as_ref())
        else {
            return;
        };
        while job.done < len {
            let va = dst_va + job.done as u64;
            let chunk = ((PAGE - va % PAGE) as usize).min(len - job.done);
            match ctx
                .axi
                .translate(ctx.now, stream, Iova::new(va), AccessKind::Write)
            {
                AxiOutcome::Ok(pa) => {
                    let src = data.get(job.done..job.done + chunk).unwrap_or(&[]);
                    if ctx.dram.write_phys(pa, src).is_err() {
                        self.write_fault(ctx.dram, AXI_DECERR);
                        return;
                    }
                    job.done += chunk;
                }
                AxiOutcome::Stalled(token) => {
                    job.phase = WritePhase::Stalled {
                        token,
                        since: ctx.now,
                    };
                    return;
                }
                AxiOutcome::Terminated => {
                    self.write_fault(ctx.dram, AXI_SLVERR);
                    return;
                }
            }
        }
        let ready_at = ctx
            .now
            .after(self.params.axi_latency)
            .after(ModelTime::transfer(len as u64, self.params.axi_bps));
        job.phase = WritePhase::Writing { ready_at };
    }

    /// The current commit's write was terminated (`axi_resp` SLVERR) or found nothing at
    /// its address (DECERR): report DST_FAULT, free the slot.
    fn write_fault(&mut self, dram: &HostDma, axi_resp: u8) {
        let Some(job) = self.write_job.take() else {
            return;
        };
        let dst_va = match job.entry.op {
            WqOp::Commit { dst_va, .. } => dst_va,
            WqOp::Release => 0,
        };
        self.post_wcq(
            dram,
            WcqEntry {
                phase: false,
                status: EntryStatus::DstFault,
                slot: job.entry.slot,
                bytes: job.done as u32,
                cookie: job.entry.cookie,
                fault_addr: dst_va + job.done as u64,
                axi_resp,
            },
        );
        self.free_slot(job.entry.slot);
        self.stats.dst_faults += 1;
    }

    fn channel_of(offset: usize) -> Option<(usize, usize)> {
        let rel = offset.checked_sub(CHANNEL_BASE)?;
        Some((rel / CHANNEL_STRIDE, rel % CHANNEL_STRIDE))
    }

    /// A producer-index write: refused (BAD_DOORBELL) if it would pass the consumer by more
    /// than the ring size.
    fn doorbell(ring: &mut RingRegs, value: u32, gevent: &mut u32, stats: &mut EngineStats) {
        if value.wrapping_sub(ring.head) > ring.size() {
            *gevent |= GEVENT_BAD_DOORBELL;
            stats.bad_doorbells += 1;
        } else {
            ring.tail = value;
        }
    }

    /// A consumer-index write: refused if it would pass the producer.
    fn consume(ring: &mut RingRegs, value: u32, gevent: &mut u32, stats: &mut EngineStats) {
        if value.wrapping_sub(ring.head) > ring.used() {
            *gevent |= GEVENT_BAD_DOORBELL;
            stats.bad_doorbells += 1;
        } else {
            ring.head = value;
        }
    }
}

fn low32(v: u64) -> u32 {
    v as u32
}

/// Largest log2 ring sizes the engine implements (CAPS, §3.1): SQ and CQ, then RQ, WQ and
/// WCQ. A larger value reads back as the largest.
const MAX_CHANNEL_RING_LOG2: u8 = 6;
const MAX_ENGINE_RING_LOG2: u8 = 8;

fn ring_log2(v: u64, max: u8) -> u8 {
    ((v & 0x1f) as u8).min(max)
}

impl RegisterModel for NpeModel {
    fn size(&self) -> usize {
        WINDOW_SIZE
    }

    fn read(&mut self, offset: usize, _width: AccessWidth) -> u64 {
        if let Some((n, reg)) = Self::channel_of(offset) {
            let Some(c) = self.channels.get(n) else {
                return 0;
            };
            return match reg {
                0x00 => c.sq.base,
                0x08 => u64::from(c.sq.log2),
                0x0c => u64::from(c.sq.tail),
                0x10 => u64::from(c.sq.head),
                0x18 => c.cq.base,
                0x20 => u64::from(c.cq.log2),
                0x24 => u64::from(c.cq.head),
                0x28 => u64::from(c.cq.tail),
                0x2c => {
                    u64::from(u32::from(c.en) | u32::from(c.irq_en) << 1 | u32::from(c.pdid) << 16)
                }
                0x30 => {
                    let pending = c.sq.used().min(0xffff);
                    u64::from(c.state().code() | u32::from(c.last_error) << 8 | pending << 16)
                }
                0x34 => u64::from(c.irq),
                0x38 => c.fault_addr,
                0x40 => u64::from(c.fault_index),
                0x44 if c.fault_valid => u64::from(c.fault_resp) | 1 << 3,
                0x44 => 0,
                _ => 0,
            };
        }
        let caps = u32::from(self.params.channels)
            | u32::from(self.params.rx_slots_log2) << 12
            | u32::from(MAX_CHANNEL_RING_LOG2) << 16
            | u32::from(MAX_ENGINE_RING_LOG2) << 20
            | 1 << 24;
        match offset {
            0x000 => u64::from(MAGIC << 8 | VERSION),
            0x004 => u64::from(caps),
            0x008 => u64::from(self.node_reg),
            0x00c => u64::from(u32::from(self.enabled) | u32::from(self.irq_enabled) << 2),
            0x010 => u64::from(self.irq_status()),
            0x014 => u64::from(self.gevent),
            0x020 => self.rq.base,
            0x028 => u64::from(self.rq.log2),
            0x02c => u64::from(self.rq.head),
            0x030 => u64::from(self.rq.tail),
            0x038 => self.wq.base,
            0x040 => u64::from(self.wq.log2),
            0x044 => u64::from(self.wq.tail),
            0x048 => u64::from(self.wq.head),
            0x050 => self.wcq.base,
            0x058 => u64::from(self.wcq.log2),
            0x05c => u64::from(self.wcq.head),
            0x060 => u64::from(self.wcq.tail),
            0x064 => {
                let held = self.held().min(0xffff) as u32;
                u64::from(self.free_slots.len() as u32 | held << 16)
            }
            0x068 => u64::from(self.tx_count),
            0x06c => u64::from(self.rx_count),
            _ => 0,
        }
    }

    fn write(&mut self, offset: usize, _width: AccessWidth, value: u64) {
        let v = low32(value);
        // Descriptors must be published (dsb st) before a doorbell. Any other register write
        // between the barrier and the doorbell makes the barrier stale for this check.
        // A second doorbell of the same ring after one barrier publishes descriptors written
        // after that barrier: unordered too. (One barrier may cover doorbells of several
        // rings, as the driver rings them together.)
        let doorbell_bit = match Self::channel_of(offset) {
            Some((n, 0x0c)) if n < 32 => Some(1u64 << n),
            _ if offset == 0x044 => Some(WQ_DOORBELL_BIT),
            _ => None,
        };
        if let Some(bit) = doorbell_bit {
            if !self.barrier_seen || self.rung_since_barrier & bit != 0 {
                self.stats.unordered_doorbells += 1;
            }
            self.rung_since_barrier |= bit;
        } else {
            self.barrier_seen = false;
        }
        if let Some((n, reg)) = Self::channel_of(offset) {
            let (gevent, stats) = (&mut self.gevent, &mut self.stats);
            let Some(c) = self.channels.get_mut(n) else {
                return;
            };
            match reg {
                0x00 => c.sq.set_base(value, ALIGN_128),
                0x08 => c.sq.log2 = ring_log2(value, MAX_CHANNEL_RING_LOG2),
                0x0c => Self::doorbell(&mut c.sq, v, gevent, stats),
                0x18 => c.cq.set_base(value, ALIGN_32),
                0x20 => c.cq.log2 = ring_log2(value, MAX_CHANNEL_RING_LOG2),
                0x24 => Self::consume(&mut c.cq, v, gevent, stats),
                0x2c => {
                    c.en = v & 1 != 0;
                    c.irq_en = v & 2 != 0;
                    c.pdid = (v >> 16) as u16;
                }
                0x34 => c.irq &= !(v & 7),
                0x48 => {
                    let in_fault_wait = matches!(
                        c.job,
                        Some(Job {
                            phase: JobPhase::FaultWait,
                            ..
                        })
                    );
                    let retry = v & 1 != 0;
                    let skip = v & 2 != 0;
                    if in_fault_wait && retry != skip {
                        c.resume = Some(retry);
                    }
                }
                _ => {}
            }
            return;
        }
        match offset {
            0x008 => self.node_reg = v & 0x803f_ffff,
            0x00c => {
                if v & 2 != 0 {
                    self.soft_reset();
                } else {
                    self.enabled = v & 1 != 0;
                    self.irq_enabled = v & 4 != 0;
                }
            }
            0x014 => self.gevent &= !(v & GEVENT_ALL),
            0x020 => self.rq.set_base(value, ALIGN_128),
            0x028 => self.rq.log2 = ring_log2(value, MAX_ENGINE_RING_LOG2),
            0x02c => Self::consume(&mut self.rq, v, &mut self.gevent, &mut self.stats),
            0x038 => self.wq.set_base(value, ALIGN_32),
            0x040 => self.wq.log2 = ring_log2(value, MAX_ENGINE_RING_LOG2),
            0x044 => Self::doorbell(&mut self.wq, v, &mut self.gevent, &mut self.stats),
            0x050 => self.wcq.set_base(value, ALIGN_32),
            0x058 => self.wcq.log2 = ring_log2(value, MAX_ENGINE_RING_LOG2),
            0x05c => Self::consume(&mut self.wcq, v, &mut self.gevent, &mut self.stats),
            _ => {}
        }
    }

    fn barrier(&mut self, kind: hal::barrier::Barrier) {
        use hal::barrier::Barrier;
        if matches!(kind, Barrier::DsbSt | Barrier::DsbSy) {
            self.barrier_seen = true;
            self.rung_since_barrier = 0;
        }
    }
}
