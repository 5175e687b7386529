//! `cargo xtask kernel-test`: the kernel half of linux-glue, nprdma.ko, on a real kernel.
//!
//! Builds the module (linux-glue/kernel) out of tree with the host's gcc against Debian's
//! headers for exactly the kernel `cargo xtask rxe-test` boots (the one `linux-image-amd64`
//! depends on: `linux-headers-<abi>-amd64`, `linux-headers-<abi>-common` and
//! `linux-kbuild-<series>` at the kernel's version, fetched with `apt-get download` and
//! unpacked under `target/kernel-test/`), checks that it imports no page-pinning function,
//! boots that kernel in `qemu-system-x86_64` (TCG unless hardware KVM is at hand, `-smp 2`)
//! with an initramfs holding busybox, the module and `linux-glue-kmod-test` (built on the
//! host; Debian 12's glibc in the guest, as in rxe-test), and runs the test binary as root
//! after `insmod`.
//!
//! First the test binary's quick benchmark runs (`--bench --quick`: `NPRDMA-BENCH:` lines,
//! module vs user space vs CPU vs the swap device, goals beside the figures, nothing
//! asserted), with a zram swap device (the kernel's own zram.ko) for its swap-in row and 2 GiB
//! of guest memory for its 1 GiB registered while in use. Then the guest
//! prints `NPRDMA-KMOD: PASS|FAIL|SKIP <check>: <detail>` per check, then checks its
//! kernel log for WARNING, BUG, Oops, call traces and lockdep reports, reloads the module
//! once, and ends with `NPRDMA-KMOD: VERDICT PASS|FAIL`. The command fails on any FAIL, a
//! missing verdict, or a guest that outlives its timeout.
//!
//! `--arch arm64` (also run by default, after x86_64) is the IOMMU half: the module
//! cross-built with Debian's `gcc-12-aarch64-linux-gnu` against `linux-headers-<abi>-arm64`
//! (fetched through a private apt state under `target/kernel-test-arm64/apt`, no change to
//! the machine's apt), Debian's arm64 kernel on `qemu-system-aarch64 -M virt,iommu=smmuv3`
//! with QEMU's `edu` behind the SMMUv3 (icount, so edu's 100 ms transfers cost little), and
//! `linux-glue-dma-test` plus `linux-glue-kmod-test` cross-built for
//! `aarch64-unknown-linux-gnu` with Debian's rustc-web and its arm64 standard library
//! (`libstd-rust-web-dev:arm64`), linked statically with `libc6-dev-arm64-cross`. The swap
//! soak runs in that guest too (`--soak N` transfers; zram swap, a cgroup v2 `memory.max`
//! below the buffer).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::guest::{
    self, Cpio, Vm, Wanted, cargo_artifacts, library_closure, module_order, other, read,
};
use crate::util::{XtaskError, require_tool, run_status, section, workspace_root};

/// Debian packages unpacked into the guest (besides the kernel).
const GUEST_PACKAGES: &[&str] = &["busybox-static", "libc6", "libgcc-s1"];

/// Kernel modules of the benchmark's swap device (zram and what it needs).
const SWAP_MODULES: &[&str] = &["zram"];

/// The x86_64 guest's memory: room for the benchmark's 1 GiB registered while in use (the
/// issue's size) beside the kernel and the test binary.
const GUEST_MIB: u64 = 2048;

/// Files of linux-glue/kernel that the out-of-tree build needs.
pub(crate) const MODULE_SOURCES: &[&str] = &[
    "Kbuild",
    "nprdma.h",
    "nprdma_abi.h",
    "main.c",
    "buf.c",
    "table.c",
    "fault.c",
    "ring.c",
    "dma.c",
    "devfault.c",
];

/// Kernel functions that take page references or pins (mm/gup.c): the module must import none.
pub(crate) const PINNING_SYMBOLS: &[&str] = &[
    "get_user_pages",
    "pin_user_pages",
    "get_user_pages_fast",
    "pin_user_pages_fast",
    "get_user_pages_remote",
    "pin_user_pages_remote",
    "get_user_pages_unlocked",
    "pin_user_pages_unlocked",
    "get_user_page_vma_remote",
];

/// Default wall-clock limit for the x86_64 guest (it needs about a minute under TCG).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Default wall-clock limit for the arm64 guest (checks, the CI soak and the 38 checks: about
/// 10 min on the 2-core build machine, docs/linux-glue.md "The swap soak's speed").
pub const DEFAULT_TIMEOUT_ARM64: Duration = Duration::from_secs(1800);
/// Transfers of the swap soak in CI (`--soak`): 10^5, about 7.5 min of host time
/// (docs/linux-glue.md, "The swap soak's speed").
pub const CI_SOAK: u64 = 100_000;

/// The guest's /init.
const GUEST_INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
say() { echo "NPRDMA-KMOD: $*"; }
FAILED=0
fail() { say "FAIL $*"; FAILED=1; }
say "INFO kernel $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) MiB, THP $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
if insmod /lib/modules/nprdma.ko 2>/tmp/e; then
  if [ -c /dev/nprdma-glue ]; then say "PASS insmod: nprdma.ko loaded, /dev/nprdma-glue is a character device"
  else fail "insmod: loaded, but /dev/nprdma-glue is missing"; fi
else
  fail "insmod: $(cat /tmp/e)"
fi
# A swap device for the benchmark's swap-in row: zram, no swap read-ahead (page-cluster 0).
for m in $(cat /etc/swap-modules); do insmod /lib/modules/$m 2>>/tmp/swap.err; done
if echo 256M > /sys/block/zram0/disksize 2>>/tmp/swap.err && mkswap /dev/zram0 >/dev/null 2>>/tmp/swap.err \
   && swapon /dev/zram0 2>>/tmp/swap.err; then
  echo 0 > /proc/sys/vm/page-cluster
else
  say "INFO no zram swap for the benchmark: $(cat /tmp/swap.err)"
fi
# The benchmark (module vs user space vs CPU; printed, not asserted), then the checks.
/opt/nprdma/linux-glue-kmod-test --bench --quick || say "INFO the benchmark did not complete"
swapoff /dev/zram0 2>/dev/null
/opt/nprdma/linux-glue-kmod-test --rmmod || FAILED=1
# The module loads and unloads again after the test unloaded it.
if insmod /lib/modules/nprdma.ko 2>/tmp/e && rmmod nprdma 2>>/tmp/e; then
  say "PASS reload: insmod and rmmod again"
else
  fail "reload: $(cat /tmp/e)"
fi
# The kernel log: any warning, bug, oops, call trace or lockdep report fails the run.
dmesg > /tmp/dmesg
if grep -E 'WARNING|BUG|Oops|general protection|Call Trace|circular locking|inconsistent lock state|recursive locking|lockdep|sleeping function called from invalid context' /tmp/dmesg > /tmp/bad; then
  fail "dmesg: $(wc -l < /tmp/bad) line(s) with a warning, bug, oops or lock report"
  sed 's/^/  dmesg| /' /tmp/bad | head -n 60
else
  say "PASS dmesg: no WARNING, BUG, Oops, call trace or lockdep report in $(wc -l < /tmp/dmesg) lines"
fi
grep -i nprdma /tmp/dmesg | sed 's/^/  dmesg| /' | head -n 8
if [ $FAILED = 0 ]; then say "VERDICT PASS"; else say "VERDICT FAIL"; fi
sync
poweroff -f
"#;

/// The guest architectures kernel-test knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// q35, no IOMMU, no DMA device: the mm half.
    X86_64,
    /// virt with an SMMUv3 and edu: the mm half and the IOMMU half.
    Arm64,
}

impl Arch {
    /// Parses `--arch`'s value.
    pub fn parse(s: &str) -> Option<Vec<Arch>> {
        match s {
            "x86_64" | "x86" | "amd64" => Some(vec![Arch::X86_64]),
            "arm64" | "aarch64" => Some(vec![Arch::Arm64]),
            "all" => Some(vec![Arch::X86_64, Arch::Arm64]),
            _ => None,
        }
    }
}

/// Options of `cargo xtask kernel-test`.
pub struct Options {
    /// Wall-clock limit for each guest (`None`: the architecture's default).
    pub timeout: Option<Duration>,
    /// The guests to run, in order.
    pub arches: Vec<Arch>,
    /// Transfers of the arm64 swap soak (0: none).
    pub soak: u64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            timeout: None,
            arches: vec![Arch::X86_64, Arch::Arm64],
            soak: CI_SOAK,
        }
    }
}

fn cache_dir() -> PathBuf {
    workspace_root().join("target").join("kernel-test")
}

/// `linux-image-6.1.0-57-amd64` with `arch` "amd64" -> (`6.1.0-57`, `6.1`): the kernel ABI
/// name and the series of its `linux-kbuild-*` package.
pub(crate) fn abi_and_series(kernel_package: &str, arch: &str) -> Option<(String, String)> {
    let abi = kernel_package
        .strip_prefix("linux-image-")?
        .strip_suffix(arch)?
        .strip_suffix('-')?;
    let mut parts = abi.split('.');
    let (major, minor) = (parts.next()?, parts.next()?);
    if major.is_empty() || !major.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((abi.to_string(), format!("{major}.{minor}")))
}

/// The kernel and its headers, all at the kernel's own version, and the guest's packages.
fn wanted_packages() -> Result<Vec<Wanted>, XtaskError> {
    let kernel = guest::kernel_package()?;
    let version = guest::candidate_version(&kernel)?;
    let (abi, series) = abi_and_series(&kernel, "amd64")
        .ok_or_else(|| other(format!("cannot read the kernel ABI from `{kernel}`")))?;
    let pinned = |name: String| Wanted {
        name,
        version: Some(version.clone()),
    };
    let mut wanted: Vec<Wanted> = GUEST_PACKAGES.iter().map(|n| Wanted::any(*n)).collect();
    wanted.push(pinned(kernel));
    wanted.push(pinned(format!("linux-headers-{abi}-amd64")));
    wanted.push(pinned(format!("linux-headers-{abi}-common")));
    wanted.push(pinned(format!("linux-kbuild-{series}")));
    Ok(wanted)
}

/// The headers package's Makefile includes the `-common` headers by their absolute path under
/// /usr/src; in the copy unpacked under `root` it must include the unpacked one.
pub(crate) fn rebase_includes(makefile: &str, root: &Path) -> String {
    makefile
        .lines()
        .map(|l| match l.strip_prefix("include /usr/src/") {
            Some(rest) => format!("include {}/usr/src/{rest}", root.display()),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

pub(crate) fn fix_headers_makefile(hdir: &Path, root: &Path) -> Result<(), XtaskError> {
    let path = hdir.join("Makefile");
    let text =
        std::fs::read_to_string(&path).map_err(|e| other(format!("{}: {e}", path.display())))?;
    let fixed = rebase_includes(&text, root);
    if fixed != text {
        std::fs::write(&path, fixed).map_err(|e| other(format!("{}: {e}", path.display())))?;
    }
    Ok(())
}

/// Copies the module's sources into `dir` (a file whose content did not change keeps its
/// time, so make rebuilds only what changed) and builds nprdma.ko there.
pub(crate) fn build_module(
    hdir: &Path,
    dir: &Path,
    make_args: &[&str],
) -> Result<PathBuf, XtaskError> {
    let src = workspace_root().join("linux-glue").join("kernel");
    std::fs::create_dir_all(dir).map_err(|e| other(format!("{}: {e}", dir.display())))?;
    for f in MODULE_SOURCES {
        let from = read(&src.join(f))?;
        let to = dir.join(f);
        if std::fs::read(&to).ok().as_deref() != Some(from.as_slice()) {
            std::fs::write(&to, from).map_err(|e| other(format!("{}: {e}", to.display())))?;
        }
    }
    // A source an earlier layout left here (the single nprdma.c) is not part of this build.
    for e in std::fs::read_dir(dir).map_err(|e| other(format!("{}: {e}", dir.display())))? {
        let path = e.map_err(|e| other(e.to_string()))?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let source = (name.ends_with(".c") && !name.ends_with(".mod.c")) || name.ends_with(".h");
        if source && !MODULE_SOURCES.contains(&&*name) {
            std::fs::remove_file(&path).map_err(|e| other(format!("{}: {e}", path.display())))?;
        }
    }
    run_status(
        "make (nprdma.ko)",
        Command::new("make")
            .arg("-C")
            .arg(hdir)
            .arg(format!("M={}", dir.display()))
            // One job per core: the module is seven objects, each parsing the mm, IOMMU and
            // PCI headers.
            .arg(format!(
                "-j{}",
                std::thread::available_parallelism().map_or(2, |n| n.get())
            ))
            .arg("KCFLAGS=-Werror")
            .arg("W=1")
            .args(make_args)
            .arg("modules"),
    )?;
    let ko = dir.join("nprdma.ko");
    if ko.is_file() {
        Ok(ko)
    } else {
        Err(other(format!("make built no {}", ko.display())))
    }
}

/// The kernel symbols the module imports (`nm -u`).
pub(crate) fn imported_symbols(ko: &Path) -> Result<Vec<String>, XtaskError> {
    let out = Command::new("nm")
        .arg("-u")
        .arg(ko)
        .output()
        .map_err(|error| XtaskError::Spawn {
            what: "nm -u".into(),
            error,
        })?;
    if !out.status.success() {
        return Err(XtaskError::CommandFailed {
            what: "nm -u nprdma.ko".into(),
            status: out.status,
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last().map(str::to_string))
        .collect())
}

/// The kernel configuration's debugging options that decide what the guest's log can show.
pub(crate) fn debug_config_note(hdir: &Path) -> String {
    let config = std::fs::read_to_string(hdir.join(".config")).unwrap_or_default();
    let on = |opt: &str| config.lines().any(|l| l == format!("{opt}=y"));
    let list = |opts: &[&str], want: bool| -> String {
        let v: Vec<&str> = opts.iter().copied().filter(|o| on(o) == want).collect();
        if v.is_empty() {
            "none".into()
        } else {
            v.join(", ")
        }
    };
    let opts = [
        "CONFIG_PROVE_LOCKING",
        "CONFIG_DEBUG_ATOMIC_SLEEP",
        "CONFIG_DEBUG_VM",
        "CONFIG_KASAN",
        "CONFIG_DEBUG_LIST",
    ];
    format!(
        "kernel debug options on: {}; off: {} (lockdep and might_sleep reports need the ones that are off)",
        list(&opts, true),
        list(&opts, false)
    )
}

fn build_initramfs(
    stage: &Path,
    moddir: &Path,
    ko: &Path,
    test_bin: &Path,
    out: &Path,
) -> Result<(), XtaskError> {
    let mut cpio = Cpio::new();
    for d in [
        "proc",
        "sys",
        "dev",
        "tmp",
        "run",
        "etc",
        "lib64",
        "opt/nprdma",
    ] {
        cpio.dir(d);
    }
    cpio.file("bin/busybox", 0o755, &read(&stage.join("bin/busybox"))?);
    cpio.file("lib/modules/nprdma.ko", 0o644, &read(ko)?);
    cpio.file("opt/nprdma/linux-glue-kmod-test", 0o755, &read(test_bin)?);
    for (src, guest) in library_closure(stage, &[test_bin.to_path_buf()])? {
        cpio.file(&guest, 0o755, &read(&src)?);
        if guest == "/lib64/ld-linux-x86-64.so.2" {
            cpio.file(
                "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
                0o755,
                &read(&src)?,
            );
        }
    }
    let mut list = String::new();
    for rel in module_order(moddir, SWAP_MODULES)? {
        let name = rel.file_name().unwrap_or_default().to_string_lossy();
        cpio.file(
            &format!("lib/modules/swap/{name}"),
            0o644,
            &read(&moddir.join(&rel))?,
        );
        list.push_str(&format!("swap/{name}\n"));
    }
    cpio.file("etc/swap-modules", 0o644, list.as_bytes());
    cpio.file("init", 0o755, GUEST_INIT.as_bytes());
    std::fs::write(out, cpio.finish()).map_err(|e| other(format!("{}: {e}", out.display())))
}

/// The guest's verdict: every `NPRDMA-KMOD:` line counted, any FAIL or a missing
/// `VERDICT PASS` (or test summary) is a failure.
pub(crate) fn evaluate(lines: &[String]) -> Result<(), XtaskError> {
    let protocol: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("NPRDMA-KMOD: "))
        .collect();
    let count = |word: &str| {
        protocol
            .iter()
            .filter(|l| l.starts_with(&format!("{word} ")))
            .count()
    };
    let failed: Vec<String> = protocol
        .iter()
        .filter(|l| l.starts_with("FAIL "))
        .map(|l| l.trim_start_matches("FAIL ").to_string())
        .collect();
    let total = protocol.iter().any(|l| l.starts_with("TOTAL "));
    let verdict = protocol.contains(&"VERDICT PASS");
    println!(
        "xtask: kernel-test: {} checks passed, {} failed, {} skipped",
        count("PASS"),
        failed.len(),
        count("SKIP")
    );
    if !failed.is_empty() {
        return Err(XtaskError::Checks(failed));
    }
    if !total {
        return Err(other(
            "the guest's test binary printed no TOTAL line (did it crash? see the serial log)",
        ));
    }
    if !verdict {
        return Err(other("the guest printed no `VERDICT PASS`"));
    }
    Ok(())
}

/// Runs every guest `opts` names; fails if the build, any guest check or a kernel log failed.
pub fn run(opts: &Options) -> Result<(), XtaskError> {
    let mut failed = Vec::new();
    for arch in &opts.arches {
        let r = match arch {
            Arch::X86_64 => run_x86(opts),
            Arch::Arm64 => crate::kernel_test_arm64::run(opts),
        };
        if let Err(e) = r {
            eprintln!("xtask: kernel-test ({arch:?}) failed: {e}");
            failed.push(format!("kernel-test {arch:?}: {e}"));
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(XtaskError::Checks(failed))
    }
}

/// The x86_64 guest: the mm half (no IOMMU, no DMA device).
fn run_x86(opts: &Options) -> Result<(), XtaskError> {
    let started = Instant::now();
    let qemu = require_tool("qemu-system-x86_64", "qemu-system-x86")?;
    require_tool("apt-get", "apt")?;
    require_tool("dpkg-deb", "dpkg")?;
    require_tool("ldd", "libc-bin")?;
    require_tool("make", "make")?;
    require_tool("gcc-12", "gcc-12")?;
    require_tool("nm", "binutils")?;

    section("kernel-test: build linux-glue-kmod-test");
    let test_bin = cargo_artifacts(
        &["-p", "linux-glue", "--bin", "linux-glue-kmod-test"],
        &["linux-glue-kmod-test"],
    )?
    .pop()
    .ok_or_else(|| other("cargo reported no linux-glue-kmod-test"))?;

    section(
        "kernel-test: Debian kernel, headers and guest packages (cached in target/kernel-test)",
    );
    let cache = cache_dir();
    let debs = guest::fetch_packages(&cache.join("debs"), &wanted_packages()?)?;
    guest::unpack(&cache, &debs, &|name| {
        if name.starts_with("linux-image-") {
            "kernel"
        } else if name.starts_with("linux-headers-") || name.starts_with("linux-kbuild-") {
            "headers"
        } else {
            "stage"
        }
    })?;
    let kdir = cache.join("kernel");
    let kver = guest::kernel_version(&kdir)?;
    let hroot = cache.join("headers");
    let hdir = hroot.join("usr/src").join(format!("linux-headers-{kver}"));
    fix_headers_makefile(&hdir, &hroot)?;

    section(&format!(
        "kernel-test: build nprdma.ko against linux-headers-{kver} (host gcc-12)"
    ));
    let ko = build_module(&hdir, &cache.join("module"), &[])?;
    let imports = imported_symbols(&ko)?;
    let pins: Vec<&String> = imports
        .iter()
        .filter(|s| PINNING_SYMBOLS.contains(&s.as_str()))
        .collect();
    if !pins.is_empty() {
        return Err(other(format!(
            "nprdma.ko imports page-pinning functions: {pins:?}"
        )));
    }
    let mm: Vec<&str> = imports
        .iter()
        .map(String::as_str)
        .filter(|s| s.starts_with("hmm_") || s.starts_with("mmu_interval_"))
        .collect();
    println!(
        "xtask: nprdma.ko imports {} symbols, no get_user_pages/pin_user_pages; mm ones: {}",
        imports.len(),
        mm.join(", ")
    );
    println!("xtask: {}", debug_config_note(&hdir));

    let initrd = cache.join("initramfs.cpio");
    let moddir = kdir.join("lib/modules").join(&kver);
    build_initramfs(&cache.join("stage"), &moddir, &ko, &test_bin, &initrd)?;
    println!(
        "xtask: guest kernel {kver}, initramfs {} MiB, prepared in {:.1} s",
        std::fs::metadata(&initrd)
            .map(|m| m.len() >> 20)
            .unwrap_or(0),
        started.elapsed().as_secs_f64()
    );

    section("kernel-test: boot, insmod, test (qemu-system-x86_64, -smp 2)");
    let log = cache.join("last-run.log");
    let boot = Instant::now();
    let vmlinuz = kdir.join("boot").join(format!("vmlinuz-{kver}"));
    let lines = guest::run_vm(&Vm {
        qemu: &qemu,
        vmlinuz: &vmlinuz,
        initrd: &initrd,
        accel: guest::pick_accel(),
        smp: 2,
        memory_mib: GUEST_MIB,
        append: "console=ttyS0 panic=-1 loglevel=3".into(),
        timeout: opts.timeout.unwrap_or(DEFAULT_TIMEOUT),
        log: &log,
        show: |line| {
            line.starts_with("NPRDMA-")
                || line.starts_with("  dmesg|")
                || line.contains("Kernel panic")
        },
    })?;
    let verdict = evaluate(&lines);
    println!(
        "xtask: kernel-test finished in {:.0} s (guest {:.0} s; full serial log: {})",
        started.elapsed().as_secs_f64(),
        boot.elapsed().as_secs_f64(),
        log.display()
    );
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_headers_and_kbuild_follow_the_kernel_package() {
        assert_eq!(
            abi_and_series("linux-image-6.1.0-57-amd64", "amd64"),
            Some(("6.1.0-57".into(), "6.1".into()))
        );
        assert_eq!(
            abi_and_series("linux-image-6.12.9+bpo-amd64", "amd64"),
            Some(("6.12.9+bpo".into(), "6.12".into()))
        );
        assert_eq!(abi_and_series("linux-image-amd64", "amd64"), None);
        assert_eq!(abi_and_series("linux-image-6.1.0-57-arm64", "amd64"), None);
    }

    #[test]
    fn only_absolute_includes_of_usr_src_move_under_the_unpacked_root() {
        let root = Path::new("/build/target/kernel-test/headers");
        let got = rebase_includes(
            "include /usr/src/linux-headers-6.1.0-57-common/Makefile\n# include /usr/src/x\n",
            root,
        );
        assert_eq!(
            got,
            "include /build/target/kernel-test/headers/usr/src/linux-headers-6.1.0-57-common/Makefile\n# include /usr/src/x\n"
        );
        // Idempotent: an already rebased file stays as it is.
        assert_eq!(rebase_includes(&got, root), got);
    }

    #[test]
    fn a_run_passes_only_with_its_verdict_and_no_failure() {
        let lines = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let good = lines(&[
            "NPRDMA-KMOD: PASS insmod: loaded",
            "NPRDMA-KMOD: SKIP thp-2m: off",
            "NPRDMA-KMOD: TOTAL 1 passed, 0 failed, 1 skipped",
            "NPRDMA-KMOD: VERDICT PASS",
        ]);
        assert!(evaluate(&good).is_ok());
        let mut failed = good.clone();
        failed.insert(1, "NPRDMA-KMOD: FAIL dmesg: 3 line(s)".into());
        assert!(evaluate(&failed).is_err());
        assert!(evaluate(&good[..3]).is_err(), "no verdict");
        let no_total: Vec<String> = good
            .iter()
            .filter(|l| !l.contains("TOTAL"))
            .cloned()
            .collect();
        assert!(evaluate(&no_total).is_err(), "the test binary crashed");
    }

    #[test]
    fn the_guest_log_check_catches_the_kernels_report_headers() {
        let pattern = GUEST_INIT
            .lines()
            .find(|l| l.contains("grep -E 'WARNING"))
            .expect("the dmesg check");
        for report in [
            "WARNING: CPU: 1 PID: 80 at mm/mmu_notifier.c:",
            "BUG: kernel NULL pointer dereference",
            "kernel BUG at mm/hmm.c:1!",
            "Oops: 0000 [#1] PREEMPT SMP NOPTI",
            "WARNING: possible circular locking dependency detected",
            "BUG: sleeping function called from invalid context at mm/hmm.c:1",
        ] {
            let words = [
                "WARNING",
                "BUG",
                "Oops",
                "circular locking",
                "sleeping function called from invalid context",
            ];
            assert!(
                words
                    .iter()
                    .any(|w| report.contains(w) && pattern.contains(w)),
                "{report}"
            );
        }
    }
}
