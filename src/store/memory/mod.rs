//! The embedded store: one instance, exact, the same math as Redis, with
//! bounded memory.
//!
//! Keys live in shards, each a mutex over a slot vector and its index, so
//! unrelated keys rarely meet on a lock (and a lock is held for a few hundred
//! nanoseconds, never across an await). Memory is bounded two ways:
//!
//! - **Idle eviction**: a bucket that would have refilled completely (a
//!   sliding window two periods old) changes no future decision, so it is
//!   dropped. Each call inspects the next slot of its shard in turn, so
//!   idle state disappears at the rate new state arrives.
//! - **A hard cap** (`[store] max_keys`, default 1,000,000, enforced per
//!   shard as `max_keys / 64`): when a shard is full, the least recently used
//!   of 16 randomly sampled keys is evicted (Redis's approximated LRU). Evicting a key forgets its usage: that
//!   client starts again with a full bucket.
//!
//! Memory per key: about 120 bytes plus the key's length (a 112-byte slot
//! and ~6 bytes of index; a 40-byte key costs ~160 bytes), so the default
//! cap is about 160 MB at worst.

use std::collections::HashMap;
use std::sync::Mutex;

mod fleet_tables;
mod shard;

use super::{BoxFuture, FleetTables, QuotaStore, StoreError, Unspent};
use crate::clock::{system_clock, Clock};
use crate::int_hash::{shard_of, SHARDS};
use crate::quota::{self, Grant, Spec};
use crate::sync::Recover;
use shard::Shard;

/// The overrides as `lua/overrides.lua` keeps them: (limit, who) → value.
type OverrideTable = std::collections::BTreeMap<(String, String), String>;

/// One member's entry in a table beside the buckets: (member, value,
/// expires at), a stream's demand or an instance's slots.
type MemberEntry = (u64, u64, u64);

pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: foldhash::fast::RandomState,
    per_shard_cap: usize,
    clock: Clock,
    /// RLQS streams' demands by bucket key, as `lua/fair_share.lua` keeps
    /// them; at most `max_keys` buckets.
    demands: Mutex<HashMap<String, Vec<MemberEntry>>>,
    /// Concurrency limits' slots by key, per member, as `lua/slots.lua`
    /// keeps them: (member, slots, expires at); at most `max_keys` keys.
    slots: Mutex<HashMap<String, Vec<MemberEntry>>>,
    /// The overrides, by (limit, who), and their version.
    overrides: Mutex<(u64, OverrideTable)>,
    max_keys: usize,
}

impl MemoryStore {
    pub fn new(max_keys: usize) -> MemoryStore {
        MemoryStore::with_clock(max_keys, system_clock())
    }

    pub fn with_clock(max_keys: usize, clock: Clock) -> MemoryStore {
        let shards = (0..SHARDS)
            .map(|i| Mutex::new(Shard::seeded(0x9E37_79B9_7F4A_7C15 ^ (i as u64 + 1))))
            .collect();
        MemoryStore {
            shards,
            hasher: foldhash::fast::RandomState::default(),
            per_shard_cap: max_keys.div_ceil(SHARDS).max(1),
            clock,
            demands: Mutex::default(),
            slots: Mutex::default(),
            overrides: Mutex::default(),
            max_keys,
        }
    }

    /// `key`'s hash and its shard, picked by the hash's top bits (the
    /// shard's index places keys by the low ones).
    fn locate(&self, key: &str) -> (u64, &Mutex<Shard>) {
        use std::hash::BuildHasher;
        let h = self.hasher.hash_one(key);
        (h, &self.shards[shard_of(h)])
    }

    /// Keys held now, across shards.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().recover().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decides synchronously; the trait methods wrap this. The give-back and
    /// the acquire happen under one lock, as one step.
    pub fn acquire_now(&self, key: &str, spec: &Spec, want: u64, unspent: Unspent) -> Result<Grant, StoreError> {
        self.acquire_from(key, spec, want, unspent, spec.capacity, false)
    }

    /// [`acquire_now`](Self::acquire_now), reserving tokens to come when
    /// none is left ([`QuotaStore::acquire_or_reserve`]).
    pub fn reserve_now(&self, key: &str, spec: &Spec, want: u64, unspent: Unspent) -> Result<Grant, StoreError> {
        self.acquire_from(key, spec, want, unspent, spec.capacity, true)
    }

    /// [`acquire_now`](Self::acquire_now) for a key that, when this store
    /// does not hold it yet, starts with `start` tokens (at most its
    /// capacity) instead of a full bucket: the local fallback's first
    /// grant of an outage. All `want` or nothing (a request's reserve).
    pub fn acquire_starting(&self, key: &str, spec: &Spec, want: u64, start: u64) -> Result<Grant, StoreError> {
        let unspent = Unspent {
            need: want,
            ..Unspent::default()
        };
        self.acquire_from(key, spec, want, unspent, start, false)
    }

    fn acquire_from(
        &self,
        key: &str,
        spec: &Spec,
        want: u64,
        unspent: Unspent,
        start: u64,
        reserve: bool,
    ) -> Result<Grant, StoreError> {
        let now = (self.clock)();
        let (h, shard) = self.locate(key);
        let mut shard = shard.lock().recover();
        if start < spec.capacity && shard.find(key, h).is_none() {
            // The same math as every grant: a new key's full bucket, less
            // what it does not start with.
            let spent = spec.capacity - start;
            shard.update(key, h, spec, now, self.per_shard_cap, |prior| {
                quota::acquire_returning(prior, spec, now, spent, Unspent::default()).0
            });
        }
        let mut grant = Grant::default();
        shard.update(key, h, spec, now, self.per_shard_cap, |prior| {
            // A key we no longer hold was full (or its window empty): giving
            // back to it changes nothing, as in `release_now`.
            let (state, g) = quota::reserve_returning(prior, spec, now, want, unspent, reserve);
            grant = g;
            state
        });
        Ok(grant)
    }

    /// Drops `key`'s state, if held: its next grant starts anew.
    pub fn forget(&self, key: &str) {
        {
            let (h, shard) = self.locate(key);
            let mut shard = shard.lock().recover();
            if let Some(i) = shard.find(key, h) {
                shard.remove(i);
            }
        }
    }

    pub fn release_now(&self, key: &str, spec: &Spec, unspent: Unspent) -> Result<(), StoreError> {
        let now = (self.clock)();
        let (h, shard) = self.locate(key);
        let mut shard = shard.lock().recover();
        // Releasing to a key we no longer hold is a no-op: it was full.
        shard.update_held(key, h, spec, now, |prior| quota::release(prior, spec, now, unspent));
        Ok(())
    }
}

impl QuotaStore for MemoryStore {
    fn grant<'a>(
        &'a self,
        key: &'a str,
        spec: &'a Spec,
        want: u64,
        unspent: Unspent,
        reserve: bool,
    ) -> BoxFuture<'a, Result<Grant, StoreError>> {
        let result = if reserve {
            self.reserve_now(key, spec, want, unspent)
        } else {
            self.acquire_now(key, spec, want, unspent)
        };
        Box::pin(std::future::ready(result))
    }

    fn release<'a>(&'a self, key: &'a str, spec: &'a Spec, unspent: Unspent) -> BoxFuture<'a, Result<(), StoreError>> {
        let result = self.release_now(key, spec, unspent);
        Box::pin(std::future::ready(result))
    }

    fn name(&self) -> &'static str {
        "memory"
    }

    /// The embedded store always answers.
    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(std::future::ready(Ok(())))
    }
}

impl FleetTables for MemoryStore {
    /// The fleet is this instance: its streams' demands, in memory.
    fn fair_share<'a>(&'a self, d: super::Demand<'a>) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(std::future::ready(Ok(self.fair_share_now(d))))
    }

    /// The fleet is this instance: its overrides, in memory (gone with it).
    fn overrides<'a>(&'a self, op: super::OverrideOp<'a>) -> BoxFuture<'a, Result<super::Overridden, StoreError>> {
        Box::pin(std::future::ready(Ok(self.overrides_now(op))))
    }

    /// The fleet is this instance: its slots, in memory.
    fn hold_slots<'a>(&'a self, h: super::Hold<'a>) -> BoxFuture<'a, Result<super::Slots, StoreError>> {
        Box::pin(std::future::ready(Ok(self.hold_slots_now(h))))
    }

    /// Nobody else can share this store: the fleet is this instance.
    fn heartbeat(&self, _member: u64, _ttl_ms: u64) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(std::future::ready(Ok(1)))
    }

    /// The fleet is this instance: no other changes an override.
    fn watch_overrides(&self, _wake: std::sync::Arc<tokio::sync::Notify>) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::{Algorithm, Rate};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    const NONE: Unspent = Unspent {
        tokens: 0,
        window_ms: 0,
        charge: 0,
        need: 0,
    };

    #[test]
    fn streams_share_a_bucket_max_min_fairly_until_their_demands_expire() {
        let (now, c) = clock();
        let store = MemoryStore::with_clock(1000, c);
        let d = |member, demand| super::super::Demand {
            key: "rl:{rls:edge:tenant=acme}",
            member,
            demand,
            rate: 100_000,
            ttl_ms: 2_000,
        };
        assert_eq!(store.fair_share_now(d(1, 80_000)), 80_000, "alone: what it wants");
        assert_eq!(store.fair_share_now(d(2, 80_000)), 50_000);
        assert_eq!(
            store.fair_share_now(d(1, 80_000)),
            50_000,
            "a new report replaces the old"
        );
        assert_eq!(
            store.fair_share_now(d(3, 10_000)),
            10_000,
            "less than a split: what it wants"
        );
        // Stream 2 stops reporting: its demand goes with its TTL.
        now.fetch_add(1_500, Ordering::SeqCst);
        store.fair_share_now(d(1, 80_000));
        now.fetch_add(1_000, Ordering::SeqCst);
        assert_eq!(
            store.fair_share_now(d(1, 80_000)),
            80_000,
            "2 and 3 expired: alone again"
        );
        // A stream that ends leaves at once, and the last one takes the key.
        store.fair_share_now(d(2, 80_000));
        store.fair_share_now(super::super::Demand::leave("rl:{rls:edge:tenant=acme}", 2));
        assert_eq!(store.fair_share_now(d(1, 80_000)), 80_000, "2 left: alone");
        store.fair_share_now(super::super::Demand::leave("rl:{rls:edge:tenant=acme}", 1));
        assert!(store.demands.lock().recover().is_empty());
    }

    #[test]
    fn slots_are_counted_per_member_and_leave_with_its_lease() {
        let (now, c) = clock();
        let store = MemoryStore::with_clock(2, c);
        let h = |member, hold, want| super::super::Hold {
            key: "rl:{gpu:acme}",
            member,
            hold,
            want,
            max: 3,
            ttl_ms: 1_000,
        };
        let s = |granted, held| super::super::Slots { granted, held };
        assert_eq!(store.hold_slots_now(h(1, 0, 2)), s(2, 2));
        assert_eq!(store.hold_slots_now(h(2, 0, 2)), s(1, 3), "only what fits beside 1's");
        assert_eq!(store.hold_slots_now(h(2, 1, 1)), s(0, 3), "full");
        // A call whose answer was lost: the next one says what is held.
        assert_eq!(store.hold_slots_now(h(1, 1, 0)), s(0, 2), "hold is absolute, not added");
        assert_eq!(store.hold_slots_now(h(2, 1, 1)), s(1, 3));
        // Member 1 dies: its slot is free once its lease expires.
        now.fetch_add(600, Ordering::SeqCst);
        assert_eq!(store.hold_slots_now(h(2, 2, 0)), s(0, 3), "2 renews");
        now.fetch_add(600, Ordering::SeqCst);
        assert_eq!(store.hold_slots_now(h(2, 2, 1)), s(1, 3), "1's slot expired");
        // Leaving (hold 0) frees everything; an empty key is forgotten.
        assert_eq!(store.hold_slots_now(h(2, 0, 0)), s(0, 0));
        // The key cap: no room for a third key while two hold slots.
        let other = |key| super::super::Hold { key, ..h(1, 0, 1) };
        assert_eq!(store.hold_slots_now(other("a")).granted, 1);
        assert_eq!(store.hold_slots_now(other("b")).granted, 1);
        assert_eq!(store.hold_slots_now(other("c")).granted, 0, "capped");
        now.fetch_add(2_000, Ordering::SeqCst);
        assert_eq!(store.hold_slots_now(other("c")).granted, 1, "room once a and b expired");
    }

    fn clock() -> (Arc<AtomicU64>, Clock) {
        let now = Arc::new(AtomicU64::new(1_000_000));
        let n = now.clone();
        (now, Arc::new(move || n.load(Ordering::SeqCst)))
    }

    /// A token bucket of `count` a `secs`, whole at `count`.
    pub(super) fn spec(count: u64, secs: u64) -> Spec {
        Spec::new(
            Algorithm::TokenBucket,
            Rate {
                count,
                period: Duration::from_secs(secs),
            },
            count,
        )
    }

    #[test]
    fn exact_per_key_and_independent_across_keys() {
        let (_, c) = clock();
        let store = MemoryStore::with_clock(1000, c);
        let s = spec(5, 60);
        let granted: u64 = (0..10)
            .map(|_| store.acquire_now("rl:{a}", &s, 1, NONE).unwrap().granted)
            .sum();
        assert_eq!(granted, 5);
        assert_eq!(store.acquire_now("rl:{b}", &s, 3, NONE).unwrap().granted, 3);
        let refused = store.acquire_now("rl:{a}", &s, 1, NONE).unwrap();
        assert_eq!(refused.retry_after_ms, 12_000);
    }

    #[test]
    fn release_returns_tokens_and_ignores_forgotten_keys() {
        let (_, c) = clock();
        let store = MemoryStore::with_clock(1000, c);
        let s = spec(5, 60);
        assert_eq!(store.acquire_now("k", &s, 5, NONE).unwrap().granted, 5);
        store
            .release_now(
                "k",
                &s,
                Unspent {
                    tokens: 2,
                    window_ms: 0,
                    ..Unspent::default()
                },
            )
            .unwrap();
        assert_eq!(store.acquire_now("k", &s, 5, NONE).unwrap().granted, 2);
        store
            .release_now(
                "never-seen",
                &s,
                Unspent {
                    tokens: 2,
                    window_ms: 0,
                    ..Unspent::default()
                },
            )
            .unwrap();
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn an_acquire_gives_back_first_in_the_same_step() {
        let (now, c) = clock();
        let store = MemoryStore::with_clock(1000, c);
        let s = spec(5, 60);
        assert_eq!(store.acquire_now("k", &s, 5, NONE).unwrap().granted, 5);
        // Two come back and three are asked for: the two are granted again.
        let back = Unspent {
            tokens: 2,
            window_ms: 0,
            ..Unspent::default()
        };
        let g = store.acquire_now("k", &s, 3, back).unwrap();
        assert_eq!((g.granted, g.remaining), (2, 0));
        // A give-back beyond the capacity is clamped to it.
        let g = store
            .acquire_now(
                "k",
                &s,
                0,
                Unspent {
                    tokens: 50,
                    window_ms: 0,
                    ..Unspent::default()
                },
            )
            .unwrap();
        assert_eq!(g.remaining, 5);

        // A sliding window: tokens go back to the window they came from,
        // here the previous one, which still weighs 3/4 of its count.
        let w = Spec::new(
            Algorithm::SlidingWindow,
            Rate {
                count: 8,
                period: Duration::from_secs(1),
            },
            8,
        );
        let start = now.load(Ordering::SeqCst);
        let taken = store.acquire_now("w", &w, 8, NONE).unwrap();
        assert_eq!((taken.granted, taken.window_ms), (8, start));
        now.fetch_add(1_250, Ordering::SeqCst);
        assert_eq!(store.acquire_now("w", &w, 8, NONE).unwrap().granted, 2);
        let back = Unspent {
            tokens: 4,
            window_ms: taken.window_ms,
            ..Unspent::default()
        };
        // Previous 8 → 4, weighing 3: room for 8 − 3 − 2 = 3.
        assert_eq!(store.acquire_now("w", &w, 8, back).unwrap().granted, 3);
    }

    #[test]
    fn idle_buckets_are_forgotten() {
        let (now, c) = clock();
        // The cap is enforced per shard; leave room for uneven shards.
        let store = MemoryStore::with_clock(100_000, c);
        let s = spec(1, 1);
        for i in 0..500 {
            store.acquire_now(&format!("k{i}"), &s, 1, NONE).unwrap();
        }
        assert_eq!(store.len(), 500);
        now.fetch_add(2_000, Ordering::SeqCst);
        // Every call sweeps the next slot of its shard; plenty of calls on
        // fresh keys clean out the idle ones.
        for i in 0..10_000 {
            store.acquire_now(&format!("fresh{i}"), &s, 0, NONE).unwrap();
        }
        assert!(store.len() < 100, "idle keys left: {}", store.len());
    }

    #[test]
    fn keys_keep_their_own_state_while_others_are_swept_and_moved() {
        let (now, c) = clock();
        // A cap no shard reaches (the kept keys, used once, would be the
        // first evicted): slots move by the sweep's removals alone.
        let store = MemoryStore::with_clock(SHARDS * 64, c);
        let kept = spec(100, 3600); // hours to refill: never idle here
        let brief = spec(1, 1); // idle a second after its grant
        let mut rng = 7u64;
        for round in 0..40u64 {
            for i in 0..50 {
                // Key i of the kept ones has spent i % 7 + 1 tokens.
                if round == 0 {
                    let spent = store.acquire_now(&format!("kept{i}"), &kept, i % 7 + 1, NONE).unwrap();
                    assert_eq!(spent.granted, i % 7 + 1);
                }
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                store
                    .acquire_now(&format!("brief{}", rng % 500), &brief, 1, NONE)
                    .unwrap();
            }
            now.fetch_add(700, Ordering::SeqCst);
        }
        // Every kept key still knows what it spent: taking 0 reports it.
        for i in 0..50u64 {
            let g = store.acquire_now(&format!("kept{i}"), &kept, 0, NONE).unwrap();
            assert_eq!(g.remaining, 100 - (i % 7 + 1), "kept{i}");
        }
        // The brief keys went idle and are swept (not only capped out) by
        // calls on keys that leave nothing behind, in every shard.
        now.fetch_add(2_000, Ordering::SeqCst);
        for i in 0..20_000 {
            store.acquire_now(&format!("fresh{i}"), &brief, 0, NONE).unwrap();
        }
        assert_eq!(store.len(), 50, "only the kept keys are left");
    }

    #[test]
    fn the_cap_holds_and_evicts_the_least_recently_used() {
        let (now, c) = clock();
        let store = MemoryStore::with_clock(SHARDS * 4, c);
        let s = spec(100, 3600);
        store.acquire_now("hot", &s, 1, NONE).unwrap();
        for i in 0..10_000 {
            now.fetch_add(1, Ordering::SeqCst);
            store.acquire_now(&format!("k{i}"), &s, 1, NONE).unwrap();
            if i % 10 == 0 {
                store.acquire_now("hot", &s, 1, NONE).unwrap();
            }
        }
        assert!(store.len() <= SHARDS * 4);
        // The hot key survived: it still remembers its spending.
        assert!(store.acquire_now("hot", &s, 100, NONE).unwrap().granted < 100);
    }

    #[test]
    fn concurrent_callers_share_one_exact_bucket() {
        let store = Arc::new(MemoryStore::new(1000));
        let s = spec(1000, 86_400);
        let total = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (store, total) = (store.clone(), total.clone());
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        total.fetch_add(
                            store.acquire_now("shared", &s, 1, NONE).unwrap().granted,
                            Ordering::SeqCst,
                        );
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(total.load(Ordering::SeqCst), 1000);
    }
}
