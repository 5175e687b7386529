//! A simulated ZynqMP: DRAM, the MMU-500, and the GDMA/ADMA channels, with register windows
//! for drivers.
//!
//! Every DMA master reaches memory through the MMU-500 model with its stream ID
//! ([`SmmuPort`]). Drivers get one [`Window`] per device; a window implements
//! [`RegisterBus`], so drivers run unchanged. After every register write the machine runs
//! its masters until each is idle, finished, or held by a stalled SMMU transaction
//! ([`ZynqMpSoc::run_until_blocked`]): a RESUME write therefore lets the held channel finish
//! within that write, and a driver that polls afterwards sees the result. Masters step in a
//! fixed order (GDMA 0-7, then ADMA 0-7), so runs are deterministic.
//!
//! To add a master (the PL RDMA engine, or a QFDB's network): implement
//! [`DmaMaster`], keep it in the machine, and step it in
//! `run_until_blocked` with a [`SmmuPort`] carrying its stream ID in each [`Access`].

use std::sync::{Arc, Mutex, MutexGuard};

use boards::zynqmp::{ADMA, GDMA, SMMU};
use hal::PhysAddr;
use hal::barrier::Barrier;
use hal::dma::HostDma;
use hal::model::RegisterModel;
use hal::regs::{AccessWidth, RegisterBus};

use crate::bus::{Access, AccessResult, DmaMaster, MasterPort, Progress, StallState, StallTicket};
use crate::memory::Memory;
use crate::mmu500::{FaultReporting, Mmu500, Mmu500Config, Translation};
use crate::zdma::ZdmaModel;
use crate::{Result, SimError};

/// Most master steps one run may take (a guard against a master that never settles).
pub const MAX_STEPS_PER_RUN: u64 = 1 << 26;

/// The interconnect a master sees: the MMU-500 in front of DRAM.
pub struct SmmuPort<'a> {
    smmu: &'a mut Mmu500,
    memory: &'a Memory,
}

impl<'a> SmmuPort<'a> {
    /// A port through `smmu` to `memory`.
    pub fn new(smmu: &'a mut Mmu500, memory: &'a Memory) -> Self {
        SmmuPort { smmu, memory }
    }
}

impl MasterPort for SmmuPort<'_> {
    fn read(&mut self, access: &Access, buf: &mut [u8]) -> AccessResult {
        match self.smmu.translate(access, self.memory) {
            Translation::Phys(pa) => match self.memory.read(pa, buf) {
                Ok(()) => AccessResult::Ok,
                Err(r) => AccessResult::Err(r),
            },
            Translation::RazWi => {
                buf.fill(0);
                AccessResult::Ok
            }
            Translation::Abort(r) => AccessResult::Err(r),
            Translation::Stalled(t) => AccessResult::Stalled(t),
        }
    }

    fn write(&mut self, access: &Access, data: &[u8]) -> AccessResult {
        match self.smmu.translate(access, self.memory) {
            Translation::Phys(pa) => match self.memory.write(pa, data) {
                Ok(()) => AccessResult::Ok,
                Err(r) => AccessResult::Err(r),
            },
            Translation::RazWi => AccessResult::Ok,
            Translation::Abort(r) => AccessResult::Err(r),
            Translation::Stalled(t) => AccessResult::Stalled(t),
        }
    }

    fn stall_state(&mut self, ticket: StallTicket) -> StallState {
        self.smmu.stall_state(ticket)
    }
}

/// How to build the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocConfig {
    /// Physical base of the simulated DRAM (in the ZynqMP's low DDR window).
    pub dram_base: PhysAddr,
    /// DRAM size in 4 KiB pages.
    pub dram_pages: usize,
    /// The MMU-500.
    pub smmu: Mmu500Config,
    /// Whether the zDMA channels report error responses (ISR.AXI_RD_DATA/AXI_WR_DATA) as
    /// silicon does, or ignore them as QEMU's model does ([`ZdmaModel::ignore_bus_errors`]).
    pub zdma_reports_bus_errors: bool,
}

impl SocConfig {
    /// 8 MiB of DRAM at 1 GiB and the ZynqMP MMU-500.
    pub const fn zynqmp() -> Self {
        SocConfig {
            dram_base: PhysAddr::new(0x4000_0000),
            dram_pages: 2048,
            smmu: Mmu500Config::zynqmp(),
            zdma_reports_bus_errors: true,
        }
    }

    /// The same machine with the weakest behaviour the driver must survive: an SMMU that
    /// reports no syndrome, no MULTI and never stalls ([`FaultReporting::WEAKEST`]), and zDMA
    /// channels that complete without reporting a bus error.
    pub const fn weakest() -> Self {
        let mut config = Self::zynqmp();
        config.smmu.reporting = FaultReporting::WEAKEST;
        config.zdma_reports_bus_errors = false;
        config
    }
}

impl Default for SocConfig {
    fn default() -> Self {
        Self::zynqmp()
    }
}

/// The machine's state (see the module docs).
#[derive(Debug)]
pub struct ZynqMpSoc {
    memory: Memory,
    /// The MMU-500.
    pub smmu: Mmu500,
    /// GDMA channels 0-7 (stream IDs 0x14E8-0x14EF, 128-bit).
    pub gdma: Vec<ZdmaModel>,
    /// ADMA channels 0-7 (stream IDs 0x868-0x86F, 64-bit).
    pub adma: Vec<ZdmaModel>,
    steps: u64,
    barriers: u64,
}

impl ZynqMpSoc {
    /// Builds the machine.
    pub fn new(config: SocConfig) -> Result<Self> {
        let dram = Arc::new(HostDma::new(config.dram_base, config.dram_pages)?);
        let channel = |stream: u32, bus_width: u16| {
            let mut model = ZdmaModel::new(stream, usize::from(bus_width));
            if !config.zdma_reports_bus_errors {
                model.ignore_bus_errors();
            }
            model
        };
        Ok(ZynqMpSoc {
            memory: Memory::new(dram),
            smmu: Mmu500::new(config.smmu)?,
            gdma: GDMA
                .iter()
                .map(|c| channel(c.stream.0, c.bus_width))
                .collect(),
            adma: ADMA
                .iter()
                .map(|c| channel(c.stream.0, c.bus_width))
                .collect(),
            steps: 0,
            barriers: 0,
        })
    }

    /// The simulated DRAM.
    pub fn memory(&self) -> &Memory {
        &self.memory
    }

    /// Master steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Barriers drivers issued on the machine's windows.
    pub fn barriers(&self) -> u64 {
        self.barriers
    }

    /// Runs every master until none advances (idle, done, or held by the SMMU). Returns the
    /// steps taken.
    pub fn run_until_blocked(&mut self) -> u64 {
        let mut steps = 0u64;
        loop {
            let mut advanced = false;
            let ZynqMpSoc {
                memory,
                smmu,
                gdma,
                adma,
                ..
            } = self;
            for master in gdma.iter_mut().chain(adma.iter_mut()) {
                let mut port = SmmuPort::new(smmu, memory);
                if master.step(&mut port) == Progress::Advanced {
                    advanced = true;
                    steps += 1;
                }
            }
            if !advanced || steps >= MAX_STEPS_PER_RUN {
                break;
            }
        }
        self.steps += steps;
        steps
    }

    fn device(&mut self, device: Device) -> &mut dyn RegisterModel {
        match device {
            Device::Smmu => &mut self.smmu,
            Device::Gdma(n) => &mut self.gdma[n],
            Device::Adma(n) => &mut self.adma[n],
        }
    }
}

/// A device with a register window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// The MMU-500 (0xFD80_0000).
    Smmu,
    /// GDMA channel n (0xFD50_0000 + n * 0x1_0000).
    Gdma(usize),
    /// ADMA channel n (0xFFA8_0000 + n * 0x1_0000).
    Adma(usize),
}

/// A shared handle to a machine.
#[derive(Clone, Debug)]
pub struct Soc {
    inner: Arc<Mutex<ZynqMpSoc>>,
    dram: Arc<HostDma>,
}

impl Soc {
    /// Builds a machine.
    pub fn new(config: SocConfig) -> Result<Self> {
        let soc = ZynqMpSoc::new(config)?;
        let dram = soc.memory.dram().clone();
        Ok(Soc {
            inner: Arc::new(Mutex::new(soc)),
            dram,
        })
    }

    /// A ZynqMP with 8 MiB of DRAM.
    pub fn zynqmp() -> Result<Self> {
        Self::new(SocConfig::zynqmp())
    }

    /// Locks the machine to inspect or change model state (tests). A poisoned lock is
    /// recovered: the state is still the best evidence of what happened.
    pub fn lock(&self) -> MutexGuard<'_, ZynqMpSoc> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The simulated DRAM, which is also the drivers' `DmaMemory`.
    pub fn dram(&self) -> &Arc<HostDma> {
        &self.dram
    }

    /// A register window on `device`.
    pub fn window(&self, device: Device) -> Result<Window> {
        let size = {
            let mut soc = self.lock();
            let (len, index, what) = match device {
                Device::Smmu => (1, 0, "smmu"),
                Device::Gdma(n) => (soc.gdma.len(), n, "gdma"),
                Device::Adma(n) => (soc.adma.len(), n, "adma"),
            };
            if index >= len {
                return Err(SimError::NoSuchDevice { what, index });
            }
            soc.device(device).size()
        };
        Ok(Window {
            soc: self.clone(),
            device,
            size,
        })
    }

    /// The MMU-500's window.
    pub fn smmu_window(&self) -> Result<Window> {
        self.window(Device::Smmu)
    }

    /// GDMA channel `n`'s window.
    pub fn gdma_window(&self, n: usize) -> Result<Window> {
        self.window(Device::Gdma(n))
    }

    /// The SMMU interrupt line (ZynqMP SPI 155).
    pub fn smmu_interrupt(&self) -> bool {
        self.lock().smmu.interrupt_line()
    }
}

/// A driver's view of one device's registers.
#[derive(Clone, Debug)]
pub struct Window {
    soc: Soc,
    device: Device,
    size: usize,
}

impl Window {
    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Where the window is on a real ZynqMP.
    pub fn zynqmp_base(&self) -> u64 {
        match self.device {
            Device::Smmu => SMMU.regs.base,
            Device::Gdma(n) => GDMA.get(n).map_or(0, |c| c.regs.base),
            Device::Adma(n) => ADMA.get(n).map_or(0, |c| c.regs.base),
        }
    }
}

impl RegisterBus for Window {
    fn read(&self, offset: usize, width: AccessWidth) -> u64 {
        let mut soc = self.soc.lock();
        soc.device(self.device).read(offset, width) & width.mask()
    }

    fn write(&self, offset: usize, width: AccessWidth, value: u64) {
        let mut soc = self.soc.lock();
        soc.device(self.device)
            .write(offset, width, value & width.mask());
        soc.run_until_blocked();
    }

    fn size(&self) -> usize {
        self.size
    }

    fn barrier(&self, kind: Barrier) {
        hal::barrier::issue(kind);
        self.soc.lock().barriers += 1;
    }
}
