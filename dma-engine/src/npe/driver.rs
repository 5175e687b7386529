//! The NPE driver: channels, the receive path, the fault-aware scheduler.
//!
//! One [`Npe`] drives one engine. Its data channels each carry one connection towards one
//! peer and run a `protocol::Sender`; one more channel, the control channel, carries the
//! protocol messages the driver answers with (ACK, NACK, RESOLVED, ABORT_ACK). For every peer
//! it accepts data from it runs a `protocol::Receiver`, which is the admission gate of the
//! receive path: no arriving block is written before `Receiver::admit` said `Write`
//! (docs/dma-engine.md §5.2).
//!
//! Everything happens in [`Npe::poll`]: interrupts, completion and receive queues, the
//! receiver's decisions, and the scheduler that turns the senders' transmit requests into
//! descriptors. A channel with an unresolved source fault is *parked*: it gets no new
//! descriptors until [`Npe::page_resolved`] says the page is back, while the other channels
//! keep being fed (§5.4). Time (`now`) is in nanoseconds of whatever clock the caller uses.

use hal::barrier::Barrier;
use hal::dma::{DmaDirection, DmaMemory};
use hal::regs::RegisterBus;
use heapless::{Deque, Vec};
use protocol::wire::{BlockHeader, Message};
use protocol::{
    Access, Admission, BlockRange, Completion, Delivery, Disposition, Envelope, FaultReason,
    Generation, Ignored, Receiver, ReceiverConfig, ReceiverStats, Sender, SenderConfig,
    SenderStats, TransferDesc, TransferId, Transmit, WriteOutcome,
};
use tock_registers::interfaces::{Readable, Writeable};

use super::desc::{
    CQ_ENTRY, CqEntry, EntryStatus, InlineMsg, RQ_ENTRY, RqEntry, RqKind, SQ_ENTRY, SqEntry, SqOp,
    WCQ_ENTRY, WQ_ENTRY, WcqEntry, WqEntry, WqOp,
};
use super::regs::{
    CAPS, CH_CTRL, CH_IRQ, CTRL, FAULT_INFO, FAULT_SYNDROME, GEVENT, ID, MAGIC, NODE, NpeChannel,
    NpeGlobal, RESUME, RING_CFG, VERSION, channel_offset,
};
use super::ring::Ring;
use crate::error::{DmaError, Result};

/// The block size of spec version 1.
pub const BLOCK_SIZE: u32 = 4096;
/// Reads of CTRL to wait for SOFT_RESET to clear itself (about 1 ms of register reads).
const SOFT_RESET_POLLS: u32 = 10_000;
/// RESUME.RETRYs of one descriptor whose page the memory manager calls present before the
/// fault goes to the fault service as unresolved (the SMMU and the memory manager disagree,
/// e.g. a mapping not installed yet).
pub const MAX_PRESENT_RETRIES: u8 = 4;
/// Most SQ entries per channel the driver shadows (log2 6).
pub const MAX_SQ_LOG2: u8 = 6;
const MAX_SQ: usize = 1 << MAX_SQ_LOG2;
/// Capacity of the driver's queue of outgoing protocol messages.
pub const CONTROL_QUEUE: usize = 128;
/// Most blocks that can wait for page resolutions at once.
pub const MAX_WAITERS: usize = 128;
/// Most commits outstanding (posted, result not yet read): enough for a 256-entry WQ, a
/// 256-entry WCQ and the one being written.
pub const MAX_COMMITS: usize = 520;
const PAGE: u64 = 4096;

/// Sender timing and limits, in the caller's time units (nanoseconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SenderTiming {
    /// How long a sent block waits for its ACK.
    pub ack_timeout: u64,
    /// First wait after a NACK before re-sending without a RESOLVED notice.
    pub backoff_initial: u64,
    /// Longest such wait.
    pub backoff_max: u64,
    /// How long a source fault may stay unresolved.
    pub source_fault_timeout: u64,
    /// Most sends of one block.
    pub max_attempts: u16,
    /// Most transfers open per channel (clamped to the driver's capacity).
    pub window: u32,
}

impl SenderTiming {
    /// Defaults for an ExaNet-class link: ACK timeout 1 ms, backoff 200 µs to 2 ms, source
    /// faults may take 20 ms, 16 attempts. Generous against a major fault (~60 µs,
    /// docs/dma-engine.md §10) so that slow resolutions do not cause spurious re-sends.
    pub const DEFAULT: SenderTiming = SenderTiming {
        ack_timeout: 1_000_000,
        backoff_initial: 200_000,
        backoff_max: 2_000_000,
        source_fault_timeout: 20_000_000,
        max_attempts: 16,
        window: u32::MAX,
    };
}

/// Engine-wide configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NpeConfig {
    /// This node's coordinate (22 bits).
    pub node: u32,
    /// log2 entries of each channel's SQ (at most 6).
    pub sq_log2: u8,
    /// log2 entries of each channel's CQ.
    pub cq_log2: u8,
    /// log2 entries of the RQ.
    pub rq_log2: u8,
    /// log2 entries of the WQ.
    pub wq_log2: u8,
    /// log2 entries of the WCQ.
    pub wcq_log2: u8,
    /// Most descriptors queued per data channel. Small values make parking take effect
    /// sooner and share the transmit arbiter more evenly.
    pub sq_batch: u8,
    /// The hardware channel reserved for control messages.
    pub control_channel: u8,
    /// Sender timing.
    pub timing: SenderTiming,
}

impl NpeConfig {
    /// A configuration for `node` with the control channel at `control_channel`: 16-entry
    /// SQs and CQs with 8 descriptors queued per channel, 64-entry RQ/WQ/WCQ, default timing.
    pub const fn new(node: u32, control_channel: u8) -> Self {
        Self {
            node,
            sq_log2: 4,
            cq_log2: 4,
            rq_log2: 6,
            wq_log2: 6,
            wcq_log2: 6,
            sq_batch: 8,
            control_channel,
            timing: SenderTiming::DEFAULT,
        }
    }
}

/// A data channel: one connection towards one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelConfig {
    /// The peer's node coordinate.
    pub peer: u32,
    /// Protection domain of the local (source) buffers.
    pub pdid: u16,
    /// The peer's region key (its receive PDID).
    pub peer_key: u32,
    /// Session of the connection (both ends must agree).
    pub session: u32,
}

/// A receive connection: blocks from one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerConfig {
    /// The peer's node coordinate.
    pub peer: u32,
    /// Session of the connection.
    pub session: u32,
    /// Protection domain of the local receive buffers (the key the peer addresses them with).
    pub pdid: u16,
}

/// What the memory manager says about a page an access faulted on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultClass {
    /// Present with the access allowed (resolved meanwhile).
    Present,
    /// Absent but resolvable: ask for resolution and wait.
    Resolvable,
    /// Never resolvable (outside every region, write to read-only).
    Denied(FaultReason),
}

/// The node services the driver needs: the memory manager's view of pages and the fault
/// service. Implemented by the node software (the simulator's node, or the kernel glue).
pub trait NpeHost {
    /// Classifies the page holding `va` in protection domain `pdid` for `access`.
    fn classify(&mut self, pdid: u16, va: u64, access: Access) -> FaultClass;
    /// Asks the fault service to make the page holding `va` present. It answers later with
    /// [`Npe::page_resolved`] or [`Npe::page_unresolvable`] (also when the request repeats one
    /// already in progress).
    fn request_resolution(&mut self, pdid: u16, va: u64, access: Access);
    /// The page-state generation of `pdid`'s registered region (protocol §3.2).
    fn snapshot(&self, pdid: u16) -> Generation;
    /// Whether `[va, va + len)` was written into the pages validated at `since`.
    fn check(
        &self,
        pdid: u16,
        va: u64,
        len: u64,
        since: Generation,
    ) -> core::result::Result<(), FaultReason>;
}

/// Counters of one [`Npe::poll`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollReport {
    /// CQ entries consumed.
    pub cq_entries: u32,
    /// RQ entries consumed.
    pub rq_entries: u32,
    /// WCQ entries consumed.
    pub wcq_entries: u32,
    /// Data descriptors posted.
    pub blocks_posted: u32,
    /// Message descriptors posted.
    pub msgs_posted: u32,
    /// Local faults handled.
    pub local_faults: u32,
    /// Earliest time a sender timer may need a poll (`None`: no timer pending). Channels that
    /// wait for room or a resolution are woken by their events instead.
    pub next_deadline: Option<u64>,
}

impl PollReport {
    /// Whether the poll did anything.
    pub fn did_work(&self) -> bool {
        self.cq_entries
            + self.rq_entries
            + self.wcq_entries
            + self.blocks_posted
            + self.msgs_posted
            + self.local_faults
            > 0
    }
}

/// Counters for reports and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NpeStats {
    /// `SEND_BLOCK` descriptors posted.
    pub blocks_posted: u64,
    /// `SEND_MSG` descriptors posted.
    pub msgs_posted: u64,
    /// Blocks written to memory (COMMITs whose write completed and whose pages did not
    /// change meanwhile).
    pub commits: u64,
    /// Blocks released without writing.
    pub releases: u64,
    /// Source faults reported by the engine.
    pub local_faults: u64,
    /// Of those, retried in place (the page was back already).
    pub local_fault_retries: u64,
    /// Destination write faults reported by the engine.
    pub dest_faults: u64,
    /// Commits whose version check failed (a page changed during the write).
    pub page_changed: u64,
    /// NACKs sent.
    pub nacks_sent: u64,
    /// RESOLVED notices sent.
    pub resolved_sent: u64,
    /// Messages that failed to decode (bad CRC, foreign, truncated) or arrived in the wrong
    /// kind of entry; dropped.
    pub malformed: u64,
    /// Messages for a session or peer this driver does not have; dropped.
    pub unknown_connection: u64,
    /// Messages a state machine refused as a protocol violation; dropped.
    pub protocol_violations: u64,
    /// Messages the sender ignored because the transfer is unknown.
    pub unknown_transfer: u64,
    /// Messages the sender ignored as duplicates (duplicate ACKs and NACKs).
    pub duplicates: u64,
    /// Messages of a type this driver does not serve (HELLO, fault-in, state lookup).
    pub unsupported: u64,
    /// Error entries from the engine (BAD_DESCRIPTOR, LINK_ERROR, FLUSHED).
    pub engine_errors: u64,
    /// Engine-wide error events (`GEVENT` BAD_DOORBELL, LINK_ERROR, CRC_DROP, QUEUE_ERROR),
    /// one per bit seen set; acknowledged at each poll.
    pub engine_events: u64,
    /// Polls that found `GEVENT.RX_HELD`: arriving traffic waited for a receive slot or an
    /// RQ entry (back-pressure into the network; informational).
    pub rx_held: u64,
    /// Queues the engine stopped because it could not reach them (`CH_IRQ.ERROR`,
    /// `GEVENT.QUEUE_ERROR`, §4); the driver wrote their bases again so the engine retries.
    pub queue_restarts: u64,
    /// Source faults retried [`MAX_PRESENT_RETRIES`] times on a page the memory manager
    /// called present, then handed to the fault service as unresolved.
    pub retry_limit_hits: u64,
    /// Polls that stopped draining a queue because a driver queue was full.
    pub back_pressure: u64,
    /// Source faults whose block stopped waiting without a resolution (its transfer was
    /// aborted, e.g. after `source_fault_timeout`, or an earlier attempt of the block was
    /// acknowledged meanwhile).
    pub source_waits_abandoned: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SqShadow {
    tid: TransferId,
    block: u32,
    attempt: u16,
}

#[derive(Debug)]
struct HwChannel {
    index: u8,
    sq: Ring,
    cq: Ring,
    shadow: [Option<SqShadow>; MAX_SQ],
    tail_dirty: bool,
}

#[derive(Debug)]
struct DataChannel<const T: usize, const NB: usize> {
    hw: HwChannel,
    cfg: ChannelConfig,
    sender: Sender<T, NB>,
    /// Unresolved source faults: the scheduler gives the channel nothing while non-zero.
    parked: u16,
    /// A LOCAL_FAULT the driver could not handle yet (its queues were full).
    fault_pending: bool,
    /// RESUME.RETRYs in a row for the descriptor at this SQ index (mod 2^16), after the
    /// memory manager called its page present: bounded by [`MAX_PRESENT_RETRIES`].
    present_retries: (u16, u8),
}

impl<const T: usize, const NB: usize> DataChannel<T, NB> {
    /// The scheduler gives it nothing now (parked on a source fault, a fault not handled
    /// yet, or its SQ full), so only its timers run.
    fn timers_only(&self, batch: u32) -> bool {
        self.parked > 0
            || self.fault_pending
            || self.hw.sq.in_use() >= batch
            || self.hw.sq.free() == 0
    }
}

#[derive(Debug)]
struct PeerRx<const T: usize, const NB: usize> {
    cfg: PeerConfig,
    receiver: Receiver<T, NB>,
}

#[derive(Clone, Copy, Debug)]
struct SlotShadow {
    peer: u8,
    header: BlockHeader,
    snapshot: Generation,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WaiterKind {
    Source {
        channel: u8,
        tid: TransferId,
        block: u32,
    },
    Dest {
        peer: u8,
        tid: TransferId,
        block: u32,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Waiter {
    pdid: u16,
    page: u64,
    kind: WaiterKind,
    /// Resolved at this generation, but the notice could not be queued yet.
    resolved: Option<Generation>,
    /// Found unresolvable, but the fatal NACK could not be queued yet.
    unresolvable: Option<FaultReason>,
}

#[derive(Clone, Copy, Debug)]
struct Outgoing {
    peer: u32,
    session: u32,
    message: Message,
}

/// The driver of one NPE: `CH` hardware channels (data channels plus the control channel),
/// `PEERS` receive connections, and per connection a window of `T` transfers of up to `NB`
/// blocks (so transfers up to `NB * 4 KiB`).
pub struct Npe<B: RegisterBus, const CH: usize, const PEERS: usize, const T: usize, const NB: usize>
{
    bus: B,
    cfg: NpeConfig,
    rq: Ring,
    wq: Ring,
    wcq: Ring,
    control: HwChannel,
    channels: [Option<DataChannel<T, NB>>; CH],
    peers: [Option<PeerRx<T, NB>>; PEERS],
    /// Commits in flight, indexed by the COOKIE of their WQ entry. Not by slot: the engine
    /// frees a slot when it posts the commit's WCQ entry and may reuse it for a new arrival
    /// before the driver has read that entry.
    commits: [Option<SlotShadow>; MAX_COMMITS],
    next_commit: usize,
    outgoing: Deque<Outgoing, CONTROL_QUEUE>,
    waiters: Vec<Waiter, MAX_WAITERS>,
    stats: NpeStats,
    next_channel: usize,
    wq_dirty: bool,
}

impl<B: RegisterBus, const CH: usize, const PEERS: usize, const T: usize, const NB: usize>
    Npe<B, CH, PEERS, T, NB>
{
    /// Probes the engine behind `bus`, allocates its rings from `dma`, programs and enables
    /// it (interrupts on). Channels and peers are opened afterwards.
    pub fn new<D: DmaMemory + ?Sized>(bus: B, dma: &D, cfg: NpeConfig) -> Result<Self> {
        let global = NpeGlobal::new(&bus, 0)?;
        let id = global.id().extract();
        if id.read(ID::MAGIC) != MAGIC {
            return Err(DmaError::NotAnNpe { id: id.get() });
        }
        if id.read(ID::VERSION) != VERSION {
            return Err(DmaError::UnsupportedVersion {
                found: id.read(ID::VERSION),
            });
        }
        let caps = global.caps().extract();
        let hw_channels = caps.read(CAPS::CHANNELS);
        check_capacity("channels", CH as u32, hw_channels)?;
        if caps.read(CAPS::BLOCK_SHIFT) != 0 {
            return Err(DmaError::InvalidConfig {
                what: "engine block size is not 4 KiB",
            });
        }
        let sq_max = caps.read(CAPS::SQ_MAX_LOG2).min(u32::from(MAX_SQ_LOG2));
        check_capacity("SQ log2", u32::from(cfg.sq_log2), sq_max)?;
        check_capacity(
            "CQ log2",
            u32::from(cfg.cq_log2),
            caps.read(CAPS::SQ_MAX_LOG2),
        )?;
        let rq_max = caps.read(CAPS::RQ_MAX_LOG2);
        for (what, log2) in [
            ("RQ log2", cfg.rq_log2),
            ("WQ log2", cfg.wq_log2),
            ("WCQ log2", cfg.wcq_log2),
        ] {
            check_capacity(what, u32::from(log2), rq_max)?;
        }
        if usize::from(cfg.control_channel) >= CH {
            return Err(DmaError::InvalidConfig {
                what: "control channel beyond the driver's channels",
            });
        }
        if cfg.sq_batch == 0 || u32::from(cfg.sq_batch) > 1 << cfg.sq_log2 {
            return Err(DmaError::InvalidConfig {
                what: "sq_batch must be 1..=SQ entries",
            });
        }
        check_coordinate(cfg.node)?;
        sender_config(&cfg.timing, 0)?;

        // Reset (SOFT_RESET clears itself when done, §3.1), then program the global rings.
        global.ctrl().write(CTRL::SOFT_RESET::SET);
        let mut polls = 0;
        while global.ctrl().is_set(CTRL::SOFT_RESET) {
            polls += 1;
            if polls >= SOFT_RESET_POLLS {
                return Err(DmaError::ResetStuck { polls });
            }
        }
        let rq = Ring::new(dma, cfg.rq_log2, RQ_ENTRY, DmaDirection::FromDevice)?;
        let wq = Ring::new(dma, cfg.wq_log2, WQ_ENTRY, DmaDirection::ToDevice)?;
        let wcq = Ring::new(dma, cfg.wcq_log2, WCQ_ENTRY, DmaDirection::FromDevice)?;
        global.rq_base().set(rq.bus_addr());
        global
            .rq_cfg()
            .write(RING_CFG::LOG2.val(u32::from(rq.log2())));
        global.rq_head().set(0);
        global.wq_base().set(wq.bus_addr());
        global
            .wq_cfg()
            .write(RING_CFG::LOG2.val(u32::from(wq.log2())));
        global.wcq_base().set(wcq.bus_addr());
        global
            .wcq_cfg()
            .write(RING_CFG::LOG2.val(u32::from(wcq.log2())));
        global.wcq_head().set(0);
        global
            .node()
            .write(NODE::COORD.val(cfg.node) + NODE::VALID::SET);
        let control = Self::setup_channel(&bus, dma, &cfg, cfg.control_channel, 0)?;
        global.ctrl().write(CTRL::ENABLE::SET + CTRL::IRQ_EN::SET);
        Ok(Self {
            bus,
            cfg,
            rq,
            wq,
            wcq,
            control,
            channels: [const { None }; CH],
            peers: [const { None }; PEERS],
            commits: [None; MAX_COMMITS],
            next_commit: 0,
            outgoing: Deque::new(),
            waiters: Vec::new(),
            stats: NpeStats::default(),
            next_channel: 0,
            wq_dirty: false,
        })
    }

    fn setup_channel<D: DmaMemory + ?Sized>(
        bus: &B,
        dma: &D,
        cfg: &NpeConfig,
        index: u8,
        pdid: u16,
    ) -> Result<HwChannel> {
        let regs = NpeChannel::new(bus, channel_offset(usize::from(index)))?;
        let sq = Ring::new(dma, cfg.sq_log2, SQ_ENTRY, DmaDirection::ToDevice)?;
        let cq = Ring::new(dma, cfg.cq_log2, CQ_ENTRY, DmaDirection::FromDevice)?;
        regs.ctrl().set(0);
        regs.sq_base().set(sq.bus_addr());
        regs.sq_cfg()
            .write(RING_CFG::LOG2.val(u32::from(sq.log2())));
        regs.cq_base().set(cq.bus_addr());
        regs.cq_cfg()
            .write(RING_CFG::LOG2.val(u32::from(cq.log2())));
        regs.cq_head().set(0);
        regs.ctrl()
            .write(CH_CTRL::EN::SET + CH_CTRL::IRQ_EN::SET + CH_CTRL::PDID.val(u32::from(pdid)));
        Ok(HwChannel {
            index,
            sq,
            cq,
            shadow: [None; MAX_SQ],
            tail_dirty: false,
        })
    }

    /// Opens data channel `channel` towards `cfg.peer`; transfer ids start at 0.
    pub fn open_channel<D: DmaMemory + ?Sized>(
        &mut self,
        dma: &D,
        channel: u8,
        cfg: ChannelConfig,
    ) -> Result<()> {
        if channel == self.cfg.control_channel {
            return Err(DmaError::ChannelInUse { channel });
        }
        let slot = self
            .channels
            .get(usize::from(channel))
            .ok_or(DmaError::NoSuchChannel { channel })?;
        if slot.is_some() {
            return Err(DmaError::ChannelInUse { channel });
        }
        if u16::try_from(cfg.peer_key).is_err() {
            // SEND_BLOCK carries the destination PDID in 16 bits (docs/dma-engine.md §4.1).
            return Err(DmaError::InvalidConfig {
                what: "peer_key wider than the descriptor's 16-bit destination PDID",
            });
        }
        check_coordinate(cfg.peer)?;
        // Answers are routed by (peer, session): two senders with one identity would take
        // each other's ACKs, and the peer's receiver would take the second one's blocks for
        // duplicates of the first's.
        if self
            .channels
            .iter()
            .flatten()
            .any(|c| c.cfg.peer == cfg.peer && c.cfg.session == cfg.session)
        {
            return Err(DmaError::InvalidConfig {
                what: "another channel already has this peer and session",
            });
        }
        let sender = Sender::new(sender_config(&self.cfg.timing, 0)?)?;
        let hw = Self::setup_channel(&self.bus, dma, &self.cfg, channel, cfg.pdid)?;
        if let Some(slot) = self.channels.get_mut(usize::from(channel)) {
            *slot = Some(DataChannel {
                hw,
                cfg,
                sender,
                parked: 0,
                fault_pending: false,
                present_retries: (0, 0),
            });
        }
        Ok(())
    }

    /// Accepts data from `cfg.peer` into receive slot `slot` (an index of the driver's own
    /// peer table).
    pub fn open_peer(&mut self, slot: u8, cfg: PeerConfig) -> Result<()> {
        check_coordinate(cfg.peer)?;
        // A live receiver may have commits in flight; replacing it would orphan them.
        match self.peers.get(usize::from(slot)) {
            None => return Err(DmaError::NoSuchPeer { slot }),
            Some(Some(_)) => return Err(DmaError::PeerInUse { slot }),
            Some(None) => {}
        }
        if self
            .peers
            .iter()
            .flatten()
            .any(|p| p.cfg.peer == cfg.peer && p.cfg.session == cfg.session)
        {
            return Err(DmaError::InvalidConfig {
                what: "another peer slot already has this peer and session",
            });
        }
        let receiver = Receiver::new(ReceiverConfig {
            block_size: BLOCK_SIZE,
            first_tid: TransferId(0),
        })?;
        if let Some(entry) = self.peers.get_mut(usize::from(slot)) {
            *entry = Some(PeerRx { cfg, receiver });
        }
        Ok(())
    }

    /// The configuration in force.
    pub fn config(&self) -> &NpeConfig {
        &self.cfg
    }

    /// Driver counters.
    pub fn stats(&self) -> &NpeStats {
        &self.stats
    }

    /// The sender counters of a data channel.
    pub fn sender_stats(&self, channel: u8) -> Result<&SenderStats> {
        Ok(self.channel(channel)?.sender.stats())
    }

    /// The receiver counters of a peer slot.
    pub fn receiver_stats(&self, slot: u8) -> Result<&ReceiverStats> {
        self.peers
            .get(usize::from(slot))
            .and_then(Option::as_ref)
            .map(|p| p.receiver.stats())
            .ok_or(DmaError::NoSuchPeer { slot })
    }

    /// Whether a data channel is parked on unresolved source faults.
    pub fn is_parked(&self, channel: u8) -> Result<bool> {
        Ok(self.channel(channel)?.parked > 0)
    }

    /// Transfers submitted on `channel` whose completion was not taken yet.
    pub fn open_transfers(&self, channel: u8) -> Result<usize> {
        Ok(self.channel(channel)?.sender.open_transfers())
    }

    /// The register bus (for tests and diagnostics).
    pub fn bus(&self) -> &B {
        &self.bus
    }

    fn channel(&self, channel: u8) -> Result<&DataChannel<T, NB>> {
        self.channels
            .get(usize::from(channel))
            .and_then(Option::as_ref)
            .ok_or(DmaError::NoSuchChannel { channel })
    }

    fn channel_mut(&mut self, channel: u8) -> Result<&mut DataChannel<T, NB>> {
        self.channels
            .get_mut(usize::from(channel))
            .and_then(Option::as_mut)
            .ok_or(DmaError::NoSuchChannel { channel })
    }

    /// Queues an RDMA write on `channel`. `QueueFull` is back-pressure: take completions
    /// with [`poll_completion`](Self::poll_completion), then submit again. The blocks go out
    /// at the next [`poll`](Self::poll).
    pub fn submit(&mut self, channel: u8, desc: TransferDesc) -> Result<TransferId> {
        // The descriptors carry 49-bit virtual addresses (desc::VA_MASK).
        if !within_va(desc.src, desc.len) || !within_va(desc.dest, desc.len) {
            return Err(DmaError::InvalidTransfer {
                what: "source or destination beyond the engine's 49-bit virtual addresses",
            });
        }
        let ch = self.channel_mut(channel)?;
        let open = ch.sender.open_transfers();
        match ch.sender.submit(desc) {
            Ok(tid) => Ok(tid),
            Err(protocol::ProtocolError::WindowFull { .. }) => {
                Err(DmaError::QueueFull { channel, open })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The next completion of `channel`, in submission order, exactly once per transfer.
    pub fn poll_completion(&mut self, channel: u8) -> Result<Option<Completion>> {
        Ok(self.channel_mut(channel)?.sender.poll_completion())
    }

    /// The next finished transfer received from peer slot `slot`, in order, exactly once.
    pub fn poll_delivery(&mut self, slot: u8) -> Result<Option<Delivery>> {
        Ok(self
            .peers
            .get_mut(usize::from(slot))
            .and_then(Option::as_mut)
            .ok_or(DmaError::NoSuchPeer { slot })?
            .receiver
            .poll_delivery())
    }

    /// Does all pending work at time `now` (ns); see the module documentation.
    pub fn poll<H: NpeHost + ?Sized>(&mut self, now: u64, host: &mut H) -> Result<PollReport> {
        let mut report = PollReport::default();
        self.service_events()?;
        self.service_channels(now, host, &mut report)?;
        // Write results first: they free the driver's commit records and produce replies.
        self.drain_wcq(host, &mut report)?;
        self.drain_rq(now, host, &mut report)?;
        self.retry_waiters()?;
        self.transmit(now, &mut report)?;
        self.ring_doorbells()?;
        report.next_deadline = self.next_deadline(now);
        Ok(report)
    }

    /// The fault service made the page holding `va` of `pdid` present (table generation
    /// `generation` afterwards): re-issue waiting source blocks and send RESOLVED notices.
    /// Takes effect at the next [`poll`](Self::poll).
    pub fn page_resolved(&mut self, pdid: u16, va: u64, generation: Generation) -> Result<u32> {
        let page = va & !(PAGE - 1);
        let mut released = 0;
        let mut i = 0;
        while let Some(w) = self.waiters.get(i).copied() {
            if w.pdid != pdid || w.page != page {
                i += 1;
                continue;
            }
            let done = match w.kind {
                WaiterKind::Source {
                    channel,
                    tid,
                    block,
                } => {
                    let ch = self.channel_mut(channel)?;
                    ch.sender.source_resolved(tid, BlockRange::single(block))?;
                    ch.parked = ch.parked.saturating_sub(1);
                    true
                }
                WaiterKind::Dest { peer, tid, block } => {
                    self.resolve_dest(peer, tid, block, generation)?
                }
            };
            if done {
                self.waiters.swap_remove(i);
                released += 1;
            } else {
                if let Some(w) = self.waiters.get_mut(i) {
                    w.resolved = Some(generation);
                }
                i += 1;
            }
        }
        Ok(released)
    }

    /// The fault service cannot make the page present: abort the transfers waiting for it
    /// (a fatal NACK at the destination; a cancel at the source).
    pub fn page_unresolvable(&mut self, pdid: u16, va: u64, reason: FaultReason) -> Result<u32> {
        let page = va & !(PAGE - 1);
        let mut aborted = 0;
        let mut i = 0;
        while let Some(w) = self.waiters.get(i).copied() {
            if w.pdid != pdid || w.page != page {
                i += 1;
                continue;
            }
            aborted += 1;
            match w.kind {
                WaiterKind::Source {
                    channel,
                    tid,
                    block,
                } => {
                    let ch = self.channel_mut(channel)?;
                    ch.sender.source_unresolvable(tid, block, reason)?;
                    ch.parked = ch.parked.saturating_sub(1);
                }
                WaiterKind::Dest { peer, tid, block } => {
                    if !self.fail_dest(peer, tid, block, reason)? {
                        // No room for the fatal NACK yet: `retry_waiters` sends it.
                        if let Some(w) = self.waiters.get_mut(i) {
                            w.unresolvable = Some(reason);
                        }
                        i += 1;
                        continue;
                    }
                }
            }
            self.waiters.swap_remove(i);
        }
        Ok(aborted)
    }

    /// The fatal NACK for a destination block that cannot be resolved; `false` if the
    /// control queue has no room yet.
    fn fail_dest(
        &mut self,
        peer: u8,
        tid: TransferId,
        block: u32,
        reason: FaultReason,
    ) -> Result<bool> {
        if self.outgoing.is_full() {
            return Ok(false);
        }
        let (cfg, nack) = {
            let rx = self.peer_mut(peer)?;
            let nack = rx
                .receiver
                .unresolvable(tid, BlockRange::single(block), reason)?;
            (rx.cfg, nack)
        };
        if let Some(nack) = nack {
            self.queue_message(cfg.peer, cfg.session, Message::Nack(nack));
            self.stats.nacks_sent += 1;
        }
        Ok(true)
    }

    fn peer_mut(&mut self, slot: u8) -> Result<&mut PeerRx<T, NB>> {
        self.peers
            .get_mut(usize::from(slot))
            .and_then(Option::as_mut)
            .ok_or(DmaError::NoSuchPeer { slot })
    }

    /// RESOLVED for a destination block; `false` if the control queue has no room yet.
    fn resolve_dest(
        &mut self,
        peer: u8,
        tid: TransferId,
        block: u32,
        generation: Generation,
    ) -> Result<bool> {
        if self.outgoing.is_full() {
            return Ok(false);
        }
        let rx = self.peer_mut(peer)?;
        let cfg = rx.cfg;
        if let Some(resolved) = rx
            .receiver
            .resolved(tid, BlockRange::single(block), generation)?
        {
            self.queue_message(cfg.peer, cfg.session, Message::Resolved(resolved));
            self.stats.resolved_sent += 1;
        }
        Ok(true)
    }

    fn queue_message(&mut self, peer: u32, session: u32, message: Message) -> bool {
        self.outgoing
            .push_back(Outgoing {
                peer,
                session,
                message,
            })
            .is_ok()
    }

    /// Destination waiters whose page was resolved, or found unresolvable, while the
    /// control queue was full.
    fn retry_waiters(&mut self) -> Result<()> {
        let mut i = 0;
        while let Some(w) = self.waiters.get(i).copied() {
            let WaiterKind::Dest { peer, tid, block } = w.kind else {
                i += 1;
                continue;
            };
            let done = match (w.unresolvable, w.resolved) {
                (Some(reason), _) => self.fail_dest(peer, tid, block, reason)?,
                (None, Some(generation)) => self.resolve_dest(peer, tid, block, generation)?,
                (None, None) => false,
            };
            if done {
                self.waiters.swap_remove(i);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Engine-wide events: counted and acknowledged (W1C exactly the bits read), or the
    /// level interrupt would stay asserted (§9).
    fn service_events(&mut self) -> Result<()> {
        let global = NpeGlobal::new(&self.bus, 0)?;
        let events = global.gevent().get();
        if events == 0 {
            return Ok(());
        }
        global.gevent().set(events);
        if events & GEVENT::RX_HELD::SET.value != 0 {
            self.stats.rx_held += 1;
        }
        let errors = events & !GEVENT::RX_HELD::SET.value;
        self.stats.engine_events += u64::from(errors.count_ones());
        if events & GEVENT::QUEUE_ERROR::SET.value != 0 {
            // Writing a ring's base again lets the engine retry it (§4); the rings are the
            // driver's own memory, so the same addresses.
            global.rq_base().set(self.rq.bus_addr());
            global.wq_base().set(self.wq.bus_addr());
            global.wcq_base().set(self.wcq.bus_addr());
            self.stats.queue_restarts += 1;
        }
        Ok(())
    }

    /// Channel interrupts: local faults and completion entries.
    fn service_channels<H: NpeHost + ?Sized>(
        &mut self,
        now: u64,
        host: &mut H,
        report: &mut PollReport,
    ) -> Result<()> {
        for index in 0..CH {
            let Some(Some(ch)) = self.channels.get(index) else {
                continue;
            };
            let regs = NpeChannel::new(&self.bus, channel_offset(usize::from(ch.hw.index)))?;
            let causes = regs.irq().get();
            if causes != 0 {
                // W1C exactly the causes seen (never a read-modify-write).
                regs.irq().set(causes);
            }
            if causes & CH_IRQ::ERROR::SET.value != 0 {
                restart_channel_rings(&regs, &ch.hw);
                self.stats.queue_restarts += 1;
            }
            let fault = causes & CH_IRQ::LOCAL_FAULT::SET.value != 0;
            if fault || ch.fault_pending {
                self.handle_local_fault(index, now, host, report)?;
            }
            self.drain_cq(index, report)?;
        }
        // The control channel only ever completes messages.
        let regs = NpeChannel::new(&self.bus, channel_offset(usize::from(self.control.index)))?;
        let causes = regs.irq().get();
        if causes != 0 {
            regs.irq().set(causes);
        }
        if causes & CH_IRQ::ERROR::SET.value != 0 {
            restart_channel_rings(&regs, &self.control);
            self.stats.queue_restarts += 1;
        }
        let control_errors = drain_completions(&self.bus, &mut self.control, report)?;
        self.stats.engine_errors += u64::from(control_errors);
        Ok(())
    }

    fn drain_cq(&mut self, index: usize, report: &mut PollReport) -> Result<()> {
        let Some(Some(ch)) = self.channels.get_mut(index) else {
            return Ok(());
        };
        let errors = drain_completions(&self.bus, &mut ch.hw, report)?;
        self.stats.engine_errors += u64::from(errors);
        Ok(())
    }

    fn handle_local_fault<H: NpeHost + ?Sized>(
        &mut self,
        index: usize,
        now: u64,
        host: &mut H,
        report: &mut PollReport,
    ) -> Result<()> {
        let room = !self.waiters.is_full();
        let Some(Some(ch)) = self.channels.get_mut(index) else {
            return Ok(());
        };
        let regs = NpeChannel::new(&self.bus, channel_offset(usize::from(ch.hw.index)))?;
        let state = regs.status().read(super::regs::CH_STATUS::STATE);
        if state != 2 {
            // Not (or no longer) in FAULT_WAIT.
            ch.fault_pending = false;
            return Ok(());
        }
        if !room {
            ch.fault_pending = true;
            self.stats.back_pressure += 1;
            return Ok(());
        }
        ch.fault_pending = false;
        report.local_faults += 1;
        self.stats.local_faults += 1;
        let addr = regs.fault_addr().get();
        let sq_index = regs.fault_info().read(FAULT_INFO::SQ_INDEX) as u16;
        let syndrome = regs.fault_syndrome().extract();
        // DECERR: the read reached no memory at all; no resolution can help (§3.2).
        let decode_error = syndrome.is_set(FAULT_SYNDROME::VALID)
            && syndrome.read(FAULT_SYNDROME::RESP) == AXI_DECERR;
        let slot = usize::from(sq_index) & (ch.hw.sq.slots() as usize - 1);
        let shadow = ch.hw.shadow.get(slot).copied().flatten();
        let Some(shadow) = shadow else {
            // A fault on a descriptor that reads no user memory: an engine bug. Skip it.
            self.stats.engine_errors += 1;
            regs.resume().write(RESUME::SKIP::SET);
            return Ok(());
        };
        let pdid = ch.cfg.pdid;
        let mut class = if decode_error {
            FaultClass::Denied(FaultReason::OutOfRegion)
        } else {
            host.classify(pdid, addr, Access::Read)
        };
        if class == FaultClass::Present {
            let (index, count) = ch.present_retries;
            let count = if index == sq_index { count } else { 0 };
            if count >= MAX_PRESENT_RETRIES {
                // The SMMU keeps refusing a page the memory manager calls present: let the
                // fault service look at it instead of retrying for ever.
                class = FaultClass::Resolvable;
                ch.present_retries = (sq_index, 0);
                self.stats.retry_limit_hits += 1;
            } else {
                ch.present_retries = (sq_index, count + 1);
            }
        } else {
            ch.present_retries = (sq_index, 0);
        }
        match class {
            FaultClass::Present => {
                regs.resume().write(RESUME::RETRY::SET);
                self.stats.local_fault_retries += 1;
            }
            FaultClass::Resolvable => {
                let disposition = ch.sender.source_fault(
                    now,
                    shadow.tid,
                    shadow.block,
                    shadow.attempt,
                    FaultReason::NotPresent,
                );
                // The channel leaves FAULT_WAIT whatever the sender said: with the interrupt
                // already acknowledged, nothing else would ever release it.
                regs.resume().write(RESUME::SKIP::SET);
                let disposition = disposition?;
                if disposition == Disposition::Applied {
                    ch.parked += 1;
                    let channel = index as u8;
                    // `room` was checked above.
                    let _ = self.waiters.push(Waiter {
                        pdid,
                        page: addr & !(PAGE - 1),
                        kind: WaiterKind::Source {
                            channel,
                            tid: shadow.tid,
                            block: shadow.block,
                        },
                        resolved: None,
                        unresolvable: None,
                    });
                    host.request_resolution(pdid, addr, Access::Read);
                }
            }
            FaultClass::Denied(reason) => {
                let applied =
                    ch.sender
                        .source_fault(now, shadow.tid, shadow.block, shadow.attempt, reason);
                regs.resume().write(RESUME::SKIP::SET);
                applied?;
            }
        }
        Ok(())
    }

    /// Arrived messages and staged blocks.
    fn drain_rq<H: NpeHost + ?Sized>(
        &mut self,
        now: u64,
        host: &mut H,
        report: &mut PollReport,
    ) -> Result<()> {
        let start = self.rq.index;
        let mut buf = [0u8; RQ_ENTRY];
        // Entries taken are acknowledged (RQ_HEAD) even when handling one fails: otherwise
        // the engine, its RQ full, would wait for room the driver never gives.
        let result = loop {
            match self.rq.read_new(self.rq.index, &mut buf) {
                Ok(true) => {}
                Ok(false) => break Ok(()),
                Err(e) => break Err(e),
            }
            // Room for the reply this entry may cause, and for its WQ entry.
            let wq_room = self.wq.free() > 0 || {
                match NpeGlobal::new(&self.bus, 0) {
                    Ok(global) => self.wq.seen_head = global.wq_head().get(),
                    Err(e) => break Err(e.into()),
                }
                self.wq.free() > 0
            };
            if self.outgoing.len() + 2 > CONTROL_QUEUE || !wq_room || !self.commits_free() {
                self.stats.back_pressure += 1;
                break Ok(());
            }
            let entry = RqEntry::decode(&buf);
            self.rq.index = self.rq.index.wrapping_add(1);
            report.rq_entries += 1;
            let handled = match entry {
                Ok(entry) => self.receive(now, host, &entry),
                Err(_) => {
                    // An entry the engine should never write: handled below like one whose
                    // handling failed (counted, and its slot freed if it names one).
                    self.stats.malformed += 1;
                    Err(DmaError::BadEntry {
                        what: "receive entry",
                    })
                }
            };
            if let Err(e) = handled {
                if !is_entry_error(&e) {
                    break Err(e);
                }
                // One bad entry must not stop the others, nor lose a receive slot for good.
                self.stats.engine_errors += 1;
                if let Some(slot) = RqEntry::block_slot(&buf)
                    && let Err(e) = self.post_write(slot, WqOp::Release, 0)
                {
                    break Err(e);
                }
            }
        };
        if self.rq.index != start {
            NpeGlobal::new(&self.bus, 0)?.rq_head().set(self.rq.index);
        }
        result
    }

    fn receive<H: NpeHost + ?Sized>(
        &mut self,
        now: u64,
        host: &mut H,
        entry: &RqEntry,
    ) -> Result<()> {
        let decoded = Envelope::decode(entry.msg.as_bytes());
        match entry.kind {
            RqKind::Msg => {
                let Ok((envelope, used)) = decoded else {
                    self.stats.malformed += 1;
                    return Ok(());
                };
                if used != entry.msg.len() {
                    self.stats.malformed += 1;
                    return Ok(());
                }
                self.on_message(now, entry.src, envelope)
            }
            RqKind::Block { slot, length } => {
                let header = match decoded {
                    Ok((
                        Envelope {
                            session,
                            message: Message::Block(header),
                        },
                        used,
                    )) if used == entry.msg.len() && header.len == length => {
                        Some((session, header))
                    }
                    _ => None,
                };
                let Some((session, header)) = header else {
                    self.stats.malformed += 1;
                    return self.post_write(slot, WqOp::Release, 0);
                };
                self.on_block(host, entry.src, session, slot, header)
            }
        }
    }

    fn on_message(&mut self, now: u64, src: u32, envelope: Envelope) -> Result<()> {
        let message = envelope.message;
        match message {
            Message::Ack(_)
            | Message::Nack(_)
            | Message::Resolved(_)
            | Message::FaultInAck(_)
            | Message::AbortAck(_) => {
                let Some(ch) = self
                    .channels
                    .iter_mut()
                    .flatten()
                    .find(|c| c.cfg.peer == src && c.cfg.session == envelope.session)
                else {
                    self.stats.unknown_connection += 1;
                    return Ok(());
                };
                match ch.sender.handle(now, &message) {
                    Ok(Disposition::Applied) => {}
                    Ok(Disposition::Ignored(Ignored::UnknownTransfer)) => {
                        self.stats.unknown_transfer += 1
                    }
                    Ok(Disposition::Ignored(Ignored::Duplicate)) => self.stats.duplicates += 1,
                    Ok(Disposition::Ignored(_)) => {}
                    Err(_) => self.stats.protocol_violations += 1,
                }
            }
            Message::Abort(abort) => {
                let Some(rx) = self
                    .peers
                    .iter_mut()
                    .flatten()
                    .find(|p| p.cfg.peer == src && p.cfg.session == envelope.session)
                else {
                    self.stats.unknown_connection += 1;
                    return Ok(());
                };
                let cfg = rx.cfg;
                if let Some(ack) = rx.receiver.on_abort(&abort) {
                    self.queue_message(cfg.peer, cfg.session, Message::AbortAck(ack));
                }
            }
            Message::Block(_) => self.stats.malformed += 1,
            _ => self.stats.unsupported += 1,
        }
        Ok(())
    }

    fn on_block<H: NpeHost + ?Sized>(
        &mut self,
        host: &mut H,
        src: u32,
        session: u32,
        slot: u8,
        header: BlockHeader,
    ) -> Result<()> {
        let found = self.peers.iter().position(|p| {
            p.as_ref()
                .is_some_and(|p| p.cfg.peer == src && p.cfg.session == session)
        });
        let Some(peer_index) = found else {
            self.stats.unknown_connection += 1;
            return self.post_write(slot, WqOp::Release, 0);
        };
        let peer = peer_index as u8;
        let rx = self.peer_mut(peer)?;
        let cfg = rx.cfg;
        let admission = rx.receiver.admit(&header);
        match admission {
            Ok(Admission::Write) => {
                if header.key != u32::from(cfg.pdid)
                    || !within_va(header.dest, u64::from(header.len))
                {
                    // A key this receiver does not own, or an address the engine cannot
                    // reach (COMMIT carries 49 bits): refuse for good, write nothing.
                    let reply = rx.receiver.written(
                        &header,
                        WriteOutcome::Fault {
                            reason: FaultReason::OutOfRegion,
                            fatal: true,
                        },
                    )?;
                    if let Some(reply) = reply {
                        self.queue_message(cfg.peer, cfg.session, reply);
                        self.stats.nacks_sent += 1;
                    }
                    return self.post_write(slot, WqOp::Release, 0);
                }
                let snapshot = host.snapshot(cfg.pdid);
                let Some(cookie) = self.alloc_commit(SlotShadow {
                    peer,
                    header,
                    snapshot,
                }) else {
                    // Cannot happen: `drain_rq` checked for a free record first.
                    self.stats.engine_errors += 1;
                    return self.post_write(slot, WqOp::Release, 0);
                };
                self.post_write(
                    slot,
                    WqOp::Commit {
                        pdid: cfg.pdid,
                        length: header.len,
                        dst_va: header.dest,
                    },
                    cookie,
                )
            }
            Ok(Admission::Duplicate(ack)) | Ok(Admission::Retired(ack)) => {
                self.queue_message(cfg.peer, cfg.session, Message::Ack(ack));
                self.post_write(slot, WqOp::Release, 0)
            }
            Ok(Admission::Aborted) | Ok(Admission::OutOfWindow) | Ok(Admission::InFlight) => {
                self.post_write(slot, WqOp::Release, 0)
            }
            Err(_) => {
                self.stats.protocol_violations += 1;
                self.post_write(slot, WqOp::Release, 0)
            }
        }
    }

    fn alloc_commit(&mut self, shadow: SlotShadow) -> Option<u64> {
        for step in 0..MAX_COMMITS {
            let index = (self.next_commit + step) % MAX_COMMITS;
            if let Some(entry) = self.commits.get_mut(index)
                && entry.is_none()
            {
                *entry = Some(shadow);
                self.next_commit = (index + 1) % MAX_COMMITS;
                return Some(index as u64);
            }
        }
        None
    }

    fn commits_free(&self) -> bool {
        self.commits.iter().any(Option::is_none)
    }

    fn post_write(&mut self, slot: u8, op: WqOp, cookie: u64) -> Result<()> {
        if op == WqOp::Release {
            self.stats.releases += 1;
        }
        let entry = WqEntry { op, slot, cookie };
        self.wq.write(self.wq.index, &entry.encode())?;
        self.wq.index = self.wq.index.wrapping_add(1);
        self.wq_dirty = true;
        Ok(())
    }

    /// Results of commits.
    fn drain_wcq<H: NpeHost + ?Sized>(
        &mut self,
        host: &mut H,
        report: &mut PollReport,
    ) -> Result<()> {
        let start = self.wcq.index;
        let mut buf = [0u8; WCQ_ENTRY];
        // As in `drain_rq`: WCQ_HEAD covers every entry taken, whatever happened to it.
        let result = loop {
            match self.wcq.read_new(self.wcq.index, &mut buf) {
                Ok(true) => {}
                Ok(false) => break Ok(()),
                Err(e) => break Err(e),
            }
            if self.outgoing.len() + 2 > CONTROL_QUEUE || self.waiters.is_full() {
                self.stats.back_pressure += 1;
                break Ok(());
            }
            self.wcq.index = self.wcq.index.wrapping_add(1);
            report.wcq_entries += 1;
            let entry = WcqEntry::decode(&buf).unwrap_or_else(|_| {
                // An entry the engine should never write. Its COOKIE (word 1) still names
                // the commit: finish that commit as refused, so the block is NACKed and
                // re-sent instead of staying "being written" for ever.
                self.stats.engine_errors += 1;
                WcqEntry {
                    phase: true,
                    status: EntryStatus::BadDescriptor,
                    slot: buf[2],
                    bytes: 0,
                    cookie: buf
                        .get(8..16)
                        .and_then(|b| b.try_into().ok())
                        .map_or(u64::MAX, u64::from_le_bytes),
                    fault_addr: 0,
                    axi_resp: 0,
                }
            });
            if let Err(e) = self.write_done(host, &entry) {
                if !is_entry_error(&e) {
                    break Err(e);
                }
                self.stats.engine_errors += 1;
            }
        };
        if self.wcq.index != start {
            NpeGlobal::new(&self.bus, 0)?.wcq_head().set(self.wcq.index);
        }
        result
    }

    fn write_done<H: NpeHost + ?Sized>(&mut self, host: &mut H, entry: &WcqEntry) -> Result<()> {
        let Some(shadow) = usize::try_from(entry.cookie)
            .ok()
            .and_then(|c| self.commits.get_mut(c))
            .and_then(Option::take)
        else {
            self.stats.engine_errors += 1;
            return Ok(());
        };
        let header = shadow.header;
        let rx = self.peer_mut(shadow.peer)?;
        let cfg = rx.cfg;
        let mut wait_for: Option<u64> = None;
        let mut resolved_now = false;
        let outcome = match entry.status {
            EntryStatus::Ok => match host.check(
                cfg.pdid,
                header.dest,
                u64::from(header.len),
                shadow.snapshot,
            ) {
                Ok(()) => {
                    self.stats.commits += 1;
                    WriteOutcome::Written
                }
                Err(reason) => {
                    self.stats.page_changed += 1;
                    // Which page changed is not known; the block's first page is asked for,
                    // and the backoff covers the rest.
                    match host.classify(cfg.pdid, header.dest, Access::Write) {
                        FaultClass::Denied(r) => WriteOutcome::Fault {
                            reason: r,
                            fatal: true,
                        },
                        FaultClass::Present => {
                            resolved_now = true;
                            WriteOutcome::Fault {
                                reason,
                                fatal: false,
                            }
                        }
                        FaultClass::Resolvable => {
                            wait_for = Some(header.dest);
                            WriteOutcome::Fault {
                                reason,
                                fatal: false,
                            }
                        }
                    }
                }
            },
            EntryStatus::DstFault => {
                self.stats.dest_faults += 1;
                match host.classify(cfg.pdid, entry.fault_addr, Access::Write) {
                    FaultClass::Denied(reason) => WriteOutcome::Fault {
                        reason,
                        fatal: true,
                    },
                    FaultClass::Present => {
                        resolved_now = true;
                        WriteOutcome::Fault {
                            reason: FaultReason::NotPresent,
                            fatal: false,
                        }
                    }
                    FaultClass::Resolvable => {
                        wait_for = Some(entry.fault_addr);
                        WriteOutcome::Fault {
                            reason: FaultReason::NotPresent,
                            fatal: false,
                        }
                    }
                }
            }
            _ => {
                // BAD_DESCRIPTOR: our own commit was refused. The block is not written; NACK
                // it so the sender re-sends.
                self.stats.engine_errors += 1;
                resolved_now = true;
                WriteOutcome::Fault {
                    reason: FaultReason::NotPresent,
                    fatal: false,
                }
            }
        };
        let rx = self.peer_mut(shadow.peer)?;
        let reply = rx.receiver.written(&header, outcome)?;
        if let Some(reply) = reply {
            if matches!(reply, Message::Nack(_)) {
                self.stats.nacks_sent += 1;
            }
            self.queue_message(cfg.peer, cfg.session, reply);
        }
        if matches!(outcome, WriteOutcome::Fault { fatal: false, .. }) {
            if resolved_now {
                let generation = host.snapshot(cfg.pdid);
                self.resolve_dest(shadow.peer, header.tid, header.block, generation)?;
            } else if let Some(va) = wait_for {
                let waiter = Waiter {
                    pdid: cfg.pdid,
                    page: va & !(PAGE - 1),
                    kind: WaiterKind::Dest {
                        peer: shadow.peer,
                        tid: header.tid,
                        block: header.block,
                    },
                    resolved: None,
                    unresolvable: None,
                };
                if !self.waiters.iter().any(|w| w.kind == waiter.kind) {
                    // Room was checked before taking the entry.
                    let _ = self.waiters.push(waiter);
                }
                host.request_resolution(cfg.pdid, va, Access::Write);
            }
        }
        Ok(())
    }

    /// The scheduler: control messages first, then data channels round-robin, skipping
    /// parked ones.
    fn transmit(&mut self, now: u64, report: &mut PollReport) -> Result<()> {
        // Control messages.
        refresh_head(&self.bus, &mut self.control)?;
        while self.control.sq.free() > 0 {
            let Some(out) = self.outgoing.pop_front() else {
                break;
            };
            let msg = encode_message(out.session, &out.message)?;
            let signal = self.control.sq.free() == 1;
            post(
                &mut self.control,
                SqEntry {
                    op: SqOp::SendMsg,
                    signal,
                    tid14: out.message.transfer().map_or(0, |t| (t.0 & 0x3fff) as u16),
                    peer: out.peer,
                    dst_pdid: 0,
                    cookie: 0,
                    msg,
                },
                None,
            )?;
            report.msgs_posted += 1;
            self.stats.msgs_posted += 1;
        }

        // Data channels, one descriptor per channel per round.
        let batch = u32::from(self.cfg.sq_batch);
        for index in 0..CH {
            if let Some(Some(ch)) = self.channels.get_mut(index) {
                refresh_head(&self.bus, &mut ch.hw)?;
            }
        }
        self.expire_parked(now)?;
        let mut progress = true;
        while progress {
            progress = false;
            for step in 0..CH {
                let index = (self.next_channel + step) % CH;
                let Some(Some(ch)) = self.channels.get_mut(index) else {
                    continue;
                };
                if ch.parked > 0 || ch.fault_pending {
                    continue;
                }
                if ch.hw.sq.in_use() >= batch || ch.hw.sq.free() == 0 {
                    continue;
                }
                let Some(transmit) = ch.sender.poll_transmit(now) else {
                    continue;
                };
                // Signal the descriptor that fills the batch: its completion tells the driver
                // there is room again.
                let signal = ch.hw.sq.in_use() + 1 >= batch;
                match transmit {
                    Transmit::Block(send) => {
                        let header = send.header;
                        let msg = encode_message(ch.cfg.session, &Message::Block(header))?;
                        post(
                            &mut ch.hw,
                            SqEntry {
                                op: SqOp::SendBlock {
                                    src_va: send.src,
                                    length: header.len,
                                    dst_va: header.dest,
                                },
                                signal,
                                tid14: (header.tid.0 & 0x3fff) as u16,
                                peer: ch.cfg.peer,
                                dst_pdid: ch.cfg.peer_key as u16,
                                cookie: u64::from(header.tid.0) << 32 | u64::from(header.block),
                                msg,
                            },
                            Some(SqShadow {
                                tid: header.tid,
                                block: header.block,
                                attempt: header.attempt,
                            }),
                        )?;
                        report.blocks_posted += 1;
                        self.stats.blocks_posted += 1;
                    }
                    Transmit::Abort(abort) => {
                        let msg = encode_message(ch.cfg.session, &Message::Abort(abort))?;
                        post(
                            &mut ch.hw,
                            SqEntry {
                                op: SqOp::SendMsg,
                                signal,
                                tid14: (abort.tid.0 & 0x3fff) as u16,
                                peer: ch.cfg.peer,
                                dst_pdid: 0,
                                cookie: 0,
                                msg,
                            },
                            None,
                        )?;
                        report.msgs_posted += 1;
                        self.stats.msgs_posted += 1;
                    }
                }
                progress = true;
            }
        }
        self.next_channel = (self.next_channel + 1) % CH.max(1);
        Ok(())
    }

    /// Runs the timers of channels the scheduler gives no transmissions (parked, or with a
    /// full SQ): a source fault the fault service never resolves must still abort its
    /// transfer after `source_fault_timeout` (docs/protocol.md §8.1), and a channel whose
    /// engine stopped must still time its transfers out.
    fn expire_parked(&mut self, now: u64) -> Result<()> {
        let batch = u32::from(self.cfg.sq_batch);
        let mut any = false;
        for ch in self.channels.iter_mut().flatten() {
            if ch.timers_only(batch) {
                ch.sender.process_timers(now);
                any = true;
            }
        }
        if !any {
            return Ok(());
        }
        let mut i = 0;
        while let Some(w) = self.waiters.get(i).copied() {
            if let WaiterKind::Source {
                channel,
                tid,
                block,
            } = w.kind
            {
                let ch = self.channel_mut(channel)?;
                if !ch.sender.awaits_source(tid, block) {
                    ch.parked = ch.parked.saturating_sub(1);
                    self.waiters.swap_remove(i);
                    self.stats.source_waits_abandoned += 1;
                    continue;
                }
            }
            i += 1;
        }
        Ok(())
    }

    fn ring_doorbells(&mut self) -> Result<()> {
        let any = self.wq_dirty
            || self.control.tail_dirty
            || self.channels.iter().flatten().any(|c| c.hw.tail_dirty);
        if !any {
            return Ok(());
        }
        let global = NpeGlobal::new(&self.bus, 0)?;
        // Descriptors must be visible before the engine is told about them.
        global.barrier(Barrier::DsbSt);
        if self.wq_dirty {
            global.wq_tail().set(self.wq.index);
            self.wq_dirty = false;
        }
        ring(&self.bus, &mut self.control)?;
        for ch in self.channels.iter_mut().flatten() {
            ring(&self.bus, &mut ch.hw)?;
        }
        Ok(())
    }

    fn next_deadline(&self, now: u64) -> Option<u64> {
        let batch = u32::from(self.cfg.sq_batch);
        let mut best: Option<u64> = None;
        for ch in self.channels.iter().flatten() {
            let blocked = ch.timers_only(batch);
            // A blocked channel sends nothing, but its timers run (`expire_parked`).
            let deadline = if blocked {
                ch.sender.next_timer()
            } else {
                ch.sender.next_deadline()
            };
            let Some(deadline) = deadline else {
                continue;
            };
            // A blocked channel is woken by its completion or resolution, not by a timer.
            if blocked && deadline <= now {
                continue;
            }
            let deadline = deadline.max(now);
            best = Some(best.map_or(deadline, |b| b.min(deadline)));
        }
        best
    }

    /// Waiters for page resolutions (for diagnostics and the node's bookkeeping).
    pub fn waiting_pages(&self) -> usize {
        self.waiters.len()
    }

    /// Frees the rings. The engine is disabled first.
    pub fn shutdown<D: DmaMemory + ?Sized>(self, dma: &D) -> Result<()> {
        let global = NpeGlobal::new(&self.bus, 0)?;
        global.ctrl().write(CTRL::SOFT_RESET::SET);
        self.rq.release(dma)?;
        self.wq.release(dma)?;
        self.wcq.release(dma)?;
        self.control.sq.release(dma)?;
        self.control.cq.release(dma)?;
        for ch in self.channels.into_iter().flatten() {
            ch.hw.sq.release(dma)?;
            ch.hw.cq.release(dma)?;
        }
        Ok(())
    }
}

fn check_capacity(what: &'static str, requested: u32, max: u32) -> Result<()> {
    if requested > max {
        return Err(DmaError::Capacity {
            what,
            requested,
            max,
        });
    }
    Ok(())
}

fn sender_config(timing: &SenderTiming, first_tid: u32) -> Result<SenderConfig> {
    if timing.ack_timeout == 0 || timing.max_attempts == 0 || timing.window == 0 {
        return Err(DmaError::InvalidConfig {
            what: "timing: ack_timeout, max_attempts and window must be non-zero",
        });
    }
    if timing.backoff_max < timing.backoff_initial {
        return Err(DmaError::InvalidConfig {
            what: "timing: backoff_max below backoff_initial",
        });
    }
    Ok(SenderConfig {
        block_size: BLOCK_SIZE,
        window: timing.window,
        max_attempts: timing.max_attempts,
        ack_timeout: timing.ack_timeout,
        backoff_initial: timing.backoff_initial,
        backoff_max: timing.backoff_max,
        source_fault_timeout: timing.source_fault_timeout,
        first_tid: TransferId(first_tid),
    })
}

fn encode_message(session: u32, message: &Message) -> Result<InlineMsg> {
    let bytes = Envelope::new(session, *message).to_bytes();
    InlineMsg::new(&bytes)
}

fn post(hw: &mut HwChannel, entry: SqEntry, shadow: Option<SqShadow>) -> Result<()> {
    hw.sq.write(hw.sq.index, &entry.encode())?;
    let slot = (hw.sq.index & (hw.sq.slots() - 1)) as usize;
    if let Some(s) = hw.shadow.get_mut(slot) {
        *s = shadow;
    }
    hw.sq.index = hw.sq.index.wrapping_add(1);
    hw.tail_dirty = true;
    Ok(())
}

fn refresh_head<B: RegisterBus>(bus: &B, hw: &mut HwChannel) -> Result<()> {
    let regs = NpeChannel::new(bus, channel_offset(usize::from(hw.index)))?;
    hw.sq.seen_head = regs.sq_head().get();
    Ok(())
}

fn ring<B: RegisterBus>(bus: &B, hw: &mut HwChannel) -> Result<()> {
    if hw.tail_dirty {
        let regs = NpeChannel::new(bus, channel_offset(usize::from(hw.index)))?;
        regs.sq_tail().set(hw.sq.index);
        hw.tail_dirty = false;
    }
    Ok(())
}

/// Drains a channel's CQ; returns the number of error entries.
fn drain_completions<B: RegisterBus>(
    bus: &B,
    hw: &mut HwChannel,
    report: &mut PollReport,
) -> Result<u32> {
    let start = hw.cq.index;
    let mut errors = 0;
    let mut buf = [0u8; CQ_ENTRY];
    loop {
        if !hw.cq.read_new(hw.cq.index, &mut buf)? {
            break;
        }
        hw.cq.index = hw.cq.index.wrapping_add(1);
        report.cq_entries += 1;
        match CqEntry::decode(&buf) {
            // SRC_FAULT was handled when the channel entered FAULT_WAIT.
            Ok(e) if matches!(e.status, EntryStatus::Ok | EntryStatus::SrcFault) => {}
            _ => errors += 1,
        }
    }
    if hw.cq.index != start {
        let regs = NpeChannel::new(bus, channel_offset(usize::from(hw.index)))?;
        regs.cq_head().set(hw.cq.index);
    }
    Ok(errors)
}

/// A node coordinate must fit the 22 bits descriptors and NODE carry (§4.1, §3.1).
fn check_coordinate(coordinate: u32) -> Result<()> {
    if coordinate & !super::desc::COORD_MASK != 0 {
        return Err(DmaError::InvalidConfig {
            what: "node coordinate beyond 22 bits",
        });
    }
    Ok(())
}

/// Whether handling one queue entry failed for a reason of that entry alone (a message the
/// protocol refused, a connection that is gone, an entry the engine should not have
/// written), so the queue goes on with the next; other errors (the register bus, the DMA
/// memory) end the poll.
fn is_entry_error(e: &DmaError) -> bool {
    matches!(
        e,
        DmaError::Protocol(_)
            | DmaError::NoSuchPeer { .. }
            | DmaError::NoSuchChannel { .. }
            | DmaError::BadEntry { .. }
    )
}

/// FAULT_SYNDROME.RESP for a decode error (§3.2).
const AXI_DECERR: u32 = 3;

/// Writes a channel's SQ and CQ bases again: the engine stopped the channel in ERROR because
/// it could not reach one of them, and a new base lets it retry (§4). Indices are unchanged.
fn restart_channel_rings<B: RegisterBus>(regs: &NpeChannel<'_, B>, hw: &HwChannel) {
    regs.sq_base().set(hw.sq.bus_addr());
    regs.cq_base().set(hw.cq.bus_addr());
}

/// Whether `[addr, addr + len)` lies within the engine's 49-bit virtual address space.
fn within_va(addr: u64, len: u64) -> bool {
    addr.checked_add(len.saturating_sub(1))
        .is_some_and(|last| last <= super::desc::VA_MASK)
}
