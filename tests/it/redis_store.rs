//! The Redis scripts and store against a real `redis-server`: the scripts
//! run directly by `redis-cli --eval`, and through `RedisStore`, which must
//! agree with the embedded store decision for decision.

use std::time::{Duration, Instant};

use leasegate::quota::Unspent;
use leasegate::quota::{self, Algorithm, Grant, Rate, Spec};
use leasegate::store::memory::MemoryStore;
use leasegate::store::redis::{RedisStore, Target};
use leasegate::store::{Acquire as _, StoreError};

use crate::support;
use crate::support::redis::Redis;

pub(crate) fn spec(algorithm: Algorithm, rate: &str, capacity: u64) -> Spec {
    let rate: Rate = rate.parse().unwrap();
    Spec::new(algorithm, rate, capacity)
}

/// Runs a script file with `redis-cli --eval`; returns the reply's integers.
fn eval(redis: &Redis, script: &str, key: &str, args: &[u64]) -> Vec<u64> {
    let lua = |name: &str| format!("{}/lua/{name}", env!("CARGO_MANIFEST_DIR"));
    let mut path = lua(script);
    // The fixed-window scripts run with the calendar in front, as the
    // store loads them.
    if matches!(script, "fixed_window.lua" | "release.lua") {
        let joined = std::env::temp_dir().join(format!("leasegate-{}-{script}", std::process::id()));
        let text = std::fs::read_to_string(lua("calendar.lua")).unwrap() + &std::fs::read_to_string(&path).unwrap();
        std::fs::write(&joined, text).unwrap();
        path = joined.display().to_string();
    }
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
async fn acquire_retrying(store: &RedisStore, key: &str, spec: &Spec, want: u64, unspent: Unspent) -> Grant {
    reserve_retrying(store, key, spec, want, unspent, false).await
}

/// [`acquire_retrying`], reserving (`acquire_or_reserve`) when `reserve`.
pub(crate) async fn reserve_retrying(
    store: &RedisStore,
    key: &str,
    spec: &Spec,
    want: u64,
    unspent: Unspent,
    reserve: bool,
) -> Grant {
    crate::support::eventually(
        Duration::from_secs(10),
        async || {
            let call = if reserve {
                store.acquire_or_reserve(key, spec, want, unspent)
            } else {
                store.acquire(key, spec, want, unspent)
            };
            call.await.ok()
        },
        || "Redis never answered".into(),
    )
    .await
}

/// Redis's own clock, in ms, as the scripts read it.
fn redis_now_ms(redis: &Redis) -> u64 {
    let out = redis.cli(&["TIME"]);
    let mut lines = out.lines().map(|l| l.trim().parse::<u64>().unwrap());
    let (secs, micros) = (lines.next().unwrap(), lines.next().unwrap());
    secs * 1000 + micros / 1000
}

fn field(redis: &Redis, key: &str, name: &str) -> u64 {
    redis.cli(&["HGET", key, name]).trim().parse().unwrap()
}

fn pttl(redis: &Redis, key: &str) -> u64 {
    redis.cli(&["PTTL", key]).trim().parse().unwrap()
}

#[test]
fn token_bucket_script_grants_partially_and_says_when_to_retry() {
    let redis = Redis::start();
    // 10 per minute, capacity 10: one token per 6 s.
    let [granted, remaining, reset, retry, window, reserved, owed] =
        eval(&redis, "token_bucket.lua", "rl:{t:a}", &[10, 60_000, 10, 4])[..]
    else {
        panic!()
    };
    assert_eq!((granted, remaining, retry, window, reserved, owed), (4, 6, 0, 0, 0, 0));
    assert!((23_990..=24_000).contains(&reset), "{reset}");
    // Asking for more than is left: a partial grant, which empties the
    // bucket and so already says when the next token comes.
    let r = eval(&redis, "token_bucket.lua", "rl:{t:a}", &[10, 60_000, 10, 100]);
    assert_eq!((r[0], r[1]), (6, 0));
    assert!((5_900..=6_000).contains(&r[3]), "{r:?}");
    // Empty: nothing granted, and the exact wait for one token (6 s, less
    // the few ms since the bucket was last measured).
    let r = eval(&redis, "token_bucket.lua", "rl:{t:a}", &[10, 60_000, 10, 1]);
    assert_eq!(r[0], 0);
    assert!((5_900..=6_000).contains(&r[3]), "{r:?}");
    // State is a hash that lives until the bucket is full again, and a
    // second more.
    let fields = redis.cli(&["HGETALL", "rl:{t:a}"]);
    assert!(fields.contains("tokens") && fields.contains("ts"), "{fields}");
    let ttl = pttl(&redis, "rl:{t:a}");
    assert!(ttl <= r[2] + 1_000 && ttl + 100 >= r[2] + 1_000, "{ttl} {r:?}");
}

#[test]
fn a_token_bucket_key_lives_until_full_not_two_refills_from_empty() {
    let redis = Redis::start();
    // 1000/day that used five tokens: full again in 5 × 86.4 s, so the key
    // lives about 433 s, not two days.
    let r = eval(&redis, "token_bucket.lua", "rl:{t:ttl}", &[1_000, 86_400_000, 1_000, 5]);
    assert_eq!((r[0], r[1], r[2]), (5, 995, 432_000));
    let ttl = pttl(&redis, "rl:{t:ttl}");
    assert!((432_000..=433_000).contains(&ttl), "{ttl}");
    // Giving them back leaves it full: the key may go within a second.
    eval(
        &redis,
        "release.lua",
        "rl:{t:ttl}",
        &[0, 1_000, 86_400_000, 1_000, 5, 0],
    );
    let ttl = pttl(&redis, "rl:{t:ttl}");
    assert!(ttl <= 1_000, "{ttl}");
}

#[test]
fn token_bucket_script_says_the_real_wait_on_the_grant_that_empties_it() {
    let redis = Redis::start();
    // 5/min: one token taken 10 s ago (4 left then, 4 + 5/6 now). Taking 4
    // leaves 5/6 of a token: the next is 2 s away, not 12.
    let ts = redis_now_ms(&redis) - 10_000;
    redis.cli(&["HSET", "rl:{t:e}", "tokens", "240000", "ts", &ts.to_string()]);
    let r = eval(&redis, "token_bucket.lua", "rl:{t:e}", &[5, 60_000, 5, 4]);
    assert_eq!((r[0], r[1]), (4, 0), "{r:?}");
    assert!((1_900..=2_000).contains(&r[3]), "{r:?}");
}

/// A drained bucket asked to reserve: the tokens of its refill to come,
/// in turn. The first asker's first token is due when the bucket's next
/// one is, the second asker's after the first asker's last; the debt
/// stops at one burst (or one period's count), and what is given back
/// pays it off.
#[test]
fn token_bucket_script_reserves_the_refill_in_turn_and_bounds_the_debt() {
    let redis = Redis::start();
    // 10/s, burst 10: one token every 100 ms. Drained.
    let r = eval(&redis, "token_bucket.lua", "rl:{t:q}", &[10, 1_000, 10, 10, 0, 1]);
    assert_eq!(
        (r[0], r[5]),
        (10, 0),
        "a bucket with tokens grants, reserves nothing: {r:?}"
    );
    let a = eval(&redis, "token_bucket.lua", "rl:{t:q}", &[10, 1_000, 10, 5, 0, 1]);
    assert_eq!((a[0], a[1], a[5]), (0, 0, 5), "{a:?}");
    assert!((1..=100).contains(&a[3]), "the first is due with the next token: {a:?}");
    let b = eval(&redis, "token_bucket.lua", "rl:{t:q}", &[10, 1_000, 10, 5, 0, 1]);
    assert_eq!(b[5], 5, "{b:?}");
    assert!(
        (400..=600).contains(&(b[3] - a[3])),
        "after the first asker's five: {a:?} {b:?}"
    );
    // Without `reserve`, nothing is taken from the queue.
    let c = eval(&redis, "token_bucket.lua", "rl:{t:q}", &[10, 1_000, 10, 5, 0, 0]);
    assert_eq!((c[0], c[5]), (0, 0), "{c:?}");
    assert!(c[3] >= b[3] + 400, "a plain ask waits for the whole queue: {c:?}");
    // The debt is at most one burst: ten owed, nothing more fits.
    let d = eval(&redis, "token_bucket.lua", "rl:{t:q}", &[10, 1_000, 10, 5, 0, 1]);
    assert_eq!((d[0], d[5]), (0, 0), "{d:?}");
    // Tokens given back pay the debt off first.
    let e = eval(&redis, "token_bucket.lua", "rl:{t:q}", &[10, 1_000, 10, 3, 5, 1]);
    assert_eq!(e[5], 3, "five back made room for three: {e:?}");
}

#[test]
fn token_bucket_script_gives_back_before_granting() {
    let redis = Redis::start();
    let r = eval(&redis, "token_bucket.lua", "rl:{t:g}", &[10, 86_400_000, 10, 10, 0]);
    assert_eq!(r[0], 10);
    // Two come back in the same call that asks for three: two granted.
    let r = eval(&redis, "token_bucket.lua", "rl:{t:g}", &[10, 86_400_000, 10, 3, 2]);
    assert_eq!((r[0], r[1]), (2, 0), "{r:?}");
    // A give-back beyond the capacity stops at the capacity.
    let r = eval(&redis, "token_bucket.lua", "rl:{t:g}", &[10, 86_400_000, 10, 0, 100]);
    assert_eq!(r[1], 10, "{r:?}");
}

#[test]
fn token_bucket_scripts_re_anchor_a_timestamp_from_the_future() {
    let redis = Redis::start();
    // The state says "measured an hour from now" (written before a failover
    // to a replica whose clock is an hour behind). 10/s: one token per 100 ms.
    let future = redis_now_ms(&redis) + 3_600_000;
    redis.cli(&["HSET", "rl:{t:f}", "tokens", "0", "ts", &future.to_string()]);
    let r = eval(&redis, "token_bucket.lua", "rl:{t:f}", &[10, 1_000, 10, 1]);
    assert_eq!(r[0], 0, "nothing refills for a step back: {r:?}");
    assert!((1..=100).contains(&r[3]), "{r:?}");
    let ts = field(&redis, "rl:{t:f}", "ts");
    assert!(ts < future - 3_000_000, "re-anchored to now: {ts}");
    std::thread::sleep(Duration::from_millis(250));
    let r = eval(&redis, "token_bucket.lua", "rl:{t:f}", &[10, 1_000, 10, 10]);
    assert!((2..=3).contains(&r[0]), "refills again at once, not in an hour: {r:?}");
    // The release script does the same.
    redis.cli(&["HSET", "rl:{t:f}", "tokens", "0", "ts", &future.to_string()]);
    let r = eval(&redis, "release.lua", "rl:{t:f}", &[0, 10, 1_000, 10, 1, 0]);
    assert_eq!(r[1], 1, "{r:?}");
    assert!(field(&redis, "rl:{t:f}", "ts") < future - 3_000_000);
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
    let r = eval(&redis, "release.lua", "rl:{t:r}", &[0, 10, 1_000, 5, 100, 0]);
    assert_eq!(r[1], 5, "{r:?}");
    // Releasing to a key that is gone is a no-op: it does not come back.
    let r = eval(&redis, "release.lua", "rl:{t:gone}", &[0, 10, 1_000, 5, 3, 0]);
    assert_eq!(r[1], 5);
    assert_eq!(redis.cli(&["EXISTS", "rl:{t:gone}"]).trim(), "0");
}

#[test]
fn sliding_window_script_admits_the_limit_per_window() {
    let redis = Redis::start();
    // 5 per hour: within one aligned window, 5 and no more.
    let r = eval(&redis, "sliding_window.lua", "rl:{w:a}", &[5, 3_600_000, 3]);
    assert_eq!((r[0], r[1], r[3]), (3, 2, 0));
    let window = r[4];
    assert_eq!(window % 3_600_000, 0);
    let r = eval(&redis, "sliding_window.lua", "rl:{w:a}", &[5, 3_600_000, 10]);
    assert_eq!((r[0], r[1], r[4]), (2, 0, window));
    // The 5 of this window still weigh 5 × (1 − e/p) after it turns, so the
    // next request fits a fifth of a period into the next one: said by the
    // grant that filled the window, and again by the refusal.
    assert_eq!(r[3], r[2] + 720_000, "{r:?}");
    let r = eval(&redis, "sliding_window.lua", "rl:{w:a}", &[5, 3_600_000, 1]);
    assert_eq!(r[0], 0);
    assert_eq!(r[3], r[2] + 720_000, "{r:?}");
    // Release takes back from the window they were taken in, the current one.
    eval(&redis, "release.lua", "rl:{w:a}", &[1, 5, 3_600_000, 5, 2, window]);
    let r = eval(&redis, "sliding_window.lua", "rl:{w:a}", &[5, 3_600_000, 5]);
    assert_eq!(r[0], 2);
    let ttl = pttl(&redis, "rl:{w:a}");
    assert!(ttl > 3_600_000 && ttl <= 7_200_000, "{ttl}");
}

#[test]
fn sliding_window_release_goes_back_to_the_window_it_came_from() {
    let redis = Redis::start();
    let p = 86_400_000;
    let start = redis_now_ms(&redis) / p * p;
    let prev_win = (start - p).to_string();
    // 6 taken yesterday, in a window that has turned since.
    redis.cli(&["HSET", "rl:{w:r}", "win", &prev_win, "cur", "6", "prev", "0"]);
    // Given back to yesterday's window: off the previous count.
    eval(&redis, "release.lua", "rl:{w:r}", &[1, 10, p, 10, 4, start - p]);
    assert_eq!(field(&redis, "rl:{w:r}", "win"), start);
    assert_eq!(
        (field(&redis, "rl:{w:r}", "prev"), field(&redis, "rl:{w:r}", "cur")),
        (2, 0)
    );
    // The acquire script's give-back does the same, before granting.
    let r = eval(&redis, "sliding_window.lua", "rl:{w:r}", &[10, p, 3, 1, start - p]);
    assert_eq!((r[0], r[4]), (3, start));
    assert_eq!(
        (field(&redis, "rl:{w:r}", "prev"), field(&redis, "rl:{w:r}", "cur")),
        (1, 3)
    );
    // To today's window: off the current count.
    eval(&redis, "sliding_window.lua", "rl:{w:r}", &[10, p, 0, 2, start]);
    assert_eq!(field(&redis, "rl:{w:r}", "cur"), 1);
    // A window older than the previous one weighs nothing any more: a
    // give-back to it changes nothing.
    redis.cli(&["HSET", "rl:{w:o}", "win", &prev_win, "cur", "6", "prev", "6"]);
    eval(&redis, "release.lua", "rl:{w:o}", &[1, 10, p, 10, 4, start - 2 * p]);
    assert_eq!(
        (field(&redis, "rl:{w:o}", "prev"), field(&redis, "rl:{w:o}", "cur")),
        (6, 0)
    );
}

#[test]
fn sliding_window_scripts_re_anchor_a_window_from_the_future() {
    let redis = Redis::start();
    // 2 per second; the state's window starts an hour from now, full.
    let p = 1_000;
    let start = redis_now_ms(&redis) / p * p;
    let future = (start + 3_600_000).to_string();
    redis.cli(&["HSET", "rl:{w:f}", "win", &future, "cur", "2", "prev", "0"]);
    let r = eval(&redis, "sliding_window.lua", "rl:{w:f}", &[2, p, 1]);
    assert_eq!(r[0], 0, "{r:?}");
    // Re-anchored to now's window, its count kept: refused for at most two
    // periods, not an hour.
    assert!(r[4] < start + 3_600_000, "{r:?}");
    assert_eq!(field(&redis, "rl:{w:f}", "win"), r[4]);
    assert_eq!(field(&redis, "rl:{w:f}", "cur"), 2);
    assert!((1..=2 * p).contains(&r[3]), "{r:?}");
    std::thread::sleep(Duration::from_millis(r[3] + 20));
    let r = eval(&redis, "sliding_window.lua", "rl:{w:f}", &[2, p, 1]);
    assert_eq!(r[0], 1, "admitted again after retry_after: {r:?}");
    // A previous count from the future weighs fully, as a monotonic clock
    // just past that window's start would weigh it: nothing more fits.
    let day = 86_400_000;
    let next = (redis_now_ms(&redis) / day * day + day).to_string();
    redis.cli(&["HSET", "rl:{w:b}", "win", &next, "cur", "0", "prev", "5"]);
    let r = eval(&redis, "sliding_window.lua", "rl:{w:b}", &[5, day, 5]);
    assert_eq!(r[0], 0, "{r:?}");
    assert_eq!(field(&redis, "rl:{w:b}", "cur"), 5);
    // The release script re-anchors too.
    redis.cli(&["HSET", "rl:{w:b}", "win", &next, "cur", "0", "prev", "5"]);
    eval(&redis, "release.lua", "rl:{w:b}", &[1, 5, day, 5, 1, 0]);
    assert_eq!(field(&redis, "rl:{w:b}", "win"), redis_now_ms(&redis) / day * day);
    assert_eq!(field(&redis, "rl:{w:b}", "cur"), 5);
}

#[test]
fn fixed_window_script_counts_per_epoch_aligned_window() {
    let redis = Redis::start();
    let day = 86_400_000;
    let start = redis_now_ms(&redis) / day * day;
    // 5 per day, aligned to 00:00 UTC as envoyproxy/ratelimit aligns it.
    let r = eval(&redis, "fixed_window.lua", "rl:{f:a}", &[5, day, 3]);
    assert_eq!((r[0], r[1], r[3], r[4]), (3, 2, 0, start), "{r:?}");
    let midnight = start + day - redis_now_ms(&redis);
    assert!(r[2].abs_diff(midnight) < 1_000, "reset at midnight: {r:?}");
    // Partial grant; the grant that fills the window says: the next one.
    let r = eval(&redis, "fixed_window.lua", "rl:{f:a}", &[5, day, 10]);
    assert_eq!((r[0], r[1]), (2, 0));
    assert_eq!(r[3], r[2], "{r:?}");
    // Refused calls are not counted.
    let r = eval(&redis, "fixed_window.lua", "rl:{f:a}", &[5, day, 1]);
    assert_eq!(r[0], 0);
    assert_eq!(field(&redis, "rl:{f:a}", "n"), 5);
    // Give-backs: to this window they count; to an ended one they do not.
    eval(&redis, "release.lua", "rl:{f:a}", &[2, 5, day, 5, 2, start]);
    assert_eq!(field(&redis, "rl:{f:a}", "n"), 3);
    eval(&redis, "release.lua", "rl:{f:a}", &[2, 5, day, 5, 2, start - day]);
    assert_eq!(field(&redis, "rl:{f:a}", "n"), 3);
    let r = eval(&redis, "fixed_window.lua", "rl:{f:a}", &[5, day, 0, 1, start]);
    assert_eq!((r[0], r[1]), (0, 3), "{r:?}");
    // The key lives until the window ends, not longer.
    let ttl = pttl(&redis, "rl:{f:a}");
    assert!(ttl <= day && ttl + 5_000 >= start + day - redis_now_ms(&redis), "{ttl}");
    // A window from the future (a clock that went back) is re-anchored to
    // now's with its count: refused until now's window ends, not the future's.
    let future = (start + 7 * day).to_string();
    redis.cli(&["HSET", "rl:{f:f}", "win", &future, "n", "5"]);
    let r = eval(&redis, "fixed_window.lua", "rl:{f:f}", &[5, day, 1]);
    assert_eq!((r[0], r[4]), (0, start), "{r:?}");
    assert!(r[3] <= day, "{r:?}");
}

/// A count above the limit (costs charged past it) is carried into the
/// windows after it, `limit` paid off by each, in the scripts as in their
/// Rust twins (`quota::fixed_window::roll`, `quota::sliding_window::roll`):
/// a window's debt is never forgiven at its end, a month's included.
#[tokio::test]
async fn window_scripts_carry_an_overshoot_into_the_next_windows() {
    let redis = Redis::start();
    let memory = MemoryStore::new(100);
    let day = 86_400_000;
    let now = redis_now_ms(&redis);
    let start = now / day * day;
    // 17 counted against 5 a day, yesterday: 12 today, refused, 7 owed.
    redis.cli(&["HSET", "rl:{c:f}", "win", &(start - day).to_string(), "n", "17"]);
    let r = eval(&redis, "fixed_window.lua", "rl:{c:f}", &[5, day, 1]);
    assert_eq!((r[0], r[6]), (0, 7), "{r:?}");
    assert_eq!(field(&redis, "rl:{c:f}", "n"), 12);
    assert!(pttl(&redis, "rl:{c:f}") > day, "kept while owed");
    // Three days ago: 2 left, and room for 3.
    redis.cli(&["HSET", "rl:{c:g}", "win", &(start - 3 * day).to_string(), "n", "17"]);
    let r = eval(&redis, "fixed_window.lua", "rl:{c:g}", &[5, day, 1]);
    assert_eq!((r[0], r[1]), (1, 2), "{r:?}");
    // Last month, 13 counted against 5 a month: 8 this month.
    let month = spec(Algorithm::FixedWindow, "5/month", 5);
    let (this, _) = quota::Calendar::Month.window(now, month.period_ms());
    let (last, _) = quota::Calendar::Month.window(this - 1, month.period_ms());
    redis.cli(&["HSET", "rl:{c:m}", "win", &last.to_string(), "n", "13"]);
    let r = eval(
        &redis,
        "fixed_window.lua",
        "rl:{c:m}",
        &[5, month.period_ms(), 1, 0, 0, 2],
    );
    assert_eq!(r[0], 0, "{r:?}");
    assert_eq!(field(&redis, "rl:{c:m}", "n"), 8);

    // A sliding window of 5 a day that counted 12 yesterday: now's
    // previous count is 5, its current 7 (owed), refused; the wait is the
    // exact time until one fits, in the memory twin as in the script.
    redis.cli(&[
        "HSET",
        "rl:{c:s}",
        "win",
        &(start - day).to_string(),
        "cur",
        "12",
        "prev",
        "0",
    ]);
    let r = eval(&redis, "sliding_window.lua", "rl:{c:s}", &[5, day, 1]);
    assert_eq!(r[0], 0, "{r:?}");
    assert_eq!(
        (field(&redis, "rl:{c:s}", "cur"), field(&redis, "rl:{c:s}", "prev")),
        (7, 5)
    );
    let sliding = spec(Algorithm::SlidingWindow, "5/day", 5);
    let at = redis_now_ms(&redis);
    let state = quota::sliding_window::State {
        window_ms: start - day,
        current: 12,
        previous: 0,
    };
    let (_, g) = quota::sliding_window::acquire(Some(state), &sliding, at, 1);
    assert_eq!((g.granted, g.owed), (0, r[6]), "{g:?} {r:?}");
    assert!(g.retry_after_ms.abs_diff(r[3]) < 2_000, "{g:?} {r:?}");
    assert!(r[3] > start + day - at, "not before the next window: {r:?}");
    // The release script rolls the same way.
    redis.cli(&[
        "HSET",
        "rl:{c:r}",
        "win",
        &(start - day).to_string(),
        "cur",
        "12",
        "prev",
        "0",
    ]);
    eval(&redis, "release.lua", "rl:{c:r}", &[1, 5, day, 5, 1, 0]);
    assert_eq!(
        (field(&redis, "rl:{c:r}", "cur"), field(&redis, "rl:{c:r}", "prev")),
        (7, 5)
    );
    // And a charge through the memory store carries as the script does.
    let charged = Unspent {
        charge: 17,
        ..Unspent::default()
    };
    let m = memory
        .acquire("rl:{c:x}", &spec(Algorithm::FixedWindow, "5/day", 5), 0, charged)
        .await
        .unwrap();
    assert_eq!(m.owed, 12);
}

#[tokio::test]
async fn a_restarted_redis_starts_with_a_full_bucket_and_reloads_the_scripts() {
    let mut redis = Redis::start();
    let store = RedisStore::start(&Target::Node(redis.url())).unwrap();
    let s = spec(Algorithm::TokenBucket, "10/min", 10);
    let g = acquire_retrying(&store, "rl:{r:a}", &s, 10, Unspent::default()).await;
    assert_eq!(g.granted, 10);
    assert_eq!(
        acquire_retrying(&store, "rl:{r:a}", &s, 1, Unspent::default())
            .await
            .granted,
        0
    );
    // The same port, an empty server: no bucket, no script cache.
    redis.restart();
    let g = acquire_retrying(&store, "rl:{r:a}", &s, 10, Unspent::default()).await;
    assert_eq!(g.granted, 10, "a fresh bucket starts full");
    // A flushed script cache is reloaded transparently too.
    redis.cli(&["SCRIPT", "FLUSH"]);
    let g = store.acquire("rl:{r:b}", &s, 3, Unspent::default()).await.unwrap();
    assert_eq!(g.granted, 3);
    assert!(redis.calls("script|load") + redis.calls("eval") >= 1);
}

#[tokio::test]
async fn a_store_started_without_redis_fails_fast_and_recovers() {
    let port = support::closed_port();
    let store = RedisStore::start(&Target::Node(format!("redis://127.0.0.1:{port}"))).unwrap();
    let s = spec(Algorithm::TokenBucket, "10/min", 10);
    let started = Instant::now();
    let err = store.acquire("rl:{x}", &s, 1, Unspent::default()).await.unwrap_err();
    assert!(matches!(err, StoreError::NotConnected(_)), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    // Redis comes up later on that port: the same store starts working.
    let _redis = Redis::start_on(port);
    assert_eq!(
        acquire_retrying(&store, "rl:{x}", &s, 1, Unspent::default())
            .await
            .granted,
        1
    );
}

/// Redis gone, its port refusing: every call fails at once as a store
/// error (the call that met the broken connection `Unavailable`, those
/// after it `NotConnected`: never sent), never by hanging until a deadline
/// on a reconnect; and once Redis is back on that port, the connection is
/// redialled in the background (within the redial's backoff of 500 ms) and
/// the very next call after it is up is served.
#[tokio::test]
async fn a_refused_connection_fails_at_once_and_the_next_call_after_a_restart_is_served() {
    let mut redis = Redis::start();
    let store = RedisStore::start(&Target::Node(redis.url())).unwrap();
    let s = spec(Algorithm::TokenBucket, "100/min", 100);
    acquire_retrying(&store, "rl:{refused}", &s, 1, Unspent::default()).await;
    redis.kill();
    for call in 0..20 {
        let started = Instant::now();
        let result = store.acquire("rl:{refused}", &s, 1, Unspent::default()).await;
        let took = started.elapsed();
        assert!(
            matches!(result, Err(StoreError::Unavailable(_) | StoreError::NotConnected(_))),
            "call {call}: {result:?}"
        );
        // The guard's deadline is 5 ms by default; a refusal takes far less.
        assert!(took < Duration::from_millis(50), "call {call} took {took:?}");
    }
    assert!(!store.link().is_up());
    redis.restart();
    assert!(
        store.link().wait_up(Duration::from_secs(2)).await,
        "{}",
        store.link().describe()
    );
    let g = store.acquire("rl:{refused}", &s, 1, Unspent::default()).await;
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
    acquire_retrying(&store, "rl:{late}", &s, 1, Unspent::default()).await; // connected; 99 left
                                                                            // Redis hangs for 300 ms; a caller waits 20 ms for 50 tokens, then leaves.
    redis.freeze();
    let call = store.acquire("rl:{late}", &s, 50, Unspent::default());
    assert!(tokio::time::timeout(Duration::from_millis(20), call).await.is_err());
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.thaw();
    // The script ran once Redis woke, and its 50 tokens were returned.
    let units = async || -> u64 { redis.cli(&["HGET", "rl:{late}", "tokens"]).trim().parse().unwrap_or(0) };
    crate::support::eventually(
        Duration::from_secs(5),
        async || (units().await / 3_600_000 == 99 && redis.calls("evalsha") >= 3).then_some(()),
        || "the late grant was not returned".into(),
    )
    .await;
}

/// A late grant of a sliding window goes back to the window it was counted
/// in (passing no window would leave it counted: "older, nothing").
#[tokio::test]
async fn a_late_sliding_window_grant_goes_back_to_its_window() {
    let redis = Redis::start();
    let store = RedisStore::start(&Target::Node(redis.url())).unwrap();
    let s = spec(Algorithm::SlidingWindow, "100/day", 100);
    acquire_retrying(&store, "rl:{late:w}", &s, 1, Unspent::default()).await;
    redis.freeze();
    let call = store.acquire("rl:{late:w}", &s, 50, Unspent::default());
    assert!(tokio::time::timeout(Duration::from_millis(20), call).await.is_err());
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.thaw();
    crate::support::eventually(
        Duration::from_secs(5),
        async || {
            let cur: u64 = redis.cli(&["HGET", "rl:{late:w}", "cur"]).trim().parse().unwrap_or(0);
            (cur == 1 && redis.calls("evalsha") >= 3).then_some(())
        },
        || "the late grant was not returned".into(),
    )
    .await;
}

/// A region's credit spend whose caller stopped waiting (the deadline
/// passed, Redis a zone away) still ran: its tokens go back to the key's
/// credit instead of being spent for nobody (issue 37: a surging region
/// admitted no more than its slice while it held granted credit).
#[tokio::test]
async fn credit_spent_for_a_caller_that_stopped_waiting_goes_back() {
    use leasegate::store::RegionStore;
    let redis = Redis::start();
    let relay = crate::support::relay::Relay::start(([127, 0, 0, 1], redis.port).into(), Duration::from_millis(10));
    let store = RedisStore::start(&Target::Node(relay.url())).unwrap();
    assert!(store.link().wait_up(Duration::from_secs(5)).await);
    let key = "rl:{eu:k}";
    assert_eq!(store.credit(key, 1, 100, 60_000).await.unwrap(), 100);
    // The caller gives up long before the 20 ms round trip ends.
    let gave_up = tokio::time::timeout(Duration::from_millis(2), store.spend_credit(key, 30, 60_000)).await;
    assert!(gave_up.is_err());
    // The script ran and its reply came to nobody: the 30 go back.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let all = store.spend_credit(key, 1_000, 60_000).await.unwrap();
    assert_eq!(all.spent, 100, "{all:?}");
}
