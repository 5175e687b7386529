//! `cargo xtask test`: everything CI checks, in one command.
//!
//! Order: set-up (Debian packages), formatting, the layering rule (crates, and no import cycle
//! between connectx's modules), clippy, host tests, NPE's RTL (lint and synthesis, `cargo
//! xtask synth`), a small run of the main job (`nprdma demo`), cross builds of the `no_std`
//! crates, the board image builder's checks, every firmware program on QEMU, then the server
//! path on Soft-RoCE (`rxe-test`). Every step runs even if an
//! earlier one failed, so one CI run reports all problems; the command fails if any step failed.

use std::process::Command;
use std::time::Instant;

use crate::util::{XtaskError, run_status, section, workspace_root};
use crate::{firmware, setup};

/// Crates that must build for `aarch64-unknown-none` (they run on the boards).
pub const NO_STD_CRATES: &[&str] = &[
    "hal",
    "smmu-driver",
    "protocol",
    "dma-engine",
    "boards",
    "fpga-bitstreams",
];

fn host_cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root());
    cmd
}

pub fn run_all(skip_setup: bool) -> Result<(), XtaskError> {
    let started = Instant::now();
    if !skip_setup {
        section("setup: Debian packages");
        setup::ensure_packages(setup::ALL_PACKAGES)?;
    }
    let mut failed: Vec<String> = Vec::new();
    // Yosys is single-threaded and takes minutes: it runs beside every other step and is
    // collected at the end.
    section("NPE RTL: verilator lint, then yosys synth_xilinx started in the background");
    let synth = crate::synth::start();
    let mut step = |name: &str, result: Result<(), XtaskError>| {
        if let Err(e) = result {
            eprintln!("xtask: step `{name}` failed: {e}");
            failed.push(name.to_string());
        }
    };

    section("cargo fmt --check");
    step(
        "fmt",
        run_status(
            "cargo fmt",
            host_cargo().args(["fmt", "--all", "--", "--check"]),
        ),
    );

    section("layering (docs/architecture.md)");
    step(
        "layering",
        crate::layers::check().and_then(|problems| {
            if problems.is_empty() {
                Ok(())
            } else {
                Err(XtaskError::Checks(problems))
            }
        }),
    );
    let modules_started = Instant::now();
    step(
        "module cycles",
        crate::modcycles::check().and_then(|(problems, modules, edges)| {
            println!(
                "xtask: {} ({modules} modules, {edges} imports): no import cycle: {} ({:.2} s)",
                crate::modcycles::CHECKED.join(", "),
                problems.is_empty(),
                modules_started.elapsed().as_secs_f64()
            );
            if problems.is_empty() {
                Ok(())
            } else {
                Err(XtaskError::Checks(problems))
            }
        }),
    );

    section("cargo clippy (all targets, warnings are errors)");
    step(
        "clippy",
        run_status(
            "cargo clippy",
            host_cargo().args([
                "clippy",
                "--workspace",
                "--all-targets",
                "--quiet",
                "--",
                "-D",
                "warnings",
            ]),
        ),
    );

    section("host tests");
    // The RTL-vs-model differential test at the size issue #29 asks for (10^4 transfers,
    // about a minute); a plain `cargo test` runs 2,000.
    step(
        "test",
        run_status(
            "cargo test",
            host_cargo()
                .args(["test", "--workspace"])
                .env("NPE_DIFF_TRANSFERS", "10000"),
        ),
    );

    // The demo as a newcomer runs it (release, its default size): it fails if the hybrid
    // policy loses or a faulting median falls below the fault-free one.
    section("main job: nprdma demo on the virtual QFDB (release, as shipped; every byte verified)");
    let demo_started = Instant::now();
    step(
        "demo",
        run_status(
            "nprdma demo",
            host_cargo()
                .args(["run", "--release", "--quiet", "-p", "nprdma", "--", "demo"])
                .args(["--out", "target/nprdma-demo-ci"]),
        ),
    );
    println!(
        "xtask: demo took {:.0} s",
        demo_started.elapsed().as_secs_f64()
    );

    section("soak: nprdma soak, 10^5 transfers per configuration (release; nothing lost)");
    step(
        "soak",
        run_status(
            "nprdma soak",
            host_cargo()
                .args(["run", "--release", "--quiet", "-p", "nprdma", "--", "soak"])
                .args(["--transfers", "100000"]),
        ),
    );

    section(&format!(
        "no_std crates for aarch64-unknown-none: {}",
        NO_STD_CRATES.join(", ")
    ));
    let mut args = Vec::new();
    for c in NO_STD_CRATES {
        args.extend(["-p", c]);
    }
    step("cross-build", firmware::cross_build(&args, false));

    section("board image builder: a bitstream-shaped test file through cargo xtask image");
    step("image-check", crate::image::self_check());

    failed.extend(
        firmware::test_all()
            .into_iter()
            .map(|f| format!("firmware {f}")),
    );

    section("libnprdma.so on Soft-RoCE (cargo xtask rxe-test)");
    if let Err(e) = crate::rxe::run(&crate::rxe::Options::default()) {
        eprintln!("xtask: step `rxe-test` failed: {e}");
        failed.push("rxe-test".into());
    }

    section("nprdma.ko in Debian guests, x86_64 and arm64 + SMMUv3 (cargo xtask kernel-test)");
    if let Err(e) = crate::kernel_test::run(&crate::kernel_test::Options::default()) {
        eprintln!("xtask: step `kernel-test` failed: {e}");
        failed.push("kernel-test".into());
    }

    section("NPE RTL: yosys synth_xilinx for the xczu9eg (cargo xtask synth), collected");
    let waited = Instant::now();
    match synth.and_then(crate::synth::Running::finish) {
        Ok(()) => {}
        Err(e) => {
            eprintln!("xtask: step `synth` failed: {e}");
            failed.push("synth".into());
        }
    }
    println!(
        "xtask: synth was waited for {:.1} s after the last other step",
        waited.elapsed().as_secs_f64()
    );

    let secs = started.elapsed().as_secs();
    if failed.is_empty() {
        println!("\nxtask test: all steps passed in {secs} s");
        Ok(())
    } else {
        Err(XtaskError::Checks(failed))
    }
}
