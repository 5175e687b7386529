//! The seam between a DMA master model and the SMMU that translates its AXI accesses.
//!
//! A master model (the NPE engine model) asks [`AxiTranslate::translate`] for every access to
//! user memory; the SMMU answers with a physical address, terminates the access (the master
//! sees an AXI error response), or stalls it until software writes the context's `RESUME`.
//!
//! [`WalkerSmmu`] is a stand-in SMMU for the virtual QFDB: it walks the real stage-1 tables
//! that `smmu_driver::pagetable::PageTable` builds in simulated DRAM, with the independent
//! walker `smmu_driver::walk`, per stream in stall or terminate mode, and queues a
//! `FaultRecord` for every fault, as the MMU-500's context bank would report it. It has no
//! TLB (so a missing invalidation cannot be caught here) and no register interface; the
//! register-accurate MMU-500 model (`sim::mmu500`, issue 4) replaces it behind this same trait.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use hal::dma::HostDma;
use hal::{Iova, PhysAddr};
use smmu_driver::fault::{
    AccessKind, FaultKind, FaultRecord, RawSyndrome, SmmuFlavour, SmmuId, StallTag, StreamId,
};
use smmu_driver::pagetable::{Invalidations, TlbMaintenance};
use smmu_driver::walk::{self, AccessRequest, WalkConfig, WalkFault};

use crate::des::ModelTime;

/// Identifies a stalled transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StallToken(pub u64);

/// The SMMU's answer to one access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AxiOutcome {
    /// Translated.
    Ok(PhysAddr),
    /// Terminated: the master gets SLVERR.
    Terminated,
    /// Held until software resumes or terminates it.
    Stalled(StallToken),
}

/// What software did with a stalled transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StallResolution {
    /// Retry (translate again).
    Retry,
    /// Terminate (the master gets SLVERR).
    Terminate,
}

/// An SMMU as a DMA master model sees it.
pub trait AxiTranslate {
    /// Translates one access of `stream` at `now`.
    fn translate(
        &mut self,
        now: ModelTime,
        stream: StreamId,
        iova: Iova,
        access: AccessKind,
    ) -> AxiOutcome;

    /// The fate of a stalled transaction: `None` while it is still held.
    fn stall_outcome(&mut self, token: StallToken) -> Option<StallResolution>;
}

/// How a stream's context treats faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextConfig {
    /// Root of the stage-1 tables (TTBR0).
    pub root: PhysAddr,
    /// Stall faulting transactions (MMU-500 `SCTLR.CFCFG` = 1) instead of terminating them.
    pub stall: bool,
}

/// Counters of the stand-in SMMU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SmmuStats {
    /// Accesses translated.
    pub translations: u64,
    /// Faults (records queued).
    pub faults: u64,
    /// Of those, stalled.
    pub stalls: u64,
    /// Of those, terminated at once.
    pub terminated: u64,
    /// Stalled transactions software terminated.
    pub stall_terminated: u64,
    /// Total model time transactions spent stalled (ps).
    pub stall_time: ModelTime,
    /// TLB invalidation runs software issued.
    pub invalidations: u64,
}

#[derive(Clone, Copy, Debug)]
struct Stall {
    since: ModelTime,
    outcome: Option<StallResolution>,
}

/// The stand-in SMMU (see the module documentation).
#[derive(Debug)]
pub struct WalkerSmmu {
    dram: Arc<HostDma>,
    contexts: HashMap<u32, ContextConfig>,
    records: VecDeque<FaultRecord>,
    stalls: HashMap<u64, Stall>,
    next_token: u64,
    stats: SmmuStats,
}

impl WalkerSmmu {
    /// An SMMU whose table walks read `dram`.
    pub fn new(dram: Arc<HostDma>) -> Self {
        Self {
            dram,
            contexts: HashMap::new(),
            records: VecDeque::new(),
            stalls: HashMap::new(),
            next_token: 1,
            stats: SmmuStats::default(),
        }
    }

    /// Attaches `stream` to a context.
    pub fn attach(&mut self, stream: StreamId, context: ContextConfig) {
        self.contexts.insert(stream.0, context);
    }

    /// The next fault record, as the context-fault interrupt handler would read it.
    pub fn take_record(&mut self) -> Option<FaultRecord> {
        self.records.pop_front()
    }

    /// Software's `RESUME` for a stalled transaction (`retry = false`: terminate).
    /// Returns false for an unknown or already answered token.
    pub fn resume(&mut self, token: StallToken, now: ModelTime, retry: bool) -> bool {
        let Some(stall) = self.stalls.get_mut(&token.0) else {
            return false;
        };
        if stall.outcome.is_some() {
            return false;
        }
        stall.outcome = Some(if retry {
            StallResolution::Retry
        } else {
            self.stats.stall_terminated += 1;
            StallResolution::Terminate
        });
        self.stats.stall_time = self.stats.stall_time.after(now.since(stall.since));
        true
    }

    /// Counters.
    pub fn stats(&self) -> &SmmuStats {
        &self.stats
    }

    /// Stalled transactions not answered yet.
    pub fn pending_stalls(&self) -> usize {
        self.stalls.values().filter(|s| s.outcome.is_none()).count()
    }
}

impl AxiTranslate for WalkerSmmu {
    fn translate(
        &mut self,
        now: ModelTime,
        stream: StreamId,
        iova: Iova,
        access: AccessKind,
    ) -> AxiOutcome {
        self.stats.translations += 1;
        let Some(ctx) = self.contexts.get(&stream.0).copied() else {
            // An unmatched stream: the MMU-500's default for unmatched streams is a fault.
            self.stats.terminated += 1;
            return AxiOutcome::Terminated;
        };
        let request = match access {
            AccessKind::Read => AccessRequest::READ,
            AccessKind::Write => AccessRequest::WRITE,
        };
        let dram = &self.dram;
        let result = walk::translate(ctx.root, iova, &request, true, &WalkConfig::SMMU_48, |pa| {
            dram.read_phys_u64(pa)
        });
        let fault = match result {
            Ok(pa) => return AxiOutcome::Ok(pa),
            Err(fault) => fault,
        };
        self.stats.faults += 1;
        let (kind, level) = match fault {
            WalkFault::Translation { level } => (FaultKind::Translation, level),
            WalkFault::Permission { level } => (FaultKind::Permission, level),
            WalkFault::AccessFlag { level } => (FaultKind::AccessFlag, level),
            WalkFault::AddressSize { level } => (FaultKind::AddressSize, level),
            WalkFault::External { level, .. } => (FaultKind::External, level),
        };
        let stall = ctx.stall.then(|| {
            let token = self.next_token;
            self.next_token = self.next_token.wrapping_add(1).max(1);
            self.stalls.insert(
                token,
                Stall {
                    since: now,
                    outcome: None,
                },
            );
            token
        });
        self.records.push_back(FaultRecord {
            smmu: SmmuId {
                flavour: SmmuFlavour::V2,
                instance: 0,
            },
            stream,
            iova,
            access,
            kind,
            level: Some(level),
            // The walker's tokens stay far below 2^32 in any run.
            stall: stall.map(|t| StallTag(t as u32)),
            syndrome: RawSyndrome::default(),
        });
        match stall {
            Some(token) => {
                self.stats.stalls += 1;
                AxiOutcome::Stalled(StallToken(token))
            }
            None => {
                self.stats.terminated += 1;
                AxiOutcome::Terminated
            }
        }
    }

    fn stall_outcome(&mut self, token: StallToken) -> Option<StallResolution> {
        let outcome = self.stalls.get(&token.0)?.outcome?;
        self.stalls.remove(&token.0);
        Some(outcome)
    }
}

/// The stand-in has no TLB: invalidations are counted, nothing else is needed.
impl TlbMaintenance for WalkerSmmu {
    fn invalidate_now(&mut self, invalidations: &Invalidations) -> smmu_driver::Result<()> {
        self.stats.invalidations += invalidations.len() as u64;
        Ok(())
    }
}
