//! Transfer latencies, measured honestly: from the moment the application intended to issue a
//! transfer (an open-loop arrival, or in the closed loop the moment its window slot freed),
//! so time blocked by back-pressure or by a fault before the post counts. Kept in a
//! log-linear histogram, so a run's memory does not grow with its number of transfers.

/// What happened to a transfer on its way (the worst of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultClass {
    /// No engine fault on its pages.
    None,
    /// At least one minor fault, nothing worse.
    Minor,
    /// At least one major fault (a swap read), no block sent again.
    Major,
    /// At least one block was sent again.
    Resent,
}

impl FaultClass {
    /// All classes, in report order.
    pub const ALL: [FaultClass; 4] = [
        FaultClass::None,
        FaultClass::Minor,
        FaultClass::Major,
        FaultClass::Resent,
    ];

    /// The report name.
    pub fn name(self) -> &'static str {
        match self {
            FaultClass::None => "no fault",
            FaultClass::Minor => "minor",
            FaultClass::Major => "major",
            FaultClass::Resent => "re-sent",
        }
    }

    /// The index in [`FaultClass::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Sub-buckets per power of two: values are kept to within 1/128 (0.8%).
const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;

/// A histogram of latencies in model nanoseconds: exact below 128 ns, then 128 buckets per
/// power of two. Percentiles are the upper edge of their bucket (never below the sample).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum_ns: u128,
    max_ns: u64,
}

fn bucket(ns: u64) -> usize {
    if ns < SUB {
        return ns as usize;
    }
    let exp = 63 - ns.leading_zeros(); // >= SUB_BITS
    let shift = exp - SUB_BITS;
    let sub = (ns >> shift) - SUB; // 0..SUB
    ((u64::from(shift) + 1) * SUB + sub) as usize
}

fn upper(index: usize) -> u64 {
    let i = index as u64;
    if i < SUB {
        return i;
    }
    let shift = i / SUB - 1;
    let sub = i % SUB;
    ((SUB + sub + 1) << shift) - 1
}

impl Histogram {
    /// Adds a sample of `ns` model nanoseconds.
    pub fn record(&mut self, ns: u64) {
        let b = bucket(ns);
        if self.counts.len() <= b {
            self.counts.resize(b + 1, 0);
        }
        if let Some(c) = self.counts.get_mut(b) {
            *c += 1;
        }
        self.total += 1;
        self.sum_ns += u128::from(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The `q` quantile (nearest rank) in model ns, at most the largest sample.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return upper(i).min(self.max_ns);
            }
        }
        self.max_ns
    }

    /// Percentiles in model µs.
    pub fn percentiles(&self) -> super::Percentiles {
        let us = |ns: u64| ns as f64 / 1e3;
        super::Percentiles {
            p50: us(self.quantile_ns(0.50)),
            p90: us(self.quantile_ns(0.90)),
            p99: us(self.quantile_ns(0.99)),
            p999: us(self.quantile_ns(0.999)),
            max: us(self.max_ns),
            mean: if self.total == 0 {
                0.0
            } else {
                (self.sum_ns / u128::from(self.total)) as f64 / 1e3
            },
            count: self.total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_within_a_128th_and_quantiles_never_below_the_sample() {
        for ns in [0, 1, 127, 128, 129, 1_000, 117_300, 9_999_999, u64::MAX / 4] {
            let up = upper(bucket(ns));
            assert!(up >= ns, "{ns}: {up}");
            assert!(up - ns <= ns / 128 + 1, "{ns}: {up}");
        }
        let mut h = Histogram::default();
        for ns in 1..=1000 {
            h.record(ns * 1000);
        }
        let p = h.percentiles();
        assert_eq!(p.count, 1000);
        assert!((500.0..=504.0).contains(&p.p50), "{}", p.p50);
        assert!((999.0..=1000.0).contains(&p.p999), "{}", p.p999);
        assert_eq!(p.max, 1000.0);
    }
}
