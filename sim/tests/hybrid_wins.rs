//! The hybrid (cost-based) policy never loses: at every faulting rate of the demo's sweep and
//! in each of the demo's further scenarios, its throughput (model time, deterministic for the
//! seed) is at least the better of stall-only's and retransmit-only's, within 0.5%. The runs
//! are the demo's own (`sim::vqfdb::scenarios`: the same configurations and number of
//! transfers), over several seeds; the verdict is the one the demo prints and fails on.

use sim::vqfdb::scenarios::{
    CONTENDERS, DEMO_TRANSFERS, SCENARIOS, SWEEP, Verdict, demo, run_parallel,
};
use sim::vqfdb::{RunReport, SimConfig};

/// The seeds checked (the demo's default is 1).
const SEEDS: [u64; 3] = [1, 2, 3];

/// Every case of the demo's verdict for `seed`: its name and the contenders' configurations.
fn cases(seed: u64) -> Vec<(String, Vec<SimConfig>)> {
    let mut cases = Vec::new();
    for &rate in SWEEP.iter().filter(|&&r| r > 0.0) {
        let cfgs = CONTENDERS
            .iter()
            .map(|&s| SimConfig {
                keep_samples: false,
                ..demo(s, rate, DEMO_TRANSFERS, seed)
            })
            .collect();
        cases.push((format!("seed {seed}, sweep at {:.1}%", rate * 100.0), cfgs));
    }
    for sc in SCENARIOS {
        let cfgs = CONTENDERS
            .iter()
            .map(|&s| SimConfig {
                keep_samples: false,
                ..(sc.config)(s, DEMO_TRANSFERS, seed)
            })
            .collect();
        cases.push((format!("seed {seed}, {}", sc.name), cfgs));
    }
    cases
}

fn run_cases(cases: &[(String, Vec<SimConfig>)]) -> Vec<(String, Vec<RunReport>)> {
    let all: Vec<SimConfig> = cases.iter().flat_map(|(_, c)| c.clone()).collect();
    let mut reports = run_parallel(&all, 2).into_iter().map(|r| r.unwrap());
    cases
        .iter()
        .map(|(name, cfgs)| (name.clone(), reports.by_ref().take(cfgs.len()).collect()))
        .collect()
}

#[test]
fn hybrid_is_at_least_the_better_of_stall_only_and_retransmit_only() {
    let cases: Vec<_> = SEEDS.iter().flat_map(|&seed| cases(seed)).collect();
    let results = run_cases(&cases);
    let mut stall_won = 0;
    for (case, runs) in &results {
        let v = Verdict::of(case.clone(), runs);
        assert!(
            !v.hybrid_lost(),
            "{case}: hybrid {:.2} Gb/s, stall-only {:.2}, retransmit-only {:.2}",
            v.hybrid,
            v.stall,
            v.retransmit
        );
        stall_won += usize::from(v.stall > v.retransmit);
    }
    // The scenarios are ones where stalling should win, and it does, for every seed.
    assert!(
        stall_won >= 2 * SEEDS.len(),
        "stall-only won only {stall_won} cases"
    );
}
