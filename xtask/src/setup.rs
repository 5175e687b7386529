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
    run_status(
        "apt-get update",
        Command::new("apt-get")
            .args(["-q", "-o", "Dpkg::Use-Pty=0", "update"])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    run_status(
        "apt-get install",
        Command::new("apt-get")
            .args(["-q", "-y", "-o", "Dpkg::Use-Pty=0", "install"])
            .args(&names)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
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
