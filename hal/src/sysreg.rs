//! The AArch64 system registers firmware and drivers need (Arm ARM DDI 0487, D19.2 and
//! D11 for the generic timer). Real accesses on aarch64, through `aarch64-cpu`'s typed
//! registers where it has them; elsewhere a deterministic fake whose counter advances one
//! microsecond per read, so timeouts in host tests expire after a known number of polls
//! instead of wall-clock time, and whose other registers are plain stored values.
//!
//! The few functions named after a register ([`current_el`], [`counter`], [`midr`], ...) are
//! what drivers use. Firmware reaches every other register through [`read`] and [`write()`]
//! with a [`SysReg`]: on the target each one is a typed `aarch64-cpu` register, or, for the
//! registers `aarch64-cpu` 11.2 does not name (CTR_EL0, ISR_EL1, the EL3 translation
//! registers, CPTR_EL3, the GICv3 CPU interface's EL1 registers, writes to CNTFRQ_EL0 and
//! ESR_EL3), one
//! `mrs`/`msr` here. [`fields`] re-exports `aarch64-cpu`'s field definitions for composing
//! and decoding values, on the host too.

/// `aarch64-cpu`'s field definitions of the registers behind [`SysReg`] that it describes,
/// for composing values (`SCR_EL3::NS::NonSecure + SCR_EL3::RW::NextELIsAarch64`) and
/// decoding them, on any target. Access the registers through [`read`] and [`write()`], not
/// through the register constants these modules share their names with (on the host those
/// are unimplemented).
pub mod fields {
    pub use aarch64_cpu::registers::{
        CNTHCTL_EL2, CNTV_CTL_EL0, DAIF, HCR_EL2, ICC_SRE_EL2, ID_AA64MMFR0_EL1, SCR_EL3,
        SCTLR_EL1, SCTLR_EL2, SPSR_EL3,
    };
}

/// An exception level, for the registers banked per EL.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum El {
    /// EL1.
    El1,
    /// EL2 (without VHE).
    El2,
    /// EL3.
    El3,
}

impl El {
    /// The EL with number `el` (1-3), if it is one.
    pub const fn from_number(el: u8) -> Option<El> {
        match el {
            1 => Some(El::El1),
            2 => Some(El::El2),
            3 => Some(El::El3),
            _ => None,
        }
    }

    /// The EL's number.
    pub const fn number(self) -> u8 {
        match self {
            El::El1 => 1,
            El::El2 => 2,
            El::El3 => 3,
        }
    }

    const fn index(self) -> usize {
        self.number() as usize - 1
    }
}

/// A system register behind [`read`] and [`write()`] (Arm ARM D19.2 names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SysReg {
    /// MPIDR_EL1: the PE's affinity.
    MpidrEl1,
    /// ID_AA64MMFR0_EL1: PARange and the supported granules.
    IdAa64mmfr0El1,
    /// ID_AA64PFR0_EL1: which ELs are implemented and in which execution states.
    IdAa64pfr0El1,
    /// CTR_EL0: cache line sizes (DminLine in bits 19:16).
    CtrEl0,
    /// ISR_EL1: pending SError (A, bit 8), IRQ, FIQ.
    IsrEl1,
    /// CNTFRQ_EL0: the system counter's frequency; writable only at the highest EL.
    CntfrqEl0,
    /// CNTV_CTL_EL0: the EL1 virtual timer's control.
    CntvCtlEl0,
    /// CNTV_TVAL_EL0: the EL1 virtual timer's down-counter view.
    CntvTvalEl0,
    /// DAIF: the PSTATE interrupt masks.
    Daif,
    /// HCR_EL2.
    HcrEl2,
    /// CPTR_EL2 (non-VHE layout).
    CptrEl2,
    /// CNTHCTL_EL2 (non-VHE layout): EL1 access to the physical counter and timer.
    CnthctlEl2,
    /// CNTVOFF_EL2: the virtual counter's offset.
    CntvoffEl2,
    /// SCR_EL3.
    ScrEl3,
    /// CPTR_EL3.
    CptrEl3,
    /// SP_EL1, the stack pointer EL1 uses with SPSel = 1.
    SpEl1,
    /// SP_EL2.
    SpEl2,
    /// ICC_SRE_EL1: GICv3 system register interface enable at EL1.
    IccSreEl1,
    /// ICC_SRE_EL2.
    IccSreEl2,
    /// ICC_PMR_EL1: the GICv3 CPU interface's priority mask.
    IccPmrEl1,
    /// ICC_IGRPEN1_EL1: Group 1 interrupt enable of the GICv3 CPU interface.
    IccIgrpen1El1,
    /// SCTLR_ELx.
    Sctlr(El),
    /// MAIR_ELx.
    Mair(El),
    /// TCR_ELx.
    Tcr(El),
    /// TTBR0_ELx.
    Ttbr0(El),
    /// VBAR_ELx.
    Vbar(El),
    /// ESR_ELx.
    Esr(El),
    /// ELR_ELx.
    Elr(El),
    /// FAR_ELx.
    Far(El),
    /// SPSR_ELx.
    Spsr(El),
}

impl SysReg {
    /// Registers without an EL parameter, then nine per-EL groups of three.
    #[cfg_attr(target_arch = "aarch64", allow(dead_code))]
    const COUNT: usize = 21 + 9 * 3;

    /// A dense index (the host fake's storage).
    #[cfg_attr(target_arch = "aarch64", allow(dead_code))]
    const fn index(self) -> usize {
        match self {
            SysReg::MpidrEl1 => 0,
            SysReg::IdAa64mmfr0El1 => 1,
            SysReg::IdAa64pfr0El1 => 2,
            SysReg::CtrEl0 => 3,
            SysReg::IsrEl1 => 4,
            SysReg::CntfrqEl0 => 5,
            SysReg::CntvCtlEl0 => 6,
            SysReg::CntvTvalEl0 => 7,
            SysReg::Daif => 8,
            SysReg::HcrEl2 => 9,
            SysReg::CptrEl2 => 10,
            SysReg::CnthctlEl2 => 11,
            SysReg::CntvoffEl2 => 12,
            SysReg::ScrEl3 => 13,
            SysReg::CptrEl3 => 14,
            SysReg::SpEl1 => 15,
            SysReg::SpEl2 => 16,
            SysReg::IccSreEl1 => 17,
            SysReg::IccSreEl2 => 18,
            SysReg::IccPmrEl1 => 19,
            SysReg::IccIgrpen1El1 => 20,
            SysReg::Sctlr(el) => 21 + el.index(),
            SysReg::Mair(el) => 24 + el.index(),
            SysReg::Tcr(el) => 27 + el.index(),
            SysReg::Ttbr0(el) => 30 + el.index(),
            SysReg::Vbar(el) => 33 + el.index(),
            SysReg::Esr(el) => 36 + el.index(),
            SysReg::Elr(el) => 39 + el.index(),
            SysReg::Far(el) => 42 + el.index(),
            SysReg::Spsr(el) => 45 + el.index(),
        }
    }
}

/// Reads `reg`. The register must be accessible at the current EL (an EL3 register from EL3,
/// an EL2 register from EL2 or EL3, ...); otherwise the `mrs` is UNDEFINED and takes an
/// exception, which the firmware runtime reports.
pub fn read(reg: SysReg) -> u64 {
    imp::read(reg)
}

/// Writes `value` to `reg`. The caller issues the ISB (or exception return) that makes the
/// new value take effect where the architecture asks for one.
///
/// # Safety
/// The register must be accessible at the current EL, and `value` must keep every
/// assumption the running code makes: a translation, exception vector, stack or trap
/// setting that changes what memory means or where execution goes is the caller's to
/// justify (Arm ARM D19.2 for each register's fields and their RES0/RES1 bits).
pub unsafe fn write(reg: SysReg, value: u64) {
    // SAFETY: the caller's contract.
    unsafe { imp::write(reg, value) }
}

/// The current stack pointer (`SP`, whichever of SP_EL0 or SP_ELx PSTATE.SP selects). On
/// the host, the address of a local of this function.
#[inline(always)]
pub fn stack_pointer() -> u64 {
    imp::stack_pointer()
}

/// Waits for an interrupt (`wfi`): returns when an interrupt (masked in PSTATE or not) is
/// pending, or for no reason (Arm ARM D1.6.2). On the host, advances the fake counter by one
/// tick.
pub fn wait_for_interrupt() {
    imp::wait_for_interrupt()
}

/// The current exception level (0-3).
pub fn current_el() -> u8 {
    imp::current_el()
}

/// The generic timer's physical count (`CNTPCT_EL0`).
pub fn counter() -> u64 {
    imp::counter()
}

/// The generic timer's frequency in Hz (`CNTFRQ_EL0`), as firmware programmed it.
pub fn counter_frequency() -> u64 {
    imp::counter_frequency()
}

/// `MIDR_EL1`, which core this is (Arm ARM D19.2: implementer in bits 31:24, part number in
/// 15:4).
pub fn midr() -> u64 {
    imp::midr()
}

/// `CPUECTLR_EL1`, the CPU extended control register of the Cortex-A53 (TRM DDI 0500,
/// `CPUECTLR_EL1`) and Cortex-A57 (TRM DDI 0488): implementation defined, at the encoding
/// `S3_1_C15_C2_1`, which `aarch64-cpu` does not name.
///
/// # Safety
/// The core must implement the register there (check [`midr`]), and the current EL must be
/// allowed to read it (EL3 always; EL2 and EL1 only as ACTLR_EL3/ACTLR_EL2.CPUECTLR allow
/// writes, and reads from EL1 and up), or the access is UNDEFINED.
pub unsafe fn cpuectlr() -> u64 {
    // SAFETY: the caller's contract.
    unsafe { imp::cpuectlr() }
}

/// Writes `CPUECTLR_EL1` (see [`cpuectlr`]); the caller follows it with an ISB.
///
/// # Safety
/// As for [`cpuectlr`], for a write; and the value must be one the core's TRM allows at
/// this point (SMPEN, for example, is set before the caches and the MMU are enabled).
pub unsafe fn set_cpuectlr(value: u64) {
    // SAFETY: the caller's contract.
    unsafe { imp::set_cpuectlr(value) }
}

#[cfg(target_arch = "aarch64")]
mod imp {
    use aarch64_cpu::registers::*;
    use core::arch::asm;

    use super::{El, SysReg};

    pub fn current_el() -> u8 {
        CurrentEL.read(CurrentEL::EL) as u8
    }
    pub fn counter() -> u64 {
        // An ISB keeps the counter read from being hoisted above earlier instructions
        // (Arm ARM D11.2.2).
        aarch64_cpu::asm::barrier::isb(aarch64_cpu::asm::barrier::SY);
        CNTPCT_EL0.get()
    }
    pub fn counter_frequency() -> u64 {
        CNTFRQ_EL0.get()
    }
    pub fn midr() -> u64 {
        MIDR_EL1.get()
    }
    pub unsafe fn cpuectlr() -> u64 {
        let value: u64;
        // SAFETY: the caller guarantees the register exists and may be read at this EL.
        unsafe {
            core::arch::asm!("mrs {}, s3_1_c15_c2_1", out(reg) value, options(nomem, nostack))
        };
        value
    }
    pub unsafe fn set_cpuectlr(value: u64) {
        // SAFETY: the caller guarantees the register exists, may be written at this EL and
        // takes this value now.
        unsafe {
            core::arch::asm!("msr s3_1_c15_c2_1, {}", in(reg) value, options(nomem, nostack))
        };
    }
    pub fn wait_for_interrupt() {
        aarch64_cpu::asm::wfi();
    }
    #[inline(always)]
    pub fn stack_pointer() -> u64 {
        SP.get()
    }

    /// `mrs` of a register `aarch64-cpu` does not name.
    macro_rules! mrs {
        ($name:literal) => {{
            let value: u64;
            // SAFETY: reading a system register has no side effect on memory; an access the
            // current EL may not make is UNDEFINED and taken as an exception (`read`'s
            // documented contract), not undefined behaviour of the program.
            unsafe { asm!(concat!("mrs {}, ", $name), out(reg) value, options(nomem, nostack)) };
            value
        }};
    }

    /// `msr` to a register `aarch64-cpu` does not name.
    macro_rules! msr {
        ($name:literal, $value:expr) => {{
            let value: u64 = $value;
            // SAFETY: `write`'s caller guarantees the register is accessible at this EL and
            // that the value keeps the running code's assumptions.
            unsafe { asm!(concat!("msr ", $name, ", {}"), in(reg) value, options(nomem, nostack)) };
        }};
    }

    pub fn read(reg: SysReg) -> u64 {
        match reg {
            SysReg::MpidrEl1 => MPIDR_EL1.get(),
            SysReg::IdAa64mmfr0El1 => ID_AA64MMFR0_EL1.get(),
            SysReg::IdAa64pfr0El1 => ID_AA64PFR0_EL1.get(),
            SysReg::CtrEl0 => mrs!("ctr_el0"),
            SysReg::IsrEl1 => mrs!("isr_el1"),
            SysReg::CntfrqEl0 => CNTFRQ_EL0.get(),
            SysReg::CntvCtlEl0 => CNTV_CTL_EL0.get(),
            SysReg::CntvTvalEl0 => CNTV_TVAL_EL0.get(),
            SysReg::Daif => DAIF.get(),
            SysReg::HcrEl2 => HCR_EL2.get(),
            SysReg::CptrEl2 => CPTR_EL2.get(),
            SysReg::CnthctlEl2 => CNTHCTL_EL2.get(),
            SysReg::CntvoffEl2 => CNTVOFF_EL2.get(),
            SysReg::ScrEl3 => SCR_EL3.get(),
            SysReg::CptrEl3 => mrs!("cptr_el3"),
            SysReg::SpEl1 => SP_EL1.get(),
            SysReg::SpEl2 => SP_EL2.get(),
            SysReg::IccSreEl1 => mrs!("s3_0_c12_c12_5"),
            SysReg::IccSreEl2 => ICC_SRE_EL2.get(),
            SysReg::IccPmrEl1 => mrs!("s3_0_c4_c6_0"),
            SysReg::IccIgrpen1El1 => mrs!("s3_0_c12_c12_7"),
            SysReg::Sctlr(El::El1) => SCTLR_EL1.get(),
            SysReg::Sctlr(El::El2) => SCTLR_EL2.get(),
            SysReg::Sctlr(El::El3) => SCTLR_EL3.get(),
            SysReg::Mair(El::El1) => MAIR_EL1.get(),
            SysReg::Mair(El::El2) => MAIR_EL2.get(),
            SysReg::Mair(El::El3) => mrs!("mair_el3"),
            SysReg::Tcr(El::El1) => TCR_EL1.get(),
            SysReg::Tcr(El::El2) => TCR_EL2.get(),
            SysReg::Tcr(El::El3) => mrs!("tcr_el3"),
            SysReg::Ttbr0(El::El1) => TTBR0_EL1.get(),
            SysReg::Ttbr0(El::El2) => TTBR0_EL2.get(),
            SysReg::Ttbr0(El::El3) => mrs!("ttbr0_el3"),
            SysReg::Vbar(El::El1) => VBAR_EL1.get(),
            SysReg::Vbar(El::El2) => VBAR_EL2.get(),
            SysReg::Vbar(El::El3) => VBAR_EL3.get(),
            SysReg::Esr(El::El1) => ESR_EL1.get(),
            SysReg::Esr(El::El2) => ESR_EL2.get(),
            SysReg::Esr(El::El3) => ESR_EL3.get(),
            SysReg::Elr(El::El1) => ELR_EL1.get(),
            SysReg::Elr(El::El2) => ELR_EL2.get(),
            SysReg::Elr(El::El3) => ELR_EL3.get(),
            SysReg::Far(El::El1) => FAR_EL1.get(),
            SysReg::Far(El::El2) => FAR_EL2.get(),
            SysReg::Far(El::El3) => FAR_EL3.get(),
            SysReg::Spsr(El::El1) => SPSR_EL1.get(),
            SysReg::Spsr(El::El2) => SPSR_EL2.get(),
            SysReg::Spsr(El::El3) => SPSR_EL3.get(),
        }
    }

    /// # Safety
    /// As for [`super::write`].
    pub unsafe fn write(reg: SysReg, value: u64) {
        match reg {
            // Identification and status registers are read only: a write is refused by
            // doing nothing (the architecture makes it UNDEFINED).
            SysReg::MpidrEl1
            | SysReg::IdAa64mmfr0El1
            | SysReg::IdAa64pfr0El1
            | SysReg::CtrEl0
            | SysReg::IsrEl1 => {}
            SysReg::CntfrqEl0 => msr!("cntfrq_el0", value),
            SysReg::CntvCtlEl0 => CNTV_CTL_EL0.set(value),
            SysReg::CntvTvalEl0 => CNTV_TVAL_EL0.set(value),
            SysReg::Daif => DAIF.set(value),
            SysReg::HcrEl2 => HCR_EL2.set(value),
            SysReg::CptrEl2 => CPTR_EL2.set(value),
            SysReg::CnthctlEl2 => CNTHCTL_EL2.set(value),
            SysReg::CntvoffEl2 => CNTVOFF_EL2.set(value),
            SysReg::ScrEl3 => SCR_EL3.set(value),
            SysReg::CptrEl3 => msr!("cptr_el3", value),
            SysReg::SpEl1 => SP_EL1.set(value),
            SysReg::SpEl2 => SP_EL2.set(value),
            SysReg::IccSreEl1 => msr!("s3_0_c12_c12_5", value),
            SysReg::IccSreEl2 => ICC_SRE_EL2.set(value),
            SysReg::IccPmrEl1 => msr!("s3_0_c4_c6_0", value),
            SysReg::IccIgrpen1El1 => msr!("s3_0_c12_c12_7", value),
            SysReg::Sctlr(El::El1) => SCTLR_EL1.set(value),
            SysReg::Sctlr(El::El2) => SCTLR_EL2.set(value),
            SysReg::Sctlr(El::El3) => SCTLR_EL3.set(value),
            SysReg::Mair(El::El1) => MAIR_EL1.set(value),
            SysReg::Mair(El::El2) => MAIR_EL2.set(value),
            SysReg::Mair(El::El3) => msr!("mair_el3", value),
            SysReg::Tcr(El::El1) => TCR_EL1.set(value),
            SysReg::Tcr(El::El2) => TCR_EL2.set(value),
            SysReg::Tcr(El::El3) => msr!("tcr_el3", value),
            SysReg::Ttbr0(El::El1) => TTBR0_EL1.set(value),
            SysReg::Ttbr0(El::El2) => TTBR0_EL2.set(value),
            SysReg::Ttbr0(El::El3) => msr!("ttbr0_el3", value),
            SysReg::Vbar(El::El1) => VBAR_EL1.set(value),
            SysReg::Vbar(El::El2) => VBAR_EL2.set(value),
            SysReg::Vbar(El::El3) => VBAR_EL3.set(value),
            SysReg::Esr(El::El1) => ESR_EL1.set(value),
            SysReg::Esr(El::El2) => ESR_EL2.set(value),
            SysReg::Esr(El::El3) => msr!("esr_el3", value),
            SysReg::Elr(El::El1) => ELR_EL1.set(value),
            SysReg::Elr(El::El2) => ELR_EL2.set(value),
            SysReg::Elr(El::El3) => ELR_EL3.set(value),
            SysReg::Far(El::El1) => FAR_EL1.set(value),
            SysReg::Far(El::El2) => FAR_EL2.set(value),
            SysReg::Far(El::El3) => FAR_EL3.set(value),
            SysReg::Spsr(El::El1) => SPSR_EL1.set(value),
            SysReg::Spsr(El::El2) => SPSR_EL2.set(value),
            SysReg::Spsr(El::El3) => SPSR_EL3.set(value),
        }
    }
}

#[cfg(not(target_arch = "aarch64"))]
mod imp {
    pub use super::fake::{counter, counter_frequency, current_el, midr, read};

    pub unsafe fn cpuectlr() -> u64 {
        super::fake::cpuectlr()
    }
    pub unsafe fn set_cpuectlr(value: u64) {
        super::fake::set_cpuectlr(value)
    }
    pub unsafe fn write(reg: super::SysReg, value: u64) {
        super::fake::write(reg, value)
    }
    pub fn wait_for_interrupt() {
        super::fake::advance(1)
    }
    #[inline(always)]
    pub fn stack_pointer() -> u64 {
        let here = 0u8;
        core::ptr::addr_of!(here) as u64
    }
}

/// The host fake (non-aarch64 builds only).
#[cfg(not(target_arch = "aarch64"))]
pub mod fake {
    use core::sync::atomic::{AtomicU8, AtomicU64, Ordering};

    use super::SysReg;

    /// Frequency of the fake counter: 1 MHz, so one tick is one microsecond.
    pub const FAKE_FREQUENCY_HZ: u64 = 1_000_000;

    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static EL: AtomicU8 = AtomicU8::new(1);
    static MIDR: AtomicU64 = AtomicU64::new(0);
    static CPUECTLR: AtomicU64 = AtomicU64::new(0);
    static CPUECTLR_WRITES: AtomicU64 = AtomicU64::new(0);
    static REGS: [AtomicU64; SysReg::COUNT] = [const { AtomicU64::new(0) }; SysReg::COUNT];
    static WRITES: [AtomicU64; SysReg::COUNT] = [const { AtomicU64::new(0) }; SysReg::COUNT];

    /// Reads the fake counter; each read advances it by one tick (one microsecond).
    pub fn counter() -> u64 {
        COUNTER.fetch_add(1, Ordering::Relaxed)
    }

    /// The fake counter's frequency.
    pub fn counter_frequency() -> u64 {
        FAKE_FREQUENCY_HZ
    }

    /// The fake exception level (1 unless a test set it).
    pub fn current_el() -> u8 {
        EL.load(Ordering::Relaxed)
    }

    /// Sets the fake exception level.
    pub fn set_current_el(el: u8) {
        EL.store(el & 3, Ordering::Relaxed)
    }

    /// Moves the fake counter forward.
    pub fn advance(ticks: u64) {
        COUNTER.fetch_add(ticks, Ordering::Relaxed);
    }

    /// The fake MIDR_EL1 (0, no known core, unless a test set it).
    pub fn midr() -> u64 {
        MIDR.load(Ordering::Relaxed)
    }

    /// Sets the fake MIDR_EL1.
    pub fn set_midr(value: u64) {
        MIDR.store(value, Ordering::Relaxed)
    }

    /// The fake CPUECTLR_EL1.
    pub fn cpuectlr() -> u64 {
        CPUECTLR.load(Ordering::Relaxed)
    }

    /// Writes the fake CPUECTLR_EL1 (what `set_cpuectlr` does on the host) and counts the
    /// write.
    pub fn set_cpuectlr(value: u64) {
        CPUECTLR.store(value, Ordering::Relaxed);
        CPUECTLR_WRITES.fetch_add(1, Ordering::Relaxed);
    }

    /// Writes to the fake CPUECTLR_EL1 so far.
    pub fn cpuectlr_writes() -> u64 {
        CPUECTLR_WRITES.load(Ordering::Relaxed)
    }

    /// The fake `reg`: what the last [`write()`] (or [`set()`]) stored, 0 before that. The
    /// counter frequency reads [`FAKE_FREQUENCY_HZ`] until a test sets another one.
    pub fn read(reg: SysReg) -> u64 {
        match (reg, REGS[reg.index()].load(Ordering::Relaxed)) {
            (SysReg::CntfrqEl0, 0) => FAKE_FREQUENCY_HZ,
            (_, value) => value,
        }
    }

    /// What `hal::sysreg::write` does on the host: stores the value and counts the write.
    pub fn write(reg: SysReg, value: u64) {
        REGS[reg.index()].store(value, Ordering::Relaxed);
        WRITES[reg.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Presets the fake `reg` (not counted as a write).
    pub fn set(reg: SysReg, value: u64) {
        REGS[reg.index()].store(value, Ordering::Relaxed);
    }

    /// Writes to the fake `reg` so far.
    pub fn writes(reg: SysReg) -> u64 {
        WRITES[reg.index()].load(Ordering::Relaxed)
    }
}

#[cfg(all(test, not(target_arch = "aarch64")))]
mod tests {
    use super::*;

    #[test]
    fn every_register_has_its_own_fake_storage() {
        let mut all = Vec::new();
        for reg in [
            SysReg::MpidrEl1,
            SysReg::IdAa64mmfr0El1,
            SysReg::IdAa64pfr0El1,
            SysReg::CtrEl0,
            SysReg::IsrEl1,
            SysReg::CntfrqEl0,
            SysReg::CntvCtlEl0,
            SysReg::CntvTvalEl0,
            SysReg::Daif,
            SysReg::HcrEl2,
            SysReg::CptrEl2,
            SysReg::CnthctlEl2,
            SysReg::CntvoffEl2,
            SysReg::ScrEl3,
            SysReg::CptrEl3,
            SysReg::SpEl1,
            SysReg::SpEl2,
            SysReg::IccSreEl1,
            SysReg::IccSreEl2,
            SysReg::IccPmrEl1,
            SysReg::IccIgrpen1El1,
        ] {
            all.push(reg);
        }
        for el in [El::El1, El::El2, El::El3] {
            all.extend([
                SysReg::Sctlr(el),
                SysReg::Mair(el),
                SysReg::Tcr(el),
                SysReg::Ttbr0(el),
                SysReg::Vbar(el),
                SysReg::Esr(el),
                SysReg::Elr(el),
                SysReg::Far(el),
                SysReg::Spsr(el),
            ]);
        }
        let mut indices: Vec<usize> = all.iter().map(|r| r.index()).collect();
        indices.sort_unstable();
        assert_eq!(indices, (0..SysReg::COUNT).collect::<Vec<_>>());
        assert_eq!(El::from_number(2), Some(El::El2));
        assert_eq!(El::from_number(0), None);
        assert_eq!(El::El3.number(), 3);
    }

    #[test]
    fn the_fake_stores_what_was_written() {
        let reg = SysReg::Vbar(El::El2);
        let before = fake::writes(reg);
        // SAFETY: the host fake has no hardware behind it.
        unsafe { write(reg, 0x1000_0800) };
        assert_eq!(read(reg), 0x1000_0800);
        assert_eq!(fake::writes(reg), before + 1);
        fake::set(reg, 0);
        assert_eq!(fake::writes(reg), before + 1, "presets are not writes");
        assert_eq!(read(SysReg::CntfrqEl0), fake::FAKE_FREQUENCY_HZ);
        let t = fake::counter();
        wait_for_interrupt();
        assert!(fake::counter() >= t + 2);
    }
}
