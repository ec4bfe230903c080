//! `queue_ms`: requests a limit would refuse wait in line, in arrival
//! order, for their token, against the real binary on Redis.

use std::time::{Duration, Instant};

use crate::support::redis::Redis;
use crate::support::{client, sample, Gateway, Toml};

fn toml(redis: &Redis, queue: &str) -> Toml {
    Toml::new()
        .gateway("workers = 1\naccess_log = \"off\"")
        .redis(&redis.url(), "timeout_ms = 1000")
        .respond("api", "/", &["two"])
        .limit("two", "2/s")
        .with(&format!("burst = 1\nby = [\"route\"]\n{queue}"))
}

/// Sends one GET per `gap`, each on its own connection, all at once in
/// flight; each one's (index, status, when it was answered).
async fn burst(gw: &Gateway, n: usize, gap: Duration) -> Vec<(usize, u16, Duration)> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..n {
        let addr = gw.http();
        tasks.push(tokio::spawn(async move {
            let mut c = client::http1(addr).await;
            let resp = client::send(&mut c, client::get("/")).await;
            (i, resp.status().as_u16(), start.elapsed())
        }));
        tokio::time::sleep(gap).await;
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_rate_wait_their_turn_instead_of_a_429() {
    let redis = Redis::start();
    let gw = Gateway::start_connected(&toml(&redis, "queue_ms = 3000"));
    let answers = burst(&gw, 4, Duration::from_millis(30)).await;
    let statuses: Vec<u16> = answers.iter().map(|a| a.1).collect();
    assert_eq!(statuses, [200, 200, 200, 200], "{answers:?}");
    // In arrival order, each a token's spacing (500 ms) after the last.
    let mut by_time = answers.clone();
    by_time.sort_by_key(|a| a.2);
    let order: Vec<usize> = by_time.iter().map(|a| a.0).collect();
    assert_eq!(order, [0, 1, 2, 3], "{answers:?}");
    assert!(by_time[3].2 >= Duration::from_millis(1_300), "{answers:?}");
    assert!(by_time[3].2 < Duration::from_millis(3_000), "{answers:?}");
    let m = gw.metrics().await;
    assert_eq!(
        sample(&m, "leasegate_queue_wait_seconds_count{limit=\"two\"}"),
        3.0,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_line_or_a_token_past_queue_ms_is_refused_at_once() {
    let redis = Redis::start();
    // One may wait; the others are refused as without a queue.
    let gw = Gateway::start_connected(&toml(&redis, "queue_ms = 3000\nqueue_max = 1"));
    let answers = burst(&gw, 4, Duration::from_millis(30)).await;
    let mut statuses: Vec<u16> = answers.iter().map(|a| a.1).collect();
    statuses.sort();
    assert_eq!(statuses, [200, 200, 429, 429], "{answers:?}");
    for (_, status, at) in &answers {
        if *status == 429 {
            assert!(*at < Duration::from_millis(400), "a refusal waited: {answers:?}");
        }
    }
    drop(gw);
    // A queue shorter than the wait for a token: refused at once.
    let gw = Gateway::start_connected(&toml(&redis, "queue_ms = 100"));
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let answers = burst(&gw, 2, Duration::from_millis(10)).await;
    assert_eq!(answers[0].1, 200, "{answers:?}");
    assert_eq!(answers[1].1, 429, "{answers:?}");
    assert!(answers[1].2 < Duration::from_millis(400), "{answers:?}");
}
