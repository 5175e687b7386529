//! The event loop of a run: nodes, fabric, application, bookkeeping and the report.
//!
//! This file holds the world's state and its event dispatch; the rest is split by concern:
//! `build` (nodes, memory, SMMUs, engines, fabric, pairs), `events` (engine steps, the fault
//! service, the driver, harvesting and verifying), `app` (the application's posts) and
//! `report`.

mod app;
mod build;
#[cfg(test)]
mod cost_tests;
mod events;
mod report;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use dma_engine::npe::{ChannelConfig, NpeConfig, PeerConfig};
use hal::dma::{DmaDirection, DmaMemory, DmaRegion, HostDma};
use hal::model::ModelBus;
use hal::{PhysAddr, VirtAddr};
use protocol::{
    Access, CompletionStatus, DeliveryStatus, FaultReason, PageEntry, PageStateTable, TransferDesc,
};
use smmu_driver::SmmuError;
use smmu_driver::fault::{FaultCost, StandardPolicy};
use smmu_driver::pagetable::{PageTable, PageTableConfig};

use super::node::{
    CH, Driver, FaultAction, FaultService, HostView, Inflight, Mm, NodeCosts, NodePolicy,
};
use super::smmu::{FaultPort, NodeSmmu, SmmuModel};
use super::{
    FaultClass, Histogram, Integrity, MemoryLimit, RunReport, SimConfig, SimError, Strategy,
    VqResult,
};
use crate::axi::{ContextConfig, WalkerSmmu};
use crate::des::{EventQueue, ModelTime, SplitMix64};
use crate::memory::Memory;
use crate::node_memory::{NodeMemory, PAGE};
use crate::npe::{EngineCtx, Frame, NpeModel, NpeModelParams};
use crate::qfdb::{Fabric, Topology};
use smmu_driver::fault::{StallTag, StreamFaultConfig};

/// The PDID of every node's (single) application process.
const PDID: u16 = 1;
/// The hardware channel reserved for control messages.
const CONTROL_CHANNEL: u8 = (CH - 1) as u8;
/// Virtual base of every node's buffers.
const VA_BASE: u64 = 0x40_0000_0000;
/// Physical base of every node's DRAM (each node has its own address space).
const DRAM_BASE: u64 = 0x8_0000_0000;
/// DRAM pages beside the frames: rings and page tables.
const DRAM_EXTRA_PAGES: usize = 1024;

#[derive(Debug)]
pub(crate) enum Ev {
    EngineWake(usize),
    Arrive(usize, Box<Frame>),
    DriverRun(usize),
    AppRun(usize),
    AppPost(usize, Prepared),
    FaultDone(usize, u64),
    Terminate(usize, StallTag),
    Unresolvable(usize, u64, FaultReason),
    Inject(usize, Box<Frame>),
    Arrival(usize),
}

/// A transfer the application prepared and will post.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Prepared {
    pair: usize,
    intended: ModelTime,
    seq: u64,
    src_slot: u32,
    dst_slot: u32,
    checksum: u64,
}

pub(crate) struct Pair {
    pub(crate) src: usize,
    pub(crate) dst: usize,
    pub(crate) channel: u8,
    pub(crate) peer_slot: u8,
    pub(crate) quota: u64,
    pub(crate) submitted: u64,
    pub(crate) finished: u64,
    pub(crate) inflight: usize,
    pub(crate) free_src: Vec<u32>,
    pub(crate) free_dst: Vec<u32>,
    pub(crate) src_base: u64,
    pub(crate) dst_base: u64,
    pub(crate) waiting: Option<Prepared>,
    /// Closed loop: when each window slot freed (the intended issue time of the next
    /// transfer). Open loop: transfers that arrived and wait to be issued.
    pub(crate) intents: VecDeque<ModelTime>,
    /// Open loop: the next arrival, how many arrived, and the arrivals' random source.
    pub(crate) next_arrival: ModelTime,
    pub(crate) arrived: u64,
    pub(crate) arrival_rng: SplitMix64,
    /// The worst engine fault on each slot's pages since its transfer was prepared.
    pub(crate) src_class: Vec<FaultClass>,
    pub(crate) dst_class: Vec<FaultClass>,
    pub(crate) next_completion: u32,
    pub(crate) next_delivery: u32,
    /// Test rig mode: completions and deliveries with the time they were taken.
    pub(crate) completions: Vec<(ModelTime, protocol::Completion)>,
    pub(crate) deliveries: Vec<(ModelTime, protocol::Delivery)>,
    /// When each destination slot was last used (posted).
    pub(crate) dst_used: Vec<ModelTime>,
}

/// Host memory the simulated nodes' buffers may take together (their DRAM is real memory).
const MAX_MODELLED_BYTES: u64 = 8 << 30;

pub(crate) struct Record {
    prepared: Prepared,
    completed: bool,
    verified: bool,
}

pub(crate) struct Node {
    pub(crate) dram: Arc<HostDma>,
    pub(crate) _frames: DmaRegion,
    pub(crate) driver: Box<Driver>,
    pub(crate) mm: Mm,
    pub(crate) faults: FaultService,
    /// What the cost-based policy starts from (its dynamic inputs are fed at each record).
    pub(crate) costs: NodeCosts,
    pub(crate) driver_free_at: ModelTime,
    pub(crate) driver_at: Option<ModelTime>,
    pub(crate) engine_at: Option<ModelTime>,
    pub(crate) app_free_at: ModelTime,
    pub(crate) app_busy: bool,
    pub(crate) out_pairs: Vec<usize>,
    pub(crate) in_pairs: Vec<usize>,
    pub(crate) next_pair: usize,
    pub(crate) requests: Vec<(u64, Access)>,
    /// The fault service loses this node's faults, the driver's requests and the SMMU's
    /// records alike (a test of the timeouts that bound a fault nobody resolves).
    pub(crate) lose_requests: bool,
    /// Open loop: the application's wake-up for the next arrival, if one is scheduled.
    pub(crate) arrival_wake: Option<ModelTime>,
    /// Which streams (read, write) are on stall-mode contexts.
    pub(crate) stalling: [bool; 2],
}

pub(crate) struct World<'p> {
    pub(crate) cfg: SimConfig,
    pub(crate) q: EventQueue<Ev>,
    pub(crate) fabric: Fabric,
    pub(crate) nodes: Vec<Node>,
    pub(crate) pairs: Vec<Pair>,
    pub(crate) ledger: HashMap<(usize, u32), Record>,
    pub(crate) rng: SplitMix64,
    pub(crate) latencies: Vec<f64>,
    pub(crate) back_pressure: u64,
    pub(crate) latency: Histogram,
    pub(crate) latency_by_class: [Histogram; 4],
    pub(crate) bytes: u64,
    pub(crate) first_post: Option<ModelTime>,
    pub(crate) last_completion: ModelTime,
    pub(crate) finished: u64,
    pub(crate) total: u64,
    pub(crate) setup: ModelTime,
    pub(crate) data: Vec<u8>,
    pub(crate) progress: Box<dyn FnMut(u64, u64) + 'p>,
    /// Test rig mode: no workload; completions and deliveries are kept for the test.
    pub(crate) manual: bool,
    /// Rewrites every frame an engine sends, completion the driver reports and delivery it
    /// reports (tests: drop, duplicate, corrupt, reorder).
    pub(crate) seams: Seams<'p>,
    /// What the application's checks counted.
    pub(crate) integrity: Integrity,
}

/// Test seams of a run: each, when set, rewrites what passes through it and returns what to
/// pass on instead (nothing to drop it, two to duplicate it, a changed one to corrupt it;
/// holding one back and returning it later reorders). The run's own checks stay behind the
/// seams, so what they count is what a bug at that place would do.
#[derive(Default)]
pub struct Seams<'p> {
    /// Every frame an engine sends, before the wire.
    pub frames: Option<Seam<'p, Frame>>,
    /// Every completion a sender's driver reports, before the application's checks.
    pub completions: Option<PairSeam<'p, protocol::Completion>>,
    /// Every delivery a receiver's driver reports, before the application's checks.
    pub deliveries: Option<PairSeam<'p, protocol::Delivery>>,
}

/// A seam over things of type `T`: returns what to pass on instead.
pub type Seam<'p, T> = Box<dyn FnMut(T) -> Vec<T> + 'p>;

/// A seam over things of type `T` of one pair (its index, in the workload's order).
pub type PairSeam<'p, T> = Box<dyn FnMut(usize, T) -> Vec<T> + 'p>;

/// A 64-bit checksum of `data` (word-wise multiply-rotate mixing; any change of a byte
/// changes it with overwhelming probability).
fn checksum(data: &[u8]) -> u64 {
    let mut h: u64 = 0x9E37_79B9_7F4A_7C15 ^ data.len() as u64;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h ^ u64::from_le_bytes(w))
            .wrapping_mul(0xFF51_AFD7_ED55_8CCD)
            .rotate_left(29);
    }
    for &b in chunks.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    }
    h ^ (h >> 33)
}

pub(crate) fn session(src: usize, dst: usize) -> u32 {
    0x5e55_0000 ^ ((src as u32) << 8 | dst as u32)
}

/// Runs one simulation. `progress(done, total)` is called now and then with the number of
/// transfers finished (completed at the sender and verified at the receiver).
pub fn run(cfg: &SimConfig, progress: &mut dyn FnMut(u64, u64)) -> VqResult<RunReport> {
    run_with_seams(cfg, progress, Seams::default())
}

/// [`run`] with `hook` rewriting every frame an engine sends (fault-injection experiments:
/// return no frame to drop it, two to duplicate it, or a changed one to corrupt it). The run
/// still checks every byte and every transfer, so an injected fault the protocol cannot
/// repair makes it fail.
pub fn run_with_hook(
    cfg: &SimConfig,
    progress: &mut dyn FnMut(u64, u64),
    hook: &mut dyn FnMut(Frame) -> Vec<Frame>,
) -> VqResult<RunReport> {
    let seams = Seams {
        frames: Some(Box::new(hook)),
        ..Seams::default()
    };
    run_with_seams(cfg, progress, seams)
}

/// [`run`] with test seams between the engines and the wire, and between the drivers and the
/// application's checks ([`Seams`]). A run whose checks counted anything lost, duplicated,
/// reordered or corrupted fails with [`SimError::Integrity`] and the counts.
pub fn run_with_seams<'p>(
    cfg: &SimConfig,
    progress: &'p mut dyn FnMut(u64, u64),
    seams: Seams<'p>,
) -> VqResult<RunReport> {
    validate(cfg)?;
    let mut world = World::build(cfg, Box::new(progress))?;
    world.seams = seams;
    world.setup()?;
    world.main_loop()?;
    let report = world.report()?;
    if report.integrity.is_clean() {
        Ok(report)
    } else {
        Err(SimError::Integrity(report.integrity))
    }
}

/// The most slots per pair and direction (`--slots`): 128 MiB of buffer per pair and
/// direction at the largest transfer size.
const MAX_SLOTS: usize = 1024;

fn validate(cfg: &SimConfig) -> VqResult<()> {
    let topo = Topology::new(cfg.nodes)?;
    let max_size = (super::node::MAX_BLOCKS as u32) * 4096;
    if cfg.transfer_size == 0 || cfg.transfer_size > max_size {
        return Err(SimError::Config(format!(
            "--size must be 1..={max_size} bytes (got {})",
            cfg.transfer_size
        )));
    }
    if !(0.0..=1.0).contains(&cfg.fault_rate) {
        return Err(SimError::Config(format!(
            "--fault-rate must be between 0 and 1 (got {})",
            cfg.fault_rate
        )));
    }
    if cfg.depth == 0 || cfg.depth > super::node::WINDOW {
        return Err(SimError::Config(format!(
            "--depth must be 1..={} (got {})",
            super::node::WINDOW,
            cfg.depth
        )));
    }
    if cfg.slots < cfg.depth {
        return Err(SimError::Config(format!(
            "--slots ({}) must be at least --depth ({})",
            cfg.slots, cfg.depth
        )));
    }
    if cfg.slots > MAX_SLOTS {
        // Slot indices are 32-bit, and every slot is memory of the modelled nodes.
        return Err(SimError::Config(format!(
            "--slots must be at most {MAX_SLOTS} (got {})",
            cfg.slots
        )));
    }
    if let Some(load) = cfg.offered_load_gbps
        && !(load > 0.0 && load.is_finite())
    {
        return Err(SimError::Config(format!(
            "--offered-load must be positive (got {load})"
        )));
    }
    if cfg.transfers == 0 {
        return Err(SimError::Config("--transfers must be at least 1".into()));
    }
    let pairs = cfg.workload.pairs(topo.nodes());
    let per_node_peers = (0..topo.nodes())
        .map(|n| {
            pairs
                .iter()
                .filter(|p| p.0 == n)
                .count()
                .max(pairs.iter().filter(|p| p.1 == n).count())
        })
        .max()
        .unwrap_or(0);
    if per_node_peers > CH - 1 {
        return Err(SimError::Config(format!(
            "workload {} on {} nodes needs {} peers per node; the driver has {} channels",
            cfg.workload.name(),
            cfg.nodes,
            per_node_peers,
            CH - 1
        )));
    }
    if let MemoryLimit::Fraction(f) = cfg.memory_limit
        && !(f > 0.0 && f.is_finite())
    {
        return Err(SimError::Config(format!(
            "--memory-limit must be positive (got {f})"
        )));
    }
    Ok(())
}

impl<'p> World<'p> {
    fn main_loop(&mut self) -> VqResult<()> {
        (self.progress)(0, self.total);
        while self.finished < self.total {
            let Some((now, ev)) = self.q.pop() else {
                // Nothing more can happen: what is unfinished is lost.
                self.integrity.lost = self.total - self.finished;
                return Err(SimError::Integrity(self.integrity));
            };
            self.dispatch(now, ev)?;
        }
        Ok(())
    }

    /// Processes events until none is left or the next one is after `until`.
    pub(crate) fn run_until(&mut self, until: ModelTime) -> VqResult<()> {
        while let Some((now, ev)) = self.q.pop_until(until) {
            self.dispatch(now, ev)?;
        }
        Ok(())
    }

    fn dispatch(&mut self, now: ModelTime, ev: Ev) -> VqResult<()> {
        for node in &mut self.nodes {
            node.mm.mem.set_now(now)?;
        }
        {
            match ev {
                Ev::EngineWake(n) => {
                    if self.nodes[n].engine_at == Some(now) {
                        self.nodes[n].engine_at = None;
                        self.engine_step(n, now)?;
                    }
                }
                Ev::Arrive(n, frame) => {
                    self.nodes[n].driver.bus().lock().deliver(*frame);
                    self.engine_step(n, now)?;
                }
                Ev::DriverRun(n) => {
                    if self.nodes[n].driver_at == Some(now) {
                        self.nodes[n].driver_at = None;
                        self.driver_run(n, now)?;
                    }
                }
                Ev::AppRun(n) => self.app_run(n, now)?,
                Ev::AppPost(n, prepared) => self.app_post(n, now, prepared)?,
                Ev::FaultDone(n, page) => self.fault_done(n, now, page)?,
                Ev::Terminate(n, token) => {
                    self.nodes[n].mm.smmu.resume(token, now, false)?;
                    self.engine_step(n, now)?;
                }
                Ev::Unresolvable(n, page, reason) => {
                    self.nodes[n].driver.page_unresolvable(PDID, page, reason)?;
                    self.request_driver(n, now);
                }
                Ev::Arrival(n) => {
                    if self.nodes[n].arrival_wake == Some(now) {
                        self.nodes[n].arrival_wake = None;
                        self.wake_app(n, now);
                    }
                }
                Ev::Inject(n, frame) => {
                    self.nodes[n].driver.bus().lock().deliver(*frame);
                    self.engine_step(n, now)?;
                }
            }
        }
        Ok(())
    }

    fn request_engine(&mut self, n: usize, at: ModelTime) {
        let node = &mut self.nodes[n];
        if node.engine_at.is_some_and(|t| t <= at) {
            return;
        }
        node.engine_at = Some(at);
        self.q.schedule(at, Ev::EngineWake(n));
    }

    pub(crate) fn request_driver(&mut self, n: usize, at: ModelTime) {
        let node = &mut self.nodes[n];
        let at = at.max(node.driver_free_at);
        if node.driver_at.is_some_and(|t| t <= at) {
            return;
        }
        node.driver_at = Some(at);
        self.q.schedule(at, Ev::DriverRun(n));
    }
}

#[cfg(test)]
mod tests {
    use super::checksum;

    #[test]
    fn checksum_sees_every_byte() {
        let data: Vec<u8> = (0..4099u32).map(|i| (i * 7) as u8).collect();
        let base = checksum(&data);
        for i in [0, 1, 8, 4095, 4098] {
            let mut d = data.clone();
            d[i] ^= 0x10;
            assert_ne!(checksum(&d), base, "byte {i}");
        }
        assert_ne!(checksum(&data[..4098]), base);
    }
}
