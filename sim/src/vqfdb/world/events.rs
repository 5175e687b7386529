//! The engines, their fault service and the driver: what happens on each node event.

use super::*;

impl<'p> World<'p> {
    pub(crate) fn engine_step(&mut self, n: usize, now: ModelTime) -> VqResult<()> {
        let mut out = Vec::new();
        let advance = {
            let node = &mut self.nodes[n];
            let mut model = node.driver.bus().lock();
            model.advance(&mut EngineCtx {
                now,
                dram: &node.dram,
                axi: &mut node.mm.smmu,
                out: &mut out,
            })
        };
        let out = match self.seams.frames.as_mut() {
            Some(hook) => out.into_iter().flat_map(&mut **hook).collect(),
            None => out,
        };
        for frame in out {
            let arrival = self
                .fabric
                .send(now, n, frame.dst, frame.wire_bytes(), frame.vc())?;
            let dst = frame.dst;
            self.q.schedule(arrival, Ev::Arrive(dst, Box::new(frame)));
        }
        if let Some(t) = advance.next {
            self.request_engine(n, t);
        }
        if advance.irq {
            self.request_driver(n, now);
        }
        // Fault records the SMMU queued (the context-fault interrupt).
        let mut records = Vec::new();
        self.nodes[n].mm.smmu.take_records(&mut records)?;
        for record in records {
            self.fault_record(n, now, &record)?;
        }
        Ok(())
    }

    pub(super) fn fault_record(
        &mut self,
        n: usize,
        now: ModelTime,
        record: &smmu_driver::fault::FaultRecord,
    ) -> VqResult<()> {
        self.mark_fault(n, record.iova.as_u64());
        let costs = self.cfg.costs;
        let node = &mut self.nodes[n];
        if let Some(policy) = node.faults.handler.policy().cost()
            && record.access == smmu_driver::fault::AccessKind::Write
        {
            // A stalled write holds the blocks staged behind it and those held at the
            // ingress, and half of those that arrive while it waits.
            let waiting = {
                let model = node.driver.bus().lock();
                (model.slots_in_use().saturating_sub(1) + model.held()) as u64
            };
            policy.set_queue_ns(node.faults.queue_ns(now));
            // The class the resolver will report for this page.
            let estimate = match node.mm.mem.fault_cost(record.iova.as_u64()) {
                Some(FaultCost::Major) => smmu_driver::fault::FaultEstimate::Major,
                _ => node.mm.mem.estimate_minor(),
            };
            let resolve = policy.expected_resolve_ns(&estimate).unwrap_or(0);
            let mut c = policy.costs(smmu_driver::fault::AccessKind::Write);
            c.blocked_milli = node.costs.write_blocked_milli(waiting * 1000, resolve);
            c.capacity = node.costs.write_capacity(waiting * 1000);
            policy.set_costs(smmu_driver::fault::AccessKind::Write, c);
        }
        let actions = node.faults.on_record(now, record, &mut node.mm, &costs)?;
        for action in actions {
            match action {
                FaultAction::None => {}
                FaultAction::Terminate(at, token) => self.q.schedule(at, Ev::Terminate(n, token)),
                FaultAction::Resolve(at, page) => self.q.schedule(at, Ev::FaultDone(n, page)),
                FaultAction::Unresolvable(at, page, reason) => {
                    self.q.schedule(at, Ev::Unresolvable(n, page, reason))
                }
            }
        }
        Ok(())
    }

    /// Notes an engine fault on node `n`'s page `va` against the transfer using that slot
    /// (for the latency per fault class).
    fn mark_fault(&mut self, n: usize, va: u64) {
        let class = match self.nodes[n].mm.mem.fault_cost(va) {
            Some(FaultCost::Minor) => FaultClass::Minor,
            Some(FaultCost::Major) => FaultClass::Major,
            None => return,
        };
        let slot_bytes = self.slot_bytes();
        let buffer_bytes = slot_bytes * self.cfg.slots as u64;
        let Some(off) = va.checked_sub(VA_BASE) else {
            return;
        };
        let buffer = (off / buffer_bytes) as usize;
        let slot = ((off % buffer_bytes) / slot_bytes) as usize;
        let node = &self.nodes[n];
        let (p, src) = if buffer < node.out_pairs.len() {
            (node.out_pairs[buffer], true)
        } else if let Some(&p) = node.in_pairs.get(buffer - node.out_pairs.len()) {
            (p, false)
        } else {
            return;
        };
        let pair = &mut self.pairs[p];
        let classes = if src {
            &mut pair.src_class
        } else {
            &mut pair.dst_class
        };
        if let Some(c) = classes.get_mut(slot) {
            *c = (*c).max(class);
        }
    }

    pub(super) fn fault_done(&mut self, n: usize, now: ModelTime, page: u64) -> VqResult<()> {
        let node = &mut self.nodes[n];
        let Some(inflight) = node.faults.inflight.remove(&page) else {
            return Ok(());
        };
        if node.lose_requests {
            // Lost: stalled accesses are terminated, and nobody hears of the page again.
            for token in inflight.resume {
                node.mm.smmu.resume(token, now, false)?;
            }
            return node.mm.mem.release_hold(page);
        }
        if node.mm.mem.needs_frame(page) {
            node.mm.ensure_free_frame(now)?;
        }
        // The second half of the shared fault service for the record the page was decided
        // on: fix, invalidate, then answer its own stall. Stalls of later records of the same
        // page are answered the same way after it.
        let Inflight {
            plan,
            started,
            cost,
            resume,
        } = inflight;
        if let (Some(policy), Some(cost)) = (node.faults.handler.policy().cost(), cost) {
            // The cost-based policy learns each class's service time (queueing excluded).
            policy.observe(cost, now.since(started).as_ns());
        }
        let own = plan
            .record
            .stall
            .filter(|_| plan.decision == smmu_driver::fault::FaultDecision::Resume);
        let mut others = resume;
        if let Some(i) = own.and_then(|t| others.iter().position(|&o| o == t)) {
            others.remove(i);
        }
        let streams = node.faults.streams(&node.mm);
        let Mm {
            mem, table, smmu, ..
        } = &mut node.mm;
        let mut port = FaultPort { smmu, now, streams };
        let outcome = node
            .faults
            .handler
            .second_half(&mut port, &plan, mem, table)?;
        match outcome.decision {
            smmu_driver::fault::FaultDecision::Abort(
                SmmuError::ResolveFailed { .. } | SmmuError::OutsideRegisteredRegion { .. },
            ) => {
                for token in others {
                    node.mm.smmu.resume(token, now, false)?;
                }
                node.driver
                    .page_unresolvable(PDID, page, FaultReason::OutOfRegion)?;
                node.mm.mem.release_hold(page)?;
            }
            smmu_driver::fault::FaultDecision::Abort(e) => return Err(e.into()),
            _ => {
                let generation = match outcome.mapped {
                    Some(mapped) => node.mm.pstate.mark_present(
                        VirtAddr::new(page),
                        hal::PageSize::Size4K,
                        mapped.frame,
                        true,
                    )?,
                    None => node.mm.pstate.generation(),
                };
                node.mm.mem.reference(page);
                for token in others {
                    node.mm.smmu.resume(token, now, true)?;
                }
                node.driver.page_resolved(PDID, page, generation)?;
            }
        }
        self.engine_step(n, now)?;
        self.request_driver(n, now);
        Ok(())
    }

    pub(super) fn driver_run(&mut self, n: usize, now: ModelTime) -> VqResult<()> {
        let costs = self.cfg.costs;
        let report = {
            let node = &mut self.nodes[n];
            let mut host = HostView {
                mm: &mut node.mm,
                requests: &mut node.requests,
            };
            node.driver.poll(now.as_ns(), &mut host)?
        };
        let mut cost = costs.driver_entry;
        let mul = |t: ModelTime, k: u32| ModelTime(t.0.saturating_mul(u64::from(k)));
        cost = cost
            .after(mul(costs.per_cq, report.cq_entries))
            .after(mul(costs.per_rq, report.rq_entries))
            .after(mul(costs.per_wcq, report.wcq_entries))
            .after(mul(
                costs.per_post,
                report.blocks_posted + report.msgs_posted,
            ))
            .after(mul(costs.per_local_fault, report.local_faults));
        let done = now.after(cost);
        self.nodes[n].driver_free_at = done;
        // The engine sees the doorbells (and the CQ room a drained CQ gives a channel that
        // waited for it) once the driver finished.
        if report.blocks_posted
            + report.msgs_posted
            + report.cq_entries
            + report.rq_entries
            + report.wcq_entries
            + report.local_faults
            > 0
        {
            self.request_engine(n, done);
        }
        // Fault requests of the driver go to the fault service.
        let mut requests = std::mem::take(&mut self.nodes[n].requests);
        if self.nodes[n].lose_requests {
            requests.clear();
        }
        let mut resolved_now = false;
        for (va, access) in requests {
            let page = va & !(PAGE - 1);
            let node = &mut self.nodes[n];
            if node.faults.inflight.contains_key(&page) {
                continue;
            }
            if node.mm.mem.is_resident(page) {
                let generation = node.mm.pstate.generation();
                node.driver.page_resolved(PDID, page, generation)?;
                resolved_now = true;
                continue;
            }
            let stream = match access {
                Access::Read => node.mm.read_stream,
                Access::Write => node.mm.write_stream,
            };
            let record = FaultService::record_for(stream, va, access);
            self.fault_record(n, done, &record)?;
        }
        if resolved_now {
            self.request_driver(n, done);
        }
        self.harvest(n, done)?;
        if let Some(deadline) = report.next_deadline {
            self.request_driver(n, ModelTime::from_ns(deadline).max(done));
        }
        Ok(())
    }

    /// Completions at the sender and deliveries at the receiver.
    pub(super) fn harvest(&mut self, n: usize, at: ModelTime) -> VqResult<()> {
        if self.manual {
            for i in 0..self.nodes[n].out_pairs.len() {
                let p = self.nodes[n].out_pairs[i];
                let channel = self.pairs[p].channel;
                while let Some(c) = self.nodes[n].driver.poll_completion(channel)? {
                    self.pairs[p].completions.push((at, c));
                }
            }
            for i in 0..self.nodes[n].in_pairs.len() {
                let p = self.nodes[n].in_pairs[i];
                let slot = self.pairs[p].peer_slot;
                while let Some(d) = self.nodes[n].driver.poll_delivery(slot)? {
                    self.pairs[p].deliveries.push((at, d));
                }
            }
            return Ok(());
        }
        let mut app_wake = false;
        for i in 0..self.nodes[n].out_pairs.len() {
            let p = self.nodes[n].out_pairs[i];
            let channel = self.pairs[p].channel;
            while let Some(c) = self.nodes[n].driver.poll_completion(channel)? {
                let passed = match self.seams.completions.as_mut() {
                    Some(seam) => seam(p, c),
                    None => vec![c],
                };
                for c in passed {
                    app_wake |= self.complete(p, at, c)?;
                }
            }
        }
        for i in 0..self.nodes[n].in_pairs.len() {
            let p = self.nodes[n].in_pairs[i];
            let slot = self.pairs[p].peer_slot;
            while let Some(d) = self.nodes[n].driver.poll_delivery(slot)? {
                let passed = match self.seams.deliveries.as_mut() {
                    Some(seam) => seam(p, d),
                    None => vec![d],
                };
                for d in passed {
                    self.verify(p, d.tid.0, d.status)?;
                }
            }
        }
        if app_wake {
            self.wake_app(n, at);
        }
        if self.finished.is_multiple_of(256) || self.finished == self.total {
            (self.progress)(self.finished, self.total);
        }
        Ok(())
    }

    /// Where `tid` stands against the next transfer expected in order: 0 it is that one,
    /// above 0 a later one (those between are late or lost), below 0 an earlier one.
    fn order(tid: u32, expected: u32) -> i32 {
        tid.wrapping_sub(expected) as i32
    }

    /// One completion at the sender: checked against the transfers posted (a second one of
    /// a transfer is counted duplicated, one after a later transfer's reordered); returns
    /// whether the application has something to do.
    fn complete(&mut self, p: usize, at: ModelTime, c: protocol::Completion) -> VqResult<bool> {
        let pair = &mut self.pairs[p];
        let order = Self::order(c.tid.0, pair.next_completion);
        let Some(rec) = self.ledger.get_mut(&(p, c.tid.0)) else {
            if order < 0 {
                // Completed and delivered already (it left the ledger).
                self.integrity.duplicated += 1;
                return Ok(false);
            }
            return Err(SimError::Accounting(format!(
                "node {} -> {}: completion for unknown transfer {}",
                pair.src, pair.dst, c.tid.0
            )));
        };
        if rec.completed {
            self.integrity.duplicated += 1;
            return Ok(false);
        }
        if order < 0 {
            self.integrity.reordered += 1;
        } else {
            pair.next_completion = c.tid.0.wrapping_add(1);
        }
        if c.status != CompletionStatus::Ok {
            return Err(SimError::Accounting(format!(
                "node {} -> {}: transfer {} ended {:?}",
                pair.src, pair.dst, c.tid.0, c.status
            )));
        }
        rec.completed = true;
        let latency = at.since(rec.prepared.intended);
        let class = if c.retransmissions > 0 {
            FaultClass::Resent
        } else {
            let src = pair.src_class.get(rec.prepared.src_slot as usize);
            let dst = pair.dst_class.get(rec.prepared.dst_slot as usize);
            src.copied()
                .unwrap_or(FaultClass::None)
                .max(dst.copied().unwrap_or(FaultClass::None))
        };
        self.latency.record(latency.as_ns());
        if let Some(h) = self.latency_by_class.get_mut(class.index()) {
            h.record(latency.as_ns());
        }
        if self.cfg.keep_samples {
            self.latencies.push(latency.as_us());
        }
        self.last_completion = self.last_completion.max(at);
        pair.inflight -= 1;
        if self.cfg.offered_load_gbps.is_none() {
            // Closed loop: the window slot is free now; the next transfer is meant to go at
            // once.
            pair.intents.push_back(at);
        }
        pair.free_src.push(rec.prepared.src_slot);
        if rec.verified {
            pair.free_dst.push(rec.prepared.dst_slot);
            pair.finished += 1;
            self.finished += 1;
            self.ledger.remove(&(p, c.tid.0));
        }
        Ok(true)
    }

    pub(super) fn verify(&mut self, p: usize, tid: u32, status: DeliveryStatus) -> VqResult<()> {
        let slot_bytes = self.slot_bytes();
        let len = self.cfg.transfer_size as usize;
        let pair = &mut self.pairs[p];
        let order = Self::order(tid, pair.next_delivery);
        let known = self.ledger.get(&(p, tid)).map(|rec| rec.verified);
        match known {
            // Delivered already: verified, or verified and completed (it left the ledger).
            Some(true) => {
                self.integrity.duplicated += 1;
                return Ok(());
            }
            None if order < 0 => {
                self.integrity.duplicated += 1;
                return Ok(());
            }
            _ => {}
        }
        if order < 0 {
            self.integrity.reordered += 1;
        } else {
            pair.next_delivery = tid.wrapping_add(1);
        }
        if status != DeliveryStatus::Complete {
            return Err(SimError::Accounting(format!(
                "node {} <- {}: transfer {tid} delivered {status:?}",
                pair.dst, pair.src
            )));
        }
        let (src, dst, dst_base) = (pair.src, pair.dst, pair.dst_base);
        let rec = self.ledger.get_mut(&(p, tid)).ok_or_else(|| {
            SimError::Accounting(format!(
                "delivery of unknown transfer {tid} ({src} -> {dst})"
            ))
        })?;
        self.data.resize(len, 0);
        let dst_va = dst_base + u64::from(rec.prepared.dst_slot) * slot_bytes;
        self.nodes[dst].mm.mem.peek(dst_va, &mut self.data)?;
        if checksum(&self.data) != rec.prepared.checksum {
            // Corrupted past every check before this one: counted, and the run goes on (it
            // fails at the end with the counts).
            self.integrity.corrupted += 1;
        }
        rec.verified = true;
        self.bytes += len as u64;
        if rec.completed {
            let dst_slot = rec.prepared.dst_slot;
            self.ledger.remove(&(p, tid));
            let pair = &mut self.pairs[p];
            pair.free_dst.push(dst_slot);
            pair.finished += 1;
            self.finished += 1;
            let src_node = pair.src;
            self.wake_app(src_node, self.q.now());
        }
        Ok(())
    }
}
