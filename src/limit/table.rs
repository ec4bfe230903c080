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

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::lease::Lease;
use super::near;
use crate::sync::Recover;

pub const SHARDS: usize = 64;

type Shard = RwLock<crate::int_hash::IntMap<u64, Arc<Lease>>>;

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
pub type Evicted = Vec<Arc<Lease>>;

impl LeaseTable {
    pub fn new(max_keys: usize) -> LeaseTable {
        LeaseTable {
            id: super::near::new_table_id(),
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::default())).collect(),
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

    fn shard(&self, h: u64) -> &Shard {
        &self.shards[(h >> 58) as usize % SHARDS]
    }

    /// Runs `f` on the lease of `h`, if there is one: from this thread's
    /// front when it keeps the lease (no lock), else under the shard's read
    /// lock, offering the lease to the front on its second miss there.
    #[inline]
    pub fn with<T>(&self, h: u64, f: impl FnOnce(&Lease) -> T) -> Option<T> {
        let mut f = Some(f);
        if let Some(t) = near::with(self.id, h, |l| f.take().map(|f| f(l))).flatten() {
            return Some(t);
        }
        // Taken only by a hit, which returned.
        let f = f.take()?;
        let (t, keep) = {
            let shard = self.shard(h).read().recover();
            let lease = shard.get(&h)?;
            (f(lease), near::wants(self.id, h).then(|| lease.clone()))
        };
        if let Some(lease) = keep {
            near::keep(self.id, h, lease);
        }
        Some(t)
    }

    pub fn get(&self, h: u64) -> Option<Arc<Lease>> {
        self.shard(h).read().recover().get(&h).cloned()
    }

    /// The lease of `h`, made if there is none. At a full shard an eighth
    /// of its leases are evicted first and returned, for their tokens to go
    /// back to the store.
    pub fn get_or_insert(&self, h: u64, key: &str) -> (Arc<Lease>, Evicted) {
        if let Some(l) = self.get(h) {
            return (l, Vec::new());
        }
        let mut shard = self.shard(h).write().recover();
        let mut evicted = Vec::new();
        if shard.len() >= self.per_shard_cap && !shard.contains_key(&h) {
            let batch = (self.per_shard_cap / 8).max(1);
            // Idle leases first: nothing at hand, nobody holding them.
            let mut victims: Vec<u64> = shard
                .iter()
                .filter(|(_, l)| l.available() == 0 && !near::is_held(l))
                .map(|(k, _)| *k)
                .take(batch)
                .collect();
            if victims.is_empty() {
                // Every lease holds tokens or is in use: the cap still holds.
                // From a random place in the shard, so no lease is spared
                // for where its hash happens to sit in the map.
                let from = fastrand::usize(..shard.len().max(1));
                victims = shard
                    .keys()
                    .copied()
                    .cycle()
                    .skip(from)
                    .take(batch.min(shard.len()))
                    .collect();
            }
            for v in victims {
                if let Some(lease) = shard.remove(&v) {
                    lease.evict();
                    evicted.push(lease);
                }
            }
        }
        let lease = shard.entry(h).or_insert_with(|| Arc::new(Lease::new(key))).clone();
        (lease, evicted)
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().recover().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Visits every lease, shard by shard, under a read lock.
    pub fn for_each(&self, mut f: impl FnMut(&Arc<Lease>)) {
        for shard in self.shards.iter() {
            let map = shard.read().recover();
            map.values().for_each(&mut f);
        }
    }

    /// The lease whose store key is `key`, by a scan of the whole table
    /// (one shard's read lock at a time), comparing keys. The table is keyed
    /// by a hash of the key's parts, which the string cannot give back (a
    /// header value's `:` is hashed into the string, an IP is hashed by its
    /// octets), so there is no lookup by string. Bounded by the table's
    /// capacity (`[store] max_keys`): for the admin endpoint only, never for
    /// requests.
    pub fn find(&self, key: &str) -> Option<Arc<Lease>> {
        self.find_all(&[key]).pop().flatten()
    }

    /// The leases of `keys`, in their order, in one scan of the table
    /// (however many keys are asked for).
    pub fn find_all(&self, keys: &[&str]) -> Vec<Option<Arc<Lease>>> {
        let wanted: std::collections::HashMap<&str, usize> = keys.iter().enumerate().map(|(i, k)| (*k, i)).collect();
        let mut found = vec![None; keys.len()];
        let mut left = wanted.len();
        for shard in self.shards.iter() {
            let map = shard.read().recover();
            for lease in map.values() {
                if let Some(&i) = wanted.get(lease.key()) {
                    if found[i].is_none() {
                        found[i] = Some(lease.clone());
                        left -= 1;
                    }
                }
            }
            if left == 0 {
                break;
            }
        }
        // A key asked for twice gets its lease twice.
        for (i, k) in keys.iter().enumerate() {
            if found[i].is_none() {
                if let Some(&j) = wanted.get(k) {
                    found[i] = found[j].clone();
                }
            }
        }
        found
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
            for lease in map.values().take(max - seen) {
                f(lease);
                seen += 1;
            }
        }
        seen
    }

    /// Keeps the leases `keep` approves, shard by shard, under a write lock.
    pub fn retain(&self, mut keep: impl FnMut(&Arc<Lease>) -> bool) {
        for shard in self.shards.iter() {
            let mut map = shard.write().recover();
            map.retain(|_, lease| {
                let kept = keep(lease);
                if !kept {
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
