//! The application on each node: preparing, posting and completing transfers.

use super::*;

impl<'p> World<'p> {
    pub(super) fn wake_app(&mut self, n: usize, at: ModelTime) {
        if !self.nodes[n].app_busy {
            self.nodes[n].app_busy = true;
            let at = at.max(self.nodes[n].app_free_at);
            self.q.schedule(at, Ev::AppRun(n));
        }
    }

    /// Open loop: the time between two arrivals of pair `p` (exponential, mean such that all
    /// pairs together offer the configured load).
    pub(super) fn arrival_gap(&mut self, p: usize) -> ModelTime {
        let load = self.cfg.offered_load_gbps.unwrap_or(1.0) * 1e9;
        let bits = f64::from(self.cfg.transfer_size) * 8.0;
        let mean_ps = bits * self.pairs.len() as f64 / load * 1e12;
        let u = self.pairs[p].arrival_rng.next_f64();
        ModelTime((-(1.0 - u).ln() * mean_ps) as u64)
    }

    /// Open loop: moves the arrivals of node `n`'s pairs up to `now` into their queues and
    /// schedules the application's wake-up for the next one.
    fn pump_arrivals(&mut self, n: usize, now: ModelTime) {
        let mut next = None::<ModelTime>;
        for i in 0..self.nodes[n].out_pairs.len() {
            let p = self.nodes[n].out_pairs[i];
            while self.pairs[p].arrived < self.pairs[p].quota && self.pairs[p].next_arrival <= now {
                let at = self.pairs[p].next_arrival;
                self.pairs[p].intents.push_back(at);
                self.pairs[p].arrived += 1;
                let gap = self.arrival_gap(p);
                self.pairs[p].next_arrival = at.after(gap);
            }
            if self.pairs[p].arrived < self.pairs[p].quota {
                let at = self.pairs[p].next_arrival;
                next = Some(next.map_or(at, |t| t.min(at)));
            }
        }
        if let Some(at) = next
            && self.nodes[n].arrival_wake.is_none_or(|t| t > at)
        {
            self.nodes[n].arrival_wake = Some(at);
            self.q.schedule(at, Ev::Arrival(n));
        }
    }

    /// The application prepares the next transfer of one of its pairs, round-robin.
    pub(super) fn app_run(&mut self, n: usize, now: ModelTime) -> VqResult<()> {
        self.nodes[n].app_busy = false;
        let open_loop = self.cfg.offered_load_gbps.is_some();
        if open_loop {
            self.pump_arrivals(n, now);
        }
        let count = self.nodes[n].out_pairs.len();
        let limit = if self.cfg.overpost {
            self.cfg.slots
        } else {
            self.cfg.depth
        };
        let mut chosen = None;
        for step in 0..count {
            let i = (self.nodes[n].next_pair + step) % count;
            let p = self.nodes[n].out_pairs[i];
            let pair = &mut self.pairs[p];
            if let Some(waiting) = pair.waiting.take() {
                // Refused by back-pressure earlier: post it again.
                self.nodes[n].app_busy = true;
                self.q.schedule(now, Ev::AppPost(n, waiting));
                self.nodes[n].next_pair = (i + 1) % count;
                return Ok(());
            }
            if pair.submitted < pair.quota
                && (!open_loop || !pair.intents.is_empty())
                && pair.inflight < limit
                && !pair.free_src.is_empty()
                && !pair.free_dst.is_empty()
            {
                chosen = Some(p);
                self.nodes[n].next_pair = (i + 1) % count;
                break;
            }
        }
        let Some(p) = chosen else {
            return Ok(());
        };
        let slot_bytes = self.slot_bytes();
        let len = self.cfg.transfer_size as usize;
        let costs = self.cfg.costs;
        let intended;
        let (src, dst, seq, src_slot, dst_slot, src_va, dst_va) = {
            let pair = &mut self.pairs[p];
            let src_slot = pair.free_src.pop().unwrap_or(0);
            let dst_slot = pair.free_dst.pop().unwrap_or(0);
            let seq = pair.submitted;
            pair.submitted += 1;
            pair.inflight += 1;
            intended = pair.intents.pop_front().unwrap_or(now).min(now);
            // A fresh transfer on these slots: only its own faults count for it.
            for class in [
                pair.src_class.get_mut(src_slot as usize),
                pair.dst_class.get_mut(dst_slot as usize),
            ]
            .into_iter()
            .flatten()
            {
                *class = FaultClass::None;
            }
            (
                pair.src,
                pair.dst,
                seq,
                src_slot,
                dst_slot,
                pair.src_base + u64::from(src_slot) * slot_bytes,
                pair.dst_base + u64::from(dst_slot) * slot_bytes,
            )
        };
        // Produce the data (not charged: it is the workload, not the transfer).
        let mut data_rng = SplitMix64::derive(self.cfg.seed ^ 0xDA7A, (p as u64) << 40 | seq);
        self.data.resize(len, 0);
        for chunk in self.data.chunks_mut(8) {
            let w = data_rng.next_u64().to_le_bytes();
            chunk.copy_from_slice(w.get(..chunk.len()).unwrap_or(&[]));
        }
        let sum = checksum(&self.data);
        let mut t = now.max(self.nodes[n].app_free_at);
        let pages = (len as u64).div_ceil(PAGE);
        // The CPU's stores bring the source pages in (its faults are charged).
        for page in 0..pages {
            t = self.cpu_access(n, src_va + page * PAGE, t)?;
        }
        self.nodes[n].mm.mem.write_resident(src_va, &self.data)?;
        // Background reclaim (pressure from other memory users) has taken each page of the
        // transfer away with probability `fault_rate`. A destination page at a uniformly
        // random moment since the slot was last used: recently taken pages are still in
        // memory (minor fault), older ones were written to swap (major fault). A source page
        // only after the CPU's stores above made it resident with the new data, so now: it is
        // still in memory (a minor fault); writing it to swap "before" the data existed would
        // be a major fault that cannot happen.
        let rate = self.cfg.fault_rate;
        let dst_used = std::mem::replace(&mut self.pairs[p].dst_used[dst_slot as usize], now);
        for page in 0..pages {
            if self.rng.chance(rate) {
                let va = src_va + page * PAGE;
                let mm = &mut self.nodes[n].mm;
                if mm.mem.is_resident(va) && !mm.mem.is_pinned(va) {
                    mm.deactivate_at(va, now)?;
                }
            }
            if self.rng.chance(rate) {
                let va = dst_va + page * PAGE;
                let when = dst_used.after(ModelTime(
                    (now.since(dst_used).0 as f64 * self.rng.next_f64()) as u64,
                ));
                let mm = &mut self.nodes[dst].mm;
                if mm.mem.is_resident(va) && !mm.mem.is_pinned(va) {
                    mm.deactivate_at(va, when)?;
                }
            }
        }
        if self.cfg.strategy == Strategy::PreFault {
            for page in 0..pages {
                t = t.after(costs.touch_page);
                t = self.cpu_access(n, src_va + page * PAGE, t)?;
            }
        }
        t = t.after(costs.app_post);
        self.nodes[n].app_free_at = t;
        self.nodes[n].app_busy = true;
        let _ = src;
        self.q.schedule(
            t,
            Ev::AppPost(
                n,
                Prepared {
                    pair: p,
                    intended,
                    seq,
                    src_slot,
                    dst_slot,
                    checksum: sum,
                },
            ),
        );
        Ok(())
    }

    /// A CPU access by the application at `t`; returns when it is done.
    pub(super) fn cpu_access(&mut self, n: usize, va: u64, t: ModelTime) -> VqResult<ModelTime> {
        let costs = self.cfg.costs;
        let node = &mut self.nodes[n];
        let (fault, io_done) = node.mm.cpu_touch(va, t, false)?;
        Ok(match fault {
            None => t,
            Some(FaultCost::Minor) => {
                node.faults.counters.cpu_faults += 1;
                t.after(costs.cpu_minor_fault)
            }
            Some(FaultCost::Major) => {
                node.faults.counters.cpu_faults += 1;
                io_done.max(t).after(costs.cpu_minor_fault)
            }
        })
    }

    pub(super) fn app_post(
        &mut self,
        n: usize,
        now: ModelTime,
        prepared: Prepared,
    ) -> VqResult<()> {
        self.nodes[n].app_busy = false;
        let slot_bytes = self.slot_bytes();
        let pair = &self.pairs[prepared.pair];
        let desc = TransferDesc {
            src: pair.src_base + u64::from(prepared.src_slot) * slot_bytes,
            dest: pair.dst_base + u64::from(prepared.dst_slot) * slot_bytes,
            len: u64::from(self.cfg.transfer_size),
            key: u32::from(PDID),
            tag: prepared.seq,
        };
        let channel = pair.channel;
        match self.nodes[n].driver.submit(channel, desc) {
            Ok(tid) => {
                self.first_post.get_or_insert(now);
                self.ledger.insert(
                    (prepared.pair, tid.0),
                    Record {
                        prepared,
                        completed: false,
                        verified: false,
                    },
                );
                self.request_driver(n, now);
            }
            Err(e) if e.is_back_pressure() => {
                // Nothing is dropped: the transfer waits for a completion.
                self.back_pressure += 1;
                self.pairs[prepared.pair].waiting = Some(prepared);
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
        self.wake_app(n, now);
        Ok(())
    }
}
