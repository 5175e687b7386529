//! `cargo xtask`: the project's automation.
//!
//! - `setup`: installs the Debian packages the project needs (idempotent, quiet when done).
//! - `firmware NAME`: cross-builds a bare-metal program for `aarch64-unknown-none` with
//!   Debian's rustc-web and `-Zbuild-std`.
//! - `qemu NAME`: builds it and runs it on QEMU: `virt` with an SMMUv3 and the `edu` device,
//!   or `xlnx-zcu102` for the ZynqMP program; the firmware's verdict line becomes the exit
//!   status.
//! - `decode`: prints a console capture (a board's UART log) with the firmware's defmt frame
//!   lines decoded by the program's ELF.
//! - `rxe-test`: the server path (libnprdma.so) on Soft-RoCE in a Debian guest under
//!   `qemu-system-x86_64`: unmodified perftest, the stress program, with/without ratios.
//! - `kernel-test`: the kernel module nprdma.ko (linux-glue/kernel), built against Debian's
//!   headers and exercised by `linux-glue-kmod-test` in a Debian guest under
//!   `qemu-system-x86_64`.
//! - `image BOARD`: the SD-card boot directory (BOOT.BIN via bootgen, overlay, firmware
//!   ELFs, manifest; the Vivado Tcl) from the user's bitstream and Xilinx boot files.
//! - `test`: everything CI checks.
//! - `list`: the firmware programs and what each is expected to do.
//!
//! Errors are one line naming what is missing and how to get it; the exit status is 1 for a
//! failure and 2 for a usage error.

mod firmware;
mod guest;
mod image;
mod kernel_test;
mod kernel_test_arm64;
mod layers;
mod modcycles;
mod rxe;
mod rxe_clients;
mod rxe_odp;
mod setup;
mod synth;
mod test;
mod util;

use std::process::ExitCode;

use util::XtaskError;

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  setup                       install the Debian packages the project needs (idempotent)
  firmware <name> [--release] cross-build a bare-metal program for aarch64-unknown-none
  qemu <name> [--release] [--timeout <seconds>]
                              build a program and run it on qemu-system-aarch64 (virt + SMMUv3 +
                              edu; xlnx-zcu102 for the zynqmp-* program)
  decode (<name> [--release] | --elf <path>) [<capture file>]
                              print a console capture (stdin if no file) with its defmt frame
                              lines (NPRDMA-DEFMT: ...) decoded by the program's ELF, which must
                              be the one that ran (default: the last `cargo xtask firmware` build)
  rxe-test [--iters <n>] [--cmp-iters <n>] [--stress-ops <n>] [--rounds <n>] [--bw-rounds <n>]
           [--smp <n>] [--compare-only] [--clients-only] [--ctl-only] [--clients-full] [--client <name>] [--no-pin] [--cmp-flags <perftest flags>]
           [--candidate <libnprdma.so>] [--boots <n>] [--odp-anchor | --odp-only]
                              libnprdma.so on Soft-RoCE in a Debian guest (qemu-system-x86_64):
                              unmodified perftest, the stress program, with/without ratios
                              (--compare-only: just the alternating with/without comparison;
                              --clients-only: just every perftest benchmark and rdma-core
                              example without the library, with it and with NPRDMA=off;
                              --ctl-only: just the control-connection rendezvous checks;
                              --clients-full: those with every perftest size, -a, up to 8 MiB;
                              --client <name>: only that client case (write_bw_rc), or one
                              mode of it (write_bw_rc_lib);
                              --candidate: also a second build of the library, in the same
                              rounds, compared run by run with this one;
                              --boots: boot n times and pool the latency ratios;
                              --odp-anchor: also boot Debian's trixie-backports kernel and
                              measure pinned registration, ODP and the library side by side;
                              --odp-only: only that boot)
  kernel-test [--arch x86_64|arm64|all] [--soak <transfers>] [--timeout <seconds>]
                              build nprdma.ko against Debian's headers and test it in Debian
                              guests (qemu-system-x86_64, -smp 2): handshake, registration
                              without pinning, frames vs pagemap, invalidations, bad input,
                              teardown, rmmod; arm64 (qemu-system-aarch64 virt + SMMUv3 + edu):
                              edu DMA in an IOMMU domain with IOVA = VA, the scratch page and
                              re-sends, a swap soak (default 100000 transfers); fails on any
                              WARNING/BUG/Oops or SMMU event in a guest log (default: all)
  image <board> [--bitstream <.bit>] [--fsbl <elf>] [--pmufw <elf>] [--atf <elf>]
        [--uboot <elf>] [--out <dir>]
                              a directory for the SD card's boot partition (zcu102): BOOT.BIN
                              made by bootgen, the NPE overlay, the firmware ELFs, the manifest,
                              the Vivado Tcl; says exactly what is missing. Without --atf and
                              --uboot, BOOT.BIN boots the bare-metal zynqmp-smmu-faults program
  image-check                 the image builder's own checks on a bitstream-shaped test file
                              (part of `test`)
  synth                       NPE's RTL (fpga-bitstreams/rtl): verilator --lint-only -Wall, then
                              yosys synth_xilinx -family xcup; prints LUT/FF/BRAM/DSP use against
                              the xczu9eg and fails on latches, loops, undriven nets, over budget
  test [--skip-setup]         everything CI checks: fmt, the layering rule (crates, and no
                              import cycle between connectx's modules), clippy, host tests, a
                              small nprdma demo, no_std cross builds, every firmware test on
                              QEMU, rxe-test, kernel-test
  list                        list the firmware programs and what each is expected to do
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(XtaskError::Usage(msg)) => {
            eprintln!("error: {msg}\n\n{USAGE}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<(), XtaskError> {
    let (cmd, rest) = match args.split_first() {
        Some((c, r)) => (c.as_str(), r),
        None => return Err(XtaskError::Usage("no command given".into())),
    };
    let mut opts = util::Options::parse(rest)?;
    match cmd {
        "setup" => {
            opts.finish()?;
            setup::ensure_packages(setup::ALL_PACKAGES)
        }
        "synth" => {
            opts.finish()?;
            synth::run()
        }
        "firmware" => {
            let name = opts.positional("program name")?;
            let release = opts.flag("--release");
            opts.finish()?;
            let program = firmware::find(&name)?;
            let elf = firmware::build(program, release)?;
            println!("{}", elf.display());
            Ok(())
        }
        "qemu" => {
            // Options with values first: their values are not the program's name.
            let timeout = opts.value_u64("--timeout")?;
            let release = opts.flag("--release");
            let name = opts.positional("program name")?;
            opts.finish()?;
            let program = firmware::find(&name)?;
            let outcome = firmware::build_and_run(program, release, timeout)?;
            outcome.into_result()
        }
        "decode" => {
            let elf = opts.value_str("--elf")?;
            let release = opts.flag("--release");
            let elf = match elf {
                Some(path) => std::path::PathBuf::from(path),
                None => {
                    let name = opts.positional("program name (or --elf <path>)")?;
                    firmware::elf_path(firmware::find(&name)?, release)
                }
            };
            let capture = opts.positional("capture file").ok();
            opts.finish()?;
            match capture {
                Some(path) => {
                    let file = std::fs::File::open(&path).map_err(|e| {
                        XtaskError::Other(format!("cannot read the capture {path}: {e}"))
                    })?;
                    firmware::decode(&elf, file)
                }
                None => firmware::decode(&elf, std::io::stdin().lock()),
            }
        }
        "rxe-test" => {
            let mut o = rxe::Options::default();
            if let Some(n) = opts.value_u64("--iters")? {
                o.iters = n;
            }
            if let Some(n) = opts.value_u64("--cmp-iters")? {
                o.cmp_iters = n;
            }
            if let Some(n) = opts.value_u64("--stress-ops")? {
                o.stress_ops = n;
            }
            if let Some(n) = opts.value_u64("--rounds")? {
                o.rounds = n.max(1);
            }
            if let Some(n) = opts.value_u64("--bw-rounds")? {
                o.bw_rounds = n;
            }
            if let Some(n) = opts.value_u64("--smp")? {
                o.smp = n.clamp(1, 64);
            }
            o.compare_only = opts.flag("--compare-only");
            o.clients_only = opts.flag("--clients-only");
            o.ctl_only = opts.flag("--ctl-only");
            o.clients_full = opts.flag("--clients-full");
            o.client = opts.value_str("--client")?;
            if opts.flag("--no-pin") {
                o.pin = false;
            }
            if let Some(f) = opts.value_str("--cmp-flags")? {
                o.cmp_flags = f;
            }
            o.candidate = opts.value_str("--candidate")?.map(std::path::PathBuf::from);
            if let Some(n) = opts.value_u64("--boots")? {
                o.boots = n.clamp(1, 50);
            }
            o.odp_anchor = opts.flag("--odp-anchor");
            o.odp_only = opts.flag("--odp-only");
            opts.finish()?;
            o.validate()?;
            rxe::run(&o)
        }
        "kernel-test" => {
            let mut o = kernel_test::Options::default();
            if let Some(s) = opts.value_u64("--timeout")? {
                o.timeout = Some(std::time::Duration::from_secs(s.max(1)));
            }
            if let Some(a) = opts.value_str("--arch")? {
                o.arches = kernel_test::Arch::parse(&a).ok_or_else(|| {
                    XtaskError::Usage(format!("--arch {a}: x86_64, arm64 or all"))
                })?;
            }
            if let Some(n) = opts.value_u64("--soak")? {
                o.soak = n;
            }
            opts.finish()?;
            kernel_test::run(&o)
        }
        "image" => {
            let mut inputs = image::Inputs::default();
            let path = |v: Option<String>| v.map(std::path::PathBuf::from);
            inputs.bitstream = path(opts.value_str("--bitstream")?);
            inputs.fsbl = path(opts.value_str("--fsbl")?);
            inputs.pmufw = path(opts.value_str("--pmufw")?);
            inputs.atf = path(opts.value_str("--atf")?);
            inputs.uboot = path(opts.value_str("--uboot")?);
            inputs.out = path(opts.value_str("--out")?);
            let board = opts.positional("board name")?;
            opts.finish()?;
            let report = image::build(&board, &inputs)?;
            image::print(&report);
            Ok(())
        }
        "image-check" => {
            opts.finish()?;
            image::self_check()
        }
        "test" => {
            let skip_setup = opts.flag("--skip-setup");
            opts.finish()?;
            test::run_all(skip_setup)
        }
        "list" => {
            opts.finish()?;
            for p in firmware::PROGRAMS {
                println!(
                    "{:<22} {:<8} {}",
                    p.name,
                    p.machine.name(),
                    p.describe_expectation()
                );
            }
            Ok(())
        }
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(())
        }
        other => Err(XtaskError::Usage(format!("unknown command `{other}`"))),
    }
}
