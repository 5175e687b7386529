//! `fault-probe`: a program that must fail. It reads an address outside the runtime's
//! identity map, which raises a synchronous data abort (translation fault); the exception
//! handler prints ESR, ELR and FAR and a FAIL verdict. The harness uses it to check that a
//! faulting firmware makes `cargo xtask qemu` fail with the syndrome printed.
//!
//! Run it with `cargo xtask qemu fault-probe` (expect a failure).
#![cfg_attr(target_os = "none", no_std, no_main)]

#[cfg(all(target_arch = "aarch64", target_os = "none"))]
mod target {
    use firmware::platform::virt;
    use firmware::{Boot, Verdict};

    firmware::program!("fault-probe", virt::PLATFORM, run);

    fn run(boot: &Boot) -> Verdict {
        // The first address past the mapped range: beyond 2^39 there are no translation
        // tables, so the load takes a translation fault at the current EL.
        let addr = boot.map.mapped_limit;
        defmt::info!(
            "fault-probe: reading {=u64:#x} (outside the identity map); expect a data abort \
             report and a FAIL verdict",
            addr
        );
        let value: u64;
        // SAFETY: deliberately faulting load. It is inline assembly, not a Rust
        // dereference, so the compiler assumes nothing about the address; the exception
        // handler reports the abort and powers off, so execution does not continue here.
        unsafe {
            core::arch::asm!(
                "ldr {value}, [{addr}]",
                addr = in(reg) addr,
                value = out(reg) value,
                options(nostack, readonly),
            )
        };
        Verdict::fail(format_args!(
            "fault-probe: read of {addr:#x} returned {value:#x} instead of faulting"
        ))
    }
}

#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!(
        "fault-probe runs on aarch64 bare metal: use `cargo xtask qemu fault-probe` \
         (it is meant to fail)"
    );
    std::process::exit(2);
}
