//! The event queue: draining, decoding and overflow (IHI0070 §7.2, §7.4).

use super::*;

/// The stalled transaction of a record the driver rejected, to be terminated.
type RejectedStall = Option<(StreamId, StallTag)>;

impl<'a, B: RegisterBus + ?Sized, M: Deref<Target: DmaMemory>, D: DelayNs> Smmuv3<'a, B, M, D> {
    pub(super) fn write_eventq_cons(&self) {
        self.regs
            .eventq_cons()
            .set(self.eventq_cons | (self.overflow_ack << 31));
    }

    /// Consumes the record at the consumer index (the caller has seen it published and synced
    /// the queue for the CPU): decodes and counts it. Returns, beside it, the stalled
    /// transaction of a record the driver rejects, which the caller must terminate (nobody can
    /// act on it, but it waits for an answer). The caller writes EVENTQ_CONS.
    fn pop_event(&mut self) -> Result<(Result<Event>, RejectedStall)> {
        let at = self.eventq_ring.index(self.eventq_cons) as usize * EVENT_BYTES;
        let raw = [
            self.eventq.read_u64(at)?,
            self.eventq.read_u64(at + 8)?,
            self.eventq.read_u64(at + 16)?,
            self.eventq.read_u64(at + 24)?,
        ];
        self.eventq_cons = self.eventq_ring.next(self.eventq_cons);
        self.stats.events += 1;
        let decoded = event::decode(raw, &self.caps, self.config.instance);
        match &decoded {
            Ok(Event::Fault(_)) => self.stats.fault_events += 1,
            Ok(_) => self.stats.other_events += 1,
            Err(SmmuError::UnknownEvent { .. }) => self.stats.unknown_events += 1,
            Err(_) => self.stats.malformed_events += 1,
        }
        let stalled = match decoded {
            Err(SmmuError::MalformedStalledEvent { stream, stag, .. }) => {
                Some((StreamId(stream), StallTag(u32::from(stag))))
            }
            _ => None,
        };
        Ok((decoded, stalled))
    }

    /// Terminates the stalled transaction of a rejected record (CMD_RESUME abort).
    fn terminate_rejected(&mut self, stalled: RejectedStall) -> Result<()> {
        match stalled {
            Some((stream, stag)) => self.resume(stream, stag, ResumeAction::Abort),
            None => Ok(()),
        }
    }

    /// Consumes every record in the event queue (at most twice its size per call, so a
    /// babbling device cannot keep the caller here), handing each decoded record, or its
    /// decoding error, to `sink`. Then checks the overflow signals (EVENTQ_PROD.OVFLG and
    /// GERROR.EVENTQ_ABT_ERR) and acknowledges them.
    ///
    /// On silicon, issue [`sync`](Self::sync) before draining when you need every event of
    /// transactions that already completed (§4.7.3); QEMU writes records synchronously.
    pub fn drain_events(&mut self, mut sink: impl FnMut(Result<Event>)) -> Result<DrainSummary> {
        let ring = self.eventq_ring;
        let limit = ring.entries().saturating_mul(2);
        let mut summary = DrainSummary::default();
        loop {
            let prod = self.regs.eventq_prod().get();
            if ring.is_empty(prod, self.eventq_cons) || summary.records >= limit {
                break;
            }
            self.dma.sync_for_cpu(self.eventq.region());
            while !ring.is_empty(prod, self.eventq_cons) && summary.records < limit {
                let (decoded, stalled) = self.pop_event()?;
                summary.records += 1;
                match &decoded {
                    Ok(Event::Fault(_)) => summary.faults += 1,
                    Ok(_) => {}
                    Err(_) => summary.rejected += 1,
                }
                sink(decoded);
                self.terminate_rejected(stalled)?;
                // Free space for the SMMU now and then while draining a long queue.
                if summary.records % 64 == 0 {
                    self.write_eventq_cons();
                }
            }
            self.write_eventq_cons();
        }
        let ovflg = self.regs.eventq_prod().get() >> 31;
        if ovflg != self.overflow_ack {
            self.overflow_ack = ovflg;
            self.events_lost = true;
            self.stats.overflows += 1;
            self.write_eventq_cons();
        }
        self.handle_global_errors()?;
        summary.overflow = core::mem::take(&mut self.events_lost);
        Ok(summary)
    }

    /// Takes the next fault from the event queue ([`FaultSource`]): any other event, and a
    /// record that does not decode, is a fault without a record whose others may be lost (a
    /// stalled one is terminated first, as in [`drain_events`](Self::drain_events)); an
    /// overflow marks the next fault taken as `lost`, or is reported alone once the queue is
    /// empty.
    pub(super) fn next_fault(&mut self) -> Result<Option<TakenFault>> {
        let prod = self.regs.eventq_prod().get();
        if self.eventq_ring.is_empty(prod, self.eventq_cons) {
            let ovflg = prod >> 31;
            if ovflg != self.overflow_ack {
                self.overflow_ack = ovflg;
                self.events_lost = true;
                self.stats.overflows += 1;
                self.write_eventq_cons();
            }
            self.handle_global_errors()?;
            return Ok(
                core::mem::take(&mut self.events_lost).then_some(TakenFault {
                    record: None,
                    lost: true,
                }),
            );
        }
        self.dma.sync_for_cpu(self.eventq.region());
        let (decoded, stalled) = self.pop_event()?;
        self.write_eventq_cons();
        self.terminate_rejected(stalled)?;
        Ok(Some(match decoded {
            Ok(Event::Fault(record)) => TakenFault {
                record: Some(record),
                lost: core::mem::take(&mut self.events_lost),
            },
            // Any other event (a configuration error, F_STREAM_DISABLED, an
            // implementation-defined one) also ended a transaction on some stream, and a
            // record that does not decode may have been a fault: a fault whose record is
            // lost, so the caller treats what is in flight as suspect.
            Ok(_) | Err(_) => TakenFault {
                record: None,
                lost: true,
            },
        }))
    }
}
