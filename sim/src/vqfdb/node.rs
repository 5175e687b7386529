//! One node of the virtual QFDB: its memory manager, fault service and driver host.

use std::collections::HashMap;
use std::sync::Arc;

use dma_engine::npe::{FaultClass, Npe, NpeHost};
use hal::dma::HostDma;
use hal::model::ModelBus;
use hal::{Iova, PageSize, PhysAddr, VirtAddr};
use protocol::{Access, FaultReason, Generation, PageEntry, PageStateTable};
use smmu_driver::fault::{
    AccessKind, FaultCost, FaultDecision, FaultHandler, FaultKind, FaultPlan, FaultRecord,
    RawSyndrome, SmmuFlavour, SmmuId, StallTag, StandardPolicy, StreamFaultConfig, StreamId,
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

/// A resolution in progress.
pub(crate) struct Inflight {
    pub plan: FaultPlan,
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
    pub handler: FaultHandler<StandardPolicy>,
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
    pub fn new(policy: StandardPolicy, read_budget: ModelTime, write_budget: ModelTime) -> Self {
        Self {
            handler: FaultHandler::new(policy),
            read_cfg: StreamFaultConfig::stall_tolerant(read_budget.as_ns()),
            write_cfg: StreamFaultConfig::stall_tolerant(write_budget.as_ns()),
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
                let (cpu_done, done) = match mm.mem.fault_cost(page) {
                    None => (decided, decided),
                    Some(FaultCost::Minor) => {
                        // An inactive page must not be written back while its minor fault
                        // is being resolved.
                        mm.mem.hold_for_fault(page);
                        let t = start.after(costs.minor_fault.max(costs.fault_decide));
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
                self.inflight.insert(page, Inflight { plan, resume });
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
