//! Verilates NPE's RTL (`../rtl`, top `npe_top`) and compiles the C++ model, Verilator's
//! runtime and the C shim (`csrc/npe_shim.cpp`) into a static library with the `cc` crate.
//! Needs `verilator` (Debian package `verilator`, installed by `cargo xtask setup`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The engine's Verilog files, top first: `rtl/sources.f`, the one list xtask's synthesis
/// reads too (the `.vh` files are included by the modules).
fn sources(rtl: &Path) -> Vec<PathBuf> {
    let list = std::fs::read_to_string(rtl.join("sources.f")).expect("rtl/sources.f exists");
    list.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| rtl.join(l))
        .collect()
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let rtl = manifest.join("..").join("rtl");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    let obj = out.join("verilated");
    println!("cargo:rerun-if-changed={}", rtl.display());
    println!("cargo:rerun-if-changed=csrc/npe_shim.cpp");
    for entry in std::fs::read_dir(&rtl).expect("fpga-bitstreams/rtl exists") {
        let path = entry.expect("readable directory").path();
        println!("cargo:rerun-if-changed={}", path.display());
    }
    let _ = std::fs::remove_dir_all(&obj);
    let status = Command::new("verilator")
        .args(["--cc", "-O3", "--top-module", "npe_top", "-Wno-fatal"])
        // 64 receive slots, as the model (`rig::SLOTS_LOG2`).
        .arg("-GSLOTS_LOG2=6")
        .arg(format!("-I{}", rtl.display()))
        .arg("--Mdir")
        .arg(&obj)
        .args(sources(&rtl))
        .status()
        .expect(
            "`verilator` not found: install the Debian package `verilator` (`cargo xtask setup`)",
        );
    assert!(status.success(), "verilator failed on fpga-bitstreams/rtl");

    let include = verilator_include();
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .opt_level(2)
        .warnings(false)
        .include(&obj)
        .include(&include)
        .include(include.join("vltstd"))
        .file(include.join("verilated.cpp"))
        .file(include.join("verilated_threads.cpp"))
        .file(manifest.join("csrc").join("npe_shim.cpp"));
    for entry in std::fs::read_dir(&obj).expect("verilator wrote its output") {
        let path = entry.expect("readable directory").path();
        if path.extension().is_some_and(|e| e == "cpp") {
            build.file(path);
        }
    }
    build.compile("npe_verilated");
    println!("cargo:rustc-link-lib=pthread");
}

/// Verilator's runtime sources: `verilator --getenv VERILATOR_ROOT` + `/include`.
fn verilator_include() -> PathBuf {
    let out = Command::new("verilator")
        .args(["--getenv", "VERILATOR_ROOT"])
        .output()
        .expect("verilator runs");
    let root = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let dir = Path::new(&root).join("include");
    assert!(
        dir.join("verilated.cpp").is_file(),
        "Verilator's runtime is not at {}",
        dir.display()
    );
    dir
}
