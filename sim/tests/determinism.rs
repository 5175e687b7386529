//! Same seed, same run: the paths whose state evolves during a run (the hybrid policy
//! learning its service times online, open-loop arrivals, the soak's link errors and queue
//! pressure) reproduce every figure of the report exactly.

use sim::vqfdb::scenarios::{DEMO_TRANSFERS, SCENARIOS, latency_runs, saturation_gbps};
use sim::vqfdb::soak::{self, LinkErrors};
use sim::vqfdb::{RunReport, SimConfig, Strategy, run};

fn twice(cfg: &SimConfig) -> (RunReport, RunReport) {
    (
        run(cfg, &mut |_, _| {}).unwrap(),
        run(cfg, &mut |_, _| {}).unwrap(),
    )
}

#[test]
fn the_learning_hybrid_policy_reproduces_its_run() {
    let cfg = (SCENARIOS[0].config)(Strategy::Hybrid, 600, 2);
    let (a, b) = twice(&cfg);
    // It did learn: faults were weighed and resolved.
    assert!(a.decisions.resumed_cheaper > 0);
    assert_eq!(a, b);
    // And the seed matters.
    let other = run(&SimConfig { seed: 3, ..cfg }, &mut |_, _| {}).unwrap();
    assert_ne!(a.latency, other.latency);
}

#[test]
fn open_loop_latency_runs_reproduce() {
    let load = saturation_gbps(DEMO_TRANSFERS, 1).unwrap();
    for cfg in latency_runs(load, 600, 2)
        .into_iter()
        .filter(|c| c.strategy == Strategy::Hybrid)
    {
        let (a, b) = twice(&cfg);
        assert!(!a.samples.is_empty());
        assert_eq!(a, b);
    }
}

#[test]
fn the_soak_reproduces_its_runs_and_its_link_errors() {
    let errors = LinkErrors {
        drop: 0.001,
        corrupt: 0.001,
        undetected: 0.0,
    };
    for c in soak::configurations(4_000, 4096, 0.01, 5) {
        let (a, ia) = soak::run(&c.cfg, &errors, &mut |_, _| {});
        let (b, ib) = soak::run(&c.cfg, &errors, &mut |_, _| {});
        let (a, b) = (a.unwrap(), b.unwrap());
        assert!(ia.dropped + ia.corrupted_blocks + ia.corrupted_messages > 0);
        assert_eq!(ia, ib, "{}", c.label);
        assert_eq!(a, b, "{}", c.label);
    }
}
