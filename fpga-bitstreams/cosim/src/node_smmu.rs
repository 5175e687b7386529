//! One node's MMU-500 for the engine-level rigs ([`crate::rig`]): sim's model (`sim::mmu500`)
//! programmed by the SMMUv2 driver, with real stage-1 tables in the node's DRAM, so a fault
//! arises only because a page is missing from a table or lacks write permission there.
//!
//! - **Two protection domains**, told apart by PDID bit 4 ([`STALL_PDID`]): domain 0's
//!   context banks terminate faults (`SCTLR.CFCFG` = 0, with `CFRE`: the engine gets SLVERR),
//!   domain 1's stall them (`CFCFG` = 1) until software writes the bank's `RESUME` (IHI 0062
//!   `SMMU_CBn_SCTLR`, `SMMU_CBn_RESUME`). Each domain has a stage-1 table of its own, and a
//!   bank for its reads and one for its writes (the engine's stream is its port's base plus
//!   the AXI ID: PDID bits 4:0, bit 5 for writes; docs/dma-engine.md §3), each matched by one
//!   stream-match register that ignores PDID bits 3:0 (IHI 0062 `SMMU_SMRn`.MASK, routed by
//!   `SMMU_S2CRn` to the bank). A stalled read and a stalled write thus never wait for each
//!   other's `RESUME`, and a page taken from one domain's table is still mapped in the other.
//! - **Windows.** Each table maps the rig's source window read-only and its destination
//!   window read-write, identity (IOVA = PA), before the engines run. A test takes a page out
//!   ([`NodeSmmu::unmap`]) or write-protects it ([`NodeSmmu::write_protect`]) with the TLB
//!   invalidations that requires, and puts it back ([`NodeSmmu::restore`]).
//! - **Faults.** A stalled access is answered only by the one fault service
//!   ([`NodeSmmu::service_stalls`]: `FaultHandler::service_pending`, policy
//!   `StandardPolicy::Hybrid`): the node's memory is resident, so every fault is minor, its
//!   page is mapped and the access resumed. A terminated access is the engine's to report
//!   (FAULT_WAIT, DST_FAULT); the service only takes its record, and the test maps the page
//!   the engine names before it resumes or re-sends.

use std::sync::{Arc, Mutex, MutexGuard};

use hal::delay::NoDelay;
use hal::dma::{DmaDirection, DmaMemory, DmaRegion, HostDma};
use hal::{Iova, PageSize, PhysAddr};
use sim::axi::{AxiOutcome, AxiTranslate, StallResolution, StallToken};
use sim::des::ModelTime;
use sim::memory::Memory;
use smmu_driver::SmmuError;
use smmu_driver::fault::{
    AccessKind, FaultCost, FaultDecision, FaultHandler, FaultOutcome, FaultResolver, FaultVisitor,
    RegisteredRegion, ResolveError, ResolveEstimate, ResolvedPage, StandardPolicy,
    StreamFaultConfig, StreamId, TakenFault,
};
use smmu_driver::pagetable::{Attributes, PageTable, PageTableConfig, Permissions, TlbMaintenance};
use smmu_driver::v2::{
    ContextBank, ContextConfig, DriverConfig, FaultModel, SmmuV2, StreamMatch, StreamRoute,
};

use crate::error::{CosimError, Result};
use crate::mmu500::{Mmu500Port, SharedMmu500};

/// PDID bit 4: set, the stalling domain; clear, the terminating one.
pub const STALL_PDID: u16 = 0x10;
/// Stall budget of the stalling domain's streams (ns): a minor fault fits.
pub const STALL_BUDGET_NS: u64 = 100_000;
/// What mapping a resident page is estimated to cost (ns).
pub const MINOR_NS: u64 = 2_000;
const PAGE: u64 = 4096;

type Smmu = SmmuV2<SharedMmu500, NoDelay>;

/// A window of IOVA = PA the tables map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// First byte (page aligned).
    pub base: u64,
    /// Bytes (a multiple of 4 KiB).
    pub len: u64,
    /// Mapped writable (the engine's writes go here) or read-only.
    pub writable: bool,
}

/// What the data port saw, by outcome and direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCounts {
    /// Reads terminated (SLVERR).
    pub terminated_reads: u64,
    /// Writes terminated.
    pub terminated_writes: u64,
    /// Reads stalled (a retried access that stalls again counts again).
    pub stalled_reads: u64,
    /// Writes stalled.
    pub stalled_writes: u64,
}

/// The model on a data port, counting what it answers.
#[derive(Debug)]
pub struct CountingPort {
    port: Mmu500Port,
    counts: Arc<Mutex<PortCounts>>,
}

impl AxiTranslate for CountingPort {
    fn translate(
        &mut self,
        now: ModelTime,
        stream: StreamId,
        iova: Iova,
        access: AccessKind,
    ) -> AxiOutcome {
        let outcome = self.port.translate(now, stream, iova, access);
        let write = access == AccessKind::Write;
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        match (&outcome, write) {
            (AxiOutcome::Terminated, false) => c.terminated_reads += 1,
            (AxiOutcome::Terminated, true) => c.terminated_writes += 1,
            (AxiOutcome::Stalled(_), false) => c.stalled_reads += 1,
            (AxiOutcome::Stalled(_), true) => c.stalled_writes += 1,
            _ => {}
        }
        outcome
    }

    fn stall_outcome(&mut self, token: StallToken) -> Option<StallResolution> {
        self.port.stall_outcome(token)
    }
}

/// What the fault service did (module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StallCounts {
    /// Stalled accesses resumed after their page was mapped.
    pub resumed: u64,
    /// Stalled accesses the service terminated.
    pub terminated: u64,
    /// Records of terminated accesses taken (left to the engine's fault path).
    pub terminated_records: u64,
    /// Faults the SMMU reported without a record (FSR.MULTI).
    pub lost: u64,
}

/// Services stalled records only.
struct StallsOnly<'a>(&'a mut StallCounts);

impl FaultVisitor for StallsOnly<'_> {
    fn wants(&mut self, fault: &TakenFault) -> bool {
        fault.record.is_some_and(|r| r.is_stalled())
    }

    fn done(&mut self, fault: &TakenFault, outcome: Option<&FaultOutcome>) {
        self.0.lost += u64::from(fault.lost);
        match (fault.record, outcome.map(|o| &o.decision)) {
            (Some(_), Some(FaultDecision::Resume)) => self.0.resumed += 1,
            (Some(_), Some(_)) => self.0.terminated += 1,
            (Some(_), None) => self.0.terminated_records += 1,
            (None, _) => {}
        }
    }
}

/// The node's memory as the fault service sees it: every page of a window is resident.
#[derive(Clone, Debug)]
struct Resident {
    stream_base: u32,
    windows: Vec<Window>,
}

impl Resident {
    fn window(&self, iova: Iova) -> Option<&Window> {
        let a = iova.as_u64();
        self.windows
            .iter()
            .find(|w| a >= w.base && a - w.base < w.len)
    }
}

impl FaultResolver for Resident {
    fn region(&self, stream: StreamId, iova: Iova) -> Option<RegisteredRegion> {
        if stream.0 & !0x3f != self.stream_base {
            return None;
        }
        self.window(iova).map(|w| RegisteredRegion {
            stream,
            start: Iova::new(w.base),
            len: w.len,
            writable: w.writable,
        })
    }

    fn estimate(&self, _stream: StreamId, _iova: Iova, _access: AccessKind) -> ResolveEstimate {
        ResolveEstimate::Minor {
            expected_ns: MINOR_NS,
        }
    }

    fn resolve(
        &mut self,
        _stream: StreamId,
        iova: Iova,
        _access: AccessKind,
    ) -> core::result::Result<ResolvedPage, ResolveError> {
        let w = self.window(iova).ok_or(ResolveError(1))?;
        Ok(ResolvedPage {
            frame: PhysAddr::new(iova.as_u64() & !(PAGE - 1)),
            size: PageSize::Size4K,
            attributes: attributes(w.writable),
            cost: FaultCost::Minor,
        })
    }
}

fn attributes(writable: bool) -> Attributes {
    Attributes::normal(if writable {
        Permissions::READ_WRITE
    } else {
        Permissions::READ_ONLY
    })
}

/// TLB maintenance of the banks over one table.
struct Banks<'a> {
    smmu: &'a mut Smmu,
    banks: &'a [ContextBank],
}

impl TlbMaintenance for Banks<'_> {
    fn invalidate_now(
        &mut self,
        invalidations: &smmu_driver::pagetable::Invalidations,
    ) -> smmu_driver::Result<()> {
        for &cb in self.banks {
            self.smmu.tlb(cb)?.invalidate_now(invalidations)?;
        }
        Ok(())
    }
}

/// One node's MMU-500, its driver and its two domains' tables (module documentation).
pub struct NodeSmmu {
    mmu: SharedMmu500,
    smmu: Smmu,
    /// Per domain (0 terminate, 1 stall): its table and its banks (read, write).
    tables: [PageTable<Arc<HostDma>>; 2],
    banks: [[ContextBank; 2]; 2],
    handler: FaultHandler<StandardPolicy>,
    resident: Resident,
    /// Pages taken out or write-protected, per domain, until restored.
    changed: Vec<(usize, u64)>,
    memory: Memory,
    counts: Arc<Mutex<PortCounts>>,
    stalls: StallCounts,
    /// The DRAM below the windows' end, kept from the tables' allocator (rings and buffers
    /// live there at fixed addresses).
    _reserved: DmaRegion,
}

impl NodeSmmu {
    /// The MMU-500 of the node whose DRAM is `dram` (starting at 0) and whose data port's
    /// stream base is `stream_base`, with `windows` mapped in both domains.
    pub fn new(dram: &Arc<HostDma>, stream_base: u32, windows: &[Window]) -> Result<Self> {
        let end = windows.iter().map(|w| w.base + w.len).max().unwrap_or(0);
        let reserved = dram.allocate(end.div_ceil(PAGE) as usize, DmaDirection::Bidirectional)?;
        let mmu = SharedMmu500::zynqmp()?;
        let config = DriverConfig {
            implementation: boards::zynqmp::SMMU.implementation,
            ..DriverConfig::DEFAULT
        };
        let mut smmu = SmmuV2::probe(mmu.clone(), NoDelay::default(), config)?;
        smmu.reset()?;
        let too_wide = SmmuError::InvalidConfig {
            what: "a data stream wider than 16 bits",
        };
        let mut tables = Vec::with_capacity(2);
        let mut banks = Vec::with_capacity(2);
        for (domain, model) in [(0usize, FaultModel::Terminate), (1, FaultModel::Stall)] {
            let mut table = PageTable::new(dram.clone(), PageTableConfig::default())?;
            let mut pair = Vec::with_capacity(2);
            for write in [false, true] {
                let cb = smmu.alloc_context(&ContextConfig::new(
                    table.root(),
                    &table.walk_config(),
                    model,
                ))?;
                let id = stream_base | (domain as u32) << 4 | u32::from(write) << 5;
                smmu.attach(
                    StreamMatch {
                        id: u16::try_from(id).map_err(|_| too_wide)?,
                        mask: 0x0f,
                    },
                    StreamRoute::Translate(cb),
                    if model == FaultModel::Stall {
                        StreamFaultConfig::stall_tolerant(STALL_BUDGET_NS)
                    } else {
                        StreamFaultConfig::NEVER_STALL
                    },
                )?;
                pair.push(cb);
            }
            let mut tlb = Banks {
                smmu: &mut smmu,
                banks: &pair,
            };
            for w in windows {
                for page in (w.base..w.base + w.len).step_by(PAGE as usize) {
                    table.map(
                        Iova::new(page),
                        PhysAddr::new(page),
                        PageSize::Size4K,
                        &attributes(w.writable),
                        &mut tlb,
                    )?;
                }
            }
            tables.push(table);
            banks.push(<[ContextBank; 2]>::try_from(pair).map_err(|_| {
                SmmuError::InvalidConfig {
                    what: "two banks per domain",
                }
            })?);
        }
        let banks: [[ContextBank; 2]; 2] =
            banks.try_into().map_err(|_| SmmuError::InvalidConfig {
                what: "two domains",
            })?;
        let tables: [PageTable<Arc<HostDma>>; 2] = tables
            .try_into()
            .map_err(|_| SmmuError::InvalidConfig { what: "two tables" })?;
        Ok(Self {
            mmu,
            smmu,
            tables,
            banks,
            handler: FaultHandler::new(StandardPolicy::Hybrid),
            resident: Resident {
                stream_base,
                windows: windows.to_vec(),
            },
            changed: Vec::new(),
            memory: Memory::new(dram.clone()),
            counts: Arc::default(),
            stalls: StallCounts::default(),
            _reserved: reserved,
        })
    }

    /// The model's port for the node's engine (any number of them share the counts).
    pub fn port(&self) -> CountingPort {
        CountingPort {
            port: self.mmu.port(self.memory.clone()),
            counts: self.counts.clone(),
        }
    }

    /// The domain of `pdid` (0 terminate, 1 stall).
    pub fn domain_of(pdid: u16) -> usize {
        usize::from(pdid & STALL_PDID != 0)
    }

    fn change(&mut self, domain: usize, va: u64, unmap: bool) -> Result<()> {
        let domain = domain.min(1);
        let page = va & !(PAGE - 1);
        let mut tlb = Banks {
            smmu: &mut self.smmu,
            banks: &self.banks[domain],
        };
        let table = &mut self.tables[domain];
        let inv = if unmap {
            table.unmap(Iova::new(page), PAGE, &mut tlb)?
        } else {
            table.protect(Iova::new(page), PAGE, Permissions::READ_ONLY, &mut tlb)?
        };
        if !inv.is_empty() {
            tlb.invalidate_now(&inv)?;
        }
        self.changed.push((domain, page));
        Ok(())
    }

    /// Takes the page of `va` out of `domain`'s table (a translation fault on any access).
    pub fn unmap(&mut self, domain: usize, va: u64) -> Result<()> {
        self.change(domain, va, true)
    }

    /// Makes the page of `va` read-only in `domain`'s table (a permission fault on a write).
    pub fn write_protect(&mut self, domain: usize, va: u64) -> Result<()> {
        self.change(domain, va, false)
    }

    /// Maps the page of `va` in `domain`'s table as its window says (whatever the fault
    /// service did to it meanwhile).
    pub fn restore(&mut self, domain: usize, va: u64) -> Result<()> {
        let domain = domain.min(1);
        let page = va & !(PAGE - 1);
        let writable = self
            .resident
            .window(Iova::new(page))
            .map(|w| w.writable)
            .ok_or(SmmuError::InvalidConfig {
                what: "a page outside the windows",
            })?;
        let mut tlb = Banks {
            smmu: &mut self.smmu,
            banks: &self.banks[domain],
        };
        let table = &mut self.tables[domain];
        let inv = if table.translate(Iova::new(page))?.is_none() {
            table.map(
                Iova::new(page),
                PhysAddr::new(page),
                PageSize::Size4K,
                &attributes(writable),
                &mut tlb,
            )?
        } else {
            let p = if writable {
                Permissions::READ_WRITE
            } else {
                Permissions::READ_ONLY
            };
            table.protect(Iova::new(page), PAGE, p, &mut tlb)?
        };
        if !inv.is_empty() {
            tlb.invalidate_now(&inv)?;
        }
        self.changed.retain(|&c| c != (domain, page));
        Ok(())
    }

    /// Restores every page taken out or write-protected.
    pub fn restore_all(&mut self) -> Result<()> {
        while let Some(&(domain, page)) = self.changed.last() {
            self.restore(domain, page)?;
        }
        Ok(())
    }

    /// Takes every fault the SMMU reports: a stalled access is serviced (its page mapped, the
    /// access resumed), a terminated one's record only taken. Returns how many stalled
    /// accesses were answered.
    pub fn service_stalls(&mut self) -> Result<u64> {
        if let Some(g) = self.smmu.take_global_fault()? {
            return Err(CosimError::GlobalFault {
                gfsr: g.gfsr,
                stream: g.gfsynr1 & 0xffff,
            });
        }
        let before = self.stalls.resumed + self.stalls.terminated;
        self.handler.service_pending(
            &mut self.smmu,
            &mut self.resident,
            &mut self.tables[1],
            64,
            &mut StallsOnly(&mut self.stalls),
        )?;
        Ok(self.stalls.resumed + self.stalls.terminated - before)
    }

    /// Whether any bank reports a fault (a record or FSR.MULTI) or still holds a stall whose
    /// record was taken but not answered.
    pub fn busy(&self) -> bool {
        self.smmu.faulting_contexts().next().is_some()
            || self
                .banks
                .iter()
                .flatten()
                .any(|&cb| self.smmu.stall_pending(cb).unwrap_or(true))
    }

    /// What the data ports saw.
    pub fn counts(&self) -> MutexGuard<'_, PortCounts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the fault service did.
    pub fn stall_counts(&self) -> StallCounts {
        self.stalls
    }

    /// The model's event counters.
    pub fn stats(&self) -> sim::mmu500::Mmu500Stats {
        self.mmu.stats()
    }
}
