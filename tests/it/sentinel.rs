//! Redis Sentinel: a master, a replica and three sentinels, all real
//! processes on 127.0.0.1. The gateway finds the master through the
//! sentinels; the master is SIGKILLed under load. No request waits on the
//! failover (each is answered within the store deadline plus a little),
//! fail-open and fail-closed routes behave as with a dead Redis while it
//! lasts, and limits resume on the promoted replica, from its copy of the
//! buckets. The timeline is printed (`cargo test --test it sentinel:: --
//! --nocapture`). Also: a graceful switch (`SENTINEL FAILOVER`), and a
//! node answering `READONLY` (named by a stand-in sentinel) sending the
//! gateway back to the sentinels.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::StatusCode;

use crate::support::redis::{Redis, Sentinels, MASTER_NAME};
use crate::support::{self, client, sample, Gateway, Toml};

fn config(set: &Sentinels) -> Toml {
    config_with(&set.urls_toml())
}

/// `sentinels`: a TOML list of sentinel URLs. `/open` fails open and
/// `/closed` fails closed, both under a limit they never reach; `/low`
/// fails closed under `4/h`.
fn config_with(sentinels: &str) -> Toml {
    Toml::new()
        .gateway("workers = 1")
        .table(
            "store",
            &format!(
                "backend = \"redis\"\nsentinel = {sentinels}\nsentinel_master = \"{MASTER_NAME}\"\ntimeout_ms = 10"
            ),
        )
        .table("store.breaker", "failures = 3\nopen_ms = 500")
        .table("leasing", "min = 1\nmax = 5")
        .respond("open", "/open", &["roomy"])
        .with("on_store_failure = \"allow\"")
        .respond("closed", "/closed", &["roomy"])
        .with("on_store_failure = \"deny\"")
        .respond("low", "/low", &["low"])
        .with("on_store_failure = \"deny\"")
        .limit("roomy", "100000/s")
        .with("by = [\"route\"]")
        .limit("low", "4/h")
        .with("by = [\"route\"]")
}

/// The scenarios run one at a time: each starts five or six Redis
/// processes and a gateway, and two at once on a 2-core host would measure
/// each other.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The slowest answer allowed during a failover: the 10 ms deadline plus a
/// debug build's and a loaded host's slack (measured: 6–9 ms quiet, 42 ms
/// with six busy loops). A request that waited on the failover would take
/// seconds.
const SLOWEST: Duration = Duration::from_millis(250);

async fn request(c: &mut client::Sender1, path: &str) -> (StatusCode, Duration) {
    let started = Instant::now();
    let (status, _, _) = client::text(client::send(c, client::get(path)).await).await;
    (status, started.elapsed())
}

/// The answer of a fail-closed route once the store decided: a `503` is a
/// store call that missed the 10 ms deadline (a busy host), so ask again,
/// for up to 3 s.
async fn decided(c: &mut client::Sender1, path: &str) -> StatusCode {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let status = request(c, path).await.0;
        if status != StatusCode::SERVICE_UNAVAILABLE || Instant::now() > deadline {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (5 s at most) until the `low` bucket reached the replica
/// (asynchronous replication, on loopback).
async fn reached_the_replica(set: &Sentinels) {
    crate::support::eventually(
        Duration::from_secs(5),
        async || (set.replica.cli(&["EXISTS", "rl:{low:low}"]).trim() == "1").then_some(()),
        || "the bucket never reached the replica".into(),
    )
    .await;
}

/// The master's port as sentinel `port` names it.
fn named_master(port: u16) -> Option<u16> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["SENTINEL", "get-master-addr-by-name", MASTER_NAME])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|p| p.trim().parse().ok())
}

fn ms(d: Option<Duration>) -> String {
    d.map_or("never".to_string(), |d| format!("{} ms", d.as_millis()))
}

#[tokio::test]
async fn a_killed_master_fails_over_to_the_replica_without_stalling_a_request() {
    let _one_at_a_time = SERIAL.lock().await;
    let test_started = Instant::now();
    let mut set = Sentinels::start();
    assert_eq!(set.master_port(), Some(set.master.port));
    let gw = Gateway::start_connected(&config(&set));
    let mut c = client::http1(gw.http()).await;

    // A healthy baseline: the fail-closed route is served from Redis.
    crate::support::eventually(
        Duration::from_secs(10),
        async || (request(&mut c, "/closed").await.0 == StatusCode::OK).then_some(()),
        || format!("never served:\n{}", gw.log()),
    )
    .await;
    // Exhaust a limit on the master: 4 per hour.
    let mut low = Vec::new();
    for _ in 0..5 {
        low.push(decided(&mut c, "/low").await);
    }
    assert_eq!(low.iter().filter(|s| **s == StatusCode::OK).count(), 4, "{low:?}");
    assert_eq!(low[4], StatusCode::TOO_MANY_REQUESTS);
    // The bucket reached the replica (asynchronous replication, on loopback).
    reached_the_replica(&set).await;
    let replica_scripts_before = set.replica.script_calls();

    // Watch the sentinels: when does a majority name the replica?
    let kill_at = Instant::now();
    let promoted: Arc<Mutex<Option<Duration>>> = Arc::default();
    let watcher = {
        let promoted = promoted.clone();
        let ports: Vec<u16> = set.sentinels.iter().map(|s| s.port).collect();
        let replica = set.replica.port;
        std::thread::spawn(move || {
            while kill_at.elapsed() < Duration::from_secs(40) {
                let named = ports.iter().filter(|p| named_master(**p) == Some(replica)).count();
                if named >= 2 {
                    *promoted.lock().unwrap() = Some(kill_at.elapsed());
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    set.master.kill();

    // Drive both routes until the fail-closed one is served again after
    // failing, then a little longer.
    let (mut first_failure, mut first_success) = (None, None);
    let (mut open_ok, mut closed_503, mut closed_ok, mut requests) = (0u64, 0u64, 0u64, 0u64);
    let mut slowest = Duration::ZERO;
    let mut resumed_at = None;
    // Ends half a second after service resumes; the cap leaves room for a
    // split vote among the sentinels (another election 2 × failover-timeout
    // later) on a loaded host.
    let until = kill_at + Duration::from_secs(40);
    while Instant::now() < until {
        let (status, took) = request(&mut c, "/open").await;
        assert_eq!(status, StatusCode::OK, "a fail-open route keeps answering 200");
        slowest = slowest.max(took);
        open_ok += 1;
        let (status, took) = request(&mut c, "/closed").await;
        slowest = slowest.max(took);
        requests += 2;
        match status {
            StatusCode::OK => {
                closed_ok += 1;
                if first_failure.is_some() && first_success.is_none() {
                    first_success = Some(kill_at.elapsed());
                }
            }
            StatusCode::SERVICE_UNAVAILABLE => {
                closed_503 += 1;
                first_failure.get_or_insert(kill_at.elapsed());
            }
            other => panic!("unexpected {other} on the fail-closed route"),
        }
        if first_success.is_some() {
            let at = *resumed_at.get_or_insert(Instant::now());
            if at.elapsed() > Duration::from_millis(500) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    watcher.join().unwrap();
    let promoted = *promoted.lock().unwrap();
    println!("failover timeline (from the SIGKILL of the master, timeout_ms = 10, open_ms = 500):");
    println!("  first failure (fail-closed 503):      {}", ms(first_failure));
    println!("  promotion named by the sentinels:     {}", ms(promoted));
    println!("  first success on the new master:      {}", ms(first_success));
    println!(
        "  {requests} requests: {open_ok} fail-open 200s, {closed_ok} fail-closed 200s, {closed_503} 503s; slowest {slowest:?}"
    );
    println!("  whole test so far: {:?}", test_started.elapsed());
    assert!(first_failure.is_some(), "the outage was seen:\n{}", gw.log());
    let promoted = promoted.unwrap_or_else(|| panic!("the sentinels never promoted the replica"));
    let first_success = first_success.unwrap_or_else(|| panic!("enforcement never resumed:\n{}", gw.log()));
    assert!(
        slowest < SLOWEST,
        "no request waits on the failover: slowest took {slowest:?}"
    );
    assert!(
        first_success < promoted + Duration::from_secs(5),
        "resumed {first_success:?} after the kill, promotion at {promoted:?}"
    );

    // Limits resume on the promoted replica, from its copy of the bucket:
    // the exhausted key is still exhausted, and the calls land there.
    assert_eq!(decided(&mut c, "/low").await, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        set.replica.script_calls() > replica_scripts_before,
        "the scripts run on the new master"
    );
    crate::support::eventually(
        Duration::from_secs(5),
        async || (sample(&gw.metrics().await, "leasegate_circuit_open ") == 0.0).then_some(()),
        || format!("the circuit stayed open:\n{}", gw.log()),
    )
    .await;
    assert!(
        gw.log().contains("the sentinels name a new Redis master"),
        "{}",
        gw.log()
    );
}

/// A graceful switch (`SENTINEL FAILOVER`): the old master lives on as a
/// replica of the new one, and the gateway's connection to it stays open
/// (its scripts meet `READONLY` if the demotion comes before the gateway's
/// next discovery). The gateway moves to the new master and stops calling
/// the old one; no request waits. The sentinel list starts
/// with one that is down: discovery asks them all at once, so it costs
/// nothing.
#[tokio::test]
async fn a_switched_master_is_followed_and_the_demoted_one_left_alone() {
    let _one_at_a_time = SERIAL.lock().await;
    let set = Sentinels::start();
    let text = config(&set).replace(
        "sentinel = [",
        &format!("sentinel = [\"redis://127.0.0.1:{}\", ", support::closed_port()),
    );
    let gw = Gateway::start_connected(&text);
    let mut c = client::http1(gw.http()).await;
    crate::support::eventually(
        Duration::from_secs(10),
        async || (request(&mut c, "/closed").await.0 == StatusCode::OK).then_some(()),
        || format!("never served:\n{}", gw.log()),
    )
    .await;
    for _ in 0..4 {
        assert_eq!(decided(&mut c, "/low").await, StatusCode::OK);
    }
    reached_the_replica(&set).await;

    let started = Instant::now();
    let out = set.sentinels[0].cli(&["SENTINEL", "FAILOVER", MASTER_NAME]);
    assert_eq!(out.trim(), "OK", "SENTINEL FAILOVER: {out}");
    let mut slowest = Duration::ZERO;
    let (mut moved, mut named) = (None, None);
    while started.elapsed() < Duration::from_secs(30) {
        if named.is_none() && named_master(set.sentinels[0].port) == Some(set.replica.port) {
            named = Some(started.elapsed());
        }
        for path in ["/open", "/closed"] {
            let (status, took) = request(&mut c, path).await;
            slowest = slowest.max(took);
            assert!(
                status == StatusCode::OK || (path == "/closed" && status == StatusCode::SERVICE_UNAVAILABLE),
                "{path}: {status}"
            );
        }
        if moved.is_none() && set.replica.script_calls() > 0 {
            moved = Some(started.elapsed());
        }
        if moved.is_some_and(|m| started.elapsed() > m + Duration::from_millis(500)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let moved = moved.unwrap_or_else(|| {
        panic!(
            "the gateway never called the new master (the sentinels name port {:?}; replica {}, old master {}):\n{}",
            set.master_port(),
            set.replica.port,
            set.master.port,
            gw.log()
        )
    });
    let readonly = gw.log().contains("READONLY");
    let log = gw.log();
    println!(
        "switch: named by the sentinel {} after SENTINEL FAILOVER, scripts on the new master at {} ms; +switch-master seen: {}; READONLY seen: {readonly}; slowest {slowest:?}",
        ms(named),
        moved.as_millis(),
        log.contains(": +switch-master"),
    );
    assert!(log.contains("watching the sentinel for +switch-master"), "{log}");
    assert!(slowest < SLOWEST, "slowest took {slowest:?}");
    assert_eq!(set.master_port(), Some(set.replica.port));
    // The sentinels turn the old master into a replica after the switch.
    // About 10 s after the switch here (measured 10.04–10.1 s): room for a
    // loaded host.
    crate::support::eventually(
        Duration::from_secs(30),
        async || {
            set.master
                .cli(&["INFO", "replication"])
                .contains("role:slave")
                .then_some(())
        },
        || "the old master was never demoted".into(),
    )
    .await;

    // The demoted node gets no more calls; the new one gets them all, and
    // holds the exhausted bucket.
    let old = set.master.script_calls();
    let new = set.replica.script_calls();
    for _ in 0..50 {
        assert_eq!(decided(&mut c, "/closed").await, StatusCode::OK);
    }
    assert_eq!(decided(&mut c, "/low").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(set.master.script_calls(), old, "the demoted master is left alone");
    assert!(set.replica.script_calls() > new);
}

/// A stand-in sentinel that names whatever node the test says (a real one
/// would not name a replica): answers `SENTINEL get-master-addr-by-name`
/// with `127.0.0.1:<names>`, `+OK` to anything else, and counts the asks.
struct FakeSentinel {
    port: u16,
    names: Arc<AtomicU16>,
    asked: Arc<AtomicU64>,
}

impl FakeSentinel {
    fn start(names: u16) -> FakeSentinel {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let names = Arc::new(AtomicU16::new(names));
        let asked = Arc::new(AtomicU64::new(0));
        let (n, a) = (names.clone(), asked.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (n, a) = (n.clone(), a.clone());
                std::thread::spawn(move || Self::serve(conn, &n, &a));
            }
        });
        FakeSentinel { port, names, asked }
    }

    fn serve(conn: TcpStream, names: &AtomicU16, asked: &AtomicU64) {
        let mut out = conn.try_clone().unwrap();
        let mut r = BufReader::new(conn);
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let Some(n) = line.trim().strip_prefix('*').and_then(|n| n.parse::<usize>().ok()) else {
                return;
            };
            let mut args = Vec::new();
            for _ in 0..n {
                let mut len = String::new();
                r.read_line(&mut len).unwrap();
                let len: usize = len.trim().trim_start_matches('$').parse().unwrap();
                let mut buf = vec![0; len + 2];
                r.read_exact(&mut buf).unwrap();
                args.push(String::from_utf8_lossy(&buf[..len]).to_lowercase());
            }
            let reply = if args.first().map(String::as_str) == Some("sentinel") {
                asked.fetch_add(1, Ordering::SeqCst);
                let port = names.load(Ordering::SeqCst).to_string();
                format!("*2\r\n$9\r\n127.0.0.1\r\n${}\r\n{port}\r\n", port.len())
            } else {
                "+OK\r\n".to_string()
            };
            if out.write_all(reply.as_bytes()).is_err() {
                return;
            }
        }
    }
}

/// The sentinels name a node that is a replica: a new connection must
/// answer `ROLE` as the master before any call uses it, so the replica is
/// never connected (its scripts would meet `READONLY`), never reads `ok`,
/// and the sentinels are asked again; once they name the master the
/// gateway moves there. No request waits meanwhile. (A master demoted
/// while connected, whose scripts meet `READONLY`, is the graceful switch
/// above.)
#[tokio::test]
async fn a_replica_named_as_master_is_never_used_and_the_sentinels_are_asked_again() {
    let _one_at_a_time = SERIAL.lock().await;
    let master = Redis::start();
    let replica = Redis::start_replica_of(&master);
    let fake = FakeSentinel::start(replica.port);
    let text = config_with(&format!("[\"redis://127.0.0.1:{}\"]", fake.port))
        .to_string()
        .replace("timeout_ms = 10", "timeout_ms = 10\nconnect_timeout_ms = 300");
    let gw = Gateway::start(&text);
    assert!(
        gw.log()
            .contains("the store has not answered: serving as in a store outage"),
        "{}",
        gw.log()
    );
    let mut c = client::http1(gw.http()).await;
    let mut slowest = Duration::ZERO;
    crate::support::eventually(
        Duration::from_secs(10),
        async || {
            if gw.log().contains("the node is not the master (ROLE)") {
                return Some(());
            }
            let (status, took) = request(&mut c, "/closed").await;
            slowest = slowest.max(took);
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "a replica takes no write");
            None
        },
        || format!("no ROLE check:\n{}", gw.log()),
    )
    .await;
    let mut admin = client::http1(gw.admin()).await;
    let (_, _, ready) = client::text(client::send(&mut admin, client::get("/readyz")).await).await;
    assert!(
        ready.contains("store redis: circuit open, connecting (the node is not the master (ROLE))"),
        "{ready}"
    );
    assert!(!gw.log().contains("connected to Redis"), "{}", gw.log());
    assert_eq!(replica.script_calls(), 0, "no call reached the replica");
    let asked = fake.asked.load(Ordering::SeqCst);
    fake.names.store(master.port, Ordering::SeqCst);
    let flipped = Instant::now();
    let deadline = flipped + Duration::from_secs(5);
    loop {
        let (status, took) = request(&mut c, "/closed").await;
        slowest = slowest.max(took);
        if status == StatusCode::OK && master.script_calls() > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "never moved to the master:\n{}", gw.log());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!(
        "readonly: served by the master {} ms after the sentinel named it ({} asks before); slowest {slowest:?}",
        flipped.elapsed().as_millis(),
        asked
    );
    assert!(slowest < SLOWEST, "slowest took {slowest:?}");
}

/// Sentinel as a managed Redis runs it: the master, its replica and the
/// sentinels all TLS only (replication and the sentinels' links to the
/// nodes over TLS too), the gateway given `rediss://` sentinels and the
/// CA. It finds the master over TLS, the first requests are decided by
/// it, and a SIGKILL of the master fails over to the replica, over TLS.
#[tokio::test]
async fn over_tls_the_gateway_follows_a_failover_of_a_tls_only_master() {
    let _one_at_a_time = SERIAL.lock().await;
    let ca = support::TestCa::new("leasegate redis CA");
    let mut set = Sentinels::start_tls(&ca);
    assert_eq!(set.master_port(), Some(set.master.port));
    let text = config_with(&set.urls_toml()).to_string().replace(
        "timeout_ms = 10",
        // A debug build's TLS: 1-2.5 ms a call here, tens of ms on a
        // loaded CI machine: the deadline is not what this test is about.
        "timeout_ms = 100\nca = \"ca.pem\"",
    );
    let gw = Gateway::start_with(&text, &[("ca.pem", &ca.cert_pem)]);
    // Calls made before the sentinels named the master opened the
    // breaker: the first requests are the master's once it has closed.
    crate::support::eventually(
        Duration::from_secs(10),
        async || gw.metrics().await.contains("leasegate_circuit_open 0").then_some(()),
        || format!("the breaker never closed: {}", gw.log()),
    )
    .await;
    let mut c = client::http1(gw.http()).await;
    // Ready means the master answered over TLS: the first requests are its.
    let mut low = Vec::new();
    for _ in 0..5 {
        low.push(request(&mut c, "/low").await.0);
    }
    assert_eq!(
        low,
        [200, 200, 200, 200, 429].map(|s| StatusCode::from_u16(s).unwrap()),
        "{}",
        gw.log()
    );
    reached_the_replica(&set).await;
    set.master.kill();
    let mut failed = false;
    crate::support::eventually(
        Duration::from_secs(40),
        async || {
            match request(&mut c, "/closed").await.0 {
                StatusCode::OK if failed => return Some(()),
                StatusCode::OK => {}
                _ => failed = true,
            }
            None
        },
        || format!("never served again:\n{}", gw.log()),
    )
    .await;
    assert_eq!(set.master_port(), Some(set.replica.port));
    // The promoted replica holds the drained bucket.
    assert_eq!(decided(&mut c, "/low").await, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        gw.log().contains("the sentinels name a new Redis master"),
        "{}",
        gw.log()
    );
    assert!(gw.log().contains("connected to Redis redis=rediss://"), "{}", gw.log());
}
