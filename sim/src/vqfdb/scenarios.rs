//! The workloads `nprdma demo` runs, shared with the tests that check what it shows.
//!
//! [`demo`] is the main workload (one QFDB, all-to-all, 64 KiB, memory limit 25%), swept over
//! [`SWEEP`]. [`SCENARIOS`] are further workloads chosen so that stalling should win: a
//! re-send must cross a long link twice (the RESOLVED notice out, the block back), while the
//! few transfers in flight towards a node leave little behind a stalled write.

use super::{MemoryLimit, RunReport, SimConfig, Strategy, Workload};
use crate::des::ModelTime;

/// Faulting-page rates of the demo's sweep.
pub const SWEEP: [f64; 5] = [0.0, 0.005, 0.01, 0.02, 0.05];

/// The faulting-page rate of the demo's main table and of its latency runs.
pub const MAIN_RATE: f64 = 0.01;

/// Transfers per run of the demo (its `--transfers` and `--sweep-transfers` defaults; the
/// tests run the same).
pub const DEMO_TRANSFERS: u64 = 2400;

/// The strategies the verdict compares, in its order.
pub const CONTENDERS: [Strategy; 3] = [
    Strategy::StallOnly,
    Strategy::RetransmitOnly,
    Strategy::Hybrid,
];

/// How far hybrid may fall below the better of stall-only and retransmit-only (a share of
/// it) before it counts as lost.
pub const HYBRID_TOLERANCE: f64 = 0.005;

/// One case of the verdict: throughput (Gb/s, model time) of the three contenders.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// The case: a faulting rate of the sweep or a scenario's name.
    pub case: String,
    /// Stall-only's throughput.
    pub stall: f64,
    /// Retransmit-only's throughput.
    pub retransmit: f64,
    /// Hybrid's throughput.
    pub hybrid: f64,
}

impl Verdict {
    /// The verdict of `runs`, the contenders' reports in [`CONTENDERS`] order.
    pub fn of(case: impl Into<String>, runs: &[RunReport]) -> Self {
        let gbps = |k: usize| runs.get(k).map_or(0.0, |r| r.throughput_gbps);
        Self {
            case: case.into(),
            stall: gbps(0),
            retransmit: gbps(1),
            hybrid: gbps(2),
        }
    }

    /// The better of stall-only and retransmit-only, and its name.
    pub fn best_other(&self) -> (f64, &'static str) {
        if self.stall >= self.retransmit {
            (self.stall, "stall-only")
        } else {
            (self.retransmit, "retransmit-only")
        }
    }

    /// Hybrid's margin over the better of the other two, in percent (negative: below it).
    pub fn margin_percent(&self) -> f64 {
        let (best, _) = self.best_other();
        if best > 0.0 {
            100.0 * (self.hybrid - best) / best
        } else {
            0.0
        }
    }

    /// Hybrid is more than [`HYBRID_TOLERANCE`] below the better of the other two.
    pub fn hybrid_lost(&self) -> bool {
        self.hybrid < (1.0 - HYBRID_TOLERANCE) * self.best_other().0
    }
}

/// Runs `cfgs` on up to `threads` threads (each run is deterministic on its own); results in
/// `cfgs` order.
pub fn run_parallel(cfgs: &[SimConfig], threads: usize) -> Vec<super::VqResult<RunReport>> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: std::sync::Mutex<Vec<Option<super::VqResult<RunReport>>>> =
        std::sync::Mutex::new((0..cfgs.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, cfgs.len().max(1)) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(cfg) = cfgs.get(i) else { break };
                    let r = super::run(cfg, &mut |_, _| {});
                    if let Ok(mut all) = results.lock()
                        && let Some(slot) = all.get_mut(i)
                    {
                        *slot = Some(r);
                    }
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_default()
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(super::SimError::Internal("a run did not report".into()))))
        .collect()
}

/// The latency rule: at the same offered load, no faulting run has a lower median than the
/// fault-free one. Returns a line per run that breaks it.
pub fn median_violations(free: &RunReport, runs: &[RunReport]) -> Vec<String> {
    runs.iter()
        .filter(|r| r.fault_rate > 0.0 && r.latency.p50 < free.latency.p50)
        .map(|r| {
            format!(
                "{} at {}: p50 {:.1} µs < fault-free {:.1} µs",
                r.strategy,
                r.offered_load_gbps
                    .map_or("closed loop".to_string(), |l| format!("{l:.0} Gb/s")),
                r.latency.p50,
                free.latency.p50
            )
        })
        .collect()
}

/// The below-saturation latency load, as a share of the saturation load.
pub const BELOW_SATURATION: f64 = 0.56;

/// The offered loads (payload Gb/s over all pairs, open loop) at which the demo measures
/// latency, from `capacity_gbps`, the fault-free closed-loop throughput of the same
/// workload ([`saturation_gbps`]): below saturation ([`BELOW_SATURATION`] of it) and at
/// saturation (all of it: the fault-free run can just carry the load, a faulting one cannot,
/// so backlogs grow through the run and these latencies also depend on the run's length).
/// Above saturation every strategy is overloaded and the medians stop meaning what they
/// mean here (docs/virtual-qfdb.md, "Reading the demo table"); the demo does not go there.
pub fn latency_loads(capacity_gbps: f64) -> [(f64, &'static str); 2] {
    [
        (capacity_gbps * BELOW_SATURATION, "below saturation"),
        (capacity_gbps, "at saturation"),
    ]
}

/// Saturation, precisely: the throughput (Gb/s, model time) of the fault-free closed loop on
/// the demo workload with `transfers` transfers, where every pair always has its window
/// full: the most the nodes carry without faults. (Without faults nothing in the run is
/// random, so it is the same for every seed.)
pub fn saturation_gbps(transfers: u64, seed: u64) -> super::VqResult<f64> {
    let cfg = SimConfig {
        keep_samples: false,
        ..demo(Strategy::Hybrid, 0.0, transfers, seed)
    };
    Ok(super::run(&cfg, &mut |_, _| {})?.throughput_gbps)
}

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

/// The runs of one latency table: the fault-free run (hybrid at 0%), then every strategy at
/// [`MAIN_RATE`], all open loop at `load_gbps` (the same arrivals for every strategy).
pub fn latency_runs(load_gbps: f64, transfers: u64, seed: u64) -> Vec<SimConfig> {
    std::iter::once((Strategy::Hybrid, 0.0))
        .chain(Strategy::ALL.into_iter().map(|s| (s, MAIN_RATE)))
        .map(|(s, rate)| SimConfig {
            offered_load_gbps: Some(load_gbps),
            ..demo(s, rate, transfers, seed)
        })
        .collect()
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
