//! Tables, progress bars and JSON.

use std::fmt::Write as _;
use std::path::Path;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use sim::vqfdb::RunReport;

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
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:>9} {:>7} {:>9} {:>9} {:>7} {:>7} {:>8} {:>7} {:>7} {:>10} {:>10} {:>9} {:>9}",
        "strategy",
        "Gb/s",
        "% free",
        "p50 µs",
        "p99 µs",
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
        "{:<16} {:>9} {:>7} {:>9} {:>9} {:>7} {:>7} {:>8} {:>7} {:>7} {:>10} {:>10} {:>9} {:>9}",
        "",
        "model",
        "",
        "model",
        "model",
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
            "{:<16} {:>9.2} {:>7} {:>9.1} {:>9.1} {:>7} {:>7} {:>8} {:>7} {:>7} {:>10.1} {:>10.1} {:>9.2} {:>9.1}",
            name,
            r.throughput_gbps,
            pct,
            r.latency.p50,
            r.latency.p99,
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
        "bytes": r.bytes,
        "model_duration_us": r.duration.as_us(),
        "model_setup_us": r.setup.as_us(),
        "throughput_gbps_model": r.throughput_gbps,
        "latency_model_us": {
            "p50": r.latency.p50, "p90": r.latency.p90, "p99": r.latency.p99,
            "max": r.latency.max, "mean": r.latency.mean
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
