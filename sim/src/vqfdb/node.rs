//! One node of the virtual QFDB: its memory manager, fault service and driver host.

use std::collections::HashMap;
use std::sync::Arc;

use dma_engine::npe::{FaultClass, Npe, NpeHost};
use hal::dma::HostDma;
use hal::model::ModelBus;
use hal::{Iova, PageSize, PhysAddr, VirtAddr};
use protocol::{Access, FaultReason, Generation, PageEntry, PageStateTable};
use smmu_driver::fault::{
    AccessKind, CostPolicy, FaultCost, FaultDecision, FaultHandler, FaultKind, FaultPlan,
    FaultPolicy, FaultRecord, PolicyInput, RawSyndrome, SmmuFlavour, SmmuId, StallTag,
    StandardPolicy, StreamFaultConfig, StreamId,
};
use smmu_driver::pagetable::{Attributes, PageTable, Permissions, TlbMaintenance};

use super::smmu::{FaultPort, NodeSmmu};
use super::{CostModel, SimError, VqResult};
use crate::des::ModelTime;
use crate::node_memory::{NodeMemory, PAGE, Victim};
use crate::npe::NpeModel;

/// Channels of the driver instance the virtual QFDB uses (15 peers + the control channel).
pub(crate) const CH: usize = 16;
/// Peers a node accepts data from.
pub(crate) const PEERS: usize = 16;
/// Transfers open per connection.
pub(crate) const WINDOW: usize = 8;
/// Blocks per transfer (128 KiB transfers).
pub(crate) const MAX_BLOCKS: usize = 32;

/// The driver type every node runs.
pub(crate) type Driver = Npe<ModelBus<NpeModel>, CH, PEERS, WINDOW, MAX_BLOCKS>;

/// The memory-manager side of a node: memory, the SMMU tables, the page-state table.
pub(crate) struct Mm {
    pub mem: NodeMemory,
    pub table: PageTable<Arc<HostDma>>,
    pub pstate: PageStateTable<Vec<PageEntry>>,
    /// Generation of the last invalidation of each page (the SoC form of the version check,
    /// docs/dma-engine.md §5.2).
    pub invalidated_at: Vec<u64>,
    pub smmu: NodeSmmu,
    /// The engine's read and write streams for this node's PDID.
    pub read_stream: StreamId,
    pub write_stream: StreamId,
    pub pdid: u16,
}

impl Mm {
    fn page_index(&self, va: u64) -> Option<usize> {
        let off = va.checked_sub(self.mem.va_base())?;
        let idx = usize::try_from(off / PAGE).ok()?;
        (idx < self.mem.pages()).then_some(idx)
    }

    /// Installs the translation of a page the memory made resident, then records it in the
    /// page-state table (translation first: protocol §3.4).
    pub fn map(&mut self, va: u64, frame: PhysAddr) -> VqResult<Generation> {
        let page = va & !(PAGE - 1);
        let inv = self.table.map(
            Iova::new(page),
            frame,
            PageSize::Size4K,
            &Attributes::normal(Permissions::READ_WRITE),
            &mut self.smmu,
        )?;
        if !inv.is_empty() {
            self.smmu.invalidate_now(&inv)?;
        }
        Ok(self
            .pstate
            .mark_present(VirtAddr::new(page), PageSize::Size4K, frame, true)?)
    }

    /// Takes a page's translation away: page-state invalidation first, then the table and
    /// the TLB (protocol §3.4).
    pub fn unmap(&mut self, va: u64) -> VqResult<()> {
        let page = va & !(PAGE - 1);
        let inv = self.pstate.invalidate(VirtAddr::new(page), PAGE)?;
        if let Some(idx) = self.page_index(page)
            && let Some(slot) = self.invalidated_at.get_mut(idx)
        {
            *slot = inv.generation.0;
        }
        let runs = self.table.unmap(Iova::new(page), PAGE, &mut self.smmu)?;
        if !runs.is_empty() {
            self.smmu.invalidate_now(&runs)?;
        }
        Ok(())
    }

    /// Background reclaim takes a resident page away (it stays in memory, inactive).
    pub fn deactivate(&mut self, va: u64) -> VqResult<()> {
        self.check_reclaimable(va)?;
        self.unmap(va)?;
        self.mem.deactivate(va)
    }

    /// Background reclaim took a resident page away at `when` (in the past): it is inactive,
    /// or already written to swap if it is older than the write-back age.
    pub fn deactivate_at(&mut self, va: u64, when: ModelTime) -> VqResult<()> {
        self.check_reclaimable(va)?;
        self.unmap(va)?;
        self.mem.deactivate_at(va, when)
    }

    /// Refuses, before anything is unmapped, a page reclaim cannot take: one that is not
    /// resident, or pinned (unmapping it first would leave a pinned page faulting).
    fn check_reclaimable(&self, va: u64) -> VqResult<()> {
        if !self.mem.is_resident(va) || self.mem.is_pinned(va) {
            return Err(SimError::Internal(format!(
                "reclaim of a page that is not resident and unpinned at {va:#x}"
            )));
        }
        Ok(())
    }

    /// Reclaims until a frame is free under the limit.
    pub fn ensure_free_frame(&mut self, now: ModelTime) -> VqResult<()> {
        let mut guard = 0;
        while !self.mem.has_free_frame() {
            guard += 1;
            if guard > 1_000_000 {
                return Err(SimError::Internal("reclaim makes no progress".into()));
            }
            match self.mem.pick_victim() {
                Some(Victim::Cached(va)) => self.mem.evict(va, now)?,
                Some(Victim::Resident(va)) => {
                    self.unmap(va)?;
                    self.mem.evict(va, now)?;
                }
                None => {
                    return Err(SimError::OutOfMemory(format!(
                        "every one of the {} frames under the limit is pinned",
                        self.mem.limit()
                    )));
                }
            }
        }
        Ok(())
    }

    /// A CPU access to `va`: makes the page resident and mapped if needed. Returns the fault
    /// it took (if any) and when its I/O completes.
    pub fn cpu_touch(
        &mut self,
        va: u64,
        now: ModelTime,
        pin: bool,
    ) -> VqResult<(Option<FaultCost>, ModelTime)> {
        let cost = self.mem.fault_cost(va);
        let mut io_done = now;
        if cost.is_some() {
            if self.mem.needs_frame(va) && !pin {
                self.ensure_free_frame(now)?;
            }
            if cost == Some(FaultCost::Major) {
                io_done = self.mem.reserve_swap_in(now);
            }
            let (frame, _) = self.mem.make_resident(va, pin)?;
            self.map(va, frame)?;
        } else if pin {
            self.mem.make_resident(va, true)?;
        }
        self.mem.reference(va);
        Ok((cost, io_done))
    }

    /// The SoC version check (docs/dma-engine.md §5.2): every page of the range is present
    /// and none was invalidated after `since`.
    pub fn check_written(&self, va: u64, len: u64, since: Generation) -> Result<(), FaultReason> {
        let mut page = va & !(PAGE - 1);
        let end = va.saturating_add(len);
        while page < end {
            let Some(idx) = self.page_index(page) else {
                return Err(FaultReason::OutOfRegion);
            };
            let present = self
                .pstate
                .lookup(VirtAddr::new(page))
                .map(|s| s.present)
                .unwrap_or(false);
            if !present {
                return Err(FaultReason::NotPresent);
            }
            if self.invalidated_at.get(idx).copied().unwrap_or(0) > since.0 {
                return Err(FaultReason::PageChanged);
            }
            page += PAGE;
        }
        Ok(())
    }
}

/// The policy a node's fault service runs: one of the fixed rules, or the cost-based one
/// (`hybrid`, fed by the node: docs/virtual-qfdb.md, "The hybrid policy").
#[derive(Debug)]
pub(crate) enum NodePolicy {
    Standard(StandardPolicy),
    Cost(CostPolicy),
}

impl FaultPolicy for NodePolicy {
    fn decide(&self, input: &PolicyInput<'_>) -> FaultDecision {
        match self {
            NodePolicy::Standard(p) => p.decide(input),
            NodePolicy::Cost(p) => p.decide(input),
        }
    }
}

impl NodePolicy {
    /// The cost-based policy, if that is what the node runs.
    pub fn cost(&self) -> Option<&CostPolicy> {
        match self {
            NodePolicy::Cost(p) => Some(p),
            NodePolicy::Standard(_) => None,
        }
    }
}

/// A resolution in progress.
pub(crate) struct Inflight {
    pub plan: FaultPlan,
    /// When the fault CPU started on it, and what it is expected to cost (for the cost-based
    /// policy's learning).
    pub started: ModelTime,
    pub cost: Option<FaultCost>,
    /// Stalled transactions to resume when the page is present.
    pub resume: Vec<StallTag>,
}

/// Counters of a node's fault service.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FaultCounters {
    pub cpu_faults: u64,
}

/// The node's fault service: the SMMU driver's `FaultHandler` with the node memory as
/// resolver, on its own modelled CPU.
pub(crate) struct FaultService {
    pub handler: FaultHandler<NodePolicy>,
    /// Source reads stall only their channel.
    pub read_cfg: StreamFaultConfig,
    /// A stalled destination write holds every commit behind it, so its stall budget is
    /// smaller (docs/dma-engine.md §6.3).
    pub write_cfg: StreamFaultConfig,
    pub inflight: HashMap<u64, Inflight>,
    pub cpu_free_at: ModelTime,
    pub counters: FaultCounters,
}

/// What the fault service wants scheduled after handling a record.
pub(crate) enum FaultAction {
    /// Nothing more (attached to a resolution in progress, or handled at once).
    None,
    /// Terminate the stalled transaction at this time.
    Terminate(ModelTime, StallTag),
    /// The resolution of `page` completes at this time.
    Resolve(ModelTime, u64),
    /// The fault cannot be resolved; tell the driver at this time.
    Unresolvable(ModelTime, u64, FaultReason),
}

impl FaultService {
    pub fn new(policy: NodePolicy, read_budget: u64, write_budget: u64) -> Self {
        Self {
            handler: FaultHandler::new(policy),
            read_cfg: StreamFaultConfig::stall_tolerant(read_budget),
            write_cfg: StreamFaultConfig::stall_tolerant(write_budget),
            inflight: HashMap::new(),
            cpu_free_at: ModelTime::ZERO,
            counters: FaultCounters::default(),
        }
    }

    /// A synthetic record for a fault the engine driver reported (terminated access whose
    /// SMMU record may have been merged or not read yet).
    pub fn record_for(stream: StreamId, va: u64, access: Access) -> FaultRecord {
        FaultRecord {
            smmu: SmmuId {
                flavour: SmmuFlavour::V2,
                instance: 0,
            },
            stream,
            iova: Iova::new(va),
            access: match access {
                Access::Read => AccessKind::Read,
                Access::Write => AccessKind::Write,
            },
            kind: FaultKind::Translation,
            level: None,
            stall: None,
            syndrome: RawSyndrome::default(),
        }
    }

    /// The engine's two streams with what each declared about faults.
    pub fn streams(&self, mm: &Mm) -> [(StreamId, StreamFaultConfig); 2] {
        [
            (mm.read_stream, self.read_cfg),
            (mm.write_stream, self.write_cfg),
        ]
    }

    /// The fault CPU's backlog at `now`: how long until it starts on a record arriving then.
    pub fn queue_ns(&self, now: ModelTime) -> u64 {
        now.max(self.cpu_free_at).since(now).as_ns()
    }

    /// Decides on `record` at `now`; returns what to schedule (up to two actions).
    pub fn on_record(
        &mut self,
        now: ModelTime,
        record: &FaultRecord,
        mm: &mut Mm,
        costs: &CostModel,
    ) -> VqResult<[FaultAction; 2]> {
        let page = record.iova.as_u64() & !(PAGE - 1);
        let token = record.stall;
        let start = now.max(self.cpu_free_at);
        let decided = start.after(costs.fault_decide);
        if let Some(policy) = self.handler.policy().cost() {
            // The stall lasts from now: the fault CPU's backlog, then the fault's service
            // time (decision included: `CostModel::minor_service`, `major_service`).
            policy.set_queue_ns(self.queue_ns(now));
        }
        let streams = self.streams(mm);
        let Mm {
            mem, table, smmu, ..
        } = mm;
        let mut port = FaultPort {
            smmu,
            now: decided,
            streams,
        };
        let plan = self.handler.decide_for(&mut port, record, mem, table)?;
        if let Some(inflight) = self.inflight.get_mut(&page) {
            // Already being resolved: this record only needs its own stall answered.
            self.cpu_free_at = decided;
            return Ok(match (plan.decision, token) {
                (FaultDecision::Resume, Some(t)) => {
                    inflight.resume.push(t);
                    [FaultAction::None, FaultAction::None]
                }
                (_, Some(t)) => [FaultAction::Terminate(decided, t), FaultAction::None],
                (_, None) => [FaultAction::None, FaultAction::None],
            });
        }
        match plan.decision {
            FaultDecision::Abort(_) => {
                self.cpu_free_at = decided;
                let reason = match plan.estimate {
                    smmu_driver::fault::FaultEstimate::WriteToReadOnly => FaultReason::Permission,
                    _ => FaultReason::OutOfRegion,
                };
                let first = token.map_or(FaultAction::None, |t| FaultAction::Terminate(decided, t));
                Ok([first, FaultAction::Unresolvable(decided, page, reason)])
            }
            decision => {
                let cost = mm.mem.fault_cost(page);
                let (cpu_done, done) = match cost {
                    None => (decided, decided),
                    Some(FaultCost::Minor) => {
                        // An inactive page must not be written back while its minor fault
                        // is being resolved.
                        mm.mem.hold_for_fault(page);
                        let t = start.after(costs.minor_service());
                        (t, t)
                    }
                    Some(FaultCost::Major) => {
                        // The CPU issues the swap read once it decided; the page is ready when
                        // both the read and the CPU's own work are done.
                        let io = mm.mem.reserve_swap_in(decided);
                        let cpu = decided.after(costs.major_fault_cpu);
                        (cpu, io.max(cpu))
                    }
                };
                self.cpu_free_at = cpu_done;
                let mut resume = Vec::new();
                let mut first = FaultAction::None;
                match (decision, token) {
                    (FaultDecision::Resume, Some(t)) => resume.push(t),
                    (_, Some(t)) => first = FaultAction::Terminate(decided, t),
                    _ => {}
                }
                self.inflight.insert(
                    page,
                    Inflight {
                        plan,
                        started: start,
                        cost,
                        resume,
                    },
                );
                Ok([first, FaultAction::Resolve(done, page)])
            }
        }
    }
}

/// The driver's view of the node (its `NpeHost`).
pub(crate) struct HostView<'a> {
    pub mm: &'a mut Mm,
    pub requests: &'a mut Vec<(u64, Access)>,
}

impl NpeHost for HostView<'_> {
    fn classify(&mut self, pdid: u16, va: u64, _access: Access) -> FaultClass {
        if pdid != self.mm.pdid || !self.mm.mem.contains(va) {
            return FaultClass::Denied(FaultReason::OutOfRegion);
        }
        if self.mm.mem.is_resident(va) {
            FaultClass::Present
        } else {
            FaultClass::Resolvable
        }
    }

    fn request_resolution(&mut self, pdid: u16, va: u64, access: Access) {
        if pdid == self.mm.pdid {
            self.requests.push((va, access));
        }
    }

    fn snapshot(&self, _pdid: u16) -> Generation {
        self.mm.pstate.generation()
    }

    fn check(&self, pdid: u16, va: u64, len: u64, since: Generation) -> Result<(), FaultReason> {
        if pdid != self.mm.pdid {
            return Err(FaultReason::OutOfRegion);
        }
        self.mm.check_written(va, len, since)
    }
}

/// The cost-based policy's view of one node, from the run's configuration (the node feeds
/// the dynamic parts, its queues, at each decision: `World::fault_record`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct NodeCosts {
    /// Extra cost of terminating and re-sending a destination write (ns).
    pub write_retransmit_ns: u64,
    /// Extra cost of terminating and re-issuing a source read locally (ns).
    pub read_retransmit_ns: u64,
    /// Blocks arriving at the write engine per microsecond (expected, thousandths).
    pub arrivals_milli_per_us: u64,
    /// The write engine's expected backlog under the workload (blocks, thousandths).
    pub write_backlog_milli: u64,
    /// Transfers a stalled source read holds on its channel: the others of its pair in
    /// flight (thousandths).
    pub read_blocked_milli: u64,
    /// Transfers in flight towards the node besides the faulting one (thousandths): however
    /// many blocks wait behind a stalled write, they delay at most these transfers.
    pub others_milli: u64,
    /// The write engine's service time per block (one AXI write of a block, ns).
    pub write_service_ns: u64,
    /// The write engine's utilisation under the workload (thousandths).
    pub write_load_milli: u64,
    /// The time one re-sent block takes at the slower of the receiving port and the write
    /// engine (ns).
    pub resend_busy_ns: u64,
}

impl NodeCosts {
    /// A node's costs for `cfg`: `hops` is the mean hop count from its senders, `senders` how
    /// many peers write to it, `fan_out` how many it writes to (sharing its port). These are
    /// the model's own parameters (link, engine, CPU costs), combined as the comments say;
    /// the combination is ours.
    pub fn new(cfg: &super::SimConfig, hops: f64, senders: usize, fan_out: usize) -> Self {
        use crate::link::{block_wire_bytes, message_wire_bytes};
        let c = &cfg.costs;
        let block = cfg.link.serialization(block_wire_bytes(PAGE)).as_ns() as f64;
        let msg = cfg.link.serialization(message_wire_bytes(56)).as_ns() as f64;
        let hop = cfg.link.hop_latency.as_ns() as f64;
        let ns = |t: ModelTime| t.as_ns() as f64;
        let one_way = hops * hop;
        // RESOLVED to the sender and its handling, then the block again and its admission;
        // the re-sent block also occupies both ends' ports for its serialization.
        let write_retransmit = (msg + one_way + ns(c.per_rq) + ns(c.driver_entry))
            + (ns(c.per_post) + block + one_way + ns(c.per_rq) + ns(c.driver_entry))
            + block;
        // The engine's report, the driver's handling and the block read again (one AXI
        // access of a block, the engine model's parameters).
        let engine = crate::npe::NpeModelParams::new(0, cfg.nodes.max(1));
        let axi = ns(engine.axi_latency) + ns(ModelTime::transfer(PAGE, engine.axi_bps));
        let read_retransmit = ns(c.driver_entry) + ns(c.per_local_fault) + ns(c.per_post) + axi;
        // The write engine serves a block in one AXI write; blocks arrive from the senders,
        // each keeping `depth` transfers in flight over its round trip, at most at the rate
        // its port gives it.
        let blocks = u64::from(cfg.transfer_size).div_ceil(PAGE) as f64;
        let service = axi;
        // A transfer's round trip: its blocks through the sender's shared port, the trip out
        // and the ACK's back, and the drivers' handling (entries, the post, the write
        // completion and the ACK).
        let handling = 2.0 * ns(c.driver_entry) + ns(c.per_post) + ns(c.per_wcq) + ns(c.per_rq);
        let round_trip = blocks * block * fan_out.max(1) as f64 + 2.0 * one_way + handling;
        let per_sender = (cfg.depth as f64 * blocks / round_trip).min(1.0 / block);
        let lambda = (senders as f64 * per_sender).min(1.0 / block);
        let rho = (lambda * service).min(0.999);
        let backlog = (rho * rho / (1.0 - rho)).min(64.0);
        Self {
            write_retransmit_ns: write_retransmit as u64,
            read_retransmit_ns: read_retransmit as u64,
            arrivals_milli_per_us: (lambda * 1e6) as u64,
            write_backlog_milli: (backlog * 1000.0) as u64,
            read_blocked_milli: (cfg.depth.saturating_sub(1) * 1000) as u64,
            others_milli: (senders * cfg.depth).saturating_sub(1) as u64 * 1000,
            write_service_ns: service as u64,
            write_load_milli: (rho * 1000.0) as u64,
            resend_busy_ns: service.max(block) as u64,
        }
    }

    /// What a write stall of `resolve_ns` holds back, given `waiting_milli` blocks staged or
    /// held at the ingress: those, and half of the blocks that arrive meanwhile (they wait
    /// half the stall on average), but never more than the other transfers in flight
    /// towards the node (blocks of one transfer delay it once); thousandths.
    pub fn write_blocked_milli(&self, waiting_milli: u64, resolve_ns: u64) -> u64 {
        (waiting_milli + self.arrivals_milli_per_us * resolve_ns / 2_000).min(self.others_milli)
    }

    /// The write engine's capacity side with `waiting_milli` blocks queued for it.
    pub fn write_capacity(&self, waiting_milli: u64) -> smmu_driver::fault::Capacity {
        smmu_driver::fault::Capacity {
            backlog_ns: waiting_milli * self.write_service_ns / 1000,
            load_milli: self.write_load_milli,
            resend_ns: self.resend_busy_ns,
            // The transfers in flight towards the node, the faulting one included: a
            // terminated write lets the rest of its transfer be written meanwhile.
            inherit_milli: self.others_milli + 1000,
        }
    }

    /// The policy with these costs as its starting point.
    pub fn policy(&self, costs: &CostModel, swap_read: ModelTime) -> CostPolicy {
        use smmu_driver::fault::StallCosts;
        CostPolicy::new(
            StallCosts {
                retransmit_ns: self.read_retransmit_ns,
                blocked_milli: self.read_blocked_milli,
                capacity: Default::default(),
            },
            StallCosts {
                retransmit_ns: self.write_retransmit_ns,
                blocked_milli: self
                    .write_blocked_milli(self.write_backlog_milli, costs.minor_service().as_ns()),
                capacity: self.write_capacity(self.write_backlog_milli),
            },
            costs.major_service(swap_read).as_ns(),
        )
    }
}
