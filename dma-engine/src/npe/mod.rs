//! Driver of NPE, our PL RDMA engine (specification: `docs/dma-engine.md`).
//!
//! - [`regs`]: the register map (§3) as tock-registers fields and `hal::register_block!`s.
//! - [`regmap`]: the register map as data and its hash, shared with bitstream manifests,
//!   and the probe-time design check.
//! - [`desc`]: the queue entries (§4) with `bitfield` word views and checked decoding.
//! - [`Npe`]: the driver. It runs the unpinned-memory protocol (`protocol::Sender` per
//!   channel, `protocol::Receiver` per peer), gates every arriving block through
//!   `Receiver::admit` before the engine may write it, schedules channels round-robin while
//!   parking those that wait for a source fault, re-sends exactly the blocks the protocol
//!   asks for, and hands completions to the user in order, exactly once. Queue-full is a
//!   typed error ([`DmaError::QueueFull`]), never a drop.
//!
//! `no_std`, no heap: every queue is a `heapless` ring or a fixed array sized by const
//! generics.

pub mod desc;
mod driver;
pub mod regmap;
pub mod regs;
mod ring;

pub use crate::error::{DmaError, Result};
pub use driver::{
    BLOCK_SIZE, CONTROL_QUEUE, ChannelConfig, FaultClass, MAX_COMMITS, MAX_PRESENT_RETRIES,
    MAX_SQ_LOG2, MAX_WAITERS, Npe, NpeConfig, NpeHost, NpeStats, PeerConfig, PollReport,
    SenderTiming,
};
