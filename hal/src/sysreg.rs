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

#[cfg(target_arch = "aarch64")]
mod imp {
    use aarch64_cpu::registers::{CNTFRQ_EL0, CNTPCT_EL0, CurrentEL, Readable};

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
}

#[cfg(not(target_arch = "aarch64"))]
mod imp {
    pub use super::fake::{counter, counter_frequency, current_el};
}

/// The host fake (non-aarch64 builds only).
#[cfg(not(target_arch = "aarch64"))]
pub mod fake {
    use core::sync::atomic::{AtomicU8, AtomicU64, Ordering};

    /// Frequency of the fake counter: 1 MHz, so one tick is one microsecond.
    pub const FAKE_FREQUENCY_HZ: u64 = 1_000_000;

    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static EL: AtomicU8 = AtomicU8::new(1);

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
}
