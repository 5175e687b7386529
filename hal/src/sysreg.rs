//! The few AArch64 system registers that drivers need: the exception level and the generic
//! timer's counter (Arm ARM D11.1). Real `mrs` on aarch64 (through `aarch64-cpu`); elsewhere a
//! deterministic fake whose counter advances one microsecond per read, so timeouts in host
//! tests expire after a known number of polls instead of wall-clock time.

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
    use aarch64_cpu::registers::{CNTFRQ_EL0, CNTPCT_EL0, CurrentEL, MIDR_EL1, Readable};

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
}

#[cfg(not(target_arch = "aarch64"))]
mod imp {
    pub use super::fake::{counter, counter_frequency, current_el, midr};

    pub unsafe fn cpuectlr() -> u64 {
        super::fake::cpuectlr()
    }
    pub unsafe fn set_cpuectlr(value: u64) {
        super::fake::set_cpuectlr(value)
    }
}

/// The host fake (non-aarch64 builds only).
#[cfg(not(target_arch = "aarch64"))]
pub mod fake {
    use core::sync::atomic::{AtomicU8, AtomicU64, Ordering};

    /// Frequency of the fake counter: 1 MHz, so one tick is one microsecond.
    pub const FAKE_FREQUENCY_HZ: u64 = 1_000_000;

    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static EL: AtomicU8 = AtomicU8::new(1);
    static MIDR: AtomicU64 = AtomicU64::new(0);
    static CPUECTLR: AtomicU64 = AtomicU64::new(0);
    static CPUECTLR_WRITES: AtomicU64 = AtomicU64::new(0);

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
}
