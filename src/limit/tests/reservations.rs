//! Reservations on a drained token bucket, limiter by limiter and as a
//! fleet: the store is asked once per reservation, tokens come due no
//! earlier than the refill, unspent ones go back, and a full queue sends
//! instances back spread out.

use super::*;

/// A fleet of `n` limiters on one store (the manual clock), one hot key at
/// 100/s with a burst of 100, each instance asked once a millisecond (ten
/// times the key's rate per instance) for `secs` seconds after the burst
/// is spent. Returns (store calls, admitted) over those seconds.
async fn drained_hot_key(n: usize, secs: u64) -> (u64, u64) {
    let (now, clock) = manual_clock(T0);
    let store = Arc::new(Scripted::with_clock(clock.clone()));
    let settings = Settings {
        sizing: Sizing {
            min: 5,
            max: 10,
            ..Sizing::default()
        },
        ..settings()
    };
    let fleet: Vec<_> = (0..n)
        .map(|_| Limiter::new(store.clone(), settings, clock.clone()))
        .collect();
    let limits = vec![limit("hot", "100/s", Some(100), Mode::Enforce)];
    let run = async |ms: u64| {
        let mut admitted = 0;
        for _ in 0..ms {
            now.fetch_add(1, Ordering::SeqCst);
            for limiter in &fleet {
                admitted += u64::from(one(limiter, &limits, "a").await.refused_at().is_none());
            }
        }
        admitted
    };
    // The burst, spent.
    run(1_000).await;
    let calls = store.acquires.load(Ordering::SeqCst);
    let admitted = run(secs * 1_000).await;
    (store.acquires.load(Ordering::SeqCst) - calls, admitted)
}

/// The attack the leases must hold against: a drained hot key that far
/// more clients want than it allows, over a fleet. Each instance's
/// refusals come from memory, and the store is asked once per reservation
/// (a lease of 5 to 10 tokens), not once per token per instance: the
/// calls stay near `rate / min lease` = 20/s whatever the fleet's size,
/// and the fleet admits the refill, no more.
#[tokio::test(start_paused = true)]
async fn a_drained_hot_key_costs_the_store_its_refill_not_a_poll_per_instance() {
    let secs = 5;
    let (two_calls, two_admitted) = drained_hot_key(2, secs).await;
    let (ten_calls, ten_admitted) = drained_hot_key(10, secs).await;
    for (n, calls, admitted) in [(2, two_calls, two_admitted), (10, ten_calls, ten_admitted)] {
        println!("{n} instances: {calls} store calls, {admitted} admitted in {secs} s");
        // 100/s refilled over the run: 500 tokens, served from the
        // bucket's debt in turn; one lease of at most 10 per instance may
        // be at hand when the run ends, or still owed at its start.
        assert!(admitted <= 500 + 10 * n as u64, "{n} instances admitted {admitted}");
        assert!(admitted >= 500 - 10 * n as u64, "{n} instances admitted {admitted}");
        // The floor is 500 / 10 = 50 calls (leases of max), 100 of min.
        assert!(calls <= 3 * 100, "{n} instances made {calls} store calls in {secs} s");
    }
    assert!(
        ten_calls <= 2 * two_calls.max(50),
        "{two_calls} calls for 2, {ten_calls} for 10"
    );
}

/// A bucket another instance drained: the manual clock, the counting
/// store, the limit (`rate`, `burst`), its key for identity `k` and its
/// quota, and settings with leases of exactly five (reserve as given).
struct Drained {
    now: Arc<AtomicU64>,
    clock: Clock,
    store: Arc<Scripted>,
    limits: Vec<Arc<LimitRuntime>>,
    key: String,
    settings: Settings,
}

fn drained(rate: &str, burst: u64, reserve: bool) -> Drained {
    let (now, clock) = manual_clock(T0);
    let store = Arc::new(Scripted::with_clock(clock.clone()));
    let settings = Settings {
        sizing: Sizing {
            min: 5,
            max: 5,
            fraction: 1.0,
            ttl_ms: 1_000,
            ..Sizing::default()
        },
        reserve,
        ..settings()
    };
    let limits = vec![limit("hot", rate, Some(burst), Mode::Enforce)];
    let h = http::HeaderMap::new();
    let key = crate::limit::store_key(&limits[0].config, &facts("k", &h), None);
    let spec = limits[0].config.spec();
    let taken = store
        .memory()
        .acquire_now(&key, &spec, burst, Unspent::default())
        .unwrap();
    assert_eq!(taken.granted, burst);
    Drained {
        now,
        clock,
        store,
        limits,
        key,
        settings,
    }
}

impl Drained {
    fn instance(&self) -> Arc<Limiter> {
        Limiter::new(self.store.clone(), self.settings, self.clock.clone())
    }
}

/// One instance holds a reservation: refused from memory with the exact
/// wait until each reserved token is due, admitted when it is, with no
/// store call in between; the sweeper keeps the lease while tokens are
/// still to come, and `/limits/state` shows them.
#[tokio::test(start_paused = true)]
async fn a_reservation_is_spent_as_it_comes_due_without_asking_the_store_again() {
    // 10/s, burst 10: one token every 100 ms. Another instance took the
    // burst.
    let d = drained("10/s", 10, true);
    let b = d.instance();
    let Drained {
        now,
        store,
        limits,
        key,
        ..
    } = d;
    let calls = store.acquires.load(Ordering::SeqCst);
    // `b` asks, and is queued for the next five tokens of the refill.
    let v = one(&b, &limits, "k").await;
    assert_eq!(v.refused_at(), Some(0));
    assert_eq!(v.limits[0].retry_after_ms, 100);
    assert_eq!(store.acquires.load(Ordering::SeqCst), calls + 1);
    assert_eq!(store.reserved.load(Ordering::SeqCst), 5);
    let state = &b.report().key_states(&[&key])[0];
    assert_eq!((state.tokens_reserved, state.blocked_for_ms), (5, 100));
    // The sweeper keeps it, even idle.
    b.sweeper().sweep(0).await;
    assert_eq!(b.report().key_states(&[&key])[0].tokens_reserved, 5);
    // Each token when it is due, not a millisecond before; no store call.
    now.fetch_add(99, Ordering::SeqCst);
    assert_eq!(one(&b, &limits, "k").await.limits[0].retry_after_ms, 1);
    now.fetch_add(1, Ordering::SeqCst);
    assert_eq!(one(&b, &limits, "k").await.refused_at(), None);
    let v = one(&b, &limits, "k").await;
    assert_eq!((v.refused_at(), v.limits[0].retry_after_ms), (Some(0), 100));
    now.fetch_add(400, Ordering::SeqCst);
    for _ in 0..4 {
        assert_eq!(one(&b, &limits, "k").await.refused_at(), None);
    }
    // No call while tokens were reserved; once the last came due, the
    // tokens at hand fell to the low watermark and a background refill
    // queued for the next reservation (ahead of need, as any refill).
    assert_eq!(store.acquires.load(Ordering::SeqCst), calls + 2);
    assert_eq!(store.reserved.load(Ordering::SeqCst), 10);
    // So the next request is refused from memory until that one's first
    // token, with no call of its own.
    let v = one(&b, &limits, "k").await;
    assert_eq!(v.refused_at(), Some(0));
    assert!(v.limits[0].retry_after_ms <= 100, "{}", v.limits[0].retry_after_ms);
    assert_eq!(store.acquires.load(Ordering::SeqCst), calls + 2);
}

/// Reserved tokens nobody came for go back a lease TTL after each was
/// due, and pay the bucket's debt off.
#[tokio::test(start_paused = true)]
async fn reserved_tokens_nobody_spends_go_back() {
    // 1/s, burst 10, drained by another instance.
    let d = drained("1/s", 10, true);
    let b = d.instance();
    let Drained {
        now,
        store,
        limits,
        key,
        ..
    } = d;
    let spec = limits[0].config.spec();
    assert_eq!(one(&b, &limits, "k").await.refused_at(), Some(0));
    assert_eq!(store.reserved.load(Ordering::SeqCst), 5);
    // Due at 1, 2, 3, 4 and 5 s; nobody comes to `b`. Idle, unblocked and
    // with nothing at hand, its lease is still kept while they are owed.
    now.fetch_add(1_500, Ordering::SeqCst);
    b.sweeper().sweep(0).await;
    assert_eq!(b.report().key_states(&[&key])[0].tokens_reserved, 5);
    // Each goes back a TTL after it was due: the first at 2 s, the last
    // at 6 s.
    now.fetch_add(499, Ordering::SeqCst);
    b.sweeper().sweep(60_000).await;
    assert_eq!(store.returned.load(Ordering::SeqCst), 0);
    now.fetch_add(1, Ordering::SeqCst);
    b.sweeper().sweep(60_000).await;
    tokio::task::yield_now().await;
    assert_eq!(store.returned.load(Ordering::SeqCst), 1);
    assert_eq!(b.report().key_states(&[&key])[0].tokens_reserved, 4);
    now.fetch_add(4_000, Ordering::SeqCst);
    b.sweeper().sweep(60_000).await;
    tokio::task::yield_now().await;
    assert_eq!(store.returned.load(Ordering::SeqCst), 5);
    // The debt is paid: 6 s refilled 6 tokens, 5 of which were owed; with
    // the 5 back, the bucket holds 6.
    let g = store
        .memory()
        .acquire_now(&key, &spec, 100, Unspent::default())
        .unwrap();
    assert_eq!(g.granted, 6);
}

/// Past the debt's bound (one burst or one period's count) nothing more is
/// reserved: the instance is told when a token free of every reservation
/// comes, exactly, and its local block ends up to a quarter of that early,
/// at a different moment on every instance, so the instances waiting for
/// the queue to drain do not all ask at once.
#[tokio::test(start_paused = true)]
async fn a_full_queue_sends_instances_back_at_spread_times_and_clients_the_exact_wait() {
    // 10/s, burst 10 (a debt of 10 at most), drained by another instance.
    let d = drained("10/s", 10, true);
    let fleet: Vec<_> = (0..6).map(|_| d.instance()).collect();
    let Drained { store, limits, key, .. } = d;
    // Two reservations of five fill the queue: due 100-500 and 600-1000 ms.
    for (i, limiter) in fleet[..2].iter().enumerate() {
        let v = one(limiter, &limits, "k").await;
        assert_eq!(v.limits[0].retry_after_ms, 100 + 500 * i as u64);
    }
    assert_eq!(store.reserved.load(Ordering::SeqCst), 10);
    // The others: no room. A token free of the queue comes at 1.1 s.
    let mut ends = std::collections::BTreeSet::new();
    for limiter in &fleet[2..] {
        let v = one(limiter, &limits, "k").await;
        assert_eq!((v.refused_at(), v.limits[0].retry_after_ms), (Some(0), 1_100));
        let blocked = limiter.report().key_states(&[&key])[0].blocked_for_ms;
        assert!((825..=1_100).contains(&blocked), "{blocked}");
        ends.insert(blocked);
    }
    assert!(ends.len() > 1, "every instance the same block: {ends:?}");
    assert_eq!(store.reserved.load(Ordering::SeqCst), 10);
}

/// `[leasing] reserve = false`: a drained bucket answers nothing, as
/// before reservations (a fleet mid-upgrade), and the key is blocked for
/// the next token's wait.
#[tokio::test(start_paused = true)]
async fn with_reserve_off_a_drained_bucket_reserves_nothing() {
    let d = drained("10/s", 10, false);
    let b = d.instance();
    let Drained { store, limits, .. } = d;
    let v = one(&b, &limits, "k").await;
    assert_eq!((v.refused_at(), v.limits[0].retry_after_ms), (Some(0), 100));
    assert_eq!(store.reserved.load(Ordering::SeqCst), 0);
}
