//! The seeded generator tests draw their random inputs from, and the draws they make with it.

pub use shoal_kernels::rng::SplitMix64;

/// Draws tests make from a [`SplitMix64`]; every one is a pure function of the generator's sequence, so a
/// seed reproduces a failing case.
pub trait Draw {
    /// Uniform in `0..n` (`n > 0`), as `next_u64() % n`.
    fn below(&mut self, n: u64) -> u64;
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64;
    /// True with probability `percent` / 100.
    fn chance(&mut self, percent: u64) -> bool;
    /// `len` random bytes (the low byte of one draw each).
    fn bytes(&mut self, len: usize) -> Vec<u8>;
    /// Uniform in `[lo, hi)`, from the top 24 bits of one draw (exact for power-of-two widths).
    fn f32_in(&mut self, lo: f32, hi: f32) -> f32;
}

impl Draw for SplitMix64 {
    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.range(0, 99) < percent
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }

    fn f32_in(&mut self, lo: f32, hi: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + unit * (hi - lo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_match_the_formulas_the_test_suites_used_bit_for_bit() {
        // kernels' tests drew `(x >> 40) / 2^23 - 1`, wire's `((x >> 40) / 2^24 - 0.5) * 8`.
        let (mut a, mut b) = (SplitMix64::new(3), SplitMix64::new(3));
        for _ in 0..10_000 {
            let x = b.next_u64();
            assert_eq!(
                a.f32_in(-1.0, 1.0).to_bits(),
                ((x >> 40) as f32 / (1u64 << 23) as f32 - 1.0).to_bits()
            );
            let x = b.next_u64();
            assert_eq!(
                a.f32_in(-4.0, 4.0).to_bits(),
                (((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0).to_bits()
            );
        }
    }

    #[test]
    fn ranges_are_inclusive_and_bounded() {
        let mut g = SplitMix64::new(1);
        let seen: std::collections::BTreeSet<u64> = (0..1000).map(|_| g.range(3, 5)).collect();
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), [3, 4, 5]);
        assert!((0..1000).all(|_| !g.chance(0) && g.chance(100)));
    }
}
