//! The report of a finished run.

use super::*;

impl<'p> World<'p> {
    pub(super) fn report(&mut self) -> VqResult<RunReport> {
        // Transfers still in the ledger never both completed and arrived.
        self.integrity.lost += self.ledger.len() as u64;
        let mut r = RunReport {
            strategy: self.cfg.strategy.name().into(),
            workload: self.cfg.workload.name().into(),
            nodes: self.cfg.nodes,
            fault_rate: self.cfg.fault_rate,
            seed: self.cfg.seed,
            transfers: self.finished,
            bytes: self.bytes,
            setup: self.setup,
            events: self.q.processed(),
            back_pressure: self.back_pressure,
            integrity: self.integrity,
            ..RunReport::default()
        };
        let start = self.first_post.unwrap_or(ModelTime::ZERO);
        r.duration = self.last_completion.since(start);
        if r.duration.0 > 0 {
            r.throughput_gbps = self.bytes as f64 * 8.0 / r.duration.as_secs() / 1e9;
        }
        r.offered_load_gbps = self.cfg.offered_load_gbps;
        r.latency = self.latency.percentiles();
        for (slot, h) in r.latency_by_class.iter_mut().zip(&self.latency_by_class) {
            *slot = h.percentiles();
        }
        if self.cfg.keep_samples {
            let mut samples = std::mem::take(&mut self.latencies);
            samples.sort_by(f64::total_cmp);
            r.samples = samples;
        }
        let mut faults = 0;
        for node in &self.nodes {
            if let Some(policy) = node.faults.handler.policy().cost() {
                let d = policy.decisions();
                let t = &mut r.decisions;
                t.resumed_present += d.resumed_present;
                t.resumed_cheaper += d.resumed_cheaper;
                t.terminated_dearer += d.terminated_dearer;
                t.terminated_budget += d.terminated_budget;
                t.terminated_not_stalled += d.terminated_not_stalled;
                t.aborted += d.aborted;
            }
            for (count, stalls) in r.stalling_streams.iter_mut().zip(node.stalling) {
                *count += usize::from(stalls);
            }
            let fs = node.faults.handler.stats();
            r.minor_faults += fs.minor;
            r.major_faults += fs.major;
            r.spurious_faults += fs.spurious;
            r.resumed += fs.resumed;
            r.cpu_faults += node.faults.counters.cpu_faults;
            let ss = node.mm.smmu.stats();
            r.translations += ss.translations;
            r.stalls += ss.stalls;
            r.terminations += ss.terminated + ss.stall_terminated;
            faults += ss.faults;
            let ds = node.driver.stats();
            r.nacks += ds.nacks_sent;
            r.resolved_notices += ds.resolved_sent;
            r.source_faults += ds.local_faults - ds.local_fault_retries;
            r.dropped_messages += ds.duplicates + ds.unknown_transfer;
            for &p in &node.out_pairs {
                r.retransmissions += node
                    .driver
                    .sender_stats(self.pairs[p].channel)?
                    .retransmissions;
            }
            let es = *node.driver.bus().lock().stats();
            r.rx_held += es.rx_held;
            r.crc_drops += es.crc_drops;
            r.stall_time = r
                .stall_time
                .after(es.read_stall_time)
                .after(es.write_stall_time);
            r.write_stall_time = r.write_stall_time.after(es.write_stall_time);
            if es.unordered_doorbells
                + es.bad_doorbells
                + es.bad_descriptors
                + es.queue_errors
                + es.link_errors
                > 0
            {
                return Err(SimError::Internal(format!(
                    "engine saw driver errors: {} unordered doorbells, {} bad doorbells, {} bad descriptors, {} queue errors, {} link errors",
                    es.unordered_doorbells,
                    es.bad_doorbells,
                    es.bad_descriptors,
                    es.queue_errors,
                    es.link_errors
                )));
            }
            let ms = node.mm.mem.stats();
            r.resident_peak += ms.peak_resident * PAGE;
            r.swap_outs += ms.swap_outs;
            r.footprint += node.mm.mem.pages() as u64 * PAGE;
            let limit = node.mm.mem.limit() as u64 * PAGE;
            r.memory_limit = r.memory_limit.max(limit);
            r.memory_limit_total += limit;
        }
        if r.translations > 0 {
            r.measured_fault_rate = faults as f64 / r.translations as f64;
        }
        Ok(r)
    }
}
