//! The memory store is the Lua scripts' twin: `run` with `[store] kind =
//! "memory"`, the fallback buckets and `leasegate simulate` decide with it.
//! Here it is held to the real scripts on a real `redis-server`, operation
//! for operation, over random sequences: the quota algorithms and the
//! fleet's tables: concurrency slots (`lua/slots.lua`),
//! RLQS fair shares (`lua/fair_share.lua`) and overrides
//! (`lua/overrides.lua`).

use std::time::Duration;

use leasegate::quota::Algorithm;
use leasegate::quota::Unspent;
use leasegate::store::memory::MemoryStore;
use leasegate::store::redis::{RedisStore, Target};
use leasegate::store::{Acquire as _, Demand, FleetTables as _, Hold, Overridden, OverrideOp, QuotaStore as _};

use crate::redis_store::{reserve_retrying, spec};
use crate::support::redis::Redis;

/// Random acquires (with and without give-backs) and releases, the same on
/// both stores: with a quota that refills too slowly to move during the
/// test, every grant must match. Give-backs and releases go to the window
/// the tokens came from, or on purpose to an older, the previous or a later
/// window.
#[tokio::test]
async fn redis_and_memory_stores_agree_decision_for_decision() {
    let redis = Redis::start();
    let store = RedisStore::start(&Target::Node(redis.url())).unwrap();
    let memory = MemoryStore::new(10_000);
    let specs = [
        spec(Algorithm::TokenBucket, "50/day", 20),
        spec(Algorithm::TokenBucket, "1000/day", 1000),
        spec(Algorithm::SlidingWindow, "30/day", 30),
        spec(Algorithm::FixedWindow, "40/day", 40),
        // Calendar quotas: the scripts' civil dates against the Rust ones.
        spec(Algorithm::FixedWindow, "40/month", 40),
        spec(Algorithm::FixedWindow, "25/week", 25),
    ];
    // Tokens each key holds, by the window they were granted in.
    let mut held: std::collections::HashMap<String, Vec<(u64, u64)>> = Default::default();
    let mut rng = fastrand::Rng::with_seed(7);
    for step in 0..800 {
        let which = rng.usize(..specs.len());
        let spec = &specs[which];
        let key = format!("rl:{{diff:{which}:{}}}", rng.u8(..3));
        let lots = held.entry(key.clone()).or_default();
        let unspent = match (rng.u8(..3), lots.pop()) {
            (0, _) | (_, None) => Unspent::default(),
            (_, Some((window_ms, n))) => {
                let tokens = rng.u64(1..=n + 2);
                if n > tokens {
                    lots.push((window_ms, n - tokens));
                }
                let p = spec.period_ms();
                let window_ms = match rng.u8(..6) {
                    0 => window_ms.saturating_sub(2 * p),
                    1 => window_ms.saturating_sub(p),
                    2 => window_ms + p,
                    _ => window_ms,
                };
                Unspent {
                    tokens,
                    window_ms,
                    ..Unspent::default()
                }
            }
        };
        if rng.u8(..4) == 0 && unspent.tokens > 0 {
            store.release(&key, spec, unspent).await.unwrap();
            memory.release(&key, spec, unspent).await.unwrap();
            continue;
        }
        let want = rng.u64(0..12);
        // A third of the asks may reserve (a drained token bucket then
        // goes into debt, alike on both).
        let reserve = rng.u8(..3) == 0;
        // Some carry a cost's charge (the key may go into debt), and some
        // need several tokens at once or nothing.
        let mut unspent = unspent;
        if rng.u8(..4) == 0 {
            unspent.charge = rng.u64(1..30);
        }
        if rng.u8(..3) == 0 {
            unspent.need = rng.u64(0..=want.max(1));
        }
        let r = reserve_retrying(&store, &key, spec, want, unspent, reserve).await;
        let m = if reserve {
            memory.acquire_or_reserve(&key, spec, want, unspent).await.unwrap()
        } else {
            memory.acquire(&key, spec, want, unspent).await.unwrap()
        };
        assert_eq!(
            (r.granted, r.remaining, r.window_ms, r.reserved, r.owed),
            (m.granted, m.remaining, m.window_ms, m.reserved, m.owed),
            "step {step}: {key} want {want} reserve {reserve} {unspent:?}: redis {r:?} memory {m:?}"
        );
        if m.granted + m.reserved > 0 {
            held.entry(key).or_default().push((m.window_ms, m.granted + m.reserved));
        }
        // Times differ only by the milliseconds between the two calls.
        let close = |a: u64, b: u64| a.abs_diff(b) <= 2_000;
        assert!(close(r.reset_ms, m.reset_ms), "step {step}: {r:?} {m:?}");
        assert!(close(r.retry_after_ms, m.retry_after_ms), "step {step}: {r:?} {m:?}");
        if r.granted > 0 || unspent.need <= 1 || want == 0 {
            assert_eq!(r.retry_after_ms == 0, r.remaining > 0, "step {step}: {r:?}");
        } else {
            // Refused for want of `need`: the wait until they fit.
            assert!(r.granted == 0 && r.retry_after_ms > 0, "step {step}: {r:?} {unspent:?}");
        }
    }
}

/// The store once Redis answers (the first call may race its start).
async fn answering(redis: &Redis) -> RedisStore {
    let store = RedisStore::start(&Target::Node(redis.url())).unwrap();
    crate::support::eventually(
        Duration::from_secs(10),
        async || store.overrides(OverrideOp::Version).await.ok().map(|_| ()),
        || "Redis never answered".into(),
    )
    .await;
    store
}

/// An overrides answer with its entries in one order (Redis answers a
/// hash's fields in its own).
fn sorted(mut o: Overridden) -> Overridden {
    o.entries.sort();
    o
}

#[tokio::test]
async fn redis_and_memory_fleet_tables_agree_operation_for_operation() {
    let redis = Redis::start();
    let store = answering(&redis).await;
    let memory = MemoryStore::new(10_000);
    let limits = ["a".to_string(), "b".to_string(), "c".to_string()];
    let mut rng = fastrand::Rng::with_seed(11);
    // Entries live a minute: none expires during the run, so both sides
    // see the same table whatever their clocks read. Expiry is checked
    // on its own below.
    let ttl_ms = 60_000;
    for step in 0..1_500 {
        match rng.u8(..3) {
            0 => {
                let key = format!("rl:{{slots:{}}}", rng.u8(..2));
                let h = Hold {
                    key: &key,
                    member: rng.u64(1..=4),
                    // Renewals (want 0), leaves (hold 0, want 0), a
                    // member's own count off by a lost answer.
                    hold: rng.u64(0..5),
                    want: rng.u64(0..6),
                    max: rng.u64(1..12),
                    ttl_ms,
                };
                let r = store.hold_slots(h).await.unwrap();
                let m = memory.hold_slots(h).await.unwrap();
                assert_eq!((r.granted, r.held), (m.granted, m.held), "step {step}: {h:?}");
            }
            1 => {
                let key = format!("rl:{{share:{}}}", rng.u8(..2));
                let leaves = rng.u8(..6) == 0;
                let d = Demand {
                    key: &key,
                    member: rng.u64(1..=5),
                    demand: rng.u64(0..5_000),
                    rate: rng.u64(1..10_000),
                    ttl_ms: if leaves { 0 } else { ttl_ms },
                };
                let r = store.fair_share(d).await.unwrap();
                let m = memory.fair_share(d).await.unwrap();
                assert_eq!(r, m, "step {step}: {d:?}");
            }
            _ => {
                let limit = &limits[rng.usize(..limits.len())];
                let who = format!("key:{}", rng.u8(..4));
                let value = format!("{{\"rate\":\"{}/s\"}}", rng.u8(1..50));
                let op = match rng.u8(..5) {
                    0 | 1 => OverrideOp::Set {
                        limit,
                        who: &who,
                        value: &value,
                    },
                    2 => OverrideOp::Delete { limit, who: &who },
                    3 => OverrideOp::Version,
                    _ => OverrideOp::Load(&limits[..rng.usize(1..=limits.len())]),
                };
                let r = sorted(store.overrides(op).await.unwrap());
                let m = sorted(memory.overrides(op).await.unwrap());
                assert_eq!(
                    (r.version, r.full, &r.entries),
                    (m.version, m.full, &m.entries),
                    "step {step}: {op:?}"
                );
            }
        }
    }
}

/// Expired entries leave both tables alike: a member's slots and a
/// stream's demand count only for their ttl.
#[tokio::test]
async fn expired_slots_and_demands_leave_both_tables() {
    let redis = Redis::start();
    let store = answering(&redis).await;
    let memory = MemoryStore::new(10_000);
    let both = |h: Hold<'static>| {
        let (store, memory) = (&store, &memory);
        async move { (store.hold_slots(h).await.unwrap(), memory.hold_slots(h).await.unwrap()) }
    };
    let hold = |member, hold, want, ttl_ms| Hold {
        key: "rl:{expiry}",
        member,
        hold,
        want,
        max: 5,
        ttl_ms,
    };
    let (r, m) = both(hold(1, 0, 4, 100)).await;
    assert_eq!((r.granted, m.granted), (4, 4));
    let (r, m) = both(hold(2, 0, 4, 60_000)).await;
    assert_eq!((r.granted, m.granted), (1, 1), "member 1's 4 still count");
    let demand = |member, demand, ttl_ms| Demand {
        key: "rl:{expiring-share}",
        member,
        demand,
        rate: 1_000,
        ttl_ms,
    };
    assert_eq!(store.fair_share(demand(1, 900, 100)).await.unwrap(), 900);
    assert_eq!(memory.fair_share(demand(1, 900, 100)).await.unwrap(), 900);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Member 1's slots and stream 1's demand have expired on both sides.
    let (r, m) = both(hold(2, 1, 4, 60_000)).await;
    assert_eq!((r.granted, r.held), (m.granted, m.held));
    assert_eq!((r.granted, r.held), (4, 5));
    let r = store.fair_share(demand(2, 900, 60_000)).await.unwrap();
    let m = memory.fair_share(demand(2, 900, 60_000)).await.unwrap();
    assert_eq!((r, m), (900, 900));
}
