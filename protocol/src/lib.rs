//! The unpinned-memory protocol of nprdma, shared by the SoC path (our PL RDMA engine behind
//! the MMU-500) and the server path (the LD_PRELOAD library over verbs).
//!
//! - [`page_table`]: per-page present bit, permission, frame and version for a registered
//!   region, with the operations the memory-manager glue needs and the version check that
//!   tells a transfer whether a page it relied on changed meanwhile.
//! - [`wire`]: the messages (block header, ACK, NACK, resolved notice, fault-in request and
//!   ACK, state lookup, abort, hello) and their versioned, checksummed little-endian encoding.
//! - [`sender`] and [`receiver`]: the per-transfer state machines of the two ends of a
//!   connection: per-block ACK/NACK, source- and destination-side faults, bounded backoff and
//!   retries, typed aborts, and completions delivered in order and exactly once.
//!
//! Everything is pure logic: no clocks and no I/O. Time enters as `now` values in the caller's
//! units, so runs are deterministic. The specification is `docs/protocol.md`; what comes from
//! the NP-RDMA paper and the ExaNeSt work, and what is ours, is said there (§0).
#![cfg_attr(not(test), no_std)]

mod crc;
mod error;
pub mod page_table;
pub mod receiver;
pub mod sender;
mod types;
pub mod wire;

pub use crc::crc32c;
pub use error::{ProtocolError, Result};
pub use page_table::{Invalidation, PageEntry, PageFault, PageState, PageStateTable};
pub use receiver::{
    Admission, Delivery, DeliveryStatus, Receiver, ReceiverConfig, ReceiverStats, WriteOutcome,
};
pub use sender::{
    BlockSend, Completion, CompletionStatus, Disposition, Ignored, Sender, SenderConfig,
    SenderStats, TransferDesc, Transmit,
};
pub use types::{
    AbortReason, Access, BlockRange, FaultReason, Generation, RequestStatus, TransferId,
};
pub use wire::{Envelope, Message, MessageType};
