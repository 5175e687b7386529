//! A node's SMMU: the register-accurate MMU-500 model driven by the real SMMUv2 driver
//! (`smmu_driver::v2`), or the stand-in walker (`crate::axi::WalkerSmmu`).
//!
//! With the MMU-500 each node has two context banks over the same stage-1 tables: one for the
//! engine's read stream and one for its write stream, so a stalled read and a stalled write do
//! not wait for each other's RESUME (the MMU-500 records one fault per bank; further faults of
//! a bank are held or set FSR.MULTI, `docs/mmu500.md`). Faults are read from the banks with
//! `SmmuV2::take_context_fault`, answered with `SmmuV2::resume`, and TLB maintenance goes
//! through `SmmuV2::tlb` (TLBIVA + TLBSYNC) for both banks' ASIDs.

use hal::Iova;
use hal::PhysAddr;
use hal::delay::NoDelay;
use hal::model::ModelBus;
use smmu_driver::fault::{AccessKind, FaultRecord, StallTag, StreamFaultConfig, StreamId};
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
}

/// A node's SMMU.
pub(crate) enum NodeSmmu {
    Walker(WalkerSmmu),
    Mmu500(Box<Mmu500Node>),
}

impl NodeSmmu {
    /// An MMU-500 with two contexts over `root`, in stall or terminate mode, with the read and
    /// write streams attached.
    pub fn mmu500(
        memory: Memory,
        root: PhysAddr,
        walk: &WalkConfig,
        stall: bool,
        streams: [(StreamId, StreamFaultConfig); 2],
    ) -> VqResult<Self> {
        let model = Mmu500::new(Mmu500Config::zynqmp())
            .map_err(|e| SimError::Internal(format!("MMU-500 model: {e}")))?;
        let mut v2 = SmmuV2::probe(
            ModelBus::new(model),
            NoDelay::default(),
            DriverConfig::DEFAULT,
        )?;
        v2.reset()?;
        let fault_model = if stall {
            FaultModel::Stall
        } else {
            FaultModel::Terminate
        };
        let mut banks = Vec::with_capacity(2);
        for (stream, fault) in streams {
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
                // Faults held behind the stall set MULTI; RESUME is ignored until FSR is
                // clear except for SS, so take (clear) it first.
                if m.v2.read_fsr(cb)? & !(1 << 30) != 0 {
                    let _ = m.v2.take_context_fault(cb)?;
                }
                let action = if retry {
                    ResumeAction::Retry
                } else {
                    ResumeAction::Terminate
                };
                m.v2.resume(cb, action)?;
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
