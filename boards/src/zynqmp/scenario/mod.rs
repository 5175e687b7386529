//! The SMMU fault scenario, written once for the simulator and for silicon.
//!
//! It drives the MMU-500 ([`SmmuV2`]) and two zDMA channels ([`ZdmaChannel`]) through
//! register buses only, so the same code runs against `sim`'s models on the host
//! (`cargo test -p sim`) and against MMIO in the `zynqmp-smmu-faults` firmware program. Each
//! [`Phase`] gets a fresh context bank and page table, a [`Pager`] with frames and a backing
//! store, and copies data with the zDMA through the SMMU while pages are missing. The fault
//! path is `smmu-driver`'s: [`SmmuV2::service_context`] with
//! [`StandardPolicy::Hybrid`] (stall and resume a minor fault within the stall budget,
//! otherwise terminate and retransmit; never resume a stream that is not stall-tolerant).
//!
//! A transfer is reported complete only when it is known to be good (docs/mmu500.md §2.3):
//! a fault is attributed to a transfer only by stream and address together
//! ([`smmu_driver::fault::attribute`]); a fault that cannot be attributed (no syndrome, an
//! address no transfer covers, FSR.MULTI) makes every transfer in flight on the bank suspect,
//! and a suspect transfer has its pages made present through the fault path
//! ([`FaultHandler::resolve_range`]) and is sent again, whatever its engine says. So the
//! scenario also passes on SMMUs and DMA engines that report less than silicon does.
//!
//! Every completed transfer is checked byte for byte against its source (read back through
//! the pager), and every destination is overwritten with a sentinel before the transfer, so
//! a DMA that did nothing, or read stale memory, fails the check.
//!
//! | phase | context | what happens |
//! |---|---|---|
//! | [`Phase::MinorStallResume`] | stall | source pages resident but unmapped: each fault is minor, resolved while the transaction is stalled, then RESUME retry |
//! | [`Phase::MajorRetransmit`] | stall | source and destination absent: each fault is major, so the transaction is terminated at once, the page paged in, and the transfer retransmitted |
//! | [`Phase::TerminateOnly`] | terminate | a stream that must never stall (as PCIe): minor faults are still terminated and retransmitted |
//! | [`Phase::MultiStall`] | stall | two channels fault at once on one context: the second fault sets FSR.MULTI and waits behind the first stall; MULTI makes both suspect, so both are sent again |
//! | [`Phase::MultiTerminate`] | terminate | the same with terminate: the second channel's fault is lost (MULTI), so it is suspect: its pages are resolved and it is sent again |
//! | [`Phase::OutsideRegion`] | stall | a source outside every registered region and a write to a read-only region: aborted, never mapped, destination untouched |
//! | [`Phase::Eviction`] | stall | a page is evicted (unmap + TLBIVA + TLBSYNC) and its frame reused; reading the old IOVA must fault, not return the new page's data |
//!
//! Before the phases, [`run`] checks that the SMMU translates at all
//! ([`Rig::check_translated`]): a transfer from an IOVA no table maps must fault in the
//! context bank its stream is routed to. On a ZynqMP whose SMMU was programmed through the
//! wrong security view (docs/mmu500.md §7a) the GDMA's traffic would bypass it, and the
//! phases would fail with errors that do not say why.
//!
//! The scenario returns counters per phase ([`PhaseReport`]) and checks invariants that hold
//! on any correct SMMU and DMA ([`PhaseReport::check`]); exact counts are asserted by the
//! host tests against the model.

mod rig;

use dma_engine::DmaError;
use dma_engine::zdma::{ChannelStatus, Transfer, ZdmaChannel, ZdmaConfig};
use hal::Iova;
use hal::delay::DelayNs;
use hal::dma::DmaMemory;
use hal::regs::RegisterBus;
use smmu_driver::SmmuError;
use smmu_driver::fault::{
    AccessKind, Attribution, FaultCost, FaultDecision, FaultHandler, InFlightAccess,
    StandardPolicy, StreamFaultConfig, StreamId, attribute,
};
use smmu_driver::pagetable::{PageTable, PageTableConfig};
use smmu_driver::v2::{
    ContextBank, ContextConfig, DriverConfig, FaultModel, ResumeAction, SmmuV2, StreamMatch,
    StreamMatchIndex, StreamRoute, UnmatchedStreams,
};

pub use crate::pager::{Fill, PagerStats, Residency, pattern_byte};

/// The scenario's pager: 32 pages in up to 8 regions, 32 frames, a store in DMA memory.
pub type Pager<'m, M> = crate::pager::Pager<'m, 'static, M, 32, 32>;
pub use rig::Rig;

use crate::{BoardError, Result};

const PAGE: u64 = 4096;
/// Where the scenario's IOVAs live: 0x2_0000_0000 (8 GiB), inside the 12 GiB from 4 GiB to
/// 16 GiB that the ZynqMP's system address map leaves reserved ([`crate::zynqmp::ADDRESS_MAP`],
/// UG1085 "System Addresses"; a test checks it). Not DDR, so a bypassed access there gets a
/// decode error instead of hitting memory (the program image sits in low DDR at 0x1000_0000,
/// where the window used to be).
pub const IOVA_HOLE: crate::zynqmp::Region = crate::zynqmp::Region {
    base: 0x2_0000_0000,
    size: 0x100_0000,
};

/// Byte written over every destination before a transfer.
pub const SENTINEL: u8 = 0xa5;
/// Frames per phase.
pub const FRAMES_PER_PHASE: usize = 16;
const MAX_SERVICE_PER_CALL: usize = 64;

/// One part of the scenario (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Phase {
    /// Minor faults on a stalling context: stall, resolve, resume.
    MinorStallResume,
    /// Major faults on a stalling context: terminate, page in, retransmit.
    MajorRetransmit,
    /// A terminate-only context (a stream that must never stall).
    TerminateOnly,
    /// Two channels fault at once on a stalling context (FSR.MULTI).
    MultiStall,
    /// Two channels fault at once on a terminating context (FSR.MULTI, a lost record).
    MultiTerminate,
    /// Faults outside every registered region, and writes to a read-only region: aborted.
    OutsideRegion,
    /// Eviction and frame reuse: the TLB must be invalidated.
    Eviction,
}

impl Phase {
    /// Every phase, in the order [`run`] runs them.
    pub const ALL: [Phase; 7] = [
        Phase::MinorStallResume,
        Phase::MajorRetransmit,
        Phase::TerminateOnly,
        Phase::MultiStall,
        Phase::MultiTerminate,
        Phase::OutsideRegion,
        Phase::Eviction,
    ];

    /// A short name for verdict lines.
    pub const fn name(self) -> &'static str {
        match self {
            Phase::MinorStallResume => "minor-stall-resume",
            Phase::MajorRetransmit => "major-retransmit",
            Phase::TerminateOnly => "terminate-only",
            Phase::MultiStall => "multi-stall",
            Phase::MultiTerminate => "multi-terminate",
            Phase::OutsideRegion => "outside-region",
            Phase::Eviction => "eviction",
        }
    }

    /// The context bank's fault model.
    pub const fn fault_model(self) -> FaultModel {
        match self {
            Phase::TerminateOnly | Phase::MultiTerminate => FaultModel::Terminate,
            _ => FaultModel::Stall,
        }
    }

    /// Whether the phase's streams are declared stall-tolerant.
    pub const fn stall_tolerant(self) -> bool {
        !matches!(self, Phase::TerminateOnly)
    }

    /// DMA channels the phase uses.
    pub const fn channels(self) -> usize {
        match self {
            Phase::MultiStall | Phase::MultiTerminate => 2,
            _ => 1,
        }
    }
}

/// What a phase counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Transfers completed and checked.
    pub transfers: u32,
    /// Bytes of completed transfers.
    pub bytes: u64,
    /// Context faults with a record.
    pub faults: u32,
    /// Of those, the records of a stalled transaction (FSR.SS).
    pub stalls: u32,
    /// Stalls of attempts already doomed (to be sent again or failed), terminated rather
    /// than resumed.
    pub doomed_stalls: u32,
    /// Stalled transactions resumed (retried).
    pub resumes: u32,
    /// Of those, the ones whose page had to be fetched (a major fault): the policy must never
    /// hold a stall that long.
    pub resumed_major: u32,
    /// Transfers sent again (after an AXI error, or a "done" that was not known good).
    pub retransmissions: u32,
    /// Of those, the ones sent again because a fault could not be ruled out, not because a
    /// fault attributed to them was terminated.
    pub suspect_resends: u32,
    /// Transfers aborted by the fault path.
    pub aborts: u32,
    /// Fault records with FSR.MULTI (lost syndromes).
    pub multi: u32,
    /// Faults that could not be attributed to one transfer (no stream or address in the
    /// syndrome, or one no transfer in flight covers): every transfer in flight was suspect.
    pub unattributed: u32,
    /// Pages made present for suspect transfers before they were sent again.
    pub prefaulted: u32,
    /// Minor resolutions.
    pub minor: u32,
    /// Major resolutions.
    pub major: u32,
    /// Pages evicted.
    pub evictions: u32,
}

impl Counters {
    /// Whether the SMMU stalled every fault it recorded and each was attributed to its
    /// transfer: what an MMU-500 does on a stalling context.
    pub fn stalled_and_attributed(&self) -> bool {
        self.faults > 0 && self.stalls == self.faults && self.unattributed == 0
    }

    fn add(&mut self, other: &Counters) {
        self.transfers += other.transfers;
        self.bytes += other.bytes;
        self.faults += other.faults;
        self.stalls += other.stalls;
        self.doomed_stalls += other.doomed_stalls;
        self.resumes += other.resumes;
        self.resumed_major += other.resumed_major;
        self.retransmissions += other.retransmissions;
        self.suspect_resends += other.suspect_resends;
        self.aborts += other.aborts;
        self.multi += other.multi;
        self.unattributed += other.unattributed;
        self.prefaulted += other.prefaulted;
        self.minor += other.minor;
        self.major += other.major;
        self.evictions += other.evictions;
    }
}

/// One phase's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PhaseReport {
    /// The phase.
    pub phase: Phase,
    /// Its counters.
    pub counters: Counters,
}

impl PhaseReport {
    /// Checks the invariants of the phase that hold on any correct SMMU and DMA engine (on
    /// silicon the exact counts may differ from the model's: a channel may have several reads
    /// outstanding, so more faults and MULTI may be seen).
    ///
    /// Where an SMMU reports less than an MMU-500 does (no syndrome, no stall: see
    /// docs/mmu500.md, "Fault attribution"), faults cannot be attributed or resumed and the
    /// transfers are sent again: the stall invariants apply only to a phase that saw stalls
    /// and attributed every fault ([`Counters::stalls`], [`Counters::unattributed`] say
    /// which). What a transfer ends with (its data, or the abort) is checked either way.
    pub fn check(&self) -> Result<()> {
        let c = &self.counters;
        let fail = |what| {
            Err(BoardError::InvariantViolated {
                phase: self.phase,
                what,
            })
        };
        match self.phase {
            Phase::MinorStallResume => {
                if c.transfers != 2 || c.faults == 0 || c.aborts != 0 || c.major != 0 {
                    return fail("minor faults must be resolved and both transfers complete");
                }
                if c.stalled_and_attributed() && (c.resumes == 0 || c.retransmissions != 0) {
                    return fail("minor faults within budget must be resumed, not retransmitted");
                }
            }
            Phase::MajorRetransmit => {
                if c.transfers != 1 || c.retransmissions == 0 || c.major == 0 {
                    return fail("major faults must be terminated and retransmitted");
                }
                if c.resumed_major != 0 || c.aborts != 0 {
                    return fail("a major fault must never be resumed");
                }
            }
            Phase::TerminateOnly => {
                if c.transfers != 1 || c.retransmissions == 0 {
                    return fail("terminated faults must be retransmitted");
                }
                if c.resumes != 0 {
                    return fail("a stream that must not stall was resumed");
                }
            }
            Phase::MultiStall => {
                if c.transfers != 2 || c.aborts != 0 {
                    return fail("both stalled channels must complete");
                }
                // Stalled faults are resumed: only a transfer that was suspect is sent again
                // (a lost syndrome makes both transfers in flight suspect).
                if c.stalled_and_attributed() && c.retransmissions != c.suspect_resends {
                    return fail("a stalled, attributed fault was retransmitted");
                }
            }
            Phase::MultiTerminate => {
                if c.transfers != 2 || c.resumes != 0 || c.retransmissions < 2 {
                    return fail("both terminated channels must retransmit and complete");
                }
            }
            Phase::OutsideRegion => {
                if c.aborts != 2 || c.transfers != 0 || c.resumes != 0 {
                    return fail("faults outside the regions must be aborted");
                }
            }
            Phase::Eviction => {
                if c.transfers != 2 || c.evictions == 0 || c.faults == 0 {
                    return fail("an evicted page must fault again");
                }
            }
        }
        Ok(())
    }
}

/// FSR's fault bits (IHI0062 `SMMU_CBn_FSR`: TF, AFF, PF, EF, TLBMCF, TLBLKF, ASF, UUT),
/// without MULTI and SS.
pub const FSR_FAULT_BITS: u32 = 0x1fe;

/// How the engine ended the check's transfer ([`Rig::check_translated`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineOutcome {
    /// The engine reported an error response (the SMMU terminated the access): the zDMA on
    /// silicon and in `sim`.
    BusError(DmaError),
    /// The engine said done (an engine that does not report error responses).
    Done,
}

/// The translation self-check's result: the fault the unmapped transfer raised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TranslationCheck {
    /// The stream checked (channel 0's).
    pub stream: StreamId,
    /// The index of the bank it was routed to.
    pub context: u16,
    /// The unmapped IOVA read.
    pub iova: u64,
    /// The bank's FSR as read.
    pub fsr: u32,
    /// The bank's FAR (0 on SMMUs that record no address).
    pub far: u64,
    /// How the engine ended the transfer.
    pub engine: EngineOutcome,
}

/// The scenario's result.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScenarioReport {
    /// The translation self-check run before the phases ([`Rig::check_translated`]).
    pub translation: Option<TranslationCheck>,
    /// One report per phase run.
    pub phases: heapless::Vec<PhaseReport, 8>,
}

impl ScenarioReport {
    /// The sum over all phases.
    pub fn total(&self) -> Counters {
        let mut total = Counters::default();
        for p in &self.phases {
            total.add(&p.counters);
        }
        total
    }

    /// The report of `phase`, if it ran.
    pub fn phase(&self, phase: Phase) -> Option<&PhaseReport> {
        self.phases.iter().find(|p| p.phase == phase)
    }
}

/// Scenario settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScenarioConfig {
    /// The phases to run, in order.
    pub phases: &'static [Phase],
    /// What the pager estimates a minor fault costs (ns).
    pub minor_fault_ns: u64,
    /// Stall budget of the stall-tolerant streams (ns).
    pub stall_budget_ns: u64,
    /// Attempts per transfer before giving up.
    pub max_attempts: u32,
    /// How long a transfer may make no progress (us).
    pub dma_timeout_us: u64,
    /// Poll interval (us).
    pub poll_interval_us: u32,
    /// First IOVA of the phases' regions (4 KiB aligned, below 2^48 - 16 MiB). Keep the
    /// window in a physical-address hole ([`IOVA_HOLE`]), so that a transaction the SMMU
    /// does not translate (a bypassed stream) gets a decode error instead of reaching memory.
    pub iova_base: u64,
    /// Whether the DMA engine reports an error response and stops there (as the zDMA does,
    /// UG1085 "DMA Controller": the channel reports the AXI error and goes to its error
    /// state). An engine that carries on (QEMU's model) completes transfers whose accesses
    /// were terminated, and may write the destination of a transfer that is aborted. With
    /// `false` a "done" is trusted only if the bank reported no fault while the transfer was
    /// in flight, and an aborted transfer's destination is not required untouched. The
    /// scenario also turns this off by itself the first time an engine reports done for a
    /// transfer that cannot have succeeded.
    pub engine_reports_bus_errors: bool,
}

impl ScenarioConfig {
    /// All phases; minor faults estimated at 2 us against a 20 us stall budget.
    pub const DEFAULT: ScenarioConfig = ScenarioConfig {
        phases: &Phase::ALL,
        minor_fault_ns: 2_000,
        stall_budget_ns: 20_000,
        max_attempts: 8,
        dma_timeout_us: 100_000,
        poll_interval_us: 1,
        iova_base: IOVA_HOLE.base,
        engine_reports_bus_errors: true,
    };
}

impl Default for ScenarioConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What the scenario runs on: the MMU-500's register window, two zDMA channel windows with
/// their stream IDs, DMA memory (page tables, frames, backing store) and a delay.
#[derive(Debug)]
pub struct Machine<'m, S, Z, M, D> {
    /// The MMU-500 window (0xFD80_0000, 128 KiB on ZynqMP).
    pub smmu: S,
    /// Two zDMA channel windows.
    pub channels: [Z; 2],
    /// Their stream IDs.
    pub streams: [StreamId; 2],
    /// DMA memory the SMMU and the channels can reach.
    pub dma: &'m M,
    /// Delay for bounded polls.
    pub delay: D,
}

impl<'m, S, Z, M, D> Machine<'m, S, Z, M, D> {
    /// A ZynqMP machine using GDMA channels 0 and 1 (stream IDs 0x14E8 and 0x14E9).
    pub fn zynqmp(smmu: S, gdma0: Z, gdma1: Z, dma: &'m M, delay: D) -> Self {
        Machine {
            smmu,
            channels: [gdma0, gdma1],
            streams: [super::GDMA[0].stream, super::GDMA[1].stream],
            dma,
            delay,
        }
    }
}

/// Probes and resets the SMMU, checks that channel 0's stream is translated
/// ([`Rig::check_translated`]: one unmapped transfer must fault in its bank) and runs
/// `config.phases` on `machine`.
pub fn run<S, Z, M, D>(
    machine: Machine<'_, S, Z, M, D>,
    config: &ScenarioConfig,
) -> Result<ScenarioReport>
where
    S: RegisterBus,
    Z: RegisterBus,
    M: DmaMemory,
    D: DelayNs + Clone,
{
    let mut rig = Rig::new(machine, config)?;
    let translation = rig.check_translated()?;
    let mut report = rig.run_all()?;
    report.translation = Some(translation);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zynqmp::{AddressWindow, window_of};

    #[test]
    fn the_iova_window_is_a_hole_of_the_address_map() {
        assert_eq!(window_of(IOVA_HOLE), Some(AddressWindow::Reserved));
        assert_eq!(ScenarioConfig::DEFAULT.iova_base, IOVA_HOLE.base);
    }
}
