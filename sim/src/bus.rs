//! What a DMA master model sees of the interconnect.
//!
//! A master issues page-bounded accesses through a [`MasterPort`] (in a
//! [`ZynqMpSoc`](crate::soc::ZynqMpSoc) that is the MMU-500 model in front of DRAM). An
//! access either completes, fails with an AXI error response, or is **stalled** by the SMMU:
//! the master then holds a [`StallTicket`] and asks [`MasterPort::stall_state`] on later steps
//! until the SMMU retries it (the master re-issues the access) or terminates it.

/// An AXI response other than OKAY.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AxiResponse {
    /// SLVERR: the slave (here: the SMMU terminating a transaction) signalled an error.
    SlvErr,
    /// DECERR: no slave at the address.
    DecErr,
}

/// One access of a master: at most up to the next 4 KiB boundary (AXI bursts never cross one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Access {
    /// The master's stream ID.
    pub stream: u32,
    /// Bus address (an IOVA when the SMMU translates).
    pub address: u64,
    /// Bytes.
    pub len: usize,
    /// Write (else read).
    pub write: bool,
    /// AxPROT\[0\]: privileged.
    pub privileged: bool,
    /// AxPROT\[2\]: instruction fetch.
    pub instruction: bool,
}

/// Identifies a stalled transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StallTicket(pub u64);

/// What became of an access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessResult {
    /// Completed (for reads: the buffer holds the data).
    Ok,
    /// The SMMU holds it.
    Stalled(StallTicket),
    /// Error response.
    Err(AxiResponse),
}

/// Where a stalled transaction is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StallState {
    /// Still held.
    Held,
    /// Released for retry: the master issues the access again.
    Retry,
    /// Terminated with an error response.
    Terminated(AxiResponse),
    /// Terminated silently (SCTLR.CFRE = 0): reads return zeros, writes are dropped, the
    /// master sees OKAY.
    TerminatedSilently,
    /// The ticket is unknown (already consumed, or never issued).
    Unknown,
}

/// The interconnect as a master sees it.
pub trait MasterPort {
    /// Reads `buf.len()` bytes at `access.address`.
    fn read(&mut self, access: &Access, buf: &mut [u8]) -> AccessResult;
    /// Writes `data` at `access.address`.
    fn write(&mut self, access: &Access, data: &[u8]) -> AccessResult;
    /// The state of a stalled access. A final state (`Retry` or `Terminated*`) is reported
    /// once; the ticket is then forgotten.
    fn stall_state(&mut self, ticket: StallTicket) -> StallState;
}

/// What one [`DmaMaster::step`] achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Progress {
    /// Nothing to do.
    Idle,
    /// Moved data or changed state: step again.
    Advanced,
    /// Waiting for the SMMU (a stalled access).
    Blocked,
}

/// A device model that masters DMA.
pub trait DmaMaster {
    /// Makes one unit of progress (one access or one state change) through `port`.
    fn step(&mut self, port: &mut dyn MasterPort) -> Progress;
}
