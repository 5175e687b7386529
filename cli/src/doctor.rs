//! `nprdma doctor`: what the server-path library (libnprdma.so) is doing, in plain words.
//!
//! For this process it prints what a verbs application started now with the same environment
//! would get (mode, budget, why the library would step aside); for every running process that
//! has the library preloaded it prints the live counters from that process's status page
//! (docs/connectx.md, "nprdma doctor").

use libnprdma::doctor::{self, Report, ReportMode};

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn mode(m: ReportMode) -> &'static str {
    match m {
        ReportMode::Unpinned => {
            "unpinned (registrations are virtual; windows are pinned on demand)"
        }
        ReportMode::Off => "off (pass-through: every call goes to libibverbs and pins as usual)",
        ReportMode::Unknown => "unknown (the status page holds a mode this nprdma does not know)",
    }
}

/// The lines describing one report.
pub fn describe(r: &Report) -> Vec<String> {
    let mut lines = vec![
        format!("  mode:       {}", mode(r.mode)),
        format!(
            "  budget:     {} pinned at most, windows of {}",
            mib(r.budget),
            mib(r.window)
        ),
        format!(
            "  memory:     {} registered unpinned, {} pinned now (peak {}), {} registered in pass-through",
            mib(r.registered_bytes),
            mib(r.pinned_bytes),
            mib(r.pinned_peak),
            mib(r.passthrough_bytes)
        ),
        format!(
            "  activity:   {} regions, {} windows now, {} window registrations, {} evictions, {} work requests translated",
            r.regions, r.windows, r.window_registrations, r.evictions, r.work_requests
        ),
        format!(
            "  peers:      {} leases granted, {} remote window requests, {} errors synthesized",
            r.leases_granted, r.remote_requests, r.synthesized_errors
        ),
    ];
    for reason in &r.reasons {
        lines.push(format!("  note:       {reason}"));
    }
    lines
}

/// Prints the report.
pub fn run() {
    let me = doctor::current();
    println!("this environment (a verbs application started now with LD_PRELOAD=libnprdma.so):");
    for l in describe(&me) {
        println!("{l}");
    }
    let others = doctor::others(None);
    if others.is_empty() {
        println!("no running process has libnprdma.so active");
    }
    for r in others {
        let state = if r.alive { "running" } else { "exited" };
        println!("process {} ({state}):", r.pid);
        for l in describe(&r) {
            println!("{l}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_mode_budget_and_memory() {
        let mut r = doctor::current();
        r.mode = ReportMode::Unpinned;
        r.budget = 16 << 20;
        r.pinned_bytes = 4 << 20;
        r.pinned_peak = 8 << 20;
        r.registered_bytes = 1 << 30;
        r.reasons = vec!["dmabuf registration passed through".into()];
        let text = describe(&r).join("\n");
        assert!(text.contains("mode:       unpinned"), "{text}");
        assert!(text.contains("16.0 MiB pinned at most"), "{text}");
        assert!(
            text.contains("1024.0 MiB registered unpinned, 4.0 MiB pinned now (peak 8.0 MiB)"),
            "{text}"
        );
        assert!(
            text.contains("note:       dmabuf registration passed through"),
            "{text}"
        );
    }
}
