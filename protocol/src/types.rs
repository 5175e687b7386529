//! Small value types shared by the table, the messages and the state machines.

use crate::{ProtocolError, Result};

/// Identifies one transfer within a connection.
///
/// Ids are assigned by the sender, consecutively (no gaps), starting at the connection's first
/// id. They are compared with serial-number arithmetic (RFC 1982) so they may wrap; windows
/// are tiny compared with 2^31, so comparisons are never ambiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct TransferId(pub u32);

impl TransferId {
    /// The id after this one.
    pub const fn next(self) -> Self {
        Self(self.0.wrapping_add(1))
    }

    /// `self - base` in serial arithmetic: negative if `self` comes before `base`.
    pub const fn offset_from(self, base: TransferId) -> i64 {
        self.0.wrapping_sub(base.0) as i32 as i64
    }

    /// The id `n` after this one.
    pub const fn advance(self, n: u32) -> Self {
        Self(self.0.wrapping_add(n))
    }
}

/// A non-empty range of block indices `first..=last` within one transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockRange {
    first: u32,
    count: u32,
}

impl BlockRange {
    /// The range of `count` blocks from `first`; `None` if `count` is zero or the last index
    /// would not fit u32.
    pub const fn new(first: u32, count: u32) -> Option<Self> {
        if count == 0 || first.checked_add(count - 1).is_none() {
            return None;
        }
        Some(Self { first, count })
    }

    /// The range holding only `block`.
    pub const fn single(block: u32) -> Self {
        Self {
            first: block,
            count: 1,
        }
    }

    /// First block index.
    pub const fn first(self) -> u32 {
        self.first
    }

    /// Number of blocks.
    pub const fn count(self) -> u32 {
        self.count
    }

    /// Last block index (inclusive).
    pub const fn last(self) -> u32 {
        // Cannot overflow: checked in `new`.
        self.first + (self.count - 1)
    }

    /// Whether `block` is in the range.
    pub const fn contains(self, block: u32) -> bool {
        block >= self.first && block <= self.last()
    }

    /// The block indices, in ascending order.
    pub fn iter(self) -> core::ops::RangeInclusive<u32> {
        self.first..=self.last()
    }

    /// Checks that the range lies within a transfer of `block_count` blocks.
    pub(crate) fn check_within(self, tid: TransferId, block_count: u32) -> Result<()> {
        if self.last() >= block_count {
            return Err(ProtocolError::BlockOutOfRange {
                tid: tid.0,
                block: u64::from(self.first.max(block_count)),
                count: block_count,
            });
        }
        Ok(())
    }
}

/// A page-state table generation, also used as a page's version.
///
/// The table's generation grows by one on every change (invalidation or mapping); a page's
/// version is the generation at which it last changed. A transfer that looked at its pages at
/// generation `g` relies on nothing having changed iff every page it uses is present and has
/// version `<= g` (see `PageStateTable::check`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Generation(pub u64);

/// The kind of memory access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// The engine reads (a source buffer).
    Read,
    /// The engine writes (a destination buffer).
    Write,
}

impl Access {
    /// Wire code.
    pub const fn code(self) -> u8 {
        match self {
            Access::Read => 1,
            Access::Write => 2,
        }
    }

    /// From a wire code.
    pub const fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Access::Read),
            2 => Some(Access::Write),
            _ => None,
        }
    }
}

/// Why an access to a page failed. Wire codes are stable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultReason {
    /// The page is not present (translation fault; the SMMU's `FSR.TF`).
    NotPresent,
    /// The page is present but does not allow the access (the SMMU's `FSR.PF`), e.g. a write to
    /// a read-only or copy-on-write page.
    Permission,
    /// The address is outside every region the peer registered; never resolvable.
    OutOfRegion,
    /// The page was invalidated (and possibly remapped) while the access was in progress, so
    /// the access may have hit the scratch page; detected by the version check.
    PageChanged,
}

impl FaultReason {
    /// Wire code (1..=4).
    pub const fn code(self) -> u8 {
        match self {
            FaultReason::NotPresent => 1,
            FaultReason::Permission => 2,
            FaultReason::OutOfRegion => 3,
            FaultReason::PageChanged => 4,
        }
    }

    /// From a wire code.
    pub const fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(FaultReason::NotPresent),
            2 => Some(FaultReason::Permission),
            3 => Some(FaultReason::OutOfRegion),
            4 => Some(FaultReason::PageChanged),
            _ => None,
        }
    }
}

/// Why a transfer was aborted. Delivered to the user in the transfer's completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AbortReason {
    /// The user cancelled it.
    Cancelled,
    /// A block was sent `max_attempts` times without an ACK.
    RetriesExhausted {
        /// The block that ran out of attempts.
        block: u32,
    },
    /// A source-side fault was not resolved within `source_fault_timeout`.
    SourceFaultTimeout {
        /// The faulting block.
        block: u32,
    },
    /// A source-side fault that cannot be resolved (permission, out of region).
    SourceFault {
        /// The faulting block.
        block: u32,
        /// Why.
        reason: FaultReason,
    },
    /// The destination refused the blocks for good (a fatal NACK or a failed fault-in).
    RemoteRejected {
        /// The first refused block.
        block: u32,
        /// Why.
        reason: FaultReason,
    },
}

impl AbortReason {
    /// Wire encoding: (reason code, fault reason code or 0, block index).
    pub const fn to_wire(self) -> (u8, u8, u32) {
        match self {
            AbortReason::Cancelled => (1, 0, 0),
            AbortReason::RetriesExhausted { block } => (2, 0, block),
            AbortReason::SourceFaultTimeout { block } => (3, 0, block),
            AbortReason::SourceFault { block, reason } => (4, reason.code(), block),
            AbortReason::RemoteRejected { block, reason } => (5, reason.code(), block),
        }
    }

    /// From the wire encoding; `None` if the codes are not a valid combination.
    pub const fn from_wire(code: u8, fault: u8, block: u32) -> Option<Self> {
        match (code, fault, FaultReason::from_code(fault)) {
            (1, 0, _) if block == 0 => Some(AbortReason::Cancelled),
            (2, 0, _) => Some(AbortReason::RetriesExhausted { block }),
            (3, 0, _) => Some(AbortReason::SourceFaultTimeout { block }),
            (4, _, Some(reason)) => Some(AbortReason::SourceFault { block, reason }),
            (5, _, Some(reason)) => Some(AbortReason::RemoteRejected { block, reason }),
            _ => None,
        }
    }
}

/// Outcome of a fault-in or state-lookup request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestStatus {
    /// Done: the pages are present now (fault-in) or the state is valid (lookup).
    Ok,
    /// Failed for this reason.
    Failed(FaultReason),
}

impl RequestStatus {
    /// Wire code: 0 for `Ok`, else the fault reason's code.
    pub const fn code(self) -> u8 {
        match self {
            RequestStatus::Ok => 0,
            RequestStatus::Failed(reason) => reason.code(),
        }
    }

    /// From a wire code.
    pub const fn from_code(code: u8) -> Option<Self> {
        if code == 0 {
            return Some(RequestStatus::Ok);
        }
        match FaultReason::from_code(code) {
            Some(reason) => Some(RequestStatus::Failed(reason)),
            None => None,
        }
    }
}
