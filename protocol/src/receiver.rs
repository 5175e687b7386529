//! The receiver side of a connection: decides which arriving blocks to write, answers with
//! ACKs and NACKs, tells the sender when faults are resolved, and hands finished transfers to
//! its user in transfer-id order, exactly once.
//!
//! Writing is two-phase so that a stale duplicate never touches memory: the caller asks
//! [`Receiver::admit`] before writing a block, and reports the result with
//! [`Receiver::written`]. Transitions are listed in `docs/protocol.md` §6.

use heapless::Deque;

use crate::types::{AbortReason, BlockRange, FaultReason, Generation, TransferId};
use crate::wire::{Abort, AbortAck, Ack, BlockHeader, Message, Nack, Resolved};
use crate::{ProtocolError, Result};

/// Receiver parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceiverConfig {
    /// Block size in bytes (agreed with the sender).
    pub block_size: u32,
    /// Id of the first transfer of the connection (the sender's `first_tid`).
    pub first_tid: TransferId,
}

/// What to do with an arriving block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Admission {
    /// Write the payload, then report the result with [`Receiver::written`].
    Write,
    /// The block is already written: drop the payload, send this ACK (the sender may have
    /// lost the first one).
    Duplicate(Ack),
    /// The transfer was finished and handed to the user: drop the payload (it may be a late
    /// copy overtaken by a later transfer to the same memory), send this ACK.
    Retired(Ack),
    /// The transfer was aborted: drop the payload, send nothing.
    Aborted,
    /// Beyond the receive window (the user is not draining deliveries): drop, send nothing;
    /// the sender re-sends after its timeout.
    OutOfWindow,
    /// Another copy of this block was admitted and its write has not been reported yet: drop
    /// the payload, send nothing (that write's result answers the sender). Two writes of one
    /// block in flight could let the second land after the transfer was delivered.
    InFlight,
}

/// The result of writing an admitted block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteOutcome {
    /// All bytes landed, and the version check of the destination pages passed.
    Written,
    /// The write faulted (or the version check failed).
    Fault {
        /// Why.
        reason: FaultReason,
        /// The fault can never be resolved (the sender aborts). `OutOfRegion` is always fatal.
        fatal: bool,
    },
}

/// How a transfer ended at the receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeliveryStatus {
    /// Every block was written.
    Complete,
    /// The sender aborted it; the reason is known if its abort notice arrived (it is not
    /// when the transfer was retired through a later header's `oldest_open`).
    Aborted(Option<AbortReason>),
}

/// A finished transfer, handed to the user in id order, exactly once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Delivery {
    /// The transfer.
    pub tid: TransferId,
    /// Blocks in it (0 if no block of it ever arrived).
    pub block_count: u32,
    /// How it ended.
    pub status: DeliveryStatus,
}

/// Counters for reports and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReceiverStats {
    /// Blocks written (first successful write of each block).
    pub blocks_written: u64,
    /// Arriving copies of blocks already written, dropped.
    pub duplicates_dropped: u64,
    /// Arriving blocks of retired transfers, dropped.
    pub retired_dropped: u64,
    /// Arriving blocks of aborted transfers, dropped.
    pub aborted_dropped: u64,
    /// Arriving blocks beyond the window, dropped.
    pub out_of_window: u64,
    /// Arriving copies of blocks whose write was in flight, dropped.
    pub in_flight_dropped: u64,
    /// NACKs produced.
    pub nacks: u64,
    /// Resolved notices produced.
    pub resolved: u64,
    /// Transfers delivered complete.
    pub delivered_complete: u64,
    /// Transfers delivered aborted.
    pub delivered_aborted: u64,
}

impl ReceiverStats {
    const ZERO: ReceiverStats = ReceiverStats {
        blocks_written: 0,
        duplicates_dropped: 0,
        retired_dropped: 0,
        aborted_dropped: 0,
        out_of_window: 0,
        in_flight_dropped: 0,
        nacks: 0,
        resolved: 0,
        delivered_complete: 0,
        delivered_aborted: 0,
    };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RxBlock {
    Missing,
    /// Admitted for writing; the write's result is not reported yet.
    Writing,
    /// The write of `attempt` faulted; waiting for the caller's resolution.
    Faulted {
        attempt: u16,
    },
    Written,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RxPhase {
    /// Known only to exist (ids are dense): no block of it seen yet.
    Unseen,
    Open,
    Complete,
    Aborted(Option<AbortReason>),
}

#[derive(Clone, Debug)]
struct RxTransfer<const B: usize> {
    tid: TransferId,
    block_count: u32,
    written: u32,
    /// Blocks in [`RxBlock::Writing`]: the transfer is not delivered while any is.
    in_flight: u32,
    blocks: [RxBlock; B],
    phase: RxPhase,
}

impl<const B: usize> RxTransfer<B> {
    const fn unseen(tid: TransferId) -> Self {
        Self {
            tid,
            block_count: 0,
            written: 0,
            in_flight: 0,
            blocks: [RxBlock::Missing; B],
            phase: RxPhase::Unseen,
        }
    }

    fn block_mut(&mut self, block: u32) -> Option<&mut RxBlock> {
        if block >= self.block_count {
            return None;
        }
        self.blocks.get_mut(usize::try_from(block).ok()?)
    }

    /// Marks an unfinished transfer aborted; finished ones stay as they are. A transfer
    /// closed without a reason (a later transfer's `oldest_open` passed it) takes the reason
    /// of the ABORT notice that arrives afterwards.
    fn abort(&mut self, reason: Option<AbortReason>) {
        match self.phase {
            RxPhase::Unseen | RxPhase::Open | RxPhase::Aborted(None) => {
                self.phase = RxPhase::Aborted(reason);
            }
            _ => {}
        }
    }
}

enum Slot {
    At(usize),
    Retired,
    OutOfWindow,
}

/// The receiver side of one connection, with a window of `T` transfers of up to `B` blocks.
#[derive(Debug)]
pub struct Receiver<const T: usize, const B: usize> {
    cfg: ReceiverConfig,
    /// The oldest transfer not yet delivered; every earlier one was delivered.
    watermark: TransferId,
    /// The latest `oldest_open` heard: every transfer before it is finished at the sender.
    /// Kept beyond the window, so that transfers the window could not hold yet are closed
    /// when it moves on (the notice that said so is not repeated).
    finished_before: TransferId,
    slots: Deque<RxTransfer<B>, T>,
    stats: ReceiverStats,
}

impl<const T: usize, const B: usize> Receiver<T, B> {
    /// A receiver expecting `cfg.first_tid` next. `const` so that a bare-metal driver can
    /// build it in a `static`.
    pub const fn new(cfg: ReceiverConfig) -> Result<Self> {
        if let Err(e) = ProtocolError::check_shape(T, B, cfg.block_size) {
            return Err(e);
        }
        Ok(Self {
            cfg,
            watermark: cfg.first_tid,
            finished_before: cfg.first_tid,
            slots: Deque::new(),
            stats: ReceiverStats::ZERO,
        })
    }

    /// The receive window in transfers (announce it in `Hello::window`).
    pub const fn window(&self) -> u32 {
        if T > u32::MAX as usize {
            u32::MAX
        } else {
            T as u32
        }
    }

    /// Counters.
    pub fn stats(&self) -> &ReceiverStats {
        &self.stats
    }

    /// The oldest transfer not yet delivered.
    pub fn watermark(&self) -> TransferId {
        self.watermark
    }

    /// Decides whether to write an arriving block. Errors mean the sender broke the protocol
    /// (block count beyond the agreed maximum or changing within a transfer, bad length); the
    /// block must then be dropped.
    ///
    /// Every [`Admission::Write`] must be followed by [`written`](Self::written) for the same
    /// header, whatever became of the write: until then the block counts as in flight, no
    /// other copy of it is admitted, and its transfer is not delivered.
    pub fn admit(&mut self, header: &BlockHeader) -> Result<Admission> {
        self.validate(header)?;
        self.retire_before(header.oldest_open);
        let ack = Ack {
            tid: header.tid,
            blocks: BlockRange::single(header.block),
            attempt: header.attempt,
        };
        let idx = match self.slot(header.tid) {
            Slot::At(idx) => idx,
            Slot::Retired => {
                self.stats.retired_dropped += 1;
                return Ok(Admission::Retired(ack));
            }
            Slot::OutOfWindow => {
                self.stats.out_of_window += 1;
                return Ok(Admission::OutOfWindow);
            }
        };
        let Some(t) = self.slots.get_mut(idx) else {
            return Ok(Admission::OutOfWindow);
        };
        match t.phase {
            RxPhase::Unseen => {
                t.phase = RxPhase::Open;
                t.block_count = header.block_count;
            }
            RxPhase::Aborted(_) => {
                self.stats.aborted_dropped += 1;
                return Ok(Admission::Aborted);
            }
            RxPhase::Open | RxPhase::Complete if t.block_count != header.block_count => {
                return Err(ProtocolError::InconsistentTransfer { tid: header.tid.0 });
            }
            RxPhase::Open | RxPhase::Complete => {}
        }
        let count = t.block_count;
        match t.block_mut(header.block) {
            Some(RxBlock::Written) => {
                self.stats.duplicates_dropped += 1;
                Ok(Admission::Duplicate(ack))
            }
            Some(RxBlock::Writing) => {
                self.stats.in_flight_dropped += 1;
                Ok(Admission::InFlight)
            }
            Some(state) => {
                *state = RxBlock::Writing;
                t.in_flight += 1;
                Ok(Admission::Write)
            }
            None => Err(ProtocolError::BlockOutOfRange {
                tid: header.tid.0,
                block: u64::from(header.block),
                count,
            }),
        }
    }

    /// Reports how the write of an admitted block went; returns the ACK or NACK to send (none
    /// when the transfer was aborted meanwhile). A NACK asks the caller to resolve the fault
    /// and then call [`resolved`](Self::resolved).
    pub fn written(
        &mut self,
        header: &BlockHeader,
        outcome: WriteOutcome,
    ) -> Result<Option<Message>> {
        let ack = Message::Ack(Ack {
            tid: header.tid,
            blocks: BlockRange::single(header.block),
            attempt: header.attempt,
        });
        let idx = match self.slot_if_seen(header.tid) {
            Slot::At(idx) => idx,
            // Retired meanwhile: complete (another copy landed) or aborted.
            Slot::Retired => return Ok((outcome == WriteOutcome::Written).then_some(ack)),
            Slot::OutOfWindow => return Err(ProtocolError::UnknownTransfer { tid: header.tid.0 }),
        };
        let Some(t) = self.slots.get_mut(idx) else {
            return Err(ProtocolError::UnknownTransfer { tid: header.tid.0 });
        };
        // The admitted write is over, whatever the transfer's phase now.
        if header.block_count == t.block_count
            && let Some(state @ RxBlock::Writing) = t.block_mut(header.block)
        {
            *state = RxBlock::Missing;
            t.in_flight = t.in_flight.saturating_sub(1);
        }
        match t.phase {
            RxPhase::Unseen => return Err(ProtocolError::UnknownTransfer { tid: header.tid.0 }),
            RxPhase::Aborted(_) => return Ok(None),
            // Every block is in place; whatever this copy did, the block is written.
            RxPhase::Complete => return Ok(Some(ack)),
            RxPhase::Open if t.block_count != header.block_count => {
                return Err(ProtocolError::InconsistentTransfer { tid: header.tid.0 });
            }
            RxPhase::Open => {}
        }
        let count = t.block_count;
        let state = t
            .block_mut(header.block)
            .ok_or(ProtocolError::BlockOutOfRange {
                tid: header.tid.0,
                block: u64::from(header.block),
                count,
            })?;
        match (*state, outcome) {
            (RxBlock::Written, _) => Ok(Some(ack)),
            (_, WriteOutcome::Written) => {
                *state = RxBlock::Written;
                t.written += 1;
                if t.written == t.block_count {
                    t.phase = RxPhase::Complete;
                }
                self.stats.blocks_written += 1;
                Ok(Some(ack))
            }
            (_, WriteOutcome::Fault { reason, fatal }) => {
                *state = RxBlock::Faulted {
                    attempt: header.attempt,
                };
                self.stats.nacks += 1;
                Ok(Some(Message::Nack(Nack {
                    tid: header.tid,
                    blocks: BlockRange::single(header.block),
                    attempt: header.attempt,
                    reason,
                    fatal: fatal || reason == FaultReason::OutOfRegion,
                })))
            }
        }
    }

    /// The caller made the destination pages of `blocks` present again (`generation` is its
    /// page-state generation afterwards). Returns the notice that lets the sender re-send at
    /// once, if any of the blocks was waiting for it.
    pub fn resolved(
        &mut self,
        tid: TransferId,
        blocks: BlockRange,
        generation: Generation,
    ) -> Result<Option<Resolved>> {
        let Some(t) = self.open_slot(tid) else {
            return Ok(None);
        };
        blocks.check_within(tid, t.block_count)?;
        let mut any = false;
        for block in blocks.iter() {
            if let Some(state @ RxBlock::Faulted { .. }) = t.block_mut(block) {
                *state = RxBlock::Missing;
                any = true;
            }
        }
        if !any {
            return Ok(None);
        }
        self.stats.resolved += 1;
        Ok(Some(Resolved {
            tid,
            blocks,
            generation,
        }))
    }

    /// The caller cannot resolve the faults of `blocks` (e.g. the memory was unmapped):
    /// returns a fatal NACK, which makes the sender abort the transfer.
    pub fn unresolvable(
        &mut self,
        tid: TransferId,
        blocks: BlockRange,
        reason: FaultReason,
    ) -> Result<Option<Nack>> {
        let Some(t) = self.open_slot(tid) else {
            return Ok(None);
        };
        blocks.check_within(tid, t.block_count)?;
        let attempt = blocks
            .iter()
            .filter_map(|b| match t.block_mut(b) {
                Some(RxBlock::Faulted { attempt }) => Some(*attempt),
                _ => None,
            })
            .max()
            .unwrap_or(1);
        self.stats.nacks += 1;
        Ok(Some(Nack {
            tid,
            blocks,
            attempt,
            reason,
            fatal: true,
        }))
    }

    /// The sender aborted a transfer. Returns the acknowledgement to send (none if the
    /// transfer lies beyond the window). A transfer already complete here stays complete.
    pub fn on_abort(&mut self, abort: &Abort) -> Option<AbortAck> {
        let ack = AbortAck { tid: abort.tid };
        match self.slot(abort.tid) {
            Slot::At(idx) => {
                if let Some(t) = self.slots.get_mut(idx) {
                    t.abort(Some(abort.reason));
                }
            }
            Slot::Retired => {}
            Slot::OutOfWindow => return None,
        }
        self.retire_before(abort.oldest_open);
        Some(ack)
    }

    /// The next finished transfer, in id order; each is delivered exactly once.
    pub fn poll_delivery(&mut self) -> Option<Delivery> {
        let front = self.slots.front()?;
        if front.in_flight > 0 {
            // A write may still land in the transfer's memory: not the user's yet.
            return None;
        }
        let status = match front.phase {
            RxPhase::Complete => DeliveryStatus::Complete,
            RxPhase::Aborted(reason) => DeliveryStatus::Aborted(reason),
            RxPhase::Unseen | RxPhase::Open => return None,
        };
        let delivery = Delivery {
            tid: front.tid,
            block_count: front.block_count,
            status,
        };
        self.slots.pop_front();
        self.watermark = self.watermark.next();
        match status {
            DeliveryStatus::Complete => self.stats.delivered_complete += 1,
            DeliveryStatus::Aborted(_) => self.stats.delivered_aborted += 1,
        }
        // The window moved: close what an earlier `oldest_open` said is finished.
        self.retire_before(self.finished_before);
        Some(delivery)
    }

    fn validate(&self, header: &BlockHeader) -> Result<()> {
        let max = B.min(u32::MAX as usize) as u64;
        if u64::from(header.block_count) > max {
            return Err(ProtocolError::TooManyBlocks {
                blocks: u64::from(header.block_count),
                max,
            });
        }
        if header.block >= header.block_count {
            return Err(ProtocolError::BlockOutOfRange {
                tid: header.tid.0,
                block: u64::from(header.block),
                count: header.block_count,
            });
        }
        let last = header.block + 1 == header.block_count;
        let bad_len = header.len == 0
            || header.len > self.cfg.block_size
            || (!last && header.len != self.cfg.block_size);
        if bad_len {
            return Err(ProtocolError::BadBlockLength {
                tid: header.tid.0,
                block: header.block,
                len: header.len,
            });
        }
        // The transfer being sent is open, so `oldest_open` cannot be past it; a header that
        // says so would close transfers that have not even started.
        if header.oldest_open.offset_from(header.tid) > 0 {
            return Err(ProtocolError::InconsistentTransfer { tid: header.tid.0 });
        }
        Ok(())
    }

    /// Every transfer before `oldest_open` is finished at the sender; those not complete here
    /// were aborted (their notice may have been lost).
    fn retire_before(&mut self, oldest_open: TransferId) {
        if oldest_open.offset_from(self.finished_before) > 0 {
            self.finished_before = oldest_open;
        }
        let ahead = oldest_open.offset_from(self.watermark);
        if ahead <= 0 {
            return;
        }
        let count = usize::try_from(ahead).unwrap_or(usize::MAX).min(T);
        for idx in 0..count {
            if idx >= self.slots.len() {
                let tid = self.watermark.advance(idx as u32);
                if self.slots.push_back(RxTransfer::unseen(tid)).is_err() {
                    break;
                }
            }
            if let Some(t) = self.slots.get_mut(idx) {
                t.abort(None);
            }
        }
    }

    /// The slot of `tid`, creating placeholders for unseen ids up to it.
    fn slot(&mut self, tid: TransferId) -> Slot {
        let offset = tid.offset_from(self.watermark);
        if offset < 0 {
            return Slot::Retired;
        }
        let Ok(idx) = usize::try_from(offset) else {
            return Slot::OutOfWindow;
        };
        if idx >= T {
            return Slot::OutOfWindow;
        }
        while self.slots.len() <= idx {
            let next = self.watermark.advance(self.slots.len() as u32);
            if self.slots.push_back(RxTransfer::unseen(next)).is_err() {
                return Slot::OutOfWindow;
            }
        }
        Slot::At(idx)
    }

    /// The slot of `tid` if it exists already.
    fn slot_if_seen(&self, tid: TransferId) -> Slot {
        let offset = tid.offset_from(self.watermark);
        if offset < 0 {
            return Slot::Retired;
        }
        match usize::try_from(offset) {
            Ok(idx) if idx < self.slots.len() => Slot::At(idx),
            _ => Slot::OutOfWindow,
        }
    }

    fn open_slot(&mut self, tid: TransferId) -> Option<&mut RxTransfer<B>> {
        match self.slot_if_seen(tid) {
            Slot::At(idx) => self.slots.get_mut(idx).filter(|t| t.phase == RxPhase::Open),
            _ => None,
        }
    }
}
