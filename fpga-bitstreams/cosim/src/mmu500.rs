//! The ZynqMP's MMU-500 for the co-simulated engines: sim's register-accurate model
//! (`sim::mmu500`, docs/mmu500.md) shared by two parties, as the one SMMU of an MPSoC is.
//!
//! - [`Mmu500Port`] is the model on the engines' data ports, behind sim's `AxiTranslate`
//!   seam: a transaction is translated by the model's TLB and table walk, terminated (the
//!   engine gets SLVERR: the SMMUv2 driver sets SCTLR.CFRE) or stalled until software writes
//!   the context bank's RESUME.
//! - [`SharedMmu500`] is the model's register window, the `hal::RegisterBus` the SMMUv2
//!   driver (`smmu_driver::v2::SmmuV2`) programs and services faults through.
//!
//! Nothing here decides anything about faults: which bank stalls or terminates is the context
//! bank's configuration, and every fault is answered by software through the window.

use std::sync::Arc;

use hal::Iova;
use hal::barrier::Barrier;
use hal::model::ModelBus;
use hal::regs::{AccessWidth, RegisterBus};
use sim::axi::{AxiOutcome, AxiTranslate, StallResolution, StallToken};
use sim::bus::{Access, StallState, StallTicket};
use sim::des::ModelTime;
use sim::memory::Memory;
use sim::mmu500::{Mmu500, Mmu500Config, Mmu500Stats, Translation};
use smmu_driver::fault::{AccessKind, StreamId};

use crate::error::Result;

/// The register window of a shared MMU-500 model.
#[derive(Clone, Debug)]
pub struct SharedMmu500(Arc<ModelBus<Mmu500>>);

impl SharedMmu500 {
    /// A ZynqMP MMU-500 (`Mmu500Config::zynqmp`) out of reset.
    pub fn zynqmp() -> Result<Self> {
        Ok(Self(Arc::new(ModelBus::new(Mmu500::new(
            Mmu500Config::zynqmp(),
        )?))))
    }

    /// The model's port for engines whose memory is `memory`.
    pub fn port(&self, memory: Memory) -> Mmu500Port {
        Mmu500Port {
            model: self.0.clone(),
            memory,
        }
    }

    /// The model's event counters.
    pub fn stats(&self) -> Mmu500Stats {
        *self.0.lock().stats()
    }

    /// Whether the SMMU's interrupt line is asserted (a context or global fault is pending).
    pub fn interrupt_line(&self) -> bool {
        self.0.lock().interrupt_line()
    }
}

impl RegisterBus for SharedMmu500 {
    fn read(&self, offset: usize, width: AccessWidth) -> u64 {
        self.0.read(offset, width)
    }

    fn write(&self, offset: usize, width: AccessWidth, value: u64) {
        self.0.write(offset, width, value)
    }

    fn size(&self) -> usize {
        self.0.size()
    }

    fn barrier(&self, kind: Barrier) {
        self.0.barrier(kind)
    }
}

/// The model as the engines' data ports see it (see the module documentation).
#[derive(Debug)]
pub struct Mmu500Port {
    model: Arc<ModelBus<Mmu500>>,
    memory: Memory,
}

impl AxiTranslate for Mmu500Port {
    fn translate(
        &mut self,
        _now: ModelTime,
        stream: StreamId,
        iova: Iova,
        access: AccessKind,
    ) -> AxiOutcome {
        let address = iova.as_u64();
        // A burst never crosses a 4 KiB page (AXI4; the engine splits at pages).
        let request = Access {
            stream: stream.0,
            address,
            len: (4096 - address % 4096) as usize,
            write: access == AccessKind::Write,
            privileged: true,
            instruction: false,
        };
        match self.model.lock().translate(&request, &self.memory) {
            Translation::Phys(pa) => AxiOutcome::Ok(pa),
            // The SMMUv2 driver sets CFRE, so a terminated transaction is an error response;
            // were it RAZ/WI, the engine must still not take dropped data for written.
            Translation::RazWi | Translation::Abort(_) => AxiOutcome::Terminated,
            Translation::Stalled(t) => AxiOutcome::Stalled(StallToken(t.0)),
        }
    }

    fn stall_outcome(&mut self, token: StallToken) -> Option<StallResolution> {
        match self.model.lock().stall_state(StallTicket(token.0)) {
            StallState::Held => None,
            StallState::Retry => Some(StallResolution::Retry),
            StallState::Terminated(_) | StallState::TerminatedSilently | StallState::Unknown => {
                Some(StallResolution::Terminate)
            }
        }
    }
}
