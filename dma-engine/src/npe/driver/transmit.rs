//! The send side: local channels' completions and faults, the transmit arbiter, parked
//! channels, doorbells and deadlines.

use super::*;

impl<B: RegisterBus, const CH: usize, const PEERS: usize, const T: usize, const NB: usize>
    Npe<B, CH, PEERS, T, NB>
{
    /// Engine-wide events: counted and acknowledged (W1C exactly the bits read), or the
    /// level interrupt would stay asserted (§9).
    pub(super) fn service_events(&mut self) -> Result<()> {
        let global = NpeGlobal::new(&self.bus, 0)?;
        let events = global.gevent().get();
        if events == 0 {
            return Ok(());
        }
        global.gevent().set(events);
        if events & GEVENT::RX_HELD::SET.value != 0 {
            self.stats.rx_held += 1;
        }
        let errors = events & !GEVENT::RX_HELD::SET.value;
        self.stats.engine_events += u64::from(errors.count_ones());
        if events & GEVENT::QUEUE_ERROR::SET.value != 0 {
            // Writing a ring's base again lets the engine retry it (§4); the rings are the
            // driver's own memory, so the same addresses.
            global.rq_base().set(self.rq.bus_addr());
            global.wq_base().set(self.wq.bus_addr());
            global.wcq_base().set(self.wcq.bus_addr());
            self.stats.queue_restarts += 1;
        }
        Ok(())
    }

    /// Channel interrupts: local faults and completion entries.
    pub(super) fn service_channels<H: NpeHost + ?Sized>(
        &mut self,
        now: u64,
        host: &mut H,
        report: &mut PollReport,
    ) -> Result<()> {
        for index in 0..CH {
            let Some(Some(ch)) = self.channels.get(index) else {
                continue;
            };
            let regs = NpeChannel::new(&self.bus, channel_offset(usize::from(ch.hw.index)))?;
            let causes = regs.irq().get();
            if causes != 0 {
                // W1C exactly the causes seen (never a read-modify-write).
                regs.irq().set(causes);
            }
            if causes & CH_IRQ::ERROR::SET.value != 0 {
                restart_channel_rings(&regs, &ch.hw);
                self.stats.queue_restarts += 1;
            }
            let fault = causes & CH_IRQ::LOCAL_FAULT::SET.value != 0;
            if fault || ch.fault_pending {
                self.handle_local_fault(index, now, host, report)?;
            }
            self.drain_cq(index, report)?;
        }
        // The control channel only ever completes messages.
        let regs = NpeChannel::new(&self.bus, channel_offset(usize::from(self.control.index)))?;
        let causes = regs.irq().get();
        if causes != 0 {
            regs.irq().set(causes);
        }
        if causes & CH_IRQ::ERROR::SET.value != 0 {
            restart_channel_rings(&regs, &self.control);
            self.stats.queue_restarts += 1;
        }
        let control_errors = drain_completions(&self.bus, &mut self.control, report)?;
        self.stats.engine_errors += u64::from(control_errors);
        Ok(())
    }

    pub(super) fn drain_cq(&mut self, index: usize, report: &mut PollReport) -> Result<()> {
        let Some(Some(ch)) = self.channels.get_mut(index) else {
            return Ok(());
        };
        let errors = drain_completions(&self.bus, &mut ch.hw, report)?;
        self.stats.engine_errors += u64::from(errors);
        Ok(())
    }

    pub(super) fn handle_local_fault<H: NpeHost + ?Sized>(
        &mut self,
        index: usize,
        now: u64,
        host: &mut H,
        report: &mut PollReport,
    ) -> Result<()> {
        let room = !self.waiters.is_full();
        let Some(Some(ch)) = self.channels.get_mut(index) else {
            return Ok(());
        };
        let regs = NpeChannel::new(&self.bus, channel_offset(usize::from(ch.hw.index)))?;
        let state = regs.status().read(crate::npe::regs::CH_STATUS::STATE);
        if state != 2 {
            // Not (or no longer) in FAULT_WAIT.
            ch.fault_pending = false;
            return Ok(());
        }
        if !room {
            ch.fault_pending = true;
            self.stats.back_pressure += 1;
            return Ok(());
        }
        ch.fault_pending = false;
        report.local_faults += 1;
        self.stats.local_faults += 1;
        let addr = regs.fault_addr().get();
        let sq_index = regs.fault_info().read(FAULT_INFO::SQ_INDEX) as u16;
        let syndrome = regs.fault_syndrome().extract();
        // DECERR: the read reached no memory at all; no resolution can help (§3.2).
        let decode_error = syndrome.is_set(FAULT_SYNDROME::VALID)
            && syndrome.read(FAULT_SYNDROME::RESP) == AXI_DECERR;
        let slot = usize::from(sq_index) & (ch.hw.sq.slots() as usize - 1);
        let shadow = ch.hw.shadow.get(slot).copied().flatten();
        let Some(shadow) = shadow else {
            // A fault on a descriptor that reads no user memory: an engine bug. Skip it.
            self.stats.engine_errors += 1;
            regs.resume().write(RESUME::SKIP::SET);
            return Ok(());
        };
        let pdid = ch.cfg.pdid;
        let mut class = if decode_error {
            FaultClass::Denied(FaultReason::OutOfRegion)
        } else {
            host.classify(pdid, addr, Access::Read)
        };
        if class == FaultClass::Present {
            let (index, count) = ch.present_retries;
            let count = if index == sq_index { count } else { 0 };
            if count >= MAX_PRESENT_RETRIES {
                // The SMMU keeps refusing a page the memory manager calls present: let the
                // fault service look at it instead of retrying for ever.
                class = FaultClass::Resolvable;
                ch.present_retries = (sq_index, 0);
                self.stats.retry_limit_hits += 1;
            } else {
                ch.present_retries = (sq_index, count + 1);
            }
        } else {
            ch.present_retries = (sq_index, 0);
        }
        match class {
            FaultClass::Present => {
                regs.resume().write(RESUME::RETRY::SET);
                self.stats.local_fault_retries += 1;
            }
            FaultClass::Resolvable => {
                let disposition = ch.sender.source_fault(
                    now,
                    shadow.tid,
                    shadow.block,
                    shadow.attempt,
                    FaultReason::NotPresent,
                );
                // The channel leaves FAULT_WAIT whatever the sender said: with the interrupt
                // already acknowledged, nothing else would ever release it.
                regs.resume().write(RESUME::SKIP::SET);
                let disposition = disposition?;
                if disposition == Disposition::Applied {
                    ch.parked += 1;
                    let channel = index as u8;
                    // `room` was checked above.
                    let _ = self.waiters.push(Waiter {
                        pdid,
                        page: addr & !(PAGE - 1),
                        kind: WaiterKind::Source {
                            channel,
                            tid: shadow.tid,
                            block: shadow.block,
                        },
                        resolved: None,
                        unresolvable: None,
                    });
                    host.request_resolution(pdid, addr, Access::Read);
                }
            }
            FaultClass::Denied(reason) => {
                let applied =
                    ch.sender
                        .source_fault(now, shadow.tid, shadow.block, shadow.attempt, reason);
                regs.resume().write(RESUME::SKIP::SET);
                applied?;
            }
        }
        Ok(())
    }

    /// The scheduler: control messages first, then data channels round-robin, skipping
    /// parked ones.
    pub(super) fn transmit(&mut self, now: u64, report: &mut PollReport) -> Result<()> {
        // Control messages.
        refresh_head(&self.bus, &mut self.control)?;
        while self.control.sq.free() > 0 {
            let Some(out) = self.outgoing.pop_front() else {
                break;
            };
            let msg = encode_message(out.session, &out.message)?;
            let signal = self.control.sq.free() == 1;
            post(
                &mut self.control,
                SqEntry {
                    op: SqOp::SendMsg,
                    signal,
                    tid14: out.message.transfer().map_or(0, |t| (t.0 & 0x3fff) as u16),
                    peer: out.peer,
                    dst_pdid: 0,
                    cookie: 0,
                    msg,
                },
                None,
            )?;
            report.msgs_posted += 1;
            self.stats.msgs_posted += 1;
        }

        // Data channels, one descriptor per channel per round.
        let batch = u32::from(self.cfg.sq_batch);
        for index in 0..CH {
            if let Some(Some(ch)) = self.channels.get_mut(index) {
                refresh_head(&self.bus, &mut ch.hw)?;
            }
        }
        self.expire_parked(now)?;
        let mut progress = true;
        while progress {
            progress = false;
            for step in 0..CH {
                let index = (self.next_channel + step) % CH;
                let Some(Some(ch)) = self.channels.get_mut(index) else {
                    continue;
                };
                if ch.parked > 0 || ch.fault_pending {
                    continue;
                }
                if ch.hw.sq.in_use() >= batch || ch.hw.sq.free() == 0 {
                    continue;
                }
                let Some(transmit) = ch.sender.poll_transmit(now) else {
                    continue;
                };
                // Signal the descriptor that fills the batch: its completion tells the driver
                // there is room again.
                let signal = ch.hw.sq.in_use() + 1 >= batch;
                match transmit {
                    Transmit::Block(send) => {
                        let header = send.header;
                        let msg = encode_message(ch.cfg.session, &Message::Block(header))?;
                        post(
                            &mut ch.hw,
                            SqEntry {
                                op: SqOp::SendBlock {
                                    src_va: send.src,
                                    length: header.len,
                                    dst_va: header.dest,
                                },
                                signal,
                                tid14: (header.tid.0 & 0x3fff) as u16,
                                peer: ch.cfg.peer,
                                dst_pdid: ch.cfg.peer_key as u16,
                                cookie: u64::from(header.tid.0) << 32 | u64::from(header.block),
                                msg,
                            },
                            Some(SqShadow {
                                tid: header.tid,
                                block: header.block,
                                attempt: header.attempt,
                            }),
                        )?;
                        report.blocks_posted += 1;
                        self.stats.blocks_posted += 1;
                    }
                    Transmit::Abort(abort) => {
                        let msg = encode_message(ch.cfg.session, &Message::Abort(abort))?;
                        post(
                            &mut ch.hw,
                            SqEntry {
                                op: SqOp::SendMsg,
                                signal,
                                tid14: (abort.tid.0 & 0x3fff) as u16,
                                peer: ch.cfg.peer,
                                dst_pdid: 0,
                                cookie: 0,
                                msg,
                            },
                            None,
                        )?;
                        report.msgs_posted += 1;
                        self.stats.msgs_posted += 1;
                    }
                }
                progress = true;
            }
        }
        self.next_channel = (self.next_channel + 1) % CH.max(1);
        Ok(())
    }

    /// Runs the timers of channels the scheduler gives no transmissions (parked, or with a
    /// full SQ): a source fault the fault service never resolves must still abort its
    /// transfer after `source_fault_timeout` (docs/protocol.md §8.1), and a channel whose
    /// engine stopped must still time its transfers out.
    pub(super) fn expire_parked(&mut self, now: u64) -> Result<()> {
        let batch = u32::from(self.cfg.sq_batch);
        let mut any = false;
        for ch in self.channels.iter_mut().flatten() {
            if ch.timers_only(batch) {
                ch.sender.process_timers(now);
                any = true;
            }
        }
        if !any {
            return Ok(());
        }
        let mut i = 0;
        while let Some(w) = self.waiters.get(i).copied() {
            if let WaiterKind::Source {
                channel,
                tid,
                block,
            } = w.kind
            {
                let ch = self.channel_mut(channel)?;
                if !ch.sender.awaits_source(tid, block) {
                    ch.parked = ch.parked.saturating_sub(1);
                    self.waiters.swap_remove(i);
                    self.stats.source_waits_abandoned += 1;
                    continue;
                }
            }
            i += 1;
        }
        Ok(())
    }

    pub(super) fn ring_doorbells(&mut self) -> Result<()> {
        let any = self.wq_dirty
            || self.control.tail_dirty
            || self.channels.iter().flatten().any(|c| c.hw.tail_dirty);
        if !any {
            return Ok(());
        }
        let global = NpeGlobal::new(&self.bus, 0)?;
        // Descriptors must be visible before the engine is told about them.
        global.barrier(Barrier::DsbSt);
        if self.wq_dirty {
            global.wq_tail().set(self.wq.index);
            self.wq_dirty = false;
        }
        ring(&self.bus, &mut self.control)?;
        for ch in self.channels.iter_mut().flatten() {
            ring(&self.bus, &mut ch.hw)?;
        }
        Ok(())
    }

    pub(super) fn next_deadline(&self, now: u64) -> Option<u64> {
        let batch = u32::from(self.cfg.sq_batch);
        let mut best: Option<u64> = None;
        for ch in self.channels.iter().flatten() {
            let blocked = ch.timers_only(batch);
            // A blocked channel sends nothing, but its timers run (`expire_parked`).
            let deadline = if blocked {
                ch.sender.next_timer()
            } else {
                ch.sender.next_deadline()
            };
            let Some(deadline) = deadline else {
                continue;
            };
            // A blocked channel is woken by its completion or resolution, not by a timer.
            if blocked && deadline <= now {
                continue;
            }
            let deadline = deadline.max(now);
            best = Some(best.map_or(deadline, |b| b.min(deadline)));
        }
        best
    }
}
