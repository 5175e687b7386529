//! The virtual QFDB: nodes with our driver stack running against models, a workload, and the
//! measurements behind `nprdma demo` and `nprdma sim`.
//!
//! Each node has simulated DRAM, an NPE engine model (`crate::npe`) driven by the real driver
//! (`dma_engine::npe::Npe`) through the register seam, an SMMU (`crate::axi`) walking real
//! stage-1 tables (`smmu_driver::pagetable`), memory with a limit, reclaim and swap
//! (`crate::node_memory`), the protocol's page-state table, and a fault service built on
//! `smmu_driver::fault::FaultHandler`. Nodes exchange frames over the fabric of
//! `crate::qfdb`. An application on each node posts RDMA writes of unpinned buffers and checks
//! every byte that arrives.
//!
//! Node software runs inside the simulation and costs modelled CPU time ([`CostModel`]). All
//! times in reports are **model time**; the CLI measures wall time separately and never mixes
//! the two.

mod latency;
mod node;
mod rig;
pub mod scenarios;
mod smmu;
pub mod soak;
mod world;

pub use crate::error::{Integrity, Result as VqResult, SimError};
pub use latency::{FaultClass, Histogram};
pub use rig::{Eviction, Rig};
pub use smmu::SmmuModel;
pub use smmu_driver::fault::CostDecisions;
pub use world::{PairSeam, Seam, Seams, run, run_with_hook, run_with_seams};

use crate::des::ModelTime;
use crate::link::LinkParams;
use crate::node_memory::SwapParams;

/// How a run deals with unpinned memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Pin every buffer page at start: no faults, everything resident.
    PinAll,
    /// Touch every source page on the CPU just before posting; residual faults are handled
    /// like `Hybrid`.
    PreFault,
    /// SMMU contexts stall every fault; the handler resumes after resolving, however long.
    StallOnly,
    /// SMMU contexts terminate every fault; the protocol re-sends (NACK/RESOLVED, local
    /// re-issue).
    RetransmitOnly,
    /// The cost-based policy (`smmu_driver::fault::CostPolicy`): a stream goes on a
    /// stall-mode context only where a stall can pay; per fault, stall or re-send, whichever
    /// is expected to cost less (docs/virtual-qfdb.md, "The hybrid policy").
    Hybrid,
    /// The fixed rule the hybrid strategy used before the cost-based policy: both contexts
    /// stall, resume minor faults within the stall budgets (`CostModel::stall_budget`,
    /// `write_stall_budget`), terminate and re-send the rest. For comparison; not in
    /// [`Strategy::ALL`].
    HybridFixed,
}

impl Strategy {
    /// All strategies, in table order.
    pub const ALL: [Strategy; 5] = [
        Strategy::PinAll,
        Strategy::PreFault,
        Strategy::StallOnly,
        Strategy::RetransmitOnly,
        Strategy::Hybrid,
    ];

    /// The CLI name.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::PinAll => "pin-all",
            Strategy::PreFault => "pre-fault",
            Strategy::StallOnly => "stall-only",
            Strategy::RetransmitOnly => "retransmit-only",
            Strategy::Hybrid => "hybrid",
            Strategy::HybridFixed => "hybrid-fixed",
        }
    }

    /// From a CLI name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .chain([Strategy::HybridFixed])
            .find(|s| s.name() == name)
    }
}

/// Who sends to whom.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Workload {
    /// Every node writes to every other node.
    AllToAll,
    /// Node i writes to node i + 1 (mod n).
    Ring,
    /// Every node writes to node 0.
    Incast,
}

impl Workload {
    /// The CLI name.
    pub fn name(self) -> &'static str {
        match self {
            Workload::AllToAll => "all-to-all",
            Workload::Ring => "ring",
            Workload::Incast => "incast",
        }
    }

    /// From a CLI name.
    pub fn from_name(name: &str) -> Option<Self> {
        [Workload::AllToAll, Workload::Ring, Workload::Incast]
            .into_iter()
            .find(|w| w.name() == name)
    }

    /// The (source, destination) pairs for `nodes` nodes.
    pub fn pairs(self, nodes: usize) -> Vec<(usize, usize)> {
        match self {
            Workload::AllToAll => (0..nodes)
                .flat_map(|s| (0..nodes).filter(move |&d| d != s).map(move |d| (s, d)))
                .collect(),
            Workload::Ring => (0..nodes).map(|s| (s, (s + 1) % nodes)).collect(),
            Workload::Incast => (1..nodes).map(|s| (s, 0)).collect(),
        }
    }
}

/// The memory limit per node.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MemoryLimit {
    /// Absolute, in bytes.
    Bytes(u64),
    /// A fraction of the node's buffer footprint.
    Fraction(f64),
}

/// Modelled CPU costs of node software (model time). Sources: NP-RDMA's fault figures
/// (the NP-RDMA paper's abstract: 3.5-5.7 µs minor, 60 µs major); everything
/// else is our assumption for a Cortex-A53 at 1.5 GHz (the QFDB's, per INFN), stated as
/// such in the reports.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    /// Interrupt entry and exit of one driver run (assumption).
    pub driver_entry: ModelTime,
    /// Per completion entry consumed (assumption).
    pub per_cq: ModelTime,
    /// Per receive entry consumed: decode, admission (assumption).
    pub per_rq: ModelTime,
    /// Per write completion: version check, ACK/NACK (assumption).
    pub per_wcq: ModelTime,
    /// Per descriptor posted (assumption).
    pub per_post: ModelTime,
    /// Per local fault handled by the driver (assumption).
    pub per_local_fault: ModelTime,
    /// Reading the fault record and deciding (assumption; part of the minor cost).
    pub fault_decide: ModelTime,
    /// Resolving and mapping a minor fault, decision included: 4.6 µs, the midpoint of
    /// NP-RDMA's 3.5-5.7 µs.
    pub minor_fault: ModelTime,
    /// CPU part of a major fault; the swap device adds its own time (the sum is about
    /// NP-RDMA's 60 µs with the default device).
    pub major_fault_cpu: ModelTime,
    /// Posting one transfer (assumption).
    pub app_post: ModelTime,
    /// Touching one resident page on the CPU (pre-fault; assumption).
    pub touch_page: ModelTime,
    /// A CPU page fault that needs no I/O (assumption).
    pub cpu_minor_fault: ModelTime,
    /// Pinning one page (assumption).
    pub pin_page: ModelTime,
    /// How long the hybrid policy lets a source read stall (ours: above a minor fault, far
    /// below a major one).
    pub stall_budget: ModelTime,
    /// How long it lets a destination write stall: a stalled write holds the write engine and
    /// every block behind it, so only faults that are nearly free (already resolved) are worth
    /// it (ours).
    pub write_stall_budget: ModelTime,
}

impl CostModel {
    /// How long the fault CPU takes over a minor fault once it starts on it: the decision
    /// and the mapping (`minor_fault` includes the decision, so never less than
    /// `fault_decide`). The one definition the fault service schedules with, the resolver
    /// estimates with and the cost-based policy starts from.
    pub fn minor_service(&self) -> ModelTime {
        self.minor_fault.max(self.fault_decide)
    }

    /// How long a major fault takes once the fault CPU starts on it, with an idle swap
    /// device whose read takes `swap_read`: the decision, then the CPU's part and the read
    /// side by side (what the fault service schedules; the policy's prior).
    pub fn major_service(&self, swap_read: ModelTime) -> ModelTime {
        self.fault_decide.after(self.major_fault_cpu.max(swap_read))
    }
}

impl Default for CostModel {
    fn default() -> Self {
        Self {
            driver_entry: ModelTime::from_ns(500),
            per_cq: ModelTime::from_ns(50),
            per_rq: ModelTime::from_ns(200),
            per_wcq: ModelTime::from_ns(150),
            per_post: ModelTime::from_ns(100),
            per_local_fault: ModelTime::from_ns(300),
            fault_decide: ModelTime::from_ns(500),
            minor_fault: ModelTime::from_ns(4_600),
            major_fault_cpu: ModelTime::from_ns(5_000),
            app_post: ModelTime::from_ns(300),
            touch_page: ModelTime::from_ns(50),
            cpu_minor_fault: ModelTime::from_ns(1_000),
            pin_page: ModelTime::from_ns(250),
            stall_budget: ModelTime::from_ns(10_000),
            write_stall_budget: ModelTime::from_ns(1_000),
        }
    }
}

/// Everything a run needs.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// Nodes (four per QFDB; QFDBs form a ring).
    pub nodes: usize,
    /// Who writes to whom.
    pub workload: Workload,
    /// How unpinned memory is handled.
    pub strategy: Strategy,
    /// Probability that background reclaim takes each page of a transfer away just before the
    /// engine uses it (the faulting-page rate the knob sets).
    pub fault_rate: f64,
    /// Memory limit per node.
    pub memory_limit: MemoryLimit,
    /// Seed of every random choice.
    pub seed: u64,
    /// Transfers in total (over all pairs).
    pub transfers: u64,
    /// Bytes per transfer (1 ..= 128 KiB).
    pub transfer_size: u32,
    /// Transfers in flight per pair.
    pub depth: usize,
    /// Buffer slots per pair and direction (the buffers' footprint).
    pub slots: usize,
    /// Link parameters.
    pub link: LinkParams,
    /// Swap device.
    pub swap: SwapParams,
    /// CPU costs.
    pub costs: CostModel,
    /// Keep every latency sample in the report (for plots); otherwise only percentiles.
    pub keep_samples: bool,
    /// Which SMMU model the nodes use.
    pub smmu: SmmuModel,
    /// Open loop: transfers arrive at this offered load (payload Gb/s over all pairs, model
    /// time; Poisson arrivals per pair from the seed, the same for every strategy) and queue
    /// in the application until their pair's window lets them go. `None`: closed loop, each
    /// pair issues as soon as its window has room.
    pub offered_load_gbps: Option<f64>,
    /// The application posts up to `slots` transfers per pair without waiting for the
    /// driver's window (`depth` is ignored): the driver refuses what its window cannot take
    /// (`QueueFull`) and the application posts it again after a completion (queue-overflow
    /// pressure; the soak).
    pub overpost: bool,
}

impl Default for SimConfig {
    /// One QFDB, all-to-all, hybrid, 1% fault rate, memory limit 50% of the footprint,
    /// 64 KiB transfers, 4 in flight per pair, 16 slots per pair.
    fn default() -> Self {
        Self {
            nodes: 4,
            workload: Workload::AllToAll,
            strategy: Strategy::Hybrid,
            fault_rate: 0.01,
            memory_limit: MemoryLimit::Fraction(0.5),
            seed: 1,
            transfers: 1200,
            transfer_size: 64 * 1024,
            depth: 4,
            slots: 16,
            link: LinkParams::default(),
            swap: SwapParams::default(),
            costs: CostModel::default(),
            keep_samples: false,
            smmu: SmmuModel::Mmu500,
            offered_load_gbps: None,
            overpost: false,
        }
    }
}

/// Latency percentiles in model µs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
    /// Mean.
    pub mean: f64,
    /// Samples.
    pub count: u64,
}

impl Percentiles {
    /// Percentiles of `samples` (nearest-rank); sorts them.
    pub fn of(samples: &mut [f64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_by(f64::total_cmp);
        let rank = |q: f64| {
            let idx = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1;
            samples.get(idx).copied().unwrap_or(0.0)
        };
        Self {
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            p999: rank(0.999),
            max: samples.last().copied().unwrap_or(0.0),
            mean: samples.iter().sum::<f64>() / samples.len() as f64,
            count: samples.len() as u64,
        }
    }
}

/// What a run measured. Times are model time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunReport {
    /// Strategy name.
    pub strategy: String,
    /// Workload name.
    pub workload: String,
    /// Nodes.
    pub nodes: usize,
    /// The fault-rate knob.
    pub fault_rate: f64,
    /// Seed.
    pub seed: u64,
    /// Transfers completed (all verified).
    pub transfers: u64,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Model time from the first post to the last completion.
    pub duration: ModelTime,
    /// Model time spent before the first post (pinning).
    pub setup: ModelTime,
    /// Aggregate payload throughput in Gb/s of model time.
    pub throughput_gbps: f64,
    /// The offered load of an open-loop run (Gb/s); `None` for the closed loop.
    pub offered_load_gbps: Option<f64>,
    /// Per-transfer latency in model µs, from the moment the application intended to issue
    /// the transfer (its open-loop arrival, or in the closed loop the moment its window slot
    /// freed) to its completion: time blocked by back-pressure or a fault before the post
    /// counts.
    pub latency: Percentiles,
    /// The same per [`FaultClass`] (no fault, minor, major, re-sent), in that order.
    pub latency_by_class: [Percentiles; 4],
    /// Latency samples in model µs (sorted), when asked for.
    pub samples: Vec<f64>,
    /// The cost-based policy's decisions with their reasons, summed over the nodes (zero
    /// for the fixed rules).
    pub decisions: CostDecisions,
    /// Of the nodes, how many put their read stream and their write stream on stall-mode
    /// contexts.
    pub stalling_streams: [usize; 2],
    /// Engine page faults resolved without I/O.
    pub minor_faults: u64,
    /// Engine page faults that read the swap device.
    pub major_faults: u64,
    /// Engine faults found already fixed.
    pub spurious_faults: u64,
    /// CPU page faults (pre-fault, data production).
    pub cpu_faults: u64,
    /// SMMU translations (page accesses of the engines).
    pub translations: u64,
    /// Faults per translation.
    pub measured_fault_rate: f64,
    /// Faulting transactions the SMMU stalled.
    pub stalls: u64,
    /// Faults the handler decided to resume (stall, resolve, retry).
    pub resumed: u64,
    /// Faulting transactions terminated (the engine saw an error).
    pub terminations: u64,
    /// Block re-sends.
    pub retransmissions: u64,
    /// NACKs sent.
    pub nacks: u64,
    /// RESOLVED notices sent.
    pub resolved_notices: u64,
    /// Source faults re-issued locally.
    pub source_faults: u64,
    /// Total model time transactions were stalled (read and write).
    pub stall_time: ModelTime,
    /// Of which the destination write engine was stalled (head-of-line for everything behind).
    pub write_stall_time: ModelTime,
    /// Peak resident buffer memory over all nodes, bytes.
    pub resident_peak: u64,
    /// Buffer footprint over all nodes, bytes.
    pub footprint: u64,
    /// The largest node's memory limit, bytes (nodes of an asymmetric workload have their own
    /// footprints, so a percentage limit differs between them).
    pub memory_limit: u64,
    /// The nodes' memory limits added up, bytes.
    pub memory_limit_total: u64,
    /// Pages written to swap.
    pub swap_outs: u64,
    /// Duplicate or unknown-transfer messages the drivers dropped.
    pub dropped_messages: u64,
    /// Events the simulation processed.
    pub events: u64,
    /// Times an engine held arriving traffic at its ingress for want of a receive slot or RQ
    /// entry (`GEVENT.RX_HELD`: back-pressure into the network, nothing dropped).
    pub rx_held: u64,
    /// Frames engines discarded for a bad footer CRC (injected link errors).
    pub crc_drops: u64,
    /// Posts the driver refused with back-pressure (`QueueFull`); each was posted again later.
    pub back_pressure: u64,
    /// What the application's checks counted: lost, duplicated, reordered and corrupted
    /// transfers. A run with any of them fails ([`SimError::Integrity`]), so a report has all
    /// four at 0; they are here so that what was checked is printed from what was counted.
    pub integrity: Integrity,
}
