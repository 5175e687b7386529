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

mod api;
mod receive;
mod transmit;

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

pub use api::{
    ChannelConfig, FaultClass, NpeConfig, NpeHost, NpeStats, PeerConfig, PollReport, SenderTiming,
};

use super::desc::{
    CQ_ENTRY, CqEntry, EntryStatus, InlineMsg, RQ_ENTRY, RqEntry, RqKind, SQ_ENTRY, SqEntry, SqOp,
    WCQ_ENTRY, WQ_ENTRY, WcqEntry, WqEntry, WqOp,
};
use super::regmap::{DRIVER_DESIGN, DesignId, check_design};
use super::regs::{
    CAPS, CH_CTRL, CH_IRQ, CTRL, FAULT_INFO, FAULT_SYNDROME, GEVENT, NODE, NpeChannel, NpeGlobal,
    RESUME, RING_CFG, channel_offset,
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
        // The probe-time check (docs/dma-engine.md §3.1): an NPE of this driver's version
        // whose manifest declares this driver's register map.
        check_design(global.id().get(), cfg.design)?;
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
