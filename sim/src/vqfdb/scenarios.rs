//! The workloads `nprdma demo` runs, shared with the tests that check what it shows.
//!
//! [`demo`] is the main workload (one QFDB, all-to-all, 64 KiB, memory limit 25%), swept over
//! [`SWEEP`]. [`SCENARIOS`] are further workloads chosen so that stalling should win: a
//! re-send must cross a long link twice (the RESOLVED notice out, the block back), while the
//! few transfers in flight towards a node leave little behind a stalled write.

use super::{MemoryLimit, SimConfig, Strategy, Workload};
use crate::des::ModelTime;

/// Faulting-page rates of the demo's sweep.
pub const SWEEP: [f64; 5] = [0.0, 0.005, 0.01, 0.02, 0.05];

/// Offered loads (payload Gb/s over all pairs, open loop) at which the demo measures latency:
/// below saturation (about 56% of the fault-free workload's 107 Gb/s) and at saturation (the
/// fault-free run's capacity: it just keeps up, a faulting run cannot, so the application's
/// backlog grows through the run and these latencies also depend on the run's length).
pub const LATENCY_LOADS_GBPS: [(f64, &str); 2] =
    [(60.0, "below saturation"), (107.0, "at saturation")];

/// The demo workload: one QFDB, all-to-all RDMA writes of 64 KiB from unpinned buffers, two
/// in flight per pair, the memory limit at 25% of the buffer footprint (memory pressure:
/// reclaimed pages soon go to swap).
pub fn demo(strategy: Strategy, fault_rate: f64, transfers: u64, seed: u64) -> SimConfig {
    SimConfig {
        nodes: 4,
        strategy,
        fault_rate,
        memory_limit: MemoryLimit::Fraction(0.25),
        transfers,
        transfer_size: 64 * 1024,
        depth: 2,
        slots: 16,
        seed,
        keep_samples: true,
        ..SimConfig::default()
    }
}

/// A further workload of the demo.
#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    /// Short name.
    pub name: &'static str,
    /// What it is and why stalling should win there.
    pub what: &'static str,
    /// Its configuration for a strategy, a number of transfers and a seed.
    pub config: fn(Strategy, u64, u64) -> SimConfig,
}

/// A fast swap device: 5 µs per request at 8 GB/s (an NVMe-class device; the default is 50 µs
/// at 2 GB/s), so even a major fault resolves in about 10 µs.
fn fast_swap(cfg: &mut SimConfig) {
    cfg.swap.latency = ModelTime::from_ns(5_000);
    cfg.swap.bandwidth_bps = 64_000_000_000;
}

fn long_link(strategy: Strategy, transfers: u64, seed: u64) -> SimConfig {
    let mut cfg = SimConfig {
        depth: 1,
        fault_rate: 0.02,
        ..demo(strategy, 0.02, transfers, seed)
    };
    cfg.link.hop_latency = ModelTime::from_ns(20_000);
    fast_swap(&mut cfg);
    cfg
}

fn incast(strategy: Strategy, transfers: u64, seed: u64) -> SimConfig {
    let mut cfg = SimConfig {
        workload: Workload::Incast,
        depth: 1,
        ..demo(strategy, 0.02, transfers, seed)
    };
    cfg.link.hop_latency = ModelTime::from_ns(10_000);
    fast_swap(&mut cfg);
    cfg
}

fn two_qfdbs(strategy: Strategy, transfers: u64, seed: u64) -> SimConfig {
    let mut cfg = SimConfig {
        nodes: 8,
        workload: Workload::Ring,
        transfer_size: 128 * 1024,
        depth: 1,
        slots: 8,
        ..demo(strategy, 0.02, transfers, seed)
    };
    cfg.link.hop_latency = ModelTime::from_ns(5_000);
    fast_swap(&mut cfg);
    cfg
}

/// The demo's further scenarios (2% faulting pages each).
pub const SCENARIOS: [Scenario; 3] = [
    Scenario {
        name: "long-link",
        what: "4 nodes all-to-all, 64 KiB, 1 in flight per pair, 20 µs per hop, fast swap",
        config: long_link,
    },
    Scenario {
        name: "incast",
        what: "3 nodes write to node 0, 64 KiB, 1 in flight per pair, 10 µs per hop, fast swap",
        config: incast,
    },
    Scenario {
        name: "two-qfdb-ring",
        what: "8 nodes (2 QFDBs) in a ring, 128 KiB, 1 in flight, 5 µs per hop, fast swap",
        config: two_qfdbs,
    },
];
