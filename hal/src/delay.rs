//! Delays and bounded polling on top of embedded-hal's [`DelayNs`].
//!
//! Every wait on hardware in this project is bounded: a device that never answers turns into
//! [`HalError::Timeout`], never a hang.

pub use embedded_hal::delay::DelayNs;

use crate::{HalError, Result};

/// A busy-wait delay on the generic timer's counter ([`crate::sysreg::counter`]).
#[derive(Debug, Clone, Copy)]
pub struct CounterDelay {
    ticks_per_us: u64,
}

impl CounterDelay {
    /// A delay using the counter frequency firmware programmed (at least 1 MHz is assumed
    /// when `CNTFRQ_EL0` reads as zero, which happens when no firmware set it).
    pub fn new() -> Self {
        let hz = crate::sysreg::counter_frequency();
        Self {
            ticks_per_us: (hz / 1_000_000).max(1),
        }
    }
}

impl Default for CounterDelay {
    fn default() -> Self {
        Self::new()
    }
}

impl DelayNs for CounterDelay {
    fn delay_ns(&mut self, ns: u32) {
        let ticks = (u64::from(ns) * self.ticks_per_us).div_ceil(1000);
        let start = crate::sysreg::counter();
        while crate::sysreg::counter().wrapping_sub(start) < ticks {
            core::hint::spin_loop();
        }
    }
}

/// Polls `done` every `interval_us` microseconds until it returns true or `timeout_us` have
/// been waited. Returns the time waited.
///
/// The budget counts the delays requested, not a clock, so it behaves the same against a model
/// that answers instantly and against silicon.
pub fn poll_until<D: DelayNs + ?Sized>(
    delay: &mut D,
    timeout_us: u64,
    interval_us: u32,
    mut done: impl FnMut() -> bool,
) -> Result<u64> {
    let interval = u64::from(interval_us.max(1));
    let mut waited = 0u64;
    loop {
        if done() {
            return Ok(waited);
        }
        if waited >= timeout_us {
            return Err(HalError::Timeout { waited_us: waited });
        }
        delay.delay_us(interval_us.max(1));
        waited = waited.saturating_add(interval);
    }
}

/// A delay that returns at once and counts what was asked of it: for host tests and for
/// models that complete synchronously.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoDelay {
    /// Total nanoseconds requested.
    pub requested_ns: u64,
}

impl DelayNs for NoDelay {
    fn delay_ns(&mut self, ns: u32) {
        self.requested_ns = self.requested_ns.saturating_add(u64::from(ns));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_succeeds_when_condition_turns_true() {
        let mut d = NoDelay::default();
        let mut n = 0;
        let waited = poll_until(&mut d, 100, 10, || {
            n += 1;
            n == 4
        })
        .unwrap();
        assert_eq!(waited, 30);
        assert_eq!(d.requested_ns, 30_000);
    }

    #[test]
    fn poll_times_out() {
        let mut d = NoDelay::default();
        assert_eq!(
            poll_until(&mut d, 50, 10, || false),
            Err(HalError::Timeout { waited_us: 50 })
        );
    }

    #[test]
    fn counter_delay_waits_on_the_fake_counter() {
        let mut d = CounterDelay::new();
        let before = crate::sysreg::counter();
        d.delay_us(20);
        assert!(crate::sysreg::counter() - before >= 20);
    }
}
