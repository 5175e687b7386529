//! The deterministic discrete-event core of the virtual QFDB.
//!
//! - [`ModelTime`]: simulated time in picoseconds. It is *model time*: it says how long
//!   things take on the modelled machine, never how long the simulation took to run. Every
//!   printed figure carries the word "model" (e.g. "12.5 model µs").
//! - [`EventQueue`]: a priority queue of events ordered by time, then by insertion order, so
//!   two runs with the same inputs process the same events in the same order.
//! - [`SplitMix64`]: the seeded random source. Every random choice of a run comes from
//!   generators derived from the run's seed, so a seed reproduces a run exactly.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::fmt;

/// A point in (or span of) model time, in picoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelTime(pub u64);

impl ModelTime {
    /// Time zero.
    pub const ZERO: ModelTime = ModelTime(0);
    /// The end of time (never reached).
    pub const NEVER: ModelTime = ModelTime(u64::MAX);

    /// `ns` model nanoseconds.
    pub const fn from_ns(ns: u64) -> Self {
        ModelTime(ns.saturating_mul(1_000))
    }

    /// `us` model microseconds (fractions allowed; negative or NaN give zero).
    pub fn from_us(us: f64) -> Self {
        if us.is_finite() && us > 0.0 {
            ModelTime((us * 1e6).round() as u64)
        } else {
            ModelTime::ZERO
        }
    }

    /// In model nanoseconds (rounded down).
    pub const fn as_ns(self) -> u64 {
        self.0 / 1_000
    }

    /// In model microseconds.
    pub fn as_us(self) -> f64 {
        self.0 as f64 / 1e6
    }

    /// In model seconds.
    pub fn as_secs(self) -> f64 {
        self.0 as f64 / 1e12
    }

    /// `self + d`, saturating at [`ModelTime::NEVER`].
    pub const fn after(self, d: ModelTime) -> Self {
        ModelTime(self.0.saturating_add(d.0))
    }

    /// `self - earlier`, or zero.
    pub const fn since(self, earlier: ModelTime) -> Self {
        ModelTime(self.0.saturating_sub(earlier.0))
    }

    /// The time `bytes` take at `bits_per_second` (rounded up to a picosecond).
    pub fn transfer(bytes: u64, bits_per_second: u64) -> Self {
        if bits_per_second == 0 {
            return ModelTime::NEVER;
        }
        let ps = (u128::from(bytes) * 8 * 1_000_000_000_000).div_ceil(u128::from(bits_per_second));
        ModelTime(u64::try_from(ps).unwrap_or(u64::MAX))
    }
}

impl fmt::Display for ModelTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3} model µs", self.as_us())
    }
}

struct Entry<E> {
    at: ModelTime,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at && self.seq == other.seq
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    // BinaryHeap is a max-heap: invert so the earliest (then first inserted) comes out first.
    fn cmp(&self, other: &Self) -> Ordering {
        other.at.cmp(&self.at).then(other.seq.cmp(&self.seq))
    }
}

/// Events in time order; ties in insertion order.
pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    seq: u64,
    now: ModelTime,
    processed: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E> EventQueue<E> {
    /// An empty queue at time zero.
    pub fn new() -> Self {
        Self {
            heap: BinaryHeap::new(),
            seq: 0,
            now: ModelTime::ZERO,
            processed: 0,
        }
    }

    /// The time of the event being processed (the last one popped).
    pub fn now(&self) -> ModelTime {
        self.now
    }

    /// Schedules `event` at `at`; a time in the past means "now" (time never goes back).
    pub fn schedule(&mut self, at: ModelTime, event: E) {
        let at = at.max(self.now);
        self.heap.push(Entry {
            at,
            seq: self.seq,
            event,
        });
        self.seq += 1;
    }

    /// Schedules `event` `delay` after now.
    pub fn schedule_in(&mut self, delay: ModelTime, event: E) {
        self.schedule(self.now.after(delay), event);
    }

    /// The next event, advancing the clock to its time.
    pub fn pop(&mut self) -> Option<(ModelTime, E)> {
        let entry = self.heap.pop()?;
        self.now = entry.at;
        self.processed += 1;
        Some((entry.at, entry.event))
    }

    /// The next event if it is due at or before `until`.
    pub fn pop_until(&mut self, until: ModelTime) -> Option<(ModelTime, E)> {
        if self.heap.peek()?.at > until {
            return None;
        }
        self.pop()
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether no event is waiting.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Events processed so far.
    pub fn processed(&self) -> u64 {
        self.processed
    }
}

/// SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators",
/// OOPSLA 2014): a 64-bit counter passed through a mixing function. Statistically good enough
/// for a simulation, tiny, and its output for a seed never changes, which is what
/// reproducibility needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator for `seed`.
    pub const fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// An independent generator for sub-stream `stream` of `seed` (e.g. one per node).
    pub fn derive(seed: u64, stream: u64) -> Self {
        let mut g = SplitMix64::new(seed ^ stream.wrapping_mul(0xD6E8_FEB8_6659_FD93));
        // Decorrelate nearby streams.
        g.next_u64();
        Self::new(g.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.next_f64() < p
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        // Multiply-shift (Lemire); the bias is below 2^-64 * n, irrelevant here.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_out_in_time_then_insertion_order() {
        let mut q = EventQueue::new();
        q.schedule(ModelTime::from_ns(5), "b");
        q.schedule(ModelTime::from_ns(1), "a");
        q.schedule(ModelTime::from_ns(5), "c");
        assert_eq!(q.pop(), Some((ModelTime::from_ns(1), "a")));
        // An event scheduled in the past runs "now", never before the current time.
        q.schedule(ModelTime::ZERO, "now");
        assert_eq!(q.pop(), Some((ModelTime::from_ns(1), "now")));
        assert_eq!(q.pop(), Some((ModelTime::from_ns(5), "b")));
        assert_eq!(q.pop(), Some((ModelTime::from_ns(5), "c")));
        assert_eq!(q.pop(), None);
        assert_eq!(q.processed(), 4);
    }

    #[test]
    fn transfer_times_follow_the_bandwidth() {
        // 4096 bytes at 32 Gb/s: 32768 bits / 32e9 b/s = 1.024 µs.
        assert_eq!(
            ModelTime::transfer(4096, 32_000_000_000),
            ModelTime(1_024_000)
        );
        assert_eq!(ModelTime::from_us(1.1), ModelTime(1_100_000));
        assert_eq!(ModelTime::from_us(-3.0), ModelTime::ZERO);
        assert_eq!(format!("{}", ModelTime(2_500_000)), "2.500 model µs");
    }

    #[test]
    fn splitmix_matches_the_reference_sequence() {
        // The first outputs for seed 1234567 as published with the Rosetta Code task
        // "Pseudo-random numbers/Splitmix64" (not computed with this code).
        let mut g = SplitMix64::new(1_234_567);
        assert_eq!(g.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(g.next_u64(), 3_203_168_211_198_807_973);
        let mut a = SplitMix64::derive(7, 1);
        let mut b = SplitMix64::derive(7, 2);
        assert_ne!(a.next_u64(), b.next_u64());
        let mut c = SplitMix64::new(9);
        let n = (0..10_000).filter(|_| c.chance(0.25)).count();
        assert!((2_250..2_750).contains(&n), "{n}");
        assert!((0..1000).all(|_| c.below(10) < 10));
    }
}
