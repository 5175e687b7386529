//! Fault policies: resume, terminate and retransmit, or abort.

use super::{FaultKind, FaultRecord};
use crate::SmmuError;

/// Per-stream facts the policy needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamFaultConfig {
    /// The master tolerates its transactions being stalled (a platform device declared so,
    /// like Linux's `dma-can-stall`). Never true for PCIe (IHI0070 §3.12.1; PCIe ordering:
    /// a stalled posted write can deadlock completions).
    pub stall_tolerant: bool,
    /// How long a transaction may stay stalled while the fault is resolved, in nanoseconds.
    pub stall_budget_ns: u64,
}

impl StreamFaultConfig {
    /// A PCIe (or any non-stall-tolerant) stream: always terminate.
    pub const NEVER_STALL: StreamFaultConfig = StreamFaultConfig {
        stall_tolerant: false,
        stall_budget_ns: 0,
    };

    /// A stall-tolerant platform stream with a stall budget.
    pub const fn stall_tolerant(stall_budget_ns: u64) -> StreamFaultConfig {
        StreamFaultConfig {
            stall_tolerant: true,
            stall_budget_ns,
        }
    }
}

/// What the handler found out about a fault before deciding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultEstimate {
    /// No registered region of the stream contains the IOVA.
    OutsideRegion,
    /// A write to a read-only region.
    WriteToReadOnly,
    /// A fault kind no mapping fixes (address size, external, unknown).
    Unrecoverable,
    /// The table already maps the page with the access allowed. `stale_tlb` is set for a
    /// permission fault: the SMMU used an older, stricter TLB entry (e.g. a RO -> RW upgrade
    /// not yet invalidated, which QEMU's `smmuv3_translate` keeps using), so that entry
    /// must be invalidated. Translation and access-flag faults come from entries that were
    /// never cached (Arm ARM R_XCLRD), so they need nothing.
    Present {
        /// The SMMU's TLB holds a stale entry for the page.
        stale_tlb: bool,
    },
    /// The resolver expects a minor fault costing about `expected_ns`.
    Minor {
        /// Expected resolution time in nanoseconds.
        expected_ns: u64,
    },
    /// The resolver expects a major fault.
    Major,
    /// The resolver cannot tell.
    Unknown,
}

/// Everything a policy decides from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyInput<'a> {
    /// The fault.
    pub record: &'a FaultRecord,
    /// The stream tolerates stalls ([`StreamFaultConfig::stall_tolerant`]).
    pub stall_tolerant: bool,
    /// The SMMU stalled the transaction (it supports stalling and the context asked for it).
    pub stalled: bool,
    /// The estimate.
    pub estimate: FaultEstimate,
    /// The stream's stall budget in nanoseconds.
    pub stall_budget_ns: u64,
}

/// What to do with the faulting transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultDecision {
    /// Keep it stalled, make the page present, invalidate, then retry it (SMMUv2
    /// `RESUME.TnR = 0`, SMMUv3 `CMD_RESUME` retry).
    Resume,
    /// Terminate it now if stalled (the master sees an abort), make the page present, and
    /// have the DMA master retransmit.
    TerminateAndRetransmit,
    /// Terminate it if stalled and fail the transfer with this error. Nothing is mapped.
    Abort(SmmuError),
}

/// Chooses a [`FaultDecision`].
pub trait FaultPolicy {
    /// The decision for `input`. The handler overrides a decision that breaks its rules
    /// (resuming a transaction that is not stalled or not on a stall-tolerant stream; not
    /// aborting where [`abort_reason`] says so) and counts the override.
    fn decide(&self, input: &PolicyInput<'_>) -> FaultDecision;
}

/// The abort every policy must choose for this input, if any: outside every region, write to
/// a read-only region, or unrecoverable kind.
pub fn abort_reason(record: &FaultRecord, estimate: &FaultEstimate) -> Option<SmmuError> {
    let stream = record.stream.0;
    let iova = record.iova;
    match estimate {
        FaultEstimate::OutsideRegion => Some(SmmuError::OutsideRegisteredRegion { stream, iova }),
        FaultEstimate::WriteToReadOnly => Some(SmmuError::WriteToReadOnlyRegion { stream, iova }),
        FaultEstimate::Unrecoverable => Some(SmmuError::UnrecoverableFault {
            stream,
            iova,
            kind: record.kind,
        }),
        _ => None,
    }
}

/// The kinds a mapping can fix.
pub(crate) fn recoverable(kind: FaultKind) -> bool {
    matches!(
        kind,
        FaultKind::Translation | FaultKind::Permission | FaultKind::AccessFlag
    )
}

/// The three policies the project needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StandardPolicy {
    /// The master cannot retransmit: resume every stalled fault, however long resolving
    /// takes; a transaction that was terminated (not stalled, or stalled on a stream that may
    /// not stall) loses its data ([`SmmuError::TransferLost`]).
    StallOnly,
    /// Never resume: terminate (if stalled) and retransmit. The only choice on QEMU's SMMUv3,
    /// which cannot stall.
    RetransmitOnly,
    /// Resume when the transaction is stalled on a stall-tolerant stream and the fault is
    /// minor within the stall budget (or already fixed); otherwise terminate and retransmit
    /// (major, unknown, over budget, not stalled). A fixed rule; [`CostPolicy`] decides on
    /// expected costs instead.
    ///
    /// [`CostPolicy`]: super::CostPolicy
    Hybrid,
}

impl FaultPolicy for StandardPolicy {
    fn decide(&self, input: &PolicyInput<'_>) -> FaultDecision {
        if let Some(error) = abort_reason(input.record, &input.estimate) {
            return FaultDecision::Abort(error);
        }
        let may_resume = input.stalled && input.stall_tolerant;
        match self {
            StandardPolicy::StallOnly => {
                if may_resume {
                    FaultDecision::Resume
                } else {
                    FaultDecision::Abort(SmmuError::TransferLost {
                        stream: input.record.stream.0,
                        iova: input.record.iova,
                    })
                }
            }
            StandardPolicy::RetransmitOnly => FaultDecision::TerminateAndRetransmit,
            StandardPolicy::Hybrid => {
                let cheap = match input.estimate {
                    FaultEstimate::Present { .. } => true,
                    FaultEstimate::Minor { expected_ns } => expected_ns <= input.stall_budget_ns,
                    _ => false,
                };
                if may_resume && cheap {
                    FaultDecision::Resume
                } else {
                    FaultDecision::TerminateAndRetransmit
                }
            }
        }
    }
}
