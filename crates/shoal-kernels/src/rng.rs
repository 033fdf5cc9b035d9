//! [`SplitMix64`]: the one deterministic random generator of the project — the engine's sampler draws
//! with it, and tests and benchmarks make their random inputs with it (through `shoal-testkit`).

/// SplitMix64: small, fast and good enough for drawing from a distribution; fully determined by its
/// 64-bit state, which [`SplitMix64::state`] reads back (another node can continue the same sequence).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator whose state is `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The current state: `SplitMix64::new(g.state())` continues exactly as `g` would.
    pub fn state(&self) -> u64 {
        self.0
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), from the top 53 bits.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_is_splitmix64() {
        // The reference sequence for seed 0 (Vigna's splitmix64.c).
        let mut g = SplitMix64::new(0);
        assert_eq!(g.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(g.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        let mut h = SplitMix64::new(g.state());
        assert_eq!(h.next_u64(), g.next_u64());
    }
}
