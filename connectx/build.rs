//! Links the cdylib against the system libibverbs (the runtime library, so only libibverbs1 is
//! needed to build): `dlvsym(RTLD_NEXT, ...)` then always finds libibverbs after us, even when
//! the application loads it late with dlopen. The rlib (tests, the CLI) does not link it.
//!
//! Cargo builds the cdylib even when the crate is only a dependency (of the `nprdma` CLI), and
//! the CLI must build on a machine with nothing but Rust. So when libibverbs.so.1 is not
//! installed the cdylib is linked without it (it still works for applications that link
//! libibverbs themselves) and the build says so.

use std::path::Path;

/// Where Debian and other multiarch/FHS systems keep the runtime library.
const SEARCH: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib64",
    "/lib",
];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let found = SEARCH
        .iter()
        .map(|d| Path::new(d).join("libibverbs.so.1"))
        .find(|p| p.exists());
    for d in SEARCH {
        println!("cargo::rerun-if-changed={d}/libibverbs.so.1");
    }
    match found {
        Some(_) => {
            println!("cargo::rustc-cdylib-link-arg=-Wl,--push-state,--no-as-needed");
            println!("cargo::rustc-cdylib-link-arg=-l:libibverbs.so.1");
            println!("cargo::rustc-cdylib-link-arg=-Wl,--pop-state");
        }
        None => println!(
            "cargo::warning=libibverbs.so.1 not found (Debian package libibverbs1): libnprdma.so is \
             built without a link to it and works only in applications that link libibverbs"
        ),
    }
}
