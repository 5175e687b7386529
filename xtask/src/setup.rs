//! `cargo xtask setup`: the Debian packages the project needs, installed idempotently.
//!
//! Why each package is needed is part of its entry; docs/toolchains.md has the background.
//! rustup cannot add targets on the build machines (no network to its servers), so bare-metal
//! builds use Debian's second Rust toolchain (rustc-web) with the standard library's source.

use std::process::Command;

use crate::util::{XtaskError, run_status, which};

/// A Debian package and why we need it.
pub struct Package {
    /// Debian package name.
    pub name: &'static str,
    /// What it is for.
    pub why: &'static str,
}

/// Everything any xtask command needs.
pub const ALL_PACKAGES: &[Package] = &[
    Package {
        name: "rustc-web",
        why: "Rust 1.96 that can build core/alloc for aarch64-unknown-none (-Zbuild-std)",
    },
    Package {
        name: "cargo-web",
        why: "the cargo that goes with rustc-web",
    },
    Package {
        name: "rust-web-src",
        why: "the standard library source -Zbuild-std compiles",
    },
    Package {
        name: "lld",
        why: "ld.lld links the bare-metal ELF images",
    },
    Package {
        name: "qemu-system-arm",
        why: "qemu-system-aarch64 runs the firmware tests on virt + SMMUv3 + edu",
    },
    Package {
        name: "qemu-system-x86",
        why: "qemu-system-x86_64 boots the Debian guest of rxe-test (Soft-RoCE)",
    },
    Package {
        name: "gcc",
        why: "cc: compiles connectx's layout probe (tools/layout-probe.c); rustup's Rust links with it too",
    },
    Package {
        name: "libibverbs-dev",
        why: "rdma-core headers: connectx's layout test checks its ABI declarations against them",
    },
    Package {
        name: "libibverbs1",
        why: "libibverbs.so.1, which libnprdma.so links against",
    },
];

/// Whether dpkg says `name` is installed.
fn installed(name: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", name])
        .output()
        .map(|o| {
            o.status.success()
                && String::from_utf8_lossy(&o.stdout).contains("install ok installed")
        })
        .unwrap_or(false)
}

/// Installs whatever of `packages` is missing; prints nothing when all are present.
pub fn ensure_packages(packages: &[Package]) -> Result<(), XtaskError> {
    if which("dpkg-query").is_none() {
        return Err(XtaskError::CannotInstall(
            "this is not a Debian system (no dpkg-query): install the packages in docs/toolchains.md by hand".into(),
        ));
    }
    let missing: Vec<&Package> = packages.iter().filter(|p| !installed(p.name)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = missing.iter().map(|p| p.name).collect();
    // `id -u` rather than a libc dependency for one call.
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if !is_root {
        return Err(XtaskError::CannotInstall(format!(
            "missing Debian packages: {}; run `cargo xtask setup` as root or `sudo apt-get install -y {}`",
            names.join(", "),
            names.join(" ")
        )));
    }
    println!("installing Debian packages:");
    for p in &missing {
        println!("  {:<16} {}", p.name, p.why);
    }
    // QEMU's system emulators must come from the same Debian suite as an installed qemu-utils
    // (they share qemu-system-common's version); some machines carry qemu-utils from backports.
    let (qemu, rest): (Vec<&str>, Vec<&str>) =
        names.iter().partition(|n| n.starts_with("qemu-system-"));
    let qemu_suite = if qemu.is_empty() {
        None
    } else {
        backports_suite_of("qemu-utils")
    };
    if let Some(suite) = &qemu_suite {
        ensure_suite_source(suite)?;
    }
    run_status(
        "apt-get update",
        Command::new("apt-get")
            .args(["-q", "-o", "Dpkg::Use-Pty=0", "update"])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    let install = |what: &[&str], suite: Option<&str>| {
        if what.is_empty() {
            return Ok(());
        }
        let mut cmd = Command::new("apt-get");
        cmd.args(["-q", "-y", "-o", "Dpkg::Use-Pty=0", "install"]);
        if let Some(s) = suite {
            cmd.args(["-t", s]);
        }
        run_status(
            "apt-get install",
            cmd.args(what).env("DEBIAN_FRONTEND", "noninteractive"),
        )
    };
    install(&rest, None)?;
    install(&qemu, qemu_suite.as_deref())?;
    let still: Vec<&str> = names.iter().copied().filter(|n| !installed(n)).collect();
    if still.is_empty() {
        Ok(())
    } else {
        Err(XtaskError::CannotInstall(format!(
            "apt-get did not install: {}",
            still.join(", ")
        )))
    }
}

/// The backports suite (`<codename>-backports`) an installed package came from, if it did
/// (Debian marks backported versions `~bpo<release>`).
fn backports_suite_of(package: &str) -> Option<String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}|${Version}", package])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (status, version) = text.split_once('|')?;
    if !out.status.success()
        || !status.contains("install ok installed")
        || !version.contains("~bpo")
    {
        return None;
    }
    let release = std::fs::read_to_string("/etc/os-release").ok()?;
    let codename = release
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))?
        .trim_matches('"')
        .to_string();
    (!codename.is_empty()).then(|| format!("{codename}-backports"))
}

/// Makes sure apt knows `suite` from the Debian archive (adds a sources file if no configured
/// source names it).
fn ensure_suite_source(suite: &str) -> Result<(), XtaskError> {
    let mut files = vec![std::path::PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        files.extend(dir.filter_map(|e| e.ok()).map(|e| e.path()));
    }
    let known = files.iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines()
                .any(|l| !l.trim_start().starts_with('#') && l.contains(suite))
        })
    });
    if known {
        return Ok(());
    }
    let path = format!("/etc/apt/sources.list.d/nprdma-{suite}.sources");
    println!("adding {suite} to apt's sources ({path}): the installed qemu-utils comes from it");
    let body = format!(
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: {suite}\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    );
    std::fs::write(&path, body)
        .map_err(|e| XtaskError::CannotInstall(format!("cannot write {path}: {e}")))
}
