//! A hasher for maps keyed by integers that are already well spread (hashes,
//! ids): a few mixing steps instead of SipHash. Not for keys a client
//! chooses directly.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

const K: u64 = 0x9E37_79B9_7F4A_7C15;

#[derive(Default)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        // MurmurHash3's finaliser: every input bit reaches every output bit,
        // so a table indexed by low bits sees the high ones too (the lease
        // map picks its shard from the top bits).
        let mut x = self.0;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = self.0.rotate_left(29) ^ n.wrapping_mul(K);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A `HashMap` over integer-like keys, hashed with [`IntHasher`].
pub type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    fn hash(v: impl Hash) -> u64 {
        BuildHasherDefault::<IntHasher>::default().hash_one(v)
    }

    #[test]
    fn tuples_use_every_component_and_high_bits_reach_low_ones() {
        assert_ne!(hash((1u64, 2usize)), hash((2u64, 1usize)));
        assert_ne!(hash((7u64, 0usize)), hash((7u64, 1usize)));
        let low = |v: u64| hash(v) & 0xff;
        assert_ne!(low(1 << 60), low(2 << 60), "keys differing only in top bits");
    }
}
