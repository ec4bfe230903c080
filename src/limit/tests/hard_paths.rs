//! The limiter on the paths a rate limiter exists for: drained buckets,
//! failed stores, cold bursts, key floods, slow stores.

use super::*;
use crate::quota::Algorithm;

fn sliding(name: &str, rate: &str, mode: Mode) -> Arc<LimitRuntime> {
    let rate: Rate = rate.parse().unwrap();
    let config = Arc::new(
        Limit::try_new(Draft {
            algorithm: Algorithm::SlidingWindow,
            mode,
            ..Draft::new(name, rate)
        })
        .unwrap(),
    );
    Arc::new(LimitRuntime::new(config, "test", &Metrics::new()))
}

#[tokio::test(start_paused = true)]
async fn the_first_429_after_a_bucket_drains_tells_the_stores_exact_wait() {
    let (now, _, limiter) = at(T0);
    let limits = vec![limit("five", "5/min", None, Mode::Enforce)];
    assert_eq!(one(&limiter, &limits, "a").await.refused_at(), None);
    now.fetch_add(10_000, Ordering::SeqCst);
    for _ in 0..4 {
        assert_eq!(one(&limiter, &limits, "a").await.refused_at(), None);
    }
    // 10 s refilled 5/6 of a token: the next one is 2 s away, not 12.
    let v = one(&limiter, &limits, "a").await;
    assert_eq!(v.refused_at(), Some(0));
    assert_eq!((v.limits[0].retry_after_ms, v.limits[0].reset_ms), (2_000, 2_000));
    // Clearly earlier is refused; at Retry-After the client is admitted.
    now.fetch_add(1_000, Ordering::SeqCst);
    let v = one(&limiter, &limits, "a").await;
    assert_eq!(v.refused_at(), Some(0));
    assert_eq!(v.limits[0].retry_after_ms, 1_000);
    now.fetch_add(1_000, Ordering::SeqCst);
    assert_eq!(one(&limiter, &limits, "a").await.refused_at(), None);
}

#[tokio::test(start_paused = true)]
async fn a_sliding_window_client_that_obeys_retry_after_is_admitted() {
    let (now, _, limiter) = at(T0);
    let limits = vec![sliding("five", "5/min", Mode::Enforce)];
    for _ in 0..5 {
        assert_eq!(one(&limiter, &limits, "a").await.refused_at(), None);
    }
    let v = one(&limiter, &limits, "a").await;
    assert_eq!(v.refused_at(), Some(0));
    // Five in this window: the sixth fits once the window has turned and
    // slid a fifth of the way on: 50 s + 12 s.
    let wait = v.limits[0].retry_after_ms;
    assert_eq!(wait, 62_000);
    now.fetch_add(wait - 1_000, Ordering::SeqCst);
    assert_eq!(
        one(&limiter, &limits, "a").await.refused_at(),
        Some(0),
        "a second early"
    );
    now.fetch_add(1_000, Ordering::SeqCst);
    assert_eq!(one(&limiter, &limits, "a").await.refused_at(), None, "on time");
}

#[tokio::test(start_paused = true)]
async fn stages_that_cannot_refuse_never_fail_a_fail_closed_request() {
    let store = failing();
    let limiter = Limiter::new(store, settings(), monotonic_clock());
    let canary = {
        let rate: Rate = "1/h".parse().unwrap();
        let config = Arc::new(
            Limit::try_new(Draft {
                mode: Mode::Canary,
                canary_percent: 0,
                ..Draft::new("canary", rate)
            })
            .unwrap(),
        );
        Arc::new(LimitRuntime::new(config, "test", &Metrics::new()))
    };
    let limits = vec![
        limit("shadow", "1/h", None, Mode::Shadow),
        limit("soft", "1/h", None, Mode::Soft),
        canary,
        limit("enforce", "1/h", None, Mode::Enforce),
    ];
    let h = http::HeaderMap::new();
    for _ in 0..3 {
        // fail_open = false: a `deny` route.
        let v = limiter
            .check(&pick(&limits, &[0, 1, 2]), &[], &facts("k", &h), StoreFailure::Deny)
            .await
            .committed();
        assert_eq!((v.refused_at(), &v.store_error), (None, &None));
        assert_eq!(v.limits.len(), 3, "every limit is still counted");
    }
    let v = limiter
        .check(&pick(&limits, &[0, 3]), &[], &facts("k", &h), StoreFailure::Deny)
        .await
        .committed();
    assert!(v.store_error.is_some(), "an enforced limit's failure still decides");
}

#[tokio::test(start_paused = true)]
async fn a_cold_burst_costs_a_couple_of_store_calls() {
    let store = slow(10);
    let limiter = Limiter::new(store.clone(), settings(), monotonic_clock());
    let limits = Arc::new(vec![limit("route", "10000/min", None, Mode::Enforce)]);
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (limiter, limits) = (limiter.clone(), limits.clone());
            tokio::spawn(async move { one(&limiter, &limits, "same").await.refused_at() })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), None);
    }
    let wants = store.wants.lock().unwrap().clone();
    assert!(wants.len() <= 3, "{wants:?}");
    // One call at a time, none bigger than max: this instance holds at most
    // max plus one call's grant.
    let max = Sizing::default().max;
    assert!(wants.iter().all(|&w| w <= max), "{wants:?}");
    let held = limiter
        .leases
        .with(limiter_hash(&limiter, &limits[0], "same"), |l| l.available());
    assert!(held.unwrap_or(0) <= max, "{held:?}");
}

fn limiter_hash(limiter: &Limiter, limit: &LimitRuntime, id: &str) -> u64 {
    let h = http::HeaderMap::new();
    limiter.key_hash(limit, &facts(id, &h), None)
}

/// A store that answers after 40 ms with one token, whatever was asked.
fn stingy() -> Arc<Scripted> {
    let store = Arc::new(Scripted::new());
    store.delay(Call::Acquire, 40).grant_always(Grant {
        granted: 1,
        remaining: 1_000,
        ..Grant::default()
    });
    store
}

#[tokio::test(start_paused = true)]
async fn a_request_waits_at_most_one_deadline_in_all() {
    let limiter = Limiter::new(stingy(), settings(), monotonic_clock());
    limiter.set_settings(Settings {
        deadline_ms: 50,
        ..limiter.settings()
    });
    let limits = Arc::new(vec![limit("l", "1000000/s", None, Mode::Enforce)]);
    let first = {
        let (limiter, limits) = (limiter.clone(), limits.clone());
        tokio::spawn(async move { one(&limiter, &limits, "k").await.refused_at() })
    };
    tokio::time::sleep(Duration::from_millis(2)).await;
    // This one waits for the first call (38 ms), which brings one token
    // only; its own call would take 40 ms more. It gives up at 50 ms.
    let started = tokio::time::Instant::now();
    let v = one(&limiter, &limits, "k").await;
    let waited = started.elapsed();
    assert_eq!(v.store_error, Some(StoreError::Timeout(50)));
    // On tokio's paused clock: exactly the one deadline (its timer's
    // millisecond rounding aside), not 38 ms of waiting plus 50 of its own.
    assert!(
        (Duration::from_millis(50)..=Duration::from_millis(51)).contains(&waited),
        "{waited:?}"
    );
    assert_eq!(first.await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn expired_tokens_go_back_inside_the_next_call() {
    let (now, store, limiter) = at(1_000_000);
    limiter.set_settings(Settings {
        sizing: Sizing {
            ttl_ms: 1,
            ..Sizing::default()
        },
        ..limiter.settings()
    });
    let limits = vec![limit("l", "1000/min", None, Mode::Enforce)];
    assert_eq!(one(&limiter, &limits, "a").await.refused_at(), None);
    now.fetch_add(5, Ordering::SeqCst); // past the 1 ms TTL
    assert_eq!(one(&limiter, &limits, "a").await.refused_at(), None);
    // No round trip of their own: the four unspent tokens rode along.
    assert_eq!(store.releases.load(Ordering::SeqCst), 0);
    assert_eq!(store.acquires.load(Ordering::SeqCst), 2);
    assert_eq!(store.returned.load(Ordering::SeqCst), 4);
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_keys_keeps_the_table_capped_and_loses_no_token() {
    let (store, limiter) = setup();
    let limiter = {
        let settings = Settings {
            max_keys: 512,
            ..limiter.settings()
        };
        Limiter::new(store.clone(), settings, monotonic_clock())
    };
    let limits = vec![limit("l", "1000/min", None, Mode::Enforce)];
    for i in 0..3_000 {
        // Each key leases 5 and spends 1: 4 at hand when it is evicted.
        assert_eq!(one(&limiter, &limits, &format!("k{i}")).await.refused_at(), None);
        assert!(limiter.report().tracked_keys() <= limiter.leases.capacity());
    }
    for _ in 0..200 {
        if limiter.report().pending_releases() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut held = 0;
    limiter.leases.for_each(|l| held += l.available());
    let (granted, returned) = (
        store.granted.load(Ordering::SeqCst),
        store.returned.load(Ordering::SeqCst),
    );
    assert!(returned > 0);
    assert_eq!(
        granted - returned,
        3_000 + held,
        "granted {granted}, returned {returned}, held {held}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_warning_measures_how_far_over_across_the_window() {
    let (now, _, limiter) = at(T0);
    let limits = vec![limit("soft", "10/min", None, Mode::Soft)];
    for _ in 0..10 {
        assert_eq!(one(&limiter, &limits, "a").await.limits[0].outcome, Outcome::Admitted);
    }
    for _ in 0..5 {
        assert_eq!(
            one(&limiter, &limits, "a").await.limits[0].outcome,
            Outcome::SoftLimited
        );
    }
    // A token refills and is granted; the key is no less over for it.
    now.fetch_add(6_000, Ordering::SeqCst);
    assert_eq!(one(&limiter, &limits, "a").await.limits[0].outcome, Outcome::Admitted);
    let v = one(&limiter, &limits, "a").await;
    assert_eq!(v.limits[0].outcome, Outcome::SoftLimited);
    assert_eq!(v.limits[0].over_percent, 60);
}

/// A limiter on a store the test can switch off, on a manual clock.
fn switchable() -> (Arc<AtomicU64>, Arc<Scripted>, Arc<Limiter>) {
    let (now, clock) = manual_clock(T0);
    let store = Arc::new(Scripted::with_memory(MemoryStore::with_clock(1_000, clock.clone())));
    let limiter = Limiter::new(store.clone(), settings(), clock);
    (now, store, limiter)
}

#[tokio::test(start_paused = true)]
async fn the_default_fallback_is_about_twice_the_recent_admitted_rate() {
    let (now, store, limiter) = switchable();
    let limits = vec![limit("l", "6000/min", None, Mode::Enforce)];
    // Five minutes at 10 requests per second.
    for _ in 0..3_000 {
        assert_eq!(one(&limiter, &limits, "a").await.refused_at(), None);
        now.fetch_add(100, Ordering::SeqCst);
    }
    store.all(Answer::Fail(StoreError::Unavailable("down".into())));
    now.fetch_add(2_000, Ordering::SeqCst); // the lease at hand has expired
    let v = one(&limiter, &limits, "a").await;
    assert!(v.store_error.is_some());
    // About 20 per second, not the 100 per second of the quota.
    let per_minute = v.limits[0].quota;
    assert!((1_100..=1_300).contains(&per_minute), "{per_minute}");
    // Requests during the outage, at 50 per second, admitted or not, do not
    // raise it: only what the store granted counts.
    for _ in 0..3_000 {
        one(&limiter, &limits, "a").await;
        now.fetch_add(20, Ordering::SeqCst);
    }
    assert_eq!(one(&limiter, &limits, "a").await.limits[0].quota, per_minute);
    // A key this instance had not seen gets the floor, 1 % of the quota.
    assert_eq!(one(&limiter, &limits, "new").await.limits[0].quota, 60);
}

#[tokio::test(start_paused = true)]
async fn a_young_key_falls_back_to_about_twice_its_rate_too() {
    let (now, store, limiter) = switchable();
    let limits = vec![limit("l", "6000/min", None, Mode::Enforce)];
    // Ten seconds at 10 per second: a sixth of the average's minute.
    for _ in 0..100 {
        assert_eq!(one(&limiter, &limits, "a").await.refused_at(), None);
        now.fetch_add(100, Ordering::SeqCst);
    }
    store.all(Answer::Fail(StoreError::Unavailable("down".into())));
    now.fetch_add(2_000, Ordering::SeqCst);
    let per_minute = one(&limiter, &limits, "a").await.limits[0].quota;
    assert!((1_000..=1_400).contains(&per_minute), "{per_minute}");
}

#[tokio::test(start_paused = true)]
async fn sliding_window_tokens_go_back_to_the_window_they_were_counted_in() {
    let (now, store, limiter) = at(T0 + 49_500); // half a second before the window turns
    let limits = vec![sliding("w", "1000/min", Mode::Enforce)];
    assert_eq!(one(&limiter, &limits, "a").await.refused_at(), None);
    let taken_in = T0 - 10_000; // the window's start
                                // The window turns and the lease expires unspent: its tokens go back,
                                // inside the next call, to the window they were counted in.
    now.fetch_add(2_000, Ordering::SeqCst);
    assert_eq!(one(&limiter, &limits, "a").await.refused_at(), None);
    let back = store.unspent.lock().unwrap().clone();
    assert_eq!(back.len(), 1, "{back:?}");
    assert_eq!((back[0].tokens, back[0].window_ms), (4, taken_in));
    // (Where the store puts them is the store's part: src/quota and
    // tests/redis_store.rs.)
}

#[tokio::test(start_paused = true)]
async fn swept_tokens_are_not_counted_as_admitted() {
    let (now, _, limiter) = at(T0);
    let limits = vec![limit("l", "100/min", None, Mode::Enforce)];
    // One request every 3 s: each lease of 5 expires, and the sweeper takes
    // its 4 unspent tokens back before the next request comes.
    for _ in 0..20 {
        assert_eq!(one(&limiter, &limits, "a").await.refused_at(), None);
        now.fetch_add(2_000, Ordering::SeqCst);
        limiter.sweeper().sweep(3_600_000).await;
        now.fetch_add(1_000, Ordering::SeqCst);
    }
    let rate = limiter
        .leases
        .with(limiter_hash(&limiter, &limits[0], "a"), |l| l.admitted_rate())
        .unwrap();
    // A third of a request per second, not the 5 / 3 s the leases held.
    assert!((0.25..0.45).contains(&rate), "{rate}");
}

#[tokio::test(start_paused = true)]
async fn a_refill_in_a_new_window_sends_the_old_windows_tokens_back_to_it() {
    let (now, store, limiter) = at(T0 + 49_500); // half a second before the window turns
    let limits = vec![sliding("w", "1000/min", Mode::Enforce)];
    assert_eq!(one(&limiter, &limits, "a").await.refused_at(), None); // lease of 5, 4 at hand
    now.fetch_add(700, Ordering::SeqCst); // the next window, the lease still alive
    for _ in 0..3 {
        assert_eq!(one(&limiter, &limits, "a").await.refused_at(), None);
    }
    // The third left one token at hand (the low watermark): the refill came
    // from the new window, and the old window's token went back to it.
    for _ in 0..100 {
        if limiter.report().pending_releases() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let back = store.unspent.lock().unwrap().clone();
    assert_eq!(
        back,
        vec![Unspent {
            tokens: 1,
            window_ms: T0 - 10_000,
            ..Unspent::default()
        }]
    );
}

#[tokio::test(start_paused = true)]
async fn a_reload_that_changes_a_limit_lifts_its_keys_local_blocks() {
    let (store, limiter) = setup();
    let limits = vec![limit("two", "2/min", None, Mode::Enforce)];
    for _ in 0..2 {
        assert_eq!(one(&limiter, &limits, "a").await.refused_at(), None);
    }
    assert_eq!(one(&limiter, &limits, "a").await.refused_at(), Some(0));
    let h = limiter_hash(&limiter, &limits[0], "a");
    assert!(limiter
        .leases
        .with(h, |l| blocked::remaining(l, limiter.now_ms()))
        .flatten()
        .is_some());
    let calls = store.acquires.load(Ordering::SeqCst);
    limiter
        .sweeper()
        .release_limits(&std::collections::HashSet::from(["two".to_string()]))
        .await;
    // The old quota's refusal says nothing about the new one: the next
    // request asks the store.
    assert!(limiter
        .leases
        .with(h, |l| blocked::remaining(l, limiter.now_ms()))
        .flatten()
        .is_none());
    one(&limiter, &limits, "a").await;
    assert_eq!(store.acquires.load(Ordering::SeqCst), calls + 1);
}

#[tokio::test(start_paused = true)]
async fn background_releases_past_their_bound_are_dropped_not_queued() {
    // A store whose releases never answer.
    let store = Arc::new(Scripted::new());
    store.answer(Call::Release, Answer::Hang);
    let limiter = Limiter::new(store, settings(), monotonic_clock());
    let limits = vec![limit("l", "1000000/min", None, Mode::Enforce)];
    one(&limiter, &limits, "a").await;
    let lease = limiter.leases.get(limiter_hash(&limiter, &limits[0], "a")).unwrap();
    for _ in 0..sweep::MAX_PENDING_RELEASES + 100 {
        lease.give_back(1);
        limiter
            .releases
            .later(&limiter.store, sweep::Release::take_all(&lease).unwrap());
    }
    tokio::task::yield_now().await;
    assert_eq!(limiter.report().pending_releases(), sweep::MAX_PENDING_RELEASES);
}

#[tokio::test(start_paused = true)]
async fn a_lease_evicted_during_its_store_call_gives_the_grant_back() {
    let store = slow(20);
    let settings = Settings {
        max_keys: 512, // 8 leases per shard
        ..settings()
    };
    let limiter = Limiter::new(store.clone(), settings, monotonic_clock());
    let limits = Arc::new(vec![limit("l", "1000000/min", None, Mode::Enforce)]);
    let call = {
        let (limiter, limits) = (limiter.clone(), limits.clone());
        tokio::spawn(async move { one(&limiter, &limits, "a").await.refused_at() })
    };
    tokio::time::sleep(Duration::from_millis(2)).await;
    // While its call is in flight, fill its shard with leases that hold
    // tokens until the table lets it go.
    let h = limiter_hash(&limiter, &limits[0], "a");
    let a = limiter.leases.get(h).unwrap();
    let mut i = 0u64;
    while !a.is_evicted() {
        let other = (h & (0x3F << 58)) | (i + 1);
        i += 1;
        assert!(i < 10_000, "never evicted");
        let (lease, _) = limiter.leases.get_or_insert(other, "rl:{l:other}");
        lease.give_back(1);
    }
    drop(a);
    assert_eq!(call.await.unwrap(), None, "the request still gets its token");
    for _ in 0..100 {
        if limiter.report().pending_releases() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // A lease of 5: one for the request, the other 4 back to the store.
    let granted = store.granted.load(Ordering::SeqCst);
    assert_eq!(store.returned.load(Ordering::SeqCst), granted - 1);
}

/// Admitted requests of `identity` in a row, until the first refusal (at
/// most 1 000), without the clock moving.
async fn admitted_in_a_row(limiter: &Arc<Limiter>, limits: &[Arc<LimitRuntime>], identity: &str) -> usize {
    let mut n = 0;
    while n < 1_000 && one(limiter, limits, identity).await.refused_at().is_none() {
        n += 1;
    }
    n
}

#[tokio::test(start_paused = true)]
async fn every_outage_starts_the_fallback_low_not_where_the_last_one_left_it() {
    let (now, store, limiter) = switchable();
    let limits = vec![limit("l", "6000/min", None, Mode::Enforce)];
    store.all(Answer::Fail(StoreError::Unavailable("down".into())));
    let first = admitted_in_a_row(&limiter, &limits, "a").await;
    // A fallback bucket starts with a second of its rate or a lease, not
    // its burst (the floor: 60 per minute).
    assert!((1..60).contains(&first), "{first}");
    // The store comes back and answers for the key ...
    store.all(Answer::Real);
    now.fetch_add(2_000, Ordering::SeqCst);
    assert_eq!(one(&limiter, &limits, "a").await.store_error, None);
    // ... so the next outage starts the key's fallback anew, not from the
    // bucket the first one left (drained here; full had time passed).
    store.all(Answer::Fail(StoreError::Unavailable("down".into())));
    now.fetch_add(2_000, Ordering::SeqCst);
    let second = admitted_in_a_row(&limiter, &limits, "a").await;
    assert_eq!(second, first);
}
