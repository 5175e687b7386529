//! Gives every firmware program its linker script, but only for bare-metal builds: the host
//! build of the same binaries (for `cargo clippy --all-targets` and `cargo test`) links as a
//! normal host program.

use std::env;
use std::fs;
use std::path::Path;

/// The linker script of a program: its platform's script under `link/`. ZynqMP programs are
/// named `zynqmp-*` and link into DDR at EL3 (`link/zynqmp.ld`); the rest are QEMU `virt`
/// programs (`link/virt.ld`).
fn script_for(program: &str) -> &'static str {
    if program.starts_with("zynqmp-") {
        "zynqmp.ld"
    } else {
        "virt.ld"
    }
}

fn main() {
    println!("cargo:rerun-if-changed=link");
    println!("cargo:rerun-if-changed=src/bin");
    if env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("none") {
        return;
    }
    let manifest_dir = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let manifest_dir = Path::new(&manifest_dir);
    // The `.defmt` section of format strings (the script comes with the defmt crate).
    println!("cargo:rustc-link-arg-bins=-Tdefmt.x");
    let bins = fs::read_dir(manifest_dir.join("src/bin")).expect("firmware/src/bin is readable");
    for entry in bins {
        let path = entry.expect("firmware/src/bin entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let Some(program) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        let script = manifest_dir.join("link").join(script_for(program));
        assert!(
            script.is_file(),
            "firmware program `{program}` needs the linker script {}",
            script.display()
        );
        println!("cargo:rustc-link-arg-bin={program}=-T{}", script.display());
    }
}
