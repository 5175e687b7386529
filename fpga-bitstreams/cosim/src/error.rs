//! The co-simulation's error type: failures of the drivers and models it composes, and an
//! engine that stops making progress.

/// Why a co-simulation step failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CosimError {
    /// The NPE driver refused or failed.
    #[error("NPE driver: {0}")]
    Dma(#[from] dma_engine::DmaError),
    /// The SMMU driver or the fault service failed.
    #[error("SMMU driver: {0}")]
    Smmu(#[from] smmu_driver::SmmuError),
    /// The board's pager failed.
    #[error("pager: {0}")]
    Board(#[from] boards::BoardError),
    /// A model of `sim` refused its configuration.
    #[error("model: {0}")]
    Sim(#[from] sim::SimError),
    /// The DMA memory failed.
    #[error("memory: {0}")]
    Hal(#[from] hal::HalError),
    /// The SMMU reported a global fault (a stream nobody attached, a bad context).
    #[error("SMMU global fault: sGFSR {gfsr:#x}, stream {stream:#x}")]
    GlobalFault {
        /// sGFSR as read.
        gfsr: u32,
        /// The stream sGFSYNR1 names.
        stream: u32,
    },
    /// The board has no such engine.
    #[error("no engine {engine} on the board")]
    NoSuchEngine {
        /// The index asked for.
        engine: usize,
    },
    /// A condition was not reached within the clock budget.
    #[error("not reached after {cycles} clocks: {what}")]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// Clocks run.
        cycles: u64,
    },
}

/// A co-simulation result.
pub type Result<T> = core::result::Result<T, CosimError>;
