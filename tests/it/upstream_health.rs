//! Passive health and failover across an upstream's targets: a refused
//! connect is retried on another target, a failing target leaves the
//! rotation and comes back after its backoff, the last one never leaves.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{self, client, upstream, Gateway, Toml};

/// An upstream that answers every request `503` until healed, then `200`.
struct Flaky {
    addr: std::net::SocketAddr,
    healed: Arc<AtomicBool>,
    served: Arc<AtomicUsize>,
}

async fn flaky() -> Flaky {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let healed = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let (h, s) = (healed.clone(), served.clone());
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let (h, s) = (h.clone(), s.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut seen = Vec::new();
                // One request (no body) per connection, then close.
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                s.fetch_add(1, Ordering::SeqCst);
                let status = if h.load(Ordering::SeqCst) {
                    "200 OK"
                } else {
                    "503 Service Unavailable"
                };
                let resp = format!("HTTP/1.1 {status}\r\ncontent-length: 5\r\nconnection: close\r\n\r\nflaky");
                let _ = tcp.write_all(resp.as_bytes()).await;
            });
        }
    });
    Flaky { addr, healed, served }
}

async fn statuses(gw: &Gateway, n: usize) -> Vec<u16> {
    let mut c = client::http1(gw.http()).await;
    let mut out = Vec::new();
    for _ in 0..n {
        let resp = client::send(&mut c, client::get("/")).await;
        out.push(client::text(resp).await.0.as_u16());
    }
    out
}

fn up_gauge(metrics: &str, upstream: &str, target: &str) -> Option<f64> {
    let name = format!("leasegate_upstream_target_up{{upstream=\"{upstream}\",target=\"{target}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&name).and_then(|v| v.trim().parse().ok()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connect_is_retried_and_the_dead_target_ejected() {
    let alive = upstream::start("alive").await;
    let dead = format!("127.0.0.1:{}", support::closed_port());
    let toml = Toml::new()
        .gateway("workers = 2")
        .raw(&format!(
            "[[upstreams]]\nname = \"pair\"\ntargets = [\"http://{dead}\", \"{}\"]\neject_after = 5\n",
            alive.target()
        ))
        .forward("all", "/", "pair");
    let gw = Gateway::start(&toml);
    let m = gw.metrics().await;
    assert_eq!(up_gauge(&m, "pair", &dead), Some(1.0), "{m}");

    // Nothing was sent to the dead target: every request is retried on
    // the live one at once.
    let got = statuses(&gw, 20).await;
    assert!(got.iter().all(|&s| s == 200), "{got:?}\n{}", gw.log());
    assert_eq!(alive.requests.load(Ordering::SeqCst), 20);

    let m = gw.metrics().await;
    assert_eq!(up_gauge(&m, "pair", &dead), Some(0.0), "{m}");
    assert_eq!(up_gauge(&m, "pair", &alive.addr.to_string()), Some(1.0), "{m}");
    let log = gw.log();
    assert!(log.contains(&format!("target {dead} is unreachable")), "{log}");
    assert!(
        log.contains("upstream target ejected") && log.contains(&format!("target={dead}")),
        "{log}"
    );
    // At most eject_after connects were tried on it (one per worker's pool).
    let retried = log.matches("retried on another target").count();
    assert!((1..=5).contains(&retried), "{retried}\n{log}");

    // Per target: what each was sent, and how it failed.
    let series = |name: &str, labels: &str| -> f64 {
        let prefix = format!("{name}{{{labels}}} ");
        m.lines()
            .find_map(|l| l.strip_prefix(&prefix).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0.0)
    };
    let alive_t = alive.addr.to_string();
    assert_eq!(
        series(
            "leasegate_upstream_target_requests_total",
            &format!("upstream=\"pair\",target=\"{alive_t}\"")
        ),
        20.0,
        "{m}"
    );
    assert_eq!(
        series(
            "leasegate_upstream_target_requests_total",
            &format!("upstream=\"pair\",target=\"{dead}\"")
        ),
        retried as f64,
        "{m}"
    );
    assert_eq!(
        series(
            "leasegate_upstream_target_errors_total",
            &format!("upstream=\"pair\",target=\"{dead}\",kind=\"unreachable\"")
        ),
        retried as f64,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_target_leaves_the_rotation_and_comes_back_after_its_backoff() {
    let alive = upstream::start("alive").await;
    let bad = flaky().await;
    let lone = flaky().await;
    let toml = Toml::new()
        .gateway("workers = 1")
        .raw(&format!(
            "[[upstreams]]\nname = \"pair\"\ntargets = [\"http://{}\", \"{}\"]\neject_after = 3\neject_ms = 700\n",
            bad.addr,
            alive.target()
        ))
        .raw(&format!(
            "[[upstreams]]\nname = \"lone\"\ntargets = [\"http://{}\"]\neject_after = 3\neject_ms = 700\n",
            lone.addr
        ))
        .forward("lone", "/lone", "lone")
        .forward("all", "/", "pair");
    let gw = Gateway::start(&toml);

    let got = statuses(&gw, 16).await;
    // A 503 is an answer: passed on, not retried; after eject_after of
    // them the target is out and every request is 200.
    assert!(got.iter().filter(|&&s| s == 503).count() <= 3, "{got:?}");
    assert!(got[8..].iter().all(|&s| s == 200), "{got:?}");
    assert_eq!(bad.served.load(Ordering::SeqCst), 3);
    let m = gw.metrics().await;
    assert_eq!(up_gauge(&m, "pair", &bad.addr.to_string()), Some(0.0), "{m}");
    let statuses_counted = format!(
        "leasegate_upstream_target_errors_total{{upstream=\"pair\",target=\"{}\",kind=\"status\"}} 3",
        bad.addr
    );
    assert!(m.contains(&statuses_counted), "{m}");

    // Healed, it is back within one backoff: one trial, then its share.
    bad.healed.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let got = statuses(&gw, 6).await;
    assert!(got.iter().all(|&s| s == 200), "{got:?}");
    assert!(
        bad.served.load(Ordering::SeqCst) >= 5,
        "{}",
        bad.served.load(Ordering::SeqCst)
    );
    let m = gw.metrics().await;
    assert_eq!(up_gauge(&m, "pair", &bad.addr.to_string()), Some(1.0), "{m}");
    assert!(
        gw.log().contains("upstream target back in the rotation"),
        "{}",
        gw.log()
    );

    // The last target is never ejected: its answers pass on, as they are.
    let mut c = client::http1(gw.http()).await;
    for _ in 0..6 {
        let resp = client::send(&mut c, client::get("/lone")).await;
        assert_eq!(client::text(resp).await.0, 503);
    }
    assert_eq!(lone.served.load(Ordering::SeqCst), 6);
    let m = gw.metrics().await;
    assert_eq!(up_gauge(&m, "lone", &lone.addr.to_string()), Some(1.0), "{m}");
}
