//! The send side of the engine model: local channels (descriptor fetch, source reads through
//! the SMMU, completions) and the injection port onto the link.

use super::*;

impl NpeModel {
    /// Posts a CQ entry, or keeps it (in order behind any kept before) when the CQ cannot
    /// be written: the channel then stops in ERROR until CQ_BASE is written again.
    pub(super) fn post_cq(&mut self, ch: usize, dram: &HostDma, entry: CqEntry) {
        let Some(c) = self.channels.get_mut(ch) else {
            return;
        };
        c.pending_cq.push_back(entry);
        if Self::flush_cq(c, dram) {
            self.stats.queue_errors += 1;
        }
    }

    /// Writes the channel's kept CQ entries; returns whether a write failed just now.
    pub(super) fn flush_cq(c: &mut Channel, dram: &HostDma) -> bool {
        while !c.cq.error {
            let Some(entry) = c.pending_cq.front() else {
                return false;
            };
            let e = CqEntry {
                phase: c.cq.phase(c.cq.tail),
                ..*entry
            };
            let written =
                c.cq.addr(c.cq.tail, CQ_ENTRY)
                    .is_some_and(|addr| dram.write_phys(addr, &e.encode()).is_ok());
            if !written {
                c.cq.error = true;
                c.irq |= IRQ_ERROR;
                return true;
            }
            c.pending_cq.pop_front();
            c.cq.tail = c.cq.tail.wrapping_add(1);
            c.irq |= IRQ_COMPLETION;
        }
        false
    }

    /// Finishes the channel's current descriptor.
    pub(super) fn finish(
        &mut self,
        ch: usize,
        dram: &HostDma,
        status: EntryStatus,
        bytes: u32,
        fault: u64,
    ) {
        let Some(c) = self.channels.get_mut(ch) else {
            return;
        };
        let Some(job) = c.job.take() else {
            return;
        };
        c.sq.head = c.sq.head.wrapping_add(1);
        if status != EntryStatus::Ok {
            c.last_error = status.code();
            if status != EntryStatus::SrcFault {
                c.irq |= IRQ_ERROR;
            }
        }
        if job.entry.signal || status != EntryStatus::Ok {
            self.post_cq(
                ch,
                dram,
                CqEntry {
                    phase: false,
                    status,
                    sq_index: job.index as u16,
                    bytes,
                    cookie: job.entry.cookie,
                    fault_addr: fault,
                },
            );
        }
    }

    pub(super) fn step_channel(&mut self, ch: usize, ctx: &mut EngineCtx<'_>) -> bool {
        let now = ctx.now;
        let Some(c) = self.channels.get_mut(ch) else {
            return false;
        };
        if !c.en {
            return false;
        }
        // CQ entries kept while the CQ could not be written go first, in order.
        if !c.pending_cq.is_empty() {
            let before = c.pending_cq.len();
            if Self::flush_cq(c, ctx.dram) {
                self.stats.queue_errors += 1;
            }
            let Some(c) = self.channels.get_mut(ch) else {
                return false;
            };
            if !c.pending_cq.is_empty() {
                return c.pending_cq.len() != before;
            }
        }
        let Some(c) = self.channels.get_mut(ch) else {
            return false;
        };
        // RESUME written while in FAULT_WAIT.
        if let Some(retry) = c.resume.take()
            && let Some(job) = c
                .job
                .as_mut()
                .filter(|j| matches!(j.phase, JobPhase::FaultWait))
        {
            {
                c.fault_valid = false;
                if retry {
                    job.done = 0;
                    job.payload.clear();
                    job.phase = JobPhase::Read;
                } else {
                    let fault = c.fault_addr;
                    self.finish(ch, ctx.dram, EntryStatus::SrcFault, 0, fault);
                }
                return true;
            }
        }
        let Some(c) = self.channels.get_mut(ch) else {
            return false;
        };
        match c.job.as_ref().map(|j| &j.phase) {
            None => {
                if c.sq.error || c.sq.used() == 0 || c.cq.used() >= c.cq.size() {
                    return false;
                }
                let index = c.sq.head;
                let mut bytes = [0u8; SQ_ENTRY];
                let read =
                    c.sq.addr(index, SQ_ENTRY)
                        .is_some_and(|addr| ctx.dram.read_phys(addr, &mut bytes).is_ok());
                if !read {
                    // Nothing consumed: the channel stops in ERROR until SQ_BASE is written.
                    c.sq.error = true;
                    c.irq |= IRQ_ERROR;
                    self.stats.queue_errors += 1;
                    return false;
                }
                match SqEntry::decode(&bytes, BLOCK) {
                    Ok(entry) => {
                        let phase = match entry.op {
                            SqOp::SendBlock { .. } => JobPhase::Read,
                            SqOp::SendMsg | SqOp::Nop => JobPhase::TxReady,
                        };
                        c.job = Some(Job {
                            entry,
                            index,
                            done: 0,
                            payload: Vec::new(),
                            phase,
                        });
                        if matches!(entry.op, SqOp::SendMsg | SqOp::Nop) {
                            // Messages use the control VC and go out at once; NOP does nothing.
                            let mut status = EntryStatus::Ok;
                            if matches!(entry.op, SqOp::SendMsg) {
                                if self.reachable(entry.peer) {
                                    ctx.out.push(Frame {
                                        src: self.coordinate(),
                                        dst: entry.peer as usize,
                                        pdid: entry.dst_pdid,
                                        tid14: entry.tid14,
                                        msg: entry.msg,
                                        payload: None,
                                        crc_error: false,
                                    });
                                    self.stats.tx_msgs += 1;
                                } else {
                                    status = self.link_error();
                                }
                            }
                            self.finish(ch, ctx.dram, status, 0, 0);
                        }
                    }
                    Err(_) => {
                        self.stats.bad_descriptors += 1;
                        c.job = Some(Job {
                            entry: SqEntry {
                                op: SqOp::Nop,
                                signal: true,
                                tid14: 0,
                                peer: 0,
                                dst_pdid: 0,
                                cookie: u64::from_le_bytes(
                                    bytes
                                        .get(32..40)
                                        .and_then(|b| b.try_into().ok())
                                        .unwrap_or([0; 8]),
                                ),
                                msg: InlineMsg::EMPTY,
                            },
                            index,
                            done: 0,
                            payload: Vec::new(),
                            phase: JobPhase::TxReady,
                        });
                        self.finish(ch, ctx.dram, EntryStatus::BadDescriptor, 0, 0);
                    }
                }
                true
            }
            Some(JobPhase::Read) => {
                self.read_block(ch, ctx);
                true
            }
            Some(JobPhase::Reading { ready_at }) if *ready_at <= now => {
                if let Some(job) = c.job.as_mut() {
                    job.phase = JobPhase::TxReady;
                }
                true
            }
            Some(JobPhase::Stalled { token, since }) => {
                let (token, since) = (*token, *since);
                match ctx.axi.stall_outcome(token) {
                    None => false,
                    Some(resolution) => {
                        self.stats.read_stall_time =
                            self.stats.read_stall_time.after(now.since(since));
                        if let Some(job) = c.job.as_mut() {
                            match resolution {
                                StallResolution::Retry => job.phase = JobPhase::Read,
                                StallResolution::Terminate => {
                                    let va = match job.entry.op {
                                        SqOp::SendBlock { src_va, .. } => src_va + job.done as u64,
                                        _ => 0,
                                    };
                                    job.phase = JobPhase::FaultWait;
                                    c.fault_addr = va;
                                    c.fault_index = job.index as u16;
                                    c.fault_valid = true;
                                    c.fault_resp = AXI_SLVERR;
                                    c.irq |= IRQ_LOCAL_FAULT;
                                    self.stats.src_faults += 1;
                                }
                            }
                        }
                        true
                    }
                }
            }
            _ => false,
        }
    }

    /// A descriptor to an unreachable peer: nothing is sent (§7 LINK_ERROR).
    pub(super) fn link_error(&mut self) -> EntryStatus {
        self.gevent |= GEVENT_LINK_ERROR;
        self.stats.link_errors += 1;
        EntryStatus::LinkError
    }

    /// Translates and reads the block of the channel's job from where it stopped.
    pub(super) fn read_block(&mut self, ch: usize, ctx: &mut EngineCtx<'_>) {
        let axi_bps = self.params.axi_bps;
        let latency = self.params.axi_latency;
        let Some(c) = self.channels.get_mut(ch) else {
            return;
        };
        let stream = self.params.stream_of(c.pdid, false);
        let Some(job) = c.job.as_mut() else {
            return;
        };
        let SqOp::SendBlock { src_va, length, .. } = job.entry.op else {
            return;
        };
        let len = length as usize;
        while job.done < len {
            let va = src_va + job.done as u64;
            let chunk = ((PAGE - va % PAGE) as usize).min(len - job.done);
            match ctx
                .axi
                .translate(ctx.now, stream, Iova::new(va), AccessKind::Read)
            {
                AxiOutcome::Ok(pa) => {
                    let start = job.payload.len();
                    job.payload.resize(start + chunk, 0);
                    let dst = job.payload.get_mut(start..).unwrap_or(&mut []);
                    if ctx.dram.read_phys(pa, dst).is_err() {
                        // A decode error behind the SMMU: treat as a terminated read.
                        job.phase = JobPhase::FaultWait;
                        c.fault_addr = va;
                        c.fault_index = job.index as u16;
                        c.fault_valid = true;
                        c.fault_resp = AXI_DECERR;
                        c.irq |= IRQ_LOCAL_FAULT;
                        self.stats.src_faults += 1;
                        return;
                    }
                    job.done += chunk;
                }
                AxiOutcome::Stalled(token) => {
                    job.phase = JobPhase::Stalled {
                        token,
                        since: ctx.now,
                    };
                    return;
                }
                AxiOutcome::Terminated => {
                    job.phase = JobPhase::FaultWait;
                    c.fault_addr = va;
                    c.fault_index = job.index as u16;
                    c.fault_valid = true;
                    c.fault_resp = AXI_SLVERR;
                    c.irq |= IRQ_LOCAL_FAULT;
                    self.stats.src_faults += 1;
                    return;
                }
            }
        }
        let ready_at = ctx
            .now
            .after(latency)
            .after(ModelTime::transfer(len as u64, axi_bps));
        job.phase = JobPhase::Reading { ready_at };
    }

    /// The transmit arbiter: one block at a time on the injection port, round-robin.
    pub(super) fn inject(&mut self, ctx: &mut EngineCtx<'_>) -> bool {
        if ctx.now < self.tx_busy_until {
            return false;
        }
        let n = self.channels.len();
        for step in 0..n {
            let ch = (self.next_tx_channel + step) % n;
            // A disabled channel is frozen: its block waits until it is enabled again.
            let ready = self.channels.get(ch).is_some_and(|c| {
                c.en && matches!(
                    c.job,
                    Some(Job {
                        phase: JobPhase::TxReady,
                        entry: SqEntry {
                            op: SqOp::SendBlock { .. },
                            ..
                        },
                        ..
                    })
                )
            });
            if !ready {
                continue;
            }
            let peer = self
                .channels
                .get(ch)
                .and_then(|c| c.job.as_ref())
                .map_or(0, |j| j.entry.peer);
            if !self.reachable(peer) {
                let status = self.link_error();
                self.finish(ch, ctx.dram, status, 0, 0);
                self.next_tx_channel = (ch + 1) % n;
                return true;
            }
            let src = self.coordinate();
            let Some(job) = self.channels.get_mut(ch).and_then(|c| c.job.as_mut()) else {
                continue;
            };
            let payload = std::mem::take(&mut job.payload);
            let bytes = payload.len() as u32;
            let frame = Frame {
                src,
                dst: job.entry.peer as usize,
                pdid: job.entry.dst_pdid,
                tid14: job.entry.tid14,
                msg: job.entry.msg,
                payload: Some(payload),
                crc_error: false,
            };
            let ser = ModelTime::transfer(frame.wire_bytes(), self.params.link_bps);
            self.tx_busy_until = ctx.now.after(ser);
            ctx.out.push(frame);
            self.stats.tx_blocks += 1;
            self.tx_count = self.tx_count.wrapping_add(1);
            self.finish(ch, ctx.dram, EntryStatus::Ok, bytes, 0);
            self.next_tx_channel = (ch + 1) % n;
            return true;
        }
        false
    }
}
