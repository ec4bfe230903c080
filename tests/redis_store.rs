//! The Redis scripts and store against a real `redis-server`: the scripts
//! run directly by `redis-cli --eval`, and through `RedisStore`, which must
//! agree with the embedded store decision for decision.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::{Duration, Instant};

use leasegate::quota::{Algorithm, Grant, Rate, Spec};
use leasegate::store::memory::MemoryStore;
use leasegate::store::redis::{RedisStore, Target};
use leasegate::store::{QuotaStore, StoreError};
use support::redis::Redis;

fn spec(algorithm: Algorithm, rate: &str, capacity: u64) -> Spec {
    let rate: Rate = rate.parse().unwrap();
    Spec::new(algorithm, rate, capacity)
}

/// Runs a script file with `redis-cli --eval`; returns the reply's integers.
fn eval(redis: &Redis, script: &str, key: &str, args: &[u64]) -> Vec<u64> {
    let path = format!("{}/lua/{script}", env!("CARGO_MANIFEST_DIR"));
    let mut cli_args: Vec<String> = vec!["--eval".into(), path, key.into(), ",".into()];
    cli_args.extend(args.iter().map(u64::to_string));
    let refs: Vec<&str> = cli_args.iter().map(String::as_str).collect();
    let out = redis.cli(&refs);
    out.lines()
        .map(|l| {
            l.trim()
                .parse()
                .unwrap_or_else(|_| panic!("not an integer reply: {out:?}"))
        })
        .collect()
}

/// The first call after a restart may meet the dropped connection; the
/// store reconnects on its own.
async fn acquire_retrying(store: &RedisStore, key: &str, spec: &Spec, want: u64) -> Grant {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.acquire(key, spec, want).await {
            Ok(g) => return g,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("Redis never answered: {e}"),
        }
    }
}

#[test]
fn token_bucket_script_grants_partially_and_says_when_to_retry() {
    let redis = Redis::start();
    // 10 per minute, capacity 10: one token per 6 s.
    let [granted, remaining, reset, retry] = eval(&redis, "token_bucket.lua", "rl:{t:a}", &[10, 60_000, 10, 4])[..]
    else {
        panic!()
    };
    assert_eq!((granted, remaining, retry), (4, 6, 0));
    assert!((23_990..=24_000).contains(&reset), "{reset}");
    // Asking for more than is left: a partial grant.
    let r = eval(&redis, "token_bucket.lua", "rl:{t:a}", &[10, 60_000, 10, 100]);
    assert_eq!((r[0], r[1]), (6, 0));
    // Empty: nothing granted, and the exact wait for one token (6 s, less
    // the few ms since the bucket was last measured).
    let r = eval(&redis, "token_bucket.lua", "rl:{t:a}", &[10, 60_000, 10, 1]);
    assert_eq!(r[0], 0);
    assert!((5_900..=6_000).contains(&r[3]), "{r:?}");
    // State is a hash with a TTL of about twice the full-refill time (60 s).
    let fields = redis.cli(&["HGETALL", "rl:{t:a}"]);
    assert!(fields.contains("tokens") && fields.contains("ts"), "{fields}");
    let ttl: u64 = redis.cli(&["PTTL", "rl:{t:a}"]).trim().parse().unwrap();
    assert!((119_000..=120_000).contains(&ttl), "{ttl}");
}

#[test]
fn token_bucket_script_refills_and_release_clamps_to_capacity() {
    let redis = Redis::start();
    // 1 token per 100 ms, capacity 5.
    let r = eval(&redis, "token_bucket.lua", "rl:{t:r}", &[10, 1_000, 5, 5]);
    assert_eq!(r[0], 5);
    std::thread::sleep(Duration::from_millis(250));
    let r = eval(&redis, "token_bucket.lua", "rl:{t:r}", &[10, 1_000, 5, 5]);
    assert!((2..=3).contains(&r[0]), "refilled by elapsed time: {r:?}");
    // Giving back more than fits stops at the capacity.
    let r = eval(&redis, "release.lua", "rl:{t:r}", &[0, 10, 1_000, 5, 100]);
    assert_eq!(r[1], 5, "{r:?}");
    // Releasing to a key that is gone is a no-op: it does not come back.
    let r = eval(&redis, "release.lua", "rl:{t:gone}", &[0, 10, 1_000, 5, 3]);
    assert_eq!(r[1], 5);
    assert_eq!(redis.cli(&["EXISTS", "rl:{t:gone}"]).trim(), "0");
}

#[test]
fn sliding_window_script_admits_the_limit_per_window() {
    let redis = Redis::start();
    // 5 per hour: within one aligned window, 5 and no more.
    let r = eval(&redis, "sliding_window.lua", "rl:{w:a}", &[5, 3_600_000, 3]);
    assert_eq!((r[0], r[1]), (3, 2));
    let r = eval(&redis, "sliding_window.lua", "rl:{w:a}", &[5, 3_600_000, 10]);
    assert_eq!((r[0], r[1]), (2, 0));
    let r = eval(&redis, "sliding_window.lua", "rl:{w:a}", &[5, 3_600_000, 1]);
    assert_eq!(r[0], 0);
    // Refused: the 5 of this window still weigh 5 × (1 − e/p) after it
    // turns, so the next request fits a fifth of a period into the next one.
    assert_eq!(r[3], r[2] + 720_000, "{r:?}");
    // Release takes back from the current window.
    eval(&redis, "release.lua", "rl:{w:a}", &[1, 5, 3_600_000, 5, 2]);
    let r = eval(&redis, "sliding_window.lua", "rl:{w:a}", &[5, 3_600_000, 5]);
    assert_eq!(r[0], 2);
    let ttl: u64 = redis.cli(&["PTTL", "rl:{w:a}"]).trim().parse().unwrap();
    assert!(ttl > 3_600_000 && ttl <= 7_200_000, "{ttl}");
}

/// Random acquires and releases, the same on both stores: with a quota that
/// refills too slowly to move during the test, every grant must match.
#[tokio::test]
async fn redis_and_memory_stores_agree_decision_for_decision() {
    let redis = Redis::start();
    let store = RedisStore::start(&Target::Node(redis.url())).unwrap();
    let memory = MemoryStore::new(10_000);
    let specs = [
        spec(Algorithm::TokenBucket, "50/day", 20),
        spec(Algorithm::TokenBucket, "1000/day", 1000),
        spec(Algorithm::SlidingWindow, "30/day", 30),
    ];
    let mut rng = fastrand::Rng::with_seed(7);
    for step in 0..600 {
        let which = rng.usize(..specs.len());
        let spec = &specs[which];
        let key = format!("rl:{{diff:{which}:{}}}", rng.u8(..3));
        if rng.u8(..4) == 0 {
            let n = rng.u64(1..8);
            store.release(&key, spec, n).await.unwrap();
            memory.release(&key, spec, n).await.unwrap();
            continue;
        }
        let want = rng.u64(1..12);
        let r = acquire_retrying(&store, &key, spec, want).await;
        let m = memory.acquire(&key, spec, want).await.unwrap();
        assert_eq!(
            (r.granted, r.remaining),
            (m.granted, m.remaining),
            "step {step}: {key} want {want}: redis {r:?} memory {m:?}"
        );
        // Times differ only by the milliseconds between the two calls.
        let close = |a: u64, b: u64| a.abs_diff(b) <= 2_000;
        assert!(close(r.reset_ms, m.reset_ms), "step {step}: {r:?} {m:?}");
        assert!(close(r.retry_after_ms, m.retry_after_ms), "step {step}: {r:?} {m:?}");
    }
}

#[tokio::test]
async fn a_restarted_redis_starts_with_a_full_bucket_and_reloads_the_scripts() {
    let mut redis = Redis::start();
    let store = RedisStore::start(&Target::Node(redis.url())).unwrap();
    let s = spec(Algorithm::TokenBucket, "10/min", 10);
    let g = acquire_retrying(&store, "rl:{r:a}", &s, 10).await;
    assert_eq!(g.granted, 10);
    assert_eq!(acquire_retrying(&store, "rl:{r:a}", &s, 1).await.granted, 0);
    // The same port, an empty server: no bucket, no script cache.
    redis.restart();
    let g = acquire_retrying(&store, "rl:{r:a}", &s, 10).await;
    assert_eq!(g.granted, 10, "a fresh bucket starts full");
    // A flushed script cache is reloaded transparently too.
    redis.cli(&["SCRIPT", "FLUSH"]);
    let g = store.acquire("rl:{r:b}", &s, 3).await.unwrap();
    assert_eq!(g.granted, 3);
    assert!(redis.calls("script|load") + redis.calls("eval") >= 1);
}

#[tokio::test]
async fn a_store_started_without_redis_fails_fast_and_recovers() {
    let port = support::closed_port();
    let store = RedisStore::start(&Target::Node(format!("redis://127.0.0.1:{port}"))).unwrap();
    let s = spec(Algorithm::TokenBucket, "10/min", 10);
    let started = Instant::now();
    let err = store.acquire("rl:{x}", &s, 1).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Unavailable(_) | StoreError::Failed(_)),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    // Redis comes up later on that port: the same store starts working.
    let _redis = Redis::start_on(port);
    assert_eq!(acquire_retrying(&store, "rl:{x}", &s, 1).await.granted, 1);
}

/// Redis gone, its port refusing: every call fails at once as
/// `Unavailable` (a store error), never by hanging until a deadline on a
/// reconnect that backs off; and once Redis is back on that port, the very
/// next call is served.
#[tokio::test]
async fn a_refused_connection_fails_at_once_and_the_next_call_after_a_restart_is_served() {
    let mut redis = Redis::start();
    let store = RedisStore::start(&Target::Node(redis.url())).unwrap();
    let s = spec(Algorithm::TokenBucket, "100/min", 100);
    acquire_retrying(&store, "rl:{refused}", &s, 1).await;
    redis.kill();
    for call in 0..20 {
        let started = Instant::now();
        let result = store.acquire("rl:{refused}", &s, 1).await;
        let took = started.elapsed();
        assert!(
            matches!(result, Err(StoreError::Unavailable(_))),
            "call {call}: {result:?}"
        );
        // The guard's deadline is 5 ms by default; a refusal takes far less.
        assert!(took < Duration::from_millis(50), "call {call} took {took:?}");
    }
    redis.restart();
    let g = store.acquire("rl:{refused}", &s, 1).await;
    assert!(matches!(g, Ok(Grant { granted: 1, .. })), "{g:?}");
}

#[test]
fn a_lowered_capacity_caps_a_bucket_measured_this_very_millisecond() {
    let redis = Redis::start();
    // A bucket of 100 measured now, then asked under a capacity of 10 in
    // the same millisecond (a reload lowered the burst): at most 10.
    redis.cli(&["HSET", "rl:{t:cap}", "tokens", "6000000", "ts", "99999999999999"]);
    let r = eval(&redis, "token_bucket.lua", "rl:{t:cap}", &[10, 60_000, 10, 100]);
    assert_eq!(r[0], 10, "{r:?}");
    assert_eq!(r[1], 0);
    assert!(r[2] <= 60_000, "reset is never past a full refill: {r:?}");
}

/// Tokens granted after the caller gave up (its deadline passed) go back.
#[tokio::test]
async fn a_grant_that_arrives_too_late_goes_back_to_the_bucket() {
    let redis = Redis::start();
    let store = RedisStore::start(&Target::Node(redis.url())).unwrap();
    let s = spec(Algorithm::TokenBucket, "100/h", 100);
    acquire_retrying(&store, "rl:{late}", &s, 1).await; // connected; 99 left
                                                        // Redis hangs for 300 ms; a caller waits 20 ms for 50 tokens, then leaves.
    redis.freeze();
    let call = store.acquire("rl:{late}", &s, 50);
    assert!(tokio::time::timeout(Duration::from_millis(20), call).await.is_err());
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.thaw();
    // The script ran once Redis woke, and its 50 tokens were returned.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let units: u64 = redis.cli(&["HGET", "rl:{late}", "tokens"]).trim().parse().unwrap_or(0);
        if units / 3_600_000 == 99 && redis.calls("evalsha") >= 3 {
            break;
        }
        assert!(Instant::now() < deadline, "the late grant was not returned: {units}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
