//! Identity churn at the Redis store: a flood of distinct keys, each seen
//! once, through the real binary on a real `redis-server`. The lease table
//! stays within `[store] max_keys` (its cap is hard), Redis holds no more
//! keys than were sent, and the gateway's resident memory per tracked key
//! stays within 2 KiB, as at the memory store.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;

use crate::support::redis::Redis;
use crate::support::{client, sample, Gateway, Toml};

const MAX_KEYS: u64 = 20_000;
/// Keys in the flood: the table fills, then evicts for the last 7 000 or
/// so (sized to keep the test within about 20 s in a debug build).
const FLOOD: u64 = 26_000;
const CLIENTS: u64 = 4;
/// Keys seen before the first RSS reading: buffers, connections and the
/// allocator's first arenas are then already paid for.
const WARM_UP: u64 = 1_000;
const BYTES_PER_KEY: f64 = 2_048.0;

fn config(redis: &Redis) -> Toml {
    Toml::new()
        .gateway("workers = 2\naccess_log = \"off\"")
        // About keys, not deadlines: a slow call on a busy machine must not
        // turn into a store failure (which, failing closed, would show as a
        // 503).
        .redis(&redis.url(), &format!("max_keys = {MAX_KEYS}\ntimeout_ms = 1000"))
        // Leased tokens stay for the whole flood: no key leaves the table by
        // the sweeper, so the table fills to its cap and every later key
        // evicts.
        .table("leasing", "ttl_ms = 60000")
        .respond("churn", "/", &["per_client"])
        .with("on_store_failure = \"deny\"")
        .limit("per_client", "100/min")
        .with("by = [\"header:x-client\"]")
}

/// The gateway's resident set size, in bytes.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status:\n{status}"));
    kib * 1_024
}

fn tracked_keys(metrics: &str) -> u64 {
    let line = metrics
        .lines()
        .find(|l| l.starts_with("leasegate_lease_keys "))
        .unwrap_or_else(|| panic!("no leasegate_lease_keys in\n{metrics}"));
    sample(line, "leasegate_lease_keys ") as u64
}

/// Sends one request for each key `prefix-i`, `i` in `range`, over
/// `CLIENTS` keep-alive connections at once; every answer must be 200.
async fn send_keys(gw: &Gateway, prefix: &str, range: std::ops::Range<u64>) {
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let addr = gw.http();
        let prefix = prefix.to_string();
        let range = range.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = client::http1(addr).await;
            for i in range.filter(|i| i % CLIENTS == c) {
                let req = Request::get("/")
                    .header("host", "localhost")
                    .header("x-client", format!("{prefix}-{i}"))
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                let status = client::send(&mut conn, req).await.status();
                assert_eq!(status, StatusCode::OK, "key {prefix}-{i}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// The tracked-key gauge once the sweeper, which sets it every second
/// here, has run after what came before.
async fn settled_tracked_keys(gw: &Gateway) -> u64 {
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    tracked_keys(&gw.metrics().await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_new_keys_stays_within_max_keys_and_2_kib_per_key() {
    let redis = Redis::start();
    let gw = Arc::new(Gateway::start_connected(&config(&redis)));
    let pid = gw.pid();

    send_keys(&gw, "warm", 0..WARM_UP).await;
    let tracked_before = settled_tracked_keys(&gw).await;
    let rss_before = rss_bytes(pid);

    // The gauge, watched while the flood runs: it never passes the cap.
    let done = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (gw, done, peak) = (gw.clone(), done.clone(), peak.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                let n = tracked_keys(&gw.metrics().await);
                peak.fetch_max(n, Ordering::Relaxed);
                assert!(n <= MAX_KEYS, "{n} keys tracked, over max_keys = {MAX_KEYS}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let started = Instant::now();
    send_keys(&gw, "flood", 0..FLOOD).await;
    let took = started.elapsed();
    let tracked_after = settled_tracked_keys(&gw).await;
    done.store(true, Ordering::Relaxed);
    watcher.await.unwrap();
    let rss_after = rss_bytes(pid);
    let peak = peak.load(Ordering::Relaxed).max(tracked_after);

    let dbsize: u64 = redis.cli(&["DBSIZE"]).trim().parse().unwrap();
    let grown = rss_after.saturating_sub(rss_before) as f64;
    let per_key = grown / tracked_after.max(1) as f64;
    let per_new_key = grown / tracked_after.saturating_sub(tracked_before).max(1) as f64;
    println!(
        "{FLOOD} new keys in {took:.1?} ({:.0}/s); tracked {tracked_before} -> {tracked_after} (peak {peak}, \
         max_keys {MAX_KEYS}); RSS {:.1} -> {:.1} MiB; {per_key:.0} bytes per tracked key, {per_new_key:.0} per \
         key added; Redis DBSIZE {dbsize}",
        FLOOD as f64 / took.as_secs_f64(),
        rss_before as f64 / 1_048_576.0,
        rss_after as f64 / 1_048_576.0,
    );

    assert!(peak <= MAX_KEYS, "peak {peak} keys tracked, over max_keys = {MAX_KEYS}");
    // The flood did reach the cap: the figure below is measured at it.
    assert!(
        tracked_after >= MAX_KEYS * 3 / 4,
        "only {tracked_after} keys tracked: the table never filled"
    );
    assert!(
        dbsize <= WARM_UP + FLOOD,
        "Redis holds {dbsize} keys for {} sent",
        WARM_UP + FLOOD
    );
    assert!(
        per_new_key <= BYTES_PER_KEY,
        "{per_new_key:.0} bytes of RSS per key added (RSS {rss_before} -> {rss_after}, keys {tracked_before} -> \
         {tracked_after})"
    );
}
