//! Redis dies (SIGKILL) or hangs (SIGSTOP) under a real gateway: every
//! request is still answered quickly, fail-open routes admit against their
//! fallback bucket and say so in metrics, fail-closed routes answer 503 with
//! Retry-After, and enforcement resumes when Redis is back.

use std::time::{Duration, Instant};

use http::StatusCode;

use crate::support::redis::Redis;
use crate::support::{self, client, sample, Gateway, Toml};

fn config(redis: &Redis) -> Toml {
    config_for(&redis.url())
}

/// `/open` fails open and `/closed` fails closed, both under a limit they
/// never reach; `/low` fails open under `4/h` (fallback `2/h`). Store calls
/// time out after 5 ms; three failures open the circuit for a second.
fn config_for(url: &str) -> Toml {
    Toml::new()
        .gateway("workers = 1")
        .redis(url, "timeout_ms = 5")
        .table("store.breaker", "failures = 3\nopen_ms = 1000")
        .table("leasing", "min = 1\nmax = 5")
        .respond("open", "/open", &["roomy"])
        .with("on_store_failure = \"allow\"")
        .respond("closed", "/closed", &["roomy"])
        .with("on_store_failure = \"deny\"")
        .respond("low", "/low", &["low"])
        .with("on_store_failure = \"allow\"")
        .limit("roomy", "100000/s")
        .with("by = [\"route\"]")
        .limit("low", "4/h")
        .with("by = [\"route\"]\nfallback_rate = \"2/h\"")
}

/// Sends one request; returns its status, Retry-After and how long it took.
async fn request(c: &mut client::Sender1, path: &str) -> (StatusCode, Option<u64>, Duration) {
    let started = Instant::now();
    let (status, headers, _) = client::text(client::send(c, client::get(path)).await).await;
    let retry_after = headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    (status, retry_after, started.elapsed())
}

/// Drives both routes for `secs` while the store is away; checks every
/// answer and its latency. Returns (open 200s, closed 503s).
async fn drive_outage(c: &mut client::Sender1, secs: f64) -> (u64, u64) {
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let (mut open_ok, mut closed_503) = (0, 0);
    let mut slowest = Duration::ZERO;
    while Instant::now() < until {
        let (status, _, took) = request(c, "/open").await;
        assert_eq!(status, StatusCode::OK, "a fail-open route keeps answering 200");
        open_ok += 1;
        slowest = slowest.max(took);
        let (status, retry_after, took) = request(c, "/closed").await;
        slowest = slowest.max(took);
        match status {
            // Tokens leased before the outage are still spent.
            StatusCode::OK => {}
            StatusCode::SERVICE_UNAVAILABLE => {
                assert!(retry_after.is_some_and(|s| s >= 1), "503 carries Retry-After");
                closed_503 += 1;
            }
            other => panic!("unexpected {other} on the fail-closed route"),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(slowest < Duration::from_millis(100), "slowest answer took {slowest:?}");
    println!("outage: {open_ok} admitted on the open route, {closed_503} 503s, slowest {slowest:?}");
    (open_ok, closed_503)
}

/// Redis answers: the breaker is closed and the fail-closed route is
/// served, within a few seconds (after an outage: once Redis is back).
async fn wait_for_recovery(gw: &Gateway, c: &mut client::Sender1) {
    wait_for_recovery_on(gw, c, "/closed").await;
}

/// [`wait_for_recovery`] with `path` as the fail-closed route.
async fn wait_for_recovery_on(gw: &Gateway, c: &mut client::Sender1, path: &str) {
    crate::support::eventually(
        Duration::from_secs(10),
        async || {
            let (status, _, _) = request(c, path).await;
            (status == StatusCode::OK && sample(&gw.metrics().await, "leasegate_circuit_open ") == 0.0).then_some(())
        },
        || format!("enforcement did not resume:\n{}", gw.log()),
    )
    .await;
}

#[tokio::test]
async fn a_killed_redis_fails_open_and_closed_per_route_then_recovers() {
    let mut redis = Redis::start();
    let gw = Gateway::start_connected(&config(&redis));
    let mut c = client::http1(gw.http()).await;
    // A healthy baseline first (a busy machine may slow the first calls).
    wait_for_recovery(&gw, &mut c).await;
    assert_eq!(request(&mut c, "/open").await.0, StatusCode::OK);

    redis.kill();
    let (_, closed_503) = drive_outage(&mut c, 2.0).await;
    assert!(closed_503 > 0, "the fail-closed route answered 503");
    // The fallback bucket of a fail-open route still limits: 2 per hour.
    let low: Vec<StatusCode> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(request(&mut c, "/low").await.0);
        }
        v
    };
    assert_eq!(
        low,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let m = gw.metrics().await;
    assert_eq!(sample(&m, "leasegate_circuit_open "), 1.0, "{m}");
    let mut admin = client::http1(gw.admin()).await;
    let (status, _, ready) = client::text(client::send(&mut admin, client::get("/readyz")).await).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a store outage does not take the fleet out of its balancer"
    );
    assert!(ready.contains("store redis: circuit open"), "{ready}");
    let bypassed = sample(&m, r#"rate_limit_bypassed_total{reason="store_circuit_open"} "#)
        + sample(&m, r#"rate_limit_bypassed_total{reason="store_error"} "#);
    assert!(bypassed > 0.0, "{m}");
    // Refused connections fail at once.
    let failed = sample(&m, r#"leasegate_store_calls_total{op="acquire",result="error"} "#);
    assert!(failed >= 3.0, "{m}");

    // A fresh Redis on the same port: enforcement resumes, from Redis.
    redis.restart();
    wait_for_recovery(&gw, &mut c).await;
    let failed_calls = |m: &str| {
        sample(m, r#"leasegate_store_calls_total{op="acquire",result="timeout"} "#)
            + sample(m, r#"leasegate_store_calls_total{op="acquire",result="error"} "#)
    };
    let failed_before = failed_calls(&gw.metrics().await);
    let low: Vec<StatusCode> = {
        let mut v = Vec::new();
        for _ in 0..6 {
            v.push(request(&mut c, "/low").await.0);
        }
        v
    };
    // Redis's bucket admits exactly its 4, then refuses. The first calls to
    // a Redis just restarted can miss the 5 ms deadline on a busy machine:
    // such a request is decided by the key's fallback bucket (drained by
    // the outage: a 429), and the limit stays exact around it.
    let failed = failed_calls(&gw.metrics().await) - failed_before;
    assert!(failed <= 1.0, "{failed} store calls failed after recovery: {low:?}");
    assert_eq!(low.iter().filter(|s| **s == StatusCode::OK).count(), 4, "{low:?}");
    let last_ok = low.iter().rposition(|s| *s == StatusCode::OK).unwrap_or(0);
    assert!(
        low[last_ok + 1..].iter().all(|s| *s == StatusCode::TOO_MANY_REQUESTS) && last_ok + 1 < low.len(),
        "{low:?}"
    );
    assert_eq!(
        low.iter().filter(|s| **s == StatusCode::TOO_MANY_REQUESTS).count(),
        2,
        "one refusal from Redis, and at most one from the fallback while a call failed: {low:?}"
    );
    assert_eq!(redis.cli(&["EXISTS", "rl:{low:low}"]).trim(), "1");
}

/// Redis stopped, its port refusing connections: the calls fail at once
/// and count as `store_error`, not as `store_timeout`. The deadline here is
/// 100 ms, far above what a refused connect takes on loopback, so a call
/// that reaches it is one that waited on something (a reconnect backing
/// off), not one the host was too busy to answer.
#[tokio::test]
async fn a_refused_connection_is_a_store_error_not_a_timeout() {
    let mut redis = Redis::start();
    let text = config(&redis).replace("timeout_ms = 5", "timeout_ms = 100");
    let gw = Gateway::start_connected(&text);
    let mut c = client::http1(gw.http()).await;
    wait_for_recovery(&gw, &mut c).await;

    redis.kill();
    let until = Instant::now() + Duration::from_millis(1_500);
    while Instant::now() < until {
        assert_eq!(request(&mut c, "/open").await.0, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let m = gw.metrics().await;
    assert!(
        sample(&m, r#"rate_limit_bypassed_total{reason="store_error"} "#) >= 1.0,
        "a refused connection is a store error:\n{m}"
    );
    assert_eq!(
        sample(&m, r#"rate_limit_bypassed_total{reason="store_timeout"} "#),
        0.0,
        "no call waited for the deadline:\n{m}\n{}",
        gw.log()
    );
    for op in ["acquire", "release"] {
        let timeouts = format!(r#"leasegate_store_calls_total{{op="{op}",result="timeout"}} "#);
        assert_eq!(sample(&m, &timeouts), 0.0, "{op}:\n{m}");
    }
    assert!(sample(&m, r#"leasegate_store_calls_total{op="acquire",result="error"} "#) >= 1.0);
    // Logged at WARN (the default level shows it), but not per request: at
    // most one line per reason in the 10 s interval, the rest held back.
    let log = gw.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("quota store failed")).collect();
    assert!(!lines.is_empty(), "{log}");
    assert!(lines.iter().all(|l| l.contains("WARN")), "{lines:#?}");
    assert!(lines.len() <= 2, "one line per reason per 10 s: {lines:#?}");
}

/// Redis comes back while no request arrives: the breaker's background
/// probe closes the circuit within about `open_ms` (1 s here), so
/// `leasegate_circuit_open` (and the alert on it) clears by itself.
#[tokio::test]
async fn an_idle_gateway_closes_its_circuit_when_redis_comes_back() {
    let mut redis = Redis::start();
    let gw = Gateway::start_connected(&config(&redis));
    let mut c = client::http1(gw.http()).await;
    wait_for_recovery(&gw, &mut c).await;

    redis.kill();
    crate::support::eventually(
        Duration::from_secs(10),
        async || {
            if sample(&gw.metrics().await, "leasegate_circuit_open ") == 1.0 {
                return Some(());
            }
            assert_eq!(request(&mut c, "/open").await.0, StatusCode::OK);
            None
        },
        || format!("the circuit never opened:\n{}", gw.log()),
    )
    .await;
    // From here on, no request at all. Redis still down: the background
    // probes fail, and the circuit stays open.
    drop(c);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(sample(&gw.metrics().await, "leasegate_circuit_open "), 1.0);

    redis.restart();
    let back = Instant::now();
    loop {
        let open = sample(&gw.metrics().await, "leasegate_circuit_open ");
        if open == 0.0 {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_millis(2_000),
            "still open {:?} after Redis came back:\n{}",
            back.elapsed(),
            gw.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("circuit closed {:?} after Redis came back", back.elapsed());
    assert!(gw.log().contains("store answered again; circuit closed"));
}

#[tokio::test]
async fn a_frozen_redis_times_out_then_opens_the_circuit() {
    let redis = Redis::start();
    let gw = Gateway::start_connected(&config(&redis));
    let mut c = client::http1(gw.http()).await;
    wait_for_recovery(&gw, &mut c).await;

    redis.freeze();
    let (_, closed_503) = drive_outage(&mut c, 2.0).await;
    assert!(closed_503 > 0);
    let m = gw.metrics().await;
    assert!(
        sample(&m, r#"rate_limit_bypassed_total{reason="store_timeout"} "#) >= 1.0,
        "hung calls fail by the deadline:\n{m}"
    );
    assert!(
        sample(&m, r#"rate_limit_bypassed_total{reason="store_circuit_open"} "#) >= 1.0,
        "then the circuit opens:\n{m}"
    );
    assert!(sample(&m, r#"leasegate_store_calls_total{op="acquire",result="timeout"} "#) >= 3.0);
    assert_eq!(sample(&m, "leasegate_circuit_open "), 1.0);
    // A store that does not answer is slow, not broken.
    assert_eq!(
        sample(&m, r#"rate_limit_bypassed_total{reason="store_error"} "#),
        0.0,
        "a frozen Redis is a timeout, not an error:\n{m}"
    );
    // And the missed deadlines were spent waiting for Redis, not here: the
    // calls went out, and most of each 5 ms went by after they had.
    let phase = |what: &str| sample(&m, &format!("leasegate_store_call_phase_seconds_{what} "));
    let timeouts = phase(r#"count{phase="redis",result="timeout"}"#);
    assert!(timeouts >= 3.0, "{m}");
    assert_eq!(timeouts, phase(r#"count{phase="gateway",result="timeout"}"#));
    let (redis_s, gateway_s) = (
        phase(r#"sum{phase="redis",result="timeout"}"#),
        phase(r#"sum{phase="gateway",result="timeout"}"#),
    );
    assert!(
        redis_s > gateway_s && redis_s >= timeouts * 0.002,
        "a frozen Redis's timeouts are Redis's: {redis_s} s waiting for Redis, {gateway_s} s here, {timeouts} calls"
    );

    redis.thaw();
    wait_for_recovery(&gw, &mut c).await;
}

#[tokio::test]
async fn a_gateway_started_without_redis_serves_and_enforces_once_redis_comes() {
    // Redis is not there yet: the gateway starts anyway.
    let port = support::closed_port();
    let absent = format!("redis://127.0.0.1:{port}");
    let text = config_for(&absent);
    let gw = Gateway::start(&text);
    let mut c = client::http1(gw.http()).await;
    let (status, _, took) = request(&mut c, "/open").await;
    assert_eq!(status, StatusCode::OK, "fail-open routes serve at once");
    assert!(took < Duration::from_millis(100), "{took:?}");
    let (status, retry_after, _) = request(&mut c, "/closed").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(retry_after.is_some_and(|s| s >= 1));
    // Redis arrives on that port: the breaker's next probe finds it.
    let _redis = Redis::start_on(port);
    wait_for_recovery(&gw, &mut c).await;
}

/// The three stages that cannot refuse, each on a fail-closed and a
/// fail-open route, and an enforced limit on one of each.
fn stages_config(redis: &Redis) -> Toml {
    let mut toml = Toml::new()
        .gateway("workers = 1\ninstance_id = \"stages-test\"")
        .redis(&redis.url(), "timeout_ms = 100")
        .table("store.breaker", "failures = 3\nopen_ms = 1000")
        // One token per lease and (nearly) no local block after a refusal:
        // every request of these routes asks the store, so each meets the
        // outage.
        .table("leasing", "min = 1\nmax = 1\nmax_block_ms = 1");
    for (name, limit, on_failure) in [
        ("shadow", "watch", "deny"),
        ("soft", "gentle", "deny"),
        ("canary", "trial", "deny"),
        ("lax-shadow", "watch", "allow"),
        ("lax-soft", "gentle", "allow"),
        ("lax-canary", "trial", "allow"),
        ("enforced", "strict", "deny"),
        ("bypass", "strict", "allow"),
    ] {
        toml = toml
            .respond(name, &format!("/{name}"), &[limit])
            .with(&format!("on_store_failure = \"{on_failure}\""));
    }
    // Low rates: the stages are over their quota too, in Redis and in the
    // fallback bucket, so a refusal is what they meet, not only an error.
    // Sliding windows: a drained token bucket would hand these keys a
    // reservation, and a key holding one asks the store nothing until it
    // is due (half a minute here), so it would never meet the outage.
    let sliding = "algorithm = \"sliding_window\"\nby = [\"route\"]";
    toml.limit("watch", "2/min")
        .with(&format!("{sliding}\nmode = \"shadow\""))
        .limit("gentle", "2/min")
        .with(&format!("{sliding}\nmode = \"soft\""))
        .limit("trial", "2/min")
        .with(&format!("{sliding}\nmode = \"canary\"\ncanary_percent = 0"))
        .limit("strict", "100000/s")
        .with("by = [\"route\"]")
}

const STAGE_PATHS: [&str; 6] = ["/shadow", "/soft", "/canary", "/lax-shadow", "/lax-soft", "/lax-canary"];

/// Non-zero samples of `rate_limit_bypassed_total`, whatever their labels
/// (every reason is exported at 0 from the start).
fn bypass_samples(metrics: &str) -> Vec<&str> {
    metrics
        .lines()
        .filter(|l| l.starts_with("rate_limit_bypassed_total"))
        .filter(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) != Some(0.0))
        .collect()
}

#[tokio::test]
async fn stages_that_cannot_refuse_never_answer_503_or_count_as_bypass_when_redis_dies() {
    let mut redis = Redis::start();
    let gw = Gateway::start_connected(&stages_config(&redis));
    let mut c = client::http1(gw.http()).await;
    wait_for_recovery_on(&gw, &mut c, "/enforced").await;
    // A healthy baseline: over quota already (2/min), and still 200.
    for path in STAGE_PATHS {
        for _ in 0..3 {
            assert_eq!(request(&mut c, path).await.0, StatusCode::OK, "{path} with Redis up");
        }
    }

    redis.kill();
    // Enough requests to meet refused connections first, then the open
    // circuit (3 failures open it).
    let mut seen = Vec::new();
    for round in 0..10 {
        for path in STAGE_PATHS {
            let (status, _, took) = request(&mut c, path).await;
            seen.push(status.as_u16());
            assert_eq!(
                status,
                StatusCode::OK,
                "{path}, request {round} after Redis died: a stage that cannot refuse never fails the request \
                 ({seen:?})"
            );
            assert!(took < Duration::from_millis(500), "{path}: {took:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let m = gw.metrics().await;
    assert_eq!(sample(&m, "leasegate_circuit_open "), 1.0, "the store did fail:\n{m}");
    assert!(
        bypass_samples(&m).is_empty(),
        "shadow, soft and a non-enforcing canary are left out of the bypass alert's numerator:\n{m}"
    );
    for path in STAGE_PATHS {
        let route = &path[1..];
        // Series appear at their first request: the route's 200s are
        // counted, and it has no 503 series at all (or one at 0).
        let served = format!("leasegate_requests_total{{route=\"{route}\",status=\"200\"}} ");
        assert!(sample(&m, &served) >= 13.0, "{served}in\n{m}");
        let failed = format!("leasegate_requests_total{{route=\"{route}\",status=\"503\"}} ");
        assert_eq!(sample(&m, &failed), 0.0, "{m}");
    }

    // In the same gateway an enforce limit on a fail-closed route refuses
    // service (its one leased token may serve one request first) ...
    let mut enforced = Vec::new();
    for _ in 0..4 {
        enforced.push(request(&mut c, "/enforced").await.0);
    }
    assert_eq!(enforced[1..], [StatusCode::SERVICE_UNAVAILABLE; 3], "{enforced:?}");
    assert!(bypass_samples(&gw.metrics().await).is_empty(), "a 503 is not a bypass");
    // ... and one on a fail-open route is a bypass: the metric is live here.
    for _ in 0..3 {
        assert_eq!(request(&mut c, "/bypass").await.0, StatusCode::OK);
    }
    let m = gw.metrics().await;
    assert!(
        sample(&m, r#"rate_limit_bypassed_total{reason="store_circuit_open"} "#) >= 1.0,
        "{m}"
    );
}
