//! `zynqmp-smmu-faults`: the MMU-500 fault scenario of `boards::zynqmp::scenario` on a Zynq
//! UltraScale+ board. The FSBL enters it at EL3; the runtime does the Secure set-up and drops
//! to Non-secure EL2 (docs/mmu500.md §7a), where the SMMU driver programs the Non-secure view
//! that governs the (Non-secure) GDMA channels. GDMA channels 0 and 1 (stream IDs 0x14E8 and
//! 0x14E9) copy data through the SMMU at 0xFD80_0000 while pages are missing: minor faults
//! stalled and resumed, major faults terminated and retransmitted, a terminate-only context,
//! two faults at once (FSR.MULTI), faults outside every region (aborted), and an eviction
//! that needs its TLB invalidation. Every completed transfer is checked byte for byte. DMA
//! memory is a 16 MiB pool (`.dma_pool` in `link/zynqmp.ld`) that the runtime maps
//! non-cacheable.
//!
//! The console (UART0, as the FSBL configured it) shows one line per phase with its counters,
//! the stack used (defmt lines: `cargo xtask decode zynqmp-smmu-faults CAPTURE` shows them as
//! text), then `NPRDMA-VERDICT: PASS ...` (all phases ran and passed their
//! invariants, faults > 0, data exact) or `FAIL ...` (with `BoardError::code()` when the
//! scenario failed). The CPU then waits for interrupts forever.
//!
//! Before any of that it reads the SMMU's ID registers with reads that survive an abort
//! (`rt::probe_read32`, after checking that a read outside the identity map faults and is
//! survived). If they do not look like an SMMU's (`firmware::zynqmp_zdma::decide`), it says
//! `SMMU absent` and runs the zDMA part instead: checked copies between physical buffers on
//! GDMA channels 0 and 1 (sizes 1 byte to 1 MiB, unaligned starts), a read from and a write to
//! an address nothing decodes (`boards::zynqmp::RESERVED_HOLE`), and a checked copy on each
//! channel after them. Its PASS line says what was covered and whether the engine reported
//! the bus errors. That is what runs under QEMU's `xlnx-zcu102`, which models the zDMA but
//! not the MMU-500.
//!
//! Build it with `cargo xtask firmware zynqmp-smmu-faults`; docs/mmu500.md says how to boot
//! it on a board. `cargo xtask qemu zynqmp-smmu-faults` runs it on QEMU `xlnx-zcu102`.
#![cfg_attr(target_os = "none", no_std, no_main)]

#[cfg(all(target_arch = "aarch64", target_os = "none"))]
mod target {
    use core::ptr::{self, NonNull};

    use boards::zynqmp::scenario::{self, Machine, ScenarioConfig};
    use boards::zynqmp::{GDMA, RESERVED_HOLE, SMMU};
    use dma_engine::zdma::{ZdmaChannel, ZdmaConfig};
    use firmware::exception::ProbeFault;
    use firmware::platform::zynqmp;
    use firmware::secure::Security;
    use firmware::zynqmp_zdma::{self, Absence, SmmuPresence};
    use firmware::{Boot, FirmwareError, Result, Verdict, rt, zynqmp_smmu_faults};
    use hal::PhysAddr;
    use hal::delay::CounterDelay;
    use hal::dma::{DMA_PAGE, PoolDma};
    use hal::regs::MmioBus;

    firmware::program!("zynqmp-smmu-faults", zynqmp::PLATFORM, run);

    /// Bitmap words of the DMA pool: `POOL_WORDS * 64` pages of 4 KiB = 16 MiB, the size of
    /// `.dma_pool`. The scenario needs at most about 64 pages per phase (page table, pager
    /// frames and backing store, freed after the phase).
    const POOL_WORDS: usize = 64;
    const POOL_PAGES: usize = POOL_WORDS * 64;
    /// A zDMA channel's register window (zynqmp.dtsi: 4 KiB per channel).
    const ZDMA_WINDOW: u64 = 0x1000;
    /// Written over the unused program stack to measure how much the scenario used.
    const STACK_PAINT: u64 = 0x57ac_c0de_57ac_c0de;
    /// Left unpainted below the current stack pointer (this function's own callees).
    const PAINT_MARGIN: u64 = 4096;

    unsafe extern "C" {
        // Linker-script symbols (link/zynqmp.ld); only their addresses are used.
        static __dma_pool_start: u8;
        static __dma_pool_end: u8;
        static __stack_bottom: u8;
        static __stack_top: u8;
    }

    fn run(boot: &Boot) -> Verdict {
        match run_scenario(boot) {
            Ok(verdict) => verdict,
            Err(e) => Verdict::fail(format_args!("zynqmp-smmu-faults set-up: {e}")),
        }
    }

    fn run_scenario(boot: &Boot) -> Result<Verdict> {
        match boot.security {
            // The runtime's drop from EL3: the driver programs the Non-secure view (NSCR0 et
            // al.) that governs the Non-secure GDMA channels.
            Security::NonSecure => {}
            Security::Secure => defmt::warn!(
                "running in Secure state at EL{=u8}: the driver programs the Secure view \
                 (sCR0), which does not govern the Non-secure GDMA (docs/mmu500.md section 7a)",
                boot.el
            ),
            Security::Unknown => defmt::warn!(
                "entered at EL{=u8} by an earlier stage, assumed Non-secure; the boot image \
                 should start this program at EL3 (docs/mmu500.md section 7a)",
                boot.el
            ),
        }
        check_counter()?;
        let abort_check = check_survivable_reads(boot);
        let smmu = device_window(boot, SMMU.regs.base, SMMU.regs.size)?;
        let gdma0 = device_window(boot, GDMA[0].regs.base, ZDMA_WINDOW)?;
        let gdma1 = device_window(boot, GDMA[1].regs.base, ZDMA_WINDOW)?;
        let pool = dma_pool(boot)?;
        match zynqmp_zdma::probe_smmu(SMMU.regs.base, SMMU.regs.size, rt::probe_read32) {
            SmmuPresence::Absent(why) => {
                defmt::info!(
                    "SMMU absent at {=u64:#x}: {}; running the zDMA copies without it",
                    SMMU.regs.base,
                    why
                );
                return Ok(without_smmu(gdma0, gdma1, &pool, &why, &abort_check));
            }
            SmmuPresence::Present {
                ids,
                matches_zynqmp,
            } => defmt::info!(
                "SMMU at {=u64:#x}: IDR0 {=u32:#x}, IDR1 {=u32:#x}{=str}, IDR2 {=u32:#x}, IDR7 \
                 {=u32:#x} (r{=u32}p{=u32})",
                SMMU.regs.base,
                ids.idr0,
                ids.idr1,
                if matches_zynqmp {
                    " (the ZynqMP's, UG1087)"
                } else {
                    " (not the ZynqMP's 0x30000f10)"
                },
                ids.idr2,
                ids.idr7,
                (ids.idr7 >> 4) & 0xf,
                ids.idr7 & 0xf
            ),
        }
        defmt::info!(
            "MMU-500 at {=u64:#x}, GDMA 0/1 at {=u64:#x}/{=u64:#x} (stream IDs \
             {=u32:#x}/{=u32:#x}), DMA pool {=u64:#x}+{=u64:#x} non-cacheable",
            SMMU.regs.base,
            GDMA[0].regs.base,
            GDMA[1].regs.base,
            GDMA[0].stream.0,
            GDMA[1].stream.0,
            zynqmp::DMA_POOL.base,
            zynqmp::DMA_POOL.size
        );

        let config = ScenarioConfig::DEFAULT;
        let stack = paint_stack();
        let result = scenario::run(
            Machine::zynqmp(smmu, gdma0, gdma1, &pool, CounterDelay::new()),
            &config,
        );
        let (used, size) = stack_used(stack);
        if let Ok(report) = &result {
            if let Some(line) = zynqmp_smmu_faults::translation_line(report) {
                firmware::logger::info(line);
            }
            zynqmp_smmu_faults::report_lines(report).for_each(firmware::logger::info);
        }
        defmt::info!(
            "program stack high-water mark: {=u64} of {=u64} bytes",
            used,
            size
        );
        Ok(zynqmp_smmu_faults::verdict(&config, &result))
    }

    /// Reads the first address past the identity map, which must take a translation fault
    /// that `rt::probe_read32` survives: deciding that the SMMU is absent relies on
    /// surviving an abort. `Ok` is the fault, `Err` the value a read that did not fault
    /// returned.
    fn check_survivable_reads(boot: &Boot) -> core::result::Result<ProbeFault, u32> {
        let addr = boot.map.mapped_limit;
        match rt::probe_read32(addr) {
            Err(fault) => {
                defmt::info!(
                    "abort check: reading {=u64:#x} faulted and was survived ({})",
                    addr,
                    fault
                );
                Ok(fault)
            }
            Ok(value) => {
                defmt::warn!(
                    "abort check: reading {=u64:#x} returned {=u32:#x} without faulting",
                    addr,
                    value
                );
                Err(value)
            }
        }
    }

    /// The zDMA part, for a machine without an SMMU (QEMU `xlnx-zcu102`).
    fn without_smmu(
        gdma0: MmioBus,
        gdma1: MmioBus,
        pool: &PoolDma<POOL_WORDS>,
        why: &Absence,
        abort_check: &core::result::Result<ProbeFault, u32>,
    ) -> Verdict {
        let channel = |bus| ZdmaChannel::new(bus, CounterDelay::new(), ZdmaConfig::DEFAULT);
        let result = channel(gdma0)
            .and_then(|c0| Ok([c0, channel(gdma1)?]))
            .map_err(FirmwareError::from)
            .and_then(|mut channels| {
                zynqmp_zdma::run_copies(
                    &mut channels,
                    pool,
                    RESERVED_HOLE.base,
                    &mut firmware::logger::info,
                )
            });
        zynqmp_zdma::verdict(why, abort_check, &result)
    }

    /// `CounterDelay` spins on CNTPCT_EL0: a stopped system counter (IOU_SCNTRS not enabled
    /// by the FSBL or `psu_init`) would make every bounded wait endless.
    fn check_counter() -> Result<()> {
        let hz = hal::sysreg::counter_frequency();
        if hz == 0 {
            defmt::warn!(
                "CNTFRQ_EL0 is 0 (not set by the FSBL): delays assume 1 MHz, so timeouts are \
                 shorter than configured"
            );
        } else {
            defmt::info!("system counter: CNTFRQ_EL0 = {=u64} Hz", hz);
        }
        let start = hal::sysreg::counter();
        for _ in 0..1_000_000 {
            if hal::sysreg::counter() != start {
                return Ok(());
            }
            core::hint::spin_loop();
        }
        Err(FirmwareError::CounterStopped)
    }

    /// An MMIO bus over `[base, base + size)` after checking it is mapped as Device memory.
    fn device_window(boot: &Boot, base: u64, size: u64) -> Result<MmioBus> {
        boot.check_device_window(base, size)?;
        let not_device = FirmwareError::NotDeviceMemory { base, size };
        let ptr = NonNull::new(base as *mut u8).ok_or(not_device)?;
        let len = usize::try_from(size).map_err(|_| not_device)?;
        // SAFETY: the window is in the identity map as Device memory, clear of RAM (checked
        // above), so no Rust object lives there; it is a device's register space.
        Ok(unsafe { MmioBus::new(ptr, len) })
    }

    /// The DMA pool over `.dma_pool`, after checking that the linker placed it where the
    /// platform says and that the runtime mapped it non-cacheable.
    fn dma_pool(boot: &Boot) -> Result<PoolDma<POOL_WORDS>> {
        let start = ptr::addr_of!(__dma_pool_start) as u64;
        let end = ptr::addr_of!(__dma_pool_end) as u64;
        let expected = zynqmp::DMA_POOL;
        let bad = FirmwareError::LinkerRegionMismatch {
            name: ".dma_pool",
            base: start,
            size: end.wrapping_sub(start),
        };
        let size = end.checked_sub(start).ok_or(bad)?;
        if start != expected.base
            || size != expected.size
            || size != (POOL_PAGES * DMA_PAGE) as u64
            || boot.platform.non_cacheable != Some(expected)
        {
            return Err(bad);
        }
        let cpu = NonNull::new(start as *mut u8).ok_or(bad)?;
        // SAFETY: `.dma_pool` is a NOLOAD linker-script region outside the image that nothing
        // else uses, owned by this pool for the rest of the run. The runtime mapped it Normal
        // non-cacheable (checked above: the platform names it and the MMU set-up fails the
        // run otherwise), so CPU stores reach DDR after the `dsb st` of `sync_for_device`.
        // It is identity mapped and DDR has no bus offset for the SMMU's walker or the GDMA,
        // so devices see it at its CPU address. 4 KiB alignment is checked by `new`.
        Ok(unsafe { PoolDma::new(cpu, PhysAddr::new(start), POOL_PAGES) }?)
    }

    /// The program stack (SP_EL0) as `(bottom, top)`.
    fn stack_bounds() -> (u64, u64) {
        (
            ptr::addr_of!(__stack_bottom) as u64,
            ptr::addr_of!(__stack_top) as u64,
        )
    }

    /// Fills the program stack from its bottom to [`PAINT_MARGIN`] below the current stack
    /// pointer with [`STACK_PAINT`]; returns the stack bounds.
    fn paint_stack() -> (u64, u64) {
        let (bottom, top) = stack_bounds();
        // The program runs on SP_EL0 with SPSel = 0.
        let sp = hal::sysreg::stack_pointer();
        let limit = sp.saturating_sub(PAINT_MARGIN).clamp(bottom, top);
        let mut at = bottom;
        while at + 8 <= limit {
            // SAFETY: `[bottom, limit)` is the part of the program stack below the live frames
            // (AAPCS64 has no red zone, and a margin is left for this function's callees); no
            // Rust object lives there, and a volatile write keeps the compiler out of it.
            unsafe { (at as *mut u64).write_volatile(STACK_PAINT) };
            at += 8;
        }
        (bottom, top)
    }

    /// The stack used since [`paint_stack`]: from the top down to the lowest word that no
    /// longer holds the paint. Returns `(used, size)` in bytes.
    fn stack_used((bottom, top): (u64, u64)) -> (u64, u64) {
        let mut at = bottom;
        while at + 8 <= top {
            // SAFETY: inside the program stack, below every live frame once the scenario has
            // returned (the words read are either paint or dead frames); volatile read.
            if unsafe { (at as *const u64).read_volatile() } != STACK_PAINT {
                break;
            }
            at += 8;
        }
        (top - at, top - bottom)
    }
}

#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!(
        "zynqmp-smmu-faults runs on a ZynqMP board, entered at EL3 by the FSBL: build it with \
         `cargo xtask firmware zynqmp-smmu-faults` and boot it as docs/mmu500.md describes"
    );
    std::process::exit(2);
}
