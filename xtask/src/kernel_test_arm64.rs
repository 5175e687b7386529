//! `cargo xtask kernel-test --arch arm64`: nprdma.ko's IOMMU half on Debian's arm64 kernel,
//! behind QEMU's SMMUv3 (see kernel_test.rs for the overview).
//!
//! - Packages: the kernel (`linux-image-<abi>-arm64`, modules uncompressed inside it),
//!   `linux-headers-<abi>-arm64`, `busybox-static` and `libstd-rust-web-dev` (the arm64 standard
//!   library of the host's rustc-web, at exactly its version) through a private apt state
//!   ([`guest::AptState`]); `linux-headers-<abi>-common` and `linux-kbuild-<series>` (host
//!   tools) through the machine's apt, all at the kernel's version, cached in
//!   `target/kernel-test-arm64/`.
//! - The module: kbuild with `CROSS_COMPILE=aarch64-linux-gnu-` (the headers'
//!   `.kernelvariables` name `$(CROSS_COMPILE)gcc-12`), `KCFLAGS=-Werror W=1`.
//! - The test binaries: Debian's cargo and rustc-web for `aarch64-unknown-linux-gnu` with
//!   `--sysroot` pointing at the unpacked standard library, linked statically
//!   (`+crt-static`) by `aarch64-linux-gnu-gcc` against `libc6-dev-arm64-cross`, so the guest
//!   needs no shared library.
//! - The guest: `qemu-system-aarch64 -M virt,iommu=smmuv3,gic-version=3 -cpu cortex-a57
//!   -smp 2 -icount shift=0,sleep=off -device edu,addr=2,dma_mask=...`: edu's 28-bit default
//!   DMA mask (hw/misc/edu.c) would clamp user addresses, so it is widened to 64 bits; icount
//!   with sleep=off lets the virtual clock jump over edu's 100 ms transfer delay while the
//!   guest waits for the interrupt (QEMU's `-icount` documentation).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::guest::{self, AptState, Cpio, Vm, Wanted, module_order, other, read};
use crate::kernel_test::{
    DEFAULT_TIMEOUT_ARM64, Options, PINNING_SYMBOLS, build_module, debug_config_note, evaluate,
    fix_headers_makefile,
};
use crate::util::{XtaskError, require_tool, run_status, section, workspace_root};

/// The Rust target of the guest's test binaries.
const RUST_TARGET: &str = "aarch64-unknown-linux-gnu";
/// Debian's rustc-web and cargo-web (rustup's proxies come first on PATH).
const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
const DEBIAN_CARGO: &str = "/usr/bin/cargo";
/// The cross C compiler the headers name (`$(CROSS_COMPILE)gcc-12`) and the linker.
const CROSS_GCC: &str = "aarch64-linux-gnu-gcc-12";
const CROSS_PREFIX: &str = "aarch64-linux-gnu-";
/// The test binaries put in the guest.
const TEST_BINS: &[&str] = &["linux-glue-dma-test", "linux-glue-kmod-test"];
/// Kernel modules of the swap soak (zram and what it needs).
const SOAK_MODULES: &[&str] = &["zram"];

/// QEMU's `virt` with the SMMUv3 in front of its PCIe root complex and edu at slot 2.
fn machine_args() -> Vec<String> {
    [
        "-M",
        "virt,iommu=smmuv3,gic-version=3",
        "-cpu",
        "cortex-a57",
        "-icount",
        "shift=0,sleep=off",
        "-device",
        "edu,addr=2,dma_mask=0xffffffffffffffff",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The guest's /init. `soak=N` on the kernel command line reaches it as an environment
/// variable (the kernel passes unknown `name=value` parameters to init).
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
say "INFO kernel $(uname -r) $(uname -m), $(nproc) CPUs, $(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) MiB, THP $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
dmesg | grep -E 'arm-smmu-v3|iommu: ' | sed 's/^/  dmesg| /'
EDU=/sys/bus/pci/devices/0000:00:02.0
if insmod /lib/modules/nprdma.ko 2>/tmp/e; then
  if [ -c /dev/nprdma-glue ] && [ -e /sys/bus/pci/drivers/nprdma-edu/0000:00:02.0 ] && [ -e $EDU/iommu_group ]; then
    say "PASS insmod: /dev/nprdma-glue; edu $(cat $EDU/vendor):$(cat $EDU/device) bound to nprdma-edu, iommu group $(basename $(readlink $EDU/iommu_group)), irq $(cat $EDU/irq)"
  else
    fail "insmod: loaded, but the device node, the edu binding or its iommu group is missing"
  fi
else
  fail "insmod: $(cat /tmp/e)"
fi
/opt/nprdma/linux-glue-dma-test || FAILED=1
if [ "${soak:-0}" -gt 0 ]; then
  # Swap: a zram disk; memory pressure: a cgroup v2 memory.max below the soak's buffer.
  for m in $(cat /etc/soak-modules); do insmod /lib/modules/$m 2>>/tmp/soak.err; done
  if echo 1G > /sys/block/zram0/disksize && mkswap /dev/zram0 >/dev/null && swapon /dev/zram0 \
     && mkdir -p /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup \
     && echo +memory > /sys/fs/cgroup/cgroup.subtree_control && mkdir -p /sys/fs/cgroup/soak \
     && echo 96M > /sys/fs/cgroup/soak/memory.max; then
    say "INFO soak: swap $(awk '/SwapTotal/ {print int($2 / 1024)}' /proc/meminfo) MiB on zram, cgroup memory.max $(cat /sys/fs/cgroup/soak/memory.max)"
    sh -c 'echo $$ > /sys/fs/cgroup/soak/cgroup.procs && exec /opt/nprdma/linux-glue-dma-test --soak "$0" --mib 256' "$soak" || FAILED=1
    say "INFO soak: pswpin $(awk '/^pswpin/ {print $2}' /proc/vmstat) pswpout $(awk '/^pswpout/ {print $2}' /proc/vmstat), memory.events: $(tr '\n' ' ' < /sys/fs/cgroup/soak/memory.events)"
    swapoff /dev/zram0
  else
    fail "soak: no swap or cgroup: $(cat /tmp/soak.err)"
  fi
fi
/opt/nprdma/linux-glue-kmod-test --rmmod || FAILED=1
if insmod /lib/modules/nprdma.ko 2>/tmp/e && rmmod nprdma 2>>/tmp/e; then
  say "PASS reload: insmod and rmmod again (edu bound and released)"
else
  fail "reload: $(cat /tmp/e)"
fi
dmesg > /tmp/dmesg
if grep -E 'WARNING|BUG|Oops|general protection|Call Trace|Call trace|circular locking|inconsistent lock state|recursive locking|lockdep|sleeping function called from invalid context|arm-smmu-v3.*event|Unhandled context fault' /tmp/dmesg > /tmp/bad; then
  fail "dmesg: $(wc -l < /tmp/bad) line(s) with a warning, bug, oops, lock report or SMMU event"
  sed 's/^/  dmesg| /' /tmp/bad | head -n 60
else
  say "PASS dmesg: no WARNING, BUG, Oops, call trace, lockdep report or arm-smmu-v3 event in $(wc -l < /tmp/dmesg) lines"
fi
grep -E 'nprdma' /tmp/dmesg | sed 's/^/  dmesg| /' | head -n 12
if [ $FAILED = 0 ]; then say "VERDICT PASS"; else say "VERDICT FAIL"; fi
sync
poweroff -f
"#;

fn cache_dir() -> PathBuf {
    workspace_root().join("target").join("kernel-test-arm64")
}

/// The kernel package `linux-image-arm64` depends on, and its version.
fn kernel_package(apt: &AptState) -> Result<(String, String), XtaskError> {
    let find = || -> Result<Option<(String, String)>, XtaskError> {
        let deps = apt.cache_query(&["depends", "linux-image-arm64"])?;
        let Some(k) = deps.lines().find_map(|l| {
            l.trim()
                .strip_prefix("Depends: ")
                .filter(|p| p.starts_with("linux-image-") && p.ends_with("-arm64"))
                .map(str::to_string)
        }) else {
            return Ok(None);
        };
        let show = apt.cache_query(&["show", "--no-all-versions", &k])?;
        Ok(show
            .lines()
            .find_map(|l| l.strip_prefix("Version: "))
            .map(|v| (k.clone(), v.trim().to_string())))
    };
    if let Some(k) = find()? {
        return Ok(k);
    }
    apt.update(true)?;
    find()?.ok_or_else(|| other("apt (arm64) knows no linux-image-arm64"))
}

/// The installed version of a Debian package (`dpkg-query`).
fn installed_version(name: &str) -> Result<String, XtaskError> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", name])
        .output()
        .map_err(|error| XtaskError::Spawn {
            what: "dpkg-query".into(),
            error,
        })?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() && !v.is_empty() {
        Ok(v)
    } else {
        Err(XtaskError::MissingTool {
            tool: name.to_string(),
            package: "rustc-web",
        })
    }
}

/// Cross-builds the guest's test binaries; returns their paths in [`TEST_BINS`] order.
fn build_test_bins(sysroot: &Path) -> Result<Vec<PathBuf>, XtaskError> {
    let target_dir = workspace_root().join("target").join("cross");
    let mut cmd = Command::new(DEBIAN_CARGO);
    cmd.current_dir(workspace_root())
        .env("RUSTC", DEBIAN_RUSTC)
        .env("CARGO_TARGET_DIR", &target_dir)
        .env(
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
            format!("{CROSS_PREFIX}gcc"),
        )
        .env(
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
            format!(
                "--sysroot {} -C target-feature=+crt-static",
                sysroot.display()
            ),
        )
        .env_remove("CARGO")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .args(["build", "--quiet", "--release", "--target", RUST_TARGET])
        .args(["-p", "linux-glue"]);
    for b in TEST_BINS {
        cmd.args(["--bin", b]);
    }
    run_status("cargo build (aarch64 test binaries)", &mut cmd)?;
    TEST_BINS
        .iter()
        .map(|b| {
            let p = target_dir.join(RUST_TARGET).join("release").join(b);
            if p.is_file() {
                Ok(p)
            } else {
                Err(other(format!("the build made no {}", p.display())))
            }
        })
        .collect()
}

fn build_initramfs(
    stage: &Path,
    moddir: &Path,
    ko: &Path,
    bins: &[PathBuf],
    out: &Path,
) -> Result<(), XtaskError> {
    let mut cpio = Cpio::new();
    for d in ["proc", "sys", "dev", "tmp", "run", "etc", "opt/nprdma"] {
        cpio.dir(d);
    }
    cpio.file("bin/busybox", 0o755, &read(&stage.join("bin/busybox"))?);
    cpio.file("lib/modules/nprdma.ko", 0o644, &read(ko)?);
    for b in bins {
        let name = b.file_name().unwrap_or_default().to_string_lossy();
        cpio.file(&format!("opt/nprdma/{name}"), 0o755, &read(b)?);
    }
    let order = module_order(moddir, SOAK_MODULES)?;
    let mut list = String::new();
    for rel in &order {
        let guest = format!(
            "soak/{}",
            rel.file_name().unwrap_or_default().to_string_lossy()
        );
        cpio.file(
            &format!("lib/modules/{guest}"),
            0o644,
            &read(&moddir.join(rel))?,
        );
        list.push_str(&guest);
        list.push('\n');
    }
    cpio.file("etc/soak-modules", 0o644, list.as_bytes());
    cpio.file("init", 0o755, GUEST_INIT.as_bytes());
    std::fs::write(out, cpio.finish()).map_err(|e| other(format!("{}: {e}", out.display())))
}

/// The arm64 guest: build, boot, evaluate.
pub fn run(opts: &Options) -> Result<(), XtaskError> {
    let started = Instant::now();
    let qemu = require_tool("qemu-system-aarch64", "qemu-system-arm")?;
    require_tool("apt-get", "apt")?;
    require_tool("dpkg-deb", "dpkg")?;
    require_tool("make", "make")?;
    require_tool(CROSS_GCC, "gcc-12-aarch64-linux-gnu")?;
    require_tool(&format!("{CROSS_PREFIX}gcc"), "gcc-aarch64-linux-gnu")?;
    require_tool(&format!("{CROSS_PREFIX}nm"), "binutils-aarch64-linux-gnu")?;
    require_tool(DEBIAN_CARGO, "cargo-web")?;
    let cache = cache_dir();

    section(
        "kernel-test arm64: Debian arm64 kernel, headers, busybox and Rust std (cached in target/kernel-test-arm64)",
    );
    let apt = AptState::new(cache.join("apt"), "arm64");
    apt.update(false)?;
    let (kernel, version) = kernel_package(&apt)?;
    let (abi, series) = crate::kernel_test::abi_and_series(&kernel, "arm64")
        .ok_or_else(|| other(format!("cannot read the kernel ABI from `{kernel}`")))?;
    let pinned = |name: String, v: &str| Wanted {
        name,
        version: Some(v.to_string()),
    };
    let rust_version = installed_version("rustc-web")?;
    let foreign = vec![
        pinned(kernel.clone(), &version),
        pinned(format!("linux-headers-{abi}-arm64"), &version),
        Wanted::any("busybox-static"),
        pinned("libstd-rust-web-dev".into(), &rust_version),
    ];
    let host = vec![
        pinned(format!("linux-headers-{abi}-common"), &version),
        pinned(format!("linux-kbuild-{series}"), &version),
    ];
    let debs_dir = cache.join("debs");
    let mut debs = guest::fetch_packages_from(&debs_dir, &foreign, Some(&apt))?;
    debs.extend(guest::fetch_packages(&debs_dir, &host)?);
    guest::unpack(&cache, &debs, &|name| {
        if name.starts_with("linux-image-") {
            "kernel"
        } else if name.starts_with("linux-headers-") || name.starts_with("linux-kbuild-") {
            "headers"
        } else if name.starts_with("libstd-rust") {
            "rust"
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
        "kernel-test arm64: build nprdma.ko against linux-headers-{kver} ({CROSS_GCC})"
    ));
    let cross = format!("CROSS_COMPILE={CROSS_PREFIX}");
    let ko = build_module(&hdir, &cache.join("module"), &["ARCH=arm64", &cross])?;
    let out = Command::new(format!("{CROSS_PREFIX}nm"))
        .arg("-u")
        .arg(&ko)
        .output()
        .map_err(|error| XtaskError::Spawn {
            what: "nm -u".into(),
            error,
        })?;
    let imports: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last().map(str::to_string))
        .collect();
    let pins: Vec<&String> = imports
        .iter()
        .filter(|s| PINNING_SYMBOLS.contains(&s.as_str()))
        .collect();
    if !out.status.success() || imports.is_empty() || !pins.is_empty() {
        return Err(other(format!(
            "nprdma.ko (arm64): nm -u failed or it imports page-pinning functions: {pins:?}"
        )));
    }
    let iommu: Vec<&str> = imports
        .iter()
        .map(String::as_str)
        .filter(|s| s.starts_with("iommu_"))
        .collect();
    println!(
        "xtask: nprdma.ko (arm64) imports {} symbols, no get_user_pages/pin_user_pages; IOMMU ones: {}",
        imports.len(),
        iommu.join(", ")
    );
    println!("xtask: {}", debug_config_note(&hdir));

    section(
        "kernel-test arm64: cross-build the test binaries (rustc-web, aarch64-unknown-linux-gnu, static)",
    );
    let bins = build_test_bins(&cache.join("rust/usr"))?;

    let moddir = kdir.join("lib/modules").join(&kver);
    let initrd = cache.join("initramfs.cpio");
    build_initramfs(&cache.join("stage"), &moddir, &ko, &bins, &initrd)?;
    println!(
        "xtask: guest kernel {kver}, initramfs {} MiB, prepared in {:.1} s; soak {} transfers",
        std::fs::metadata(&initrd)
            .map(|m| m.len() >> 20)
            .unwrap_or(0),
        started.elapsed().as_secs_f64(),
        opts.soak
    );

    section(
        "kernel-test arm64: boot, insmod, test (qemu-system-aarch64 virt + SMMUv3 + edu, icount)",
    );
    let log = cache.join("last-run.log");
    let boot = Instant::now();
    let vmlinuz = kdir.join("boot").join(format!("vmlinuz-{kver}"));
    let lines = guest::run_vm_on(
        &Vm {
            qemu: &qemu,
            vmlinuz: &vmlinuz,
            initrd: &initrd,
            accel: "tcg (icount)",
            smp: 2,
            memory_mib: 1024,
            append: format!("console=ttyAMA0 panic=-1 loglevel=3 soak={}", opts.soak),
            timeout: opts.timeout.unwrap_or(DEFAULT_TIMEOUT_ARM64),
            log: &log,
            show: |line| {
                line.starts_with("NPRDMA-")
                    || line.starts_with("  dmesg|")
                    || line.contains("Kernel panic")
            },
        },
        &machine_args(),
    )?;
    let verdict = evaluate(&lines);
    println!(
        "xtask: kernel-test arm64 finished in {:.0} s (guest {:.0} s; full serial log: {})",
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
    fn the_arm64_kernel_package_names_its_abi_and_series() {
        assert_eq!(
            crate::kernel_test::abi_and_series("linux-image-6.1.0-57-arm64", "arm64"),
            Some(("6.1.0-57".into(), "6.1".into()))
        );
        assert_eq!(
            crate::kernel_test::abi_and_series("linux-image-6.1.0-57-amd64", "arm64"),
            None
        );
        assert_eq!(
            crate::kernel_test::abi_and_series("linux-image-arm64", "arm64"),
            None
        );
    }

    #[test]
    fn the_guest_machine_widens_edus_dma_mask_and_uses_icount() {
        let args = machine_args().join(" ");
        assert!(args.contains("iommu=smmuv3"), "{args}");
        assert!(args.contains("dma_mask=0xffffffffffffffff"), "{args}");
        assert!(args.contains("-icount shift=0,sleep=off"), "{args}");
    }

    #[test]
    fn the_guest_log_check_catches_smmu_events() {
        let pattern = GUEST_INIT
            .lines()
            .find(|l| l.contains("grep -E 'WARNING"))
            .expect("the dmesg check");
        assert!(pattern.contains("arm-smmu-v3.*event"));
        assert!(
            pattern.contains("Call trace"),
            "arm64 spells it with a small t"
        );
    }
}
