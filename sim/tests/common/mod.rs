//! Helpers shared by the integration tests.
#![allow(dead_code)]

use dma_engine::zdma::{ZdmaChannel, ZdmaConfig};
use hal::delay::NoDelay;
use hal::dma::{DmaDirection, DmaMemory, DmaRegion, HostDma};
use hal::{Iova, PageSize, PhysAddr};
use sim::mistakes::{MistakeSwitch, MistakenBus};
use sim::soc::{Soc, Window};
use smmu_driver::fault::StreamFaultConfig;
use smmu_driver::pagetable::{
    Attributes, Invalidations, PageTable, PageTableConfig, Permissions, TlbMaintenance,
};
use smmu_driver::v2::{
    ContextBank, ContextConfig, DriverConfig, FaultModel, SmmuV2, StreamMatch, StreamRoute,
};

/// For table operations that change no live entry (fresh maps).
pub struct NoTlb;

impl TlbMaintenance for NoTlb {
    fn invalidate_now(&mut self, _: &Invalidations) -> smmu_driver::Result<()> {
        Ok(())
    }
}

pub type Smmu = SmmuV2<Window, NoDelay>;

/// The driver settings for the simulated ZynqMP: defaults, with the board's implementation
/// (MMU-500).
pub const ZYNQMP_SMMU: DriverConfig = DriverConfig {
    implementation: boards::zynqmp::SMMU.implementation,
    ..DriverConfig::DEFAULT
};
pub type Channel = ZdmaChannel<Window, NoDelay>;

pub const GDMA0: u16 = 0x14e8;
pub const GDMA1: u16 = 0x14e9;
/// Source and destination IOVAs in one 2 MiB region, so a fault on either is at level 3.
pub const SRC: u64 = 0x1000_0000;
pub const DST: u64 = 0x1000_8000;

pub fn smmu(soc: &Soc, config: DriverConfig) -> Smmu {
    let mut smmu = SmmuV2::probe(soc.smmu_window().unwrap(), NoDelay::default(), config).unwrap();
    smmu.reset().unwrap();
    smmu
}

/// An MMU-500 window that makes the mistakes `switch` turns on (ZynqMP bank layout).
pub fn mistaken_window(soc: &Soc, switch: &MistakeSwitch) -> MistakenBus<Window> {
    MistakenBus::new(soc.smmu_window().unwrap(), 0x1_0000, 0x1000, switch.clone())
}

/// A driver, probed and reset, whose register traffic goes through [`mistaken_window`].
pub fn mistaken_smmu(
    soc: &Soc,
    config: DriverConfig,
    switch: &MistakeSwitch,
) -> SmmuV2<MistakenBus<Window>, NoDelay> {
    let mut smmu = SmmuV2::probe(mistaken_window(soc, switch), NoDelay::default(), config).unwrap();
    smmu.reset().unwrap();
    smmu
}

pub fn channel(soc: &Soc, n: usize) -> Channel {
    let config = ZdmaConfig {
        timeout_us: 1_000,
        ..ZdmaConfig::DEFAULT
    };
    let mut ch = ZdmaChannel::new(soc.gdma_window(n).unwrap(), NoDelay::default(), config).unwrap();
    ch.init().unwrap();
    ch
}

pub fn table(dram: &HostDma) -> PageTable<&HostDma> {
    PageTable::new(dram, PageTableConfig::default()).unwrap()
}

pub fn rw() -> Attributes {
    Attributes::normal(Permissions::READ_WRITE)
}

/// Maps `pages` pages at `iova` to `region` (from its start).
pub fn map(table: &mut PageTable<&HostDma>, iova: u64, region: &DmaRegion, pages: u64) {
    for p in 0..pages {
        table
            .map(
                Iova::new(iova + p * 4096),
                region.bus_addr().checked_add(p * 4096).unwrap(),
                PageSize::Size4K,
                &rw(),
                &mut NoTlb,
            )
            .unwrap();
    }
}

/// A context bank over `table` with `model`, and GDMA channel 0 (and 1) attached.
pub fn context<B: hal::regs::RegisterBus>(
    smmu: &mut SmmuV2<B, NoDelay>,
    table: &PageTable<&HostDma>,
    model: FaultModel,
    hit_under_fault: bool,
    streams: &[u16],
) -> ContextBank {
    let mut config = ContextConfig::new(table.root(), &table.walk_config(), model);
    config.hit_under_fault = hit_under_fault;
    let cb = smmu.alloc_context(&config).unwrap();
    for &s in streams {
        smmu.attach(
            StreamMatch::exact(s),
            StreamRoute::Translate(cb),
            StreamFaultConfig::stall_tolerant(20_000),
        )
        .unwrap();
    }
    cb
}

/// A page of DMA memory filled with `f(i)`.
pub fn page_with(dram: &HostDma, pages: usize, f: impl Fn(usize) -> u8) -> DmaRegion {
    let r = dram.allocate(pages, DmaDirection::Bidirectional).unwrap();
    let data: Vec<u8> = (0..pages * 4096).map(f).collect();
    r.write_bytes(0, &data).unwrap();
    r
}

pub fn contents(r: &DmaRegion, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    r.read_bytes(0, &mut v).unwrap();
    v
}

pub fn phys(r: &DmaRegion) -> PhysAddr {
    r.bus_addr()
}
