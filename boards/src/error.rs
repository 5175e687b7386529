//! The crate's one error type.

use dma_engine::DmaError;
use hal::{HalError, Iova};
use smmu_driver::SmmuError;

use crate::zynqmp::scenario::Phase;

/// Errors of board set-up and of the fault scenario. Codes are stable ([`BoardError::code`]):
/// firmware prints them in its verdict line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum BoardError {
    /// The hardware seam failed.
    #[error("hal: {0}")]
    Hal(#[from] HalError),
    /// The SMMU driver failed.
    #[error("smmu: {0}")]
    Smmu(#[from] SmmuError),
    /// The DMA driver failed (other than an AXI error the scenario answers by
    /// retransmitting).
    #[error("dma: {0}")]
    Dma(#[from] DmaError),
    /// A PL AXI ID does not fit the 6 bits the stream ID has for it.
    #[error("AXI ID {axi_id} does not fit 6 bits")]
    AxiIdOutOfRange {
        /// The ID asked for.
        axi_id: u8,
    },
    /// A PL-to-PS interrupt line beyond `pl_ps_irq1[7]` (16 lines).
    #[error("PL interrupt line {line} does not exist (0-15)")]
    PlIrqOutOfRange {
        /// The line asked for.
        line: u8,
    },
    /// A transferred byte differs from the source.
    #[error(
        "{phase:?} transfer {transfer}: byte {offset:#x} is {found:#04x}, expected {expected:#04x}"
    )]
    DataMismatch {
        /// Phase.
        phase: Phase,
        /// Transfer number within the phase.
        transfer: u32,
        /// Offset in the transfer.
        offset: u32,
        /// The source byte.
        expected: u8,
        /// The destination byte.
        found: u8,
    },
    /// The DMA channel reported an AXI error but the SMMU reported no fault for its stream
    /// (and no lost fault, FSR.MULTI): nothing explains it, so retransmitting would not help.
    #[error("{phase:?} transfer {transfer}: AXI error without an SMMU fault ({error})")]
    UnexplainedAxiError {
        /// Phase.
        phase: Phase,
        /// Transfer number within the phase.
        transfer: u32,
        /// The channel's error.
        error: DmaError,
    },
    /// A transfer kept faulting.
    #[error("{phase:?} transfer {transfer}: still failing after {attempts} attempts")]
    RetransmitLimit {
        /// Phase.
        phase: Phase,
        /// Transfer number within the phase.
        transfer: u32,
        /// Attempts made.
        attempts: u32,
    },
    /// The fault path aborted a transfer the phase expected to complete.
    #[error("{phase:?} transfer {transfer}: aborted ({error})")]
    UnexpectedAbort {
        /// Phase.
        phase: Phase,
        /// Transfer number within the phase.
        transfer: u32,
        /// Why.
        error: SmmuError,
    },
    /// A transfer the phase expected to be aborted completed.
    #[error("{phase:?} transfer {transfer}: completed but should have been aborted")]
    MissingAbort {
        /// Phase.
        phase: Phase,
        /// Transfer number within the phase.
        transfer: u32,
    },
    /// An IOVA that must never be mapped (outside every region) is mapped.
    #[error("{phase:?}: IOVA {iova} is mapped although it is outside every region")]
    ForbiddenMapping {
        /// Phase.
        phase: Phase,
        /// The IOVA.
        iova: Iova,
    },
    /// The pager ran out of page slots, frames or regions.
    #[error("pager: no free {what}")]
    PagerExhausted {
        /// Which resource.
        what: &'static str,
    },
    /// An IOVA the pager does not manage.
    #[error("pager: IOVA {iova} is not in any page of the pager")]
    UnknownPage {
        /// The IOVA.
        iova: Iova,
    },
    /// The SMMU reported a global fault (an unmatched stream, a bad context).
    #[error("global SMMU fault: sGFSR {gfsr:#x}, stream {stream:#x}")]
    GlobalFault {
        /// sGFSR.
        gfsr: u32,
        /// The stream (sGFSYNR1).
        stream: u32,
    },
    /// A phase's counters break an invariant that holds on any correct SMMU and DMA.
    #[error("{phase:?}: {what}")]
    InvariantViolated {
        /// Phase.
        phase: Phase,
        /// Which invariant.
        what: &'static str,
    },
    /// A frame index past the pager's frames.
    #[error("pager: no frame {frame} (it has {frames})")]
    NoSuchFrame {
        /// The index asked for.
        frame: u16,
        /// Frames the pager owns.
        frames: u16,
    },
    /// One attempt of a transfer took more faults than the pages it touches can explain: the
    /// fault path keeps resolving a fault that comes back (a mapping the SMMU does not see).
    #[error(
        "{phase:?} transfer {transfer}: {faults} faults in one attempt, a fault that keeps coming back"
    )]
    FaultStorm {
        /// Phase.
        phase: Phase,
        /// Transfer number within the phase.
        transfer: u32,
        /// Faults taken in the attempt.
        faults: u32,
    },
    /// A transfer from an IOVA no page table maps raised no context fault in the bank its
    /// stream is routed to: the stream's traffic bypasses the SMMU (on the ZynqMP, an SMMU
    /// programmed through the Secure view while the GDMA is Non-secure: docs/mmu500.md §7a).
    #[error(
        "stream {stream:#x}: reading unmapped IOVA {iova:#x} raised no context fault \
         (sGFSR {gfsr:#x}): its traffic is not translated"
    )]
    NotTranslated {
        /// The stream.
        stream: u32,
        /// The IOVA read.
        iova: u64,
        /// The global fault status read afterwards (a fault there: an unmatched stream).
        gfsr: u32,
    },
}

impl BoardError {
    /// A stable numeric code (0 is never used: it means success).
    pub const fn code(&self) -> u32 {
        match self {
            Self::Hal(_) => 1,
            Self::Smmu(_) => 2,
            Self::Dma(_) => 3,
            Self::AxiIdOutOfRange { .. } => 4,
            Self::DataMismatch { .. } => 5,
            Self::UnexplainedAxiError { .. } => 6,
            Self::RetransmitLimit { .. } => 7,
            Self::UnexpectedAbort { .. } => 8,
            Self::MissingAbort { .. } => 9,
            Self::ForbiddenMapping { .. } => 10,
            Self::PagerExhausted { .. } => 11,
            Self::UnknownPage { .. } => 12,
            Self::GlobalFault { .. } => 13,
            Self::InvariantViolated { .. } => 14,
            Self::NoSuchFrame { .. } => 15,
            Self::FaultStorm { .. } => 16,
            Self::NotTranslated { .. } => 17,
            Self::PlIrqOutOfRange { .. } => 18,
        }
    }
}

/// Result with [`BoardError`].
pub type Result<T = ()> = core::result::Result<T, BoardError>;
