//! Latency is measured from the moment the application meant to issue a transfer, so a run
//! that faults cannot look faster than one that does not: at the same offered load (open loop,
//! the same arrivals for every strategy), no faulting strategy has a lower median than the
//! fault-free run; and each fault class is reported on its own.

use sim::vqfdb::scenarios::{LATENCY_LOADS_GBPS, demo};
use sim::vqfdb::{FaultClass, SimConfig, Strategy, run};

fn at(strategy: Strategy, rate: f64, load: f64) -> SimConfig {
    SimConfig {
        offered_load_gbps: Some(load),
        keep_samples: false,
        ..demo(strategy, rate, 240, 1)
    }
}

#[test]
fn no_faulting_strategy_has_a_lower_median_than_the_fault_free_run() {
    for (load, _) in LATENCY_LOADS_GBPS {
        let free = run(&at(Strategy::Hybrid, 0.0, load), &mut |_, _| {}).unwrap();
        assert_eq!(free.latency_by_class[FaultClass::None.index()].count, 240);
        for strategy in [
            Strategy::StallOnly,
            Strategy::RetransmitOnly,
            Strategy::Hybrid,
        ] {
            let r = run(&at(strategy, 0.05, load), &mut |_, _| {}).unwrap();
            assert!(
                r.latency.p50 >= free.latency.p50,
                "{} at {load} Gb/s: p50 {} < fault-free {}",
                strategy.name(),
                r.latency.p50,
                free.latency.p50
            );
            let classes: u64 = r.latency_by_class.iter().map(|p| p.count).sum();
            assert_eq!(classes, 240, "every transfer has one class");
            let faulted = r.latency_by_class[1..].iter().map(|p| p.count).sum::<u64>();
            assert!(faulted > 0, "{}: some transfers faulted", strategy.name());
        }
    }
}

#[test]
fn time_queued_in_the_application_counts_in_the_latency() {
    // Far above what the nodes can carry: transfers queue in the application, and that
    // wait is part of their latency (the closed loop's post-to-completion times would not
    // show it).
    let r = run(&at(Strategy::Hybrid, 0.0, 1000.0), &mut |_, _| {}).unwrap();
    let slow = run(&at(Strategy::Hybrid, 0.0, 60.0), &mut |_, _| {}).unwrap();
    assert!(
        r.latency.p50 > 2.0 * slow.latency.p50,
        "{} vs {}",
        r.latency.p50,
        slow.latency.p50
    );
    assert_eq!(r.transfers, 240);
}
