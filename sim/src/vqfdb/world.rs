//! The event loop of a run: nodes, fabric, application, bookkeeping and the report.

use std::collections::HashMap;
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

use super::node::{CH, Driver, FaultAction, FaultService, HostView, Mm};
use super::smmu::{NodeSmmu, SmmuModel};
use super::{MemoryLimit, Percentiles, RunReport, SimConfig, SimError, Strategy, VqResult};
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
}

/// A transfer the application prepared and will post.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Prepared {
    pair: usize,
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
    posted: ModelTime,
    completed: bool,
    verified: bool,
}

pub(crate) struct Node {
    pub(crate) dram: Arc<HostDma>,
    pub(crate) _frames: DmaRegion,
    pub(crate) driver: Box<Driver>,
    pub(crate) mm: Mm,
    pub(crate) faults: FaultService,
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
    /// Rewrites every frame an engine sends (tests: drop, duplicate, corrupt).
    pub(crate) frame_hook: Option<FrameHook<'p>>,
}

/// A test hook over outgoing frames: returns the frames to put on the wire instead.
pub(crate) type FrameHook<'p> = Box<dyn FnMut(Frame) -> Vec<Frame> + 'p>;

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
    validate(cfg)?;
    let mut world = World::build(cfg, Box::new(progress))?;
    world.setup()?;
    world.main_loop()?;
    world.report()
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
    validate(cfg)?;
    let mut world = World::build(cfg, Box::new(progress))?;
    world.frame_hook = Some(Box::new(hook));
    world.setup()?;
    world.main_loop()?;
    world.report()
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
    pub(crate) fn build(
        cfg: &SimConfig,
        progress: Box<dyn FnMut(u64, u64) + 'p>,
    ) -> VqResult<Self> {
        let topo = Topology::new(cfg.nodes)?;
        let pair_list = cfg.workload.pairs(cfg.nodes);
        let slot_bytes = u64::from(cfg.transfer_size).div_ceil(PAGE) * PAGE;
        let buffer_bytes = slot_bytes * cfg.slots as u64;
        // Per node: a send buffer per outgoing pair, a receive buffer per incoming pair.
        let mut out_pairs = vec![Vec::new(); cfg.nodes];
        let mut in_pairs = vec![Vec::new(); cfg.nodes];
        for (i, &(s, d)) in pair_list.iter().enumerate() {
            out_pairs[s].push(i);
            in_pairs[d].push(i);
        }
        let quota_base = cfg.transfers / pair_list.len() as u64;
        let extra = cfg.transfers % pair_list.len() as u64;
        let mut pairs = Vec::new();
        for (i, &(s, d)) in pair_list.iter().enumerate() {
            let out_index = out_pairs[s].iter().position(|&p| p == i).unwrap_or(0);
            let in_index = in_pairs[d].iter().position(|&p| p == i).unwrap_or(0);
            let src_base = VA_BASE + out_index as u64 * buffer_bytes;
            let dst_base = VA_BASE + (out_pairs[d].len() + in_index) as u64 * buffer_bytes;
            // Stacks: the last element is used first (most recently freed = most recently
            // touched, so reuse has locality).
            let slots: Vec<u32> = (0..cfg.slots as u32).rev().collect();
            pairs.push(Pair {
                src: s,
                dst: d,
                channel: out_index as u8,
                peer_slot: in_index as u8,
                quota: quota_base + u64::from((i as u64) < extra),
                submitted: 0,
                finished: 0,
                inflight: 0,
                free_src: slots.clone(),
                free_dst: slots,
                src_base,
                dst_base,
                waiting: None,
                next_completion: 0,
                next_delivery: 0,
                completions: Vec::new(),
                deliveries: Vec::new(),
                dst_used: vec![ModelTime::ZERO; cfg.slots],
            });
        }
        // Every node's buffers are real memory of this process (its simulated DRAM): refuse
        // a configuration that would need more than the host is asked to give, with a line
        // that says so, rather than abort on a failed allocation.
        let modelled: u64 = (0..cfg.nodes)
            .map(|n| (out_pairs[n].len() + in_pairs[n].len()) as u64 * buffer_bytes)
            .sum();
        if modelled > MAX_MODELLED_BYTES {
            return Err(SimError::Config(format!(
                "the buffers of this run need {} MiB of host memory (nodes x peers x slots x size); at most {} MiB: lower --slots, --size or --nodes",
                modelled >> 20,
                MAX_MODELLED_BYTES >> 20
            )));
        }
        let mut nodes = Vec::with_capacity(cfg.nodes);
        for n in 0..cfg.nodes {
            let buffers = out_pairs[n].len() + in_pairs[n].len();
            let pages = (buffers as u64 * buffer_bytes / PAGE) as usize;
            let footprint = pages as u64 * PAGE;
            let limit_bytes = match cfg.memory_limit {
                MemoryLimit::Bytes(b) => b,
                MemoryLimit::Fraction(f) => (footprint as f64 * f) as u64,
            };
            // A limit above the node's footprint puts no pressure on it: its frames are the
            // footprint, however generous the limit (it is not memory to reserve).
            let limit = usize::try_from(limit_bytes / PAGE)
                .unwrap_or(usize::MAX)
                .clamp(1, pages.max(1));
            // Every transfer in flight needs its pages resident at some point (the CPU writes
            // the source, the engine reads it, the peer writes the destination), so a limit
            // below that working set cannot make progress: refuse it as a configuration error.
            let working_set = (slot_bytes / PAGE) as usize * cfg.depth.max(1) * buffers;
            if limit < working_set.min(pages) {
                return Err(SimError::Config(format!(
                    "--memory-limit gives node {n} {} KiB, below its in-flight working set of {} KiB \
                     ({} buffers x depth {} x {} KiB per transfer); raise --memory-limit or lower --depth",
                    limit as u64 * PAGE / 1024,
                    working_set as u64 * PAGE / 1024,
                    buffers,
                    cfg.depth,
                    slot_bytes / 1024
                )));
            }
            let frames = pages.max(1);
            let dram = Arc::new(HostDma::new(
                PhysAddr::new(DRAM_BASE),
                frames + DRAM_EXTRA_PAGES,
            )?);
            let frames_region = dram.allocate(frames, DmaDirection::Bidirectional)?;
            let params = NpeModelParams::new(n, cfg.nodes);
            let read_stream = params.stream_of(PDID, false);
            let write_stream = params.stream_of(PDID, true);
            let mem = NodeMemory::new(
                dram.clone(),
                frames_region.bus_addr(),
                frames,
                VA_BASE,
                pages.max(1),
                limit,
                cfg.swap,
                [read_stream, write_stream],
                cfg.costs.minor_fault.as_ns(),
            )?;
            let table = PageTable::new(dram.clone(), PageTableConfig::default())?;
            let pstate = PageStateTable::new(
                VirtAddr::new(VA_BASE),
                pages.max(1) as u64 * PAGE,
                vec![PageEntry::ABSENT; pages.max(1)],
            )?;
            let stall = matches!(
                cfg.strategy,
                Strategy::StallOnly | Strategy::Hybrid | Strategy::PreFault | Strategy::PinAll
            );
            let smmu = match cfg.smmu {
                SmmuModel::Walker => {
                    let mut walker = WalkerSmmu::new(dram.clone());
                    // Both streams of the PDID share one context (one set of tables).
                    for stream in [read_stream, write_stream] {
                        walker.attach(
                            stream,
                            ContextConfig {
                                root: table.root(),
                                stall,
                            },
                        );
                    }
                    NodeSmmu::Walker(walker)
                }
                SmmuModel::Mmu500 => NodeSmmu::mmu500(
                    Memory::new(dram.clone()),
                    table.root(),
                    &table.walk_config(),
                    stall,
                    [
                        (
                            read_stream,
                            StreamFaultConfig::stall_tolerant(cfg.costs.stall_budget.as_ns()),
                        ),
                        (
                            write_stream,
                            StreamFaultConfig::stall_tolerant(cfg.costs.write_stall_budget.as_ns()),
                        ),
                    ],
                )?,
            };
            let policy = match cfg.strategy {
                Strategy::StallOnly => StandardPolicy::StallOnly,
                Strategy::RetransmitOnly => StandardPolicy::RetransmitOnly,
                _ => StandardPolicy::Hybrid,
            };
            let bus = ModelBus::new(NpeModel::new(params));
            let mut driver = Box::new(Driver::new(
                bus,
                &*dram,
                NpeConfig::new(n as u32, CONTROL_CHANNEL),
            )?);
            for &p in &out_pairs[n] {
                let pair = &pairs[p];
                driver.open_channel(
                    &*dram,
                    pair.channel,
                    ChannelConfig {
                        peer: pair.dst as u32,
                        pdid: PDID,
                        peer_key: u32::from(PDID),
                        session: session(pair.src, pair.dst),
                    },
                )?;
            }
            for &p in &in_pairs[n] {
                let pair = &pairs[p];
                driver.open_peer(
                    pair.peer_slot,
                    PeerConfig {
                        peer: pair.src as u32,
                        session: session(pair.src, pair.dst),
                        pdid: PDID,
                    },
                )?;
            }
            nodes.push(Node {
                dram,
                _frames: frames_region,
                driver,
                mm: Mm {
                    mem,
                    table,
                    pstate,
                    invalidated_at: vec![0; pages.max(1)],
                    smmu,
                    read_stream,
                    write_stream,
                    pdid: PDID,
                },
                faults: FaultService::new(
                    policy,
                    cfg.costs.stall_budget,
                    cfg.costs.write_stall_budget,
                ),
                driver_free_at: ModelTime::ZERO,
                driver_at: None,
                engine_at: None,
                app_free_at: ModelTime::ZERO,
                app_busy: false,
                out_pairs: out_pairs[n].clone(),
                in_pairs: in_pairs[n].clone(),
                next_pair: 0,
                requests: Vec::new(),
                lose_requests: false,
            });
        }
        let total = pairs.iter().map(|p| p.quota).sum();
        Ok(Self {
            cfg: cfg.clone(),
            q: EventQueue::new(),
            fabric: Fabric::new(topo, cfg.link),
            nodes,
            pairs,
            ledger: HashMap::new(),
            rng: SplitMix64::derive(cfg.seed, 0),
            latencies: Vec::new(),
            bytes: 0,
            first_post: None,
            last_completion: ModelTime::ZERO,
            finished: 0,
            total,
            setup: ModelTime::ZERO,
            data: Vec::new(),
            progress,
            manual: false,
            frame_hook: None,
        })
    }

    pub(crate) fn slot_bytes(&self) -> u64 {
        u64::from(self.cfg.transfer_size).div_ceil(PAGE) * PAGE
    }

    /// Initial memory: pinned (pin-all) or initialised by the application, oldest slots
    /// first so that the slots used first are the ones still resident.
    pub(crate) fn setup(&mut self) -> VqResult<()> {
        let slot_bytes = self.slot_bytes();
        for n in 0..self.nodes.len() {
            let mut cost = ModelTime::ZERO;
            let mut vas = Vec::new();
            for slot in (0..self.cfg.slots as u64).rev() {
                for &p in self.nodes[n]
                    .out_pairs
                    .iter()
                    .chain(self.nodes[n].in_pairs.iter())
                {
                    let pair = &self.pairs[p];
                    let base = if pair.src == n {
                        pair.src_base
                    } else {
                        pair.dst_base
                    };
                    let slot_va = base + slot * slot_bytes;
                    for page in 0..slot_bytes / PAGE {
                        vas.push(slot_va + page * PAGE);
                    }
                }
            }
            let pin = self.cfg.strategy == Strategy::PinAll;
            let node = &mut self.nodes[n];
            for va in vas {
                node.mm.cpu_touch(va, ModelTime::ZERO, pin)?;
                if pin {
                    cost = cost
                        .after(self.cfg.costs.pin_page)
                        .after(self.cfg.costs.cpu_minor_fault);
                }
            }
            self.setup = self.setup.max(cost);
            node.mm.mem.begin_run();
        }
        // Setup happens before time starts; the application starts after the longest setup.
        if !self.manual {
            for n in 0..self.nodes.len() {
                self.q.schedule(self.setup, Ev::AppRun(n));
            }
        }
        Ok(())
    }

    fn main_loop(&mut self) -> VqResult<()> {
        (self.progress)(0, self.total);
        while self.finished < self.total {
            let Some((now, ev)) = self.q.pop() else {
                let outstanding = self.total - self.finished;
                return Err(SimError::Accounting(format!(
                    "simulation stalled with {outstanding} of {} transfers unfinished",
                    self.total
                )));
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

    pub(crate) fn engine_step(&mut self, n: usize, now: ModelTime) -> VqResult<()> {
        let mut out = Vec::new();
        let advance = {
            let node = &mut self.nodes[n];
            let mut model = node.driver.bus().lock();
            model.advance(&mut EngineCtx {
                now,
                dram: &node.dram,
                axi: &mut node.mm.smmu,
                out: &mut out,
            })
        };
        let out = match self.frame_hook.as_mut() {
            Some(hook) => out.into_iter().flat_map(&mut **hook).collect(),
            None => out,
        };
        for frame in out {
            let arrival = self
                .fabric
                .send(now, n, frame.dst, frame.wire_bytes(), frame.vc())?;
            let dst = frame.dst;
            self.q.schedule(arrival, Ev::Arrive(dst, Box::new(frame)));
        }
        if let Some(t) = advance.next {
            self.request_engine(n, t);
        }
        if advance.irq {
            self.request_driver(n, now);
        }
        // Fault records the SMMU queued (the context-fault interrupt).
        let mut records = Vec::new();
        self.nodes[n].mm.smmu.take_records(&mut records)?;
        for record in records {
            self.fault_record(n, now, &record)?;
        }
        Ok(())
    }

    fn fault_record(
        &mut self,
        n: usize,
        now: ModelTime,
        record: &smmu_driver::fault::FaultRecord,
    ) -> VqResult<()> {
        let costs = self.cfg.costs;
        let node = &mut self.nodes[n];
        let actions = node.faults.on_record(now, record, &mut node.mm, &costs)?;
        for action in actions {
            match action {
                FaultAction::None => {}
                FaultAction::Terminate(at, token) => self.q.schedule(at, Ev::Terminate(n, token)),
                FaultAction::Resolve(at, page) => self.q.schedule(at, Ev::FaultDone(n, page)),
                FaultAction::Unresolvable(at, page, reason) => {
                    self.q.schedule(at, Ev::Unresolvable(n, page, reason))
                }
            }
        }
        Ok(())
    }

    fn fault_done(&mut self, n: usize, now: ModelTime, page: u64) -> VqResult<()> {
        let node = &mut self.nodes[n];
        let Some(inflight) = node.faults.inflight.remove(&page) else {
            return Ok(());
        };
        if node.lose_requests {
            // Lost: stalled accesses are terminated, and nobody hears of the page again.
            for token in inflight.resume {
                node.mm.smmu.resume(token, now, false)?;
            }
            return node.mm.mem.release_hold(page);
        }
        if node.mm.mem.needs_frame(page) {
            node.mm.ensure_free_frame(now)?;
        }
        let Mm {
            mem, table, smmu, ..
        } = &mut node.mm;
        let fixed = node.faults.handler.fix(&inflight.plan, mem, table, smmu);
        match fixed {
            Ok(outcome) => {
                let generation = match outcome.mapped {
                    Some(mapped) => node.mm.pstate.mark_present(
                        VirtAddr::new(page),
                        hal::PageSize::Size4K,
                        mapped.frame,
                        true,
                    )?,
                    None => node.mm.pstate.generation(),
                };
                if !outcome.invalidations.is_empty() {
                    use smmu_driver::pagetable::TlbMaintenance;
                    node.mm.smmu.invalidate_now(&outcome.invalidations)?;
                }
                node.mm.mem.reference(page);
                for token in inflight.resume {
                    node.mm.smmu.resume(token, now, true)?;
                }
                node.driver.page_resolved(PDID, page, generation)?;
            }
            Err(SmmuError::ResolveFailed { .. })
            | Err(SmmuError::OutsideRegisteredRegion { .. }) => {
                for token in inflight.resume {
                    node.mm.smmu.resume(token, now, false)?;
                }
                node.driver
                    .page_unresolvable(PDID, page, FaultReason::OutOfRegion)?;
                node.mm.mem.release_hold(page)?;
            }
            Err(e) => return Err(e.into()),
        }
        self.engine_step(n, now)?;
        self.request_driver(n, now);
        Ok(())
    }

    fn driver_run(&mut self, n: usize, now: ModelTime) -> VqResult<()> {
        let costs = self.cfg.costs;
        let report = {
            let node = &mut self.nodes[n];
            let mut host = HostView {
                mm: &mut node.mm,
                requests: &mut node.requests,
            };
            node.driver.poll(now.as_ns(), &mut host)?
        };
        let mut cost = costs.driver_entry;
        let mul = |t: ModelTime, k: u32| ModelTime(t.0.saturating_mul(u64::from(k)));
        cost = cost
            .after(mul(costs.per_cq, report.cq_entries))
            .after(mul(costs.per_rq, report.rq_entries))
            .after(mul(costs.per_wcq, report.wcq_entries))
            .after(mul(
                costs.per_post,
                report.blocks_posted + report.msgs_posted,
            ))
            .after(mul(costs.per_local_fault, report.local_faults));
        let done = now.after(cost);
        self.nodes[n].driver_free_at = done;
        // The engine sees the doorbells (and the CQ room a drained CQ gives a channel that
        // waited for it) once the driver finished.
        if report.blocks_posted
            + report.msgs_posted
            + report.cq_entries
            + report.rq_entries
            + report.wcq_entries
            + report.local_faults
            > 0
        {
            self.request_engine(n, done);
        }
        // Fault requests of the driver go to the fault service.
        let mut requests = std::mem::take(&mut self.nodes[n].requests);
        if self.nodes[n].lose_requests {
            requests.clear();
        }
        let mut resolved_now = false;
        for (va, access) in requests {
            let page = va & !(PAGE - 1);
            let node = &mut self.nodes[n];
            if node.faults.inflight.contains_key(&page) {
                continue;
            }
            if node.mm.mem.is_resident(page) {
                let generation = node.mm.pstate.generation();
                node.driver.page_resolved(PDID, page, generation)?;
                resolved_now = true;
                continue;
            }
            let stream = match access {
                Access::Read => node.mm.read_stream,
                Access::Write => node.mm.write_stream,
            };
            let record = FaultService::record_for(stream, va, access);
            self.fault_record(n, done, &record)?;
        }
        if resolved_now {
            self.request_driver(n, done);
        }
        self.harvest(n, done)?;
        if let Some(deadline) = report.next_deadline {
            self.request_driver(n, ModelTime::from_ns(deadline).max(done));
        }
        Ok(())
    }

    /// Completions at the sender and deliveries at the receiver.
    fn harvest(&mut self, n: usize, at: ModelTime) -> VqResult<()> {
        if self.manual {
            for i in 0..self.nodes[n].out_pairs.len() {
                let p = self.nodes[n].out_pairs[i];
                let channel = self.pairs[p].channel;
                while let Some(c) = self.nodes[n].driver.poll_completion(channel)? {
                    self.pairs[p].completions.push((at, c));
                }
            }
            for i in 0..self.nodes[n].in_pairs.len() {
                let p = self.nodes[n].in_pairs[i];
                let slot = self.pairs[p].peer_slot;
                while let Some(d) = self.nodes[n].driver.poll_delivery(slot)? {
                    self.pairs[p].deliveries.push((at, d));
                }
            }
            return Ok(());
        }
        let mut app_wake = false;
        for i in 0..self.nodes[n].out_pairs.len() {
            let p = self.nodes[n].out_pairs[i];
            let channel = self.pairs[p].channel;
            while let Some(c) = self.nodes[n].driver.poll_completion(channel)? {
                let pair = &mut self.pairs[p];
                if c.tid.0 != pair.next_completion {
                    return Err(SimError::Accounting(format!(
                        "node {} -> {}: completion of transfer {} arrived while {} was expected",
                        pair.src, pair.dst, c.tid.0, pair.next_completion
                    )));
                }
                pair.next_completion = pair.next_completion.wrapping_add(1);
                if c.status != CompletionStatus::Ok {
                    return Err(SimError::Accounting(format!(
                        "node {} -> {}: transfer {} ended {:?}",
                        pair.src, pair.dst, c.tid.0, c.status
                    )));
                }
                let rec = self.ledger.get_mut(&(p, c.tid.0)).ok_or_else(|| {
                    SimError::Accounting(format!("completion for unknown transfer {}", c.tid.0))
                })?;
                if rec.completed {
                    return Err(SimError::Accounting(format!(
                        "transfer {} completed twice",
                        c.tid.0
                    )));
                }
                rec.completed = true;
                self.latencies.push(at.since(rec.posted).as_us());
                self.last_completion = self.last_completion.max(at);
                pair.inflight -= 1;
                pair.free_src.push(rec.prepared.src_slot);
                if rec.verified {
                    pair.free_dst.push(rec.prepared.dst_slot);
                    pair.finished += 1;
                    self.finished += 1;
                    self.ledger.remove(&(p, c.tid.0));
                }
                app_wake = true;
            }
        }
        for i in 0..self.nodes[n].in_pairs.len() {
            let p = self.nodes[n].in_pairs[i];
            let slot = self.pairs[p].peer_slot;
            while let Some(d) = self.nodes[n].driver.poll_delivery(slot)? {
                self.verify(p, d.tid.0, d.status)?;
            }
        }
        if app_wake {
            self.wake_app(n, at);
        }
        if self.finished.is_multiple_of(256) || self.finished == self.total {
            (self.progress)(self.finished, self.total);
        }
        Ok(())
    }

    fn verify(&mut self, p: usize, tid: u32, status: DeliveryStatus) -> VqResult<()> {
        let slot_bytes = self.slot_bytes();
        let len = self.cfg.transfer_size as usize;
        let pair = &mut self.pairs[p];
        if tid != pair.next_delivery {
            return Err(SimError::Accounting(format!(
                "node {} <- {}: delivery of transfer {tid} while {} was expected",
                pair.dst, pair.src, pair.next_delivery
            )));
        }
        pair.next_delivery = pair.next_delivery.wrapping_add(1);
        if status != DeliveryStatus::Complete {
            return Err(SimError::Accounting(format!(
                "node {} <- {}: transfer {tid} delivered {status:?}",
                pair.dst, pair.src
            )));
        }
        let (src, dst, dst_base) = (pair.src, pair.dst, pair.dst_base);
        let rec = self.ledger.get_mut(&(p, tid)).ok_or_else(|| {
            SimError::Accounting(format!(
                "delivery of unknown transfer {tid} ({src} -> {dst})"
            ))
        })?;
        if rec.verified {
            return Err(SimError::Accounting(format!(
                "transfer {tid} delivered twice"
            )));
        }
        self.data.resize(len, 0);
        let dst_va = dst_base + u64::from(rec.prepared.dst_slot) * slot_bytes;
        self.nodes[dst].mm.mem.peek(dst_va, &mut self.data)?;
        let got = checksum(&self.data);
        if got != rec.prepared.checksum {
            return Err(SimError::Verification(format!(
                "transfer {tid} from node {src} to node {dst}: checksum {got:#018x}, sent {:#018x}",
                rec.prepared.checksum
            )));
        }
        rec.verified = true;
        self.bytes += len as u64;
        if rec.completed {
            let dst_slot = rec.prepared.dst_slot;
            self.ledger.remove(&(p, tid));
            let pair = &mut self.pairs[p];
            pair.free_dst.push(dst_slot);
            pair.finished += 1;
            self.finished += 1;
            let src_node = pair.src;
            self.wake_app(src_node, self.q.now());
        }
        Ok(())
    }

    fn wake_app(&mut self, n: usize, at: ModelTime) {
        if !self.nodes[n].app_busy {
            self.nodes[n].app_busy = true;
            let at = at.max(self.nodes[n].app_free_at);
            self.q.schedule(at, Ev::AppRun(n));
        }
    }

    /// The application prepares the next transfer of one of its pairs, round-robin.
    fn app_run(&mut self, n: usize, now: ModelTime) -> VqResult<()> {
        self.nodes[n].app_busy = false;
        let count = self.nodes[n].out_pairs.len();
        let mut chosen = None;
        for step in 0..count {
            let i = (self.nodes[n].next_pair + step) % count;
            let p = self.nodes[n].out_pairs[i];
            let pair = &mut self.pairs[p];
            if let Some(waiting) = pair.waiting.take() {
                // Refused by back-pressure earlier: post it again.
                self.nodes[n].app_busy = true;
                self.q.schedule(now, Ev::AppPost(n, waiting));
                self.nodes[n].next_pair = (i + 1) % count;
                return Ok(());
            }
            if pair.submitted < pair.quota
                && pair.inflight < self.cfg.depth
                && !pair.free_src.is_empty()
                && !pair.free_dst.is_empty()
            {
                chosen = Some(p);
                self.nodes[n].next_pair = (i + 1) % count;
                break;
            }
        }
        let Some(p) = chosen else {
            return Ok(());
        };
        let slot_bytes = self.slot_bytes();
        let len = self.cfg.transfer_size as usize;
        let costs = self.cfg.costs;
        let (src, dst, seq, src_slot, dst_slot, src_va, dst_va) = {
            let pair = &mut self.pairs[p];
            let src_slot = pair.free_src.pop().unwrap_or(0);
            let dst_slot = pair.free_dst.pop().unwrap_or(0);
            let seq = pair.submitted;
            pair.submitted += 1;
            pair.inflight += 1;
            (
                pair.src,
                pair.dst,
                seq,
                src_slot,
                dst_slot,
                pair.src_base + u64::from(src_slot) * slot_bytes,
                pair.dst_base + u64::from(dst_slot) * slot_bytes,
            )
        };
        // Produce the data (not charged: it is the workload, not the transfer).
        let mut data_rng = SplitMix64::derive(self.cfg.seed ^ 0xDA7A, (p as u64) << 40 | seq);
        self.data.resize(len, 0);
        for chunk in self.data.chunks_mut(8) {
            let w = data_rng.next_u64().to_le_bytes();
            chunk.copy_from_slice(w.get(..chunk.len()).unwrap_or(&[]));
        }
        let sum = checksum(&self.data);
        let mut t = now.max(self.nodes[n].app_free_at);
        let pages = (len as u64).div_ceil(PAGE);
        // The CPU's stores bring the source pages in (its faults are charged).
        for page in 0..pages {
            t = self.cpu_access(n, src_va + page * PAGE, t)?;
        }
        self.nodes[n].mm.mem.write_resident(src_va, &self.data)?;
        // Background reclaim (pressure from other memory users) has taken each page of the
        // transfer away with probability `fault_rate`. A destination page at a uniformly
        // random moment since the slot was last used: recently taken pages are still in
        // memory (minor fault), older ones were written to swap (major fault). A source page
        // only after the CPU's stores above made it resident with the new data, so now: it is
        // still in memory (a minor fault); writing it to swap "before" the data existed would
        // be a major fault that cannot happen.
        let rate = self.cfg.fault_rate;
        let dst_used = std::mem::replace(&mut self.pairs[p].dst_used[dst_slot as usize], now);
        for page in 0..pages {
            if self.rng.chance(rate) {
                let va = src_va + page * PAGE;
                let mm = &mut self.nodes[n].mm;
                if mm.mem.is_resident(va) && !mm.mem.is_pinned(va) {
                    mm.deactivate_at(va, now)?;
                }
            }
            if self.rng.chance(rate) {
                let va = dst_va + page * PAGE;
                let when = dst_used.after(ModelTime(
                    (now.since(dst_used).0 as f64 * self.rng.next_f64()) as u64,
                ));
                let mm = &mut self.nodes[dst].mm;
                if mm.mem.is_resident(va) && !mm.mem.is_pinned(va) {
                    mm.deactivate_at(va, when)?;
                }
            }
        }
        if self.cfg.strategy == Strategy::PreFault {
            for page in 0..pages {
                t = t.after(costs.touch_page);
                t = self.cpu_access(n, src_va + page * PAGE, t)?;
            }
        }
        t = t.after(costs.app_post);
        self.nodes[n].app_free_at = t;
        self.nodes[n].app_busy = true;
        let _ = src;
        self.q.schedule(
            t,
            Ev::AppPost(
                n,
                Prepared {
                    pair: p,
                    seq,
                    src_slot,
                    dst_slot,
                    checksum: sum,
                },
            ),
        );
        Ok(())
    }

    /// A CPU access by the application at `t`; returns when it is done.
    fn cpu_access(&mut self, n: usize, va: u64, t: ModelTime) -> VqResult<ModelTime> {
        let costs = self.cfg.costs;
        let node = &mut self.nodes[n];
        let (fault, io_done) = node.mm.cpu_touch(va, t, false)?;
        Ok(match fault {
            None => t,
            Some(FaultCost::Minor) => {
                node.faults.counters.cpu_faults += 1;
                t.after(costs.cpu_minor_fault)
            }
            Some(FaultCost::Major) => {
                node.faults.counters.cpu_faults += 1;
                io_done.max(t).after(costs.cpu_minor_fault)
            }
        })
    }

    fn app_post(&mut self, n: usize, now: ModelTime, prepared: Prepared) -> VqResult<()> {
        self.nodes[n].app_busy = false;
        let slot_bytes = self.slot_bytes();
        let pair = &self.pairs[prepared.pair];
        let desc = TransferDesc {
            src: pair.src_base + u64::from(prepared.src_slot) * slot_bytes,
            dest: pair.dst_base + u64::from(prepared.dst_slot) * slot_bytes,
            len: u64::from(self.cfg.transfer_size),
            key: u32::from(PDID),
            tag: prepared.seq,
        };
        let channel = pair.channel;
        match self.nodes[n].driver.submit(channel, desc) {
            Ok(tid) => {
                self.first_post.get_or_insert(now);
                self.ledger.insert(
                    (prepared.pair, tid.0),
                    Record {
                        prepared,
                        posted: now,
                        completed: false,
                        verified: false,
                    },
                );
                self.request_driver(n, now);
            }
            Err(e) if e.is_back_pressure() => {
                // Nothing is dropped: the transfer waits for a completion.
                self.pairs[prepared.pair].waiting = Some(prepared);
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
        self.wake_app(n, now);
        Ok(())
    }

    fn report(&mut self) -> VqResult<RunReport> {
        if !self.ledger.is_empty() {
            return Err(SimError::Accounting(format!(
                "{} transfers are still unfinished at the end",
                self.ledger.len()
            )));
        }
        let mut r = RunReport {
            strategy: self.cfg.strategy.name().into(),
            workload: self.cfg.workload.name().into(),
            nodes: self.cfg.nodes,
            fault_rate: self.cfg.fault_rate,
            seed: self.cfg.seed,
            transfers: self.finished,
            bytes: self.bytes,
            setup: self.setup,
            events: self.q.processed(),
            ..RunReport::default()
        };
        let start = self.first_post.unwrap_or(ModelTime::ZERO);
        r.duration = self.last_completion.since(start);
        if r.duration.0 > 0 {
            r.throughput_gbps = self.bytes as f64 * 8.0 / r.duration.as_secs() / 1e9;
        }
        let mut samples = std::mem::take(&mut self.latencies);
        r.latency = Percentiles::of(&mut samples);
        if self.cfg.keep_samples {
            r.samples = samples;
        }
        let mut faults = 0;
        for node in &self.nodes {
            let fs = node.faults.handler.stats();
            r.minor_faults += fs.minor;
            r.major_faults += fs.major;
            r.spurious_faults += fs.spurious;
            r.resumed += fs.resumed;
            r.cpu_faults += node.faults.counters.cpu_faults;
            let ss = node.mm.smmu.stats();
            r.translations += ss.translations;
            r.stalls += ss.stalls;
            r.terminations += ss.terminated + ss.stall_terminated;
            faults += ss.faults;
            let ds = node.driver.stats();
            r.nacks += ds.nacks_sent;
            r.resolved_notices += ds.resolved_sent;
            r.source_faults += ds.local_faults - ds.local_fault_retries;
            r.dropped_messages += ds.duplicates + ds.unknown_transfer;
            for &p in &node.out_pairs {
                r.retransmissions += node
                    .driver
                    .sender_stats(self.pairs[p].channel)?
                    .retransmissions;
            }
            let es = *node.driver.bus().lock().stats();
            r.stall_time = r
                .stall_time
                .after(es.read_stall_time)
                .after(es.write_stall_time);
            r.write_stall_time = r.write_stall_time.after(es.write_stall_time);
            if es.unordered_doorbells
                + es.bad_doorbells
                + es.bad_descriptors
                + es.queue_errors
                + es.link_errors
                > 0
            {
                return Err(SimError::Internal(format!(
                    "engine saw driver errors: {} unordered doorbells, {} bad doorbells, {} bad descriptors, {} queue errors, {} link errors",
                    es.unordered_doorbells,
                    es.bad_doorbells,
                    es.bad_descriptors,
                    es.queue_errors,
                    es.link_errors
                )));
            }
            let ms = node.mm.mem.stats();
            r.resident_peak += ms.peak_resident * PAGE;
            r.swap_outs += ms.swap_outs;
            r.footprint += node.mm.mem.pages() as u64 * PAGE;
            let limit = node.mm.mem.limit() as u64 * PAGE;
            r.memory_limit = r.memory_limit.max(limit);
            r.memory_limit_total += limit;
        }
        if r.translations > 0 {
            r.measured_fault_rate = faults as f64 / r.translations as f64;
        }
        Ok(r)
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
