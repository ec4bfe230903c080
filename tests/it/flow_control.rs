//! HTTP/2 flow control cannot pin an upstream: a client that grants its
//! streams no window (`SETTINGS_INITIAL_WINDOW_SIZE = 0`) and opens many
//! of them holds at most its share of the upstream's `max_in_flight`, and
//! each stalled stream is reset (`RST_STREAM` `CANCEL`) once its response
//! has waited `idle_timeout_ms` on its own window, while the client keeps
//! other streams moving on the same connection.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;

use crate::support::{client, upstream, Gateway, Toml};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_window_client_cannot_pin_the_upstream() {
    const IDLE_MS: u64 = 2_000;
    let up = upstream::start("u").await;
    let gw = Gateway::start(
        &Toml::new()
            .gateway(&format!(
                "workers = 1\naccess_log = \"off\"\nidle_timeout_ms = {IDLE_MS}"
            ))
            .upstream("u", &up.target())
            .with("max_in_flight = 8")
            .forward("all", "/", "u"),
    );
    let tcp = tokio::net::TcpStream::connect(gw.http()).await.unwrap();
    let (mut h2, conn) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, Bytes>(tcp)
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let uri = format!("http://{}/big?mb=1", gw.http());
    let mut pending = Vec::new();
    for _ in 0..64 {
        h2 = h2.ready().await.unwrap();
        let req = Request::get(uri.as_str()).body(()).unwrap();
        let (resp, _) = h2.send_request(req, true).unwrap();
        pending.push(resp);
    }
    let mut stalled = Vec::new();
    let mut statuses = Vec::new();
    for resp in pending {
        let resp = tokio::time::timeout(Duration::from_secs(5), resp)
            .await
            .expect("a response head (headers need no window)")
            .unwrap();
        statuses.push(resp.status().as_u16());
        stalled.push(resp.into_body());
    }
    let heads = Instant::now();
    // A sibling that keeps moving: a new stream every 200 ms on the same
    // connection (its first frame is taken), so no connection-wide clock
    // sees the connection as stalled.
    let sibling = {
        let mut h2 = h2.clone();
        let uri = uri.clone();
        tokio::spawn(async move {
            let mut kept = Vec::new();
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let Ok(ready) = h2.ready().await else { return };
                h2 = ready;
                let req = Request::get(uri.as_str()).body(()).unwrap();
                let Ok((resp, _)) = h2.send_request(req, true) else {
                    return;
                };
                kept.push(resp);
            }
        })
    };

    // Another client is served by the same upstream meanwhile.
    let mut other = client::http1_from("127.0.0.2", gw.http()).await;
    let started = Instant::now();
    let resp = tokio::time::timeout(
        Duration::from_secs(3),
        client::send(&mut other, client::get("/big?mb=1")),
    )
    .await
    .expect("another client is answered within 3 s");
    let (status, _, body) = client::text(resp).await;
    assert_eq!(status, 200, "{statuses:?}");
    assert_eq!(body.len(), 1 << 20);
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    assert!(
        statuses.iter().filter(|s| **s == 200).count() <= 1,
        "the zero-window client holds its share (1 of 8) at most: {statuses:?}"
    );

    // Every stalled stream is reset, CANCEL, within idle_timeout_ms + 1 s.
    let deadline = heads + Duration::from_millis(IDLE_MS + 1_000);
    for (i, mut body) in stalled.into_iter().enumerate() {
        let got = tokio::time::timeout_at(deadline.into(), body.data()).await;
        let Ok(Some(Err(e))) = got else {
            panic!("stream {i} ({}): not reset by {IDLE_MS} ms + 1 s: {got:?}", statuses[i]);
        };
        assert_eq!(e.reason(), Some(h2::Reason::CANCEL), "stream {i}: {e}");
    }
    assert!(!sibling.is_finished(), "the connection lives on");
    sibling.abort();
}

/// A response whose upstream body has ended gives its place back then,
/// though its last frame still waits on the client's window: a client
/// holding 8 such streams (its share: all 8 places here) does not keep a
/// second client from the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_place_comes_back_when_the_upstream_body_ends() {
    let up = upstream::start("u").await;
    let gw = Gateway::start(
        &Toml::new()
            .gateway("workers = 1\naccess_log = \"off\"\nidle_timeout_ms = 10000")
            .upstream("u", &up.target())
            .with("max_in_flight = 8\nmax_in_flight_per_client = 8")
            .forward("all", "/", "u"),
    );
    let tcp = tokio::net::TcpStream::connect(gw.http()).await.unwrap();
    let (mut h2, conn) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, Bytes>(tcp)
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let uri = format!("http://{}/small", gw.http());
    let mut held = Vec::new();
    for _ in 0..8 {
        h2 = h2.ready().await.unwrap();
        let (resp, _) = h2
            .send_request(Request::get(uri.as_str()).body(()).unwrap(), true)
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(5), resp)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(resp.status(), 200);
        held.push(resp.into_body());
    }
    let mut other = client::http1_from("127.0.0.2", gw.http()).await;
    let (status, _, body) = client::text(client::send(&mut other, client::get("/small")).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, "upstream u ok");
    drop(held);
}

/// A WebSocket upgrade from `127.0.0.N`: the status of its answer, and the
/// connection (a tunnel while it lives).
async fn websocket_from(gw: &Gateway, n: u8) -> (u16, tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(std::net::SocketAddr::from(([127, 0, 0, n], 0))).unwrap();
    let mut s = socket.connect(gw.http()).await.unwrap();
    s.write_all(
        b"GET /ws HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut byte))
            .await
            .unwrap()
            .unwrap();
        head.push(byte[0]);
    }
    let status = String::from_utf8_lossy(&head[9..12]).parse().unwrap_or(0);
    (status, s)
}

/// WebSocket tunnels hold their client's places for their life: a client
/// holding its share (2 of 16) in tunnels gets `503` for a third, while
/// another client still opens one; closing a tunnel gives its place back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_count_against_their_clients_share() {
    let up = upstream::start("u").await;
    let gw = Gateway::start(
        &Toml::new()
            .gateway("workers = 1\naccess_log = \"off\"")
            .upstream("u", &up.target())
            .with("max_in_flight = 16")
            .forward("all", "/", "u"),
    );
    let (a, ta) = websocket_from(&gw, 1).await;
    let (b, _tb) = websocket_from(&gw, 1).await;
    assert_eq!((a, b), (101, 101));
    let (third, _) = websocket_from(&gw, 1).await;
    assert_eq!(third, 503, "two tunnels are 127.0.0.1's share of 16");
    let (other, _to) = websocket_from(&gw, 2).await;
    assert_eq!(other, 101, "another client opens its own");
    drop(ta);
    let mut again = 0;
    for _ in 0..50 {
        again = websocket_from(&gw, 1).await.0;
        if again == 101 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(again, 101, "a closed tunnel gives its place back");
}
