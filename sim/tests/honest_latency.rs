//! Latency is measured from the moment the application meant to issue a transfer, so a run
//! that faults cannot look faster than one that does not: at the demo's offered loads (open
//! loop, the same arrivals for every strategy; below saturation and at saturation, defined
//! as the fault-free closed loop's throughput), no faulting strategy, pin-all and pre-fault
//! included, has a lower median than the fault-free run, for several seeds and the demo's
//! number of transfers; and each fault class is reported on its own.

use sim::vqfdb::scenarios::{
    DEMO_TRANSFERS, latency_loads, latency_runs, median_violations, run_parallel, saturation_gbps,
};
use sim::vqfdb::{FaultClass, RunReport, SimConfig, Strategy};

const SEEDS: [u64; 3] = [1, 2, 3];

fn run_all(cfgs: Vec<SimConfig>) -> Vec<RunReport> {
    let cfgs: Vec<SimConfig> = cfgs
        .into_iter()
        .map(|c| SimConfig {
            keep_samples: false,
            ..c
        })
        .collect();
    run_parallel(&cfgs, 2)
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
}

#[test]
fn no_strategy_has_a_lower_median_than_the_fault_free_run_at_or_below_saturation() {
    let saturation = saturation_gbps(DEMO_TRANSFERS, 1).unwrap();
    // Without faults nothing is random: saturation is one number for every seed.
    assert_eq!(saturation, saturation_gbps(DEMO_TRANSFERS, 2).unwrap());
    let mut cfgs = Vec::new();
    for seed in SEEDS {
        for (load, _) in latency_loads(saturation) {
            cfgs.extend(latency_runs(load, DEMO_TRANSFERS, seed));
        }
    }
    let per_table = 1 + Strategy::ALL.len();
    let reports = run_all(cfgs);
    for table in reports.chunks(per_table) {
        let (free, runs) = (&table[0], &table[1..]);
        assert_eq!(free.fault_rate, 0.0);
        assert_eq!(
            free.latency_by_class[FaultClass::None.index()].count,
            DEMO_TRANSFERS
        );
        let broken = median_violations(free, table);
        assert!(broken.is_empty(), "seed {}: {broken:?}", free.seed);
        for r in runs {
            let classes: u64 = r.latency_by_class.iter().map(|p| p.count).sum();
            assert_eq!(classes, DEMO_TRANSFERS, "every transfer has one class");
            let faulted = r.latency_by_class[1..].iter().map(|p| p.count).sum::<u64>();
            if r.strategy == Strategy::PinAll.name() {
                assert_eq!(faulted, 0, "pin-all never faults");
            } else {
                assert!(faulted > 0, "{}: some transfers faulted", r.strategy);
            }
        }
    }
}

#[test]
fn above_saturation_faults_only_reorder_who_waits_but_the_mean_still_pays() {
    // At 12% above saturation every run is overloaded: the nodes are busy whatever the
    // strategy, so a re-sent block costs the others no capacity, only their place in the
    // queue; the median may then fall (seen for seeds 2 and 3) while the tail rises. The
    // mean cannot fall: the faults' time is spent, not moved. That is why the demo does not
    // measure above saturation (docs/virtual-qfdb.md, "Reading the demo table").
    let load = 1.12 * saturation_gbps(DEMO_TRANSFERS, 1).unwrap();
    let mut cfgs = Vec::new();
    for seed in SEEDS {
        cfgs.extend(latency_runs(load, DEMO_TRANSFERS, seed));
    }
    let reports = run_all(cfgs);
    for table in reports.chunks(1 + Strategy::ALL.len()) {
        let free = &table[0];
        for r in &table[1..] {
            assert!(
                r.latency.mean >= free.latency.mean,
                "seed {} {}: mean {} < fault-free {}",
                r.seed,
                r.strategy,
                r.latency.mean,
                free.latency.mean
            );
        }
    }
}

#[test]
fn time_queued_in_the_application_counts_in_the_latency() {
    // Far above what the nodes can carry: transfers queue in the application, and that
    // wait is part of their latency (the closed loop's post-to-completion times would not
    // show it).
    let at = |load| latency_runs(load, 240, 1).swap_remove(0);
    let r = run_all(vec![at(1000.0), at(60.0)]);
    assert!(
        r[0].latency.p50 > 2.0 * r[1].latency.p50,
        "{} vs {}",
        r[0].latency.p50,
        r[1].latency.p50
    );
    assert_eq!(r[0].transfers, 240);
}
