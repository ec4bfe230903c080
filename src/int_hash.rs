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

/// Shards of the tables keyed by a 64-bit hash of a store key (the lease
/// table, the memory store): [`shard_of`] picks one, [`within_shard`]
/// places the key in its map.
pub const SHARDS: usize = 64;

/// The shard of hash `h`: its top six bits.
pub fn shard_of(h: u64) -> usize {
    (h >> 58) as usize
}

/// The hash a shard's own map places `h` by: rotated, so its low bits
/// (the map's bucket) and its top bits (the map's tag) are not the six
/// that [`shard_of`] picked, the same for every key of the shard.
pub fn within_shard(h: u64) -> u64 {
    h.rotate_left(32)
}

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

    #[test]
    fn a_shards_keys_differ_in_their_maps_tags_and_buckets() {
        // Same shard (top six bits), different elsewhere.
        let (a, b) = (
            (9u64 << 58) | (1 << 40) | (3 << 24),
            (9u64 << 58) | (2 << 40) | (4 << 24),
        );
        assert_eq!(shard_of(a), 9);
        assert_eq!(shard_of(a), shard_of(b));
        assert!(shard_of(u64::MAX) < SHARDS);
        assert_ne!(within_shard(a) >> 56, within_shard(b) >> 56, "tags");
        assert_ne!(within_shard(a) & 0xffff, within_shard(b) & 0xffff, "buckets");
    }
}
