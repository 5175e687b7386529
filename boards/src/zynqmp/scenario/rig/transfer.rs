//! Running transfers: starting them, servicing the bank's faults with attribution, and
//! ending each attempt (complete, re-sent or aborted).

use super::attribution::Attributor;
use super::*;

impl<'m, S, Z, M, D> Rig<'m, S, Z, M, D>
where
    S: RegisterBus,
    Z: RegisterBus,
    M: DmaMemory,
    D: DelayNs + Clone,
{
    pub(super) fn start(&mut self, phase: Phase, spec: &Spec) -> Result<()> {
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
    pub(super) fn transfer_batch(
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
    pub(super) fn end_attempt(
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
    pub(super) fn resolve_suspect(
        &mut self,
        space: &mut Space<'m, M>,
        s: &Spec,
    ) -> Result<Option<SmmuError>> {
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
    /// The fault service's loop ([`FaultHandler::service_pending`]) with the scenario's
    /// [`Attributor`]: each record is attributed first (docs/mmu500.md §2.3); only an
    /// attributed record is serviced; an unattributed one makes every transfer in flight
    /// suspect, and its stalled transaction (if any) is terminated without deciding anything
    /// on its stream or address.
    pub(super) fn service(
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
        let mut visitor = Attributor {
            specs,
            running,
            streams: self.streams,
            counters: &mut space.counters,
            owner: None,
        };
        let taken = self.handler.service_pending(
            &mut self.smmu,
            &mut space.pager,
            &mut space.table,
            MAX_SERVICE_PER_CALL,
            &mut visitor,
        )?;
        Ok(taken > 0)
    }
}
