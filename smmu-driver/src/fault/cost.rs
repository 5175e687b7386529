//! The cost-based policy: per fault, stall or retransmit, whichever is expected to cost less.
//!
//! A stalled access costs the time its fault takes to resolve, and that time again for every
//! access the stall holds behind it (head-of-line: a stalled destination write holds the write
//! engine and every commit behind it, docs/dma-engine.md §6.3). A terminated access costs the
//! same resolution for itself, plus the retransmission: the link round trip of the NACK and
//! the RESOLVED notice, the block sent again, and the drivers' handling. So, per fault,
//!
//! ```text
//! stall      = resolve × blocked          (the others' delay; the faulting access waits
//! retransmit = retransmit_ns               for `resolve` either way)
//! resolve    = queue + class time          (the fault CPU's backlog, then minor or major)
//! ```
//!
//! Where the engine a stall holds has work waiting, its held time is throughput lost, which
//! every transfer in flight towards it inherits, and a re-sent block takes its own service
//! time from it ([`Capacity`]). Both sides then add that engine time, weighted by the
//! transfers that inherit it:
//!
//! ```text
//! stall      += lost(resolve) × inherit
//! retransmit += lost(resend)  × inherit     lost(t) = min(t, backlog + load × t)
//! ```
//!
//! and [`CostPolicy`] resumes when `stall <= retransmit` (and the resolution fits the stream's
//! stall budget, the master's own limit). The platform feeds it: [`CostPolicy::set_costs`] per
//! access kind (it knows its links, block size and how many accesses are queued behind a
//! stall), [`CostPolicy::set_queue_ns`] (its fault CPU's backlog when the record arrives,
//! until the CPU starts on it: the decision itself is part of the class time)
//! and [`CostPolicy::observe`] with each resolution's service time, from which the policy
//! learns its class times online: an exponentially weighted mean with weight 1/8 per
//! observation, in integer nanoseconds, so a run fed the same observations in the same order
//! decides the same way (deterministic for a seed). The minor time starts at the resolver's
//! own estimate ([`FaultEstimate::Minor`]), the major time at `major_prior_ns`.
//!
//! [`CostPolicy::stall_pays`] answers the question a platform asks once per stream, when it
//! sets up its SMMU contexts (the same comparison as each fault's, with an empty queue): can
//! a stall ever pay on this stream, i.e. does the cheapest
//! resolution it can get (a minor fault with an idle fault CPU) cost less stalled than
//! retransmitted? A stream where it cannot goes on a terminate-mode context: then no fault of
//! it waits for a decision while holding the accesses behind it.
//!
//! State lives in [`Cell`]s: [`FaultPolicy::decide`] takes `&self`, and the handler owning the
//! policy hands out only `&P` ([`FaultHandler::policy`](super::FaultHandler::policy)).

use core::cell::Cell;

use super::policy::{FaultDecision, FaultEstimate, FaultPolicy, PolicyInput, abort_reason};
use super::{AccessKind, FaultCost};

/// What retransmitting costs on one access kind, and what a stall of it holds back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StallCosts {
    /// Expected extra cost of terminate-and-retransmit, in nanoseconds. For a destination
    /// write: the NACK's trip to the sender, the RESOLVED notice's, the block's re-send
    /// (serialization and trip) and the drivers' handling of all three. For a source read:
    /// the engine's fault report, the driver's handling and the local re-issue.
    pub retransmit_ns: u64,
    /// Accesses a stall of this kind holds behind the faulting one, in thousandths (the
    /// head-of-line weight): 0 where a stall holds nothing else.
    pub blocked_milli: u64,
    /// The capacity side: what the engine a stall holds would have done meanwhile, and what
    /// a re-send takes from it (all 0: capacity not weighed).
    pub capacity: Capacity,
}

/// Engine capacity a stall or a re-send takes: at an engine with work waiting, the time it
/// spends held (or on a re-sent block) is throughput lost, and every transfer in flight
/// towards it finishes that much later; at an idle engine it costs nothing. (The virtual
/// QFDB weighs it for destination writes, on the write engine.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Capacity {
    /// Engine work (ns) waiting when the fault is reported: the blocks queued for the engine
    /// times its service time per block.
    pub backlog_ns: u64,
    /// Engine work arriving per unit of time, in thousandths (its utilisation: arrivals per
    /// ns times the service time per block).
    pub load_milli: u64,
    /// The engine's (or the receiving port's, whichever is slower) time for one re-sent block.
    pub resend_ns: u64,
    /// Transfers that inherit lost capacity, in thousandths: those in flight towards the
    /// engine.
    pub inherit_milli: u64,
}

impl Capacity {
    /// The engine time lost when it is unavailable for `ns`: the work it had or got meanwhile,
    /// at most `ns`.
    pub fn lost_ns(&self, ns: u64) -> u64 {
        let arriving = u128::from(ns) * u128::from(self.load_milli) / 1000;
        let work = u128::from(self.backlog_ns) + arriving;
        u64::try_from(work.min(u128::from(ns))).unwrap_or(u64::MAX)
    }

    /// The delay lost engine time of `ns` imposes on the transfers that inherit it.
    pub fn delay_ns(&self, ns: u64) -> u64 {
        let d = u128::from(self.lost_ns(ns)) * u128::from(self.inherit_milli) / 1000;
        u64::try_from(d).unwrap_or(u64::MAX)
    }
}

impl StallCosts {
    /// The longest resolution for which a stall costs no more than retransmitting, on the
    /// head-of-line side alone (without [`Capacity`])
    /// (`u64::MAX` when a stall holds nothing back).
    pub fn break_even_ns(&self) -> u64 {
        if self.blocked_milli == 0 {
            return u64::MAX;
        }
        let ns = u128::from(self.retransmit_ns) * 1000 / u128::from(self.blocked_milli);
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    /// The cost, in nanoseconds, a stall of `resolve_ns` imposes on the accesses behind it
    /// (head-of-line) and, through the engine capacity it takes, on those in flight.
    pub fn stall_ns(&self, resolve_ns: u64) -> u64 {
        let ns = u128::from(resolve_ns) * u128::from(self.blocked_milli) / 1000;
        u64::try_from(ns)
            .unwrap_or(u64::MAX)
            .saturating_add(self.capacity.delay_ns(resolve_ns))
    }

    /// The cost, in nanoseconds, of terminating and retransmitting: the faulting transfer's
    /// extra delay and, through the capacity the re-sent block takes, the others'.
    pub fn resend_ns(&self) -> u64 {
        self.retransmit_ns
            .saturating_add(self.capacity.delay_ns(self.capacity.resend_ns))
    }
}

/// The cost-based policy's decisions, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CostDecisions {
    /// Resumed: the page was already present (nothing to wait for but the TLB).
    pub resumed_present: u64,
    /// Resumed: the expected stall cost was at most the retransmission's.
    pub resumed_cheaper: u64,
    /// Terminated: the expected stall cost was above the retransmission's.
    pub terminated_dearer: u64,
    /// Terminated: the resolution would outlast the stream's stall budget.
    pub terminated_budget: u64,
    /// Terminated: the access was not stalled (a terminate-mode context) or its stream may
    /// not stall.
    pub terminated_not_stalled: u64,
    /// Aborted (outside every region, read-only, unrecoverable).
    pub aborted: u64,
}

/// Chooses per fault between stall-and-resume and terminate-and-retransmit on expected costs.
#[derive(Debug)]
pub struct CostPolicy {
    read: Cell<StallCosts>,
    write: Cell<StallCosts>,
    queue_ns: Cell<u64>,
    /// Learned minor and major service times. The minor one is `None` until a resolution
    /// was observed (until then the resolver's estimate stands); 0 is a real observation (a
    /// fault resolved at once), not "nothing yet".
    minor_ns: Cell<Option<u64>>,
    major_ns: Cell<u64>,
    decisions: Cell<CostDecisions>,
}

/// Weight of one observation in the learned means: 1 / 2^LEARN_SHIFT.
const LEARN_SHIFT: u32 = 3;

impl CostPolicy {
    /// A policy with the costs of each access kind and a prior for the major fault's
    /// service time (the minor one starts at the resolver's estimate).
    pub fn new(read: StallCosts, write: StallCosts, major_prior_ns: u64) -> Self {
        Self {
            read: Cell::new(read),
            write: Cell::new(write),
            queue_ns: Cell::new(0),
            minor_ns: Cell::new(None),
            major_ns: Cell::new(major_prior_ns),
            decisions: Cell::new(CostDecisions::default()),
        }
    }

    /// The costs of `kind` now.
    pub fn costs(&self, kind: AccessKind) -> StallCosts {
        match kind {
            AccessKind::Read => self.read.get(),
            AccessKind::Write => self.write.get(),
        }
    }

    /// Updates the costs of `kind` (the platform's view of its links and queues now).
    pub fn set_costs(&self, kind: AccessKind, costs: StallCosts) {
        match kind {
            AccessKind::Read => self.read.set(costs),
            AccessKind::Write => self.write.set(costs),
        }
    }

    /// The fault CPU's backlog, in nanoseconds, before it gets to the next record.
    pub fn set_queue_ns(&self, ns: u64) {
        self.queue_ns.set(ns);
    }

    /// Learns from one resolution that took `service_ns` (queueing excluded). Every value is
    /// an observation, 0 included: a resolution that took no time (the page came back before
    /// the fault CPU looked) pulls the mean down like any fast one.
    pub fn observe(&self, cost: FaultCost, service_ns: u64) {
        let step = |old: u64| {
            if service_ns >= old {
                old + ((service_ns - old) >> LEARN_SHIFT)
            } else {
                old - ((old - service_ns) >> LEARN_SHIFT)
            }
        };
        match cost {
            // The first minor observation replaces the resolver's estimate.
            FaultCost::Minor => self
                .minor_ns
                .set(Some(self.minor_ns.get().map_or(service_ns, step))),
            FaultCost::Major => self.major_ns.set(step(self.major_ns.get())),
        }
    }

    /// The learned service time of `cost` (`None` for minor until one was observed).
    pub fn learned_ns(&self, cost: FaultCost) -> Option<u64> {
        match cost {
            FaultCost::Minor => self.minor_ns.get(),
            FaultCost::Major => Some(self.major_ns.get()),
        }
    }

    /// The decisions taken so far, by reason.
    pub fn decisions(&self) -> CostDecisions {
        self.decisions.get()
    }

    /// Whether a stall on `kind` can ever pay: the cheapest fault it can get, `cheapest`
    /// (a minor fault), resolved on an idle fault CPU, costs no more stalled than
    /// retransmitted. It is the per-fault comparison of [`FaultPolicy::decide`] with an
    /// empty queue (one definition of the resolution time, [`CostPolicy::class_ns`]). A
    /// stream where it cannot belongs on a terminate-mode context.
    pub fn stall_pays(&self, kind: AccessKind, cheapest: &FaultEstimate) -> bool {
        self.class_ns(cheapest)
            .is_some_and(|resolve| self.stall_is_cheaper(kind, resolve))
    }

    /// Whether a stall of `resolve_ns` on `kind` costs no more than retransmitting.
    fn stall_is_cheaper(&self, kind: AccessKind, resolve_ns: u64) -> bool {
        let costs = self.costs(kind);
        costs.stall_ns(resolve_ns) <= costs.resend_ns()
    }

    /// The expected service time of a fault with `estimate` once the fault CPU starts on it
    /// (the learned mean, or the resolver's estimate before any observation; `None` for
    /// estimates that are aborted).
    pub fn class_ns(&self, estimate: &FaultEstimate) -> Option<u64> {
        Some(match *estimate {
            FaultEstimate::Present { .. } => 0,
            FaultEstimate::Minor { expected_ns } => self.minor_ns.get().unwrap_or(expected_ns),
            FaultEstimate::Major | FaultEstimate::Unknown => self.major_ns.get(),
            FaultEstimate::OutsideRegion
            | FaultEstimate::WriteToReadOnly
            | FaultEstimate::Unrecoverable => return None,
        })
    }

    /// The expected resolution time of a fault with `estimate`: the fault CPU's backlog
    /// ([`CostPolicy::set_queue_ns`]) then its service time ([`CostPolicy::class_ns`]).
    pub fn expected_resolve_ns(&self, estimate: &FaultEstimate) -> Option<u64> {
        self.class_ns(estimate)
            .map(|class| self.queue_ns.get().saturating_add(class))
    }

    fn count(&self, f: impl FnOnce(&mut CostDecisions)) {
        let mut d = self.decisions.get();
        f(&mut d);
        self.decisions.set(d);
    }
}

impl FaultPolicy for CostPolicy {
    fn decide(&self, input: &PolicyInput<'_>) -> FaultDecision {
        if let Some(error) = abort_reason(input.record, &input.estimate) {
            self.count(|d| d.aborted = d.aborted.saturating_add(1));
            return FaultDecision::Abort(error);
        }
        if !(input.stalled && input.stall_tolerant) {
            self.count(|d| d.terminated_not_stalled = d.terminated_not_stalled.saturating_add(1));
            return FaultDecision::TerminateAndRetransmit;
        }
        if let FaultEstimate::Present { .. } = input.estimate {
            self.count(|d| d.resumed_present = d.resumed_present.saturating_add(1));
            return FaultDecision::Resume;
        }
        let resolve = self
            .expected_resolve_ns(&input.estimate)
            .unwrap_or(u64::MAX);
        if resolve > input.stall_budget_ns {
            self.count(|d| d.terminated_budget = d.terminated_budget.saturating_add(1));
            return FaultDecision::TerminateAndRetransmit;
        }
        if self.stall_is_cheaper(input.record.access, resolve) {
            self.count(|d| d.resumed_cheaper = d.resumed_cheaper.saturating_add(1));
            FaultDecision::Resume
        } else {
            self.count(|d| d.terminated_dearer = d.terminated_dearer.saturating_add(1));
            FaultDecision::TerminateAndRetransmit
        }
    }
}

#[cfg(test)]
mod tests {
    use hal::Iova;

    use super::*;
    use crate::fault::{FaultKind, FaultRecord, RawSyndrome, SmmuFlavour, SmmuId, StallTag};
    use crate::fault::{StreamFaultConfig, StreamId};

    fn record(access: AccessKind, stalled: bool) -> FaultRecord {
        FaultRecord {
            smmu: SmmuId {
                flavour: SmmuFlavour::V2,
                instance: 0,
            },
            stream: StreamId(7),
            iova: Iova::new(0x4000),
            access,
            kind: FaultKind::Translation,
            level: None,
            stall: stalled.then_some(StallTag(0)),
            syndrome: RawSyndrome::default(),
        }
    }

    fn input<'a>(r: &'a FaultRecord, estimate: FaultEstimate) -> PolicyInput<'a> {
        let cfg = StreamFaultConfig::stall_tolerant(u64::MAX);
        PolicyInput {
            record: r,
            stall_tolerant: cfg.stall_tolerant,
            stalled: r.is_stalled(),
            estimate,
            stall_budget_ns: cfg.stall_budget_ns,
        }
    }

    const MINOR: FaultEstimate = FaultEstimate::Minor { expected_ns: 4_600 };

    #[test]
    fn a_stall_that_holds_nothing_back_is_always_cheaper() {
        let free = StallCosts {
            retransmit_ns: 1_000,
            blocked_milli: 0,
            ..Default::default()
        };
        let p = CostPolicy::new(free, free, 60_000);
        let r = record(AccessKind::Read, true);
        assert_eq!(p.decide(&input(&r, MINOR)), FaultDecision::Resume);
        assert_eq!(
            p.decide(&input(&r, FaultEstimate::Major)),
            FaultDecision::Resume
        );
        assert_eq!(free.break_even_ns(), u64::MAX);
        assert_eq!(p.decisions().resumed_cheaper, 2);
    }

    #[test]
    fn head_of_line_weight_and_queue_tip_a_write_to_retransmission() {
        // A write stall holding 2 blocks behind it; retransmitting costs 10 µs.
        let write = StallCosts {
            retransmit_ns: 10_000,
            blocked_milli: 2_000,
            ..Default::default()
        };
        let p = CostPolicy::new(StallCosts::default(), write, 60_000);
        let w = record(AccessKind::Write, true);
        // 4.6 µs x 2 = 9.2 µs <= 10 µs: stall.
        assert_eq!(p.decide(&input(&w, MINOR)), FaultDecision::Resume);
        // Behind 1 µs of the fault CPU's queue: 5.6 x 2 > 10: retransmit.
        p.set_queue_ns(1_000);
        assert_eq!(
            p.decide(&input(&w, MINOR)),
            FaultDecision::TerminateAndRetransmit
        );
        // A major fault is never worth it here; a present page always is.
        p.set_queue_ns(0);
        assert_eq!(
            p.decide(&input(&w, FaultEstimate::Major)),
            FaultDecision::TerminateAndRetransmit
        );
        assert_eq!(
            p.decide(&input(&w, FaultEstimate::Present { stale_tlb: false })),
            FaultDecision::Resume
        );
        assert_eq!(write.break_even_ns(), 5_000);
        assert!(p.stall_pays(AccessKind::Write, &MINOR));
        let slower = FaultEstimate::Minor { expected_ns: 5_100 };
        assert!(!p.stall_pays(AccessKind::Write, &slower));
        let d = p.decisions();
        assert_eq!(
            (d.resumed_cheaper, d.terminated_dearer, d.resumed_present),
            (1, 2, 1)
        );
    }

    #[test]
    fn a_busy_engine_makes_the_stall_pay_in_capacity() {
        // Head-of-line alone: 4.6 µs x 4 held = 18.4 µs <= 20 µs of re-send: stall.
        let mut write = StallCosts {
            retransmit_ns: 20_000,
            blocked_milli: 4_000,
            ..Default::default()
        };
        let p = CostPolicy::new(StallCosts::default(), write, 60_000);
        let w = record(AccessKind::Write, true);
        assert_eq!(p.decide(&input(&w, MINOR)), FaultDecision::Resume);
        // An idle engine (nothing waiting, nothing arriving) loses nothing either way.
        write.capacity = Capacity {
            backlog_ns: 0,
            load_milli: 0,
            resend_ns: 2_000,
            inherit_milli: 5_000,
        };
        p.set_costs(AccessKind::Write, write);
        assert_eq!(write.capacity.lost_ns(4_600), 0);
        assert_eq!(p.decide(&input(&w, MINOR)), FaultDecision::Resume);
        // A busy engine: the stall takes 4.6 µs from it, the re-send 2 µs, each inherited by
        // 5 transfers: 18.4 + 23 > 20 + 10, so re-send.
        write.capacity.backlog_ns = 10_000;
        p.set_costs(AccessKind::Write, write);
        assert_eq!(write.capacity.lost_ns(4_600), 4_600);
        assert_eq!(write.stall_ns(4_600), 18_400 + 23_000);
        assert_eq!(write.resend_ns(), 30_000);
        assert_eq!(
            p.decide(&input(&w, MINOR)),
            FaultDecision::TerminateAndRetransmit
        );
        // Some load, no backlog: the engine loses only the work that arrives meanwhile.
        write.capacity.backlog_ns = 0;
        write.capacity.load_milli = 500;
        assert_eq!(write.capacity.lost_ns(4_600), 2_300);
        assert_eq!(write.capacity.lost_ns(2_000), 1_000);
    }

    #[test]
    fn unstalled_faults_are_retransmitted_and_bad_ones_aborted() {
        let p = CostPolicy::new(StallCosts::default(), StallCosts::default(), 60_000);
        let r = record(AccessKind::Read, false);
        assert_eq!(
            p.decide(&input(&r, MINOR)),
            FaultDecision::TerminateAndRetransmit
        );
        assert!(matches!(
            p.decide(&input(&r, FaultEstimate::OutsideRegion)),
            FaultDecision::Abort(_)
        ));
        let budgeted = record(AccessKind::Read, true);
        let mut i = input(&budgeted, FaultEstimate::Major);
        i.stall_budget_ns = 10_000;
        assert_eq!(p.decide(&i), FaultDecision::TerminateAndRetransmit);
        let d = p.decisions();
        assert_eq!(
            (d.terminated_not_stalled, d.aborted, d.terminated_budget),
            (1, 1, 1)
        );
    }

    #[test]
    fn service_times_are_learned_online() {
        let write = StallCosts {
            retransmit_ns: 20_000,
            blocked_milli: 1_000,
            ..Default::default()
        };
        let p = CostPolicy::new(StallCosts::default(), write, 60_000);
        let w = record(AccessKind::Write, true);
        // The 60 µs prior makes a major fault dearer than 20 µs of retransmission.
        assert_eq!(
            p.decide(&input(&w, FaultEstimate::Major)),
            FaultDecision::TerminateAndRetransmit
        );
        // A fast swap device: observed majors of 8 µs pull the mean down until stalling pays.
        for _ in 0..40 {
            p.observe(FaultCost::Major, 8_000);
        }
        assert!(p.learned_ns(FaultCost::Major).is_some_and(|ns| ns < 20_000));
        assert_eq!(
            p.decide(&input(&w, FaultEstimate::Major)),
            FaultDecision::Resume
        );
        // The first minor observation replaces the resolver's estimate.
        assert_eq!(p.learned_ns(FaultCost::Minor), None);
        p.observe(FaultCost::Minor, 3_000);
        assert_eq!(p.expected_resolve_ns(&MINOR), Some(3_000));
        p.observe(FaultCost::Minor, 3_800);
        assert_eq!(p.learned_ns(FaultCost::Minor), Some(3_100));
    }

    #[test]
    fn a_zero_ns_resolution_is_an_observation() {
        let p = CostPolicy::new(StallCosts::default(), StallCosts::default(), 60_000);
        // A minor fault that resolved at once replaces the resolver's 4.6 µs estimate ...
        p.observe(FaultCost::Minor, 0);
        assert_eq!(p.learned_ns(FaultCost::Minor), Some(0));
        assert_eq!(p.expected_resolve_ns(&MINOR), Some(0));
        // ... and later ones move the mean from there, not from "nothing observed".
        p.observe(FaultCost::Minor, 8_000);
        assert_eq!(p.learned_ns(FaultCost::Minor), Some(1_000));
        p.observe(FaultCost::Minor, 0);
        assert_eq!(p.learned_ns(FaultCost::Minor), Some(875));
        // A zero major observation pulls the prior down by an eighth.
        p.observe(FaultCost::Major, 0);
        assert_eq!(p.learned_ns(FaultCost::Major), Some(52_500));
    }

    proptest::proptest! {
        /// Each fault's decision is the cost comparison, and the set-up question is the same
        /// comparison with an empty queue.
        #[test]
        fn decide_follows_the_cost_comparison(
            retransmit_ns in 0u64..200_000,
            blocked_milli in 0u64..10_000,
            queue_ns in 0u64..100_000,
            minor_ns in 0u64..100_000,
            learned in proptest::option::of(0u64..100_000),
            write in proptest::bool::ANY,
            major in proptest::bool::ANY,
        ) {
            let costs = StallCosts { retransmit_ns, blocked_milli, ..Default::default() };
            let p = CostPolicy::new(costs, costs, 60_000);
            if let Some(ns) = learned {
                p.observe(if major { FaultCost::Major } else { FaultCost::Minor }, ns);
            }
            let kind = if write { AccessKind::Write } else { AccessKind::Read };
            let estimate = if major {
                FaultEstimate::Major
            } else {
                FaultEstimate::Minor { expected_ns: minor_ns }
            };
            let class = p.class_ns(&estimate).unwrap();
            let r = record(kind, true);
            // Idle fault CPU: the set-up answer and the per-fault decision agree.
            let idle = p.decide(&input(&r, estimate)) == FaultDecision::Resume;
            proptest::prop_assert_eq!(idle, p.stall_pays(kind, &estimate));
            proptest::prop_assert_eq!(idle, class * blocked_milli / 1000 <= retransmit_ns);
            // Behind a queue: the comparison with the queue added.
            p.set_queue_ns(queue_ns);
            let resolve = queue_ns + class;
            let queued = p.decide(&input(&r, estimate)) == FaultDecision::Resume;
            proptest::prop_assert_eq!(queued, resolve * blocked_milli / 1000 <= retransmit_ns);
        }
    }
}
