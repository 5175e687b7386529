//! The bare-metal runtime (aarch64-unknown-none only): entry code, exception vectors, MMU
//! bring-up, the console, power-off and the panic handler. See the crate docs for the boot
//! flow.

use core::arch::{asm, global_asm};
use core::fmt::{self, Write as _};
use core::panic::PanicInfo;
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, Ordering};

use hal::barrier;
use hal::regs::MmioBus;
use hal::sysreg::{self, El, SysReg, fields::HCR_EL2, fields::ID_AA64MMFR0_EL1};
use tock_registers::LocalRegisterCopy;

use crate::cadence_uart::{CadenceUart, CadenceUartRegs};
use crate::error::{FirmwareError, Result};
use crate::exception::{ProbeFault, Syndrome, Vector};
use crate::fdt::{self, Fdt};
use crate::mmu::{self, MapSummary, Regime, Table};
use crate::pl011::Pl011;
use crate::platform::{Conduit, ConsoleKind, MemRegion, Platform, PowerOff, SecureHandoff};
use crate::secure::{self, DropTarget, Security};
use crate::verdict::{self, Outcome};
use crate::{Boot, DtbOrigin, MAX_RAM_REGIONS, Program, println, psci};

// Entry. Works at EL3, EL2 or EL1 (Arm ARM D1.3 for CurrentEL, D19.2 for CPACR_EL1.FPEN
// (bits 21:20), CPTR_EL2 (non-VHE: TFP bit 10, RES1 bits 13:12 and 9:0) and CPTR_EL3 (TFP
// bit 10, TTA, TCPAC: zero traps nothing)):
// - keep x0 (a device-tree pointer under the Linux boot protocol) in x19;
// - park every CPU but Aff0 == 0 (ZynqMP may release all four A53s);
// - let FP/SIMD through at every level before any Rust code (which uses SIMD registers) runs;
// - install the vector table for the current EL;
// - exception stack on SP_ELx, program stack on SP_EL0, so a program that overflows its stack
//   still gets its fault reported (an unmapped guard page lies below each stack once the MMU
//   is on, so an overflow faults instead of running into the memory below);
// - zero .bss, then call `__firmware_rust_entry(boot_arg, el)` (defined by `program!`).
global_asm!(
    r#"
    .section .text.boot, "ax"
    .global _start
    .type _start, %function
_start:
    mov     x19, x0
    mrs     x1, mpidr_el1
    and     x1, x1, #0xff
    cbnz    x1, 9f
    mrs     x20, CurrentEL
    ubfx    x20, x20, #2, #2
    mov     x1, #(3 << 20)
    msr     cpacr_el1, x1
    adrp    x2, __firmware_vectors
    add     x2, x2, :lo12:__firmware_vectors
    cmp     x20, #3
    b.eq    3f
    cmp     x20, #2
    b.eq    2f
    cmp     x20, #1
    b.ne    9f
    msr     vbar_el1, x2
    b       4f
2:  mov     x1, #0x33ff
    msr     cptr_el2, x1
    msr     vbar_el2, x2
    b       4f
3:  msr     cptr_el3, xzr
    msr     vbar_el3, x2
4:  isb
    // SP_ELx for the vectors: select it first, since a loader may enter with SPSel = 0 (then
    // `mov sp` would set SP_EL0, and MSR SP_EL0 below is UNDEFINED with SPSel = 0).
    msr     spsel, #1
    adrp    x1, __exception_stack_top
    add     x1, x1, :lo12:__exception_stack_top
    mov     sp, x1
    adrp    x1, __stack_top
    add     x1, x1, :lo12:__stack_top
    msr     sp_el0, x1
    msr     spsel, #0
    adrp    x1, __bss_start
    add     x1, x1, :lo12:__bss_start
    adrp    x2, __bss_end
    add     x2, x2, :lo12:__bss_end
5:  cmp     x1, x2
    b.hs    6f
    str     xzr, [x1], #8
    b       5b
6:  mov     x0, x19
    mov     x1, x20
    bl      __firmware_rust_entry
9:  wfe
    b       9b
    .size _start, . - _start
"#
);

// Exception vectors (Arm ARM D1.3.1: 16 entries of 0x80 bytes, table aligned to 2 KiB):
// each entry saves x0/x1, passes its index in x0 and joins the common path, which saves the
// rest of x0-x30 into an `ExceptionFrame` on the exception stack and calls Rust.
global_asm!(
    r#"
    .section .text.vectors, "ax"
    .balign 0x800
    .global __firmware_vectors
__firmware_vectors:
    .irp index, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15
    .balign 0x80
    sub     sp, sp, #256
    stp     x0, x1, [sp]
    mov     x0, #\index
    b       __firmware_vector_common
    .endr
__firmware_vector_common:
    stp     x2, x3, [sp, #16]
    stp     x4, x5, [sp, #32]
    stp     x6, x7, [sp, #48]
    stp     x8, x9, [sp, #64]
    stp     x10, x11, [sp, #80]
    stp     x12, x13, [sp, #96]
    stp     x14, x15, [sp, #112]
    stp     x16, x17, [sp, #128]
    stp     x18, x19, [sp, #144]
    stp     x20, x21, [sp, #160]
    stp     x22, x23, [sp, #176]
    stp     x24, x25, [sp, #192]
    stp     x26, x27, [sp, #208]
    stp     x28, x29, [sp, #224]
    str     x30, [sp, #240]
    mov     x1, sp
    bl      __firmware_exception
    // Only a probe read's fault returns here (`__firmware_exception` diverges otherwise),
    // with ELR moved to the probe's fix-up: restore the registers and return to it.
    ldp     x2, x3, [sp, #16]
    ldp     x4, x5, [sp, #32]
    ldp     x6, x7, [sp, #48]
    ldp     x8, x9, [sp, #64]
    ldp     x10, x11, [sp, #80]
    ldp     x12, x13, [sp, #96]
    ldp     x14, x15, [sp, #112]
    ldp     x16, x17, [sp, #128]
    ldp     x18, x19, [sp, #144]
    ldp     x20, x21, [sp, #160]
    ldp     x22, x23, [sp, #176]
    ldp     x24, x25, [sp, #192]
    ldp     x26, x27, [sp, #208]
    ldp     x28, x29, [sp, #224]
    ldr     x30, [sp, #240]
    ldp     x0, x1, [sp]
    add     sp, sp, #256
    eret
"#
);

// A 32-bit read that survives a synchronous data abort: `__firmware_probe_read32(addr, out)`
// loads `[addr]` at `__firmware_probe_load`; if that load aborts, the exception handler sees
// ELR at that label, records the syndrome and returns to `__firmware_probe_fixup` instead,
// which returns 1. Otherwise the value is stored to `out` and 0 returned. Clobbers only x0
// and x2 (and memory at `out`).
global_asm!(
    r#"
    .section .text.probe, "ax"
    .global __firmware_probe_read32
    .type __firmware_probe_read32, %function
__firmware_probe_read32:
    .global __firmware_probe_load
__firmware_probe_load:
    ldr     w2, [x0]
    str     w2, [x1]
    mov     x0, #0
    ret
    .global __firmware_probe_fixup
__firmware_probe_fixup:
    mov     x0, #1
    ret
    .size __firmware_probe_read32, . - __firmware_probe_read32
"#
);

/// General-purpose registers at the time of an exception, as the vector stubs save them.
#[repr(C)]
#[derive(Debug)]
pub struct ExceptionFrame {
    /// x0-x30.
    pub x: [u64; 31],
    _pad: u64,
}

static PLATFORM: AtomicPtr<Platform> = AtomicPtr::new(ptr::null_mut());
/// PSCI conduit from the device tree: 0 = no usable tree (use the platform's), 1 HVC, 2 SMC,
/// 3 the tree has no PSCI node (nothing to call: e.g. QEMU `virt,secure=on` at EL3).
static DT_CONDUIT: AtomicU8 = AtomicU8::new(0);
static IN_EXCEPTION: AtomicBool = AtomicBool::new(false);
/// Set once the verdict line is out: a later exception or panic (e.g. a power-off call that
/// traps) is reported but must not print a second verdict.
static VERDICT_PRINTED: AtomicBool = AtomicBool::new(false);
static IN_PANIC: AtomicBool = AtomicBool::new(false);
/// Set while [`probe_read32`] runs: only then does a data abort at its load return (to the
/// fix-up) instead of ending the run.
static PROBING: AtomicBool = AtomicBool::new(false);
/// ESR and FAR of the last probe read that aborted.
static PROBE_ESR: AtomicU64 = AtomicU64::new(0);
static PROBE_FAR: AtomicU64 = AtomicU64::new(0);

/// Translation tables for the identity map; only `enable_mmu` touches them, once, before the
/// MMU is on. Table::EMPTY is all zeroes, so this lives in .bss. Up to four for the map, two
/// more to split the stacks' blocks down to their guard pages.
static mut TABLES: [Table; 6] = [const { Table::EMPTY }; 6];

unsafe extern "C" {
    static __image_start: u8;
    static __image_end: u8;
    /// The unmapped page below the exception stack (linker scripts).
    static __exception_stack_guard: u8;
    /// The unmapped page below the program stack (linker scripts).
    static __stack_guard: u8;
    /// The load instruction of `__firmware_probe_read32` (the assembly above).
    static __firmware_probe_load: u8;
    /// Where a faulting probe load resumes (the assembly above).
    static __firmware_probe_fixup: u8;
    /// The exception vector table (the assembly above).
    static __firmware_vectors: u8;
    /// The top of the exception stack (linker scripts).
    static __exception_stack_top: u8;
    /// `ldr w2, [addr]; str w2, [out]`; returns 0, or 1 if the load aborted.
    fn __firmware_probe_read32(addr: u64, out: *mut u32) -> u64;
}

/// Reads the 32-bit word at physical address `addr` (identity mapped) and survives the read
/// failing: a synchronous data abort on the load (an external abort from a bus error
/// response, a translation fault outside the identity map, an alignment fault) comes back as
/// [`ProbeFault::Abort`] with its ESR and FAR instead of ending the run, and an SError left
/// pending by the read (ISR_EL1.A, Arm ARM D19.2) as [`ProbeFault::SErrorPending`]. For
/// finding out whether a device answers at all before a driver touches it.
///
/// The read is one `ldr` of 32 bits; it has whatever side effects reading the register has.
pub fn probe_read32(addr: u64) -> core::result::Result<u32, ProbeFault> {
    let mut value = 0u32;
    PROBING.store(true, Ordering::SeqCst);
    // SAFETY: the assembly routine loads 32 bits from `addr` and stores them to `value`, a
    // live local; a load that aborts is redirected by `__firmware_exception` to the fix-up,
    // which returns 1 without storing. It follows the C calling convention (clobbers x0, x2).
    // No Rust object is read through `addr`: it is only an address for the `ldr`.
    let faulted = unsafe { __firmware_probe_read32(addr, &mut value) } != 0;
    PROBING.store(false, Ordering::SeqCst);
    if faulted {
        return Err(ProbeFault::Abort {
            esr: PROBE_ESR.load(Ordering::SeqCst),
            far: PROBE_FAR.load(Ordering::SeqCst),
        });
    }
    // The barrier lets an error response to the load arrive before the check; ISR_EL1 is
    // readable at EL1 and above.
    barrier::dsb_sy();
    barrier::isb();
    let isr = sysreg::read(SysReg::IsrEl1);
    // ISR_EL1.A, bit 8: an SError interrupt is pending.
    if isr & (1 << 8) != 0 {
        return Err(ProbeFault::SErrorPending);
    }
    Ok(value)
}

/// Moves the return address of the exception being handled at `el`.
fn set_elr(el: El, elr: u64) {
    // SAFETY: only called for a probe fault, whose handler returns to `elr` (the fix-up in
    // `__firmware_probe_read32`), a valid instruction of this image; ELR_ELx of the current
    // EL is always accessible.
    unsafe { sysreg::write(SysReg::Elr(el), elr) }
}

/// The platform the running program selected (none before `start` ran).
pub fn platform() -> Option<&'static Platform> {
    let p = PLATFORM.load(Ordering::Relaxed);
    // SAFETY: the only non-null value ever stored is a `&'static Platform`.
    unsafe { p.as_ref() }
}

/// Runs `f` with the platform console as a `fmt::Write`; does nothing before the platform is
/// known.
pub fn with_console(f: impl FnOnce(&mut dyn fmt::Write)) {
    let Some(platform) = platform() else {
        return;
    };
    match platform.console {
        ConsoleKind::Pl011 { base } => {
            let Some(base) = NonNull::new(base as *mut u8) else {
                return;
            };
            // SAFETY: the platform names a PL011 register window at `base`; it is Device
            // memory both with the MMU off and in the identity map, and no Rust object lives
            // there.
            let bus = unsafe { MmioBus::new(base, crate::pl011::Pl011Regs::<MmioBus>::SIZE) };
            if let Ok(mut uart) = Pl011::new(&bus) {
                f(&mut uart);
                uart.wait_idle();
            }
        }
        ConsoleKind::Cadence { base } => {
            let Some(base) = NonNull::new(base as *mut u8) else {
                return;
            };
            // SAFETY: the platform names a Cadence UART register window at `base`; it is
            // Device memory both with the MMU off and in the identity map (outside RAM), and
            // no Rust object lives there.
            let bus = unsafe { MmioBus::new(base, CadenceUartRegs::<MmioBus>::SIZE) };
            if let Ok(mut uart) = CadenceUart::new(&bus) {
                f(&mut uart);
                uart.wait_idle();
            }
        }
    }
}

fn init_console(platform: &Platform) {
    match platform.console {
        ConsoleKind::Pl011 { base } => {
            let Some(base) = NonNull::new(base as *mut u8) else {
                return;
            };
            // SAFETY: as in `with_console`.
            let bus = unsafe { MmioBus::new(base, crate::pl011::Pl011Regs::<MmioBus>::SIZE) };
            if let Ok(uart) = Pl011::new(&bus) {
                uart.init();
            }
        }
        ConsoleKind::Cadence { base } => {
            let Some(base) = NonNull::new(base as *mut u8) else {
                return;
            };
            // SAFETY: as in `with_console`.
            let bus = unsafe { MmioBus::new(base, CadenceUartRegs::<MmioBus>::SIZE) };
            if let Ok(uart) = CadenceUart::new(&bus) {
                uart.init();
            }
        }
    }
}

/// The current exception level.
pub fn current_el() -> u8 {
    hal::sysreg::current_el()
}

/// Ends the run: waits for the console to drain, then PSCI SYSTEM_OFF (or, without PSCI,
/// waits for interrupts forever).
pub fn power_off() -> ! {
    if let Some(platform) = platform()
        && let PowerOff::Psci { default_conduit } = platform.power_off
    {
        let conduit = match DT_CONDUIT.load(Ordering::Relaxed) {
            1 => Some(Conduit::Hvc),
            2 => Some(Conduit::Smc),
            3 => None,
            _ => Some(default_conduit),
        };
        match conduit {
            Some(conduit) => {
                psci::call(conduit, psci::SYSTEM_OFF, [0; 3]);
                println!("PSCI SYSTEM_OFF returned; halting");
            }
            None => println!("no PSCI in the device tree; halting"),
        }
    }
    halt()
}

fn halt() -> ! {
    loop {
        // Nothing is enabled to wake the CPU.
        sysreg::wait_for_interrupt();
    }
}

/// Prints the verdict line and powers off. If a verdict was already printed, only halts.
pub fn finish(outcome: Outcome, args: fmt::Arguments<'_>) -> ! {
    if VERDICT_PRINTED.load(Ordering::Relaxed) {
        println!("(after the verdict) {args}");
        halt();
    }
    VERDICT_PRINTED.store(true, Ordering::Relaxed);
    with_console(|console| {
        let _ = verdict::write_line(console, outcome, args);
    });
    power_off()
}

/// Prints a FAIL verdict with `args` as the reason and powers off.
pub fn fail(args: fmt::Arguments<'_>) -> ! {
    finish(Outcome::Fail, args)
}

/// The Rust side of the entry: everything between `_start` and the program's run function.
/// Called by the `__firmware_rust_entry` symbol that [`crate::program!`] defines.
pub fn start(program: &'static Program, boot_arg: usize, el: u64) -> ! {
    let entered_el = (el & 3) as u8;
    // First, before any cache or TLB maintenance and before the caches and the MMU are on
    // (Cortex-A53 TRM, CPUECTLR_EL1.SMPEN).
    let smp = crate::cpu::enable_smp(entered_el);
    PLATFORM.store(
        ptr::from_ref(program.platform).cast_mut(),
        Ordering::Relaxed,
    );
    let platform = program.platform;
    init_console(platform);
    println!();
    let (el, security) = match (entered_el, platform.secure_handoff) {
        (3, SecureHandoff::ZynqMpNonSecure) => {
            println!(
                "nprdma firmware `{}` on {}: entered at EL3 (Secure)",
                program.name, platform.name
            );
            println!("{smp}");
            zynqmp_secure_setup();
            let target = drop_to_non_secure();
            let now = current_el();
            if now != target.el() {
                fail(format_args!(
                    "the exception return to Non-secure EL{} arrived at EL{now}",
                    target.el()
                ));
            }
            println!(
                "nprdma firmware `{}` on {} at EL{now} (Non-secure), dropped from EL3 by the \
                 runtime",
                program.name, platform.name
            );
            (now, Security::NonSecure)
        }
        (3, SecureHandoff::Stay) => {
            println!(
                "nprdma firmware `{}` on {} at EL3 (Secure)",
                program.name, platform.name
            );
            println!("{smp}");
            (3, Security::Secure)
        }
        (el, _) => {
            println!(
                "nprdma firmware `{}` on {} at EL{el}",
                program.name, platform.name
            );
            println!("{smp}");
            (el, Security::Unknown)
        }
    };

    let (dtb, dtb_origin) = if platform.uses_device_tree {
        find_dtb(platform, boot_arg as u64)
    } else {
        println!(
            "device tree: not used on {} (fixed memory map)",
            platform.name
        );
        (None, DtbOrigin::None)
    };
    if let Some(fdt) = &dtb {
        match fdt.psci_conduit() {
            Ok(Some(Conduit::Hvc)) => DT_CONDUIT.store(1, Ordering::Relaxed),
            Ok(Some(Conduit::Smc)) => DT_CONDUIT.store(2, Ordering::Relaxed),
            Ok(None) => DT_CONDUIT.store(3, Ordering::Relaxed),
            Err(e) => println!("device tree /psci: {e}; using the platform's conduit"),
        }
    }
    let ram = ram_regions(platform, dtb.as_ref());
    let pa_bits = physical_address_bits();

    let map = match enable_mmu(el, &ram, platform.non_cacheable, pa_bits) {
        Ok(map) => map,
        Err(e) => fail(format_args!("MMU setup at EL{el}: {e}")),
    };
    for r in &ram {
        println!(
            "RAM {:#x}..{:#x} normal write-back",
            r.base,
            r.base.saturating_add(r.size)
        );
    }
    if let Some(r) = platform.non_cacheable {
        println!(
            "RAM {:#x}..{:#x} normal non-cacheable (DMA pool)",
            r.base,
            r.base.saturating_add(r.size)
        );
    }
    println!(
        "MMU on: identity map below {:#x} ({} PA bits), {} tables, everything else Device-nGnRnE",
        map.mapped_limit, pa_bits, map.tables
    );

    let boot = Boot {
        platform,
        el,
        entered_el,
        security,
        dtb,
        dtb_origin,
        ram,
        map,
        pa_bits,
    };
    let verdict = (program.run)(&boot);
    finish(verdict.outcome, format_args!("{}", verdict.message))
}

/// An MMIO bus over a device window at EL3 before the MMU is on (everything is
/// Device-nGnRnE then).
fn el3_window(base: u64, size: u64) -> Option<MmioBus> {
    let base = NonNull::new(base as *mut u8)?;
    // SAFETY: called at EL3 with the MMU off, on one of the ZynqMP's register windows
    // (`boards::zynqmp`), where no Rust object lives; accesses are Device-nGnRnE.
    Some(unsafe { MmioBus::new(base, usize::try_from(size).ok()?) })
}

/// The ZynqMP's Secure set-up at EL3 (see [`crate::secure`]), each step on one console line.
/// A step that fails is reported and the next one runs: the program's own checks (its
/// translation self-check above all) decide the verdict.
fn zynqmp_secure_setup() {
    use boards::zynqmp::security::{FPD_SLCR_SECURE, IOU_SCNTRS, NON_SECURE_INTERRUPTS};
    use boards::zynqmp::{GICD, SMMU};

    let cntfrq = sysreg::read(SysReg::CntfrqEl0);
    match el3_window(IOU_SCNTRS.base, IOU_SCNTRS.size)
        .map(|bus| secure::counter_frequency(&bus, cntfrq))
    {
        Some(Ok(Some(hz))) => {
            // SAFETY: EL3 is the highest EL, where CNTFRQ_EL0 is writable; it only tells
            // software the counter's frequency.
            unsafe { sysreg::write(SysReg::CntfrqEl0, hz) };
            println!("EL3: CNTFRQ_EL0 was 0: set to {hz} Hz from IOU_SCNTRS");
        }
        Some(Ok(None)) => println!("EL3: CNTFRQ_EL0 {cntfrq} Hz"),
        Some(Err(e)) => println!("EL3: CNTFRQ_EL0: {e}"),
        None => {}
    }
    if let Some(bus) = el3_window(GICD.base, GICD.size) {
        match secure::group1(&bus, &NON_SECURE_INTERRUPTS) {
            Ok(report) => println!("EL3: GIC-400 GICD_IGROUPRn: {report}"),
            Err(e) => println!("EL3: GIC-400 groups: {e}"),
        }
    }
    if let Some(bus) = el3_window(SMMU.wrapper.base, SMMU.wrapper.size) {
        match secure::power_smmu(&bus) {
            Ok(report) => println!("EL3: SMMU_REG {report}"),
            Err(e) => println!("EL3: SMMU_REG: {e}"),
        }
    }
    if let Some(bus) = el3_window(FPD_SLCR_SECURE.base, FPD_SLCR_SECURE.size) {
        match secure::gdma_non_secure(&bus, 0xff) {
            Ok(report) => println!("EL3: FPD_SLCR_SECURE {report}"),
            Err(e) => println!("EL3: FPD_SLCR_SECURE: {e}"),
        }
    }
    match crate::zynqmp_zdma::probe_smmu(SMMU.regs.base, SMMU.regs.size, probe_read32) {
        crate::zynqmp_zdma::SmmuPresence::Absent(why) => println!(
            "EL3: SMMU absent at {:#x} ({why}): no partition to check",
            SMMU.regs.base
        ),
        crate::zynqmp_zdma::SmmuPresence::Present { .. } => {
            if let Some(bus) = el3_window(SMMU.regs.base, SMMU.page_size) {
                match secure::smmu_partition(&bus) {
                    Ok(report) => println!("EL3: MMU-500 {report}"),
                    Err(e) => println!("EL3: MMU-500 partition: {e}"),
                }
            }
        }
    }
}

/// Drops from EL3 to Non-secure EL2 (EL1 where EL2 is not implemented) and returns there,
/// on the same stack (SP_EL0) with the same registers: writes the lower EL's registers
/// ([`secure::lower_el`]: SCR_EL3, HCR_EL2, CNTHCTL_EL2, CNTVOFF_EL2, CPTR_EL2, SCTLR,
/// VBAR, SP_ELx), SPSR_EL3 (EL2t/EL1t, DAIF masked) and ELR_EL3 (the instruction after the
/// `eret`), then `eret`. Called at EL3 with the MMU and caches off.
fn drop_to_non_secure() -> DropTarget {
    let target = secure::drop_target(sysreg::read(SysReg::IdAa64pfr0El1));
    let plan = secure::lower_el(
        target,
        ptr::addr_of!(__firmware_vectors) as u64,
        ptr::addr_of!(__exception_stack_top) as u64,
    );
    let scr = plan
        .writes
        .iter()
        .find(|(reg, _)| *reg == SysReg::ScrEl3)
        .map_or(0, |w| w.1);
    println!(
        "EL3: exception return to Non-secure EL{} (SCR_EL3 {scr:#x}, SPSR_EL3 {:#x}: EL{}t \
         on the program stack, DAIF masked)",
        target.el(),
        plan.spsr,
        target.el()
    );
    for &(reg, value) in &plan.writes {
        // SAFETY: EL3 may write every register of the plan. None of them changes how EL3
        // runs: SCR_EL3 takes effect for the lower ELs (EL3 is Secure whatever its NS bit),
        // and the EL2/EL1 registers are used only after the exception return below, where
        // they give the runtime's vectors, exception stack, no traps, MMU and caches off
        // (it turns them on at the new EL as at any EL).
        unsafe { sysreg::write(reg, value) };
    }
    // SAFETY: as above; SPSR_EL3 is used only by the exception return below.
    unsafe { sysreg::write(SysReg::Spsr(El::El3), plan.spsr) };
    // SAFETY: the exception return lands on the next instruction (label 2), at the target
    // EL on SP_EL0, which holds this very stack, with every general-purpose register as it
    // was (an exception return changes none; the one used for the address is declared
    // clobbered, and so are the flags, which SPSR_EL3 sets). The lower EL was prepared
    // above: vectors, exception stack, FP/SIMD not trapped (CPTR_EL2, and CPACR_EL1 from
    // `_start`), MMU and caches off as at EL3, the same memory (DDR is Non-secure on the
    // ZynqMP, the XMPUs being bypassed by the FSBL). `aarch64-cpu` has no exception return.
    unsafe {
        asm!(
            "adr {t}, 2f",
            "msr elr_el3, {t}",
            "eret",
            "2:",
            t = out(reg) _,
            options(nostack),
        )
    };
    target
}

/// The image's address range (linker-script symbols; only their addresses are used).
fn image_range() -> (u64, u64) {
    (
        ptr::addr_of!(__image_start) as u64,
        ptr::addr_of!(__image_end) as u64,
    )
}

/// Looks for a device tree at the boot register's address, then at the platform's fallback
/// address. A candidate counts only if it lies in the platform's boot RAM, outside the image,
/// and parses.
fn find_dtb(platform: &Platform, boot_arg: u64) -> (Option<Fdt<'static>>, DtbOrigin) {
    let candidates = [
        (boot_arg, DtbOrigin::BootRegister(boot_arg)),
        (
            platform.dtb_fallback.unwrap_or(0),
            DtbOrigin::Fallback(platform.dtb_fallback.unwrap_or(0)),
        ),
    ];
    let (image_start, image_end) = image_range();
    let outside_image =
        |addr: u64, len: u64| addr.saturating_add(len) <= image_start || addr >= image_end;
    for (addr, origin) in candidates {
        if addr == 0 {
            continue;
        }
        let header_len = fdt::HEADER_SIZE as u64;
        if !platform.boot_ram.contains_range(addr, header_len) || !outside_image(addr, header_len) {
            println!("device tree: ignoring {addr:#x} (not in boot RAM outside the image)");
            continue;
        }
        // SAFETY: the header lies in RAM that is always present and is not part of this
        // image (checked above); nothing writes it while the slice lives.
        let header = unsafe { core::slice::from_raw_parts(addr as *const u8, fdt::HEADER_SIZE) };
        let total = match Fdt::total_size(header) {
            Ok(total) => total as u64,
            Err(e) => {
                println!("device tree: nothing at {addr:#x}: {e}");
                continue;
            }
        };
        if !platform.boot_ram.contains_range(addr, total) || !outside_image(addr, total) {
            println!("device tree at {addr:#x}: {total:#x} bytes overlap the image or leave RAM");
            continue;
        }
        // SAFETY: as for the header, for the `totalsize` bytes checked just above.
        let blob = unsafe { core::slice::from_raw_parts(addr as *const u8, total as usize) };
        match Fdt::new(blob) {
            Ok(fdt) => {
                println!("device tree: {total} bytes at {addr:#x} ({origin})");
                return (Some(fdt), origin);
            }
            Err(e) => println!("device tree at {addr:#x}: {e}"),
        }
    }
    println!("device tree: none found; using the platform defaults");
    (None, DtbOrigin::None)
}

/// RAM from the device tree's memory nodes, else the platform's boot RAM.
fn ram_regions(
    platform: &Platform,
    dtb: Option<&Fdt<'_>>,
) -> heapless::Vec<MemRegion, MAX_RAM_REGIONS> {
    let mut ram = heapless::Vec::new();
    if let Some(fdt) = dtb {
        match fdt.memory_regions() {
            Ok(regions) => {
                for r in regions.iter().filter(|r| r.size > 0) {
                    let _ = ram.push(*r);
                }
            }
            Err(e) => println!("device tree memory nodes: {e}"),
        }
    }
    if ram.is_empty() {
        let _ = ram.push(platform.boot_ram);
    }
    ram
}

fn physical_address_bits() -> u32 {
    let mmfr0 = LocalRegisterCopy::<u64, ID_AA64MMFR0_EL1::Register>::new(sysreg::read(
        SysReg::IdAa64mmfr0El1,
    ));
    mmu::pa_bits_from_parange(mmfr0.read(ID_AA64MMFR0_EL1::PARange)).unwrap_or(32)
}

/// Builds the identity map and turns on the MMU and caches at the current EL.
fn enable_mmu(
    el: u8,
    ram: &[MemRegion],
    non_cacheable: Option<MemRegion>,
    pa_bits: u32,
) -> Result<MapSummary> {
    let regime = Regime::for_el(el)?;
    if regime == Regime::El2 {
        // E2H changes the EL2 register formats (VHE); not supported.
        let hcr = LocalRegisterCopy::<u64, HCR_EL2::Register>::new(sysreg::read(SysReg::HcrEl2));
        if hcr.is_set(HCR_EL2::E2H) {
            return Err(FirmwareError::UnsupportedExceptionLevel { el });
        }
    }
    let sysreg_el = regime.el();
    let non_cacheable = non_cacheable.as_slice();
    // Code, data and stacks must stay write-back and executable.
    let (image_start, image_end) = image_range();
    // And they must lie in RAM the map makes Normal (whole 2 MiB blocks): otherwise the first
    // instruction fetch with the MMU on faults, and so does every vector fetch after it, a
    // silent hang instead of a verdict (a device tree whose memory nodes miss the image).
    if !mmu::inside_normal(ram, image_start, image_end) {
        return Err(FirmwareError::RegionNotMappable {
            base: image_start,
            size: image_end.saturating_sub(image_start),
        });
    }
    if let Some(nc) = non_cacheable
        .iter()
        .find(|r| r.base < image_end && image_start < r.base.saturating_add(r.size))
    {
        return Err(FirmwareError::RegionNotMappable {
            base: nc.base,
            size: nc.size,
        });
    }
    // SAFETY: single CPU, called once from `start` before anything else can reach TABLES.
    let tables = unsafe { &mut *ptr::addr_of_mut!(TABLES) };
    let map = mmu::build_identity_map(
        tables,
        |t| ptr::from_ref(t) as u64,
        ram,
        non_cacheable,
        pa_bits,
        regime,
    )?;
    // A stack that overflows faults on its guard page, and the exception stack (intact,
    // below the guard) reports it, instead of overwriting the exception stack, `.bss` (these
    // tables) and the code below.
    let guards = [
        ptr::addr_of!(__exception_stack_guard) as u64,
        ptr::addr_of!(__stack_guard) as u64,
    ];
    let map = mmu::unmap_guard_pages(tables, |t| ptr::from_ref(t) as u64, map, &guards)?;
    let root = ptr::from_ref(&tables[0]) as u64;
    let mair = mmu::MAIR;
    let tcr = mmu::tcr(regime, pa_bits);
    // SAFETY: the tables describe an identity map of all RAM (code, data, stacks, device
    // tree) as normal memory and of the platform's devices as Device memory, so every
    // address in use keeps its meaning when translation starts. The sequence follows
    // Arm ARM D8.16 / the usual bring-up: tables written (MMU off, so straight to memory),
    // stale cache lines for them discarded, registers set, TLB invalidated, then SCTLR.
    unsafe {
        // The whole image, not only the tables: `.bss`, the statics and the stack frames
        // written so far also went straight to memory, and a loader that only cleaned the
        // image (all Linux's booting.rst asks of one) may have left clean lines for them
        // that would shadow those writes once the cache is on. With the cache off nothing
        // is dirty in this range, so invalidating loses nothing. The tables lie inside it.
        invalidate_dcache_range(image_start, image_end);
        // A line of the non-cacheable pool left in the cache by an earlier stage (cacheable
        // then) could be written back over DMA data later: mismatched attributes need the
        // location cleaned or invalidated before the non-cacheable use (Arm ARM B2,
        // "Mismatched memory attributes"). Nothing of this image lives there (checked above).
        for r in non_cacheable {
            invalidate_dcache_range(r.base, r.base.saturating_add(r.size));
        }
        sysreg::write(SysReg::Mair(sysreg_el), mair);
        sysreg::write(SysReg::Tcr(sysreg_el), tcr);
        sysreg::write(SysReg::Ttbr0(sysreg_el), root);
        barrier::isb();
        invalidate_tlb_and_icache(regime);
        let sctlr = sysreg::read(SysReg::Sctlr(sysreg_el));
        sysreg::write(
            SysReg::Sctlr(sysreg_el),
            (sctlr | mmu::SCTLR_SET) & !mmu::SCTLR_CLEAR,
        );
        barrier::isb();
    }
    Ok(map)
}

/// Invalidates every TLB entry of `regime`'s translation regime and the whole instruction
/// cache, each completed with `dsb nsh; isb` (Arm ARM D8.16, the TLB maintenance
/// instructions `TLBI VMALLE1`, `TLBI ALLE2`, `TLBI ALLE3`, and `IC IALLU`); `aarch64-cpu`
/// provides no maintenance instructions.
///
/// # Safety
/// Only invalidates: safe whenever the translation tables in memory are the ones the MMU is
/// meant to use (here: before it is turned on).
unsafe fn invalidate_tlb_and_icache(regime: Regime) {
    // SAFETY: TLB and instruction-cache invalidation loses no data; the caller's contract.
    unsafe {
        match regime {
            Regime::El1 => asm!("tlbi vmalle1", options(nostack)),
            Regime::El2 => asm!("tlbi alle2", options(nostack)),
            Regime::El3 => asm!("tlbi alle3", options(nostack)),
        }
        asm!(
            "dsb nsh",
            "isb",
            "ic iallu",
            "dsb nsh",
            "isb",
            options(nostack)
        );
    }
}

/// `dc ivac` over `[start, end)`, by the smallest data cache line (CTR_EL0.DminLine).
///
/// # Safety
/// The range must hold nothing that lives only in the data cache (true before the caches
/// are first enabled: every write went to memory).
unsafe fn invalidate_dcache_range(start: u64, end: u64) {
    // CTR_EL0.DminLine, bits 19:16: log2 of the smallest data cache line in words.
    let ctr = sysreg::read(SysReg::CtrEl0);
    let line = 4u64 << ((ctr >> 16) & 0xf);
    let mut at = start & !(line - 1);
    // Ordering barriers around the maintenance as D7.5.9 asks.
    barrier::dsb_sy();
    while at < end {
        // SAFETY: the caller guarantees there is no dirty data to lose. `aarch64-cpu` has no
        // cache maintenance instructions.
        unsafe { asm!("dc ivac, {}", in(reg) at, options(nostack)) };
        at += line;
    }
    barrier::dsb_sy();
    barrier::isb();
}

/// ESR, ELR, FAR and SPSR of `el`, the EL the exception was taken to.
fn syndrome_registers(el: El) -> (u64, u64, u64, u64) {
    (
        sysreg::read(SysReg::Esr(el)),
        sysreg::read(SysReg::Elr(el)),
        sysreg::read(SysReg::Far(el)),
        sysreg::read(SysReg::Spsr(el)),
    )
}

/// Called by the vector stubs with the vector index and the saved registers. Returns only
/// for a data abort of [`probe_read32`]'s load (after pointing ELR at its fix-up; the stub
/// then restores the registers and returns); every other exception ends the run.
#[unsafe(no_mangle)]
extern "C" fn __firmware_exception(index: u64, frame: *const ExceptionFrame) {
    let el = current_el();
    // The vectors run at EL1-3 only (`_start` parks the CPU at EL0).
    let sysreg_el = El::from_number(el).unwrap_or(El::El1);
    let (esr, elr, far, spsr) = syndrome_registers(sysreg_el);
    // Vector 0: synchronous, current EL on SP_EL0 (where programs run); EC 0x25: a data
    // abort taken without a change of EL.
    if index == 0
        && PROBING.load(Ordering::SeqCst)
        && elr == ptr::addr_of!(__firmware_probe_load) as u64
        && Syndrome(esr).class() == 0x25
    {
        PROBE_ESR.store(esr, Ordering::SeqCst);
        PROBE_FAR.store(far, Ordering::SeqCst);
        PROBING.store(false, Ordering::SeqCst);
        set_elr(sysreg_el, ptr::addr_of!(__firmware_probe_fixup) as u64);
        return;
    }
    if IN_EXCEPTION.load(Ordering::Relaxed) {
        // An exception while reporting one: printing or powering off is what failed.
        halt();
    }
    IN_EXCEPTION.store(true, Ordering::Relaxed);
    let syndrome = Syndrome(esr);
    let Some(vector) = Vector::from_index(index) else {
        fail(format_args!("exception with bad vector index {index}"));
    };
    println!();
    println!("*** {vector} at EL{el}");
    if vector.has_syndrome() {
        println!("    class: {syndrome}");
    }
    println!("    ESR  {esr:#018x}");
    println!("    ELR  {elr:#018x}");
    println!(
        "    FAR  {far:#018x}{}",
        if syndrome.far_valid() {
            ""
        } else {
            " (not valid)"
        }
    );
    println!("    SPSR {spsr:#018x}");
    // SAFETY: the vector stub passed a pointer to the 256-byte frame it just filled on the
    // exception stack, which stays untouched until this function (which never returns) ends.
    if let Some(frame) = unsafe { frame.as_ref() } {
        for (row, regs) in frame.x.chunks(4).enumerate() {
            let mut line = crate::verdict::Message::new();
            for (i, r) in regs.iter().enumerate() {
                let _ = write!(line, "x{:<2} {r:#018x}  ", row * 4 + i);
            }
            println!("    {}", line.as_str().trim_end());
        }
    }
    if vector.has_syndrome() {
        fail(format_args!(
            "{vector} at EL{el}: {syndrome}, ESR {esr:#x}, ELR {elr:#x}, FAR {far:#x}"
        ))
    } else {
        fail(format_args!("unexpected {vector} at EL{el}, ELR {elr:#x}"))
    }
}

#[panic_handler]
fn panic(info: &PanicInfo<'_>) -> ! {
    if IN_PANIC.load(Ordering::Relaxed) {
        halt();
    }
    IN_PANIC.store(true, Ordering::Relaxed);
    let (file, line, column) = info
        .location()
        .map_or(("?", 0, 0), |l| (l.file(), l.line(), l.column()));
    println!();
    println!("*** panic at {file}:{line}:{column}: {}", info.message());
    fail(format_args!(
        "panic at {file}:{line}:{column}: {}",
        info.message()
    ))
}
