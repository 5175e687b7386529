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
        name: "gcc-12",
        why: "the compiler Debian's kernel headers name (CC = gcc-12): kernel-test builds nprdma.ko with it",
    },
    Package {
        name: "gcc-aarch64-linux-gnu",
        why: "aarch64-linux-gnu-gcc(-12) and binutils: kernel-test cross-builds nprdma.ko for Debian's arm64 kernel and links the arm64 guest's test binaries",
    },
    Package {
        name: "libc6-dev-arm64-cross",
        why: "the arm64 glibc the arm64 guest's test binaries are linked statically against",
    },
    Package {
        name: "make",
        why: "kbuild: kernel-test builds nprdma.ko out of tree against Debian's headers",
    },
    Package {
        name: "libelf1",
        why: "objtool from linux-kbuild runs on nprdma.ko's objects and links libelf",
    },
    Package {
        name: "linux-libc-dev",
        why: "<linux/types.h> and <linux/ioctl.h>: linux-glue's test compiles the kernel module's ABI header in user space",
    },
    Package {
        name: "device-tree-compiler",
        why: "dtc -@: fpga-bitstreams compiles the NPE device-tree overlay (warnings are errors)",
    },
    Package {
        name: "xilinx-bootgen",
        why: "bootgen: `cargo xtask image` makes BOOT.BIN and checks the bitstream's .bin against bootgen's",
    },
    Package {
        name: "libibverbs-dev",
        why: "rdma-core headers: connectx's layout test checks its ABI declarations against them",
    },
    Package {
        name: "librdmacm-dev",
        why: "<rdma/rdma_cma.h>: connectx's layout test checks its librdmacm declarations (the control connection) against it",
    },
    Package {
        name: "verilator",
        why: "lints NPE's RTL (`cargo xtask synth`, verilator --lint-only -Wall)",
    },
    Package {
        name: "yosys",
        why: "synthesizes NPE's RTL for the ZynqMP (`cargo xtask synth`, synth_xilinx -family xcup)",
    },
    Package {
        name: "xz-utils",
        why: "xz -dc: rxe-test's second guest kernel (trixie-backports) ships its modules as .ko.xz, and busybox insmod loads plain ones",
    },
    Package {
        name: "debian-archive-keyring",
        why: "the archive keys that check the trixie-backports lists of rxe-test's private apt state (target/rxe-odp/apt)",
    },
    Package {
        name: "libibverbs1",
        why: "libibverbs.so.1, which libnprdma.so links against",
    },
];

/// Whether a dpkg `Status` (`<want> <error> <state>`, e.g. `install ok installed` or, for a
/// package on hold, `hold ok installed`) says the package is installed.
fn status_installed(status: &str) -> bool {
    let mut words = status.split_whitespace();
    let (_want, error, state) = (words.next(), words.next(), words.next());
    error == Some("ok") && state == Some("installed")
}

/// Whether dpkg says `name` is installed.
fn installed(name: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", name])
        .output()
        .map(|o| o.status.success() && status_installed(&String::from_utf8_lossy(&o.stdout)))
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
    // QEMU's system emulators depend on exactly their own version of qemu-system-common and
    // qemu-system-data, and qemu-utils and qemu-block-extra must match those; some machines
    // carry QEMU packages from backports, and then the emulators must come from there too.
    let (qemu, rest): (Vec<&str>, Vec<&str>) =
        names.iter().partition(|n| n.starts_with("qemu-system-"));
    let qemu_suite = if qemu.is_empty() {
        None
    } else {
        QEMU_COMPANIONS.iter().find_map(|p| backports_suite_of(p))
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

/// Packages that must have the same version as QEMU's system emulators.
const QEMU_COMPANIONS: &[&str] = &[
    "qemu-system-common",
    "qemu-system-data",
    "qemu-utils",
    "qemu-block-extra",
];

/// Whether a one-line-style sources file (`sources.list(5)`) has an enabled `deb` line for
/// exactly `suite` (the field after the URI; options in brackets may come first).
fn one_line_sources_name(text: &str, suite: &str) -> bool {
    text.lines().any(|line| {
        let line = line.split('#').next().unwrap_or("");
        let mut words = line.split_whitespace();
        if words.next() != Some("deb") {
            return false;
        }
        let mut rest = words.peekable();
        if rest.peek().is_some_and(|w| w.starts_with('[')) {
            // Skip the `[ option=value ... ]` block, which may span several words.
            for w in rest.by_ref() {
                if w.ends_with(']') {
                    break;
                }
            }
        }
        let _uri = rest.next();
        rest.next() == Some(suite)
    })
}

/// Whether a deb822 sources file (`sources.list(5)`) has a stanza of type `deb` that lists
/// exactly `suite` and is not `Enabled: no`.
fn deb822_sources_name(text: &str, suite: &str) -> bool {
    text.split("\n\n").any(|stanza| {
        let field = |name: &str| {
            stanza
                .lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .find_map(|l| {
                    let (key, value) = l.split_once(':')?;
                    key.trim()
                        .eq_ignore_ascii_case(name)
                        .then(|| value.trim().to_string())
                })
        };
        let has = |name: &str, word: &str| {
            field(name).is_some_and(|v| v.split_whitespace().any(|w| w == word))
        };
        has("Types", "deb")
            && has("Suites", suite)
            && !field("Enabled").is_some_and(|v| v.eq_ignore_ascii_case("no"))
    })
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
    if !out.status.success() || !status_installed(status) || !version.contains("~bpo") {
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

/// Makes sure apt knows `suite` from the Debian archive (adds a sources file if no enabled
/// source names it).
fn ensure_suite_source(suite: &str) -> Result<(), XtaskError> {
    let mut files = vec![std::path::PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        files.extend(dir.filter_map(|e| e.ok()).map(|e| e.path()));
    }
    let known = files.iter().any(|f| {
        // apt reads only `*.list` (one-line style) and `*.sources` (deb822) files there; a
        // `.list.save` or `.disabled` copy that names the suite does not make it known.
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let Ok(text) = std::fs::read_to_string(f) else {
            return false;
        };
        if name.ends_with(".list") {
            one_line_sources_name(&text, suite)
        } else if name.ends_with(".sources") {
            deb822_sources_name(&text, suite)
        } else {
            false
        }
    });
    if known {
        return Ok(());
    }
    let path = format!("/etc/apt/sources.list.d/nprdma-{suite}.sources");
    println!("adding {suite} to apt's sources ({path}): installed QEMU packages come from it");
    let body = format!(
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: {suite}\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    );
    std::fs::write(&path, body)
        .map_err(|e| XtaskError::CannotInstall(format!("cannot write {path}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_package_on_hold_is_installed() {
        assert!(status_installed("install ok installed"));
        assert!(status_installed("hold ok installed"));
        assert!(!status_installed("deinstall ok config-files"));
        assert!(!status_installed("install reinstreq half-installed"));
        assert!(!status_installed(""));
    }

    const SUITE: &str = "bookworm-backports";

    #[test]
    fn one_line_sources_match_the_suite_exactly_and_only_when_enabled() {
        let yes = [
            "deb http://deb.debian.org/debian bookworm-backports main",
            "deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://x/debian bookworm-backports main",
            "deb [ arch=amd64 ] http://x/debian bookworm-backports main # comment",
        ];
        for line in yes {
            assert!(one_line_sources_name(line, SUITE), "{line}");
        }
        let no = [
            "# deb http://deb.debian.org/debian bookworm-backports main",
            "deb-src http://deb.debian.org/debian bookworm-backports main",
            "deb http://deb.debian.org/debian bookworm-backports-sloppy main",
            "deb http://deb.debian.org/debian bookworm main # bookworm-backports later",
            "deb http://deb.debian.org/debian bookworm main",
        ];
        for line in no {
            assert!(!one_line_sources_name(line, SUITE), "{line}");
        }
    }

    #[test]
    fn deb822_sources_need_an_enabled_deb_stanza_with_the_suite() {
        let enabled = "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates bookworm-backports\nComponents: main\n";
        assert!(deb822_sources_name(enabled, SUITE));
        let two = format!("Types: deb\nSuites: bookworm\n\n{enabled}");
        assert!(deb822_sources_name(&two, SUITE));
        let disabled = format!("{enabled}Enabled: no\n");
        assert!(!deb822_sources_name(&disabled, SUITE));
        let src_only = "Types: deb-src\nSuites: bookworm-backports\n";
        assert!(!deb822_sources_name(src_only, SUITE));
        let sloppy = "Types: deb\nSuites: bookworm-backports-sloppy\n";
        assert!(!deb822_sources_name(sloppy, SUITE));
        let commented = "Types: deb\n# Suites: bookworm-backports\nSuites: bookworm\n";
        assert!(!deb822_sources_name(commented, SUITE));
    }
}
