//! Slots on one store shared by two limiters: a fleet of two instances.

use super::*;
use crate::clock::Clock;
use crate::limit::policy::{Draft, Limit, Mode, StoreFailure};
use crate::limit::testing::{facts, settings};
use crate::limit::{Decision, LimitRuntime, Limiter};
use crate::quota::{Algorithm, Rate};
use crate::store::memory::MemoryStore;
use crate::store::FleetStore;
use crate::telemetry::metrics::Metrics;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

fn concurrency(max: u64, mode: Mode) -> Arc<LimitRuntime> {
    let config = Arc::new(
        Limit::try_new(Draft {
            algorithm: Algorithm::Concurrency,
            burst: max,
            mode,
            ..Draft::new(
                "gpu",
                Rate {
                    count: max,
                    period: Duration::from_secs(1),
                },
            )
        })
        .unwrap(),
    );
    Arc::new(LimitRuntime::new(config, "test", &Metrics::new()))
}

fn fleet(n: usize) -> (Arc<AtomicU64>, Arc<MemoryStore>, Vec<Arc<Limiter>>) {
    let now = Arc::new(AtomicU64::new(1_000_000));
    let read = now.clone();
    let clock: Clock = Arc::new(move || read.load(Ordering::SeqCst));
    let store = Arc::new(MemoryStore::with_clock(1_000, clock.clone()));
    let limiters = (0..n)
        .map(|_| Limiter::new(store.clone() as Arc<dyn FleetStore>, settings(), clock.clone()))
        .collect();
    (now, store, limiters)
}

/// Checks one request: its decision, and the slots it holds.
async fn ask(l: &Arc<Limiter>, limits: &[Arc<LimitRuntime>]) -> (Decision, Vec<Held>, u64) {
    let h = http::HeaderMap::new();
    let mut v = l
        .check(
            &crate::limit::testing::pick(limits, &[0]),
            &[],
            &facts("acme", &h),
            StoreFailure::Allow,
        )
        .await;
    let retry = v
        .refused_at()
        .and_then(|i| v.limits.get(i))
        .map_or(0, |lv| lv.retry_after_ms);
    v.commit();
    (v.decision, v.take_held(), retry)
}

#[tokio::test]
async fn a_fleet_of_two_runs_at_most_max_and_a_slot_back_is_taken_again() {
    let (_now, _store, fleet) = fleet(2);
    let limits = [concurrency(3, Mode::Enforce)];
    let mut running = Vec::new();
    let mut admitted = 0;
    for i in 0..6 {
        let (d, held, retry) = ask(&fleet[i % 2], &limits).await;
        if d == Decision::Admit {
            admitted += 1;
            running.extend(held);
        } else {
            assert_eq!(d, Decision::Refuse { at: 0 });
            assert_eq!(retry, FULL_MS, "refused with a retry");
        }
    }
    assert_eq!(admitted, 3, "exactly max in flight across the fleet");
    // One ends on instance 0: instance 0 takes its slot again from memory.
    let ended = running
        .iter()
        .position(|h| Arc::ptr_eq(&h.table, &fleet[0].slots))
        .unwrap();
    running.remove(ended);
    assert!(matches!(
        fleet[0].slots.slot_now(first_hash(&fleet[0]), 3, &fleet[0].clock),
        Some(Taken::Slot(..))
    ));
}

fn first_hash(l: &Limiter) -> u64 {
    *l.slots
        .shards
        .iter()
        .find_map(|s| s.lock().unwrap().keys().next().copied())
        .as_ref()
        .unwrap()
}

#[tokio::test]
async fn an_idle_slot_of_a_contended_key_goes_back_for_another_instance() {
    let (_now, _store, fleet) = fleet(2);
    let limits = [concurrency(2, Mode::Enforce)];
    let (_, a1, _) = ask(&fleet[0], &limits).await;
    let (_, a2, _) = ask(&fleet[0], &limits).await;
    let (d, _, _) = ask(&fleet[1], &limits).await;
    assert_eq!(d, Decision::Refuse { at: 0 }, "both slots are instance 0's");
    drop(a1);
    // Instance 0 keeps it idle until its renewer gives it back: contended.
    SlotRenewer::of(&fleet[0]).renew(false).await;
    // Instance 1's refusal is remembered for FULL_MS: move past it.
    _now.fetch_add(FULL_MS + 1, Ordering::SeqCst);
    let (d, b1, _) = ask(&fleet[1], &limits).await;
    assert_eq!(d, Decision::Admit, "the slot went back to the store");
    let (d, _, _) = ask(&fleet[0], &limits).await;
    assert_eq!(d, Decision::Refuse { at: 0 }, "and is no longer instance 0's");
    drop((a2, b1));
}

#[tokio::test]
async fn a_dead_instances_slots_come_back_after_its_lease_ttl() {
    let (now, _store, fleet) = fleet(2);
    let limits = [concurrency(1, Mode::Enforce)];
    let (_, held, _) = ask(&fleet[0], &limits).await;
    // Instance 0 dies holding it: nothing is given back, nothing renewed.
    std::mem::forget(held);
    let ttl = settings().sizing.ttl_ms;
    now.fetch_add(ttl - 1, Ordering::SeqCst);
    assert_eq!(
        ask(&fleet[1], &limits).await.0,
        Decision::Refuse { at: 0 },
        "within the TTL"
    );
    now.fetch_add(FULL_MS + 2, Ordering::SeqCst);
    assert_eq!(ask(&fleet[1], &limits).await.0, Decision::Admit, "after it");
}

#[tokio::test]
async fn renewals_keep_a_long_requests_slot_past_the_ttl() {
    let (now, _store, fleet) = fleet(2);
    let limits = [concurrency(1, Mode::Enforce)];
    let (_, held, _) = ask(&fleet[0], &limits).await;
    for _ in 0..10 {
        now.fetch_add(300, Ordering::SeqCst);
        SlotRenewer::of(&fleet[0]).renew(false).await;
    }
    assert_eq!(
        ask(&fleet[1], &limits).await.0,
        Decision::Refuse { at: 0 },
        "still held"
    );
    drop(held);
    SlotRenewer::of(&fleet[0]).renew(false).await;
    now.fetch_add(FULL_MS + 1, Ordering::SeqCst);
    assert_eq!(ask(&fleet[1], &limits).await.0, Decision::Admit);
    SlotRenewer::of(&fleet[1]).renew(true).await;
    assert_eq!(fleet[1].report().slot_keys(), 1, "a key in use is kept");
}

#[tokio::test]
async fn shadow_admits_without_a_slot_and_leaving_gives_every_idle_slot_back() {
    let (now, _store, fleet) = fleet(1);
    let shadow = [concurrency(1, Mode::Shadow)];
    let (_, held, _) = ask(&fleet[0], &shadow).await;
    assert_eq!(held.len(), 1);
    let (d, none, _) = ask(&fleet[0], &shadow).await;
    assert_eq!((d, none.len()), (Decision::Admit, 0), "counted, not refused");
    drop(held);
    SlotRenewer::of(&fleet[0]).renew(true).await;
    now.fetch_add(FULL_MS + 1, Ordering::SeqCst);
    SlotRenewer::of(&fleet[0]).renew(false).await;
    assert_eq!(fleet[0].report().slot_keys(), 0, "nothing held: forgotten");
}

/// A store whose slot calls fail: a fail-open route runs on this
/// instance's part of max.
#[tokio::test]
async fn while_the_store_is_away_an_instance_runs_its_part_of_max() {
    use crate::store::testing::{Answer, Call, Scripted};
    let store = Arc::new(Scripted::new());
    store.answer(Call::Fleet, Answer::Fail(StoreError::Unavailable("down".into())));
    let l = Limiter::new(store, settings(), crate::clock::monotonic_clock());
    let limits = [concurrency(2, Mode::Enforce)];
    let (d, a, _) = ask(&l, &limits).await;
    assert!(matches!(d, Decision::Bypass { .. }), "{d:?}");
    let (_, b, _) = ask(&l, &limits).await;
    let (d, _, _) = ask(&l, &limits).await;
    assert_eq!(d, Decision::Refuse { at: 0 }, "max 2 over a fleet of one");
    drop((a, b));
}

/// A waiter in a concurrency limit's queue is woken by the release itself,
/// not by its next retry.
#[tokio::test]
async fn a_slot_coming_back_wakes_whoever_waits_for_it() {
    let (_now, _store, fleet) = fleet(1);
    let limits = [concurrency(1, Mode::Enforce)];
    let (_, held, _) = ask(&fleet[0], &limits).await;
    let h = http::HeaderMap::new();
    let freed = fleet[0].slot_freed(&limits[0], &facts("acme", &h));
    tokio::pin!(freed);
    assert!(
        tokio::time::timeout(Duration::from_millis(20), &mut freed)
            .await
            .is_err(),
        "nothing freed yet"
    );
    drop(held);
    tokio::time::timeout(Duration::from_millis(20), freed)
        .await
        .expect("the release wakes the waiter");
}

/// A reload that lowers `max` holds at once, even for a key with idle
/// slots in hand.
#[tokio::test]
async fn a_lower_max_after_a_reload_holds_for_a_key_with_idle_slots() {
    let (_now, _store, fleet) = fleet(1);
    let (_, a, _) = ask(&fleet[0], &[concurrency(3, Mode::Enforce)]).await;
    let (_, b, _) = ask(&fleet[0], &[concurrency(3, Mode::Enforce)]).await;
    drop(b); // idle, kept for the next request
    let lower = [concurrency(1, Mode::Enforce)];
    assert_eq!(
        ask(&fleet[0], &lower).await.0,
        Decision::Refuse { at: 0 },
        "one is in flight: max 1"
    );
    drop(a);
    assert_eq!(ask(&fleet[0], &lower).await.0, Decision::Admit);
}

/// The renewer's task keeps a slot in use alive in the store past its TTL
/// (renewed every third of one): another instance finds no room. Without
/// it, the slot lapses after a TTL and the other instance takes it.
#[tokio::test(start_paused = true)]
async fn the_renewer_task_keeps_a_slot_in_use_alive_past_its_ttl() {
    for renewing in [true, false] {
        let (now, _store, fleet) = fleet(2);
        let limits = [concurrency(1, Mode::Enforce)];
        let (d, held, _) = ask(&fleet[0], &limits).await;
        assert_eq!(d, Decision::Admit);
        let task = renewing.then(|| tokio::spawn(Arc::new(SlotRenewer::of(&fleet[0])).run()));
        let ttl_ms = settings().sizing.ttl_ms;
        for _ in 0..6 {
            now.fetch_add(ttl_ms / 4, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(ttl_ms / 4)).await;
        }
        let (d, _, _) = ask(&fleet[1], &limits).await;
        let expected = if renewing {
            Decision::Refuse { at: 0 }
        } else {
            Decision::Admit
        };
        assert_eq!(d, expected, "renewing: {renewing}");
        if let Some(t) = task {
            t.abort();
        }
        drop(held);
    }
}
