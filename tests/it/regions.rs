//! Three regions, each a real Redis and a real gateway, with a TCP relay
//! between the other regions and the primary's link that adds latency and
//! can be cut (refuse or hang). One global limit, `600/h` (no noticeable
//! refill during a test), sliced 0.5 (primary) / 0.3 / 0.2.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::redis::Redis;
use crate::support::{client, sample, Gateway, Toml};

const QUOTA: u64 = 600;
/// `[leasing] max`: the most one gateway holds at once.
const MAX_LEASE: u64 = 5;
/// Rebalance windows follow the wall clock: an hour, so a test that
/// expects one transfer per window sees one (see [`fresh_window`]).
const WINDOW_MS: u64 = 3_600_000;

/// Waits, if needed, until at least 30 s of the current rebalance window
/// are left, so a surge does not straddle two windows (and get a transfer
/// in each).
async fn fresh_window() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let left = WINDOW_MS - now % WINDOW_MS;
    if left < 30_000 {
        tokio::time::sleep(Duration::from_millis(left + 50)).await;
    }
}

fn config(redis: &Redis, name: &str, share: f64, primary: Option<SocketAddr>) -> Toml {
    let region = format!(
        "name = \"{name}\"\nshare = {share}\nlink = \"127.0.0.1:0\"\nrebalance_at = 0.8\nrebalance_window_ms = {WINDOW_MS}"
    );
    let toml = Toml::new()
        .gateway("workers = 1\naccess_log = \"off\"")
        .redis(&redis.url(), "timeout_ms = 1000")
        .table("leasing", &format!("min = 1\nmax = {MAX_LEASE}\nmax_block_ms = 20"))
        .table("region", &region);
    let toml = match primary {
        None => toml,
        Some(p) => toml.with(&format!("primary = \"http://{p}\"")),
    };
    let toml = toml
        .respond("api", "/", &["global"])
        .with("on_store_failure = \"deny\"")
        .limit("global", &format!("{QUOTA}/h"))
        .with("by = [\"route\"]");
    match primary {
        None => toml,
        // A region with a primary also has `/marker`, under a limit the
        // primary does not have: its ask goes over the link and is
        // refused, moving nothing (see [`marker`]).
        Some(_) => toml
            .respond("marker", "/marker", &["marker"])
            .with("on_store_failure = \"deny\"")
            .limit("marker", "10/h")
            .with("by = [\"route\"]"),
    }
}

/// What the relay does with a connection.
const PASS: u8 = 0;
const REFUSE: u8 = 1;
const HANG: u8 = 2;

/// A TCP relay to `target` that delays every chunk by `latency`, counts
/// connections, and can be cut.
struct Relay {
    addr: SocketAddr,
    connections: Arc<AtomicU64>,
    mode: Arc<AtomicU8>,
    /// Milliseconds each chunk waits, read as the chunk arrives.
    latency: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(target: SocketAddr, latency: Duration) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicU64::new(0));
        let mode = Arc::new(AtomicU8::new(PASS));
        let latency = Arc::new(AtomicU64::new(latency.as_millis() as u64));
        let (count, m, lat) = (connections.clone(), mode.clone(), latency.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                match m.load(Ordering::SeqCst) {
                    REFUSE => drop(inbound),
                    HANG => {
                        // Holds the connection, answers nothing.
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_secs(60)).await;
                            drop(inbound);
                        });
                    }
                    _ => {
                        let lat = lat.clone();
                        tokio::spawn(async move {
                            let Ok(outbound) = TcpStream::connect(target).await else {
                                return;
                            };
                            let (ri, wi) = inbound.into_split();
                            let (ro, wo) = outbound.into_split();
                            tokio::join!(pipe(ri, wo, lat.clone()), pipe(ro, wi, lat));
                        });
                    }
                }
            }
        });
        Relay {
            addr,
            connections,
            mode,
            latency,
            task,
        }
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    fn set_latency(&self, latency: Duration) {
        self.latency.store(latency.as_millis() as u64, Ordering::SeqCst);
    }

    fn connections(&self) -> u64 {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    latency: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        tokio::time::sleep(Duration::from_millis(latency.load(Ordering::SeqCst))).await;
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

struct World {
    // Gateways before their Redis, so each stops before its store.
    primary: Gateway,
    eu: Gateway,
    ap: Gateway,
    relay: Relay,
    _redis: [Redis; 3],
}

async fn world(latency: Duration) -> World {
    let redis = [Redis::start(), Redis::start(), Redis::start()];
    let primary = Gateway::start_connected(&config(&redis[0], "us-east", 0.5, None));
    let relay = Relay::start(primary.addr("link"), latency).await;
    let eu = Gateway::start_connected(&config(&redis[1], "eu-central", 0.3, Some(relay.addr)));
    let ap = Gateway::start_connected(&config(&redis[2], "ap-south", 0.2, Some(relay.addr)));
    World {
        primary,
        eu,
        ap,
        relay,
        _redis: redis,
    }
}

#[derive(Default, Debug)]
struct Tally {
    ok: u64,
    limited: u64,
    other: u64,
    /// The slowest answer.
    slowest: Duration,
}

/// Sends `n` requests one after another (or until `until`), counting
/// answers.
async fn send(gw: SocketAddr, n: u64, until: Option<Instant>) -> Tally {
    let mut c = client::http1(gw).await;
    let mut t = Tally::default();
    for _ in 0..n {
        if until.is_some_and(|u| Instant::now() > u) {
            break;
        }
        let started = Instant::now();
        let status = client::text(client::send(&mut c, client::get("/")).await).await.0;
        t.slowest = t.slowest.max(started.elapsed());
        match status {
            StatusCode::OK => t.ok += 1,
            StatusCode::TOO_MANY_REQUESTS => t.limited += 1,
            _ => t.other += 1,
        }
    }
    t
}

/// Sends for `secs`, pausing `pause` between requests once refused, so a
/// transfer landing mid-surge is spent.
async fn surge(gw: SocketAddr, secs: f64) -> Tally {
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut total = Tally::default();
    while Instant::now() < until {
        let t = send(gw, 50, Some(until)).await;
        total.ok += t.ok;
        total.limited += t.limited;
        total.other += t.other;
        total.slowest = total.slowest.max(t.slowest);
        if t.limited > 0 {
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
    total
}

async fn metric(gw: &Gateway, name: &str) -> f64 {
    sample(&gw.metrics().await, name)
}

/// Tokens the whole quota refills in `elapsed` (600/h: one per 6 s).
fn refill(elapsed: Duration) -> u64 {
    (QUOTA as f64 * elapsed.as_secs_f64() / 3_600.0).ceil() as u64
}

/// Drains `gw`'s slice of `marker` (3 tokens) and waits until the ask
/// that crossing its threshold signals has been answered: refused by the
/// primary, which has no such limit. The coordinator takes asks one at a
/// time, in the order the request path signalled them, and elects each
/// before the next: once the marker's ask is answered, any ask signalled
/// before it has been taken, and its transfer has had its chance to reach
/// the link.
async fn marker(gw: &Gateway) {
    let refused = "leasegate_region_transfers_total{result=\"refused\"}";
    let before = metric(gw, refused).await;
    let mut c = client::http1(gw.http()).await;
    for _ in 0..4 {
        client::text(client::send(&mut c, client::get("/marker")).await).await;
    }
    // The refusal is counted, then logged: the log line is read from the
    // gateway's stderr a moment later, so both are waited for.
    crate::support::eventually(
        Duration::from_secs(10),
        async || {
            (metric(gw, refused).await > before && gw.log().contains("region: the primary refused the transfer"))
                .then_some(())
        },
        || {
            format!(
                "the marker's ask was never answered (refused and logged):\n{}",
                gw.log()
            )
        },
    )
    .await;
}

/// Waits for the probe of the primary's link that eu and ap make at
/// start (2 relay connections), which sets their `link_up` to 1.
async fn start_probes(w: &World) {
    crate::support::eventually(
        Duration::from_secs(5),
        async || (w.relay.connections() >= 2).then_some(()),
        || "no start probes".into(),
    )
    .await;
    for (gw, region) in [(&w.eu, "eu-central"), (&w.ap, "ap-south")] {
        let name = format!("leasegate_region_link_up{{region=\"{region}\"}}");
        crate::support::eventually(
            Duration::from_secs(5),
            async || (metric(gw, &name).await == 1.0).then_some(()),
            || format!("{region}: link_up not 1 after the start probe"),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_threshold_a_region_stays_autonomous_and_a_surge_gets_a_transfer() {
    fresh_window().await;
    let w = world(Duration::from_millis(20)).await;
    let started = Instant::now();
    // The one probe each non-primary region makes at start, and nothing
    // after it.
    start_probes(&w).await;

    // eu's slice is 180 and it asks at 144 used: 100 requests (plus at most
    // a lease) stay below, and cross no ocean.
    let t = send(w.eu.http(), 100, None).await;
    assert_eq!((t.ok, t.other), (100, 0), "{t:?}");
    // An ask those requests signalled would be taken before the marker's:
    // with the marker's answered, the only link traffic is the start
    // probes and the marker's one exchange.
    marker(&w.eu).await;
    assert_eq!(
        w.relay.connections(),
        3,
        "no link traffic below the threshold (2 start probes, 1 marker)"
    );
    assert_eq!(
        metric(&w.eu, "leasegate_region_transfers_total{result=\"granted\"}").await,
        0.0
    );
    let quiet = w.relay.connections();

    // A surge crosses it: one transfer of one more slice (180 of the
    // primary's 300), credited for the window, spent after the slice.
    let t = surge(w.eu.http(), 3.0).await;
    let eu_admitted = 100 + t.ok;
    assert_eq!(t.other, 0, "{t:?}");
    assert_eq!(
        metric(&w.eu, "leasegate_region_transfers_total{result=\"granted\"}").await,
        1.0,
        "{}",
        w.eu.log()
    );
    assert!(w.relay.connections() > quiet, "the transfer crossed the link");
    let slice = 180;
    assert!(
        eu_admitted > slice + MAX_LEASE,
        "the transfer let eu admit beyond its slice: {eu_admitted}"
    );
    assert!(
        eu_admitted <= 2 * slice + refill(started.elapsed()) + MAX_LEASE,
        "at most its slice and the transfer: {eu_admitted}"
    );
    assert!(w.eu.wait_for_log("region: transfer credited", Duration::from_secs(1)));

    // The bound: every region surges now. The primary gave 180 away, so
    // the world admits no more than the global allowance, plus refill,
    // plus what is in flight (nothing: the one transfer per window is
    // done), plus one lease per region.
    let (p, ap, eu2) = tokio::join!(
        surge(w.primary.http(), 2.0),
        surge(w.ap.http(), 2.0),
        surge(w.eu.http(), 2.0)
    );
    for t in [&p, &ap, &eu2] {
        assert_eq!(t.other, 0, "{t:?}");
    }
    let global = p.ok + ap.ok + eu_admitted + eu2.ok;
    let bound = QUOTA + refill(started.elapsed()) + 3 * MAX_LEASE;
    println!(
        "admitted: us-east {} eu-central {} ap-south {} = {global}; bound {bound}",
        p.ok,
        eu_admitted + eu2.ok,
        ap.ok
    );
    assert!(global <= bound, "global {global} > bound {bound}");
    // The primary kept its slice less the transfer (and refill).
    assert!(p.ok <= 300 - 180 + refill(started.elapsed()) + MAX_LEASE, "{p:?}");
    // And the world did use nearly all of it: slicing does not starve.
    assert!(global + 3 * MAX_LEASE >= QUOTA, "global {global}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_changes_nothing_for_clients() {
    let w = world(Duration::from_millis(20)).await;
    start_probes(&w).await;
    // Warm the connection and the lease path first.
    let warm = send(w.ap.http(), 5, None).await;
    assert_eq!(warm.ok, 5);

    // Hang: the primary's link accepts and never answers.
    w.relay.set(HANG);
    let hung = surge(w.ap.http(), 2.5).await;
    // Refuse: connections close at once.
    w.relay.set(REFUSE);
    let refused = surge(w.ap.http(), 1.0).await;

    let admitted = warm.ok + hung.ok + refused.ok;
    println!(
        "partition: ap-south admitted {admitted} (slice 120); slowest answer {:?} while hung, {:?} while refused; link connections {}",
        hung.slowest,
        refused.slowest,
        w.relay.connections()
    );
    for t in [&hung, &refused] {
        assert_eq!(t.other, 0, "no 5xx during a partition: {t:?}");
        assert!(
            t.slowest < Duration::from_millis(100),
            "no request waits on the link: slowest {:?}",
            t.slowest
        );
    }
    // ap enforces its slice (120) alone: no more, and no less than most of it.
    assert!(admitted <= 120 + MAX_LEASE + 1, "{admitted}");
    assert!(admitted >= 120 - MAX_LEASE, "{admitted}");
    assert!(w.relay.connections() > 2, "the coordinator did try");
    let m = w.ap.metrics().await;
    assert_eq!(sample(&m, "leasegate_region_link_up{region=\"ap-south\"}"), 0.0, "{m}");
    // The transfer is still being retried (until its window ends, an hour
    // here): each failed attempt is a WARN, no transfer is an error yet.
    assert!(w.ap.log().contains("region: transfer failed"), "{}", w.ap.log());
    assert_eq!(sample(&m, "leasegate_region_transfers_total{result=\"granted\"}"), 0.0);

    // Healed: a probe finds the link within a few seconds.
    w.relay.set(PASS);
    crate::support::eventually(
        Duration::from_secs(8),
        async || (metric(&w.ap, "leasegate_region_link_up{region=\"ap-south\"}").await == 1.0).then_some(()),
        || "link_up never came back".into(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_link_still_credits_the_grant_that_landed_once() {
    fresh_window().await;
    let w = world(Duration::from_millis(20)).await;
    let started = Instant::now();
    // Slower than the link's timeout: the first attempts reach the primary
    // (which takes the tokens) but their answers come too late.
    w.relay
        .set_latency(leasegate::region::link::LINK_TIMEOUT + Duration::from_millis(500));
    let t = send(w.eu.http(), 200, None).await;
    assert_eq!(t.other, 0, "{t:?}");
    assert!(t.ok <= 180 + MAX_LEASE, "eu's slice only, so far: {t:?}");
    tokio::time::sleep(leasegate::region::link::LINK_TIMEOUT * 2).await;
    // The link recovers: a retry with the same id gets the recorded grant.
    w.relay.set_latency(Duration::from_millis(20));
    assert!(
        w.eu.wait_for_log("region: transfer credited", Duration::from_secs(20)),
        "{}",
        w.eu.log()
    );
    let m = w.eu.metrics().await;
    assert_eq!(
        sample(&m, "leasegate_region_transfers_total{result=\"granted\"}"),
        1.0,
        "{m}"
    );
    assert_eq!(
        sample(&m, "leasegate_region_transfers_total{result=\"error\"}"),
        0.0,
        "{m}"
    );
    assert!(
        w.eu.log().contains("region: transfer failed"),
        "the first attempts timed out"
    );
    // eu spends the credit ...
    let more = surge(w.eu.http(), 2.0).await;
    assert!(more.ok >= 180 - MAX_LEASE, "the transfer was credited: {more:?}");
    assert!(
        t.ok + more.ok <= 2 * 180 + refill(started.elapsed()) + MAX_LEASE,
        "{t:?} {more:?}"
    );
    // ... and the primary gave it once: 300 - 180 are left of its slice.
    let p = send(w.primary.http(), 300, None).await;
    assert!(p.ok <= 120 + refill(started.elapsed()) + MAX_LEASE, "{p:?}");
    assert!(p.ok + MAX_LEASE >= 120, "{p:?}");
}

/// POSTs a transfer straight to a link; (status, body).
async fn post_transfer(link: SocketAddr, body: &serde_json::Value) -> (StatusCode, serde_json::Value) {
    let mut c = client::http1(link).await;
    let req = http::Request::post("/v1/transfer")
        .header("host", "link")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(body.to_string())))
        .unwrap();
    let (status, _, text) = client::text(client::send(&mut c, req).await).await;
    (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_transfer_moves_nothing_twice_and_the_primary_never_grants_what_it_lacks() {
    let redis = Redis::start();
    let primary = Gateway::start_connected(&config(&redis, "us-east", 0.5, None));
    let link = primary.addr("link");
    let ask = |id: u64, want: u64| {
        serde_json::json!({
            "id": id, "region": "eu-central", "key": "rl:{global:api}",
            "algorithm": "token_bucket", "count": QUOTA, "period_ms": 3_600_000u64,
            "capacity": QUOTA, "want": want, "window_ms": WINDOW_MS,
        })
    };
    let (s, a) = post_transfer(link, &ask(41, 100)).await;
    assert_eq!(s, StatusCode::OK, "{a}");
    assert_eq!(a["granted"], 100);
    // The same id again: the same answer, and nothing more taken.
    let (s, again) = post_transfer(link, &ask(41, 100)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(again, a);
    // The primary's slice is 300: 200 are left, of which it keeps 60 (the
    // fifth of its slice below its own threshold, rebalance_at = 0.8) for
    // its own clients, whatever is asked.
    let (_, b) = post_transfer(link, &ask(42, 300)).await;
    assert_eq!(
        b["granted"], 140,
        "only what is left of the slice above what the primary keeps"
    );
    // The primary grants by its own limits: a request whose quota is not
    // the primary's is refused and touches nothing (run with other
    // parameters, the bucket script would have reset the empty bucket).
    for (field, value) in [
        ("capacity", serde_json::json!(1_000_000)),
        ("count", serde_json::json!(QUOTA * 10)),
        ("period_ms", serde_json::json!(1_000)),
        ("algorithm", serde_json::json!("sliding_window")),
        ("key", serde_json::json!("rl:{other:api}")),
        ("key", serde_json::json!("rl:{rls:edge:k=v}")),
    ] {
        let mut forged = ask(50, 300);
        forged[field] = value.clone();
        let (s, a) = post_transfer(link, &forged).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{field}={value}: {a}");
        assert!(a["error"].is_string(), "{a}");
    }
    // One hash tag, the whole key: nothing may follow it.
    let mut beside = ask(51, 300);
    beside["key"] = "rl:{global:api}:credit".into();
    assert_eq!(post_transfer(link, &beside).await.0, StatusCode::BAD_REQUEST);
    let (_, c) = post_transfer(link, &ask(43, 300)).await;
    assert_eq!(c["granted"], 0, "nothing to spare: nothing granted");
    // And the primary's own clients find what it kept: 60, and no more.
    let t = send(primary.http(), 70, None).await;
    assert!((60..=60 + MAX_LEASE).contains(&t.ok), "{t:?}");

    // What is not a bucket transfer is refused before any store call.
    let mut bad = ask(44, 1);
    bad["key"] = "session:secret".into();
    assert_eq!(post_transfer(link, &bad).await.0, StatusCode::BAD_REQUEST);
}

/// The regional scripts on a real Redis, through the store: credit once per
/// transfer, spent the batch that expires first first, gone with its
/// window; one claim per key and window; the sliding-window transfer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credit_is_once_per_transfer_spent_soonest_first_and_expires_with_its_window() {
    use leasegate::quota::{Algorithm, Rate, Spec};
    use leasegate::store::redis::{RedisStore, Target};
    use leasegate::store::RegionStore;

    let redis = Redis::start();
    let store = RedisStore::start(&Target::Node(redis.url())).unwrap();
    let key = "rl:{global:api}";
    // The store dials in the background: wait for its first answer.
    crate::support::eventually(
        Duration::from_secs(5),
        async || store.claim("rl:{warm:up}", 0, 1).await.ok(),
        || "Redis never answered".into(),
    )
    .await;

    assert_eq!(store.credit(key, 1, 10, 60_000).await.unwrap(), 10);
    assert_eq!(store.credit(key, 1, 10, 60_000).await.unwrap(), 0, "credited once");
    // Transfer 2 ends first (2 s: room for a loaded box between the two
    // calls), so it is spent first.
    let ttl = Duration::from_millis(2_000);
    let before = Instant::now();
    assert_eq!(store.credit(key, 2, 5, ttl.as_millis() as u64).await.unwrap(), 5);
    let credited = Instant::now();
    // 3 of transfer 2's 5; what is left (2 + 10) is said too.
    let spent = store.spend_credit(key, 3, 60_000).await.unwrap();
    assert_eq!((spent.spent, spent.left, spent.short), (3, 12, 0));
    assert!(before.elapsed() < ttl, "too slow to tell: {:?}", before.elapsed());
    // Redis set the expiry before `credited`: wait past it by the clock,
    // not by a guess of how long the calls take.
    tokio::time::sleep_until((credited + ttl + Duration::from_millis(100)).into()).await;
    // Its last 2 tokens went with its window; transfer 1's 10 remain.
    let spent = store.spend_credit(key, 100, 60_000).await.unwrap();
    assert_eq!((spent.spent, spent.left), (10, 0));
    // What credit could not give is the region's shortfall, counted for a
    // period.
    assert_eq!(spent.short, 90);
    let spent = store.spend_credit(key, 1, 60_000).await.unwrap();
    assert_eq!((spent.spent, spent.short), (0, 91));
    // A claim marks the key's transfer pending; a credit (even of no
    // tokens: a refusal) settles it.
    assert!(!store.spend_credit(key, 0, 60_000).await.unwrap().pending);

    assert!(store.claim(key, 5, 60_000).await.unwrap(), "the first claim wins");
    assert!(
        store.spend_credit(key, 0, 60_000).await.unwrap().pending,
        "claimed: pending"
    );
    store.credit(key, 99, 0, 1_000).await.unwrap();
    assert!(!store.spend_credit(key, 0, 60_000).await.unwrap().pending, "settled");
    assert!(!store.claim(key, 5, 60_000).await.unwrap(), "the second loses");
    assert!(
        store.claim(key, 6, 60_000).await.unwrap(),
        "the next window is claimed anew"
    );
    // A transfer given up releases its claim: the key is elected again.
    store.unclaim(key, 5).await.unwrap();
    assert!(store.claim(key, 5, 60_000).await.unwrap(), "claimed again");

    let window = Spec::new(
        Algorithm::SlidingWindow,
        Rate {
            count: 100,
            period: Duration::from_secs(3_600),
        },
        100,
    );
    let k = "rl:{sw:api}";
    assert_eq!(store.transfer_out(k, &window, 7, 30, 0, 60_000).await.unwrap(), 30);
    assert_eq!(store.transfer_out(k, &window, 7, 30, 0, 60_000).await.unwrap(), 30);
    assert_eq!(store.transfer_out(k, &window, 8, 100, 0, 60_000).await.unwrap(), 70);
    assert_eq!(store.transfer_out(k, &window, 9, 1, 0, 60_000).await.unwrap(), 0);
    // The primary keeps `keep` of its own: a transfer takes only what is
    // above it (the script reads what the bucket holds first).
    let kept = "rl:{sw:kept}";
    assert_eq!(
        store.transfer_out(kept, &window, 10, 100, 20, 60_000).await.unwrap(),
        80
    );
    assert_eq!(store.transfer_out(kept, &window, 11, 100, 20, 60_000).await.unwrap(), 0);

    // The fixed window (the RLS rules' algorithm) transfers alike.
    let fixed = Spec::new(
        Algorithm::FixedWindow,
        Rate {
            count: 50,
            period: Duration::from_secs(3_600),
        },
        50,
    );
    let k = "rl:{fw:api}";
    assert_eq!(store.transfer_out(k, &fixed, 7, 20, 0, 60_000).await.unwrap(), 20);
    assert_eq!(store.transfer_out(k, &fixed, 7, 20, 0, 60_000).await.unwrap(), 20);
    assert_eq!(store.transfer_out(k, &fixed, 8, 100, 0, 60_000).await.unwrap(), 30);
    assert_eq!(store.transfer_out(k, &fixed, 9, 1, 0, 60_000).await.unwrap(), 0);
    let kept = "rl:{fw:kept}";
    assert_eq!(store.transfer_out(kept, &fixed, 10, 40, 20, 60_000).await.unwrap(), 30);
}

/// In process: what a region enforces for a key is the sub-bucket's share,
/// then the slice, as `leasegate explain` shows it; and a reload keeps the
/// slice the gateway started with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slice_comes_last_and_a_reload_keeps_it() {
    use leasegate::config::parse;
    use leasegate::explain::{explain, Probe};
    use std::path::Path;

    let text = |share: f64| {
        format!(
            r#"
[listeners]
http = "127.0.0.1:0"

[region]
name = "eu-central"
share = {share}
link = "127.0.0.1:0"
primary = "http://127.0.0.1:1"

[[routes]]
name = "api"
path_prefix = "/"
response = {{ status = 200, body = "ok" }}
limits = ["global", "plain"]

[[limits]]
name = "global"
rate = "1000/min"
burst = 1500
shards = 4
shard_by = "ip"

[[limits]]
name = "plain"
rate = "10/s"
"#
        )
    };
    let path = Path::new("gateway.toml");
    let config = parse(path, &text(0.3)).unwrap();
    let probe = Probe::parse("GET", "/", &[], Some("203.0.113.7")).unwrap();
    let e = explain(&config, &probe, 0);
    // A quarter of the quota for the sub-bucket, then 0.3 of it, rounded down.
    assert_eq!((e.limits[0].rate.as_str(), e.limits[0].capacity), ("75/min", 112));
    assert_eq!((e.limits[1].rate.as_str(), e.limits[1].capacity), ("3/s", 3));

    let runtime = leasegate::runtime::Runtime::new(
        config,
        std::sync::Arc::new(leasegate::telemetry::metrics::Metrics::new()),
        std::sync::Arc::new(leasegate::store::memory::MemoryStore::new(1_000)),
    );
    runtime.apply(parse(path, &text(0.6)).unwrap()).await;
    let applied = runtime.config();
    assert!(
        applied.limits.iter().all(|l| l.share().ppm() == 300_000),
        "a reload keeps the slice of the start"
    );
    let e = explain(&applied, &probe, 0);
    assert_eq!(e.limits[1].capacity, 3);
}

/// Sends `rps` requests a second, paced, for `secs`, on one keep-alive
/// connection (a request that takes long delays the next; none is
/// skipped).
async fn paced(gw: SocketAddr, rps: f64, secs: f64) -> Tally {
    let mut c = client::http1(gw).await;
    let mut t = Tally::default();
    let start = tokio::time::Instant::now();
    let n = (rps * secs) as u64;
    for i in 0..n {
        tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rps)).await;
        match client::text(client::send(&mut c, client::get("/")).await).await.0 {
            StatusCode::OK => t.ok += 1,
            StatusCode::TOO_MANY_REQUESTS => t.limited += 1,
            _ => t.other += 1,
        }
    }
    t
}

/// The tokens eu's log says were credited (`granted=N` of each
/// "region: transfer credited" line).
fn credited(gw: &Gateway) -> u64 {
    gw.log()
        .lines()
        .filter(|l| l.contains("region: transfer credited"))
        .filter_map(|l| {
            l.split("granted=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// `600/10s` (the issue's limit), sliced by `share`, for the two-region
/// tests: one gateway per region, `rebalance_window_ms = 10000`.
fn per_ten_seconds(redis: &Redis, name: &str, share: f64, primary: Option<SocketAddr>) -> Toml {
    let region = format!(
        "name = \"{name}\"\nshare = {share}\nlink = \"127.0.0.1:0\"\nrebalance_at = 0.8\nrebalance_window_ms = 10000"
    );
    let t = Toml::new()
        .gateway("workers = 1\naccess_log = \"off\"")
        .redis(&redis.url(), "timeout_ms = 1000")
        .table("leasing", &format!("min = 1\nmax = {MAX_LEASE}"))
        .table("region", &region);
    let t = match primary {
        None => t,
        Some(p) => t.with(&format!("primary = \"http://{p}\"")),
    };
    t.respond("api", "/", &["global"])
        .limit("global", "600/10s")
        .with("by = [\"route\"]")
}

/// The issue's measurement: `600/10s`, eu-central (0.3: 180 per 10 s) at
/// three times its slice's rate, the primary at half of its own, default
/// blocks after a refusal. Every token granted to eu is admitted there:
/// over 10 s eu admits its slice (the burst and 10 s of refill) plus what
/// was credited, within a lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_surging_region_spends_every_token_it_was_granted() {
    let redis = [Redis::start(), Redis::start()];
    let primary = Gateway::start_connected(&per_ten_seconds(&redis[0], "us-east", 0.5, None));
    let eu = Gateway::start_connected(&per_ten_seconds(
        &redis[1],
        "eu-central",
        0.3,
        Some(primary.addr("link")),
    ));
    let started = Instant::now();
    let (eu_t, p_t) = tokio::join!(paced(eu.http(), 54.0, 10.0), paced(primary.http(), 15.0, 10.0));
    let elapsed = started.elapsed();
    let granted = credited(&eu);
    // A token bucket of 180 refilled at 18/s.
    let slice = 180 + (18.0 * elapsed.as_secs_f64()) as u64;
    println!(
        "eu admitted {} of {} (slice {slice}, credited {granted}); primary {} of {}",
        eu_t.ok,
        eu_t.ok + eu_t.limited,
        p_t.ok,
        p_t.ok + p_t.limited
    );
    assert!(granted > 0, "no transfer:\n{}", eu.log());
    assert!(
        eu_t.ok + MAX_LEASE >= (slice + granted).min(540),
        "eu admitted {} with {granted} credited on a slice of {slice}:\n{}",
        eu_t.ok,
        eu.log()
    );
    assert!(
        eu_t.ok <= slice + granted + MAX_LEASE,
        "eu admitted {} > {slice} + {granted}",
        eu_t.ok
    );
    assert_eq!(p_t.limited, 0, "the primary, below its slice, refused its own: {p_t:?}");
}

/// Issue 37, the surge-then-primary-surges case: eu-central (0.3 of
/// `600/10s`, a token bucket of 180 refilled at 18/s) runs at three times
/// its slice's rate and is granted a transfer; right after the primary
/// grants (its answer still crossing a 75 ms link), the primary's own
/// traffic rises to four clients flat out and spends its slice. What was
/// granted was the primary's to give (it kept what its threshold keeps,
/// before the grant), so eu still admits its slice plus every token
/// credited, within a lease, and the primary no more than its slice less
/// the transfer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_surge_then_primary_surges_case_admits_the_slice_plus_the_granted_credit() {
    let redis = [Redis::start(), Redis::start()];
    let primary = Gateway::start_connected(&per_ten_seconds(&redis[0], "us-east", 0.5, None));
    let relay = Relay::start(primary.addr("link"), Duration::from_millis(75)).await;
    let eu = Gateway::start_connected(&per_ten_seconds(&redis[1], "eu-central", 0.3, Some(relay.addr)));
    let started = Instant::now();
    let secs = 10.0;
    let primary_side = async {
        // A third of its slice's rate until it has granted, then flat out.
        let mut quiet = Tally::default();
        while !primary.log().contains("region transfer answered") && started.elapsed().as_secs_f64() < secs - 1.0 {
            let t = paced(primary.http(), 10.0, 0.2).await;
            quiet.ok += t.ok;
            quiet.limited += t.limited;
        }
        let rest = secs - started.elapsed().as_secs_f64();
        let g = primary.http();
        let (a, b, c, d) = tokio::join!(surge(g, rest), surge(g, rest), surge(g, rest), surge(g, rest));
        let mut surged = Tally::default();
        for t in [a, b, c, d] {
            surged.ok += t.ok;
            surged.limited += t.limited;
            surged.other += t.other;
        }
        (quiet, surged)
    };
    let (eu_t, (quiet, surged)) = tokio::join!(paced(eu.http(), 54.0, secs), primary_side);
    let elapsed = started.elapsed().as_secs_f64();
    let granted = credited(&eu);
    let slice = 180 + (18.0 * elapsed) as u64;
    println!(
        "eu admitted {} of {} (slice {slice}, credited {granted}); primary {} quiet, then {} of {} surging",
        eu_t.ok,
        eu_t.ok + eu_t.limited,
        quiet.ok,
        surged.ok,
        surged.ok + surged.limited
    );
    assert!(granted > 0, "no transfer:\n{}", eu.log());
    assert!(surged.limited > 0, "the primary did spend its slice: {surged:?}");
    assert_eq!((eu_t.other, surged.other), (0, 0), "{eu_t:?} {surged:?}");
    assert!(
        eu_t.ok + MAX_LEASE >= (slice + granted).min(eu_t.ok + eu_t.limited),
        "eu admitted {} with {granted} credited on a slice of {slice}:\n{}",
        eu_t.ok,
        eu.log()
    );
    assert!(
        eu_t.ok <= slice + granted + MAX_LEASE,
        "eu admitted {} > {slice} + {granted}",
        eu_t.ok
    );
    // The primary's slice (300, refilled at 30/s) less what it gave.
    let own = (300 + (30.0 * elapsed) as u64).saturating_sub(granted);
    assert!(
        quiet.ok + surged.ok <= own + MAX_LEASE,
        "the primary admitted {} > {own}: the transfer came back to it",
        quiet.ok + surged.ok
    );
}
