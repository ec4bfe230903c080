use super::*;
use crate::clock::monotonic_clock;
use crate::limit::policy::{Draft, KeyPart, Mode, StoreFailure};
use crate::limit::testing::{facts, pick, settings};
use crate::quota::Unspent;
use crate::quota::{Grant, Rate};
use crate::store::memory::MemoryStore;
use crate::store::testing::{Answer, Call, Scripted};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

mod costs;
mod hard_paths;
mod reservations;
mod tasks;
mod try_check;

/// A store that fails after a moment (3 ms, on tokio's paused clock).
fn failing() -> Arc<Scripted> {
    let store = Arc::new(Scripted::new());
    store
        .answer(Call::Acquire, Answer::Fail(StoreError::Unavailable("down".into())))
        .delay(Call::Acquire, 3);
    store
}

/// A store that answers after `ms`, like one across a network.
fn slow(ms: u64) -> Arc<Scripted> {
    let store = Arc::new(Scripted::with_memory(MemoryStore::new(1_000)));
    store.delay(Call::Acquire, ms);
    store
}

fn limit(name: &str, rate: &str, burst: Option<u64>, mode: Mode) -> Arc<LimitRuntime> {
    let rate: Rate = rate.parse().unwrap();
    let config = Arc::new(
        Limit::try_new(Draft {
            burst: burst.unwrap_or(rate.count),
            mode,
            ..Draft::new(name, rate)
        })
        .unwrap(),
    );
    Arc::new(LimitRuntime::new(config, "test", &Metrics::new()))
}

fn setup() -> (Arc<Scripted>, Arc<Limiter>) {
    let store = Arc::new(Scripted::new());
    (store.clone(), Limiter::new(store, settings(), monotonic_clock()))
}

// Every test here runs on tokio's paused clock: a store's latency, a
// deadline and a wait for background work take no real time, and a test
// that needs time to pass for the limiter moves its manual clock. No test
// sleeps for correctness, and none asserts on real elapsed time.

/// A clock the test moves, shared by the limiter and its memory store.
fn manual_clock(start_ms: u64) -> (Arc<AtomicU64>, Clock) {
    let now = Arc::new(AtomicU64::new(start_ms));
    let read = now.clone();
    (now, Arc::new(move || read.load(Ordering::SeqCst)))
}

/// A limiter on a counting memory store, both on a manual clock.
fn at(start_ms: u64) -> (Arc<AtomicU64>, Arc<Scripted>, Arc<Limiter>) {
    at_with(start_ms, settings())
}

/// [`at`], with the limiter's `settings`.
fn at_with(start_ms: u64, settings: Settings) -> (Arc<AtomicU64>, Arc<Scripted>, Arc<Limiter>) {
    let (now, clock) = manual_clock(start_ms);
    let store = Arc::new(Scripted::with_clock(clock.clone()));
    let limiter = Limiter::new(store.clone(), settings, clock);
    (now, store, limiter)
}

/// One request of `id` through `limiter`, served.
async fn one<'l>(limiter: &'l Arc<Limiter>, limits: &'l [Arc<LimitRuntime>], id: &str) -> Verdict<'l> {
    let h = http::HeaderMap::new();
    limiter
        .check(&pick(limits, &[0]), &[], &facts(id, &h), StoreFailure::Allow)
        .await
        .committed()
}

/// A start time 10 s into a minute on the epoch's grid.
const T0: u64 = 60_000 * 29_000_000 + 10_000;

#[tokio::test(start_paused = true)]
async fn concurrent_requests_without_tokens_share_one_store_call() {
    let store = slow(10);
    let settings = Settings {
        sizing: Sizing {
            min: 50,
            ..Sizing::default()
        },
        ..settings()
    };
    let limiter = Limiter::new(store.clone(), settings, monotonic_clock());
    let limits = Arc::new(vec![limit("big", "1000000/s", None, Mode::Enforce)]);
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (limiter, limits) = (limiter.clone(), limits.clone());
        tasks.push(tokio::spawn(async move {
            let h = http::HeaderMap::new();
            let v = limiter
                .check(&pick(&limits, &[0]), &[], &facts("hot", &h), StoreFailure::Allow)
                .await
                .committed();
            (v.refused_at(), v.store_error)
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), (None, None));
    }
    // One call brought 50 tokens for all twenty (a background refill
    // may follow once the lease runs low).
    assert!(store.acquires.load(Ordering::SeqCst) <= 2, "{:?}", store.acquires);
}

#[tokio::test(start_paused = true)]
async fn a_request_waits_for_another_requests_store_call_no_longer_than_the_deadline() {
    // The store answers in 50 ms; the guard's deadline is 5 ms.
    let slow = slow(50);
    let store = Arc::new(crate::store::guard::Guarded::new(
        slow.clone(),
        Duration::from_millis(5),
        crate::store::guard::BreakerSettings {
            failures: 3,
            open_ms: 1_000,
        },
        monotonic_clock(),
        Arc::new(Metrics::new()),
    ));
    let limiter = Limiter::new(store, settings(), monotonic_clock());
    let limits = Arc::new(vec![limit("big", "1000000/s", None, Mode::Enforce)]);
    let first = {
        let (limiter, limits) = (limiter.clone(), limits.clone());
        tokio::spawn(async move {
            let h = http::HeaderMap::new();
            limiter
                .check(&pick(&limits, &[0]), &[], &facts("k", &h), StoreFailure::Deny)
                .await
                .committed()
                .store_error
        })
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    let h = http::HeaderMap::new();
    let started = tokio::time::Instant::now();
    // This one waits for the first request's call, which the deadline ends
    // 5 ms after it started, 4 ms after this one did.
    let second = limiter
        .check(&pick(&limits, &[0]), &[], &facts("k", &h), StoreFailure::Deny)
        .await
        .committed();
    assert_eq!(second.store_error, Some(StoreError::Timeout(5)));
    assert!(started.elapsed() <= Duration::from_millis(5), "{:?}", started.elapsed());
    assert_eq!(first.await.unwrap(), Some(StoreError::Timeout(5)));
    assert_eq!(slow.acquires.load(Ordering::SeqCst), 1, "one call for both");
}

#[tokio::test(start_paused = true)]
async fn requests_that_waited_for_a_failed_call_fail_with_it_without_calling_again() {
    let store = failing();
    let settings = settings();
    let limiter = Limiter::new(store.clone(), settings, monotonic_clock());
    let limits = Arc::new(vec![limit("big", "1000000/s", None, Mode::Enforce)]);
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let (limiter, limits) = (limiter.clone(), limits.clone());
        tasks.push(tokio::spawn(async move {
            let h = http::HeaderMap::new();
            limiter
                .check(&pick(&limits, &[0]), &[], &facts("k", &h), StoreFailure::Deny)
                .await
                .committed()
                .store_error
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), Some(StoreError::Unavailable("down".into())));
    }
    assert_eq!(store.acquires.load(Ordering::SeqCst), 1, "one call for five requests");
}

/// Three per hour, leases of ten that live 50 ms: the first request's
/// lease takes the whole bucket.
fn one_lease_drains_the_bucket() -> (Arc<AtomicU64>, Arc<Limiter>, Vec<Arc<LimitRuntime>>) {
    let (now, _store, limiter) = at(1_000_000);
    limiter.set_settings(Settings {
        sizing: Sizing {
            min: 10,
            max: 10,
            fraction: 1.0,
            ttl_ms: 50,
            ..Sizing::default()
        },
        ..settings()
    });
    (now, limiter, vec![limit("three", "3/h", None, Mode::Enforce)])
}

#[tokio::test(start_paused = true)]
async fn a_drained_bucket_refuses_from_memory_with_the_real_wait() {
    let (_now, limiter, limits) = one_lease_drains_the_bucket();
    let h = http::HeaderMap::new();
    let v = limiter
        .check(&pick(&limits, &[0]), &[], &facts("a", &h), StoreFailure::Allow)
        .await
        .committed();
    assert_eq!(v.refused_at(), None);
    // Another instance would now find the bucket empty; this one has two
    // tokens at hand, then refuses from memory (telling the client the
    // real wait for a token: 20 minutes).
    for _ in 0..2 {
        assert_eq!(
            limiter
                .check(&pick(&limits, &[0]), &[], &facts("a", &h), StoreFailure::Allow)
                .await
                .committed()
                .refused_at(),
            None
        );
    }
    let v = limiter
        .check(&pick(&limits, &[0]), &[], &facts("a", &h), StoreFailure::Allow)
        .await
        .committed();
    assert_eq!(v.refused_at(), Some(0));
    let wait = v.limits[0].retry_after_ms;
    assert!((1_199_000..=1_200_000).contains(&wait), "{wait}");
}

#[tokio::test(start_paused = true)]
async fn unspent_tokens_of_a_drained_bucket_serve_again_after_the_lease_ttl() {
    let (now, limiter, limits) = one_lease_drains_the_bucket();
    let h = http::HeaderMap::new();
    assert_eq!(
        limiter
            .check(&pick(&limits, &[0]), &[], &facts("a", &h), StoreFailure::Allow)
            .await
            .committed()
            .refused_at(),
        None
    );
    // The two unspent tokens expire with the lease and go back; the
    // drained-bucket block is no longer than the TTL, so they serve.
    now.fetch_add(80, Ordering::SeqCst);
    for i in 0..2 {
        let v = limiter
            .check(&pick(&limits, &[0]), &[], &facts("a", &h), StoreFailure::Allow)
            .await
            .committed();
        assert_eq!(v.refused_at(), None, "request {i}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_fail_closed_route_stops_at_the_first_limit_whose_store_failed() {
    let store = failing();
    let limiter = Limiter::new(store.clone(), settings(), monotonic_clock());
    let limits = vec![
        limit("a", "1000000/s", None, Mode::Enforce),
        limit("b", "1000000/s", None, Mode::Enforce),
    ];
    let h = http::HeaderMap::new();
    let v = limiter
        .check(&pick(&limits, &[0, 1]), &[], &facts("k", &h), StoreFailure::Deny)
        .await
        .committed();
    assert!(v.store_error.is_some());
    assert_eq!(
        store.acquires.load(Ordering::SeqCst),
        1,
        "the 503 is decided; b is not asked"
    );
    // A fail-open route asks both, each decided by its fallback bucket.
    let v = limiter
        .check(&pick(&limits, &[0, 1]), &[], &facts("k2", &h), StoreFailure::Allow)
        .await
        .committed();
    assert_eq!(v.limits.len(), 2);
    assert_eq!(v.refused_at(), None);
}

#[tokio::test(start_paused = true)]
async fn a_sharded_limits_fallback_rate_is_split_over_its_sub_buckets() {
    let store = failing();
    let limiter = Limiter::new(store, settings(), monotonic_clock());
    let rate: Rate = "40/h".parse().unwrap();
    let config = Arc::new(
        Limit::try_new(Draft {
            by: vec![KeyPart::Route],
            shards: 4,
            fallback_rate: Some("8/h".parse().unwrap()),
            ..Draft::new("sharded", rate)
        })
        .unwrap(),
    );
    let limits = vec![Arc::new(LimitRuntime::new(config, "test", &Metrics::new()))];
    let h = http::HeaderMap::new();
    // One client, so one sub-bucket: its share of the fallback is 8 / 4.
    let mut admitted = 0;
    for _ in 0..5 {
        let v = limiter
            .check(&pick(&limits, &[0]), &[], &facts("k", &h), StoreFailure::Allow)
            .await
            .committed();
        assert!(v.store_error.is_some());
        if v.refused_at().is_none() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 2);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_request_frees_its_keys_store_call_slot() {
    let store = slow(10);
    let limiter = Limiter::new(store.clone(), settings(), monotonic_clock());
    let limits = vec![limit("big", "1000000/s", None, Mode::Enforce)];
    let h = http::HeaderMap::new();
    // A client that goes away while its store call is in flight...
    let abandoned = tokio::time::timeout(
        Duration::from_millis(2),
        limiter.check(&pick(&limits, &[0]), &[], &facts("k", &h), StoreFailure::Allow),
    )
    .await;
    assert!(abandoned.is_err());
    // ...leaves the key free for the next request.
    let v = tokio::time::timeout(
        Duration::from_secs(1),
        limiter.check(&pick(&limits, &[0]), &[], &facts("k", &h), StoreFailure::Allow),
    )
    .await
    .expect("no request waits on an abandoned call")
    .committed();
    assert_eq!(v.refused_at(), None);
}

#[tokio::test(start_paused = true)]
async fn a_low_limit_admits_exactly_its_quota_then_refuses_from_memory() {
    let (store, limiter) = setup();
    let limits = vec![limit("five", "5/min", None, Mode::Enforce)];
    let h = http::HeaderMap::new();
    for i in 0..5 {
        let v = limiter
            .check(&pick(&limits, &[0]), &[], &facts("a", &h), StoreFailure::Allow)
            .await
            .committed();
        assert_eq!(v.refused_at(), None, "request {i}");
        assert_eq!(v.limits[0].remaining, 4 - i);
    }
    let v = limiter
        .check(&pick(&limits, &[0]), &[], &facts("a", &h), StoreFailure::Allow)
        .await
        .committed();
    assert_eq!(v.refused_at(), Some(0));
    assert_eq!(v.limits[0].retry_after_ms.div_ceil(1000), 12);
    let calls = store.acquires.load(Ordering::SeqCst);
    // A burst of refusals on the blocked key costs no store call.
    for _ in 0..1_000 {
        let v = limiter
            .check(&pick(&limits, &[0]), &[], &facts("a", &h), StoreFailure::Allow)
            .await
            .committed();
        assert_eq!(v.refused_at(), Some(0));
    }
    assert_eq!(store.acquires.load(Ordering::SeqCst), calls);
    // Another identity is independent.
    let v = limiter
        .check(&pick(&limits, &[0]), &[], &facts("b", &h), StoreFailure::Allow)
        .await
        .committed();
    assert_eq!(v.refused_at(), None);
}

/// How many of `n` requests `which` admits.
async fn admitted(
    limiter: &Arc<Limiter>,
    limits: &[Arc<LimitRuntime>],
    which: &[usize],
    facts: &Facts<'_>,
    n: usize,
) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        if limiter
            .check(&pick(limits, which), &[], facts, StoreFailure::Allow)
            .await
            .committed()
            .refused_at()
            .is_none()
        {
            admitted += 1;
        }
    }
    admitted
}

#[tokio::test(start_paused = true)]
async fn a_refusal_by_the_second_limit_gives_back_the_first() {
    let (_, limiter) = setup();
    let limits = vec![
        limit("wide", "10/min", None, Mode::Enforce),
        limit("narrow", "2/min", None, Mode::Enforce),
    ];
    let h = http::HeaderMap::new();
    for _ in 0..2 {
        assert_eq!(
            limiter
                .check(&pick(&limits, &[0, 1]), &[], &facts("a", &h), StoreFailure::Allow)
                .await
                .committed()
                .refused_at(),
            None
        );
    }
    for _ in 0..5 {
        let v = limiter
            .check(&pick(&limits, &[0, 1]), &[], &facts("a", &h), StoreFailure::Allow)
            .await
            .committed();
        assert_eq!(v.refused_at(), Some(1));
    }
    // "wide" spent only on the 2 admitted requests: 8 left for its own route.
    assert_eq!(admitted(&limiter, &limits, &[0], &facts("a", &h), 20).await, 8);
}

#[tokio::test(start_paused = true)]
async fn shadow_and_soft_spend_like_enforce_but_admit() {
    let (_, limiter) = setup();
    let limits = vec![
        limit("shadow", "3/min", None, Mode::Shadow),
        limit("soft", "3/min", None, Mode::Soft),
    ];
    let h = http::HeaderMap::new();
    let mut outcomes = Vec::new();
    for _ in 0..5 {
        let v = limiter
            .check(&pick(&limits, &[0, 1]), &[], &facts("a", &h), StoreFailure::Allow)
            .await
            .committed();
        assert_eq!(v.refused_at(), None);
        outcomes.push((v.limits[0].outcome, v.limits[1].outcome));
    }
    let over = |o: Outcome| outcomes.iter().filter(|(a, b)| *a == o || *b == o).count();
    assert_eq!(over(Outcome::ShadowLimited), 2);
    assert_eq!(over(Outcome::SoftLimited), 2);
}

#[tokio::test(start_paused = true)]
async fn leases_grow_for_a_busy_key_and_cut_store_calls() {
    let (store, limiter) = setup();
    let limits = vec![limit("big", "1000000/min", None, Mode::Enforce)];
    let h = http::HeaderMap::new();
    for _ in 0..20_000 {
        assert_eq!(
            limiter
                .check(&pick(&limits, &[0]), &[], &facts("a", &h), StoreFailure::Allow)
                .await
                .committed()
                .refused_at(),
            None
        );
        tokio::task::yield_now().await; // let background refills run
    }
    let calls = store.acquires.load(Ordering::SeqCst);
    assert!(calls < 20_000 / 50, "{calls} store calls for 20,000 decisions");
}

#[tokio::test(start_paused = true)]
async fn expired_leases_go_back_to_the_store() {
    let (now, store, limiter) = at(1_000_000);
    limiter.set_settings(Settings {
        sizing: Sizing {
            ttl_ms: 1,
            ..Sizing::default()
        },
        ..settings()
    });
    let limits = vec![limit("l", "1000/min", None, Mode::Enforce)];
    let h = http::HeaderMap::new();
    assert_eq!(
        limiter
            .check(&pick(&limits, &[0]), &[], &facts("a", &h), StoreFailure::Allow)
            .await
            .committed()
            .refused_at(),
        None
    );
    // Past the 1 ms TTL.
    now.fetch_add(2, Ordering::SeqCst);
    limiter.sweeper().sweep(60_000).await;
    assert_eq!(store.releases.load(Ordering::SeqCst), 1);
    // All but the one spent are back in the shared bucket (the clock moved
    // 2 ms: no token refilled). Without the release it would be short of
    // the lease's unspent tokens.
    let g = store
        .memory()
        .acquire_now("rl:{l:a}", &limits[0].spec, 2_000, Unspent::default())
        .unwrap();
    assert_eq!(g.granted, 999);
}

#[tokio::test(start_paused = true)]
async fn key_churn_cannot_grow_the_lease_map_past_its_cap() {
    let store = Arc::new(MemoryStore::new(1_000_000));
    let settings = Settings {
        max_block_ms: 3_600_000,
        max_keys: 1_024,
        ..settings()
    };
    let limiter = Limiter::new(store, settings, monotonic_clock());
    let limits = vec![limit("one", "1/h", None, Mode::Enforce)];
    let h = http::HeaderMap::new();
    for i in 0..20_000 {
        let id = format!("subnet:2001:db8:{i:x}::/64");
        limiter
            .check(&pick(&limits, &[0]), &[], &facts(&id, &h), StoreFailure::Allow)
            .await
            .committed();
        limiter
            .check(&pick(&limits, &[0]), &[], &facts(&id, &h), StoreFailure::Allow)
            .await
            .committed(); // refused and blocked for an hour
    }
    assert!(
        limiter.report().tracked_keys() <= 1_024,
        "{} leases",
        limiter.report().tracked_keys()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn eight_tasks_on_one_key_admit_exactly_the_allowance() {
    let (_, limiter) = setup();
    let limits = Arc::new(vec![limit("day", "1000/day", None, Mode::Enforce)]);
    let admitted = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (limiter, limits, admitted) = (limiter.clone(), limits.clone(), admitted.clone());
            tokio::spawn(async move {
                let h = http::HeaderMap::new();
                for _ in 0..100_000 {
                    if limiter
                        .check(&pick(&limits, &[0]), &[], &facts("hot", &h), StoreFailure::Allow)
                        .await
                        .committed()
                        .refused_at()
                        .is_none()
                    {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(admitted.load(Ordering::Relaxed), 1000);
}

/// Store calls for a key visited every 60 ms for a minute (1 000 visits),
/// under `sizing`, on a memory store.
async fn calls_for_a_key_visited_every_60_ms(sizing: Sizing) -> u64 {
    let (now, store, limiter) = at_with(T0, Settings { sizing, ..settings() });
    let limits = vec![limit("big", "1000000/s", None, Mode::Enforce)];
    for _ in 0..1_000 {
        assert_eq!(one(&limiter, &limits, "visitor").await.refused_at(), None);
        now.fetch_add(60, Ordering::SeqCst);
    }
    store.acquires.load(Ordering::SeqCst)
}

/// A lease covers its lookahead: at 16 visits a second, 4 tokens under a
/// 250 ms lookahead (so `min`, 5: a store call every 5 visits, 201 in
/// all), 16 under the embedded store's 1 s once the rate estimate has
/// settled (71 in all: one in 14).
#[tokio::test(start_paused = true)]
async fn on_the_embedded_store_a_key_visited_every_60_ms_calls_a_third_as_often() {
    let shared = calls_for_a_key_visited_every_60_ms(Sizing::default()).await;
    let embedded = calls_for_a_key_visited_every_60_ms(Sizing::default().embedded()).await;
    assert!((180..=220).contains(&shared), "{shared} calls, sized as configured");
    assert!((55..=75).contains(&embedded), "{embedded} calls on the embedded store");
}
