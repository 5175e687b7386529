//! A node's SMMU: the register-accurate MMU-500 model driven by the real SMMUv2 driver
//! (`smmu_driver::v2`), or the stand-in walker (`crate::axi::WalkerSmmu`).
//!
//! With the MMU-500 each node has two context banks over the same stage-1 tables: one for the
//! engine's read stream and one for its write stream, so a stalled read and a stalled write do
//! not wait for each other's RESUME (the MMU-500 records one fault per bank; further faults of
//! a bank are held or set FSR.MULTI, `docs/mmu500.md`). Faults are read from the banks with
//! `SmmuV2::take_context_fault`, answered with `SmmuV2::resume`, and TLB maintenance goes
//! through `SmmuV2::tlb` (TLBIVA + TLBSYNC) for both banks' ASIDs. `resume` clears a MULTI
//! that would make MMU-500 ignore the RESUME, and refuses (`SmmuError::ResumeIgnored`) while
//! the bank holds a record nobody took: that record is taken, queued for the fault path like
//! any other, and the RESUME written again.

use hal::Iova;
use hal::PhysAddr;
use hal::delay::NoDelay;
use hal::model::ModelBus;
use smmu_driver::SmmuError;
use smmu_driver::fault::{
    AccessKind, FaultControl, FaultRecord, StallTag, StreamFaultConfig, StreamId,
};
use smmu_driver::pagetable::{Invalidations, TlbMaintenance};
use smmu_driver::v2::{
    ContextBank, ContextConfig, DriverConfig, FaultModel, ResumeAction, SmmuV2, StreamMatch,
    StreamRoute,
};
use smmu_driver::walk::WalkConfig;

use super::{SimError, VqResult};
use crate::axi::{AxiOutcome, AxiTranslate, SmmuStats, StallResolution, StallToken, WalkerSmmu};
use crate::bus::{Access, StallState, StallTicket};
use crate::des::ModelTime;
use crate::memory::Memory;
use crate::mmu500::{Mmu500, Mmu500Config, Translation};

/// Which SMMU model the nodes use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SmmuModel {
    /// The register-accurate MMU-500 model (`sim::mmu500`) with the SMMUv2 driver.
    Mmu500,
    /// The stand-in table walker (no TLB, no registers): faster, for experiments.
    Walker,
}

/// The MMU-500 of one node and its driver.
pub(crate) struct Mmu500Node {
    pub v2: SmmuV2<ModelBus<Mmu500>, NoDelay>,
    pub memory: Memory,
    pub read_cb: ContextBank,
    pub write_cb: ContextBank,
    /// Records taken while answering a stall (`SmmuError::ResumeIgnored`), handed to the
    /// fault path with the next [`NodeSmmu::take_records`].
    pub pending: Vec<FaultRecord>,
}

/// A node's SMMU.
pub(crate) enum NodeSmmu {
    Walker(WalkerSmmu),
    Mmu500(Box<Mmu500Node>),
}

impl NodeSmmu {
    /// An MMU-500 with two contexts over `root`, one per stream, each in stall mode where
    /// `stall` says so for its stream (read, write) and in terminate mode otherwise, with the
    /// read and write streams attached.
    pub fn mmu500(
        memory: Memory,
        root: PhysAddr,
        walk: &WalkConfig,
        stall: [bool; 2],
        streams: [(StreamId, StreamFaultConfig); 2],
    ) -> VqResult<Self> {
        let model = Mmu500::new(Mmu500Config::zynqmp())
            .map_err(|e| SimError::Internal(format!("MMU-500 model: {e}")))?;
        let config = DriverConfig {
            implementation: boards::zynqmp::SMMU.implementation,
            ..DriverConfig::DEFAULT
        };
        let mut v2 = SmmuV2::probe(ModelBus::new(model), NoDelay::default(), config)?;
        v2.reset()?;
        let mut banks = Vec::with_capacity(2);
        for ((stream, fault), stall) in streams.into_iter().zip(stall) {
            let fault_model = if stall {
                FaultModel::Stall
            } else {
                FaultModel::Terminate
            };
            let config = ContextConfig::new(root, walk, fault_model);
            let cb = v2.alloc_context(&config)?;
            let id = u16::try_from(stream.0)
                .map_err(|_| SimError::Internal(format!("stream {:#x} too wide", stream.0)))?;
            v2.attach(StreamMatch::exact(id), StreamRoute::Translate(cb), fault)?;
            banks.push(cb);
        }
        let (Some(&read_cb), Some(&write_cb)) = (banks.first(), banks.get(1)) else {
            return Err(SimError::Internal("MMU-500 contexts".into()));
        };
        Ok(NodeSmmu::Mmu500(Box::new(Mmu500Node {
            v2,
            memory,
            read_cb,
            write_cb,
            pending: Vec::new(),
        })))
    }

    /// Fault records to handle now (the context-fault interrupt handler).
    pub fn take_records(&mut self, out: &mut Vec<FaultRecord>) -> VqResult<()> {
        match self {
            NodeSmmu::Walker(w) => {
                while let Some(r) = w.take_record() {
                    out.push(r);
                }
            }
            NodeSmmu::Mmu500(m) => {
                out.append(&mut m.pending);
                if !m.v2.bus().lock().interrupt_line() {
                    return Ok(());
                }
                for cb in [m.read_cb, m.write_cb] {
                    // A bank with only MULTI yields no record: the engine reports those
                    // faults itself (docs/dma-engine.md §6.1).
                    if let Some(fault) = m.v2.take_context_fault(cb)?
                        && let Some(record) = fault.record
                    {
                        out.push(record);
                    }
                }
            }
        }
        Ok(())
    }

    /// Answers a stalled transaction: retry or terminate.
    pub fn resume(&mut self, tag: StallTag, now: ModelTime, retry: bool) -> VqResult<()> {
        Ok(self.answer(tag, now, retry)?)
    }

    /// [`resume`](Self::resume) with the driver's error type (the fault service's).
    fn answer(&mut self, tag: StallTag, now: ModelTime, retry: bool) -> smmu_driver::Result<()> {
        match self {
            NodeSmmu::Walker(w) => {
                w.resume(StallToken(u64::from(tag.0)), now, retry);
            }
            NodeSmmu::Mmu500(m) => {
                let cb = if u32::from(m.read_cb.index()) == tag.0 {
                    m.read_cb
                } else {
                    m.write_cb
                };
                if !m.v2.stall_pending(cb)? {
                    return Ok(());
                }
                let action = if retry {
                    ResumeAction::Retry
                } else {
                    ResumeAction::Terminate
                };
                match m.v2.resume(cb, action) {
                    Err(SmmuError::ResumeIgnored { .. }) => {
                        // A record nobody took yet: it goes to the fault path (its page is
                        // resolved like any other); the RESUME written next answers the stall,
                        // so the record no longer stands for a stalled transaction.
                        if let Some(fault) = m.v2.take_context_fault(cb)?
                            && let Some(mut record) = fault.record
                        {
                            record.stall = None;
                            m.pending.push(record);
                        }
                        m.v2.resume(cb, action)?;
                    }
                    other => other?,
                }
            }
        }
        Ok(())
    }

    /// Counters in the walker's terms.
    pub fn stats(&self) -> SmmuStats {
        match self {
            NodeSmmu::Walker(w) => *w.stats(),
            NodeSmmu::Mmu500(m) => {
                let s = *m.v2.bus().lock().stats();
                SmmuStats {
                    translations: s.transactions,
                    faults: s.context_faults,
                    stalls: s.stalls + s.held,
                    terminated: s.terminated,
                    stall_terminated: 0,
                    stall_time: ModelTime::ZERO,
                    invalidations: m.v2.stats().tlbi_va,
                }
            }
        }
    }
}

impl AxiTranslate for NodeSmmu {
    fn translate(
        &mut self,
        now: ModelTime,
        stream: StreamId,
        iova: Iova,
        access: AccessKind,
    ) -> AxiOutcome {
        match self {
            NodeSmmu::Walker(w) => w.translate(now, stream, iova, access),
            NodeSmmu::Mmu500(m) => {
                let address = iova.as_u64();
                let request = Access {
                    stream: stream.0,
                    address,
                    len: (4096 - address % 4096) as usize,
                    write: access == AccessKind::Write,
                    privileged: true,
                    instruction: false,
                };
                let memory = &m.memory;
                match m.v2.bus().lock().translate(&request, memory) {
                    Translation::Phys(pa) => AxiOutcome::Ok(pa),
                    // The driver programs CFRE = 1, so RAZ/WI does not happen; were it to, the
                    // engine must not treat dropped data as written.
                    Translation::RazWi | Translation::Abort(_) => AxiOutcome::Terminated,
                    Translation::Stalled(t) => AxiOutcome::Stalled(StallToken(t.0)),
                }
            }
        }
    }

    fn stall_outcome(&mut self, token: StallToken) -> Option<StallResolution> {
        match self {
            NodeSmmu::Walker(w) => w.stall_outcome(token),
            NodeSmmu::Mmu500(m) => match m.v2.bus().lock().stall_state(StallTicket(token.0)) {
                StallState::Held => None,
                StallState::Retry => Some(StallResolution::Retry),
                StallState::Terminated(_)
                | StallState::TerminatedSilently
                | StallState::Unknown => Some(StallResolution::Terminate),
            },
        }
    }
}

impl TlbMaintenance for NodeSmmu {
    fn invalidate_now(&mut self, invalidations: &Invalidations) -> smmu_driver::Result<()> {
        match self {
            NodeSmmu::Walker(w) => w.invalidate_now(invalidations),
            NodeSmmu::Mmu500(m) => {
                // Both banks cache translations of the same tables under their own ASIDs.
                for cb in [m.read_cb, m.write_cb] {
                    m.v2.tlb(cb)?.invalidate_now(invalidations)?;
                }
                Ok(())
            }
        }
    }
}

/// The node's SMMU as the shared fault service sees it ([`FaultControl`]) at one model time:
/// a stall is answered at `now`, and each of the engine's two streams has its declared
/// configuration.
pub(crate) struct FaultPort<'a> {
    pub smmu: &'a mut NodeSmmu,
    pub now: ModelTime,
    pub streams: [(StreamId, StreamFaultConfig); 2],
}

/// The TLB maintenance of a node's SMMU (both banks share the tables).
pub(crate) struct NodeTlb<'a>(&'a mut NodeSmmu);

impl TlbMaintenance for NodeTlb<'_> {
    fn invalidate_now(&mut self, invalidations: &Invalidations) -> smmu_driver::Result<()> {
        self.0.invalidate_now(invalidations)
    }
}

impl FaultControl for FaultPort<'_> {
    type Tlb<'s>
        = NodeTlb<'s>
    where
        Self: 's;

    fn answer_stall(&mut self, record: &FaultRecord, retry: bool) -> smmu_driver::Result<()> {
        let tag = record.stall.ok_or(SmmuError::InvalidConfig {
            what: "a stall answer for a record without a stall tag",
        })?;
        self.smmu.answer(tag, self.now, retry)
    }

    fn stream_config(&self, stream: StreamId) -> StreamFaultConfig {
        self.streams
            .iter()
            .find(|(s, _)| *s == stream)
            .map_or(StreamFaultConfig::NEVER_STALL, |&(_, c)| c)
    }

    fn context_tlb(&mut self, _record: &FaultRecord) -> smmu_driver::Result<NodeTlb<'_>> {
        Ok(NodeTlb(self.smmu))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use hal::dma::HostDma;
    use hal::regs::{AccessWidth, RegisterBus};
    use smmu_driver::pagetable::{PageTable, PageTableConfig};

    use super::*;

    #[test]
    fn a_record_nobody_took_goes_to_the_fault_path_and_the_stall_is_still_answered() {
        let dram = Arc::new(HostDma::new(PhysAddr::new(0x4000_0000), 64).unwrap());
        let table = PageTable::new(dram.clone(), PageTableConfig::default()).unwrap();
        let tolerant = StreamFaultConfig::stall_tolerant(1_000_000);
        let (read, write) = (StreamId(0x10), StreamId(0x11));
        let mut smmu = NodeSmmu::mmu500(
            Memory::new(dram.clone()),
            table.root(),
            &table.walk_config(),
            [true, true],
            [(read, tolerant), (write, tolerant)],
        )
        .unwrap();
        // A read of an unmapped page stalls in the read bank; its record is taken.
        let AxiOutcome::Stalled(token) =
            smmu.translate(ModelTime::ZERO, read, Iova::new(0x1000), AccessKind::Read)
        else {
            panic!("not stalled");
        };
        let mut records = Vec::new();
        smmu.take_records(&mut records).unwrap();
        let [record] = records.as_slice() else {
            panic!("{records:?}");
        };
        let tag = record.stall.unwrap();
        // Another record in FSR before the resume (FSRRESTORE, bank 0 at 0x1_0000): the
        // driver refuses to resume; the node takes that record and resumes again.
        let NodeSmmu::Mmu500(m) = &smmu else {
            unreachable!()
        };
        m.v2.bus().write(0x1_005c, AccessWidth::U32, 1 << 1);
        smmu.resume(tag, ModelTime::ZERO, false).unwrap();
        assert_eq!(smmu.stall_outcome(token), Some(StallResolution::Terminate));
        let mut records = Vec::new();
        smmu.take_records(&mut records).unwrap();
        let [queued] = records.as_slice() else {
            panic!("{records:?}");
        };
        assert_eq!(queued.stall, None, "its stall was answered");
        let NodeSmmu::Mmu500(m) = &smmu else {
            unreachable!()
        };
        let model = m.v2.bus().lock();
        assert!(!model.stall_pending(0));
        assert_eq!(model.stats().resumes_ignored, 0);
    }
}
