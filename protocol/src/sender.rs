//! The sender side of a connection: splits transfers into blocks, sends and re-sends them,
//! reacts to ACKs, NACKs, resolved notices, source faults and timeouts, and hands completions
//! to the user in submission order, exactly once.
//!
//! Pure logic: the caller passes the current time (`now`, in its own units: model time in the
//! simulator, wall-clock in the server library) and performs the I/O the sender asks for
//! ([`Sender::poll_transmit`]). Transitions are listed in `docs/protocol.md` §5.

use heapless::Deque;

use crate::types::{AbortReason, Access, BlockRange, FaultReason, RequestStatus, TransferId};
use crate::wire::{
    Abort, AbortAck, Ack, BlockHeader, FaultInAck, FaultInRequest, Message, Nack, Resolved,
};
use crate::{ProtocolError, Result};

/// Sender parameters. Times are in the caller's units (the same units as `now`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SenderConfig {
    /// Block size in bytes (agreed with the receiver, see `wire::negotiate`).
    pub block_size: u32,
    /// Most transfers open at once (submitted and not yet retired); clamped to the capacity.
    /// Must not exceed the receiver's window.
    pub window: u32,
    /// Most sends of one block, the first included; one more needed send aborts the transfer.
    pub max_attempts: u16,
    /// How long a sent block waits for its ACK before it is re-sent.
    pub ack_timeout: u64,
    /// Wait after the first NACK of a block before re-sending without a resolved notice;
    /// doubles with every further attempt of the block.
    pub backoff_initial: u64,
    /// Upper bound of that wait.
    pub backoff_max: u64,
    /// How long a source-side fault may stay unresolved before the transfer is aborted.
    pub source_fault_timeout: u64,
    /// Id of the first transfer of the connection.
    pub first_tid: TransferId,
}

impl SenderConfig {
    /// A configuration derived from the block size and the ACK timeout: backoff from half the
    /// ACK timeout up to 8 of them, 64 ACK timeouts for a source fault, 8 attempts per block,
    /// the window as large as the capacity, ids from 0.
    pub const fn new(block_size: u32, ack_timeout: u64) -> Self {
        Self {
            block_size,
            window: u32::MAX,
            max_attempts: 8,
            ack_timeout,
            backoff_initial: ack_timeout / 2,
            backoff_max: ack_timeout.saturating_mul(8),
            source_fault_timeout: ack_timeout.saturating_mul(64),
            first_tid: TransferId(0),
        }
    }
}

/// What the user asks to move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TransferDesc {
    /// Source address (local).
    pub src: u64,
    /// Destination address (in the receiver's address space).
    pub dest: u64,
    /// Bytes to move (≥ 1).
    pub len: u64,
    /// The destination region's key (protection domain or rkey); opaque to the protocol.
    pub key: u32,
    /// The user's tag, returned in the completion (a `wr_id`).
    pub tag: u64,
}

/// How a transfer ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompletionStatus {
    /// Every block was written at the destination.
    Ok,
    /// The transfer was given up.
    Aborted(AbortReason),
}

/// A transfer's one completion, delivered in submission order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Completion {
    /// The transfer.
    pub tid: TransferId,
    /// The user's tag from [`TransferDesc::tag`].
    pub tag: u64,
    /// How it ended.
    pub status: CompletionStatus,
    /// Block sends beyond the first of each block.
    pub retransmissions: u32,
    /// Faults seen (NACKs, source faults, detected remote faults).
    pub faults: u32,
}

/// A block the engine should send now: read `header.len` bytes at `src`, send them with the
/// header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockSend {
    /// The header to send with the payload.
    pub header: BlockHeader,
    /// Source address of the payload.
    pub src: u64,
}

/// Something the sender wants transmitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transmit {
    /// A data block (first send or re-send).
    Block(BlockSend),
    /// An abort notice.
    Abort(Abort),
}

impl Transmit {
    /// The message to put on the wire.
    pub const fn message(&self) -> Message {
        match self {
            Transmit::Block(send) => Message::Block(send.header),
            Transmit::Abort(abort) => Message::Abort(*abort),
        }
    }
}

/// What became of an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Disposition {
    /// It changed the state.
    Applied,
    /// It was dropped, for this reason; no state changed.
    Ignored(Ignored),
}

/// Why an event was dropped. None of these is an error: duplicates, reordering and races
/// with completion make all of them normal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ignored {
    /// The transfer was never submitted (or lies beyond the window).
    UnknownTransfer,
    /// The transfer is finished (completed or aborted).
    TransferFinished,
    /// It repeats an event already applied (a duplicate ACK or NACK).
    Duplicate,
    /// It refers to an older attempt, or to a state the block has left.
    Stale,
    /// It names an attempt that was never sent.
    BadAttempt,
    /// The message is not one this side handles.
    WrongRole,
}

/// Counters for reports and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Transfers submitted.
    pub submitted: u64,
    /// Transfers completed successfully.
    pub completed: u64,
    /// Transfers aborted.
    pub aborted: u64,
    /// Block sends, first sends and re-sends.
    pub blocks_sent: u64,
    /// Block re-sends.
    pub retransmissions: u64,
    /// ACK timeouts.
    pub timeouts: u64,
    /// NACKs applied.
    pub nacks: u64,
    /// NACKs dropped as duplicates.
    pub duplicate_nacks: u64,
    /// Peer messages for transfers this side never had.
    pub unknown_transfer_messages: u64,
    /// Peer messages for finished transfers.
    pub finished_transfer_messages: u64,
    /// Source-side faults reported.
    pub source_faults: u64,
    /// Re-sends released early by a resolved notice or fault-in ACK.
    pub resolutions: u64,
    /// Abort notices given up on (the peer never acknowledged them).
    pub abort_notices_given_up: u64,
}

impl SenderStats {
    const ZERO: SenderStats = SenderStats {
        submitted: 0,
        completed: 0,
        aborted: 0,
        blocks_sent: 0,
        retransmissions: 0,
        timeouts: 0,
        nacks: 0,
        duplicate_nacks: 0,
        unknown_transfer_messages: 0,
        finished_transfer_messages: 0,
        source_faults: 0,
        resolutions: 0,
        abort_notices_given_up: 0,
    };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TxBlock {
    /// Never sent.
    Fresh,
    /// Sent as `attempt`, waiting for its ACK until `deadline`.
    InFlight { attempt: u16, deadline: u64 },
    /// To be re-sent (after a timeout, a resolution or a backoff); `attempt` was the last send.
    Ready { attempt: u16 },
    /// NACKed: waiting for the receiver's resolved notice or the end of the backoff.
    AwaitResolution { attempt: u16, deadline: u64 },
    /// The engine could not read the source: waiting for local resolution until `deadline`.
    SourceFault { attempt: u16, deadline: u64 },
    /// Written at the destination.
    Acked,
}

impl TxBlock {
    const fn attempt(self) -> u16 {
        match self {
            TxBlock::Fresh | TxBlock::Acked => 0,
            TxBlock::InFlight { attempt, .. }
            | TxBlock::Ready { attempt }
            | TxBlock::AwaitResolution { attempt, .. }
            | TxBlock::SourceFault { attempt, .. } => attempt,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Active,
    Done,
    /// `sends` abort notices so far; the next is due at `due`; `closed` once acknowledged
    /// (or given up).
    Aborted {
        reason: AbortReason,
        sends: u16,
        due: u64,
        closed: bool,
    },
}

#[derive(Clone, Debug)]
struct TxTransfer<const B: usize> {
    tid: TransferId,
    desc: TransferDesc,
    block_count: u32,
    blocks: [TxBlock; B],
    acked: u32,
    /// Blocks in `Ready`.
    ready: u32,
    /// Next block never sent.
    next_fresh: u32,
    /// Earliest deadline of any block (may be stale-early, never late).
    next_deadline: u64,
    phase: Phase,
    delivered: bool,
    retransmissions: u32,
    faults: u32,
}

impl<const B: usize> TxTransfer<B> {
    fn block(&self, block: u32) -> Option<TxBlock> {
        if block >= self.block_count {
            return None;
        }
        self.blocks.get(usize::try_from(block).ok()?).copied()
    }

    fn block_mut(&mut self, block: u32) -> Option<&mut TxBlock> {
        if block >= self.block_count {
            return None;
        }
        self.blocks.get_mut(usize::try_from(block).ok()?)
    }

    fn abort(&mut self, reason: AbortReason, stats: &mut SenderStats) {
        if self.phase == Phase::Active {
            self.phase = Phase::Aborted {
                reason,
                sends: 0,
                due: 0,
                closed: false,
            };
            stats.aborted += 1;
        }
    }

    fn set_state(&mut self, block: u32, state: TxBlock) {
        let Some(slot) = self.block_mut(block) else {
            return;
        };
        let old = *slot;
        *slot = state;
        if matches!(old, TxBlock::Ready { .. }) {
            self.ready = self.ready.saturating_sub(1);
        }
        if matches!(state, TxBlock::Ready { .. }) {
            self.ready += 1;
        }
        if state == TxBlock::Acked && old != TxBlock::Acked {
            self.acked += 1;
        }
        if let TxBlock::InFlight { deadline, .. }
        | TxBlock::AwaitResolution { deadline, .. }
        | TxBlock::SourceFault { deadline, .. } = state
        {
            self.next_deadline = self.next_deadline.min(deadline);
        }
    }

    /// Processes every block deadline that passed.
    fn expire(&mut self, now: u64, stats: &mut SenderStats) {
        let mut next = u64::MAX;
        for block in 0..self.block_count {
            let Some(state) = self.block(block) else {
                break;
            };
            match state {
                TxBlock::InFlight { attempt, deadline }
                | TxBlock::AwaitResolution { attempt, deadline }
                    if deadline <= now =>
                {
                    if matches!(state, TxBlock::InFlight { .. }) {
                        stats.timeouts += 1;
                    }
                    self.set_state(block, TxBlock::Ready { attempt });
                }
                TxBlock::SourceFault { deadline, .. } if deadline <= now => {
                    self.abort(AbortReason::SourceFaultTimeout { block }, stats);
                    return;
                }
                TxBlock::InFlight { deadline, .. }
                | TxBlock::AwaitResolution { deadline, .. }
                | TxBlock::SourceFault { deadline, .. } => next = next.min(deadline),
                _ => {}
            }
        }
        self.next_deadline = next;
    }

    /// The next block to send, re-sends first; aborts if a block is out of attempts.
    fn next_send(
        &mut self,
        now: u64,
        cfg: &SenderConfig,
        stats: &mut SenderStats,
        oldest_open: TransferId,
    ) -> Option<BlockSend> {
        let mut chosen = None;
        if self.ready > 0 {
            chosen = (0..self.block_count)
                .find(|&b| matches!(self.block(b), Some(TxBlock::Ready { .. })));
            if chosen.is_none() {
                self.ready = 0;
            }
        }
        if chosen.is_none() && self.next_fresh < self.block_count {
            chosen = Some(self.next_fresh);
            self.next_fresh += 1;
        }
        let block = chosen?;
        let previous = self.block(block)?.attempt();
        if previous >= cfg.max_attempts {
            self.abort(AbortReason::RetriesExhausted { block }, stats);
            return None;
        }
        let attempt = previous + 1;
        self.set_state(
            block,
            TxBlock::InFlight {
                attempt,
                deadline: now.saturating_add(cfg.ack_timeout),
            },
        );
        if previous > 0 {
            self.retransmissions += 1;
            stats.retransmissions += 1;
        }
        stats.blocks_sent += 1;
        let offset = u64::from(block) * u64::from(cfg.block_size);
        let len = (self.desc.len - offset).min(u64::from(cfg.block_size)) as u32;
        Some(BlockSend {
            header: BlockHeader {
                tid: self.tid,
                block,
                block_count: self.block_count,
                attempt,
                oldest_open,
                len,
                key: self.desc.key,
                dest: self.desc.dest + offset,
            },
            src: self.desc.src + offset,
        })
    }
}

enum Located {
    Open(usize),
    Finished,
    Unknown,
}

/// The sender side of one connection, with room for `T` open transfers of up to `B` blocks.
#[derive(Debug)]
pub struct Sender<const T: usize, const B: usize> {
    cfg: SenderConfig,
    transfers: Deque<TxTransfer<B>, T>,
    next_tid: TransferId,
    next_req_seq: u32,
    stats: SenderStats,
}

impl<const T: usize, const B: usize> Sender<T, B> {
    /// A sender with no transfers. `const` so that a bare-metal driver can build it in a
    /// `static` instead of on a small stack.
    pub const fn new(mut cfg: SenderConfig) -> Result<Self> {
        if let Err(e) = ProtocolError::check_shape(T, B, cfg.block_size) {
            return Err(e);
        }
        if cfg.max_attempts == 0 {
            return Err(ProtocolError::InvalidConfig {
                field: "max_attempts",
            });
        }
        if cfg.window == 0 {
            return Err(ProtocolError::InvalidConfig { field: "window" });
        }
        if cfg.ack_timeout == 0 {
            return Err(ProtocolError::InvalidConfig {
                field: "ack_timeout",
            });
        }
        if cfg.backoff_max < cfg.backoff_initial {
            return Err(ProtocolError::InvalidConfig {
                field: "backoff_max",
            });
        }
        if (cfg.window as usize) > T {
            // T < window <= u32::MAX, so T fits u32.
            cfg.window = T as u32;
        }
        Ok(Self {
            cfg,
            transfers: Deque::new(),
            next_tid: cfg.first_tid,
            next_req_seq: 0,
            stats: SenderStats::ZERO,
        })
    }

    /// The configuration in force (the window clamped to the capacity).
    pub fn config(&self) -> &SenderConfig {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> &SenderStats {
        &self.stats
    }

    /// Transfers submitted and not yet retired.
    pub fn open_transfers(&self) -> usize {
        self.transfers.len()
    }

    /// Queues a transfer; its blocks go out through [`poll_transmit`](Self::poll_transmit).
    /// Fails with `WindowFull` when the window is full (back-pressure: drain completions).
    pub fn submit(&mut self, desc: TransferDesc) -> Result<TransferId> {
        if desc.len == 0 {
            return Err(ProtocolError::EmptyTransfer);
        }
        desc.src
            .checked_add(desc.len - 1)
            .ok_or(ProtocolError::AddressOverflow)?;
        desc.dest
            .checked_add(desc.len - 1)
            .ok_or(ProtocolError::AddressOverflow)?;
        let blocks = desc.len.div_ceil(u64::from(self.cfg.block_size));
        let max = B.min(u32::MAX as usize) as u64;
        if blocks > max {
            return Err(ProtocolError::TooManyBlocks { blocks, max });
        }
        let open = self.transfers.len();
        if open >= self.cfg.window as usize {
            return Err(ProtocolError::WindowFull { open });
        }
        let tid = self.next_tid;
        let transfer = TxTransfer {
            tid,
            desc,
            block_count: blocks as u32,
            blocks: [TxBlock::Fresh; B],
            acked: 0,
            ready: 0,
            next_fresh: 0,
            next_deadline: u64::MAX,
            phase: Phase::Active,
            delivered: false,
            retransmissions: 0,
            faults: 0,
        };
        self.transfers
            .push_back(transfer)
            .map_err(|_| ProtocolError::WindowFull { open })?;
        self.next_tid = tid.next();
        self.stats.submitted += 1;
        Ok(tid)
    }

    /// The next thing to transmit at time `now`, or `None` when nothing is due. Call it
    /// whenever the engine has room, and again at [`next_deadline`](Self::next_deadline).
    /// Processes timeouts (which may abort transfers) on the way. Re-sends of older transfers
    /// come before new blocks.
    pub fn poll_transmit(&mut self, now: u64) -> Option<Transmit> {
        for idx in 0..self.transfers.len() {
            let oldest_open = self.oldest_open();
            let Self {
                cfg,
                transfers,
                stats,
                ..
            } = self;
            let Some(t) = transfers.get_mut(idx) else {
                break;
            };
            if t.phase == Phase::Active && t.next_deadline <= now {
                t.expire(now, stats);
            }
            if t.phase == Phase::Active
                && let Some(send) = t.next_send(now, cfg, stats, oldest_open)
            {
                return Some(Transmit::Block(send));
            }
            if let Some(abort) = self.abort_notice_due(idx, now) {
                return Some(Transmit::Abort(abort));
            }
        }
        self.retire();
        None
    }

    /// Processes the timers that passed at `now` (ACK timeouts, the end of a NACK's backoff, a
    /// source fault not resolved within `source_fault_timeout`, which aborts its transfer)
    /// without taking anything to send. For a caller that holds a connection's transmissions
    /// back (while it waits for a source page) but must not stop its clock.
    pub fn process_timers(&mut self, now: u64) {
        let Self {
            transfers, stats, ..
        } = self;
        for t in transfers.iter_mut() {
            if t.phase == Phase::Active && t.next_deadline <= now {
                t.expire(now, stats);
            }
        }
    }

    /// The earliest timer of [`process_timers`](Self::process_timers) (`None`: no timer runs).
    pub fn next_timer(&self) -> Option<u64> {
        self.transfers
            .iter()
            .filter(|t| t.phase == Phase::Active && t.next_deadline != u64::MAX)
            .map(|t| t.next_deadline)
            .min()
    }

    /// Whether `block` of `tid` is waiting for its source page (reported by
    /// [`source_fault`](Self::source_fault), neither resolved nor aborted since).
    pub fn awaits_source(&self, tid: TransferId, block: u32) -> bool {
        match locate_in(&self.transfers, self.next_tid, tid) {
            Located::Open(idx) => self
                .transfers
                .get(idx)
                .filter(|t| t.phase == Phase::Active)
                .and_then(|t| t.block(block))
                .is_some_and(|state| matches!(state, TxBlock::SourceFault { .. })),
            _ => false,
        }
    }

    /// The earliest time at which [`poll_transmit`](Self::poll_transmit) may have something
    /// new; a value at or before `now` means "poll now". `None`: nothing pending at all.
    pub fn next_deadline(&self) -> Option<u64> {
        let mut best: Option<u64> = None;
        for t in self.transfers.iter() {
            let candidate = match t.phase {
                Phase::Active if t.ready > 0 || t.next_fresh < t.block_count => return Some(0),
                Phase::Active => t.next_deadline,
                Phase::Aborted {
                    due, closed: false, ..
                } => due,
                _ => continue,
            };
            if candidate != u64::MAX {
                best = Some(best.map_or(candidate, |b| b.min(candidate)));
            }
        }
        best
    }

    /// The next completion, in submission order; each transfer completes exactly once.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        let mut completion = None;
        for t in self.transfers.iter_mut() {
            if t.delivered {
                continue;
            }
            let status = match t.phase {
                Phase::Active => break,
                Phase::Done => CompletionStatus::Ok,
                Phase::Aborted { reason, .. } => CompletionStatus::Aborted(reason),
            };
            t.delivered = true;
            if status == CompletionStatus::Ok {
                self.stats.completed += 1;
            }
            completion = Some(Completion {
                tid: t.tid,
                tag: t.desc.tag,
                status,
                retransmissions: t.retransmissions,
                faults: t.faults,
            });
            break;
        }
        self.retire();
        completion
    }

    /// Handles a message from the receiver (ACK, NACK, resolved notice, fault-in ACK, abort
    /// ACK); other messages are `Ignored(WrongRole)`. Errors mean the peer broke the
    /// protocol (e.g. a block range beyond the transfer); no state changed then.
    pub fn handle(&mut self, now: u64, message: &Message) -> Result<Disposition> {
        match message {
            Message::Ack(ack) => self.on_ack(ack),
            Message::Nack(nack) => self.on_nack(now, nack),
            Message::Resolved(resolved) => self.on_resolved(resolved),
            Message::FaultInAck(ack) => self.on_fault_in_ack(ack),
            Message::AbortAck(ack) => Ok(self.on_abort_ack(ack)),
            _ => Ok(Disposition::Ignored(Ignored::WrongRole)),
        }
    }

    /// Blocks written at the destination. Any attempt that was sent counts: the receiver
    /// writes a block once, and every attempt carries the same bytes.
    pub fn on_ack(&mut self, ack: &Ack) -> Result<Disposition> {
        let (t, _) = match self.open_transfer(ack.tid) {
            Ok(found) => found,
            Err(ignored) => return Ok(Disposition::Ignored(ignored)),
        };
        ack.blocks.check_within(t.tid, t.block_count)?;
        let (mut applied, mut duplicate) = (false, false);
        for block in ack.blocks.iter() {
            let Some(state) = t.block(block) else {
                continue;
            };
            match state {
                TxBlock::Acked => duplicate = true,
                TxBlock::Fresh => {}
                _ if ack.attempt <= state.attempt() => {
                    t.set_state(block, TxBlock::Acked);
                    applied = true;
                }
                _ => {}
            }
        }
        if t.acked == t.block_count {
            t.phase = Phase::Done;
        }
        Ok(if applied {
            Disposition::Applied
        } else if duplicate {
            Disposition::Ignored(Ignored::Duplicate)
        } else {
            Disposition::Ignored(Ignored::BadAttempt)
        })
    }

    /// Blocks the receiver could not write. A fatal NACK aborts the transfer. Otherwise each
    /// block NACKed for its latest attempt waits for the receiver's resolved notice or a
    /// backoff (doubling per attempt, capped), whichever comes first; NACKs for older
    /// attempts and repeated NACKs change nothing.
    pub fn on_nack(&mut self, now: u64, nack: &Nack) -> Result<Disposition> {
        let cfg = self.cfg;
        let (t, stats) = match self.open_transfer(nack.tid) {
            Ok(found) => found,
            Err(ignored) => return Ok(Disposition::Ignored(ignored)),
        };
        nack.blocks.check_within(t.tid, t.block_count)?;
        if nack.fatal {
            t.faults += 1;
            stats.nacks += 1;
            t.abort(
                AbortReason::RemoteRejected {
                    block: nack.blocks.first(),
                    reason: nack.reason,
                },
                stats,
            );
            return Ok(Disposition::Applied);
        }
        let (mut applied, mut duplicate, mut bad) = (false, false, false);
        for block in nack.blocks.iter() {
            let Some(state) = t.block(block) else {
                continue;
            };
            match state {
                TxBlock::InFlight { attempt, .. } if attempt == nack.attempt => {
                    let deadline = now.saturating_add(backoff(&cfg, attempt));
                    t.set_state(block, TxBlock::AwaitResolution { attempt, deadline });
                    applied = true;
                }
                // Already waiting for this attempt's resolution, or already released by a
                // resolved notice that overtook the NACK.
                TxBlock::AwaitResolution { attempt, .. } | TxBlock::Ready { attempt }
                    if attempt == nack.attempt =>
                {
                    duplicate = true
                }
                TxBlock::Fresh => bad = true,
                _ if nack.attempt > state.attempt() && state != TxBlock::Acked => bad = true,
                _ => {}
            }
        }
        if applied {
            t.faults += 1;
            stats.nacks += 1;
            Ok(Disposition::Applied)
        } else if duplicate {
            stats.duplicate_nacks += 1;
            Ok(Disposition::Ignored(Ignored::Duplicate))
        } else if bad {
            Ok(Disposition::Ignored(Ignored::BadAttempt))
        } else {
            Ok(Disposition::Ignored(Ignored::Stale))
        }
    }

    /// The receiver resolved the faults behind earlier NACKs: blocks waiting for that are
    /// re-sent at the next [`poll_transmit`](Self::poll_transmit).
    pub fn on_resolved(&mut self, resolved: &Resolved) -> Result<Disposition> {
        self.release_awaiting(resolved.tid, resolved.blocks)
    }

    /// The answer to a [`FaultInRequest`] this side sent: on success the blocks are re-sent,
    /// on failure the transfer is aborted.
    pub fn on_fault_in_ack(&mut self, ack: &FaultInAck) -> Result<Disposition> {
        let RequestStatus::Failed(reason) = ack.status else {
            return self.release_awaiting(ack.tid, ack.blocks);
        };
        let (t, stats) = match self.open_transfer(ack.tid) {
            Ok(found) => found,
            Err(ignored) => return Ok(Disposition::Ignored(ignored)),
        };
        ack.blocks.check_within(t.tid, t.block_count)?;
        // Only blocks still waiting for an answer can be refused: a late answer to an old
        // request, whose blocks were re-sent and acknowledged since, changes nothing.
        let waiting = ack
            .blocks
            .iter()
            .any(|b| matches!(t.block(b), Some(TxBlock::AwaitResolution { .. })));
        if !waiting {
            return Ok(Disposition::Ignored(Ignored::Stale));
        }
        t.faults += 1;
        t.abort(
            AbortReason::RemoteRejected {
                block: ack.blocks.first(),
                reason,
            },
            stats,
        );
        Ok(Disposition::Applied)
    }

    /// The receiver retired an aborted transfer: stop repeating the abort notice.
    pub fn on_abort_ack(&mut self, ack: &AbortAck) -> Disposition {
        let idx = match locate_in(&self.transfers, self.next_tid, ack.tid) {
            Located::Open(idx) => idx,
            Located::Finished => return count_ignored(&mut self.stats, Ignored::TransferFinished),
            Located::Unknown => return count_ignored(&mut self.stats, Ignored::UnknownTransfer),
        };
        let disposition = match self.transfers.get_mut(idx).map(|t| &mut t.phase) {
            Some(Phase::Aborted {
                closed: closed @ false,
                ..
            }) => {
                *closed = true;
                Disposition::Applied
            }
            Some(Phase::Aborted { .. }) => Disposition::Ignored(Ignored::Duplicate),
            _ => Disposition::Ignored(Ignored::Stale),
        };
        self.retire();
        disposition
    }

    /// The engine could not read the source of `block` sent as `attempt` (so the block was
    /// not emitted). A resolvable fault parks the block until
    /// [`source_resolved`](Self::source_resolved) (or aborts after `source_fault_timeout`);
    /// `Permission` and `OutOfRegion` abort at once.
    ///
    /// Contract: the engine reports a source fault only for a block it did not emit in full;
    /// a block is never emitted with bytes read from a page that changed during the read.
    pub fn source_fault(
        &mut self,
        now: u64,
        tid: TransferId,
        block: u32,
        attempt: u16,
        reason: FaultReason,
    ) -> Result<Disposition> {
        let cfg = self.cfg;
        let Some((t, stats)) = self.local_transfer(tid)? else {
            return Ok(Disposition::Ignored(Ignored::TransferFinished));
        };
        let state = t.block(block).ok_or(ProtocolError::BlockOutOfRange {
            tid: tid.0,
            block: u64::from(block),
            count: t.block_count,
        })?;
        match state {
            TxBlock::InFlight { attempt: a, .. } | TxBlock::Ready { attempt: a }
                if a == attempt =>
            {
                t.faults += 1;
                stats.source_faults += 1;
                if matches!(reason, FaultReason::Permission | FaultReason::OutOfRegion) {
                    t.abort(AbortReason::SourceFault { block, reason }, stats);
                } else {
                    let deadline = now.saturating_add(cfg.source_fault_timeout);
                    t.set_state(block, TxBlock::SourceFault { attempt, deadline });
                }
                Ok(Disposition::Applied)
            }
            TxBlock::SourceFault { attempt: a, .. } if a == attempt => {
                Ok(Disposition::Ignored(Ignored::Duplicate))
            }
            TxBlock::Acked => Ok(Disposition::Ignored(Ignored::Stale)),
            _ if state.attempt() > attempt => Ok(Disposition::Ignored(Ignored::Stale)),
            _ => Err(ProtocolError::InvalidBlockState { tid: tid.0, block }),
        }
    }

    /// The fault service cannot make the source page of `block` present (`reason`): a
    /// block waiting for it ([`source_fault`](Self::source_fault)) aborts its transfer with
    /// `SourceFault { block, reason }`. Anything else is stale.
    pub fn source_unresolvable(
        &mut self,
        tid: TransferId,
        block: u32,
        reason: FaultReason,
    ) -> Result<Disposition> {
        let Some((t, stats)) = self.local_transfer(tid)? else {
            return Ok(Disposition::Ignored(Ignored::TransferFinished));
        };
        if !matches!(t.block(block), Some(TxBlock::SourceFault { .. })) {
            return Ok(Disposition::Ignored(Ignored::Stale));
        }
        t.abort(AbortReason::SourceFault { block, reason }, stats);
        Ok(Disposition::Applied)
    }

    /// The source pages of `blocks` are present again: re-issue them.
    pub fn source_resolved(&mut self, tid: TransferId, blocks: BlockRange) -> Result<Disposition> {
        let Some((t, _)) = self.local_transfer(tid)? else {
            return Ok(Disposition::Ignored(Ignored::TransferFinished));
        };
        blocks.check_within(tid, t.block_count)?;
        let mut applied = false;
        for block in blocks.iter() {
            if let Some(TxBlock::SourceFault { attempt, .. }) = t.block(block) {
                t.set_state(block, TxBlock::Ready { attempt });
                applied = true;
            }
        }
        Ok(if applied {
            Disposition::Applied
        } else {
            Disposition::Ignored(Ignored::Stale)
        })
    }

    /// The sender itself found that `blocks` (sent as `attempt`) may not have landed, e.g.
    /// a one-sided version check of the destination's page state failed (server path). The
    /// blocks wait as after a NACK; the returned request asks the peer to fault the pages in.
    /// `OutOfRegion` aborts the transfer and returns `None`.
    pub fn remote_fault(
        &mut self,
        now: u64,
        tid: TransferId,
        blocks: BlockRange,
        attempt: u16,
        reason: FaultReason,
    ) -> Result<Option<FaultInRequest>> {
        let cfg = self.cfg;
        let req_seq = self.next_req_seq;
        let Some((t, stats)) = self.local_transfer(tid)? else {
            return Ok(None);
        };
        blocks.check_within(tid, t.block_count)?;
        if reason == FaultReason::OutOfRegion {
            t.faults += 1;
            t.abort(
                AbortReason::RemoteRejected {
                    block: blocks.first(),
                    reason,
                },
                stats,
            );
            return Ok(None);
        }
        let mut any = false;
        for block in blocks.iter() {
            if let Some(TxBlock::InFlight { attempt: a, .. }) = t.block(block)
                && a == attempt
            {
                let deadline = now.saturating_add(backoff(&cfg, a));
                t.set_state(
                    block,
                    TxBlock::AwaitResolution {
                        attempt: a,
                        deadline,
                    },
                );
                any = true;
            }
        }
        if !any {
            return Ok(None);
        }
        t.faults += 1;
        let offset = u64::from(blocks.first()) * u64::from(cfg.block_size);
        let end = (u64::from(blocks.last()) + 1)
            .saturating_mul(u64::from(cfg.block_size))
            .min(t.desc.len);
        let request = FaultInRequest {
            req_seq,
            tid,
            blocks,
            key: t.desc.key,
            access: Access::Write,
            addr: t.desc.dest + offset,
            len: end - offset,
        };
        self.next_req_seq = req_seq.wrapping_add(1);
        Ok(Some(request))
    }

    /// Aborts an open transfer at the user's request.
    pub fn cancel(&mut self, tid: TransferId) -> Result<Disposition> {
        let Some((t, stats)) = self.local_transfer(tid)? else {
            return Ok(Disposition::Ignored(Ignored::TransferFinished));
        };
        t.abort(AbortReason::Cancelled, stats);
        Ok(Disposition::Applied)
    }

    /// The latest attempt sent of `block` of an active transfer (0: never sent), for
    /// transports that cannot carry the attempt in their ACK/NACK (docs/protocol.md §9):
    /// they report NACKs for this attempt and ACKs for attempt 1.
    pub fn current_attempt(&self, tid: TransferId, block: u32) -> Option<u16> {
        match locate_in(&self.transfers, self.next_tid, tid) {
            Located::Open(idx) => {
                let t = self
                    .transfers
                    .get(idx)
                    .filter(|t| t.phase == Phase::Active)?;
                match t.block(block)? {
                    TxBlock::Acked => None,
                    state => Some(state.attempt()),
                }
            }
            _ => None,
        }
    }

    /// The oldest transfer still active (every earlier one is finished); carried in block
    /// headers and abort notices.
    pub fn oldest_open(&self) -> TransferId {
        self.transfers
            .iter()
            .find(|t| t.phase == Phase::Active)
            .map_or(self.next_tid, |t| t.tid)
    }

    fn release_awaiting(&mut self, tid: TransferId, blocks: BlockRange) -> Result<Disposition> {
        let (t, stats) = match self.open_transfer(tid) {
            Ok(found) => found,
            Err(ignored) => return Ok(Disposition::Ignored(ignored)),
        };
        blocks.check_within(tid, t.block_count)?;
        let mut released = 0;
        for block in blocks.iter() {
            if let Some(TxBlock::AwaitResolution { attempt, .. }) = t.block(block) {
                t.set_state(block, TxBlock::Ready { attempt });
                released += 1;
            }
        }
        stats.resolutions += released;
        Ok(if released > 0 {
            Disposition::Applied
        } else {
            Disposition::Ignored(Ignored::Stale)
        })
    }

    /// An abort notice for transfer `idx`, if one is due.
    fn abort_notice_due(&mut self, idx: usize, now: u64) -> Option<Abort> {
        let oldest_open = self.oldest_open();
        let max_attempts = self.cfg.max_attempts;
        let ack_timeout = self.cfg.ack_timeout;
        let t = self.transfers.get_mut(idx)?;
        let tid = t.tid;
        let Phase::Aborted {
            reason,
            sends,
            due,
            closed,
        } = &mut t.phase
        else {
            return None;
        };
        if *closed || *due > now {
            return None;
        }
        if *sends >= max_attempts {
            *closed = true;
            self.stats.abort_notices_given_up += 1;
            return None;
        }
        *sends += 1;
        *due = now.saturating_add(ack_timeout);
        Some(Abort {
            tid,
            oldest_open,
            reason: *reason,
        })
    }

    /// Drops delivered transfers from the front once nothing more can happen to them.
    fn retire(&mut self) {
        while let Some(front) = self.transfers.front() {
            let finished = front.delivered
                && matches!(
                    front.phase,
                    Phase::Done | Phase::Aborted { closed: true, .. }
                );
            if !finished {
                break;
            }
            self.transfers.pop_front();
        }
    }

    /// The active transfer `tid` for a peer message, or why the message is ignored.
    fn open_transfer(
        &mut self,
        tid: TransferId,
    ) -> core::result::Result<(&mut TxTransfer<B>, &mut SenderStats), Ignored> {
        let Self {
            transfers,
            stats,
            next_tid,
            ..
        } = self;
        let reason = match locate_in(transfers, *next_tid, tid) {
            Located::Open(idx) => match transfers.get_mut(idx) {
                Some(t) if t.phase == Phase::Active => return Ok((t, stats)),
                _ => Ignored::TransferFinished,
            },
            Located::Finished => Ignored::TransferFinished,
            Located::Unknown => Ignored::UnknownTransfer,
        };
        count_ignored(stats, reason);
        Err(reason)
    }

    /// The active transfer `tid` for a local call: `None` if it is finished, an error if it
    /// never existed.
    fn local_transfer(
        &mut self,
        tid: TransferId,
    ) -> Result<Option<(&mut TxTransfer<B>, &mut SenderStats)>> {
        let Self {
            transfers,
            stats,
            next_tid,
            ..
        } = self;
        match locate_in(transfers, *next_tid, tid) {
            Located::Open(idx) => Ok(transfers
                .get_mut(idx)
                .filter(|t| t.phase == Phase::Active)
                .map(|t| (t, stats))),
            Located::Finished => Ok(None),
            Located::Unknown => Err(ProtocolError::UnknownTransfer { tid: tid.0 }),
        }
    }
}

fn locate_in<const T: usize, const B: usize>(
    transfers: &Deque<TxTransfer<B>, T>,
    next_tid: TransferId,
    tid: TransferId,
) -> Located {
    let front = transfers.front().map_or(next_tid, |t| t.tid);
    let offset = tid.offset_from(front);
    if offset < 0 {
        Located::Finished
    } else if (offset as usize) < transfers.len() {
        Located::Open(offset as usize)
    } else {
        Located::Unknown
    }
}

fn count_ignored(stats: &mut SenderStats, reason: Ignored) -> Disposition {
    match reason {
        Ignored::UnknownTransfer => stats.unknown_transfer_messages += 1,
        Ignored::TransferFinished => stats.finished_transfer_messages += 1,
        _ => {}
    }
    Disposition::Ignored(reason)
}

/// Wait after a NACK of `attempt`: `backoff_initial * 2^(attempt-1)`, at most `backoff_max`.
fn backoff(cfg: &SenderConfig, attempt: u16) -> u64 {
    let doublings = u32::from(attempt.saturating_sub(1)).min(63);
    cfg.backoff_initial
        .saturating_mul(1u64 << doublings)
        .min(cfg.backoff_max)
}
