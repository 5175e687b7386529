//! The hybrid policy decides per fault: where a minor fault is cheap to stall and a major one
//! (a slow swap read) dear, it stalls some faults and re-sends others in the same run.

use sim::des::ModelTime;
use sim::vqfdb::scenarios::SCENARIOS;
use sim::vqfdb::{SimConfig, Strategy, run};

/// The demo's incast scenario (long links, one transfer in flight per pair: a re-send costs
/// two crossings of a 10 µs link) with the default, slow swap device (about 50 µs a read)
/// and reclaim writing pages to swap after 50 µs, so that a share of the faults are major.
fn incast_slow_swap(seed: u64) -> SimConfig {
    let incast = SCENARIOS.iter().find(|s| s.name == "incast").unwrap();
    let mut cfg = (incast.config)(Strategy::Hybrid, 600, seed);
    cfg.swap = Default::default();
    cfg.swap.writeback_after = ModelTime::from_ns(50_000);
    cfg
}

#[test]
fn cheap_write_faults_are_stalled_and_dear_ones_resent_in_the_same_run() {
    for seed in [1, 2] {
        let r = run(&incast_slow_swap(seed), &mut |_, _| {}).unwrap();
        let d = r.decisions;
        assert!(r.major_faults > 0 && r.minor_faults > 0, "{r:?}");
        // Both streams are on stall-mode contexts, so every fault was weighed.
        assert_eq!(d.terminated_not_stalled, 0, "{d:?}");
        // The cost comparison: a minor fault (4.6 µs) holding little costs less than a
        // re-send crossing the 10 µs link twice; a major one (about 55 µs), or one held
        // while the write engine has work waiting, more. Both are taken in the same run.
        assert!(d.resumed_cheaper > 0, "seed {seed}: {d:?}");
        assert!(d.terminated_dearer > 0, "seed {seed}: {d:?}");
        assert_eq!(
            d.resumed_cheaper + d.terminated_dearer + d.terminated_not_stalled,
            r.minor_faults + r.major_faults,
            "seed {seed}: {d:?}"
        );
        assert!(r.retransmissions > 0);
    }
}
