//! `nprdma demo`: every strategy on the default workload, a fault-rate sweep, table, JSON,
//! plots.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Instant;

use indicatif::MultiProgress;
use serde_json::json;
use sim::vqfdb::{RunReport, SimConfig, SimError, Strategy, scenarios};

use crate::{CliError, DemoArgs, output, plot};

/// Fault rates of the sweep, and the fault rate of the main table.
pub use sim::vqfdb::scenarios::{MAIN_RATE, SWEEP};

/// The demo workload (`sim::vqfdb::scenarios::demo`): one QFDB, all-to-all RDMA writes of
/// 64 KiB from unpinned buffers, the memory limit at 25% of the buffer footprint.
pub fn workload(strategy: Strategy, fault_rate: f64, transfers: u64, seed: u64) -> SimConfig {
    scenarios::demo(strategy, fault_rate, transfers, seed)
}

use scenarios::{CONTENDERS, Verdict};

/// One line of the verdict: stall-only, retransmit-only and hybrid throughput; which won and
/// by how much hybrid is above (or below) the better of the other two.
fn verdict(v: &Verdict) -> String {
    let (best_other, other) = v.best_other();
    let winner = if v.hybrid > best_other {
        "hybrid".to_string()
    } else if v.hybrid == best_other {
        format!("hybrid = {other}")
    } else {
        other.to_string()
    };
    format!(
        "{:<16} {:>10.2} {:>10.2} {:>10.2}  {winner:<26} {:>+7.2}%{}",
        v.case,
        v.stall,
        v.retransmit,
        v.hybrid,
        v.margin_percent(),
        if v.hybrid_lost() { "  HYBRID LOST" } else { "" }
    )
}

fn verdict_header(first: &str) -> String {
    format!(
        "{first:<16} {:>10} {:>10} {:>10}  {:<26} {:>8}",
        "stall-only", "retransmit", "hybrid", "won", "hybrid vs best other"
    )
}

struct Job {
    label: String,
    cfg: SimConfig,
}

/// Runs `jobs` on `threads` threads with a progress bar each; results in job order.
fn run_all(jobs: Vec<Job>, threads: usize) -> Vec<Result<RunReport, SimError>> {
    let multi = MultiProgress::new();
    let count = jobs.len();
    let queue = Mutex::new(jobs.into_iter().enumerate().collect::<VecDeque<_>>());
    let results: Mutex<Vec<Option<Result<RunReport, SimError>>>> =
        Mutex::new((0..count).map(|_| None).collect());
    std::thread::scope(|s| {
        // No more threads than runs: each thread takes runs until none is left.
        for _ in 0..threads.clamp(1, count.max(1)) {
            s.spawn(|| {
                loop {
                    let next = queue.lock().map(|mut q| q.pop_front()).unwrap_or(None);
                    let Some((index, job)) = next else {
                        break;
                    };
                    let bar = output::multi_bar(&multi, &job.label, job.cfg.transfers);
                    let result = sim::vqfdb::run(&job.cfg, &mut |done, total| {
                        bar.set_length(total);
                        bar.set_position(done);
                    });
                    bar.finish();
                    if let Ok(mut r) = results.lock()
                        && let Some(slot) = r.get_mut(index)
                    {
                        *slot = Some(result);
                    }
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_default()
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(SimError::Internal("a run did not report".into()))))
        .collect()
}

/// The demo.
pub fn run(args: &DemoArgs) -> Result<(), CliError> {
    let wall = Instant::now();
    let threads = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    // Main table: the fault-free reference, then every strategy at 1%.
    let mut jobs = vec![Job {
        label: "fault-free (hybrid, 0%)".into(),
        cfg: workload(Strategy::Hybrid, 0.0, args.transfers, args.seed),
    }];
    for s in Strategy::ALL {
        jobs.push(Job {
            label: format!("{} @ {:.0}%", s.name(), MAIN_RATE * 100.0),
            cfg: workload(s, MAIN_RATE, args.transfers, args.seed),
        });
    }
    let main_count = jobs.len();
    // Sweep: the strategies that fault, at each rate except the main one (reused) and 0.
    let sweep_strategies = [
        Strategy::PreFault,
        Strategy::StallOnly,
        Strategy::RetransmitOnly,
        Strategy::Hybrid,
    ];
    for &rate in SWEEP.iter().filter(|&&r| r != 0.0) {
        for s in sweep_strategies {
            jobs.push(Job {
                label: format!("sweep {} @ {:.1}%", s.name(), rate * 100.0),
                cfg: workload(s, rate, args.sweep_transfers, args.seed),
            });
        }
    }
    let sweep_count = jobs.len() - main_count;
    for sc in scenarios::SCENARIOS {
        for s in CONTENDERS {
            jobs.push(Job {
                label: format!("{} {}", sc.name, s.name()),
                cfg: (sc.config)(s, args.sweep_transfers, args.seed),
            });
        }
    }
    let per_load = 1 + Strategy::ALL.len();
    println!(
        "nprdma demo: {} runs on the virtual QFDB (4 nodes, all-to-all 64 KiB RDMA writes, \
         unpinned buffers, memory limit 25% of the footprint), {} threads; then {} latency runs \
         at offered loads set by the fault-free run's throughput",
        jobs.len(),
        threads,
        per_load * 2
    );
    let results = run_all(jobs, threads);
    // Any failure fails the demo, loudly.
    let mut reports = Vec::with_capacity(results.len());
    for r in results {
        reports.push(r?);
    }
    let (main, rest) = reports.split_at(main_count);
    let (sweep, scenario_runs) = rest.split_at(sweep_count);
    let baseline = main.first().map(|r| r.throughput_gbps);
    // Latency: open loop at saturation, defined as the fault-free closed loop's throughput
    // just measured (`scenarios::saturation_gbps`), and below it; the fault-free run and
    // every strategy at the main rate.
    let saturation = baseline.unwrap_or(0.0);
    let loads = scenarios::latency_loads(saturation);
    let mut latency_jobs = Vec::new();
    for (load, what) in loads {
        for cfg in scenarios::latency_runs(load, args.transfers, args.seed) {
            let name = if cfg.fault_rate == 0.0 {
                "fault-free"
            } else {
                cfg.strategy.name()
            };
            latency_jobs.push(Job {
                label: format!("{name} @ {load:.0} Gb/s {what}"),
                cfg,
            });
        }
    }
    let latency_runs = run_all(latency_jobs, threads)
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    println!();
    println!(
        "Results at a {:.0}% faulting-page rate (times and throughput are MODEL time):",
        MAIN_RATE * 100.0
    );
    let refs: Vec<&RunReport> = main.iter().collect();
    print!("{}", output::table_with(&refs, baseline, false));
    println!(
        "(\"% free\" = throughput relative to the fault-free run; \"stall µs\" = total time \
         faulting accesses were held by the SMMU; \"HOL µs\" = of that, time the destination \
         write engine was held, delaying every block behind it; \"retrans\" = blocks sent again)"
    );
    if let (Some(b), Some(h)) = (
        baseline,
        main.iter()
            .find(|r| r.strategy == "hybrid" && r.fault_rate > 0.0),
    ) {
        println!(
            "hybrid keeps {:.1}% of fault-free throughput: it resumed {} stalled faults \
             ({:.1} model µs of stalls, {:.1} of them holding the destination write engine) and \
             re-sent {} blocks for the {} faults it terminated ({} of them major)",
            100.0 * h.throughput_gbps / b,
            h.resumed,
            h.stall_time.as_us(),
            h.write_stall_time.as_us(),
            h.retransmissions,
            h.terminations,
            h.major_faults
        );
    }

    // Sweep table: throughput per strategy and rate (pin-all does not fault: flat).
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let pin = main.iter().find(|r| r.strategy == "pin-all");
    if let Some(pin) = pin {
        series.push((
            "pin-all".into(),
            SWEEP
                .iter()
                .map(|&x| (x * 100.0, pin.throughput_gbps))
                .collect(),
        ));
    }
    for s in sweep_strategies {
        let mut points = Vec::new();
        for &rate in &SWEEP {
            let r = if rate == 0.0 {
                main.first()
            } else if rate == MAIN_RATE {
                main.iter()
                    .find(|r| r.strategy == s.name() && r.fault_rate == rate)
            } else {
                sweep
                    .iter()
                    .find(|r| r.strategy == s.name() && r.fault_rate == rate)
            };
            if let Some(r) = r {
                points.push((rate * 100.0, r.throughput_gbps));
            }
        }
        series.push((s.name().into(), points));
    }
    println!();
    println!("Throughput (Gb/s, model time) vs faulting-page rate:");
    print!("{:<16}", "strategy");
    for rate in SWEEP {
        print!(" {:>8}", format!("{:.1}%", rate * 100.0));
    }
    println!();
    for (name, points) in &series {
        print!("{name:<16}");
        for (_, y) in points {
            print!(" {y:>8.2}");
        }
        println!();
    }

    // The verdict: hybrid against the better of stall-only and retransmit-only.
    let gbps = |name: &str, rate: f64| {
        series
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, p)| p.iter().find(|(x, _)| *x == rate * 100.0))
            .map_or(0.0, |(_, y)| *y)
    };
    println!();
    println!("Hybrid against the better of stall-only and retransmit-only (Gb/s, model time):");
    println!("{}", verdict_header("faulting pages"));
    let mut verdicts = Vec::new();
    let mut lost = Vec::new();
    for &rate in SWEEP.iter().filter(|&&r| r > 0.0) {
        let v = Verdict {
            case: format!("{:.1}%", rate * 100.0),
            stall: gbps("stall-only", rate),
            retransmit: gbps("retransmit-only", rate),
            hybrid: gbps("hybrid", rate),
        };
        println!("{}", verdict(&v));
        verdicts.push(json!({"case": format!("sweep {:.1}%", rate * 100.0),
            "stall_only_gbps": v.stall, "retransmit_only_gbps": v.retransmit,
            "hybrid_gbps": v.hybrid, "hybrid_margin_percent": v.margin_percent(),
            "hybrid_lost": v.hybrid_lost()}));
        if v.hybrid_lost() {
            lost.push(format!("sweep {}", v.case));
        }
    }
    for (i, sc) in scenarios::SCENARIOS.iter().enumerate() {
        let runs = &scenario_runs[i * CONTENDERS.len()..(i + 1) * CONTENDERS.len()];
        let v = Verdict::of(sc.name, runs);
        println!("{}", verdict(&v));
        verdicts.push(json!({"case": sc.name, "what": sc.what,
            "stall_only_gbps": v.stall, "retransmit_only_gbps": v.retransmit,
            "hybrid_gbps": v.hybrid, "hybrid_margin_percent": v.margin_percent(),
            "hybrid_lost": v.hybrid_lost()}));
        if v.hybrid_lost() {
            lost.push(v.case.clone());
        }
    }
    println!("scenarios (2% faulting pages):");
    for sc in scenarios::SCENARIOS {
        println!("  {:<14} {}", sc.name, sc.what);
    }
    println!("the hybrid policy's decisions:");
    let hybrid_main = main
        .iter()
        .find(|r| r.strategy == "hybrid" && r.fault_rate > 0.0);
    if let Some(r) = hybrid_main {
        println!(
            "  {:<14} {}",
            format!("{:.0}%", MAIN_RATE * 100.0),
            output::decisions(r)
        );
    }
    for (i, sc) in scenarios::SCENARIOS.iter().enumerate() {
        if let Some(r) = scenario_runs.get(i * CONTENDERS.len() + 2) {
            println!("  {:<14} {}", sc.name, output::decisions(r));
        }
    }

    // Latency, open loop, from the intended issue time.
    let mut median_violations = Vec::new();
    let mut cdfs: Vec<plot::Cdf<'_>> = Vec::new();
    println!();
    println!(
        "saturation: {saturation:.2} Gb/s, the fault-free closed loop's throughput above (every \
         pair's window always full); the latency runs offer {:.0}% of it and all of it",
        scenarios::BELOW_SATURATION * 100.0
    );
    for (i, (load, what)) in loads.iter().enumerate() {
        let runs = &latency_runs[i * per_load..(i + 1) * per_load];
        println!();
        println!(
            "Latency at an offered load of {load:.1} Gb/s ({what}; open loop, Poisson arrivals, \
             the same for every strategy), {:.0}% faulting pages; p50/p99/p99.9 in model µs \
             from the moment the application meant to issue the transfer (transfers):",
            MAIN_RATE * 100.0
        );
        let refs: Vec<&RunReport> = runs.iter().collect();
        print!("{}", output::latency_table(&refs));
        if let Some(free) = runs.first() {
            median_violations.extend(scenarios::median_violations(free, runs));
        }
        let stem = if i == 0 {
            "latency_cdf_below_saturation"
        } else {
            "latency_cdf_at_saturation"
        };
        cdfs.push((
            stem,
            format!(
                "Latency CDF, {load:.1} Gb/s offered ({what}), {:.0}% faulting pages",
                MAIN_RATE * 100.0
            ),
            runs.iter()
                .filter(|r| r.strategy != "pin-all")
                .map(|r| {
                    let name = if r.fault_rate == 0.0 {
                        "fault-free".to_string()
                    } else {
                        r.strategy.clone()
                    };
                    (name, r.samples.as_slice())
                })
                .collect(),
        ));
    }
    if median_violations.is_empty() {
        println!(
            "no faulting strategy has a lower median latency than the fault-free run at the same offered load"
        );
    } else {
        println!("MEDIAN BELOW FAULT-FREE: {}", median_violations.join("; "));
    }

    // Files.
    std::fs::create_dir_all(&args.out)
        .map_err(|e| CliError::Output(format!("cannot create {}: {e}", args.out.display())))?;
    let files = plot::draw_all(&args.out, &cdfs, &series)?;
    let wall_s = wall.elapsed().as_secs_f64();
    let json = json!({
        "time_unit": "model µs (simulated time) unless a key says wall",
        "wall_time_s": wall_s,
        "workload": {
            "nodes": 4, "pattern": "all-to-all", "transfer_bytes": 64 * 1024,
            "memory_limit": "25% of the buffer footprint per node", "seed": args.seed,
            "main_fault_rate": MAIN_RATE, "transfers_per_main_run": args.transfers,
            "transfers_per_sweep_run": args.sweep_transfers
        },
        "fault_free_throughput_gbps_model": baseline,
        "saturation_gbps_model": saturation,
        "latency_offered_loads_gbps": loads.iter().map(|(l, w)| json!({"load": l, "what": w})).collect::<Vec<_>>(),
        "median_below_fault_free": median_violations,
        "runs": main.iter().map(output::report_json).collect::<Vec<_>>(),
        "sweep": sweep.iter().map(output::report_json).collect::<Vec<_>>(),
        "scenarios": scenario_runs.iter().map(output::report_json).collect::<Vec<_>>(),
        "latency_open_loop": latency_runs.iter().map(output::report_json).collect::<Vec<_>>(),
        "hybrid_verdict": verdicts,
        "throughput_vs_fault_rate": series.iter().map(|(n, p)| json!({"strategy": n, "points_percent_gbps": p})).collect::<Vec<_>>(),
    });
    let json_path = args.out.join("demo.json");
    output::write_json(&json_path, &json)?;
    println!();
    println!("wrote {}", json_path.display());
    for f in files {
        println!("wrote {}", f.display());
    }
    let verified: u64 = reports
        .iter()
        .chain(&latency_runs)
        .map(|r| r.transfers)
        .sum();
    println!(
        "verified: {verified} transfers in {} runs, every byte checked; none lost, duplicated or reordered",
        reports.len() + latency_runs.len()
    );
    println!("wall time: {wall_s:.1} s (host, not model time)");
    // What the demo claims, it checks: a loss of the hybrid policy or a faulting median below
    // the fault-free one fails it (after everything was printed and written).
    let mut broken = Vec::new();
    if !lost.is_empty() {
        broken.push(format!("HYBRID LOST in {}", lost.join(", ")));
    }
    if !median_violations.is_empty() {
        broken.push(format!(
            "MEDIAN BELOW FAULT-FREE: {}",
            median_violations.join("; ")
        ));
    }
    if broken.is_empty() {
        Ok(())
    } else {
        Err(CliError::Claim(broken.join("; ")))
    }
}
