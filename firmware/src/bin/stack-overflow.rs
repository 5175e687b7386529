//! `stack-overflow`: a program that must fail with its fault reported. It recurses until its
//! stack pointer is past the bottom of the program stack. The runtime leaves an unmapped
//! guard page there, so the first store into it takes a translation fault, which the
//! exception handler (on its own stack) reports with ESR, ELR and FAR. Without the guard the
//! recursion would run on through the exception stack into `.bss` (where the live
//! translation tables are) and come back to print a plain FAIL verdict, without a syndrome,
//! which `cargo xtask test` rejects.
//!
//! Run it with `cargo xtask qemu stack-overflow` (expect a failure).
#![cfg_attr(target_os = "none", no_std, no_main)]

#[cfg(all(target_arch = "aarch64", target_os = "none"))]
mod target {
    use firmware::platform::virt;
    use firmware::{Boot, Verdict, println};

    firmware::program!("stack-overflow", virt::PLATFORM, run);

    unsafe extern "C" {
        static __stack_bottom: u8;
    }

    #[inline(always)]
    fn sp() -> u64 {
        hal::sysreg::stack_pointer()
    }

    /// Recurses with a 1 KiB frame until the stack pointer is below `target`; returns the
    /// lowest stack pointer reached.
    #[inline(never)]
    fn dive(target: u64) -> u64 {
        let mut frame = [0xa5u8; 1024];
        core::hint::black_box(&mut frame);
        let here = sp();
        let lowest = if here > target { dive(target) } else { here };
        core::hint::black_box(&frame);
        lowest
    }

    fn run(_boot: &Boot) -> Verdict {
        let bottom = core::ptr::addr_of!(__stack_bottom) as u64;
        // Past the 4 KiB guard below the program stack.
        let target = bottom - 8 * 1024;
        println!(
            "stack-overflow: recursing below the program stack's bottom {bottom:#x}; \
             expect a data abort in the guard page below it"
        );
        let lowest = dive(target);
        Verdict::fail(format_args!(
            "stack-overflow: the stack reached {lowest:#x}, {} bytes below its bottom, and \
             nothing faulted",
            bottom - lowest
        ))
    }
}

#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!(
        "stack-overflow runs on aarch64 bare metal: use `cargo xtask qemu stack-overflow` \
         (it is meant to fail)"
    );
    std::process::exit(2);
}
