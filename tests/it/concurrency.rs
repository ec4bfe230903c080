//! `algorithm = "concurrency"`: requests in flight, held from admission to
//! the end of the response body, shared by a fleet through Redis and freed
//! by the store when an instance dies. Real binaries, a real Redis, and an
//! upstream that sends its head at once and its body later.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::redis::Redis;
use crate::support::{check, client, Gateway, Toml};

/// An upstream that answers each request's head at once and its body
/// (`done`) after `body_ms`, chunked: a response in flight for that long.
async fn dripping(body_ms: u64) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut got = Vec::new();
                loop {
                    let Ok(n) = s.read(&mut buf).await else { return };
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                    if got.windows(4).any(|w| w == b"\r\n\r\n") {
                        got.clear();
                        let head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
                        if s.write_all(head).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(body_ms)).await;
                        if s.write_all(b"4\r\ndone\r\n0\r\n\r\n").await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

fn toml(store: &str, upstream: SocketAddr, limit: &str) -> Toml {
    Toml::new()
        .gateway("workers = 1\naccess_log = \"off\"")
        .raw(store)
        .upstream("llm", &format!("http://{upstream}"))
        .forward("api", "/", "llm")
        .with("limits = [\"gpu\"]")
        .raw(&format!(
            "[[limits]]\nname = \"gpu\"\nalgorithm = \"concurrency\"\nby = [\"route\"]\n{limit}"
        ))
}

fn redis_store(redis: &Redis) -> String {
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 1000\n[leasing]\nttl_ms = 1000\n",
        redis.url()
    )
}

/// One request's status and headers, its body left in flight.
async fn head(addr: SocketAddr) -> (u16, http::HeaderMap, Option<hyper::body::Incoming>) {
    let mut c = client::http1(addr).await;
    let resp = client::send(&mut c, client::get("/")).await;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    // The connection's driver runs on its own task: the body can be read
    // after this returns.
    (status, headers, Some(resp.into_body()))
}

async fn heads(addrs: &[SocketAddr]) -> Vec<(u16, http::HeaderMap, Option<hyper::body::Incoming>)> {
    let tasks: Vec<_> = addrs.iter().map(|&a| tokio::spawn(head(a))).collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

fn statuses(answers: &[(u16, http::HeaderMap, Option<hyper::body::Incoming>)]) -> Vec<u16> {
    let mut s: Vec<u16> = answers.iter().map(|a| a.0).collect();
    s.sort();
    s
}

/// Asks `addr` until it admits, for at most `within`: how long it took.
async fn admitted_within(addr: SocketAddr, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < within {
        let (status, _, body) = head(addr).await;
        if status == 200 {
            drop(body);
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_run_exactly_max_until_the_bodies_end() {
    let redis = Redis::start();
    // Long enough that every head arrives while the first bodies are in
    // flight, even on a loaded machine.
    let up = dripping(3_000).await;
    let config = toml(&redis_store(&redis), up, "max = 3");
    let (a, b) = (Gateway::start_connected(&config), Gateway::start_connected(&config));
    let six = [a.http(), b.http(), a.http(), b.http(), a.http(), b.http()];
    let mut answers = heads(&six).await;
    assert_eq!(statuses(&answers), [200, 200, 200, 429, 429, 429]);
    for (status, headers, _) in &answers {
        if *status == 429 {
            assert_eq!(headers["retry-after"], "1", "{headers:?}");
            assert_eq!(headers["ratelimit-policy"], "\"gpu\";q=3;w=1", "{headers:?}");
        }
    }
    // The three admitted have their heads, not their bodies: still in flight.
    for addr in [a.http(), b.http()] {
        assert_eq!(head(addr).await.0, 429, "a slot is held until the body ends");
    }
    // The bodies end: their slots come back, to either instance.
    for (_, _, body) in answers.iter_mut() {
        if let Some(body) = body.take() {
            let _ = body.collect().await;
        }
    }
    for addr in [a.http(), b.http()] {
        let took = admitted_within(addr, Duration::from_secs(3)).await;
        assert!(took.is_some(), "no slot came back after the bodies ended:\n{}", a.log());
    }
    // Counted per instance in the store, never a bare counter.
    let keys = redis.cli(&["KEYS", "*:slots"]);
    let key = keys.lines().next().expect("a slots hash");
    let fields = redis.cli(&["HGETALL", key]);
    let counts: Vec<&str> = fields.lines().skip(1).step_by(2).collect();
    assert!(!counts.is_empty() && counts.iter().all(|c| c.contains(':')), "{fields}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instances_slots_free_within_the_lease_ttl() {
    let redis = Redis::start();
    let up = dripping(30_000).await;
    let config = toml(&redis_store(&redis), up, "max = 2");
    let mut a = Gateway::start_connected(&config);
    let b = Gateway::start_connected(&config);
    let held = heads(&[a.http(), a.http()]).await;
    assert_eq!(statuses(&held), [200, 200]);
    assert_eq!(head(b.http()).await.0, 429, "both slots are a's");
    a.signal("KILL");
    let killed = Instant::now();
    a.wait_exit(Duration::from_secs(5));
    let took = admitted_within(b.http(), Duration::from_secs(5)).await;
    let took = took.map(|_| killed.elapsed());
    // [leasing] ttl_ms = 1000, plus 2 s.
    assert!(
        took.is_some_and(|t| t <= Duration::from_millis(3_000)),
        "freed after {took:?}:\n{}",
        b.log()
    );
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_memory_store_a_queue_waits_for_a_slot_in_order() {
    let up = dripping(300).await;
    let config = toml("", up, "max = 1\nqueue_ms = 3000");
    let gw = Gateway::start(&config);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..3 {
        let addr = gw.http();
        tasks.push(tokio::spawn(async move {
            let (status, _, body) = head(addr).await;
            if let Some(body) = body {
                let _ = body.collect().await;
            }
            (i, status, start.elapsed())
        }));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    assert!(answers.iter().all(|a| a.1 == 200), "{answers:?}");
    answers.sort_by_key(|a| a.2);
    assert_eq!(
        answers.iter().map(|a| a.0).collect::<Vec<_>>(),
        [0, 1, 2],
        "{answers:?}"
    );
    // One at a time: each body takes 300 ms.
    assert!(answers[2].2 >= Duration::from_millis(850), "{answers:?}");
    // Without a queue, the second is refused while the first runs.
    let gw = Gateway::start(&toml("", up, "max = 1"));
    let both = heads(&[gw.http(), gw.http()]).await;
    assert_eq!(statuses(&both), [200, 429]);
}

#[test]
fn check_names_what_a_concurrency_limit_cannot_take() {
    let base = "[listeners]\nhttp = \"127.0.0.1:0\"\n[[limits]]\nname = \"gpu\"\nalgorithm = \"concurrency\"\n";
    let (code, _, err, _dir) = check(&format!("{base}rate = \"10/s\"\n"));
    assert_ne!(code, 0);
    assert!(err.contains("limits[0].rate") && err.contains("give max = N"), "{err}");
    let (code, _, err, _dir) = check(base);
    assert_ne!(code, 0);
    assert!(err.contains("limits[0].max") && err.contains("missing max"), "{err}");
    let (code, _, err, _dir) = check(&format!("{base}max = 4\nburst = 2\nshards = 4\n"));
    assert_ne!(code, 0);
    assert!(
        err.contains("limits[0].burst") && err.contains("limits[0].shards"),
        "{err}"
    );
    let (code, _, err, _dir) =
        check("[listeners]\nhttp = \"127.0.0.1:0\"\n[[limits]]\nname = \"l\"\nrate = \"1/s\"\nmax = 3\n");
    assert_ne!(code, 0);
    assert!(err.contains("limits[0].max"), "{err}");
    let (code, out, err, _dir) = check(&format!("{base}max = 4\n"));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("limit     gpu concurrency max 4 in flight (enforce)"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_holds_the_slots_too() {
    let cluster = crate::support::redis::Cluster::start();
    // Bodies far longer than the test: no slot comes back while the four
    // heads arrive, however slow a loaded machine makes them.
    let up = dripping(30_000).await;
    let store = format!(
        "[store]\nbackend = \"redis\"\ncluster = {}\ntimeout_ms = 1000\n",
        cluster.seeds_toml()
    );
    let config = toml(&store, up, "max = 2");
    let (a, b) = (Gateway::start_connected(&config), Gateway::start_connected(&config));
    let answers = heads(&[a.http(), b.http(), a.http(), b.http()]).await;
    assert_eq!(statuses(&answers), [200, 200, 429, 429]);
}
