//! Active health checks take a target out and bring it back with no
//! client request; every target failing them routes to all (panic
//! routing); `least_request` sends fewer requests to a slow target.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use crate::support::{client, Gateway, Toml};

/// An upstream whose `/healthz` answers `200` while `healthy`, else
/// `503`; every other request waits `delay_ms` and is counted.
struct Pod {
    addr: std::net::SocketAddr,
    healthy: Arc<AtomicBool>,
    served: Arc<AtomicUsize>,
    checks: Arc<AtomicUsize>,
}

async fn pod(delay_ms: u64) -> Pod {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let healthy = Arc::new(AtomicBool::new(true));
    let served = Arc::new(AtomicUsize::new(0));
    let checks = Arc::new(AtomicUsize::new(0));
    let (h, s, k) = (healthy.clone(), served.clone(), checks.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (h, s, k) = (h.clone(), s.clone(), k.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let (h, s, k) = (h.clone(), s.clone(), k.clone());
                    async move {
                        let mut resp = Response::new(Full::new(Bytes::from_static(b"pod")));
                        if req.uri().path() == "/healthz" {
                            k.fetch_add(1, Ordering::SeqCst);
                            if !h.load(Ordering::SeqCst) {
                                *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                            }
                        } else {
                            s.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                        }
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    Pod {
        addr,
        healthy,
        served,
        checks,
    }
}

fn up_gauge(metrics: &str, upstream: &str, target: &str) -> Option<f64> {
    let name = format!("leasegate_upstream_target_up{{upstream=\"{upstream}\",target=\"{target}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&name).and_then(|v| v.trim().parse().ok()))
}

/// Waits (5 s at most) for target `pod`'s gauge to read `want`.
async fn gauge_becomes(gw: &Gateway, pod: &Pod, want: f64) {
    crate::support::eventually(
        Duration::from_secs(5),
        async || (up_gauge(&gw.metrics().await, "pair", &pod.addr.to_string()) == Some(want)).then_some(()),
        || format!("{} never {want}:\n{}", pod.addr, gw.log()),
    )
    .await;
}

async fn send(gw: &Gateway, n: usize) {
    let mut c = client::http1(gw.http()).await;
    for _ in 0..n {
        let resp = client::send(&mut c, client::get("/work")).await;
        assert_eq!(client::text(resp).await.0, 200);
    }
}

fn checked_pair(a: &Pod, b: &Pod) -> Toml {
    Toml::new()
        .gateway("workers = 1")
        .raw(&format!(
            "[[upstreams]]\nname = \"pair\"\ntargets = [\"http://{}\", \"http://{}\"]\neject_after = 0\n\
             health = {{ path = \"/healthz\", interval_ms = 100, timeout_ms = 100, unhealthy = 2, healthy = 2 }}\n",
            a.addr, b.addr
        ))
        .forward("all", "/", "pair")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_checks_take_a_target_out_and_bring_it_back() {
    let (a, b) = (pod(0).await, pod(0).await);
    let gw = Gateway::start(&checked_pair(&a, &b));
    gauge_becomes(&gw, &a, 1.0).await;

    // /healthz fails: out, with no client request.
    a.healthy.store(false, Ordering::SeqCst);
    gauge_becomes(&gw, &a, 0.0).await;
    assert_eq!(a.served.load(Ordering::SeqCst), 0);
    assert!(
        gw.log()
            .contains("upstream target failed its health checks; out of the rotation"),
        "{}",
        gw.log()
    );
    send(&gw, 10).await;
    assert_eq!(a.served.load(Ordering::SeqCst), 0, "an unhealthy target got requests");
    assert_eq!(b.served.load(Ordering::SeqCst), 10);

    // Healthy again: back, and its share.
    a.healthy.store(true, Ordering::SeqCst);
    gauge_becomes(&gw, &a, 1.0).await;
    assert!(
        gw.log().contains("passed its health checks; back in the rotation"),
        "{}",
        gw.log()
    );
    send(&gw, 10).await;
    assert_eq!(a.served.load(Ordering::SeqCst), 5);

    // Every target failing: the checks are ignored, requests go to all.
    a.healthy.store(false, Ordering::SeqCst);
    b.healthy.store(false, Ordering::SeqCst);
    gauge_becomes(&gw, &a, 1.0).await;
    assert!(gw.wait_for_log("panic routing", Duration::from_secs(5)), "{}", gw.log());
    let before = (a.served.load(Ordering::SeqCst), b.served.load(Ordering::SeqCst));
    send(&gw, 10).await;
    assert_eq!(a.served.load(Ordering::SeqCst) - before.0, 5);
    assert_eq!(b.served.load(Ordering::SeqCst) - before.1, 5);
    assert!(a.checks.load(Ordering::SeqCst) >= 6);
}

#[test]
fn health_keys_are_checked_at_load() {
    let dir = crate::support::TempDir::new();
    let config = |health: &str| {
        format!(
            "[listeners]\nhttp = \"127.0.0.1:0\"\n\n[[upstreams]]\nname = \"u\"\ntargets = [\"http://127.0.0.1:9\"]\nhealth = {health}\n"
        )
    };
    let err = |health: &str| {
        let text = config(health);
        let path = dir.write("gateway.toml", &text);
        leasegate::config::parse(&path, &text)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let e = err("{ path = \"healthz\" }");
    assert!(
        e.contains("upstreams[0].health.path") && e.contains("starts with /"),
        "{e}"
    );
    let e = err("{ path = \"/h\", interval_ms = 500, timeout_ms = 900 }");
    assert!(
        e.contains("upstreams[0].health.timeout_ms") && e.contains("longer than interval_ms"),
        "{e}"
    );
    let e = err("{ path = \"/h\", unhealthy = 0 }");
    assert!(
        e.contains("upstreams[0].health.unhealthy") && e.contains("out of range"),
        "{e}"
    );
    let e = err("{ path = \"/h\", intervl_ms = 5 }");
    assert!(e.contains("intervl_ms"), "{e}");
    // Valid: `check` shows them.
    let text = config("{ path = \"/healthz\", interval_ms = 2000 }")
        .replace("health =", "balance = \"least_request\"\nretries = 2\nhealth =");
    let path = dir.write("gateway.toml", &text);
    let summary = leasegate::config::parse(&path, &text).unwrap().summary();
    assert!(
        summary.contains("least_request, health /healthz every 2000 ms, retries 2"),
        "{summary}"
    );
    let text = config("{ path = \"/h\" }").replace("health =", "balance = \"random\"\nhealth =");
    let path = dir.write("gateway.toml", &text);
    let e = leasegate::config::parse(&path, &text)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("upstreams[0].balance: unknown balance \"random\""), "{e}");
}

/// `clients` connections sending `each` requests in turn; the share of
/// them the slow pod served.
async fn slow_share(balance: &str) -> f64 {
    let (slow, fast) = (pod(150).await, pod(0).await);
    let gw = Gateway::start(
        &Toml::new()
            .gateway("workers = 2")
            .raw(&format!(
                "[[upstreams]]\nname = \"pair\"\ntargets = [\"http://{}\", \"http://{}\"]\nbalance = \"{balance}\"\n",
                slow.addr, fast.addr
            ))
            .forward("all", "/", "pair"),
    );
    let gw = Arc::new(gw);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let gw = gw.clone();
        tasks.push(tokio::spawn(async move { send(&gw, 6).await }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (s, f) = (slow.served.load(Ordering::SeqCst), fast.served.load(Ordering::SeqCst));
    assert_eq!(s + f, 48);
    s as f64 / 48.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_request_sends_fewer_requests_to_a_slow_target() {
    let least = slow_share("least_request").await;
    let round = slow_share("round_robin").await;
    eprintln!("slow target share: least_request {least:.3}, round_robin {round:.3}");
    assert!(least < 0.3, "least_request gave the slow target {least}");
    assert!(round > 0.4, "round_robin gave the slow target {round}");
}

/// A target that reads a request's head and closes the connection
/// without answering: the exchange breaks before any response head.
async fn resetter() -> std::net::SocketAddr {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_send_an_idempotent_request_again_on_another_target() {
    let (bad, good) = (resetter().await, pod(0).await);
    let gw = Gateway::start(
        &Toml::new()
            .gateway("workers = 1")
            .raw(&format!(
                "[[upstreams]]\nname = \"pair\"\ntargets = [\"http://{bad}\", \"http://{}\"]\neject_after = 0\nretries = 1\n",
                good.addr
            ))
            .forward("all", "/", "pair"),
    );
    let mut c = client::http1(gw.http()).await;
    // Idempotent, no body: every one answered, half of them on a retry.
    for method in ["GET", "DELETE", "GET", "OPTIONS", "HEAD", "GET"] {
        assert_eq!(call(&mut c, method, b"").await, 200, "{method}\n{}", gw.log());
    }
    assert_eq!(good.served.load(Ordering::SeqCst), 6);
    assert!(gw.log().contains("retried on another target (retries)"), "{}", gw.log());
    // Never a POST; never a body that streamed (it is gone once sent).
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(call(&mut c, "POST", b"").await);
        got.push(call(&mut c, "PUT", b"streamed body").await);
    }
    assert!(got.contains(&502), "{got:?}");
}

async fn call(c: &mut client::Sender1, method: &str, body: &'static [u8]) -> u16 {
    let req = http::Request::builder()
        .method(method)
        .uri("/work")
        .header("host", "gw")
        .body(Full::new(Bytes::from_static(body)))
        .unwrap();
    client::text(client::send(c, req).await).await.0.as_u16()
}

async fn reloaded(gw: &Gateway, text: &str, n: usize) {
    std::fs::write(&gw.config, text).unwrap();
    gw.signal("HUP");
    let want = format!("leasegate_config_reloads_total{{result=\"ok\"}} {n}");
    crate::support::eventually(
        Duration::from_secs(5),
        async || gw.metrics().await.contains(&want).then_some(()),
        || format!("no reload {n}:\n{}", gw.log()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_the_verdicts_and_stops_the_checks_it_replaces() {
    let (a, b) = (pod(0).await, pod(0).await);
    let checked = checked_pair(&a, &b);
    let gw = Gateway::start(&checked);
    a.healthy.store(false, Ordering::SeqCst);
    gauge_becomes(&gw, &a, 0.0).await;

    // The same checks: the target stays out, and one task checks it.
    reloaded(&gw, &checked, 1).await;
    let m = gw.metrics().await;
    assert_eq!(up_gauge(&m, "pair", &a.addr.to_string()), Some(0.0), "{m}");
    let before = a.checks.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let checks = a.checks.load(Ordering::SeqCst) - before;
    assert!((5..=13).contains(&checks), "{checks} checks in 1 s at 100 ms");

    // Checks removed: the target is back and nobody checks it.
    let unchecked = checked.replace(
        "health = { path = \"/healthz\", interval_ms = 100, timeout_ms = 100, unhealthy = 2, healthy = 2 }\n",
        "",
    );
    assert_ne!(unchecked, *checked);
    reloaded(&gw, &unchecked, 2).await;
    gauge_becomes(&gw, &a, 1.0).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = a.checks.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        a.checks.load(Ordering::SeqCst),
        before,
        "checks go on after they were removed"
    );
    send(&gw, 4).await;
    assert_eq!(a.served.load(Ordering::SeqCst), 2);
}
