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
//! CRC_DROP only for frames a test's frame hook marks as failing their footer CRC
//! (`Frame::crc_error`): the modelled links do not corrupt packets themselves.
//!
//! Not modelled: FLUSHED (a disabled channel is frozen instead, and its descriptors run when
//! it is enabled again).

mod receive;
mod registers;
mod transmit;

use std::collections::VecDeque;

/// The inline message of a frame (the driver's encoded protocol message).
pub use dma_engine::npe::desc::InlineMsg;
use dma_engine::npe::desc::{
    CQ_ENTRY, CqEntry, EntryStatus, RQ_ENTRY, RqEntry, RqKind, SQ_ENTRY, SqEntry, SqOp, WCQ_ENTRY,
    WQ_ENTRY, WcqEntry, WqEntry, WqOp,
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
    /// the board description's first engine (`boards::zynqmp::pl::ZCU102_PL`: its data port
    /// HP0, 0xE80, an \[I\] value: see `boards::zynqmp::PlPort::stream_base`).
    pub fn new(node: usize, nodes: usize) -> Self {
        Self {
            channels: 16,
            rx_slots_log2: 6,
            axi_bps: 32_000_000_000,
            axi_latency: ModelTime::from_ns(200),
            link_bps: 32_000_000_000,
            stream_base: boards::zynqmp::pl::ZCU102_PL.npes[0].stream_base().0,
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
    /// The footer's payload CRC does not match what was sent (a link error, injected by a
    /// test's frame hook: the modelled links themselves do not corrupt packets). The receiving
    /// engine discards such a frame whole and sets `GEVENT.CRC_DROP` (docs/dma-engine.md
    /// §4.3).
    pub crc_error: bool,
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
    /// Frames discarded for a bad footer CRC (`GEVENT.CRC_DROP`).
    pub crc_drops: u64,
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
const GEVENT_CRC_DROP: u32 = 4;
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
        if frame.crc_error {
            self.stats.crc_drops += 1;
            self.gevent |= GEVENT_CRC_DROP;
            return;
        }
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
}
