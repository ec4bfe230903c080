//! One shard's map of leases by request hash, in buckets of one cache line
//! each: seven tags and the seven leases' pointers side by side, so finding
//! a lease reads one line of the map and then the lease's own.
//!
//! A general hash table (hashbrown's included) keeps its tags and its
//! entries in two arrays: a lookup on a key not in cache waits for the
//! tags' line, then the entry's, then the lease's. On 100 000 keys visited
//! in turn every one of those is a miss, and each waits for the one before.
//! Here the first two are one.
//!
//! Open addressing over buckets: a lease goes in the first bucket from its
//! home (the hash's low bits) with a free way. A bucket counts the leases
//! that went past it full ([`Bucket::passed`], as folly's F14 does), so a
//! lookup stops at the first bucket nothing went past. The map grows (twice
//! the buckets, every lease placed again) before it is six sevenths full,
//! and never shrinks: the lease table's per-shard cap bounds it.
//!
//! The tag is 8 bits of the hash, none of those the bucket is picked by: a
//! lookup dereferences a lease that is not its own about once in 37 full
//! buckets it looks at (7 ways, 255 tags). The lease's `table_key`
//! settles it.

use crate::int_hash::within_shard as spread;
use crate::limit::lease::SharedLease;

/// Leases per bucket: with the tags and the count of leases gone past,
/// 7 × 8 + 8 = 64 bytes.
const WAYS: usize = 7;

/// A bucket's `passed` count sticks here: it no longer goes down, and
/// lookups through the bucket go on to the next until the map grows.
const STUCK: u8 = u8::MAX;

#[repr(C, align(64))]
#[derive(Default)]
struct Bucket {
    /// The ways' tags (0: empty), then the count of leases whose home is
    /// this bucket or one before it that were placed after it.
    meta: [u8; WAYS + 1],
    leases: [Option<SharedLease>; WAYS],
}

const _: () = assert!(std::mem::size_of::<Bucket>() == 64);

impl Bucket {
    fn passed(&self) -> u8 {
        self.meta[WAYS]
    }

    /// The ways whose tag is `tag`, one bit (the byte's top bit) per way,
    /// and maybe a few that are not (a borrow past a matching byte):
    /// callers compare the lease's hash.
    fn matching(&self, tag: u8) -> u64 {
        const LOW: u64 = 0x0101_0101_0101_0101;
        const WAYS_HIGH: u64 = 0x0080_8080_8080_8080;
        let x = u64::from_le_bytes(self.meta) ^ (LOW * tag as u64);
        x.wrapping_sub(LOW) & !x & WAYS_HIGH
    }

    fn free_way(&self) -> Option<usize> {
        self.meta[..WAYS].iter().position(|&t| t == 0)
    }
}

/// Where a lease sits: bucket and way.
#[derive(Clone, Copy)]
struct At {
    bucket: usize,
    way: usize,
}

/// The map. Shared readers find; the shard's writer inserts and removes.
pub(super) struct LineMap {
    buckets: Box<[Bucket]>,
    len: usize,
}

impl Default for LineMap {
    fn default() -> Self {
        LineMap::with_buckets(1)
    }
}

/// Never 0: that marks an empty way.
fn tag(x: u64) -> u8 {
    ((x >> 56) as u8).max(1)
}

impl LineMap {
    fn with_buckets(n: usize) -> LineMap {
        debug_assert!(n.is_power_of_two());
        LineMap {
            buckets: (0..n).map(|_| Bucket::default()).collect(),
            len: 0,
        }
    }

    fn mask(&self) -> usize {
        self.buckets.len() - 1
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    fn position(&self, h: u64) -> Option<At> {
        let x = spread(h);
        let tag = tag(x);
        let mut i = x as usize & self.mask();
        // A full walk at most: every bucket passed is a finite map.
        for _ in 0..self.buckets.len() {
            let b = &self.buckets[i];
            let mut m = b.matching(tag);
            while m != 0 {
                let way = m.trailing_zeros() as usize / 8;
                if b.leases[way].as_ref().is_some_and(|l| l.table_key() == h) {
                    return Some(At { bucket: i, way });
                }
                m &= m - 1;
            }
            if b.passed() == 0 {
                return None;
            }
            i = (i + 1) & self.mask();
        }
        None
    }

    #[inline]
    pub(super) fn get(&self, h: u64) -> Option<&SharedLease> {
        let at = self.position(h)?;
        self.buckets[at.bucket].leases[at.way].as_ref()
    }

    /// Places `lease` (whose hash is not in the map) without growing.
    fn place(&mut self, lease: SharedLease) {
        let x = spread(lease.table_key());
        let mask = self.mask();
        let mut i = x as usize & mask;
        loop {
            let b = &mut self.buckets[i];
            if let Some(way) = b.free_way() {
                b.meta[way] = tag(x);
                b.leases[way] = Some(lease);
                self.len += 1;
                return;
            }
            if b.meta[WAYS] != STUCK {
                b.meta[WAYS] += 1;
            }
            // The map grows before it is full: a free way comes.
            i = (i + 1) & mask;
        }
    }

    /// Twice the buckets, every lease placed again.
    fn grow(&mut self) {
        let mut bigger = LineMap::with_buckets(self.buckets.len() * 2);
        for b in std::mem::take(&mut self.buckets).into_vec() {
            for lease in b.leases.into_iter().flatten() {
                bigger.place(lease);
            }
        }
        *self = bigger;
    }

    /// The lease of `h`, made by `make` if there is none.
    pub(super) fn get_or_insert_with(&mut self, h: u64, make: impl FnOnce() -> SharedLease) -> SharedLease {
        if let Some(lease) = self.get(h) {
            return lease.clone();
        }
        // Six ways in seven at most.
        if self.len + 1 > self.buckets.len() * (WAYS - 1) {
            self.grow();
        }
        let lease = make();
        debug_assert_eq!(lease.table_key(), h);
        self.place(lease.clone());
        lease
    }

    /// Takes the lease at `at` out, and counts it off the buckets it had
    /// gone past.
    fn take(&mut self, at: At) -> Option<SharedLease> {
        let b = &mut self.buckets[at.bucket];
        let lease = b.leases[at.way].take()?;
        b.meta[at.way] = 0;
        self.len -= 1;
        let mask = self.mask();
        let mut i = spread(lease.table_key()) as usize & mask;
        while i != at.bucket {
            let passed = &mut self.buckets[i].meta[WAYS];
            if *passed != STUCK {
                // Never below 0 while the counts hold (the tests check
                // they do); were one ever short, stuck is the safe side:
                // lookups through it go on rather than stop early.
                *passed = passed.checked_sub(1).unwrap_or(STUCK);
            }
            i = (i + 1) & mask;
        }
        Some(lease)
    }

    pub(super) fn remove(&mut self, h: u64) -> Option<SharedLease> {
        let at = self.position(h)?;
        self.take(at)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &SharedLease> + Clone {
        self.buckets.iter().flat_map(|b| b.leases.iter().flatten())
    }

    /// Keeps the leases `keep` approves.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&SharedLease) -> bool) {
        for bucket in 0..self.buckets.len() {
            for way in 0..WAYS {
                let Some(lease) = &self.buckets[bucket].leases[way] else {
                    continue;
                };
                if !keep(lease) {
                    self.take(At { bucket, way });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::lease::Lease;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn lease(h: u64) -> SharedLease {
        SharedLease::new(Lease::new("k", h))
    }

    /// Every bucket's `passed` is what the leases placed say it must be.
    fn passed_counts_hold(map: &LineMap) {
        let mut want = vec![0usize; map.buckets.len()];
        let mask = map.mask();
        for (at, b) in map.buckets.iter().enumerate() {
            for (way, l) in b.leases.iter().enumerate() {
                let Some(l) = l else {
                    assert_eq!(b.meta[way], 0);
                    continue;
                };
                assert_eq!(b.meta[way], tag(spread(l.table_key())));
                let mut i = spread(l.table_key()) as usize & mask;
                while i != at {
                    want[i] += 1;
                    i = (i + 1) & mask;
                }
            }
        }
        for (b, want) in map.buckets.iter().zip(want) {
            if b.passed() != STUCK {
                assert_eq!(b.passed() as usize, want);
            }
        }
    }

    #[test]
    fn a_bucket_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Bucket>(), 64);
        assert_eq!(std::mem::align_of::<Bucket>(), 64);
    }

    #[test]
    fn tags_match_their_ways_and_a_free_way_matches_nothing() {
        let mut b = Bucket::default();
        assert_eq!(b.matching(1), 0);
        b.meta = [5, 9, 5, 0, 200, 1, 5, 5];
        let ways = |m: u64| {
            let mut v = Vec::new();
            let mut m = m;
            while m != 0 {
                v.push(m.trailing_zeros() / 8);
                m &= m - 1;
            }
            v
        };
        // The last byte is the count of leases gone past, never a way.
        assert_eq!(ways(b.matching(5)), vec![0, 2, 6]);
        assert_eq!(ways(b.matching(200)), vec![4]);
        assert!(ways(b.matching(9)).contains(&1));
        assert!(ways(b.matching(7)).iter().all(|&w| w != 7));
    }

    #[test]
    fn leases_of_one_home_overflow_and_are_found_past_it() {
        let mut map = LineMap::with_buckets(64);
        // One home (the spread hash's low bits are `h`'s bits 32 on), 40
        // leases, their tags different.
        let h = |i: u64| (i << 40) | ((i & 0xff) << 24);
        for i in 0..40 {
            map.get_or_insert_with(h(i), || lease(h(i)));
        }
        assert_eq!(map.len(), 40);
        passed_counts_hold(&map);
        for i in 0..40 {
            assert_eq!(map.get(h(i)).map(|l| l.table_key()), Some(h(i)));
        }
        assert!(map.get(h(40)).is_none());
        // Out of the middle of the run: the ones after it are still found.
        for i in (0..40).step_by(3) {
            assert!(map.remove(h(i)).is_some());
        }
        passed_counts_hold(&map);
        for i in 0..40 {
            assert_eq!(map.get(h(i)).is_some(), i % 3 != 0, "{i}");
        }
    }

    #[test]
    fn a_stuck_count_still_finds_everything() {
        let mut map = LineMap::with_buckets(64);
        let mut grown = false;
        // More leases of one home than a count holds: the map grows first
        // (its bound), so stick the count by hand.
        map.buckets[3].meta[WAYS] = STUCK;
        map.buckets[4].meta[WAYS] = STUCK;
        let h = |i: u64| (i << 40) | (3 << 32);
        for i in 0..20u64 {
            map.get_or_insert_with(h(i), || lease(h(i)));
            grown |= map.buckets.len() != 64;
        }
        assert!(!grown);
        assert_eq!(map.buckets[5].passed(), 0, "7 + 7 + 6: the run ends in bucket 5");
        for i in 0..20u64 {
            assert_eq!(map.get(h(i)).map(|l| l.table_key()), Some(h(i)));
        }
        for i in 0..20u64 {
            assert!(map.remove(h(i)).is_some());
        }
        assert_eq!(map.buckets[3].passed(), STUCK, "stuck stays stuck");
        assert!(map.get(h(99)).is_none());
    }

    proptest! {
        /// Against a std `HashMap`: any run of inserts, removals and
        /// retains, on hashes crowded into few homes or spread out.
        #[test]
        fn behaves_as_a_map(ops in prop::collection::vec((0u8..4, 0u64..300, any::<bool>()), 1..600)) {
            let mut map = LineMap::default();
            let mut model: HashMap<u64, ()> = HashMap::new();
            for (op, k, crowded) in ops {
                // Crowded: few distinct homes, many overflows.
                let h = if crowded {
                    (k << 40) | ((k % 3) << 32) | ((k & 0xff) << 24)
                } else {
                    k.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                };
                match op {
                    0 | 1 => {
                        map.get_or_insert_with(h, || lease(h));
                        model.insert(h, ());
                    }
                    2 => prop_assert_eq!(map.remove(h).is_some(), model.remove(&h).is_some()),
                    _ => {
                        map.retain(|l| l.table_key() % 5 != k % 5);
                        model.retain(|h, _| h % 5 != k % 5);
                    }
                }
                prop_assert_eq!(map.len(), model.len());
            }
            passed_counts_hold(&map);
            for h in model.keys() {
                prop_assert_eq!(map.get(*h).map(|l| l.table_key()), Some(*h));
            }
            prop_assert_eq!(map.iter().count(), model.len());
        }
    }
}
