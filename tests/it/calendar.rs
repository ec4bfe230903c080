//! Calendar quotas: `N/week` and `N/month` on a fixed window follow the
//! UTC calendar (Monday 00:00, the 1st 00:00), on the memory store and on
//! Redis (whose scripts compute the calendar from Redis's own clock): a
//! refusal's `Retry-After` is exactly the time to the next window, the
//! policy's `w` the current window's length, and a Redis key lives to the
//! window's end, not beyond.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::support::redis::Redis;
use crate::support::{client, Gateway, Toml};

const DAY: u64 = 86_400;

/// (year, month, day, seconds into the day) of Unix seconds `t`, by
/// counting whole years and months from 1970: another way than the
/// gateway's, on purpose.
fn leap(y: u64) -> bool {
    (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400)
}

fn civil(t: u64) -> (u64, u64, u64, u64) {
    let mut days = t / DAY;
    let mut y = 1970;
    loop {
        let n = if leap(y) { 366 } else { 365 };
        if days < n {
            break;
        }
        days -= n;
        y += 1;
    }
    let mut m = 0;
    while days >= days_in(y, m + 1) {
        days -= days_in(y, m + 1);
        m += 1;
    }
    (y, m + 1, days + 1, t % DAY)
}

/// Days in month `m` (1-12) of year `y`.
fn days_in(y: u64, m: u64) -> u64 {
    match m {
        2 if leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Milliseconds from `ms` to the next month's start, and this month's length in seconds.
fn to_next_month(ms: u64) -> (u64, u64) {
    let (y, m, d, secs) = civil(ms / 1000);
    let len = days_in(y, m) * DAY;
    let left_s = (days_in(y, m) - d) * DAY + (DAY - secs);
    (left_s * 1000 - ms % 1000, len)
}

/// Milliseconds from `ms` to the next Monday 00:00 UTC.
fn to_next_monday(ms: u64) -> u64 {
    let days = ms / 1000 / DAY;
    // 1970-01-01 was a Thursday; Monday is weekday 0 here.
    let weekday = (days + 3) % 7;
    (7 - weekday) * DAY * 1000 - ms % (DAY * 1000)
}

fn toml(store: &str) -> Toml {
    Toml::new()
        .gateway("workers = 1\naccess_log = \"off\"")
        .raw(store)
        .respond("monthly", "/m", &["monthly"])
        .respond("weekly", "/w", &["weekly"])
        .limit("monthly", "2/month")
        .with("algorithm = \"fixed_window\"\nby = [\"route\"]")
        .limit("weekly", "1/week")
        .with("algorithm = \"fixed_window\"\nby = [\"route\"]")
}

/// The answers to `n` GETs of `path`: (status, Retry-After, RateLimit-Policy), and when the last was sent.
async fn ask(gw: &Gateway, path: &str, n: usize) -> (Vec<(u16, Option<u64>, String)>, u64) {
    let mut c = client::http1(gw.http()).await;
    let mut out = Vec::new();
    let mut sent = 0;
    for _ in 0..n {
        sent = now_ms();
        let resp = client::send(&mut c, client::get(path)).await;
        let h = resp.headers();
        out.push((
            resp.status().as_u16(),
            h.get("retry-after").and_then(|v| v.to_str().ok()?.parse().ok()),
            h.get("ratelimit-policy")
                .map_or(String::new(), |v| v.to_str().unwrap().to_string()),
        ));
    }
    (out, sent)
}

async fn calendar_windows_hold(gw: &Gateway) {
    let (answers, sent) = ask(gw, "/m", 3).await;
    let (left_ms, month_s) = to_next_month(sent);
    assert_eq!(
        answers.iter().map(|a| a.0).collect::<Vec<_>>(),
        [200, 200, 429],
        "{answers:?}"
    );
    assert_eq!(
        answers[0].2,
        format!("\"monthly\";q=2;w={month_s}"),
        "w is this month's length"
    );
    let retry = answers[2].1.expect("a Retry-After");
    let want = left_ms.div_ceil(1000);
    assert!(
        retry.abs_diff(want) <= 1,
        "Retry-After {retry} s, to the next month {want} s"
    );
    let (answers, sent) = ask(gw, "/w", 2).await;
    assert_eq!((answers[0].0, answers[1].0), (200, 429), "{answers:?}");
    assert_eq!(answers[0].2, "\"weekly\";q=1;w=604800");
    let want = to_next_monday(sent).div_ceil(1000);
    let retry = answers[1].1.expect("a Retry-After");
    assert!(
        retry.abs_diff(want) <= 1,
        "Retry-After {retry} s, to next Monday {want} s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn month_and_week_windows_follow_the_calendar_on_the_memory_store() {
    let gw = Gateway::start(&toml(""));
    calendar_windows_hold(&gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn month_and_week_windows_follow_the_calendar_on_redis_and_keys_live_to_their_end() {
    let redis = Redis::start();
    let gw = Gateway::start_connected(&toml(&format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 1000\n",
        redis.url()
    )));
    calendar_windows_hold(&gw).await;
    let asked = now_ms();
    for (key, to_end) in [
        ("rl:{monthly:monthly}", to_next_month(asked).0),
        ("rl:{weekly:weekly}", to_next_monday(asked)),
    ] {
        let ttl: u64 = redis
            .cli(&["PTTL", key])
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{key}: {}", redis.cli(&["KEYS", "*"])));
        assert!(
            ttl <= to_end + 1_000 && ttl + 5_000 >= to_end,
            "{key}: PTTL {ttl} ms, window ends in {to_end} ms"
        );
    }
}

#[test]
fn the_civil_arithmetic_of_this_test_knows_its_calendar() {
    // 2026-12-02T04:30:00Z, a Wednesday.
    assert_eq!(civil(1_796_185_800), (2026, 12, 2, 16_200));
    assert_eq!(civil(951_782_400), (2000, 2, 29, 0));
    assert_eq!(to_next_monday(1_796_185_800_000), (5 * DAY - 16_200) * 1000);
}
