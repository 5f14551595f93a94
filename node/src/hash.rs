//! A fast hasher for integer keys (keys and request ids), instead of SipHash.
//!
//! Keys come from the cluster's own workers, not from untrusted clients, so resistance to
//! hash flooding is not needed here, and SipHash showed up in profiles of small requests.

use std::hash::{BuildHasherDefault, Hasher};

/// Multiplies the integer by an odd constant and folds the high bits down (Fibonacci hashing).
#[derive(Debug, Default, Clone, Copy)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        let h = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^ (h >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word))
                .wrapping_mul(0x51_7C_C1_B7_27_22_0A_95);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7C_C1_B7_27_22_0A_95);
    }

    fn write_i32(&mut self, n: i32) {
        self.write_u64(n as u32 as u64);
    }
}

/// A `HashMap` keyed by integers with [`IntHasher`].
pub type IntMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<IntHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearby_and_strided_keys_spread() {
        let mut map: IntMap<u64, u64> = IntMap::default();
        for i in 0..10_000u64 {
            map.insert(i * (u64::MAX / 10_000), i);
        }
        assert_eq!(map.len(), 10_000);
        let buckets: std::collections::HashSet<u64> = (0..1000u64)
            .map(|i| {
                let mut h = IntHasher::default();
                h.write_u64(i);
                h.finish() % 64
            })
            .collect();
        assert!(buckets.len() > 56, "poor spread: {}", buckets.len());
    }
}
