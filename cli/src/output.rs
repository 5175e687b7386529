//! Tables, progress bars and JSON.

use std::fmt::Write as _;
use std::path::Path;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use sim::vqfdb::{FaultClass, Percentiles, RunReport};

use crate::CliError;

const MIB: f64 = 1024.0 * 1024.0;

fn style() -> ProgressStyle {
    ProgressStyle::with_template("{prefix:>28} [{bar:30}] {pos:>7}/{len:7} transfers")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

/// A progress bar for one run (hidden when stderr is not a terminal).
pub fn progress_bar(label: &str, total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total).with_style(style());
    bar.set_prefix(label.to_string());
    bar
}

/// A bar that belongs to `multi`.
pub fn multi_bar(multi: &MultiProgress, label: &str, total: u64) -> ProgressBar {
    multi.add(progress_bar(label, total))
}

/// The results table. `baseline` (fault-free throughput) adds a "% of fault-free" column.
pub fn table(reports: &[&RunReport], baseline: Option<f64>) -> String {
    table_with(reports, baseline, true)
}

/// [`table`], with or without the latency columns.
pub fn table_with(reports: &[&RunReport], baseline: Option<f64>, latency: bool) -> String {
    let mut out = String::new();
    let lat = |a: &str, b: &str, c: &str| {
        if latency {
            format!(" {a:>9} {b:>9} {c:>9}")
        } else {
            String::new()
        }
    };
    let _ = writeln!(
        out,
        "{:<16} {:>9} {:>7}{} {:>7} {:>7} {:>8} {:>7} {:>7} {:>10} {:>10} {:>9} {:>9}",
        "strategy",
        "Gb/s",
        "% free",
        lat("p50 µs", "p99 µs", "p99.9 µs"),
        "minor",
        "major",
        "retrans",
        "NACKs",
        "stalls",
        "stall µs",
        "HOL µs",
        "res. MiB",
        "setup µs"
    );
    let _ = writeln!(
        out,
        "{:<16} {:>9} {:>7}{} {:>7} {:>7} {:>8} {:>7} {:>7} {:>10} {:>10} {:>9} {:>9}",
        "",
        "model",
        "",
        lat("model", "model", "model"),
        "faults",
        "faults",
        "blocks",
        "",
        "",
        "model",
        "model",
        "peak",
        "model"
    );
    for r in reports {
        let pct = baseline.filter(|b| *b > 0.0).map_or("-".to_string(), |b| {
            format!("{:.1}", 100.0 * r.throughput_gbps / b)
        });
        let name = if r.fault_rate == 0.0 && r.strategy == "hybrid" && baseline.is_some() {
            "fault-free".to_string()
        } else {
            r.strategy.clone()
        };
        let _ = writeln!(
            out,
            "{:<16} {:>9.2} {:>7}{} {:>7} {:>7} {:>8} {:>7} {:>7} {:>10.1} {:>10.1} {:>9.2} {:>9.1}",
            name,
            r.throughput_gbps,
            pct,
            lat(
                &format!("{:.1}", r.latency.p50),
                &format!("{:.1}", r.latency.p99),
                &format!("{:.1}", r.latency.p999)
            ),
            r.minor_faults,
            r.major_faults,
            r.retransmissions,
            r.nacks,
            r.stalls,
            r.stall_time.as_us(),
            r.write_stall_time.as_us(),
            r.resident_peak as f64 / MIB,
            r.setup.as_us()
        );
    }
    out
}

/// The latency table of open-loop runs: overall and per fault class, p50/p99/p99.9 (model
/// µs from the intended issue time); `-` where a class has no transfer.
pub fn latency_table(reports: &[&RunReport]) -> String {
    let mut out = String::new();
    let _ = write!(out, "{:<16} {:>20}", "strategy", "all");
    for c in FaultClass::ALL {
        let _ = write!(out, " {:>24}", c.name());
    }
    let _ = writeln!(out);
    let cell = |p: &Percentiles| {
        if p.count == 0 {
            "-".to_string()
        } else {
            format!("{:.0}/{:.0}/{:.0} ({})", p.p50, p.p99, p.p999, p.count)
        }
    };
    for r in reports {
        let name = if r.fault_rate == 0.0 {
            "fault-free".to_string()
        } else {
            r.strategy.clone()
        };
        let all = format!(
            "{:.1}/{:.0}/{:.0}",
            r.latency.p50, r.latency.p99, r.latency.p999
        );
        let _ = write!(out, "{name:<16} {all:>20}");
        for p in &r.latency_by_class {
            let _ = write!(out, " {:>24}", cell(p));
        }
        let _ = writeln!(out);
    }
    out
}

/// Latency per fault class, one line per class that has transfers.
pub fn latency_classes(r: &RunReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  {:<10} {:>9} {:>9} {:>9} {:>9}   (model µs from the intended issue time)",
        "class", "transfers", "p50", "p99", "p99.9"
    );
    for (class, p) in FaultClass::ALL.iter().zip(&r.latency_by_class) {
        if p.count > 0 {
            let _ = writeln!(
                out,
                "  {:<10} {:>9} {:>9.1} {:>9.1} {:>9.1}",
                class.name(),
                p.count,
                p.p50,
                p.p99,
                p.p999
            );
        }
    }
    out
}

/// The cost-based policy's decisions with their reasons (empty for the fixed rules).
pub fn decisions(r: &RunReport) -> String {
    let d = &r.decisions;
    format!(
        "policy: read streams stalling on {} nodes, write streams on {}; resumed {} (page already present) + {} (stall cheaper than a re-send); terminated {} (re-send cheaper), {} (over the stall budget), {} (not stalled: terminate-mode context); aborted {}",
        r.stalling_streams[0],
        r.stalling_streams[1],
        d.resumed_present,
        d.resumed_cheaper,
        d.terminated_dearer,
        d.terminated_budget,
        d.terminated_not_stalled,
        d.aborted
    )
}

fn percentiles_json(p: &Percentiles) -> Value {
    json!({"transfers": p.count, "p50": p.p50, "p90": p.p90, "p99": p.p99, "p999": p.p999,
           "max": p.max, "mean": p.mean})
}

/// A few lines of detail for one run.
pub fn details(r: &RunReport) -> String {
    format!(
        "{} nodes, {} workload, fault-rate knob {:.3}, measured {:.4} faults per SMMU translation ({} translations)\n\
         model duration {:.1} model µs for {} transfers ({:.1} MiB); stalls {}, terminations {}, source faults re-issued {}, RESOLVED notices {}\n\
         memory: limit at most {:.2} MiB per node ({:.2} MiB in all), footprint {:.2} MiB in all, {} pages written to swap; {} events simulated",
        r.nodes,
        r.workload,
        r.fault_rate,
        r.measured_fault_rate,
        r.translations,
        r.duration.as_us(),
        r.transfers,
        r.bytes as f64 / MIB,
        r.stalls,
        r.terminations,
        r.source_faults,
        r.resolved_notices,
        r.memory_limit as f64 / MIB,
        r.memory_limit_total as f64 / MIB,
        r.footprint as f64 / MIB,
        r.swap_outs,
        r.events
    )
}

/// One run as JSON (model time unless a key says otherwise).
pub fn report_json(r: &RunReport) -> Value {
    json!({
        "strategy": r.strategy,
        "workload": r.workload,
        "nodes": r.nodes,
        "seed": r.seed,
        "fault_rate_knob": r.fault_rate,
        "measured_fault_rate": r.measured_fault_rate,
        "transfers": r.transfers,
        "checked": {"lost": r.integrity.lost, "duplicated": r.integrity.duplicated,
                    "reordered": r.integrity.reordered, "corrupted": r.integrity.corrupted},
        "bytes": r.bytes,
        "model_duration_us": r.duration.as_us(),
        "model_setup_us": r.setup.as_us(),
        "throughput_gbps_model": r.throughput_gbps,
        "offered_load_gbps": r.offered_load_gbps,
        "latency_from": "the intended issue time (open-loop arrival, or the moment the closed loop's window slot freed)",
        "latency_model_us": percentiles_json(&r.latency),
        "latency_by_fault_class_model_us": FaultClass::ALL.iter().zip(&r.latency_by_class)
            .map(|(c, p)| (c.name().to_string(), percentiles_json(p)))
            .collect::<serde_json::Map<_, _>>(),
        "policy": {
            "streams_stalling": {"read": r.stalling_streams[0], "write": r.stalling_streams[1]},
            "resumed": {"page_present": r.decisions.resumed_present,
                        "stall_cheaper_than_resend": r.decisions.resumed_cheaper},
            "terminated": {"resend_cheaper_than_stall": r.decisions.terminated_dearer,
                           "over_stall_budget": r.decisions.terminated_budget,
                           "not_stalled_terminate_mode_context": r.decisions.terminated_not_stalled},
            "aborted": r.decisions.aborted
        },
        "faults": {
            "minor": r.minor_faults, "major": r.major_faults, "spurious": r.spurious_faults,
            "cpu": r.cpu_faults, "stalls": r.stalls, "resumed": r.resumed,
            "terminations": r.terminations,
            "smmu_translations": r.translations
        },
        "retransmissions": r.retransmissions,
        "nacks": r.nacks,
        "resolved_notices": r.resolved_notices,
        "source_faults_reissued": r.source_faults,
        "stall_time_model_us": r.stall_time.as_us(),
        "write_engine_stall_model_us": r.write_stall_time.as_us(),
        "resident_peak_bytes": r.resident_peak,
        "footprint_bytes": r.footprint,
        "memory_limit_largest_node_bytes": r.memory_limit,
        "memory_limit_total_bytes": r.memory_limit_total,
        "swap_outs": r.swap_outs,
        "dropped_duplicate_or_unknown_messages": r.dropped_messages,
        "events": r.events,
        "rx_held": r.rx_held,
        "crc_drops": r.crc_drops,
        "back_pressure_refusals": r.back_pressure,
        "verified": true
    })
}

/// Writes `value` pretty-printed to `path`, creating directories.
pub fn write_json(path: &Path, value: &Value) -> Result<(), CliError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| CliError::Output(format!("cannot create {}: {e}", dir.display())))?;
    }
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| CliError::Output(format!("cannot encode JSON: {e}")))?;
    std::fs::write(path, text)
        .map_err(|e| CliError::Output(format!("cannot write {}: {e}", path.display())))
}
