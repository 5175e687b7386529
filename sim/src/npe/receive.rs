//! The receive side of the engine model: the ejection port, the receive queue, the write
//! queue and its writes through the SMMU.

use super::*;

impl NpeModel {
    /// Moves arrived frames into the RQ (messages first: their own virtual channel).
    pub(super) fn take_ingress(&mut self, ctx: &mut EngineCtx<'_>) -> bool {
        let mut progress = false;
        // A frame leaves the ingress only once its RQ entry is written: with an RQ that
        // cannot be written it stays there (and the slot stays free), as on a full RQ.
        while !self.rq.error && self.rq.used() < self.rq.size() {
            let Some(head) = self.ingress_msgs.front().map(RqHeader::of) else {
                break;
            };
            if !self.post_rq(ctx.dram, RqKind::Msg, head) {
                break;
            }
            self.ingress_msgs.pop_front();
            self.stats.rx_msgs += 1;
            progress = true;
        }
        while !self.rq.error && self.rq.used() < self.rq.size() {
            let Some(slot) = self.free_slots.last().copied() else {
                break;
            };
            let Some((head, length)) = self.ingress_data.front().map(|f| {
                let length = f.payload.as_ref().map_or(0, |p| p.len() as u32);
                (RqHeader::of(f), length)
            }) else {
                break;
            };
            if !self.post_rq(ctx.dram, RqKind::Block { slot, length }, head) {
                break;
            }
            let Some(frame) = self.ingress_data.pop_front() else {
                break;
            };
            self.free_slots.pop();
            if let Some(s) = self.slots.get_mut(usize::from(slot)) {
                *s = frame.payload;
            }
            self.stats.rx_blocks += 1;
            self.rx_count = self.rx_count.wrapping_add(1);
            progress = true;
        }
        let holding = !self.ingress_data.is_empty() || !self.ingress_msgs.is_empty();
        if holding {
            if !self.rx_holding {
                self.stats.rx_held += 1;
            }
            self.gevent |= GEVENT_RX_HELD;
        }
        self.rx_holding = holding;
        progress
    }

    /// Writes an RQ entry for `frame`; returns whether it was written (a failure stops the
    /// RQ until RQ_BASE is written, with GEVENT.QUEUE_ERROR).
    pub(super) fn post_rq(&mut self, dram: &HostDma, kind: RqKind, head: RqHeader) -> bool {
        let entry = RqEntry {
            phase: self.rq.phase(self.rq.tail),
            kind,
            src: head.src,
            pdid: head.pdid,
            tid14: head.tid14,
            msg: head.msg,
        };
        let written = self
            .rq
            .addr(self.rq.tail, RQ_ENTRY)
            .is_some_and(|addr| dram.write_phys(addr, &entry.encode()).is_ok());
        if written {
            self.rq.tail = self.rq.tail.wrapping_add(1);
        } else {
            self.rq.error = true;
            self.queue_error();
        }
        written
    }

    pub(super) fn queue_error(&mut self) {
        self.gevent |= GEVENT_QUEUE_ERROR;
        self.stats.queue_errors += 1;
    }

    /// Posts a WCQ entry, or keeps it (in order) when the WCQ cannot be written: the write
    /// engine then stops until WCQ_BASE is written again.
    pub(super) fn post_wcq(&mut self, dram: &HostDma, entry: WcqEntry) {
        self.pending_wcq.push_back(entry);
        self.flush_wcq(dram);
    }

    /// Writes the kept WCQ entries; returns whether any was written.
    pub(super) fn flush_wcq(&mut self, dram: &HostDma) -> bool {
        let mut any = false;
        while !self.wcq.error {
            let Some(entry) = self.pending_wcq.front() else {
                break;
            };
            let e = WcqEntry {
                phase: self.wcq.phase(self.wcq.tail),
                ..*entry
            };
            let written = self
                .wcq
                .addr(self.wcq.tail, WCQ_ENTRY)
                .is_some_and(|addr| dram.write_phys(addr, &e.encode()).is_ok());
            if !written {
                self.wcq.error = true;
                self.queue_error();
                break;
            }
            self.pending_wcq.pop_front();
            self.wcq.tail = self.wcq.tail.wrapping_add(1);
            any = true;
        }
        any
    }

    pub(super) fn free_slot(&mut self, slot: u8) {
        if let Some(s) = self.slots.get_mut(usize::from(slot))
            && s.take().is_some()
        {
            self.free_slots.push(slot);
        }
    }

    /// The write engine: one WQ entry at a time, in order.
    pub(super) fn step_write(&mut self, ctx: &mut EngineCtx<'_>) -> bool {
        let now = ctx.now;
        // WCQ entries kept while the WCQ could not be written go first, in order.
        if !self.pending_wcq.is_empty() {
            let progress = self.flush_wcq(ctx.dram);
            if !self.pending_wcq.is_empty() {
                return progress;
            }
        }
        match self.write_job.as_ref().map(|j| &j.phase) {
            None => {
                if self.wq.error || self.wq.used() == 0 || self.wcq.used() >= self.wcq.size() {
                    return false;
                }
                let mut bytes = [0u8; WQ_ENTRY];
                let index = self.wq.head;
                let read = self
                    .wq
                    .addr(index, WQ_ENTRY)
                    .is_some_and(|addr| ctx.dram.read_phys(addr, &mut bytes).is_ok());
                if !read {
                    // Nothing consumed: the write engine stops until WQ_BASE is written.
                    self.wq.error = true;
                    self.queue_error();
                    return false;
                }
                self.wq.head = self.wq.head.wrapping_add(1);
                match WqEntry::decode(&bytes) {
                    Ok(entry) => match entry.op {
                        WqOp::Release => self.free_slot(entry.slot),
                        WqOp::Commit { length, .. } => {
                            let slot_len = self
                                .slots
                                .get(usize::from(entry.slot))
                                .and_then(|s| s.as_ref())
                                .map(Vec::len);
                            match slot_len {
                                Some(have) if length as usize <= have => {
                                    self.write_job = Some(WriteJob {
                                        entry,
                                        done: 0,
                                        phase: WritePhase::Write,
                                    });
                                }
                                _ => {
                                    self.stats.bad_descriptors += 1;
                                    self.post_wcq(
                                        ctx.dram,
                                        WcqEntry {
                                            phase: false,
                                            status: EntryStatus::BadDescriptor,
                                            slot: entry.slot,
                                            bytes: 0,
                                            cookie: entry.cookie,
                                            fault_addr: 0,
                                            axi_resp: 0,
                                        },
                                    );
                                    self.free_slot(entry.slot);
                                }
                            }
                        }
                    },
                    Err(_) => {
                        // Reported with the entry's own COOKIE (word 2, the driver's name
                        // for the commit, §4.4), and its slot freed if it holds a block:
                        // both operations free the slot they name.
                        self.stats.bad_descriptors += 1;
                        let cookie = bytes
                            .get(16..24)
                            .and_then(|b| b.try_into().ok())
                            .map_or(0, u64::from_le_bytes);
                        self.post_wcq(
                            ctx.dram,
                            WcqEntry {
                                phase: false,
                                status: EntryStatus::BadDescriptor,
                                slot: bytes[1],
                                bytes: 0,
                                cookie,
                                fault_addr: 0,
                                axi_resp: 0,
                            },
                        );
                        self.free_slot(bytes[1]);
                    }
                }
                true
            }
            Some(WritePhase::Write) => {
                self.write_block(ctx);
                true
            }
            Some(WritePhase::Writing { ready_at }) if *ready_at <= now => {
                if let Some(job) = self.write_job.take() {
                    let length = match job.entry.op {
                        WqOp::Commit { length, .. } => length,
                        WqOp::Release => 0,
                    };
                    self.post_wcq(
                        ctx.dram,
                        WcqEntry {
                            phase: false,
                            status: EntryStatus::Ok,
                            slot: job.entry.slot,
                            bytes: length,
                            cookie: job.entry.cookie,
                            fault_addr: 0,
                            axi_resp: 0,
                        },
                    );
                    self.free_slot(job.entry.slot);
                    self.stats.commits += 1;
                }
                true
            }
            Some(WritePhase::Stalled { token, since }) => {
                let (token, since) = (*token, *since);
                match ctx.axi.stall_outcome(token) {
                    None => false,
                    Some(resolution) => {
                        self.stats.write_stall_time =
                            self.stats.write_stall_time.after(now.since(since));
                        match resolution {
                            StallResolution::Retry => {
                                if let Some(job) = self.write_job.as_mut() {
                                    job.phase = WritePhase::Write;
                                }
                            }
                            StallResolution::Terminate => self.write_fault(ctx.dram, AXI_SLVERR),
                        }
                        true
                    }
                }
            }
            _ => false,
        }
    }

    pub(super) fn write_block(&mut self, ctx: &mut EngineCtx<'_>) {
        let Some(job) = self.write_job.as_mut() else {
            return;
        };
        let WqOp::Commit {
            pdid,
            length,
            dst_va,
        } = job.entry.op
        else {
            return;
        };
        let stream = self.params.stream_of(pdid, true);
        let len = length as usize;
        let Some(data) = self
            .slots
            .get(usize::from(job.entry.slot))
            .and_then(|s| s.as_ref())
        else {
            return;
        };
        while job.done < len {
            let va = dst_va + job.done as u64;
            let chunk = ((PAGE - va % PAGE) as usize).min(len - job.done);
            match ctx
                .axi
                .translate(ctx.now, stream, Iova::new(va), AccessKind::Write)
            {
                AxiOutcome::Ok(pa) => {
                    let src = data.get(job.done..job.done + chunk).unwrap_or(&[]);
                    if ctx.dram.write_phys(pa, src).is_err() {
                        self.write_fault(ctx.dram, AXI_DECERR);
                        return;
                    }
                    job.done += chunk;
                }
                AxiOutcome::Stalled(token) => {
                    job.phase = WritePhase::Stalled {
                        token,
                        since: ctx.now,
                    };
                    return;
                }
                AxiOutcome::Terminated => {
                    self.write_fault(ctx.dram, AXI_SLVERR);
                    return;
                }
            }
        }
        let ready_at = ctx
            .now
            .after(self.params.axi_latency)
            .after(ModelTime::transfer(len as u64, self.params.axi_bps));
        job.phase = WritePhase::Writing { ready_at };
    }

    /// The current commit's write was terminated (`axi_resp` SLVERR) or found nothing at
    /// its address (DECERR): report DST_FAULT, free the slot.
    pub(super) fn write_fault(&mut self, dram: &HostDma, axi_resp: u8) {
        let Some(job) = self.write_job.take() else {
            return;
        };
        let dst_va = match job.entry.op {
            WqOp::Commit { dst_va, .. } => dst_va,
            WqOp::Release => 0,
        };
        self.post_wcq(
            dram,
            WcqEntry {
                phase: false,
                status: EntryStatus::DstFault,
                slot: job.entry.slot,
                bytes: job.done as u32,
                cookie: job.entry.cookie,
                fault_addr: dst_va + job.done as u64,
                axi_resp,
            },
        );
        self.free_slot(job.entry.slot);
        self.stats.dst_faults += 1;
    }
}
