//! A small bare-metal runtime for aarch64 test programs of nprdma, and the portable logic
//! those programs use (device-tree parsing, PCI enumeration, the edu device, page tables,
//! exception decoding), which is unit-tested on the host against device models.
//!
//! # Programs
//! Each program is a binary in `src/bin/NAME.rs`, built for `aarch64-unknown-none` by
//! `cargo xtask firmware NAME` and, for QEMU `virt` programs, run by `cargo xtask qemu NAME`:
//!
//! - `pci-probe`: finds the PCIe ECAM in the device tree, enumerates it, assigns the `edu`
//!   device's BAR0, enables memory decoding and bus mastering, and checks edu's
//!   identification and liveness registers.
//! - `fault-probe`: reads an address outside the identity map on purpose; the exception
//!   handler must report the data abort and fail the run.
//! - `stack-overflow`: recurses past the bottom of the program stack; the unmapped guard page
//!   there must fault, and the exception handler (on its own stack) report it.
//! - `smmuv3-faults`: edu DMA through QEMU's SMMUv3 into a 4 MiB IOVA window that is only
//!   partly mapped; faults are found through the event queue, resolved by a pager and the
//!   transfers retransmitted (also with an overflowing event queue), and an eviction without
//!   TLB invalidation must be caught; see [`smmuv3_faults`] and [`gic`] (edu's interrupt
//!   wakes `wfi`; QEMU runs with `-icount shift=0,sleep=off`).
//! - `zynqmp-smmu-faults` (ZynqMP): the MMU-500 fault scenario of `boards::zynqmp::scenario`
//!   on the real SMMU and GDMA channels 0/1; see [`zynqmp_smmu_faults`] and docs/mmu500.md
//!   for running it on a board. Where no SMMU answers (QEMU `xlnx-zcu102`, which runs it in
//!   CI) it says so and runs checked zDMA copies without it instead ([`zynqmp_zdma`]).
//!
//! # Verdict protocol
//! A run ends with exactly one line `NPRDMA-VERDICT: PASS <summary>` or
//! `NPRDMA-VERDICT: FAIL <reason>` on the console, then power-off (PSCI SYSTEM_OFF through
//! `hvc #0` on `virt`, which makes QEMU exit with status 0; on ZynqMP, which has no PSCI at
//! EL3 without ATF, the CPU waits for interrupts forever after the line). The harness passes
//! a run only if it saw the PASS line and QEMU exited 0. The runtime prints the line: from
//! the value the program's run function returns, from the exception handler (FAIL with the
//! syndrome), or from the panic handler (FAIL with location and message). See [`verdict`].
//!
//! # Logging
//! Two kinds of console lines (docs/architecture.md, "Logging on the target"):
//! - **Plain text** ([`println!`], `core::fmt`): the runtime's boot lines, exception and panic
//!   reports, the verdict line, and the lines a harness parses (`stack-overflow`'s stack
//!   bottom, which xtask checks the fault address against). They must read without tools on
//!   any UART, and must work when nothing else does (an exception inside a log call).
//! - **defmt** for everything a program logs while it runs. The format strings stay in the
//!   ELF; a log call sends a string index, a timestamp (microseconds of the system counter)
//!   and its arguments as raw bytes. defmt's encodings are binary (there is no text mode), so
//!   [`logger`] sends each rzCOBS-encoded frame as one console line `NPRDMA-DEFMT: <hex>`;
//!   `cargo xtask qemu` decodes these lines with `defmt-decoder` and the program's ELF as they
//!   arrive, and `cargo xtask decode` does the same for a capture of a board's UART.
//!
//! Programs call defmt's macros directly. The portable program logic ([`edu::probe`],
//! [`smmuv3_faults::run_scenario`], [`zynqmp_zdma::run_copies`],
//! [`zynqmp_smmu_faults::report_lines`]) reports typed lines ([`edu::ProbeLine`],
//! [`smmuv3_faults::ScenarioLine`], [`zynqmp_zdma::ZdmaLine`],
//! [`zynqmp_smmu_faults::PhaseLine`]) to a sink: `logger::info` on the target (bare-metal
//! builds only), which logs them through their `defmt::Format`, and a closure that collects
//! them in host tests, where their `fmt::Display` gives the same words. Driver crates log
//! through `hal`'s shim (defmt on the target, nothing or `log` on the host), and their error
//! types implement `defmt::Format` on the target.
//!
//! # Boot flow
//! 1. `_start` (assembly in `rt`, linked first at the image base) keeps `x0`, parks all
//!    CPUs but the one with MPIDR.Aff0 = 0, reads `CurrentEL`, enables FP/SIMD
//!    (CPACR_EL1.FPEN = 0b11; also CPTR_EL2.TFP = 0 at EL2, CPTR_EL3 = 0 at EL3), installs
//!    the vector table in VBAR_ELx of the current EL, sets SP_ELx to the 16 KiB exception
//!    stack and SP_EL0 to the 512 KiB program stack (and selects SP_EL0), clears `.bss`
//!    and calls `__firmware_rust_entry(x0, el)`, which [`program!`] defines.
//! 2. `rt::start` sets CPUECTLR_EL1.SMPEN at EL3 on a Cortex-A53/A57 ([`cpu`]), records
//!    the program's [`Platform`] and initialises the console. Entered at EL3 on the ZynqMP
//!    ([`platform::SecureHandoff::ZynqMpNonSecure`]), it does the Secure set-up (GIC-400
//!    groups, `SMMU_REG`, the GDMA's TrustZone classification, the MMU-500's sCR1 partition,
//!    CNTFRQ_EL0) and returns to Non-secure EL2, or EL1 without EL2, on the same stack
//!    ([`secure`], docs/mmu500.md §7a); the boot line says the EL and security state the
//!    program runs in. If the platform uses one, it then looks for a device tree: at the address in `x0`, else at the
//!    platform's fallback (QEMU copies the DTB to the start of RAM for non-Linux ELF images
//!    and leaves `x0` zero). ZynqMP uses none.
//! 3. It builds the identity map (RAM from the device tree's memory nodes, else the
//!    platform's boot RAM; the platform's non-cacheable DMA pool, if any, inside it) and
//!    turns on the MMU with data and instruction caches at the current EL (EL1, EL2 without
//!    VHE, or EL3). Alignment checking is off, so unaligned accesses, atomics and cache
//!    behaviour on normal memory match a normal system.
//! 4. It calls the program's run function with a [`Boot`] and prints the verdict it returns,
//!    then powers off.
//!
//! Every exception (any of the 16 vectors) prints the vector, the decoded exception class,
//! ESR, ELR, FAR, SPSR and x0-x30, then a FAIL verdict, then powers off; the one exception
//! is a data abort on the load of `rt::probe_read32`, a read that finds out whether a
//! device answers at all: the handler returns its syndrome to the caller instead. The
//! runtime assumes it is entered with the MMU and data cache off (as QEMU and a
//! Xilinx-style boot do) and with the image cleaned to memory (all Linux's booting.rst asks
//! of a loader). It writes
//! `.bss`, its statics and its first stack frames with the cache off, then invalidates the
//! whole image's data cache lines (including the translation tables) and the non-cacheable
//! pool before turning the cache on, so clean lines a loader left behind cannot shadow
//! those writes. The image must lie in RAM the
//! identity map makes Normal (whole 2 MiB blocks), or `start` fails with
//! `RegionNotMappable` before the MMU goes on.
//!
//! # Memory map (QEMU `virt`, `link/virt.ld`)
//! | address | what | mapped as |
//! |---|---|---|
//! | `0x0000_0000..0x4000_0000` | flash, GIC, PL011 `0x0900_0000`, SMMUv3 `0x0905_0000`, PCIe MMIO `0x1000_0000..0x3eff_0000` | Device-nGnRnE, execute-never |
//! | `0x4000_0000..0x4020_0000` | the device tree QEMU copies there (1 MiB; QEMU loads none if it does not fit below the image) | Normal write-back |
//! | `0x4020_0000..` | the image: `.text` (entry first, vectors 2 KiB aligned), `.rodata`, `.data`, `.bss` (includes the 6 translation tables), then a guard page, the exception stack (16 KiB), a guard page and the program stack (512 KiB); the guard pages are unmapped | Normal write-back (guard pages unmapped) |
//! | rest of RAM up to its end (256 MiB with `-m 256M`) | free | Normal write-back |
//! | RAM end `..2^39` | high ECAM `0x40_1000_0000`, everything else | Device-nGnRnE, execute-never |
//! | `2^39..` | (beyond the 39-bit VA space) | not mapped: translation fault |
//!
//! # Memory map (ZynqMP, `link/zynqmp.ld`)
//! | address | what | mapped as |
//! |---|---|---|
//! | `0x0000_0000..0x1000_0000` | DDR, unused (Linux/U-Boot load addresses of other boot flows) | Normal write-back |
//! | `0x1000_0000..0x1100_0000` | the image (16 MiB budget, checked by the linker): `.text` (entry first), `.rodata`, `.data`, `.bss`, guard page, exception stack (16 KiB), guard page, program stack (512 KiB) | Normal write-back (guard pages unmapped) |
//! | `0x1100_0000..0x1200_0000` | `.dma_pool`: 16 MiB for `hal::dma::PoolDma` (SMMU page tables, frames, backing store) | Normal non-cacheable, execute-never |
//! | `0x1200_0000..0x8000_0000` | rest of DDR low (assumed populated, as on ZCU102 and QFDB) | Normal write-back |
//! | `0x8000_0000..2^39` | PL, GDMA `0xFD50_0000 + n * 0x1_0000`, SMMU `0xFD80_0000`, UART0 `0xFF00_0000`, OCM (FSBL, ATF), DDR high `0x8_0000_0000..` (not used) | Device-nGnRnE, execute-never |
//!
//! See [`mmu`] for the table layout. There is no allocator; programs use the stack and
//! fixed-capacity collections (`heapless`).
//!
//! # Adding a program
//! 1. Create `src/bin/NAME.rs` with `#![cfg_attr(target_os = "none", no_std, no_main)]` and
//!    crate docs.
//! 2. In a module gated by `#[cfg(all(target_arch = "aarch64", target_os = "none"))]`, write
//!    `fn run(boot: &firmware::Boot) -> firmware::Verdict` and invoke
//!    `firmware::program!("NAME", firmware::platform::virt::PLATFORM, run);` (or
//!    `platform::zynqmp::PLATFORM`).
//! 3. Give the host build a `fn main()` (under `#[cfg(not(target_os = "none"))]`) that says
//!    the program runs on bare metal through `cargo xtask qemu NAME` (ZynqMP: on a board)
//!    and exits with status 2.
//! 4. Put the logic in this library, generic over `hal::regs::RegisterBus`, and test it on
//!    the host against a `hal::model::ModelBus` model.
//!
//! 5. Register it in `xtask/src/firmware.rs` (`PROGRAMS`): machine and expectation.
//!
//! `build.rs` gives every `src/bin/*.rs` the linker script of its platform (`link/virt.ld`;
//! programs named `zynqmp-*` get `link/zynqmp.ld`), only when building for a bare-metal
//! target.
//!
//! # Platforms
//! A program selects a [`Platform`] (console UART, power-off method, boot RAM, device-tree
//! use and fallback address, non-cacheable DMA pool):
//! - [`platform::virt`]: QEMU `virt`, PL011 console ([`pl011`]), PSCI power-off, device tree,
//!   all RAM write-back (QEMU's DMA is coherent).
//! - [`platform::zynqmp`]: Zynq UltraScale+, entered at EL3 by the FSBL and run at
//!   Non-secure EL2 after the runtime's drop ([`secure`]): Cadence UART0 at
//!   `0xFF00_0000` ([`cadence_uart`]; the FSBL's line settings are kept, the baud rate is
//!   never programmed because it depends on UART_REF_CLK), linked into DDR at `0x1000_0000`,
//!   no device tree (the fixed memory map above), a 16 MiB non-cacheable DMA pool, and no
//!   PSCI: after the verdict line the CPU waits for interrupts forever
//!   ([`platform::PowerOff::WaitForInterrupt`]). QEMU's `xlnx-zcu102` (7.2 and 10.0) runs
//!   it too (`-M xlnx-zcu102,secure=on,virtualization=on -m 4G -kernel ELF` starts it at
//!   EL3, and it drops to Non-secure EL2 there as well) but models no MMU-500: the program
//!   finds the SMMU absent and runs only its zDMA part there.
#![cfg_attr(not(test), no_std)]

pub mod cadence_uart;
pub mod console;
pub mod cpu;
pub mod edu;
pub mod error;
pub mod exception;
pub mod fdt;
pub mod gic;
pub mod logger;
pub mod mmu;
pub mod pci;
pub mod pl011;
pub mod platform;
pub mod psci;
#[cfg(all(target_arch = "aarch64", target_os = "none"))]
pub mod rt;
pub mod secure;
pub mod smmuv3_faults;
pub mod timer;
pub mod verdict;
pub mod zynqmp_smmu_faults;
pub mod zynqmp_zdma;

use core::fmt;

pub use error::{FirmwareError, Result};
pub use platform::Platform;
pub use verdict::Verdict;

/// How many RAM regions the runtime maps.
pub const MAX_RAM_REGIONS: usize = fdt::MAX_MEMORY_REGIONS;

/// A program: its name, its platform and its run function.
#[derive(Debug)]
pub struct Program {
    /// Name printed at boot (the binary's name).
    pub name: &'static str,
    /// The board it runs on.
    pub platform: &'static Platform,
    /// Runs the test and returns the verdict the runtime prints.
    pub run: fn(&Boot) -> Verdict,
}

/// Where the device tree came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DtbOrigin {
    /// The address the loader passed in `x0`.
    BootRegister(u64),
    /// The platform's fallback address (QEMU: start of RAM).
    Fallback(u64),
    /// No device tree was found.
    None,
}

impl fmt::Display for DtbOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DtbOrigin::BootRegister(a) => write!(f, "passed in x0: {a:#x}"),
            DtbOrigin::Fallback(a) => write!(f, "found at the platform's fallback {a:#x}"),
            DtbOrigin::None => f.write_str("none"),
        }
    }
}

/// What the runtime hands a program's run function.
#[derive(Clone, Debug)]
pub struct Boot {
    /// The platform.
    pub platform: &'static Platform,
    /// The exception level the program runs at.
    pub el: u8,
    /// The exception level the loader entered the runtime at (3 on a ZynqMP after the FSBL,
    /// before the drop to `el`).
    pub entered_el: u8,
    /// The security state the program runs in.
    pub security: secure::Security,
    /// The device tree, if one was found.
    pub dtb: Option<fdt::Fdt<'static>>,
    /// Where it came from.
    pub dtb_origin: DtbOrigin,
    /// RAM mapped as normal memory.
    pub ram: heapless::Vec<platform::MemRegion, MAX_RAM_REGIONS>,
    /// The identity map.
    pub map: mmu::MapSummary,
    /// Physical address bits of the CPU.
    pub pa_bits: u32,
}

impl Boot {
    /// Checks that `[base, base + size)` is mapped as Device memory: inside the identity
    /// map and clear of every RAM region. Programs call this before wrapping a register
    /// window in an `MmioBus`.
    pub fn check_device_window(&self, base: u64, size: u64) -> Result<()> {
        let not_device = FirmwareError::NotDeviceMemory { base, size };
        let end = base.checked_add(size).ok_or(not_device)?;
        if size == 0 || end > self.map.mapped_limit {
            return Err(not_device);
        }
        let overlaps_ram = self
            .ram
            .iter()
            .any(|r| base < r.base.saturating_add(r.size) && r.base < end);
        if overlaps_ram {
            return Err(not_device);
        }
        Ok(())
    }

    /// Checks that `[base, base + size)` may become a program's own buffer (a DMA pool): RAM
    /// the identity map made Normal memory (whole 2 MiB blocks), clear of the device tree,
    /// which [`dtb`](Self::dtb) keeps borrowing for the whole run. Keeping clear of the image
    /// is the caller's part (pools start past its end).
    pub fn check_free_ram(&self, base: u64, size: u64) -> Result<()> {
        let not_free = FirmwareError::NotFreeRam { base, size };
        let end = base.checked_add(size).ok_or(not_free)?;
        if size == 0 || !mmu::inside_normal(&self.ram, base, end) {
            return Err(not_free);
        }
        if let Some(fdt) = &self.dtb {
            let blob = fdt.as_bytes();
            let (start, len) = (blob.as_ptr() as u64, blob.len() as u64);
            if base < start.saturating_add(len) && start < end {
                return Err(not_free);
            }
        }
        Ok(())
    }
}

/// Declares the program in a firmware binary: `program!("NAME", PLATFORM, run)` defines the
/// entry symbol the startup code calls, which hands control to `rt::start` with the
/// program's name, platform and run function (`fn(&Boot) -> Verdict`). Expands to nothing
/// unless building for aarch64 bare metal.
#[macro_export]
macro_rules! program {
    ($name:literal, $platform:path, $run:path $(,)?) => {
        #[cfg(all(target_arch = "aarch64", target_os = "none"))]
        #[unsafe(no_mangle)]
        extern "C" fn __firmware_rust_entry(boot_arg: usize, el: u64) -> ! {
            static PROGRAM: $crate::Program = $crate::Program {
                name: $name,
                platform: &$platform,
                run: $run,
            };
            $crate::rt::start(&PROGRAM, boot_arg, el)
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use platform::MemRegion;

    fn boot() -> Boot {
        let mut ram = heapless::Vec::new();
        ram.push(MemRegion::new(0x4000_0000, 256 << 20)).unwrap();
        Boot {
            platform: &platform::virt::PLATFORM,
            el: 1,
            entered_el: 1,
            security: secure::Security::Unknown,
            dtb: None,
            dtb_origin: DtbOrigin::None,
            ram,
            map: mmu::MapSummary {
                tables: 2,
                mapped_limit: 1 << 39,
            },
            pa_bits: 44,
        }
    }

    #[test]
    fn device_windows_must_avoid_ram_and_stay_mapped() {
        let b = boot();
        assert_eq!(b.check_device_window(0x40_1000_0000, 0x1000_0000), Ok(()));
        assert_eq!(b.check_device_window(0x1000_0000, 1 << 20), Ok(()));
        assert_eq!(b.check_device_window(0x3ff0_0000, 1 << 20), Ok(()));
        for (base, size) in [
            (0x3ff0_0000, 2 << 20),   // runs into RAM
            (0x4fff_f000, 0x1000),    // inside RAM
            (0x7f_ffff_f000, 0x2000), // crosses 2^39
            (u64::MAX, 2),
            (0x1000_0000, 0),
        ] {
            assert_eq!(
                b.check_device_window(base, size),
                Err(FirmwareError::NotDeviceMemory { base, size }),
                "{base:#x}+{size:#x}"
            );
        }
        assert_eq!(
            DtbOrigin::Fallback(0x4000_0000).to_string(),
            "found at the platform's fallback 0x40000000"
        );
    }

    #[test]
    fn free_ram_is_normal_mapped_and_clear_of_the_device_tree() {
        let mut b = boot();
        assert_eq!(b.check_free_ram(0x4100_0000, 32 << 20), Ok(()));
        for (base, size) in [
            (0x4f00_0000, 32 << 20), // runs past the end of RAM
            (0x3ff0_0000, 1 << 20),  // below RAM
            (0x4100_0000, 0),
            (u64::MAX, 2),
        ] {
            assert_eq!(
                b.check_free_ram(base, size),
                Err(FirmwareError::NotFreeRam { base, size }),
                "{base:#x}+{size:#x}"
            );
        }
        // The device tree, wherever the loader put it, is not free.
        let blob: &'static [u8] = fdt::tests::VIRT_DTB;
        b.dtb = Some(fdt::Fdt::new(blob).unwrap());
        let at = blob.as_ptr() as u64;
        let mut ram = heapless::Vec::new();
        ram.push(MemRegion::new(at & !((1 << 21) - 1), 64 << 20))
            .unwrap();
        b.ram = ram;
        let base = at & !0xfff;
        assert_eq!(
            b.check_free_ram(base, 0x2000),
            Err(FirmwareError::NotFreeRam { base, size: 0x2000 })
        );
        let after = (at + blob.len() as u64).next_multiple_of(0x1000);
        assert_eq!(b.check_free_ram(after, 0x1000), Ok(()));
    }

    #[test]
    fn error_codes_are_stable_and_distinct() {
        let errors = [
            FirmwareError::Hal(hal::HalError::EmptyRange),
            FirmwareError::FdtBadMagic { found: 0 },
            FirmwareError::PageTablesExhausted { available: 4 },
            FirmwareError::NotDeviceMemory { base: 0, size: 0 },
            FirmwareError::NotFreeRam { base: 0, size: 0 },
            FirmwareError::PciNoMemoryWindow,
            FirmwareError::EduLiveness {
                wrote: 0,
                read: 0,
                expected: !0,
            },
            FirmwareError::CounterStopped,
            FirmwareError::LinkerRegionMismatch {
                name: ".dma_pool",
                base: 0,
                size: 0,
            },
            FirmwareError::Dma(dma_engine::DmaError::Busy),
            FirmwareError::ZdmaMismatch {
                channel: 0,
                copy: 0,
                offset: 0,
                expected: 0,
                found: 0,
            },
            FirmwareError::ZdmaByteCount {
                channel: 0,
                copy: 0,
                expected: 0,
                counted: 0,
            },
        ];
        let codes: Vec<u32> = errors.iter().map(FirmwareError::code).collect();
        assert_eq!(codes, [1, 10, 20, 23, 24, 50, 41, 80, 81, 90, 91, 92]);
    }
}
