//! A fault-injecting SMMU for engine tests: identity translation (IOVA = PA), with pages a
//! test marks to terminate or to stall. It serves the RTL's data port and the Rust model alike
//! (both are `sim::axi::AxiTranslate` masters), so both see the same faults.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use hal::{Iova, PhysAddr};
use sim::axi::{AxiOutcome, AxiTranslate, StallResolution, StallToken};
use sim::des::ModelTime;
use smmu_driver::fault::{AccessKind, StreamId};

const PAGE: u64 = 4096;

/// What happens to an access to a marked page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Terminated at once (the master gets SLVERR).
    Terminate,
    /// Held until [`FaultState::resolve_stalls`].
    Stall,
}

/// The shared fault table.
#[derive(Debug, Default)]
pub struct FaultState {
    pages: HashMap<(bool, u64), Fault>,
    stalls: HashMap<u64, ((bool, u64), Option<StallResolution>)>,
    next: u64,
    /// Accesses terminated.
    pub terminated: u64,
    /// Accesses stalled.
    pub stalled: u64,
    /// Of those, writes.
    pub stalled_writes: u64,
    /// Accesses terminated that were writes.
    pub terminated_writes: u64,
}

impl FaultState {
    /// Marks the page holding `va` for writes (`write`) or reads.
    pub fn mark(&mut self, write: bool, va: u64, fault: Fault) {
        self.pages.insert((write, va / PAGE), fault);
    }

    /// Clears the mark of the page holding `va`.
    pub fn clear(&mut self, write: bool, va: u64) {
        self.pages.remove(&(write, va / PAGE));
    }

    /// Clears every mark.
    pub fn clear_all(&mut self) {
        self.pages.clear();
    }

    /// Stalled accesses not answered yet.
    pub fn pending_stalls(&self) -> usize {
        self.stalls.values().filter(|(_, r)| r.is_none()).count()
    }

    /// Answers every held access: `retry` (translate again) or terminate.
    pub fn resolve_stalls(&mut self, retry: bool) -> usize {
        let mut n = 0;
        for (_, r) in self.stalls.values_mut() {
            if r.is_none() {
                *r = Some(if retry {
                    StallResolution::Retry
                } else {
                    StallResolution::Terminate
                });
                n += 1;
            }
        }
        n
    }

    /// Resolves the held accesses as software resolving their pages would: the mark of each
    /// held access's page is cleared (other marks stay) and the access is retried. Returns
    /// how many were answered.
    pub fn resolve_stalled_pages(&mut self) -> usize {
        let held: Vec<(bool, u64)> = self
            .stalls
            .values()
            .filter(|(_, r)| r.is_none())
            .map(|(page, _)| *page)
            .collect();
        for page in &held {
            self.pages.remove(page);
        }
        self.resolve_stalls(true)
    }
}

/// The SMMU (see the module documentation); clones share one [`FaultState`].
#[derive(Clone, Debug, Default)]
pub struct FaultSmmu {
    state: Arc<Mutex<FaultState>>,
}

impl FaultSmmu {
    /// An SMMU with no marked page.
    pub fn new() -> Self {
        Self::default()
    }

    /// The fault table.
    pub fn state(&self) -> MutexGuard<'_, FaultState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl AxiTranslate for FaultSmmu {
    fn translate(
        &mut self,
        _now: ModelTime,
        _stream: StreamId,
        iova: Iova,
        access: AccessKind,
    ) -> AxiOutcome {
        let mut s = self.state();
        let write = matches!(access, AccessKind::Write);
        let va = iova.as_u64();
        match s.pages.get(&(write, va / PAGE)).copied() {
            None => AxiOutcome::Ok(PhysAddr::new(va)),
            Some(Fault::Terminate) => {
                s.terminated += 1;
                s.terminated_writes += u64::from(write);
                AxiOutcome::Terminated
            }
            Some(Fault::Stall) => {
                s.stalled += 1;
                s.stalled_writes += u64::from(write);
                s.next += 1;
                let token = s.next;
                s.stalls.insert(token, ((write, va / PAGE), None));
                AxiOutcome::Stalled(StallToken(token))
            }
        }
    }

    fn stall_outcome(&mut self, token: StallToken) -> Option<StallResolution> {
        let mut s = self.state();
        let outcome = s.stalls.get(&token.0).and_then(|(_, r)| *r);
        if outcome.is_some() {
            s.stalls.remove(&token.0);
        }
        outcome
    }
}
