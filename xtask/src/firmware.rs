//! Bare-metal programs: the registry, the cross build, and the QEMU runner.
//!
//! The verdict protocol (see the `firmware` crate): a program prints exactly one line
//! `NPRDMA-VERDICT: PASS <summary>` or `NPRDMA-VERDICT: FAIL <reason>` and powers off through
//! PSCI, which ends QEMU with status 0. A run passes only if the PASS line was seen and QEMU
//! exited 0 in time; a FAIL line, no line, a non-zero exit or a timeout is a failure.
//!
//! Programs for a board QEMU cannot model (ZynqMP: QEMU has no MMU-500) are `BuildOnly`:
//! `cargo xtask test` builds them, `cargo xtask qemu` refuses them in one line.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::util::{XtaskError, require_tool, run_status, workspace_root};

/// The machine a program is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Machine {
    /// QEMU `virt` with an SMMUv3 and the `edu` device: runs here.
    Virt,
    /// A Zynq UltraScale+ board (ZCU102, QFDB) at EL3 after the FSBL: built here, run on the
    /// board (docs/mmu500.md). QEMU's `xlnx-zcu102` has no MMU-500 model.
    ZynqMp,
}

impl Machine {
    pub fn name(self) -> &'static str {
        match self {
            Machine::Virt => "virt",
            Machine::ZynqMp => "zynqmp",
        }
    }

    /// Whether `cargo xtask qemu` can run programs for this machine.
    pub fn runs_on_qemu(self) -> bool {
        match self {
            Machine::Virt => true,
            Machine::ZynqMp => false,
        }
    }
}

/// What a program is expected to do when run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Print a PASS verdict.
    Pass,
    /// Take an exception on purpose: the runtime must print the syndrome and a FAIL verdict.
    /// Proves that `cargo xtask qemu` turns a crashing firmware into a failure.
    Exception,
    /// Must build; it runs only on its board, so nothing here checks its verdict.
    BuildOnly,
}

/// A firmware program.
pub struct Program {
    /// Binary name in the `firmware` crate.
    pub name: &'static str,
    pub machine: Machine,
    pub expect: Expect,
    /// Wall-clock limit for one QEMU run.
    pub timeout: Duration,
    /// Extra QEMU arguments for this program.
    pub qemu_args: &'static [&'static str],
    /// For [`Expect::Exception`]: what the reported fault must be, beyond being reported
    /// (given the console output).
    pub fault_check: Option<FaultCheck>,
}

/// Checks a program's console output for the exception it must report.
pub type FaultCheck = fn(&str) -> Result<(), String>;

impl Program {
    pub fn describe_expectation(&self) -> &'static str {
        match self.expect {
            Expect::Pass => "runs on QEMU, must pass",
            Expect::Exception => "runs on QEMU, must fault and report the exception syndrome",
            Expect::BuildOnly => "built only: runs on a ZynqMP board (docs/mmu500.md)",
        }
    }
}

/// Every program, and what `cargo xtask test` expects of it.
pub const PROGRAMS: &[Program] = &[
    Program {
        name: "pci-probe",
        machine: Machine::Virt,
        expect: Expect::Pass,
        timeout: Duration::from_secs(60),
        qemu_args: &[],
        fault_check: None,
    },
    Program {
        name: "fault-probe",
        machine: Machine::Virt,
        expect: Expect::Exception,
        timeout: Duration::from_secs(60),
        qemu_args: &[],
        fault_check: None,
    },
    Program {
        name: "stack-overflow",
        machine: Machine::Virt,
        expect: Expect::Exception,
        timeout: Duration::from_secs(60),
        qemu_args: &[],
        fault_check: Some(guard_page_fault),
    },
    Program {
        name: "smmuv3-faults",
        machine: Machine::Virt,
        expect: Expect::Pass,
        timeout: Duration::from_secs(180),
        // edu's DMA takes 100 ms of virtual time; with icount and sleep=off QEMU jumps the
        // virtual clock to the next timer while the CPU waits in `wfi` instead of sleeping
        // (QEMU docs, `-icount`). shift=0: one instruction = 1 ns of virtual time.
        qemu_args: &["-icount", "shift=0,sleep=off"],
        fault_check: None,
    },
    Program {
        name: "zynqmp-smmu-faults",
        machine: Machine::ZynqMp,
        expect: Expect::BuildOnly,
        // Not run here; the board run takes well under a second.
        timeout: Duration::from_secs(60),
        qemu_args: &[],
        fault_check: None,
    },
];

/// `stack-overflow`'s fault must be a data abort in the guard page: the 4 KiB below the
/// program stack's bottom, which the program prints before it recurses. Any other exception
/// (the recursion running into `.bss` and faulting elsewhere) means the guard is gone.
fn guard_page_fault(output: &str) -> Result<(), String> {
    let hex_after = |marker: &str| {
        let rest = &output[output.rfind(marker)? + marker.len()..];
        let digits: String = rest
            .trim_start_matches("0x")
            .chars()
            .take_while(char::is_ascii_hexdigit)
            .collect();
        u64::from_str_radix(&digits, 16).ok()
    };
    let bottom = hex_after("program stack's bottom ")
        .ok_or("no stack bottom printed before the recursion")?;
    let far = hex_after("FAR ").ok_or("no FAR in the exception report")?;
    if !output.contains("data abort") {
        return Err(format!("not a data abort (FAR {far:#x})"));
    }
    if !(bottom.saturating_sub(4096)..bottom).contains(&far) {
        return Err(format!(
            "the fault at {far:#x} is not in the guard page below {bottom:#x}"
        ));
    }
    Ok(())
}

/// Looks a program up by name.
pub fn find(name: &str) -> Result<&'static Program, XtaskError> {
    PROGRAMS.iter().find(|p| p.name == name).ok_or_else(|| {
        let names: Vec<&str> = PROGRAMS.iter().map(|p| p.name).collect();
        XtaskError::Other(format!(
            "no firmware program `{name}` (known: {})",
            names.join(", ")
        ))
    })
}

const CROSS_TARGET: &str = "aarch64-unknown-none";
/// rustc-web's compiler; rustup's proxies stay first on PATH, so call it by full path.
const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
const DEBIAN_CARGO: &str = "/usr/bin/cargo";
/// Edition 2024 and let-chains need at least this.
const MIN_CROSS_RUSTC: (u32, u32) = (1, 88);

/// Checks the cross toolchain and returns the environment-ready `cargo` command.
pub fn cross_cargo() -> Result<Command, XtaskError> {
    require_tool(DEBIAN_RUSTC, "rustc-web")?;
    require_tool(DEBIAN_CARGO, "cargo-web")?;
    require_tool("ld.lld", "lld")?;
    let version = Command::new(DEBIAN_RUSTC)
        .arg("--version")
        .output()
        .map_err(|error| XtaskError::Spawn {
            what: DEBIAN_RUSTC.into(),
            error,
        })?;
    let version = String::from_utf8_lossy(&version.stdout).to_string();
    let mut parts = version
        .split_whitespace()
        .nth(1)
        .unwrap_or("0.0")
        .split('.');
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    if (major, minor) < MIN_CROSS_RUSTC {
        return Err(XtaskError::MissingTool {
            tool: format!(
                "{DEBIAN_RUSTC} >= {}.{} (found {})",
                MIN_CROSS_RUSTC.0,
                MIN_CROSS_RUSTC.1,
                version.trim()
            ),
            package: "rustc-web",
        });
    }
    let sysroot = Command::new(DEBIAN_RUSTC)
        .args(["--print", "sysroot"])
        .output()
        .map_err(|error| XtaskError::Spawn {
            what: DEBIAN_RUSTC.into(),
            error,
        })?;
    let src = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim())
        .join("lib/rustlib/src/rust/library/core");
    if !src.is_dir() {
        return Err(XtaskError::MissingTool {
            tool: src.display().to_string(),
            package: "rust-web-src",
        });
    }

    let mut cmd = Command::new(DEBIAN_CARGO);
    cmd.current_dir(workspace_root())
        .env("RUSTC_BOOTSTRAP", "1")
        .env("RUSTC", DEBIAN_RUSTC)
        // A separate target directory: the host toolchain is a different rustc, and sharing one
        // directory would make each toolchain rebuild the other's artifacts.
        .env("CARGO_TARGET_DIR", cross_target_dir())
        // Log levels compiled into firmware (defmt filters at build time).
        .env("DEFMT_LOG", "info")
        // Set by the rustup cargo that runs xtask; they would point Debian's cargo at rustup's.
        .env_remove("CARGO")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER");
    Ok(cmd)
}

fn cross_target_dir() -> PathBuf {
    workspace_root().join("target").join("cross")
}

/// `cargo build` for aarch64-unknown-none with `-Zbuild-std` of the given package arguments.
pub fn cross_build(package_args: &[&str], release: bool) -> Result<(), XtaskError> {
    let mut cmd = cross_cargo()?;
    cmd.args([
        "build",
        "--quiet",
        "-Zbuild-std=core,alloc",
        "--target",
        CROSS_TARGET,
    ])
    .args(package_args);
    if release {
        cmd.arg("--release");
    }
    run_status(
        &format!("cross build ({})", package_args.join(" ")),
        &mut cmd,
    )
}

/// Builds one program; returns the ELF's path.
pub fn build(program: &Program, release: bool) -> Result<PathBuf, XtaskError> {
    cross_build(&["-p", "firmware", "--bin", program.name], release)?;
    let profile = if release { "release" } else { "debug" };
    let elf = cross_target_dir()
        .join(CROSS_TARGET)
        .join(profile)
        .join(program.name);
    if elf.is_file() {
        Ok(elf)
    } else {
        Err(XtaskError::Other(format!(
            "the build succeeded but {} is missing",
            elf.display()
        )))
    }
}

/// How a QEMU run ended.
#[derive(Debug)]
pub enum Outcome {
    /// PASS verdict and a clean power-off.
    Passed { name: String, summary: String },
    /// Anything else.
    Failed {
        name: String,
        reason: String,
        output: String,
    },
}

impl Outcome {
    pub fn into_result(self) -> Result<(), XtaskError> {
        match self {
            Outcome::Passed { name, summary } => {
                println!("xtask: `{name}` passed: {summary}");
                Ok(())
            }
            Outcome::Failed { name, reason, .. } => {
                Err(XtaskError::FirmwareFailed { name, reason })
            }
        }
    }
}

/// The verdict line prefix the firmware prints.
pub const VERDICT_PREFIX: &str = "NPRDMA-VERDICT: ";

/// The QEMU command line for `virt` (docs/toolchains.md; QEMU `hw/arm/virt.c` `create_smmu`
/// and `create_pcie`): SMMUv3 in front of the PCIe root complex, GICv3, an AArch64 CPU, the `edu`
/// device at slot 2 (stream ID 0x10), nothing else.
fn qemu_command(elf: &std::path::Path, extra: &[&str]) -> Result<Command, XtaskError> {
    let qemu = require_tool("qemu-system-aarch64", "qemu-system-arm")?;
    let mut cmd = Command::new(qemu);
    cmd.args([
        "-M",
        "virt,iommu=smmuv3,gic-version=3",
        "-cpu",
        "cortex-a57",
        "-m",
        "256M",
    ])
    .args([
        "-nographic",
        "-nodefaults",
        "-serial",
        "stdio",
        "-device",
        "edu,addr=2",
    ])
    .args(extra)
    .arg("-kernel")
    .arg(elf);
    Ok(cmd)
}

/// The one line `cargo xtask qemu` answers for a program QEMU cannot run.
fn needs_board(program: &Program) -> String {
    format!(
        "`{}` needs a ZynqMP board, not QEMU (QEMU has no MMU-500 model): build it with \
         `cargo xtask firmware {}` and boot it as docs/mmu500.md describes",
        program.name, program.name
    )
}

/// Builds and runs a program; returns how it ended (an `Err` only when it could not run).
pub fn build_and_run(
    program: &Program,
    release: bool,
    timeout_s: Option<u64>,
) -> Result<Outcome, XtaskError> {
    if !program.machine.runs_on_qemu() {
        return Err(XtaskError::Other(needs_board(program)));
    }
    let elf = build(program, release)?;
    let timeout = timeout_s
        .map(Duration::from_secs)
        .unwrap_or(program.timeout);
    run_qemu(program, &elf, timeout)
}

fn run_qemu(
    program: &Program,
    elf: &std::path::Path,
    timeout: Duration,
) -> Result<Outcome, XtaskError> {
    let name = program.name;
    let mut child = qemu_command(elf, program.qemu_args)?
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| XtaskError::Spawn {
            what: "qemu-system-aarch64".into(),
            error,
        })?;

    // Stream the console as it comes (decoding defmt frames), and keep a copy to find the
    // verdict.
    let defmt = DefmtLines::load(elf);
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut defmt = defmt;
        if let Some(out) = stdout {
            for line in crate::util::lossy_lines(out) {
                let shown = defmt.render(&line).unwrap_or_else(|| line.clone());
                println!("  | {shown}");
                if tx.send(shown).is_err() {
                    break;
                }
            }
        }
    });
    let mut stderr = child.stderr.take();
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = stderr.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });

    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if start.elapsed() >= timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(error) => {
                return Err(XtaskError::Spawn {
                    what: "qemu-system-aarch64 (wait)".into(),
                    error,
                });
            }
        }
    };
    let _ = reader.join();
    let stderr_text = err_reader.join().unwrap_or_default();
    let lines: Vec<String> = rx.try_iter().collect();
    let output = lines.join("\n");
    let verdicts: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.trim_end().strip_prefix(VERDICT_PREFIX))
        .collect();

    let name = name.to_string();
    let fail = |reason: String| {
        Ok(Outcome::Failed {
            name: name.clone(),
            reason,
            output: output.clone(),
        })
    };
    let Some(status) = status else {
        return fail(format!("timed out after {} s", timeout.as_secs()));
    };
    if !stderr_text.trim().is_empty() {
        eprintln!("qemu stderr:\n{}", stderr_text.trim_end());
    }
    match verdicts.as_slice() {
        [] => fail(format!("no verdict line; QEMU exited with {status}")),
        [one] => {
            if let Some(reason) = one.strip_prefix("FAIL") {
                fail(format!("FAIL{reason}"))
            } else if let Some(summary) = one.strip_prefix("PASS") {
                if status.success() {
                    Ok(Outcome::Passed {
                        name: name.clone(),
                        summary: summary.trim().to_string(),
                    })
                } else {
                    fail(format!("PASS printed but QEMU exited with {status}"))
                }
            } else {
                fail(format!("malformed verdict `{one}`"))
            }
        }
        many => fail(format!(
            "{} verdict lines (exactly one expected)",
            many.len()
        )),
    }
}

/// Prefix of a console line that carries one defmt frame in hex (see `firmware::logger`).
const DEFMT_PREFIX: &str = "NPRDMA-DEFMT: ";

/// Decodes the firmware's defmt frame lines with the format strings in its ELF.
struct DefmtLines {
    table: Option<defmt_decoder::Table>,
    elf: String,
}

impl DefmtLines {
    fn load(elf: &std::path::Path) -> Self {
        let table = std::fs::read(elf)
            .ok()
            .and_then(|bytes| defmt_decoder::Table::parse(&bytes).ok().flatten());
        Self {
            table,
            elf: elf.display().to_string(),
        }
    }

    /// The text to show for a defmt line; `None` for ordinary lines.
    fn render(&mut self, line: &str) -> Option<String> {
        let hex = line.trim_end().strip_prefix(DEFMT_PREFIX)?;
        let Some(table) = &self.table else {
            return Some(format!(
                "[defmt frame, no format table in {}] {hex}",
                self.elf
            ));
        };
        let bytes: Option<Vec<u8>> = (0..hex.len())
            .step_by(2)
            .map(|i| {
                hex.get(i..i + 2)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
            })
            .collect();
        let Some(bytes) = bytes else {
            return Some(format!("[malformed defmt line] {hex}"));
        };
        let mut decoder = table.new_stream_decoder();
        decoder.received(&bytes);
        let mut out = Vec::new();
        loop {
            match decoder.decode() {
                Ok(frame) => out.push(frame.display(false).to_string()),
                Err(defmt_decoder::DecodeError::UnexpectedEof) => break,
                Err(defmt_decoder::DecodeError::Malformed) => {
                    out.push(format!("[undecodable defmt frame] {hex}"));
                    break;
                }
            }
        }
        Some(out.join(" | "))
    }
}

/// Runs every program as `cargo xtask test` expects; returns the names that did not behave.
pub fn test_all() -> Vec<String> {
    check_programs(
        PROGRAMS,
        |p| build(p, false),
        |p| build_and_run(p, false, None),
    )
}

/// [`test_all`] over the given programs, builder and runner (tests pass their own).
fn check_programs(
    programs: &[Program],
    mut build: impl FnMut(&Program) -> Result<PathBuf, XtaskError>,
    mut build_and_run: impl FnMut(&Program) -> Result<Outcome, XtaskError>,
) -> Vec<String> {
    let mut failed = Vec::new();
    for program in programs {
        crate::util::section(&format!(
            "firmware {} ({})",
            program.name,
            program.describe_expectation()
        ));
        match program.expect {
            Expect::BuildOnly => match build(program) {
                Ok(elf) => println!(
                    "xtask: `{}` built ({}); not run: it needs its board",
                    program.name,
                    elf.display()
                ),
                Err(e) => failed.push(format!("{}: build failed: {e}", program.name)),
            },
            // A program that does not build or cannot be started fails alone: the others
            // still run, so one broken program does not hide the state of the rest.
            Expect::Pass => match build_and_run(program) {
                Ok(Outcome::Passed { summary, .. }) => {
                    println!("xtask: `{}` passed: {summary}", program.name)
                }
                Ok(Outcome::Failed { reason, .. }) => {
                    failed.push(format!("{}: {reason}", program.name))
                }
                Err(e) => failed.push(format!("{}: {e}", program.name)),
            },
            Expect::Exception => match build_and_run(program) {
                Err(e) => failed.push(format!("{}: {e}", program.name)),
                Ok(Outcome::Passed { .. }) => failed.push(format!(
                    "{}: passed but was expected to fault",
                    program.name
                )),
                Ok(Outcome::Failed { reason, output, .. }) => {
                    // The runtime must have reported the syndrome, not just died.
                    let reported =
                        output.contains("ESR") && output.contains("ELR") && output.contains("FAR");
                    let checked = program.fault_check.map_or(Ok(()), |check| check(&output));
                    if reason.starts_with("FAIL") && reported && checked.is_ok() {
                        println!(
                            "xtask: `{}` faulted as expected and reported the syndrome",
                            program.name
                        );
                    } else if let Err(why) = checked {
                        failed.push(format!("{}: {why}", program.name));
                    } else {
                        failed.push(format!(
                            "{}: expected a reported exception, got: {reason}",
                            program.name
                        ));
                    }
                }
            },
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stack_overflow_fault_must_be_in_the_guard_page() {
        let said = |far: &str| {
            format!(
                "stack-overflow: recursing below the program stack's bottom 0x4024d000; expect\n\
                 FAIL synchronous exception: data abort from the same EL (EC 0x25): translation \
                 fault, level 3, write, ESR 0x96000047, ELR 0x4020119c, FAR {far}"
            )
        };
        assert_eq!(guard_page_fault(&said("0x4024cf70")), Ok(()));
        assert!(
            guard_page_fault(&said("0x4024d000")).is_err(),
            "the stack itself"
        );
        assert!(guard_page_fault(&said("0x40243000")).is_err(), "in .bss");
        let undefined =
            "program stack's bottom 0x4024d000;\nundefined instruction, FAR 0x0 (not valid)";
        assert!(guard_page_fault(undefined).is_err());
    }

    #[test]
    fn every_program_has_a_binary_and_a_machine_its_name_matches() {
        let bins = workspace_root().join("firmware/src/bin");
        for p in PROGRAMS {
            assert!(
                bins.join(format!("{}.rs", p.name)).is_file(),
                "{} has no firmware/src/bin/{}.rs",
                p.name,
                p.name
            );
            // firmware/build.rs links `zynqmp-*` programs with link/zynqmp.ld.
            let zynqmp_name = p.name.starts_with("zynqmp-");
            assert_eq!(zynqmp_name, p.machine == Machine::ZynqMp, "{}", p.name);
            // A program QEMU cannot run can only be built.
            assert_eq!(
                p.machine.runs_on_qemu(),
                p.expect != Expect::BuildOnly,
                "{}",
                p.name
            );
        }
    }

    #[test]
    fn one_program_that_fails_to_build_or_start_does_not_stop_the_others() {
        let program = |name, machine, expect| Program {
            name,
            machine,
            expect,
            timeout: Duration::from_secs(1),
            qemu_args: &[],
            fault_check: None,
        };
        let programs = [
            program("broken", Machine::Virt, Expect::Pass),
            program("no-qemu", Machine::Virt, Expect::Exception),
            program("fine", Machine::Virt, Expect::Pass),
            program("board", Machine::ZynqMp, Expect::BuildOnly),
            program("faults", Machine::Virt, Expect::Exception),
        ];
        let mut ran = Vec::new();
        let failed = check_programs(
            &programs,
            |p| {
                ran.push(p.name);
                Ok(PathBuf::from(p.name))
            },
            |p| match p.name {
                "broken" => Err(XtaskError::Other("build failed: E0308".into())),
                "no-qemu" => Err(XtaskError::Other("qemu-system-aarch64 missing".into())),
                "faults" => Ok(Outcome::Failed {
                    name: p.name.into(),
                    reason: "FAIL: exception".into(),
                    output: "ESR ELR FAR".into(),
                }),
                _ => Ok(Outcome::Passed {
                    name: p.name.into(),
                    summary: "ok".into(),
                }),
            },
        );
        assert_eq!(ran, ["board"]);
        assert_eq!(
            failed,
            [
                "broken: build failed: E0308",
                "no-qemu: qemu-system-aarch64 missing"
            ]
        );
    }

    #[test]
    fn qemu_refuses_a_board_program_in_one_line_without_building() {
        let program = find("zynqmp-smmu-faults").unwrap();
        assert_eq!(program.machine, Machine::ZynqMp);
        assert_eq!(program.expect, Expect::BuildOnly);
        let Err(XtaskError::Other(message)) = build_and_run(program, false, None) else {
            panic!("`cargo xtask qemu zynqmp-smmu-faults` must be refused");
        };
        assert!(!message.contains('\n'), "{message}");
        assert!(message.contains("needs a ZynqMP board"), "{message}");
        assert!(
            message.contains("cargo xtask firmware zynqmp-smmu-faults"),
            "{message}"
        );
    }
}
