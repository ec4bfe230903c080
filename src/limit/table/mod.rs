//! The lease table: one [`Lease`] per (limit, key) this instance has asked
//! the store about, keyed by a 64-bit keyed hash of the store key.
//!
//! The map holds no strings, so a lookup touches the table and the lease,
//! nothing else. Two keys would share a lease only on a full 64-bit
//! collision under a per-process random seed (about 1 in 10^7 for a million
//! live keys). Sharded so unrelated keys rarely share a lock; a lock is held
//! only for the lookup (and the atomic spend), never across an await. Each
//! thread's front (`near`) answers its hot keys without the lock.
//!
//! The cap is hard: a shard never holds more than its share of
//! `[store] max_keys`. A new key at a full shard evicts an eighth of it at
//! once (leases holding nothing and in nobody's hands first), so a flood of
//! new identities pays one scan per many inserts, not one per insert.
//! Evicted leases give their tokens back (see [`Evicted`]).
//!
//! Each shard also indexes its leases by a hash of the store key's string
//! ([`LeaseTable::find`]): the admin's key lookups are one probe per shard,
//! never a walk of the leases. The index costs the insert of a new key one
//! more hash, and the request path nothing.

mod line_map;

use std::sync::RwLock;

use super::lease::{Lease, SharedLease};
use super::thread_cache;
use crate::sync::Recover;
use line_map::LineMap;

pub use crate::int_hash::SHARDS;

/// One shard: the leases by request hash, and the same leases' request
/// hashes by the hash of their store key's string.
///
/// An entry of `leases` is the lease's pointer and a tag, in a bucket of
/// one cache line ([`LineMap`]): the request hash it is found by is the
/// lease's own ([`Lease::table_key`]), in the cache line a decision reads
/// anyway. Finding a lease not in cache waits for two lines, the bucket and
/// the lease; hashbrown's tags and entries apart made it three.
#[derive(Default)]
struct Maps {
    leases: LineMap,
    by_key: crate::int_hash::IntMap<u64, u64>,
}

impl Maps {
    /// Forgets `h`'s index entry, if it still points at `h`.
    fn unindex(&mut self, key_hash: u64, h: u64) {
        if self.by_key.get(&key_hash) == Some(&h) {
            self.by_key.remove(&key_hash);
        }
    }
}

type Shard = RwLock<Maps>;

pub struct LeaseTable {
    /// This table's entries in threads' fronts (see `near`).
    id: u64,
    shards: Box<[Shard]>,
    pub(super) hasher: foldhash::fast::RandomState,
    /// This table's random seed of request keys' hashes
    /// ([`LeaseTable::key_hasher`]).
    key_seed: u64,
    per_shard_cap: usize,
}

/// Leases a full shard let go of: their unspent tokens are owed to the
/// store. Leases someone still holds (a store call in flight) are marked
/// evicted and give back what that call brings when it ends.
pub type Evicted = Vec<SharedLease>;

impl LeaseTable {
    pub fn new(max_keys: usize) -> LeaseTable {
        LeaseTable {
            id: super::thread_cache::new_table_id(),
            shards: (0..SHARDS).map(|_| RwLock::new(Maps::default())).collect(),
            key_seed: fastrand::u64(..),
            hasher: foldhash::fast::RandomState::default(),
            per_shard_cap: max_keys.div_ceil(SHARDS).max(8),
        }
    }

    /// A hasher for the keys of the limit whose name is `name_id`: the
    /// name is folded into the table's random seed instead of written, so
    /// a key of one part is hashed by one write, without a final fold.
    pub(super) fn key_hasher(&self, name_id: u64) -> foldhash::fast::FoldHasher<'static> {
        foldhash::fast::FoldHasher::with_seed(self.key_seed ^ name_id, foldhash::SharedSeed::global_random())
    }

    /// Most leases the table holds.
    pub fn capacity(&self) -> usize {
        self.per_shard_cap * SHARDS
    }

    /// The index's hash of a store key's string.
    fn key_hash(&self, key: &str) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one(key)
    }

    fn shard(&self, h: u64) -> &Shard {
        &self.shards[crate::int_hash::shard_of(h)]
    }

    /// Runs `f` on the lease of `h`, if there is one: from this thread's
    /// front when it keeps the lease (no lock), else under the shard's read
    /// lock, offering the lease to the front on its second miss there.
    #[inline]
    pub fn with<T>(&self, h: u64, f: impl FnOnce(&SharedLease) -> T) -> Option<T> {
        let mut f = Some(f);
        if let Some(t) = thread_cache::with(self.id, h, |l| f.take().map(|f| f(l))).flatten() {
            return Some(t);
        }
        // Taken only by a hit, which returned.
        let f = f.take()?;
        let (t, keep) = {
            let shard = self.shard(h).read().recover();
            let lease = shard.leases.get(h)?;
            (f(lease), thread_cache::wants(self.id, h).then(|| lease.clone()))
        };
        if let Some(lease) = keep {
            thread_cache::keep(self.id, h, lease);
        }
        Some(t)
    }

    pub fn get(&self, h: u64) -> Option<SharedLease> {
        self.shard(h).read().recover().leases.get(h).cloned()
    }

    /// The lease of `h`, made if there is none. At a full shard an eighth
    /// of its leases are evicted first and returned, for their tokens to go
    /// back to the store.
    pub fn get_or_insert(&self, h: u64, key: &str) -> (SharedLease, Evicted) {
        if let Some(l) = self.get(h) {
            return (l, Vec::new());
        }
        let mut shard = self.shard(h).write().recover();
        let mut evicted = Vec::new();
        if shard.leases.len() >= self.per_shard_cap && shard.leases.get(h).is_none() {
            let batch = (self.per_shard_cap / 8).max(1);
            // Idle leases first: nothing at hand, nobody holding them.
            let mut victims: Vec<u64> = shard
                .leases
                .iter()
                .filter(|l| l.available() == 0 && !thread_cache::is_held(l))
                .map(|l| l.table_key())
                .take(batch)
                .collect();
            if victims.is_empty() {
                // Every lease holds tokens or is in use: the cap still holds.
                // From a random place in the shard, so no lease is spared
                // for where its hash happens to sit in the map.
                let from = fastrand::usize(..shard.leases.len().max(1));
                victims = shard
                    .leases
                    .iter()
                    .map(|l| l.table_key())
                    .cycle()
                    .skip(from)
                    .take(batch.min(shard.leases.len()))
                    .collect();
            }
            for v in victims {
                if let Some(lease) = shard.leases.remove(v) {
                    shard.unindex(self.key_hash(lease.key()), v);
                    lease.evict();
                    evicted.push(lease);
                }
            }
        }
        let shard = &mut *shard;
        let mut made = false;
        let lease = shard.leases.get_or_insert_with(h, || {
            made = true;
            SharedLease::new(Lease::new(key, h))
        });
        if made {
            shard.by_key.insert(self.key_hash(key), h);
        }
        (lease, evicted)
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().recover().leases.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Visits every lease, shard by shard, under a read lock.
    pub fn for_each(&self, mut f: impl FnMut(&SharedLease)) {
        for shard in self.shards.iter() {
            let map = shard.read().recover();
            map.leases.iter().for_each(&mut f);
        }
    }

    /// The lease whose store key is `key`: one probe of each shard's index
    /// (under its read lock), then the key compared. For the admin
    /// endpoint; requests find their lease by the hash of its parts.
    pub fn find(&self, key: &str) -> Option<SharedLease> {
        let kh = self.key_hash(key);
        self.shards.iter().find_map(|shard| {
            let maps = shard.read().recover();
            let h = maps.by_key.get(&kh)?;
            maps.leases.get(*h).filter(|l| l.key() == key).cloned()
        })
    }

    /// [`LeaseTable::find`] of each of `keys`, in order.
    pub fn find_all(&self, keys: &[&str]) -> Vec<Option<SharedLease>> {
        keys.iter().map(|k| self.find(k)).collect()
    }

    /// Visits at most `max` leases, whole shards at a time starting at shard
    /// `start` (mod [`SHARDS`]), each under its read lock: a bounded sample
    /// of a table that may hold far more. Returns how many were visited.
    pub fn sample(&self, start: usize, max: usize, mut f: impl FnMut(&Lease)) -> usize {
        let mut seen = 0;
        for i in 0..SHARDS {
            if seen >= max {
                break;
            }
            let map = self.shards[(start + i) % SHARDS].read().recover();
            for lease in map.leases.iter().take(max - seen) {
                f(lease);
                seen += 1;
            }
        }
        seen
    }

    /// Keeps the leases `keep` approves, shard by shard, under a write lock.
    pub fn retain(&self, mut keep: impl FnMut(&SharedLease) -> bool) {
        for shard in self.shards.iter() {
            let mut map = shard.write().recover();
            let Maps { leases, by_key } = &mut *map;
            leases.retain(|lease| {
                let kept = keep(lease);
                if !kept {
                    let h = lease.table_key();
                    let kh = self.key_hash(lease.key());
                    if by_key.get(&kh) == Some(&h) {
                        by_key.remove(&kh);
                    }
                    lease.evict();
                }
                kept
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_hard_even_when_every_lease_holds_tokens() {
        let table = LeaseTable::new(1_024);
        let cap = table.capacity();
        let mut evicted = 0;
        for i in 0..20_000u64 {
            let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let (lease, out) = table.get_or_insert(h, "k");
            lease.give_back(3); // holds tokens
            evicted += out.len();
            assert!(out.iter().all(|l| l.is_evicted()));
            assert!(table.len() <= cap, "{} > {cap}", table.len());
        }
        assert_eq!(table.len() + evicted, 20_000);
    }

    #[test]
    fn find_compares_store_keys_and_sample_stops_at_its_bound() {
        let table = LeaseTable::new(100_000);
        for i in 0..1_000u64 {
            table.get_or_insert(i.wrapping_mul(0x9E37_79B9_7F4A_7C15), &format!("rl:{{l:{i}}}"));
        }
        assert_eq!(
            table.find("rl:{l:999}").map(|l| l.key().to_string()),
            Some("rl:{l:999}".into())
        );
        assert!(table.find("rl:{l:1000}").is_none());
        for start in [0, 17, 63, 64] {
            let mut seen = 0;
            assert_eq!(table.sample(start, 100, |_| seen += 1), 100);
            assert_eq!(seen, 100);
        }
        let mut keys = std::collections::HashSet::new();
        assert_eq!(
            table.sample(5, 5_000, |l| {
                keys.insert(l.key().to_string());
            }),
            1_000
        );
        assert_eq!(keys.len(), 1_000, "every lease once");
    }

    #[test]
    fn the_key_index_follows_evictions_and_sweeps() {
        let table = LeaseTable::new(8 * SHARDS);
        let key = |i: u64| format!("rl:{{l:{i}}}");
        // A full shard (same top six bits): every insert past 8 evicts.
        let h = |i: u64| (9u64 << 58) | i;
        for i in 0..40 {
            table.get_or_insert(h(i), &key(i));
            let indexed = table.shards[9].read().unwrap().by_key.len();
            assert_eq!(
                indexed,
                table.shards[9].read().unwrap().leases.len(),
                "one entry a lease"
            );
        }
        for i in 0..40 {
            let found = table.find(&key(i)).map(|l| l.key().to_string());
            let held = table.get(h(i)).is_some();
            assert_eq!(found.is_some(), held, "key {i}");
        }
        table.retain(|l| l.key() != key(39));
        assert!(table.find(&key(39)).is_none());
        assert_eq!(table.shards[9].read().unwrap().by_key.len(), table.len());
    }

    #[test]
    fn a_lease_is_found_by_the_hash_it_keeps_through_growth_and_removal() {
        let table = LeaseTable::new(100_000);
        let h = |i: u64| i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for i in 0..10_000 {
            table.get_or_insert(h(i), &format!("k{i}"));
        }
        assert_eq!(table.len(), 10_000);
        // Hashes that differ only in their low bits, in one shard.
        for i in 0..200 {
            table.get_or_insert((7u64 << 58) | i, &format!("low{i}"));
        }
        for i in 0..10_000 {
            let lease = table.get(h(i)).expect("found");
            assert_eq!((lease.table_key(), lease.key()), (h(i), format!("k{i}").as_str()));
        }
        for i in 0..200 {
            assert_eq!(
                table.get((7u64 << 58) | i).map(|l| l.key().to_string()),
                Some(format!("low{i}"))
            );
        }
        table.retain(|l| !l.key().starts_with("k1"));
        for i in 0..10_000 {
            let gone = format!("k{i}").starts_with("k1");
            assert_eq!(table.get(h(i)).is_none(), gone, "k{i}");
            assert_eq!(table.with(h(i), |l| l.key().to_string()).is_none(), gone);
        }
        let (again, _) = table.get_or_insert(h(1), "k1");
        assert_eq!(again.table_key(), h(1), "made again, with its hash");
    }

    #[test]
    fn idle_leases_go_first() {
        let table = LeaseTable::new(8 * SHARDS);
        // Fill one shard: hashes with the same top six bits.
        let h = |i: u64| (5u64 << 58) | i;
        for i in 0..8 {
            let (lease, _) = table.get_or_insert(h(i), "k");
            if i != 3 {
                lease.give_back(1);
            }
        }
        let (_, evicted) = table.get_or_insert(h(100), "k");
        assert_eq!(evicted.len(), 1);
        assert_eq!(evicted[0].available(), 0, "the lease holding nothing went");
        assert!(table.get(h(3)).is_none());
    }
}
