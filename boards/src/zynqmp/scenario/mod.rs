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
//! The scenario returns counters per phase ([`PhaseReport`]) and checks invariants that hold
//! on any correct SMMU and DMA ([`PhaseReport::check`]); exact counts are asserted by the
//! host tests against the model.

pub mod pager;

use dma_engine::DmaError;
use dma_engine::zdma::{ChannelStatus, Transfer, ZdmaChannel, ZdmaConfig};
use hal::Iova;
use hal::delay::DelayNs;
use hal::dma::DmaMemory;
use hal::regs::RegisterBus;
use smmu_driver::SmmuError;
use smmu_driver::fault::{
    AccessKind, Attribution, FaultControl, FaultCost, FaultDecision, FaultHandler, InFlightAccess,
    StandardPolicy, StreamFaultConfig, StreamId, attribute,
};
use smmu_driver::pagetable::{PageTable, PageTableConfig};
use smmu_driver::v2::{
    ContextBank, ContextConfig, DriverConfig, FaultModel, ResumeAction, SmmuV2, StreamMatch,
    StreamMatchIndex, StreamRoute, UnmatchedStreams,
};

pub use pager::{Fill, Pager, PagerStats, Residency, pattern_byte};

use crate::{BoardError, Result};

const PAGE: u64 = 4096;
/// Where the scenario's IOVAs live: 0x2_0000_0000 (8 GiB), inside the 12 GiB from 4 GiB to
/// 16 GiB that UG1085's system address map (table "System Address Map", chapter "System
/// Addresses") leaves reserved between the low peripheral windows and the PL's high
/// window at 0x4_0000_0000; U-Boot's `zynqmp_mem_map` (arch/arm/mach-zynqmp/cpu.c) maps
/// nothing there either. Not DDR, so a bypassed access there cannot hit memory (the
/// program image sits in low DDR at 0x1000_0000, where the window used to be).
pub const IOVA_HOLE: crate::zynqmp::Region = crate::zynqmp::Region {
    base: 0x2_0000_0000,
    size: 0x100_0000,
};

const _: () =
    assert!(IOVA_HOLE.base >= 0x1_0000_0000 && IOVA_HOLE.base + IOVA_HOLE.size <= 0x4_0000_0000);

/// Byte written over every destination before a transfer.
pub const SENTINEL: u8 = 0xa5;
/// Frames per phase.
pub const FRAMES_PER_PHASE: usize = 16;
const MAX_SERVICE_PER_CALL: usize = 64;

/// One part of the scenario (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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

/// The scenario's result.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScenarioReport {
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

/// Runs `config.phases` on `machine`.
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
    rig.run_all()
}

/// How a transfer ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Completed,
    Aborted(SmmuError),
}

/// One transfer of a batch.
#[derive(Clone, Copy, Debug)]
struct Spec {
    channel: usize,
    src: u64,
    dst: u64,
    len: u32,
}

/// What the fault path said about a running transfer (in its current attempt).
#[derive(Clone, Copy, Debug, Default)]
struct FaultLog {
    /// A fault attributed to the transfer was terminated: its engine saw an abort.
    terminated: bool,
    /// A fault that could not be attributed (or FSR.MULTI) was seen while the attempt was in
    /// flight: its data cannot be trusted, whatever its engine reports.
    suspect: bool,
    /// The fault path refused a fault attributed to the transfer.
    abort: Option<SmmuError>,
    /// Fault records taken while the attempt was in flight.
    faults: u32,
    /// Whether the bank reported any fault while the attempt was in flight.
    bank_faulted: bool,
    /// Whether it reported one attributed to another transfer: without FSR.MULTI (which
    /// simpler models lack) it may have replaced a record of this one.
    foreign_fault: bool,
}

impl FaultLog {
    /// Whether the attempt must be sent again rather than reported complete.
    fn needs_resend(&self) -> bool {
        self.terminated || self.suspect
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Running {
    attempts: u32,
    outcome: Option<Outcome>,
    log: FaultLog,
}

/// A phase's address space: page table, pager and context bank.
struct Space<'m, M: DmaMemory> {
    table: PageTable<&'m M>,
    pager: Pager<'m, M>,
    cb: ContextBank,
    counters: Counters,
    transfers: u32,
}

/// The scenario's drivers, kept between phases. Tests use it to run single phases and to
/// reach the SMMU driver between [`Rig::new`] and [`Rig::run_phase`].
pub struct Rig<'m, S, Z, M, D> {
    smmu: SmmuV2<S, D>,
    channels: [ZdmaChannel<Z, D>; 2],
    streams: [StreamId; 2],
    dma: &'m M,
    delay: D,
    config: ScenarioConfig,
    handler: FaultHandler<StandardPolicy>,
    /// [`ScenarioConfig::engine_reports_bus_errors`], until an engine shows otherwise.
    engine_reports_bus_errors: bool,
}

impl<'m, S, Z, M, D> Rig<'m, S, Z, M, D>
where
    S: RegisterBus,
    Z: RegisterBus,
    M: DmaMemory,
    D: DelayNs + Clone,
{
    /// Probes and resets the SMMU (unmatched streams fault) and initialises both channels.
    pub fn new(machine: Machine<'m, S, Z, M, D>, config: &ScenarioConfig) -> Result<Self> {
        let Machine {
            smmu,
            channels,
            streams,
            dma,
            delay,
        } = machine;
        if config.iova_base & (PAGE - 1) != 0 || config.iova_base > (1 << 48) - 0x100_0000 {
            return Err(SmmuError::InvalidConfig {
                what: "scenario iova_base must be 4 KiB aligned and below 2^48 - 16 MiB",
            }
            .into());
        }
        let driver_config = DriverConfig {
            implementation: super::SMMU.implementation,
            unmatched: UnmatchedStreams::Fault,
            poll_interval_us: config.poll_interval_us,
            ..DriverConfig::DEFAULT
        };
        let mut smmu = SmmuV2::probe(smmu, delay.clone(), driver_config)?;
        smmu.reset()?;
        let zdma = ZdmaConfig {
            timeout_us: config.dma_timeout_us,
            poll_interval_us: config.poll_interval_us,
            ..ZdmaConfig::DEFAULT
        };
        let [c0, c1] = channels;
        let mut channels = [
            ZdmaChannel::new(c0, delay.clone(), zdma)?,
            ZdmaChannel::new(c1, delay.clone(), zdma)?,
        ];
        for ch in &mut channels {
            ch.init()?;
        }
        Ok(Rig {
            smmu,
            channels,
            streams,
            dma,
            delay,
            config: *config,
            handler: FaultHandler::new(StandardPolicy::Hybrid),
            engine_reports_bus_errors: config.engine_reports_bus_errors,
        })
    }

    /// The SMMU driver.
    pub fn smmu(&self) -> &SmmuV2<S, D> {
        &self.smmu
    }

    /// The SMMU driver, mutable.
    pub fn smmu_mut(&mut self) -> &mut SmmuV2<S, D> {
        &mut self.smmu
    }

    /// The fault handler's counters (accumulated over every phase).
    pub fn handler_stats(&self) -> &smmu_driver::fault::FaultStats {
        self.handler.stats()
    }

    /// Runs every configured phase and checks each report's invariants.
    pub fn run_all(&mut self) -> Result<ScenarioReport> {
        let mut report = ScenarioReport::default();
        for &phase in self.config.phases {
            let r = self.run_phase(phase)?;
            report
                .phases
                .push(r)
                .map_err(|_| BoardError::InvariantViolated {
                    phase,
                    what: "more than 8 phases",
                })?;
        }
        Ok(report)
    }

    /// Runs one phase on a fresh context bank and page table, tears them down, and checks the
    /// phase's invariants.
    pub fn run_phase(&mut self, phase: Phase) -> Result<PhaseReport> {
        let output_bits = self.smmu.capabilities().output_bits.min(48);
        let table = PageTable::new(
            self.dma,
            PageTableConfig {
                output_bits,
                chunk_pages: 4,
                max_chunks: 4,
            },
        )?;
        let pager = Pager::new(self.dma, FRAMES_PER_PHASE, self.config.minor_fault_ns)?;
        let context = ContextConfig::new(table.root(), &table.walk_config(), phase.fault_model());
        let cb = self.smmu.alloc_context(&context)?;
        let fault = if phase.stall_tolerant() {
            StreamFaultConfig::stall_tolerant(self.config.stall_budget_ns)
        } else {
            StreamFaultConfig::NEVER_STALL
        };
        let mut entries: [Option<StreamMatchIndex>; 2] = [None, None];
        let mut attached = Ok(());
        for (i, entry) in entries.iter_mut().enumerate().take(phase.channels()) {
            match self.smmu.attach(
                StreamMatch::exact(self.streams[i].0 as u16),
                StreamRoute::Translate(cb),
                fault,
            ) {
                Ok(e) => *entry = Some(e),
                Err(e) => {
                    attached = Err(e);
                    break;
                }
            }
        }
        let mut space = Space {
            table,
            pager,
            cb,
            counters: Counters::default(),
            transfers: 0,
        };
        let body = match attached {
            Ok(()) => self.phase_body(phase, &mut space),
            Err(e) => Err(e.into()),
        };
        // Tear down even after a failure, so a later phase starts clean: first the channels
        // a failed phase left running are brought to an end while their context still
        // exists (their later accesses would otherwise be unmatched streams: global faults).
        let mut teardown: Result<()> = self.quiesce_channels(cb);
        for e in entries.into_iter().flatten() {
            if let Err(err) = self.smmu.detach(e) {
                teardown = Err(err.into());
            }
        }
        if let Err(err) = self.smmu.free_context(cb) {
            teardown = Err(err.into());
        }
        body?;
        teardown?;
        let report = PhaseReport {
            phase,
            counters: space.counters,
        };
        report.check()?;
        Ok(report)
    }

    /// Ends every transfer still running (after a failed phase body): terminates whatever
    /// the context has stalled, since the phase is over and resolves nothing more, so each
    /// channel stops with an AXI error or finishes, within the DMA timeout.
    fn quiesce_channels(&mut self, cb: ContextBank) -> Result<()> {
        let mut waited = 0u64;
        let mut last_error = None;
        loop {
            // A stall the body left pending (its RESUME failed) first, then new faults.
            if self.smmu.stall_pending(cb)?
                && let Err(e) = self.smmu.resume(cb, ResumeAction::Terminate)
            {
                last_error = Some(e);
            }
            for _ in 0..MAX_SERVICE_PER_CALL {
                let Some(fault) = self.smmu.take_context_fault(cb)? else {
                    break;
                };
                if fault.stalled()
                    && let Err(e) = self.smmu.resume(cb, ResumeAction::Terminate)
                {
                    last_error = Some(e);
                }
            }
            let mut busy = None;
            for ch in &mut self.channels {
                if ch.is_running() && matches!(ch.poll(), Ok(ChannelStatus::Busy)) {
                    busy = Some(ch.bytes_transferred()?);
                }
            }
            let Some(bytes) = busy else {
                return Ok(());
            };
            if waited >= self.config.dma_timeout_us {
                return Err(match last_error {
                    Some(e) => e.into(),
                    None => DmaError::Timeout {
                        waited_us: waited,
                        bytes,
                    }
                    .into(),
                });
            }
            let interval = self.config.poll_interval_us.max(1);
            self.delay.delay_us(interval);
            waited += u64::from(interval);
        }
    }

    fn src(&self, stream: usize) -> u64 {
        self.config.iova_base + stream as u64 * 0x20_0000
    }

    fn dst(&self, stream: usize) -> u64 {
        self.src(stream) + 0x10_0000
    }

    fn read_only(&self) -> u64 {
        self.config.iova_base + 0x40_0000
    }

    fn outside(&self) -> u64 {
        self.config.iova_base + 0x80_0000
    }

    /// Registers a source (pattern) and a destination region of `stream`.
    fn regions(
        &self,
        space: &mut Space<'m, M>,
        stream: usize,
        src_pages: usize,
        dst_pages: usize,
    ) -> Result<(u64, u64)> {
        let (src, dst) = (self.src(stream), self.dst(stream));
        let id = self.streams[stream];
        space.pager.add_region(
            id,
            Iova::new(src),
            src_pages,
            true,
            Fill::Pattern(stream as u8 + 1),
        )?;
        space
            .pager
            .add_region(id, Iova::new(dst), dst_pages, true, Fill::Byte(0))?;
        Ok((src, dst))
    }

    fn map_now(&mut self, space: &mut Space<'m, M>, iova: u64) -> Result<()> {
        let mut tlb = self.smmu.tlb(space.cb)?;
        space
            .pager
            .map_now(Iova::new(iova), &mut space.table, &mut tlb)
    }

    fn phase_body(&mut self, phase: Phase, space: &mut Space<'m, M>) -> Result<()> {
        match phase {
            Phase::MinorStallResume => {
                let (src, dst) = self.regions(space, 0, 4, 4)?;
                for p in 0..4 {
                    space.pager.make_resident(Iova::new(src + p * PAGE))?;
                    self.map_now(space, dst + p * PAGE)?;
                }
                // Touches all four source pages (offset 0x80 + 3 pages).
                self.copy(
                    phase,
                    space,
                    &[spec(0, src + 0x80, dst + 0x80, 3 * PAGE as u32)],
                )?;
                self.copy(
                    phase,
                    space,
                    &[spec(0, src + 0x40, dst + 0x100, 2 * PAGE as u32 + 0x20)],
                )?;
            }
            Phase::MajorRetransmit => {
                let (src, dst) = self.regions(space, 0, 2, 2)?;
                self.copy(phase, space, &[spec(0, src, dst, 2 * PAGE as u32)])?;
            }
            Phase::TerminateOnly => {
                let (src, dst) = self.regions(space, 0, 2, 2)?;
                for p in 0..2 {
                    space.pager.make_resident(Iova::new(src + p * PAGE))?;
                    self.map_now(space, dst + p * PAGE)?;
                }
                self.copy(phase, space, &[spec(0, src, dst, 2 * PAGE as u32)])?;
            }
            Phase::MultiStall | Phase::MultiTerminate => {
                let (s0, d0) = self.regions(space, 0, 1, 1)?;
                let (s1, d1) = self.regions(space, 1, 1, 1)?;
                for (s, d) in [(s0, d0), (s1, d1)] {
                    space.pager.make_resident(Iova::new(s))?;
                    self.map_now(space, d)?;
                }
                self.copy(
                    phase,
                    space,
                    &[spec(0, s0, d0, PAGE as u32), spec(1, s1, d1, PAGE as u32)],
                )?;
            }
            Phase::OutsideRegion => {
                let (src, dst) = self.regions(space, 0, 1, 1)?;
                let ro = self.read_only();
                let ro_fill = Fill::Pattern(9);
                space
                    .pager
                    .add_region(self.streams[0], Iova::new(ro), 1, false, ro_fill)?;
                self.map_now(space, src)?;
                self.map_now(space, dst)?;
                // A source outside every region: aborted, never mapped, nothing written.
                let outside = self.outside();
                self.expect_abort(phase, space, spec(0, outside, dst, PAGE as u32))?;
                if self.engine_reports_bus_errors {
                    Self::expect_untouched(phase, space, dst)?;
                }
                if space.table.translate(Iova::new(outside))?.is_some() {
                    return Err(BoardError::ForbiddenMapping {
                        phase,
                        iova: Iova::new(outside),
                    });
                }
                // A write into a read-only region: aborted, nothing written (the CPU filled it
                // with the sentinel before the transfer).
                self.expect_abort(phase, space, spec(0, src, ro, PAGE as u32))?;
                Self::expect_untouched(phase, space, ro)?;
            }
            Phase::Eviction => {
                let (src, dst) = self.regions(space, 0, 2, 1)?;
                let (a, b) = (src, src + PAGE);
                self.map_now(space, dst)?;
                self.map_now(space, a)?;
                // The SMMU caches A's translation.
                self.copy(phase, space, &[spec(0, a, dst, PAGE as u32)])?;
                let evicted_before = space.pager.stats().evictions;
                {
                    let mut tlb = self.smmu.tlb(space.cb)?;
                    space
                        .pager
                        .evict(Iova::new(a), &mut space.table, &mut tlb)?;
                }
                space.counters.evictions += space.pager.stats().evictions - evicted_before;
                // B takes A's old frame.
                self.map_now(space, b)?;
                // Reading A again must fault and page A back in, not read B's data.
                self.copy(phase, space, &[spec(0, a, dst, PAGE as u32)])?;
            }
        }
        Ok(())
    }

    /// Runs transfers that must complete.
    fn copy(&mut self, phase: Phase, space: &mut Space<'m, M>, specs: &[Spec]) -> Result<()> {
        let outcomes = self.transfer_batch(phase, space, specs)?;
        for (i, outcome) in outcomes.iter().take(specs.len()).enumerate() {
            if let Some(Outcome::Aborted(error)) = outcome {
                return Err(BoardError::UnexpectedAbort {
                    phase,
                    transfer: space.transfers - specs.len() as u32 + i as u32 + 1,
                    error: *error,
                });
            }
        }
        Ok(())
    }

    /// Checks that the page at `iova` still holds the sentinel the CPU filled it with (an
    /// aborted transfer wrote nothing there).
    fn expect_untouched(phase: Phase, space: &Space<'m, M>, iova: u64) -> Result<()> {
        match space
            .pager
            .first_difference_from(Iova::new(iova), PAGE, Fill::Byte(SENTINEL))?
        {
            Some((offset, expected, found)) => Err(BoardError::DataMismatch {
                phase,
                transfer: space.transfers,
                offset: offset as u32,
                expected,
                found,
            }),
            None => Ok(()),
        }
    }

    /// Runs a transfer that the fault path must abort.
    fn expect_abort(&mut self, phase: Phase, space: &mut Space<'m, M>, spec: Spec) -> Result<()> {
        let outcomes = self.transfer_batch(phase, space, &[spec])?;
        match outcomes[0] {
            Some(Outcome::Aborted(_)) => Ok(()),
            _ => Err(BoardError::MissingAbort {
                phase,
                transfer: space.transfers,
            }),
        }
    }

    fn start(&mut self, phase: Phase, spec: &Spec) -> Result<()> {
        let channel = self
            .channels
            .get_mut(spec.channel)
            .ok_or(BoardError::InvariantViolated {
                phase,
                what: "channel index",
            })?;
        channel.start(&Transfer {
            src: spec.src,
            dst: spec.dst,
            len: spec.len,
        })?;
        Ok(())
    }

    /// Starts up to two transfers at once and drives them to an end: services SMMU faults,
    /// polls the channels, retransmits after AXI errors the fault path explains, checks data.
    fn transfer_batch(
        &mut self,
        phase: Phase,
        space: &mut Space<'m, M>,
        specs: &[Spec],
    ) -> Result<[Option<Outcome>; 2]> {
        let n = specs.len().min(2);
        let mut running = [Running::default(); 2];
        let first_number = space.transfers + 1;
        space.transfers += n as u32;
        for i in 0..n {
            let s = &specs[i];
            space
                .pager
                .fill(Iova::new(s.dst), u64::from(s.len), Fill::Byte(SENTINEL))?;
            running[i].attempts = 1;
            self.start(phase, s)?;
        }
        let mut waited = 0u64;
        loop {
            let mut progressed = self.service(space, specs, &mut running)?;
            for (i, (r, s)) in running.iter().zip(specs).take(n).enumerate() {
                if r.outcome.is_none() && r.log.faults > s.fault_limit() {
                    return Err(BoardError::FaultStorm {
                        phase,
                        transfer: first_number + i as u32,
                        faults: r.log.faults,
                    });
                }
            }
            for i in 0..n {
                if running[i].outcome.is_some() {
                    continue;
                }
                let s = specs[i];
                let number = first_number + i as u32;
                match self.channels[s.channel].poll() {
                    Ok(ChannelStatus::Busy) => {}
                    Ok(ChannelStatus::Idle) => {
                        return Err(BoardError::InvariantViolated {
                            phase,
                            what: "a transfer's channel was idle",
                        });
                    }
                    Ok(ChannelStatus::Done(_)) => {
                        progressed = true;
                        // A fault that explains why this "done" is not to be trusted may not
                        // have been serviced yet.
                        self.service(space, specs, &mut running)?;
                        let mut log = running[i].log;
                        if log.abort.is_some() || log.terminated {
                            // One of its accesses was terminated, yet it is "done": this
                            // engine does not report error responses.
                            self.engine_reports_bus_errors = false;
                        }
                        if !self.engine_reports_bus_errors && log.foreign_fault {
                            log.suspect = true;
                            running[i].log.suspect = true;
                        }
                        if log.abort.is_some() || log.needs_resend() {
                            self.end_attempt(phase, space, &s, &mut running[i], number)?;
                            if matches!(running[i].outcome, Some(Outcome::Aborted(_))) {
                                // Done, although a page it needs is refused.
                                self.engine_reports_bus_errors = false;
                            }
                            continue;
                        }
                        if let Some((offset, expected, found)) = space.pager.first_difference(
                            Iova::new(s.src),
                            Iova::new(s.dst),
                            u64::from(s.len),
                        )? {
                            return Err(BoardError::DataMismatch {
                                phase,
                                transfer: number,
                                offset: offset as u32,
                                expected,
                                found,
                            });
                        }
                        running[i].outcome = Some(Outcome::Completed);
                        space.counters.transfers += 1;
                        space.counters.bytes += u64::from(s.len);
                    }
                    Err(error) if error.is_retransmittable() => {
                        progressed = true;
                        // The record explaining the error may not have been serviced yet.
                        self.service(space, specs, &mut running)?;
                        let log = running[i].log;
                        if log.abort.is_none() && !log.needs_resend() {
                            if !log.bank_faulted {
                                return Err(BoardError::UnexplainedAxiError {
                                    phase,
                                    transfer: number,
                                    error,
                                });
                            }
                            // The bank faulted, but no record names this transfer: an SMMU
                            // without MULTI replaced its record with a later one.
                            running[i].log.suspect = true;
                        }
                        self.end_attempt(phase, space, &s, &mut running[i], number)?;
                    }
                    Err(error) => return Err(error.into()),
                }
            }
            if running[..n].iter().all(|r| r.outcome.is_some()) {
                break;
            }
            if !progressed {
                if waited >= self.config.dma_timeout_us {
                    let stuck = (0..n)
                        .find(|&i| running[i].outcome.is_none())
                        .map_or(specs[0].channel, |i| specs[i].channel);
                    let bytes = self.channels[stuck].bytes_transferred()?;
                    return Err(DmaError::Timeout {
                        waited_us: waited,
                        bytes,
                    }
                    .into());
                }
                let interval = self.config.poll_interval_us.max(1);
                self.delay.delay_us(interval);
                waited += u64::from(interval);
            } else {
                waited = 0;
            }
        }
        Ok([running[0].outcome, running[1].outcome])
    }

    /// Ends an attempt that is not known to be good: an abort the fault path decided fails
    /// the transfer; otherwise (a terminated or a suspect attempt) the transfer is sent again,
    /// a suspect one after its pages were made present through the fault path, since its own
    /// fault may have left no usable record.
    fn end_attempt(
        &mut self,
        phase: Phase,
        space: &mut Space<'m, M>,
        s: &Spec,
        running: &mut Running,
        number: u32,
    ) -> Result<()> {
        let log = running.log;
        let abort = match log.abort {
            Some(abort) => Some(abort),
            None if log.suspect => self.resolve_suspect(space, s)?,
            None => None,
        };
        if let Some(abort) = abort {
            running.outcome = Some(Outcome::Aborted(abort));
            space.counters.aborts += 1;
            return Ok(());
        }
        if running.attempts >= self.config.max_attempts {
            return Err(BoardError::RetransmitLimit {
                phase,
                transfer: number,
                attempts: running.attempts,
            });
        }
        running.attempts += 1;
        running.log = FaultLog::default();
        space.counters.retransmissions += 1;
        if log.suspect && !log.terminated {
            space.counters.suspect_resends += 1;
        }
        // The sentinel again: the failed attempt may have written part of the destination,
        // which a retransmission that skipped it would otherwise pass off as its own work.
        space
            .pager
            .fill(Iova::new(s.dst), u64::from(s.len), Fill::Byte(SENTINEL))?;
        self.start(phase, s)
    }

    /// Makes every page of a suspect transfer present (source for reading, destination for
    /// writing) through the fault handler. Returns the fault path's refusal, if any: the
    /// transfer then fails with it.
    fn resolve_suspect(&mut self, space: &mut Space<'m, M>, s: &Spec) -> Result<Option<SmmuError>> {
        let stream = self.streams[s.channel];
        let config = self.smmu.stream_fault_config(stream);
        let smmu = self.smmu.smmu_id();
        let len = u64::from(s.len);
        for (start, access) in [(s.src, AccessKind::Read), (s.dst, AccessKind::Write)] {
            let range = InFlightAccess {
                stream,
                start: Iova::new(start),
                len,
            };
            let mut tlb = self.smmu.tlb(space.cb)?;
            let done = self.handler.resolve_range(
                smmu,
                &range,
                access,
                &config,
                &mut space.pager,
                &mut space.table,
                &mut tlb,
            )?;
            space.counters.prefaulted += done.mapped;
            space.counters.minor += done.minor;
            space.counters.major += done.major;
            if done.abort.is_some() {
                return Ok(done.abort);
            }
        }
        Ok(None)
    }

    /// Services every pending fault of the phase's context; returns whether there was one.
    ///
    /// Each record is attributed first (docs/mmu500.md §2.3). Only an attributed record goes
    /// through the fault service ([`FaultHandler::service`]); an unattributed one makes every
    /// transfer in flight suspect, and its stalled transaction (if any) is terminated without
    /// deciding anything on its stream or address.
    fn service(
        &mut self,
        space: &mut Space<'m, M>,
        specs: &[Spec],
        running: &mut [Running; 2],
    ) -> Result<bool> {
        // A global fault ends the phase (a stream the phase did not route, a bad context).
        if let Some(g) = self.smmu.take_global_fault()? {
            return Err(BoardError::GlobalFault {
                gfsr: g.gfsr,
                stream: g.stream().0,
            });
        }
        let mut any = false;
        for _ in 0..MAX_SERVICE_PER_CALL {
            let Some(fault) = self.smmu.take_context_fault(space.cb)? else {
                break;
            };
            any = true;
            let n = specs.len().min(2);
            // What is in flight: each running transfer's source and destination.
            // At most two transfers of two ranges each, so the pushes cannot fail.
            let mut ranges: heapless::Vec<InFlightAccess, 4> = heapless::Vec::new();
            let mut transfer_of: heapless::Vec<usize, 4> = heapless::Vec::new();
            for (i, s) in specs.iter().enumerate().take(n) {
                if running[i].outcome.is_some() {
                    continue;
                }
                let stream = self.streams[s.channel];
                for start in [s.src, s.dst] {
                    let _ = ranges.push(InFlightAccess {
                        stream,
                        start: Iova::new(start),
                        len: u64::from(s.len),
                    });
                    let _ = transfer_of.push(i);
                }
            }
            let owner = match attribute(fault.record.as_ref(), &ranges) {
                Attribution::Access(k) => transfer_of.get(k).copied(),
                Attribution::Bank(_) => None,
            };
            if owner.is_none() {
                space.counters.unattributed += 1;
            }
            for (i, r) in running[..n].iter_mut().enumerate() {
                if r.outcome.is_none() {
                    r.log.bank_faulted = true;
                    r.log.foreign_fault |= owner.is_some_and(|o| o != i);
                }
            }
            if fault.multi() {
                space.counters.multi += 1;
            }
            if owner.is_none() || fault.multi() {
                // Some fault's stream or address is unknown: every transfer in flight on the
                // bank is suspect (docs/mmu500.md §2.3).
                for r in running[..n].iter_mut().filter(|r| r.outcome.is_none()) {
                    r.log.suspect = true;
                }
            }
            // A stalled transaction without a record (FSR.MULTI with SS) waits for the RESUME
            // of the record taken before it, which the fault service writes.
            let Some(record) = fault.record else {
                continue;
            };
            space.counters.faults += 1;
            if fault.stalled() {
                space.counters.stalls += 1;
            }
            // A fault no running transfer explains counts against all of them, towards a
            // fault storm; an attempt already doomed (aborted, terminated or suspect) is not
            // counted: an engine that carries on after an error response faults on each of
            // its remaining bursts, and the attempt ends with the transfer anyway.
            for (i, r) in running[..n].iter_mut().enumerate() {
                let doomed = r.log.abort.is_some() || r.log.needs_resend();
                if r.outcome.is_none() && !doomed && owner.is_none_or(|o| o == i) {
                    r.log.faults += 1;
                }
            }
            let Some(owner) = owner else {
                // Nobody's fault: nothing is decided on its stream or address.
                if record.is_stalled() {
                    self.smmu.answer_stall(&record, false)?;
                }
                continue;
            };
            let outcome = self.handler.service(
                &mut self.smmu,
                &record,
                &mut space.pager,
                &mut space.table,
            )?;
            match outcome.mapped.map(|p| p.cost) {
                Some(FaultCost::Minor) => space.counters.minor += 1,
                Some(FaultCost::Major) => space.counters.major += 1,
                None => {}
            }
            match outcome.decision {
                FaultDecision::Resume => {
                    space.counters.resumes += 1;
                    if outcome.mapped.is_some_and(|p| p.cost == FaultCost::Major) {
                        space.counters.resumed_major += 1;
                    }
                }
                FaultDecision::TerminateAndRetransmit => running[owner].log.terminated = true,
                FaultDecision::Abort(error) => running[owner].log.abort = Some(error),
            }
        }
        Ok(any)
    }
}

impl Spec {
    /// Most fault records one attempt may take before the scenario calls it a fault storm.
    /// A correct fault path maps each page once per attempt, so an attempt faults about once
    /// per page it touches (on silicon a few more: several reads may be outstanding); far
    /// more means a fault that comes back after every resolution, e.g. a mapping the SMMU
    /// does not see, which would otherwise be resumed forever, since resumes are progress.
    fn fault_limit(&self) -> u32 {
        let pages = |start: u64| {
            let end = start.saturating_add(u64::from(self.len.max(1)) - 1);
            (end / PAGE - start / PAGE + 1) as u32
        };
        4 * (pages(self.src) + pages(self.dst)) + 4
    }
}

const fn spec(channel: usize, src: u64, dst: u64, len: u32) -> Spec {
    Spec {
        channel,
        src,
        dst,
        len,
    }
}
