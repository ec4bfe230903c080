//! Small holes closed (issue 40's "smaller ones"), each against the real
//! binary: what a client's `Connection` may strip, the admin listener's
//! health check, the region link's log.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{upstream, Gateway, Toml};

/// Sends raw request bytes on a new connection and reads the whole answer.
async fn raw(addr: std::net::SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// A client's `Connection` may name (and so strip before the upstream) a
/// field of its own, but not one the request was keyed or priced by, nor
/// its credentials: the upstream sees the tenant the limit counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_cannot_strip_what_the_request_was_keyed_or_priced_by() {
    let up = upstream::start("a").await;
    let toml = Toml::new()
        .upstream("backend", &up.target())
        .forward("api", "/", "backend")
        .with("limits = [\"per_tenant\", \"priced\"]")
        .limit("per_tenant", "100/min")
        .with("by = [\"header:x-tenant\"]")
        .limit("priced", "1000/min")
        .with("by = [\"route\"]\ncost = { reserve = \"header:x-units\" }");
    let gw = Gateway::start(&toml);
    let answer = raw(
        gw.http(),
        "GET /headers HTTP/1.1\r\nHost: gw\r\nX-Tenant: acme\r\nX-Units: 3\r\nX-Api-Key: k\r\nX-Own: 1\r\n\
         Connection: close, x-tenant, X-Units, x-api-key, x-own\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default().to_ascii_lowercase();
    for kept in ["\"x-tenant\"", "\"x-units\"", "\"x-api-key\""] {
        assert!(body.contains(kept), "{kept} was stripped: {body}");
    }
    assert!(
        !body.contains("\"x-own\""),
        "a field of the client's own is still hop-by-hop: {body}"
    );
}

/// The admin listener's 256 connections all held (idle clients, slow
/// scrapes, a flood): a health check still gets its answer, on a place
/// kept for probes, which serves nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_answers_while_every_admin_connection_is_held() {
    let gw = Gateway::start(&Toml::new().respond("all", "/", &[]));
    let admin = gw.admin();
    let mut held = Vec::new();
    for _ in 0..256 {
        let mut s = TcpStream::connect(admin).await.unwrap();
        // A head begun and never finished: the connection holds its place.
        s.write_all(b"GET /metrics HTTP/1.1\r\n").await.unwrap();
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    let health = raw(admin, &get("/healthz")).await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health:?}");
    let ready = raw(admin, &get("/readyz")).await;
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready:?}");
    let metrics = raw(admin, &get("/metrics")).await;
    assert!(metrics.starts_with("HTTP/1.1 503"), "{metrics:?}");
    drop(held);
}
