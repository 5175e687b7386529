//! Delays and bounded polling on top of embedded-hal's [`DelayNs`].
//!
//! Every wait on hardware in this project is bounded: a device that never answers turns into
//! [`HalError::Timeout`], never a hang.

pub use embedded_hal::delay::DelayNs;

use crate::{HalError, Result};

/// Consecutive counter reads without a change after which [`CounterDelay`] decides the counter
/// is stopped. A running counter ticks at least once per microsecond (the Arm ARM's system
/// counter section recommends 1 to 50 MHz before Armv8.6 and fixes 1 GHz from it; the ZynqMP's
/// runs at about 100 MHz), while one read with its ISB takes tens of nanoseconds, so a running
/// counter changes long before this many reads.
const STOPPED_AFTER_READS: u32 = 1 << 20;

/// A busy-wait delay on the generic timer's counter ([`crate::sysreg::counter`]).
///
/// Delays are rounded up to whole ticks, never down, so a wait is at least what was asked. A
/// counter that stops (the system counter disabled under us) ends the wait early instead of
/// spinning forever, and [`CounterDelay::counter_stopped`] reports it; the bounded polls on
/// top ([`poll_until`]) still time out, because they count the delays requested.
#[derive(Debug, Clone, Copy)]
pub struct CounterDelay {
    hz: u64,
    counter_stopped: bool,
}

impl CounterDelay {
    /// A delay using the counter frequency firmware programmed (1 MHz is assumed when
    /// `CNTFRQ_EL0` reads as zero, which happens when no firmware set it).
    pub fn new() -> Self {
        Self::with_frequency(crate::sysreg::counter_frequency())
    }

    /// A delay for a counter ticking at `hz` (zero means the 1 MHz fallback of [`Self::new`]).
    pub fn with_frequency(hz: u64) -> Self {
        Self {
            hz: if hz == 0 { 1_000_000 } else { hz },
            counter_stopped: false,
        }
    }

    /// The counter frequency the delays assume, in Hz.
    pub fn frequency(&self) -> u64 {
        self.hz
    }

    /// Whether a delay saw the counter stand still and returned early.
    pub fn counter_stopped(&self) -> bool {
        self.counter_stopped
    }

    /// Ticks that cover at least `ns` nanoseconds (rounded up).
    fn ticks_for_ns(&self, ns: u32) -> u64 {
        let ticks = (u128::from(ns) * u128::from(self.hz)).div_ceil(1_000_000_000);
        u64::try_from(ticks).unwrap_or(u64::MAX)
    }

    /// Spins until `read` has advanced `ticks` past its first value, or until it stood still
    /// for [`STOPPED_AFTER_READS`] reads in a row.
    fn wait_ticks(&mut self, ticks: u64, mut read: impl FnMut() -> u64) {
        let start = read();
        let mut last = start;
        let mut unchanged = 0u32;
        loop {
            let now = read();
            if now.wrapping_sub(start) >= ticks {
                return;
            }
            if now == last {
                unchanged += 1;
                if unchanged >= STOPPED_AFTER_READS {
                    self.counter_stopped = true;
                    return;
                }
            } else {
                last = now;
                unchanged = 0;
            }
            core::hint::spin_loop();
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
        let ticks = self.ticks_for_ns(ns);
        self.wait_ticks(ticks, crate::sysreg::counter);
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
    fn delays_round_up_to_whole_ticks() {
        // The ZynqMP's counter runs at 99.99 MHz: dividing down to whole ticks per microsecond
        // would wait 99 ticks for 100 (1% short).
        let d = CounterDelay::with_frequency(99_990_000);
        assert_eq!(d.ticks_for_ns(1_000), 100);
        assert_eq!(d.ticks_for_ns(1_000_000), 99_990);
        assert_eq!(d.ticks_for_ns(0), 0);
        // A slow counter still waits at least one tick for any nonzero delay.
        let slow = CounterDelay::with_frequency(32_768);
        assert_eq!(slow.ticks_for_ns(1), 1);
        assert_eq!(slow.ticks_for_ns(u32::MAX), 140_738);
        // No firmware set CNTFRQ_EL0: 1 MHz is assumed.
        assert_eq!(CounterDelay::with_frequency(0).frequency(), 1_000_000);
    }

    #[test]
    fn a_stopped_counter_ends_the_wait_and_is_reported() {
        let mut d = CounterDelay::with_frequency(1_000_000);
        let mut reads = 0u64;
        d.wait_ticks(10, || {
            reads += 1;
            7
        });
        assert!(d.counter_stopped());
        assert_eq!(reads, u64::from(STOPPED_AFTER_READS) + 1);
    }

    #[test]
    fn a_slow_but_running_counter_is_not_taken_for_stopped() {
        // The counter moves only every 1,000 reads (a fast CPU on a slow counter).
        let mut d = CounterDelay::with_frequency(1_000_000);
        let mut reads = 0u64;
        d.wait_ticks(50, || {
            reads += 1;
            reads / 1_000
        });
        assert!(!d.counter_stopped());
        assert!(reads >= 50_000);
    }

    #[test]
    fn the_wait_survives_a_counter_wrap() {
        let mut d = CounterDelay::with_frequency(1_000_000);
        let mut now = u64::MAX - 3;
        d.wait_ticks(8, || {
            now = now.wrapping_add(1);
            now
        });
        assert!(!d.counter_stopped());
        assert_eq!(now, 5);
    }

    #[test]
    fn counter_delay_waits_on_the_fake_counter() {
        let mut d = CounterDelay::new();
        let before = crate::sysreg::counter();
        d.delay_us(20);
        assert!(crate::sysreg::counter() - before >= 20);
    }
}
