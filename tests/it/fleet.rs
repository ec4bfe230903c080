//! A fleet of real gateways sharing one real Redis (or a Redis Cluster):
//! one limit enforced together within the lease bound, few Redis calls per
//! request, keys spread over a cluster, sub-sharded hot keys.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;

use crate::support::redis::{Cluster, Redis};
use crate::support::{self, client, Gateway, Toml};

/// One route under one limit, `fleet` (`limit`: its lines), failing
/// closed; `store`: the `[store]` lines that name Redis; `leasing`: those
/// of `[leasing]`. Each client address is an identity of its own.
fn config(store: &str, leasing: &str, limit: &str) -> Toml {
    // These tests are about sharing quota, not deadlines: a generous
    // deadline keeps a busy CI machine from turning slow calls into store
    // failures, and a store failure shows as a 503 (fail closed), never as
    // a silent admission.
    Toml::new()
        .gateway("workers = 1")
        .table("store", &format!("backend = \"redis\"\n{store}\ntimeout_ms = 1000"))
        .table("leasing", leasing)
        .table("identity", "ipv4_prefix = 32")
        .respond("api", "/", &["fleet"])
        .with("on_store_failure = \"deny\"")
        .raw("[[limits]]\nname = \"fleet\"")
        .with(limit)
}

async fn status(c: &mut client::Sender1) -> StatusCode {
    client::text(client::send(c, client::get("/")).await).await.0
}

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    limited: AtomicU64,
    other: AtomicU64,
}

/// Drives every gateway with `per_gateway` keep-alive connections, as fast
/// as they answer, for `secs`. Returns the tally and the time it took.
async fn drive(gateways: &[SocketAddr], per_gateway: usize, secs: f64) -> (Arc<Tally>, Duration) {
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for &gw in gateways {
        for _ in 0..per_gateway {
            let tally = tally.clone();
            tasks.push(tokio::spawn(async move {
                let mut c = client::http1(gw).await;
                while Instant::now() < until {
                    let counter = match status(&mut c).await {
                        StatusCode::OK => &tally.ok,
                        StatusCode::TOO_MANY_REQUESTS => &tally.limited,
                        _ => &tally.other,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    (tally, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_enforce_one_limit_within_the_lease_bound() {
    let redis = Redis::start();
    let text = config(
        &format!("url = \"{}\"", redis.url()),
        "min = 5\nmax = 20\nlookahead_ms = 250\nttl_ms = 1000",
        "rate = \"100/s\"\nburst = 100\nby = [\"route\"]",
    );
    let fleet: Vec<Gateway> = (0..3).map(|_| Gateway::start_connected(&text)).collect();
    let addrs: Vec<SocketAddr> = fleet.iter().map(Gateway::http).collect();
    let (tally, elapsed) = drive(&addrs, 2, 3.0).await;
    let ok = tally.ok.load(Ordering::Relaxed);
    let limited = tally.limited.load(Ordering::Relaxed);
    assert_eq!(tally.other.load(Ordering::Relaxed), 0);
    // The bucket starts full (100) and refills at 100/s for the time driven.
    // The largest lease is 10 (max_fraction 0.1 of the capacity, below
    // leasing.max = 20).
    let allowance = 100.0 + 100.0 * elapsed.as_secs_f64();
    let bound = allowance + 3.0 * 10.0;
    println!("admitted {ok}, limited {limited}, allowance {allowance:.0}, bound {bound:.0}, in {elapsed:?}");
    assert!(
        limited > 2 * ok,
        "drive at several times the limit: {ok} ok, {limited} limited"
    );
    assert!(
        ok as f64 >= 0.9 * allowance,
        "admitted {ok} < 0.9 × allowance {allowance:.0}"
    );
    assert!(
        ok as f64 <= bound,
        "admitted {ok} > allowance + 3 × max lease = {bound:.0}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leasing_keeps_redis_calls_per_request_low() {
    let redis = Redis::start();
    let text = config(
        &format!("url = \"{}\"", redis.url()),
        "min = 5\nmax = 500\nlookahead_ms = 250\nttl_ms = 1000",
        "rate = \"1000000/s\"\nby = [\"route\"]",
    );
    let fleet: Vec<Gateway> = (0..3).map(|_| Gateway::start_connected(&text)).collect();
    let addrs: Vec<SocketAddr> = fleet.iter().map(Gateway::http).collect();
    let before = redis.script_calls();
    let (tally, _) = drive(&addrs, 2, 2.0).await;
    let requests = tally.ok.load(Ordering::Relaxed);
    assert_eq!(
        tally.limited.load(Ordering::Relaxed) + tally.other.load(Ordering::Relaxed),
        0
    );
    let calls = redis.script_calls() - before;
    let per_request = calls as f64 / requests as f64;
    println!("{requests} requests, {calls} Redis script calls: {per_request:.4} per request");
    // Each instance reports the lease sizes it was granted.
    let m = fleet[0].metrics().await;
    assert!(support::sample(&m, "leasegate_lease_tokens_count ") >= 1.0, "{m}");
    assert!(
        support::sample(&m, r#"leasegate_store_calls_total{op="acquire",result="ok"} "#) >= 1.0,
        "{m}"
    );
    assert!(requests > 1_000, "too few requests to judge: {requests}");
    assert!(per_request <= 0.05, "{calls} calls for {requests} requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_spreads_keys_over_its_masters_and_each_limit_is_exact() {
    let cluster = Cluster::start();
    let text = config(
        &format!("cluster = {}", cluster.seeds_toml()),
        "min = 1\nmax = 10",
        "rate = \"5/h\"",
    );
    let gw = Gateway::start_connected(&text);
    // 40 clients (identity = their /32 subnet), 7 requests each: 5 admitted.
    let mut tasks = Vec::new();
    for i in 0..40 {
        let addr = gw.http();
        tasks.push(tokio::spawn(async move {
            let mut c = client::http1_from(&format!("127.0.{}.{}", i / 200, 10 + i % 200), addr).await;
            let mut seen = Vec::new();
            for _ in 0..7 {
                seen.push(status(&mut c).await.as_u16());
            }
            seen
        }));
    }
    for t in tasks {
        let seen = t.await.unwrap();
        // On a busy host a master the cluster client has not connected to
        // yet fails its first call (a `store_error`, nothing taken): the
        // fail-closed route answers 503. After that, the limit is exact.
        let settled: Vec<u16> = seen.iter().copied().skip_while(|&s| s == 503).collect();
        assert!(settled.len() >= 6, "{seen:?}");
        assert_eq!(settled[..5], [200; 5], "each client's limit is exact: {seen:?}");
        assert!(
            settled[5..].iter().all(|&s| s == 429),
            "each client's limit is exact: {seen:?}"
        );
    }
    let counts = cluster.key_counts();
    println!("keys per master: {counts:?}");
    assert_eq!(counts.iter().sum::<u64>(), 40);
    assert!(
        counts.iter().all(|&n| n >= 3),
        "keys spread over every master: {counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_limit_splits_one_key_into_sub_buckets() {
    let cluster = Cluster::start();
    let text = config(
        &format!("cluster = {}", cluster.seeds_toml()),
        "min = 1\nmax = 10",
        "rate = \"40/h\"\nby = [\"route\"]\nshards = 4",
    );
    let gw = Gateway::start_connected(&text);
    // 32 client addresses, each sending until refused twice.
    let mut admitted = 0;
    for i in 0..32 {
        let mut c = client::http1_from(&format!("127.0.3.{}", 10 + i), gw.http()).await;
        for _ in 0..30 {
            if status(&mut c).await == StatusCode::OK {
                admitted += 1;
            }
        }
    }
    // One sub-bucket per key: rl:{fleet:api:sNN}, 10 tokens each.
    let mut sub_buckets = Vec::new();
    for node in &cluster.nodes {
        for k in node.cli(&["KEYS", "rl:*"]).lines().filter(|l| !l.is_empty()) {
            sub_buckets.push(k.to_string());
        }
    }
    sub_buckets.sort();
    println!("admitted {admitted} through {sub_buckets:?}");
    assert!(sub_buckets
        .iter()
        .all(|k| k.starts_with("rl:{fleet:api:s0") && k.ends_with('}')));
    // Each sub-bucket a client reached gave exactly its share: the limit
    // holds exactly; clients that hash together share one quarter.
    assert_eq!(admitted, 10 * sub_buckets.len() as u64);
    assert!(
        sub_buckets.len() >= 3,
        "32 addresses reach most of 4 sub-buckets: {sub_buckets:?}"
    );
    let masters_used = cluster.key_counts().iter().filter(|&&n| n > 0).count();
    assert!(masters_used >= 2, "sub-buckets live on different slots");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_gives_unspent_leased_tokens_back_to_redis() {
    let redis = Redis::start();
    // Leases of 20 tokens out of a bucket of 100 per hour.
    let text = config(
        &format!("url = \"{}\"", redis.url()),
        "min = 20\nmax = 20\nmax_fraction = 1.0",
        "rate = \"100/h\"\nby = [\"route\"]",
    );
    let mut gw = Gateway::start_connected(&text);
    let mut c = client::http1(gw.http()).await;
    assert_eq!(status(&mut c).await, StatusCode::OK);
    let tokens = |redis: &Redis| -> u64 {
        let units: u64 = redis.cli(&["HGET", "rl:{fleet:api}", "tokens"]).trim().parse().unwrap();
        units / 3_600_000 // the level is kept in tokens × period_ms
    };
    assert_eq!(tokens(&redis), 80, "one lease of 20 taken");
    drop(c);
    gw.signal("TERM");
    let exit = gw.wait_exit(Duration::from_secs(15)).expect("the gateway exits");
    assert!(exit.success());
    assert_eq!(
        tokens(&redis),
        99,
        "19 unspent tokens went back: only the one request used one"
    );
    assert!(gw.log().contains("released_tokens=19"), "{}", gw.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_does_not_multiply_the_burst() {
    let mut redis = Redis::start();
    // Fail open, with no `fleet_size`: each instance's fallback may go up
    // to the whole quota, but starts with a lease's worth, not the burst.
    let text = config(
        &format!("url = \"{}\"", redis.url()),
        "min = 5\nmax = 20",
        "rate = \"10/s\"\nburst = 100\nby = [\"route\"]",
    )
    .replace("timeout_ms = 1000", "timeout_ms = 200")
    .replace("on_store_failure = \"deny\"", "on_store_failure = \"allow\"");
    let fleet: Vec<Gateway> = (0..2).map(|_| Gateway::start_connected(&text)).collect();
    let addrs: Vec<SocketAddr> = fleet.iter().map(Gateway::http).collect();
    // Traffic before the outage gives each instance a recent rate.
    let (before, _) = drive(&addrs, 2, 2.0).await;
    assert!(before.ok.load(Ordering::Relaxed) > 0);
    redis.kill();
    let (tally, elapsed) = drive(&addrs, 2, 3.0).await;
    let ok = tally.ok.load(Ordering::Relaxed);
    assert_eq!(tally.other.load(Ordering::Relaxed), 0, "fail open: no 503");
    // The whole fleet: at most the burst plus the refill of the time driven.
    let bound = 100.0 + 10.0 * elapsed.as_secs_f64();
    println!("admitted {ok} in {elapsed:?} with the store down, bound {bound:.0}");
    assert!(ok > 0, "a fail-open route admits while the store is away");
    assert!(ok as f64 <= bound, "admitted {ok} > burst + refill = {bound:.0}");
    let metrics = fleet[0].metrics().await;
    assert!(
        support::sample(&metrics, "rate_limit_bypassed_total{reason=\"store_circuit_open\"} ") > 0.0,
        "{metrics}"
    );
}

/// Waits until every gateway's `/config` counts `n` live instances by
/// their heartbeats (bounded: a few heartbeat periods).
async fn until_fleet_counts(fleet: &[Gateway], n: u64) {
    for gw in fleet {
        crate::support::eventually(
            Duration::from_secs(15),
            || async move {
                let config: serde_json::Value = serde_json::from_str(&gw.admin_get("/config").await).unwrap();
                (config["fleet"]["live"] == n && config["fleet"]["divisor"] == n).then_some(())
            },
            || format!("the fleet never counted {n}:\n{}", gw.log()),
        )
        .await;
    }
}

/// With no `fleet_size`, the fleet counts itself: three instances on one
/// Redis see each other's heartbeats, and when Redis dies each one's
/// fallback gets a third of the quota. Before the outage the key is
/// young and was drained fast, so each instance's recent admitted rate
/// alone would let it take the whole quota (three times the limit for
/// the fleet); divided by the live count, the fleet stays within twice the
/// rate plus the burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_that_falls_back_together_divides_the_quota_by_its_live_count() {
    let mut redis = Redis::start();
    let text = config(
        &format!("url = \"{}\"", redis.url()),
        "min = 1\nmax = 5",
        "rate = \"10/s\"\nburst = 10\nby = [\"route\"]",
    )
    .replace("timeout_ms = 1000", "timeout_ms = 200")
    .replace("on_store_failure = \"deny\"", "on_store_failure = \"allow\"");
    let fleet: Vec<Gateway> = (0..3).map(|_| Gateway::start_connected(&text)).collect();
    let addrs: Vec<SocketAddr> = fleet.iter().map(Gateway::http).collect();
    until_fleet_counts(&fleet, 3).await;
    let page = fleet[0].admin_get("/").await;
    assert!(page.contains("3 instance(s) live by their heartbeats"), "{page}");
    let (before, _) = drive(&addrs, 1, 2.0).await;
    assert!(before.ok.load(Ordering::Relaxed) > 0);
    redis.kill();
    let (tally, elapsed) = drive(&addrs, 1, 4.0).await;
    let ok = tally.ok.load(Ordering::Relaxed);
    assert_eq!(tally.other.load(Ordering::Relaxed), 0, "fail open: no 503");
    let bound = 2.0 * 10.0 * elapsed.as_secs_f64() + 10.0;
    println!("admitted {ok} in {elapsed:?} with the store down, bound {bound:.0}");
    assert!(ok > 0, "a fail-open route admits while the store is away");
    assert!(
        ok as f64 <= bound,
        "admitted {ok} > 2 × rate × time + burst = {bound:.0}"
    );
    // The count the fallback used stays the last one the store gave.
    let config: serde_json::Value = serde_json::from_str(&fleet[1].admin_get("/config").await).unwrap();
    assert_eq!(config["fleet"]["live"], 3, "{}", config["fleet"]);
}

/// An instance that shuts down leaves the count at once (not when its
/// heartbeat would have expired); the memory store's fleet is one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_stops_leaves_the_fleets_count() {
    let redis = Redis::start();
    let text = config(&format!("url = \"{}\"", redis.url()), "min = 1", "rate = \"10/s\"");
    let mut fleet: Vec<Gateway> = (0..2).map(|_| Gateway::start_connected(&text)).collect();
    until_fleet_counts(&fleet, 2).await;
    let mut gone = fleet.pop().unwrap();
    assert!(gone.stop(Duration::from_secs(10)).success());
    // Counted again at the next heartbeat, within its 2 s period; the
    // stopped one's heartbeat would have lived 6 s.
    let started = Instant::now();
    until_fleet_counts(&fleet, 1).await;
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    assert_eq!(redis.cli(&["ZCARD", "lg:fleet"]).trim(), "1");
    let memory = Gateway::start(&Toml::new().respond("api", "/", &[]));
    until_fleet_counts(std::slice::from_ref(&memory), 1).await;
}
