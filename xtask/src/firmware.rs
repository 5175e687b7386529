//! Bare-metal programs: the registry, the cross build, and the QEMU runner.
//!
//! The verdict protocol (see the `firmware` crate): a program prints exactly one line
//! `NPRDMA-VERDICT: PASS <summary>` or `NPRDMA-VERDICT: FAIL <reason>`. On `virt` it then
//! powers off through PSCI, which ends QEMU with status 0; on `xlnx-zcu102` (no PSCI at EL3)
//! it waits for interrupts forever, and the harness stops QEMU once the line is out. A run
//! passes only if the PASS line was seen and QEMU exited 0 (or, on `xlnx-zcu102`, was
//! stopped after the line) in time; a FAIL line, no line, a non-zero exit or a timeout is a
//! failure.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::util::{XtaskError, require_tool, run_status, workspace_root};

/// The machine a program is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Machine {
    /// QEMU `virt` with an SMMUv3 and the `edu` device.
    Virt,
    /// A Zynq UltraScale+ board (ZCU102, QFDB) at EL3 after the FSBL (docs/mmu500.md); here
    /// QEMU's `xlnx-zcu102`, which models the zDMA channels, UARTs and GIC but no MMU-500.
    ZynqMp,
}

impl Machine {
    pub fn name(self) -> &'static str {
        match self {
            Machine::Virt => "virt",
            Machine::ZynqMp => "zynqmp",
        }
    }

    /// The QEMU machine programs for this machine run on.
    pub fn qemu_machine(self) -> &'static str {
        match self {
            Machine::Virt => "virt",
            Machine::ZynqMp => "xlnx-zcu102",
        }
    }

    /// Whether a program ends the run itself (PSCI SYSTEM_OFF ends QEMU). A ZynqMP program
    /// at EL3 has no PSCI to call: after its verdict it waits for interrupts forever, and
    /// the harness stops QEMU.
    pub fn powers_off(self) -> bool {
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
        // On a board: the MMU-500 fault scenario. On QEMU's xlnx-zcu102, which has no
        // MMU-500: SMMU absent, then the zDMA copies and bus-error transfers (docs/mmu500.md).
        name: "zynqmp-smmu-faults",
        machine: Machine::ZynqMp,
        expect: Expect::Pass,
        // A few seconds under TCG; room for a slow, shared build machine.
        timeout: Duration::from_secs(120),
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

/// Where the cross build puts a program's ELF.
pub fn elf_path(program: &Program, release: bool) -> PathBuf {
    let profile = if release { "release" } else { "debug" };
    cross_target_dir()
        .join(CROSS_TARGET)
        .join(profile)
        .join(program.name)
}

/// Builds one program; returns the ELF's path.
pub fn build(program: &Program, release: bool) -> Result<PathBuf, XtaskError> {
    cross_build(&["-p", "firmware", "--bin", program.name], release)?;
    let elf = elf_path(program, release);
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
    Passed {
        name: String,
        /// The QEMU machine it ran on.
        machine: &'static str,
        summary: String,
    },
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
            Outcome::Passed {
                name,
                machine,
                summary,
            } => {
                println!("xtask: `{name}` passed on {machine}: {summary}");
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

/// What the installed QEMU's `xlnx-zcu102` takes for its audio device (the DisplayPort
/// controller has one). QEMU 10 refuses to start it without an audio backend ("no default
/// audio driver available") and names the backend with the machine property `audiodev`;
/// QEMU 7.2 has no such property and gives the first `-audiodev` to the device (with a
/// deprecation note).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QemuFeatures {
    /// `-M xlnx-zcu102,help` lists `audiodev=`.
    pub zcu102_audiodev_property: bool,
}

impl QemuFeatures {
    /// Asks `qemu` (only what the machine needs).
    fn probe(qemu: &std::path::Path, machine: Machine) -> Result<Self, XtaskError> {
        let zcu102_audiodev_property = match machine {
            Machine::Virt => false,
            Machine::ZynqMp => {
                let out = Command::new(qemu)
                    .args(["-M", "xlnx-zcu102,help"])
                    .output()
                    .map_err(|error| XtaskError::Spawn {
                        what: format!("{} -M xlnx-zcu102,help", qemu.display()),
                        error,
                    })?;
                String::from_utf8_lossy(&out.stdout).contains("audiodev=")
            }
        };
        Ok(Self {
            zcu102_audiodev_property,
        })
    }
}

/// The QEMU arguments for a machine, before the program's own and `-kernel`.
///
/// - `virt`: SMMUv3 in front of the PCIe root complex, GICv3, an AArch64 CPU, the `edu`
///   device at slot 2 (stream ID 0x10), nothing else (QEMU `hw/arm/virt.c`).
/// - `xlnx-zcu102`: `secure=on`, so `-kernel ELF` starts the program at EL3 as on the board
///   after the FSBL (without it: EL1), and `virtualization=on`, so the A53s have EL2 as on
///   silicon and the runtime drops to Non-secure EL2 as it does on a board (without it: EL1;
///   both properties of `hw/arm/xlnx-zcu102.c` in QEMU 7.2 and 10.0); 4 GiB as on the ZCU102 (2 GiB at 0, 2 GiB at 32 GiB,
///   `hw/arm/xlnx-zynqmp.c`; the default 128 MiB would not hold the image at 256 MiB); UART0
///   on stdio; an audio backend that plays nothing ([`QemuFeatures`]). The SoC's four GEMs
///   come without a network, which QEMU notes on stderr.
pub fn machine_args(machine: Machine, features: QemuFeatures) -> Vec<String> {
    let args: Vec<&str> = match machine {
        Machine::Virt => vec![
            "-M",
            "virt,iommu=smmuv3,gic-version=3",
            "-cpu",
            "cortex-a57",
            "-m",
            "256M",
            "-nographic",
            "-nodefaults",
            "-serial",
            "stdio",
            "-device",
            "edu,addr=2",
        ],
        Machine::ZynqMp => {
            let m = if features.zcu102_audiodev_property {
                "xlnx-zcu102,secure=on,virtualization=on,audiodev=snd0"
            } else {
                "xlnx-zcu102,secure=on,virtualization=on"
            };
            vec![
                "-M",
                m,
                "-m",
                "4G",
                "-nographic",
                "-nodefaults",
                "-serial",
                "stdio",
                "-audiodev",
                "none,id=snd0",
            ]
        }
    };
    args.into_iter().map(String::from).collect()
}

/// The QEMU command line for a program: [`machine_args`], the program's extra arguments,
/// then `-kernel` with its ELF.
fn qemu_command(
    machine: Machine,
    elf: &std::path::Path,
    extra: &[&str],
) -> Result<Command, XtaskError> {
    let qemu = require_tool("qemu-system-aarch64", "qemu-system-arm")?;
    let features = QemuFeatures::probe(&qemu, machine)?;
    let mut cmd = Command::new(qemu);
    cmd.args(machine_args(machine, features))
        .args(extra)
        .arg("-kernel")
        .arg(elf);
    Ok(cmd)
}

/// Builds and runs a program; returns how it ended (an `Err` only when it could not run).
pub fn build_and_run(
    program: &Program,
    release: bool,
    timeout_s: Option<u64>,
) -> Result<Outcome, XtaskError> {
    let elf = build(program, release)?;
    let timeout = timeout_s
        .map(Duration::from_secs)
        .unwrap_or(program.timeout);
    run_qemu(program, &elf, timeout)
}

/// How QEMU ended.
#[derive(Debug)]
enum Ended {
    /// It exited by itself.
    Exited(std::process::ExitStatus),
    /// The harness stopped it after the verdict line (a program that never powers off).
    StoppedAfterVerdict,
    /// The harness stopped it at the timeout.
    TimedOut,
}

/// How long QEMU may keep running after the verdict line of a program that does not power
/// off, so the console lines after it are shown too.
const AFTER_VERDICT: Duration = Duration::from_millis(500);

fn run_qemu(
    program: &Program,
    elf: &std::path::Path,
    timeout: Duration,
) -> Result<Outcome, XtaskError> {
    let name = program.name;
    let machine = program.machine;
    let mut child = qemu_command(machine, elf, program.qemu_args)?
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
    let mut lines: Vec<String> = Vec::new();
    let mut verdict_at: Option<Instant> = None;
    let ended = loop {
        lines.extend(rx.try_iter());
        if verdict_at.is_none()
            && lines
                .iter()
                .any(|l| l.trim_end().starts_with(VERDICT_PREFIX))
        {
            verdict_at = Some(Instant::now());
        }
        match child.try_wait() {
            Ok(Some(status)) => break Ended::Exited(status),
            Ok(None)
                if !machine.powers_off()
                    && verdict_at.is_some_and(|t| t.elapsed() >= AFTER_VERDICT) =>
            {
                let _ = child.kill();
                let _ = child.wait();
                break Ended::StoppedAfterVerdict;
            }
            Ok(None) if start.elapsed() >= timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break Ended::TimedOut;
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
    lines.extend(rx.try_iter());
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
    let status = match ended {
        Ended::TimedOut => return fail(format!("timed out after {} s", timeout.as_secs())),
        Ended::Exited(status) => Some(status),
        Ended::StoppedAfterVerdict => None,
    };
    if !stderr_text.trim().is_empty() {
        eprintln!("qemu stderr:\n{}", stderr_text.trim_end());
    }
    let how = match status {
        Some(status) => format!("QEMU exited with {status}"),
        None => "QEMU was stopped after the verdict".to_string(),
    };
    match verdicts.as_slice() {
        [] => fail(format!("no verdict line; {how}")),
        [one] => {
            if let Some(reason) = one.strip_prefix("FAIL") {
                fail(format!("FAIL{reason}"))
            } else if let Some(summary) = one.strip_prefix("PASS") {
                if status.is_none_or(|s| s.success()) {
                    Ok(Outcome::Passed {
                        name: name.clone(),
                        machine: machine.qemu_machine(),
                        summary: summary.trim().to_string(),
                    })
                } else {
                    fail(format!("PASS printed but {how}"))
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

/// Prints a console capture (a board's UART log, say) with its defmt frame lines decoded by
/// the format strings in `elf`, which must be the ELF that ran; other lines as they are.
pub fn decode(elf: &std::path::Path, capture: impl Read) -> Result<(), XtaskError> {
    if !elf.is_file() {
        return Err(XtaskError::Other(format!(
            "no ELF at {} (build it with `cargo xtask firmware NAME`, or give --elf)",
            elf.display()
        )));
    }
    let mut defmt = DefmtLines::load(elf);
    if defmt.table.is_none() {
        return Err(XtaskError::Other(format!(
            "{} has no defmt table (not a firmware program's ELF?)",
            elf.display()
        )));
    }
    for line in crate::util::lossy_lines(capture) {
        let line = line.trim_end_matches(['\r', '\n']);
        match defmt.render(line) {
            Some(decoded) => println!("{decoded}"),
            None => println!("{line}"),
        }
    }
    Ok(())
}

/// Runs every program as `cargo xtask test` expects; returns the names that did not behave.
pub fn test_all() -> Vec<String> {
    check_programs(PROGRAMS, |p| build_and_run(p, false, None))
}

/// [`test_all`] over the given programs and runner (tests pass their own).
fn check_programs(
    programs: &[Program],
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
            // A program that does not build or cannot be started fails alone: the others
            // still run, so one broken program does not hide the state of the rest.
            Expect::Pass => match build_and_run(program) {
                Ok(Outcome::Passed {
                    machine, summary, ..
                }) => {
                    println!("xtask: `{}` passed on {machine}: {summary}", program.name)
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

    /// The decoder with a table of one log string (index 7) and the firmware's timestamp, as
    /// `defmt-decoder` reads them from an ELF (built through its serde form).
    fn decoder_with_one_string() -> DefmtLines {
        let message = "zDMA GDMA{=u32} copy: byte {=u8:02x} exact";
        let table = serde_json::json!({
            "timestamp": {
                "string": { "tag": "Timestamp", "string": "{=u64:us}" },
                "raw_symbol": "timestamp"
            },
            "entries": {
                "7": {
                    "string": { "tag": "Info", "string": message },
                    "raw_symbol": "message"
                }
            },
            "bitflags": {},
            "encoding": "Rzcobs"
        });
        DefmtLines {
            table: Some(serde_json::from_value(table).unwrap()),
            elf: "program".into(),
        }
    }

    #[test]
    fn defmt_frame_lines_are_shown_as_their_messages() {
        let mut d = decoder_with_one_string();
        // What firmware::logger writes for that string with 1 and 0x0a at 1.5 s (its own test
        // decodes the same line).
        assert_eq!(
            d.render("NPRDMA-DEFMT: 000760e3166201770a7e00\r")
                .as_deref(),
            Some("1.500000 INFO zDMA GDMA1 copy: byte 0a exact")
        );
        assert_eq!(
            d.render("NPRDMA-VERDICT: PASS ok"),
            None,
            "text lines pass through"
        );
        assert_eq!(
            d.render("NPRDMA-DEFMT: 00076").as_deref(),
            Some("[malformed defmt line] 00076")
        );
        // Index 8 is not in the table.
        assert_eq!(
            d.render("NPRDMA-DEFMT: 000860e3166201770a7e00").as_deref(),
            Some("[undecodable defmt frame] 000860e3166201770a7e00")
        );
        let mut without = DefmtLines {
            table: None,
            elf: "program".into(),
        };
        assert_eq!(
            without.render("NPRDMA-DEFMT: 00").as_deref(),
            Some("[defmt frame, no format table in program] 00")
        );
    }

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
        }
        let zynqmp = find("zynqmp-smmu-faults").unwrap();
        assert_eq!(
            (zynqmp.machine.qemu_machine(), zynqmp.expect),
            ("xlnx-zcu102", Expect::Pass)
        );
    }

    #[test]
    fn one_program_that_fails_to_start_does_not_stop_the_others() {
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
            program("board", Machine::ZynqMp, Expect::Pass),
            program("faults", Machine::Virt, Expect::Exception),
        ];
        let mut ran = Vec::new();
        let failed = check_programs(&programs, |p| {
            ran.push(p.name);
            match p.name {
                "broken" => Err(XtaskError::Other("build failed: E0308".into())),
                "no-qemu" => Err(XtaskError::Other("qemu-system-aarch64 missing".into())),
                "faults" => Ok(Outcome::Failed {
                    name: p.name.into(),
                    reason: "FAIL: exception".into(),
                    output: "ESR ELR FAR".into(),
                }),
                _ => Ok(Outcome::Passed {
                    name: p.name.into(),
                    machine: p.machine.qemu_machine(),
                    summary: "ok".into(),
                }),
            }
        });
        assert_eq!(ran, ["broken", "no-qemu", "fine", "board", "faults"]);
        assert_eq!(
            failed,
            [
                "broken: build failed: E0308",
                "no-qemu: qemu-system-aarch64 missing"
            ]
        );
    }

    #[test]
    fn one_way_to_build_command_lines_for_both_machines() {
        let none = QemuFeatures {
            zcu102_audiodev_property: false,
        };
        let with = QemuFeatures {
            zcu102_audiodev_property: true,
        };
        let virt = machine_args(Machine::Virt, with).join(" ");
        assert!(
            virt.starts_with("-M virt,iommu=smmuv3,gic-version=3 -cpu cortex-a57 -m 256M"),
            "{virt}"
        );
        assert!(virt.ends_with("-device edu,addr=2"), "{virt}");
        assert_eq!(virt, machine_args(Machine::Virt, none).join(" "));
        // QEMU 10: the machine names the audio backend; QEMU 7.2 has no such property.
        let zcu102 = machine_args(Machine::ZynqMp, with).join(" ");
        assert!(
            zcu102.starts_with("-M xlnx-zcu102,secure=on,virtualization=on,audiodev=snd0 -m 4G"),
            "{zcu102}"
        );
        assert!(zcu102.ends_with("-audiodev none,id=snd0"), "{zcu102}");
        let old = machine_args(Machine::ZynqMp, none).join(" ");
        assert!(
            old.starts_with("-M xlnx-zcu102,secure=on,virtualization=on -m 4G"),
            "{old}"
        );
        assert!(old.contains("-serial stdio"));
        assert!(Machine::Virt.powers_off() && !Machine::ZynqMp.powers_off());
    }
}
