//! The scenario's side of the fault service's loop: which transfer in flight a fault
//! belongs to (docs/mmu500.md §2.3), and what its outcome means for that transfer.

use smmu_driver::fault::{FaultOutcome, FaultVisitor, TakenFault};

use super::*;

/// Attributes each fault to a running transfer, or to the bank, and records the outcome in
/// the transfers' fault logs and the phase's counters.
pub(super) struct Attributor<'a> {
    pub(super) specs: &'a [Spec],
    pub(super) running: &'a mut [Running; 2],
    pub(super) streams: [StreamId; 2],
    pub(super) counters: &'a mut Counters,
    /// The transfer the fault being serviced belongs to.
    pub(super) owner: Option<usize>,
}

impl Attributor<'_> {
    fn in_flight(&self) -> usize {
        self.specs.len().min(2)
    }

    /// Attributes `fault` and notes what it means for every transfer in flight.
    fn note(&mut self, fault: &TakenFault) {
        let n = self.in_flight();
        // What is in flight: each running transfer's source and destination.
        // At most two transfers of two ranges each, so the pushes cannot fail.
        let mut ranges: heapless::Vec<InFlightAccess, 4> = heapless::Vec::new();
        let mut transfer_of: heapless::Vec<usize, 4> = heapless::Vec::new();
        for (i, s) in self.specs.iter().enumerate().take(n) {
            if self.running[i].outcome.is_some() {
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
        self.owner = owner;
        if owner.is_none() {
            self.counters.unattributed += 1;
        }
        for (i, r) in self.running[..n].iter_mut().enumerate() {
            if r.outcome.is_none() {
                r.log.bank_faulted = true;
                r.log.foreign_fault |= owner.is_some_and(|o| o != i);
            }
        }
        if fault.lost {
            self.counters.multi += 1;
        }
        if owner.is_none() || fault.lost {
            // Some fault's stream or address is unknown: every transfer in flight on the
            // bank is suspect (docs/mmu500.md §2.3).
            for r in self.running[..n].iter_mut().filter(|r| r.outcome.is_none()) {
                r.log.suspect = true;
            }
        }
        let Some(record) = fault.record else {
            // A stalled transaction without a record (FSR.MULTI with SS) waits for the
            // RESUME of the record taken before it, which the fault service writes.
            return;
        };
        self.counters.faults += 1;
        if record.is_stalled() {
            self.counters.stalls += 1;
        }
        // A fault no running transfer explains counts against all of them, towards a fault
        // storm; an attempt already doomed (aborted, terminated or suspect) is not counted:
        // an engine that carries on after an error response faults on each of its remaining
        // bursts, and the attempt ends with the transfer anyway.
        for (i, r) in self.running[..n].iter_mut().enumerate() {
            let doomed = r.log.abort.is_some() || r.log.needs_resend();
            if r.outcome.is_none() && !doomed && owner.is_none_or(|o| o == i) {
                r.log.faults += 1;
            }
        }
    }
}

impl FaultVisitor for Attributor<'_> {
    /// Only a fault attributed to a transfer whose attempt is still live is serviced. An
    /// attempt already doomed (aborted, terminated or suspect) will be sent again or failed
    /// anyway: its stalled transaction is terminated rather than resumed, so the engine runs to
    /// the end of the attempt (resuming could go on for ever: a doomed attempt's faults do
    /// not count towards a fault storm).
    fn wants(&mut self, fault: &TakenFault) -> bool {
        self.note(fault);
        self.owner.is_some_and(|o| {
            let log = &self.running[o].log;
            log.abort.is_none() && !log.needs_resend()
        })
    }

    fn done(&mut self, fault: &TakenFault, outcome: Option<&FaultOutcome>) {
        if fault.record.is_none() {
            self.note(fault);
        }
        let (Some(outcome), Some(owner)) = (outcome, self.owner) else {
            if fault.record.is_some_and(|r| r.is_stalled()) && self.owner.is_some() {
                // Refused above: a doomed attempt's stall, terminated by the loop.
                self.counters.doomed_stalls += 1;
            }
            return;
        };
        match outcome.mapped.map(|p| p.cost) {
            Some(FaultCost::Minor) => self.counters.minor += 1,
            Some(FaultCost::Major) => self.counters.major += 1,
            None => {}
        }
        match outcome.decision {
            FaultDecision::Resume => {
                self.counters.resumes += 1;
                if outcome.mapped.is_some_and(|p| p.cost == FaultCost::Major) {
                    self.counters.resumed_major += 1;
                }
            }
            FaultDecision::TerminateAndRetransmit => self.running[owner].log.terminated = true,
            FaultDecision::Abort(error) => self.running[owner].log.abort = Some(error),
        }
    }
}
