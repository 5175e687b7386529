//! A fast hasher for the library's maps, whose keys are pointers and provider keys (never
//! chosen by a remote party), so hash flooding is not a concern and SipHash's cost on every
//! data-path lookup is not worth paying. The mixing step is the one rustc's FxHasher uses
//! (a rotate, an xor and a multiplication by a 64-bit odd constant); written here, not copied.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The hasher.
#[derive(Default, Clone, Copy, Debug)]
pub struct FastHasher {
    hash: u64,
}

const K: u64 = 0x517c_c1b7_2722_0a95;

impl FastHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(K);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    /// The multiplication leaves the low bits of the state depending only on the low bits of
    /// the input, and `HashMap` picks buckets by the low bits: keys that differ only above
    /// their alignment (pointers to page-aligned structs) would all probe one bucket. The
    /// rotation brings the well-mixed high bits down (rustc-hash 2 ends the same way).
    #[inline]
    fn finish(&self) -> u64 {
        self.hash.rotate_left(26)
    }
}

/// A `HashMap` with [`FastHasher`].
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_keys_spread_over_the_low_bits() {
        let b = BuildHasherDefault::<FastHasher>::default();
        for align in [16u64, 256, 4096, 1 << 21] {
            let buckets: std::collections::HashSet<u64> = (1..=1000u64)
                .map(|i| std::hash::BuildHasher::hash_one(&b, i * align) & 0xfff)
                .collect();
            assert!(
                buckets.len() > 500,
                "1000 keys {align} bytes apart use {} of 4096 low-bit buckets",
                buckets.len()
            );
        }
    }

    #[test]
    fn distinct_keys_spread_and_maps_work() {
        let mut m: FastMap<(usize, u32), u32> = FastMap::default();
        for i in 0..1000u32 {
            m.insert((0x5555_0000 + i as usize * 64, i), i);
        }
        assert_eq!(m.len(), 1000);
        assert_eq!(m.get(&(0x5555_0000 + 64 * 7, 7)), Some(&7));
        let h = |x: u64| {
            let mut s = FastHasher::default();
            s.write_u64(x);
            s.finish()
        };
        assert_ne!(h(1), h(2));
        let mut s = FastHasher::default();
        s.write(b"abc");
        assert_ne!(s.finish(), 0);
    }
}
