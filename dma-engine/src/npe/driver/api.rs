//! What the driver's users configure and read: engine, channel and peer settings, the host
//! the driver asks about faults, and its reports.

use super::*;

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
    /// What the loaded bitstream's manifest declares (`fpga_bitstreams::manifest::Manifest::
    /// design_id`); [`Npe::new`] refuses an engine whose `ID` or whose design differs from
    /// this driver's ([`check_design`]). [`DRIVER_DESIGN`] where no manifest exists (a model).
    pub design: DesignId,
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
            design: DRIVER_DESIGN,
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
