//! `nprdma doctor`: what the server-path library (libnprdma.so) is doing, in plain words.
//!
//! For this process it prints what a verbs application started now with the same environment
//! would get (mode, budget, why the library would step aside); for every running process that
//! has the library preloaded it prints the live counters from that process's status page
//! (docs/connectx.md, "nprdma doctor"). It also says which linux-glue backend (kernel module or
//! user space) this environment gets, and why (docs/linux-glue.md, "Choosing the backend").

use libnprdma::doctor::{self, Report, ReportMode, Survey};

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
        format!(
            "  fallback:   {} work requests served by pinning as plain verbs would ({} pinned now, outside the budget)",
            r.fallback_pins,
            mib(r.fallback_bytes)
        ),
    ];
    lines.push(format!(
        "  odp mode:   NPRDMA_MODE={}; {} MRs registered with on-demand paging ({})",
        r.reg_mode,
        r.odp_mrs,
        mib(r.odp_bytes)
    ));
    for d in &r.devices {
        lines.push(format!(
            "  device:     {}: {} (ODP capabilities general {:#x}, RC {:#x}; self-test {}): {}",
            d.name,
            if d.odp { "odp" } else { "windows" },
            d.odp_general_caps,
            d.odp_rc_caps,
            d.self_test.as_str(),
            d.reason
        ));
    }
    for m in &r.mrs {
        lines.push(format!(
            "  mr:         lkey {:#x} at {:#x}, {} bytes: {}",
            m.lkey,
            m.addr,
            m.len,
            m.mode.as_str()
        ));
    }
    if r.mrs_unlisted > 0 {
        lines.push(format!("  mr:         {} more not listed", r.mrs_unlisted));
    }
    for reason in &r.reasons {
        lines.push(format!("  note:       {reason}"));
    }
    lines
}

/// The lines about other processes' status files. With `clean`, the files of processes that
/// have exited are removed (a process that crashed leaves its file behind; one that exits
/// normally removes it); nothing else is touched.
pub fn describe_others(found: &Survey, clean: bool) -> Vec<String> {
    let mut lines = Vec::new();
    if found.reports.is_empty() {
        lines.push("no running process has libnprdma.so active".to_string());
    }
    let mut exited = 0;
    for (path, r) in &found.reports {
        let state = if r.alive { "running" } else { "exited" };
        lines.push(format!("process {} ({state}):", r.pid));
        lines.extend(describe(r));
        if r.alive {
            continue;
        }
        if !clean {
            exited += 1;
            continue;
        }
        match std::fs::remove_file(path) {
            Ok(()) => lines.push(format!("  removed:    {}", path.display())),
            Err(e) => lines.push(format!("  not removed: {}: {e}", path.display())),
        }
    }
    if exited > 0 {
        lines.push(format!(
            "{exited} status file(s) of exited processes: `nprdma doctor --clean` removes them"
        ));
    }
    for s in &found.skipped {
        lines.push(format!("skipped {}: {}", s.path.display(), s.why));
    }
    lines
}

/// The line about linux-glue's backend for `setting` (from `NPRDMA_BACKEND`): which one a
/// process started now would get, and why; the error when none (a bad setting, or the kernel
/// backend forced where the module is not usable).
#[cfg(target_os = "linux")]
pub fn describe_glue_backend<P: linux_glue::backend::KernelProbe>(
    setting: linux_glue::Result<linux_glue::backend::BackendSetting>,
    probe: &P,
) -> String {
    match setting.and_then(|s| linux_glue::backend::choose(s, probe)) {
        Ok(sel) => format!("linux-glue backend: {} ({})", sel.kind.as_str(), sel.reason),
        Err(e) => format!("linux-glue backend: none: {e}"),
    }
}

/// Prints the report.
pub fn run(clean: bool) {
    #[cfg(target_os = "linux")]
    println!(
        "{}",
        describe_glue_backend(
            linux_glue::backend::BackendSetting::from_env(),
            &linux_glue::backend::DeviceProbe::default()
        )
    );
    let me = doctor::current();
    println!("this environment (a verbs application started now with LD_PRELOAD=libnprdma.so):");
    for l in describe(&me) {
        println!("{l}");
    }
    for l in describe_others(&doctor::others(None), clean) {
        println!("{l}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn the_glue_backend_line_says_which_and_why() {
        use linux_glue::backend::{BackendSetting, DeviceProbe};
        let absent = DeviceProbe::at("/nonexistent/nprdma-glue");
        let auto = describe_glue_backend(Ok(BackendSetting::Auto), &absent);
        assert!(auto.starts_with("linux-glue backend: user ("), "{auto}");
        assert!(auto.contains("not loaded"), "{auto}");
        let forced = describe_glue_backend(Ok(BackendSetting::Kernel), &absent);
        assert!(forced.starts_with("linux-glue backend: none: "), "{forced}");
        assert!(forced.contains("not usable"), "{forced}");
        let user = describe_glue_backend(Ok(BackendSetting::User), &absent);
        assert!(user.contains("NPRDMA_BACKEND=user"), "{user}");
        let bad = describe_glue_backend(BackendSetting::parse("both"), &absent);
        assert!(bad.contains("\"both\" is not valid"), "{bad}");
    }

    #[test]
    fn exited_processes_are_named_and_removed_only_with_clean() {
        let dir = std::env::temp_dir().join(format!("nprdma-doctor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut exited = doctor::current();
        exited.pid = 4_000_001;
        exited.alive = false;
        let mut running = doctor::current();
        running.pid = 4_000_002;
        running.alive = true;
        let dead_file = dir.join("4000001.status");
        let live_file = dir.join("4000002.status");
        std::fs::write(&dead_file, b"x").unwrap();
        std::fs::write(&live_file, b"x").unwrap();
        let found = Survey {
            reports: vec![(dead_file.clone(), exited), (live_file.clone(), running)],
            skipped: vec![doctor::Skipped {
                path: dir.join("9.status"),
                why: "a status page of layout version 2".into(),
            }],
        };
        let text = describe_others(&found, false).join("\n");
        assert!(text.contains("process 4000001 (exited):"), "{text}");
        assert!(text.contains("process 4000002 (running):"), "{text}");
        assert!(
            text.contains("1 status file(s) of exited processes"),
            "{text}"
        );
        assert!(
            text.contains("9.status: a status page of layout version 2"),
            "{text}"
        );
        assert!(dead_file.exists());

        let text = describe_others(&found, true).join("\n");
        assert!(text.contains("removed:"), "{text}");
        assert!(!dead_file.exists());
        assert!(live_file.exists(), "a running process's file is kept");
        assert!(!text.contains("exited processes:"), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn describes_mode_budget_and_memory() {
        let mut r = doctor::current();
        r.mode = ReportMode::Unpinned;
        r.budget = 16 << 20;
        r.pinned_bytes = 4 << 20;
        r.pinned_peak = 8 << 20;
        r.registered_bytes = 1 << 30;
        r.reasons = vec!["dmabuf registration passed through".into()];
        r.reg_mode = "auto";
        r.devices = vec![libnprdma::status::DeviceReport {
            name: "rxe0".into(),
            odp: false,
            odp_general_caps: 1,
            odp_rc_caps: 0x3f,
            self_test: libnprdma::status::SelfTest::Failed,
            reason: "ODP self-test FAILED: WRITE: 3 of 9 bytes wrong".into(),
        }];
        r.mrs = vec![libnprdma::status::MrReport {
            addr: 0x1000,
            len: 4096,
            lkey: 0x17,
            mode: libnprdma::status::MrMode::PinnedFallback,
        }];
        r.mrs_unlisted = 2;
        let text = describe(&r).join("\n");
        assert!(text.contains("NPRDMA_MODE=auto"), "{text}");
        assert!(
            text.contains("rxe0: windows (ODP capabilities general 0x1, RC 0x3f; self-test failed): ODP self-test FAILED"),
            "{text}"
        );
        assert!(
            text.contains("lkey 0x17 at 0x1000, 4096 bytes: pinned-fallback"),
            "{text}"
        );
        assert!(text.contains("2 more not listed"), "{text}");
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
