//! The scenario's rig: its drivers, the phases' set-up and tear-down, and what each phase does.

mod attribution;
mod transfer;
mod translated;

use super::*;

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
            implementation: crate::zynqmp::SMMU.implementation,
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
        let pager = Pager::new(
            self.dma,
            FRAMES_PER_PHASE,
            self.config.minor_fault_ns,
            crate::pager::Store::Dma,
        )?;
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
