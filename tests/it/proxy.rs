//! The gateway as a reverse proxy, driven through the real binary with real
//! upstreams and clients.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper::body::Frame;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{self, client, upstream, Gateway, Toml};

fn config(targets: &[String], extra_routes: &str) -> String {
    let targets: Vec<String> = targets.iter().map(|t| format!("{t:?}")).collect();
    format!(
        r#"
[gateway]
workers = 2
grace_period_ms = 5000

[listeners]
http = "127.0.0.1:0"
https = "127.0.0.1:0"
admin = "127.0.0.1:0"

[tls]
cert = "{{cert}}"
key = "{{key}}"
client_hello_timeout_ms = 1000

[[upstreams]]
name = "backend"
targets = [{}]
request_timeout_ms = 5000

[[routes]]
name = "api"
path_prefix = "/"
upstream = "backend"

[[routes]]
name = "direct"
path_prefix = "/direct"
response = {{ status = 201, body = "made here", headers = {{ "x-demo" = "yes" }} }}

[[routes]]
name = "only-post"
path_prefix = "/post-only"
methods = ["POST"]
response = {{ status = 200, body = "posted" }}
{extra_routes}
"#,
        targets.join(", ")
    )
}

async fn json(resp: http::Response<hyper::body::Incoming>) -> serde_json::Value {
    let (status, _, body) = client::text(resp).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_keep_alive_forwards_with_proxy_headers() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&config(&[up.target()], ""));
    let mut c = client::http1(gw.http()).await;

    for i in 0..3 {
        let req = Request::get("/headers?n=1")
            .header("host", "api.example.com")
            .header("x-forwarded-for", "203.0.113.7")
            .header("x-leasegate-identity", "user:forged")
            .header("connection", "keep-alive, x-hop")
            .header("x-hop", "must not pass")
            .header("x-request-id", format!("req-{i}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = client::send(&mut c, req).await;
        assert_eq!(resp.headers()["x-request-id"], format!("req-{i}").as_str());
        let v = json(resp).await;
        let h = &v["headers"];
        assert_eq!(v["path"], "/headers?n=1");
        assert_eq!(h["host"][0], "api.example.com");
        assert_eq!(h["x-forwarded-for"][0], "203.0.113.7, 127.0.0.1");
        assert_eq!(h["x-forwarded-proto"][0], "http");
        assert_eq!(h["x-request-id"][0], format!("req-{i}").as_str());
        assert_eq!(
            h["x-leasegate-identity"],
            serde_json::json!(["subnet:127.0.0.0/24"]),
            "client-sent x-leasegate-* must be replaced by ours: {v}"
        );
        assert!(
            h.get("x-hop").is_none(),
            "headers named by Connection are hop-by-hop: {v}"
        );
    }
    // One client connection carried all three, and the gateway reused its
    // upstream connection.
    assert_eq!(up.requests.load(Ordering::SeqCst), 3);
    assert_eq!(up.connections.load(Ordering::SeqCst), 1);

    // A request without an id gets one, both upstream and in the response.
    let resp = client::send(&mut c, client::get("/headers")).await;
    let id = resp.headers()["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(id.len(), 32);
    let v = json(resp).await;
    assert_eq!(v["headers"]["x-request-id"][0], id.as_str());

    // Hop-by-hop response headers from the upstream are dropped.
    let resp = client::send(&mut c, client::get("/plain")).await;
    assert!(resp.headers().get("keep-alive").is_none());
    assert_eq!(resp.headers()["x-upstream"], "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_responses_no_route_and_methods() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&config(&[up.target()], ""));
    let mut c = client::http1(gw.http()).await;

    let (status, headers, body) = client::text(client::send(&mut c, client::get("/direct/x")).await).await;
    assert_eq!((status.as_u16(), body.as_str()), (201, "made here"));
    assert_eq!(headers["x-demo"], "yes");
    assert_eq!(up.requests.load(Ordering::SeqCst), 0);

    // GET on a POST-only route falls back to the catch-all upstream route.
    let (_, _, body) = client::text(client::send(&mut c, client::get("/post-only")).await).await;
    assert_eq!(body, "upstream a ok");
    let post = Request::post("/post-only")
        .header("host", "x")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (_, _, body) = client::text(client::send(&mut c, post).await).await;
    assert_eq!(body, "posted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_route_is_a_404_problem() {
    let gw = Gateway::start(
        r#"
[listeners]
http = "127.0.0.1:0"

[[routes]]
name = "v1"
path_prefix = "/v1/"
response = { status = 200, body = "v1" }
"#,
    );
    let mut c = client::http1(gw.http()).await;
    let (status, headers, body) = client::text(client::send(&mut c, client::get("/v2/x")).await).await;
    assert_eq!(status, 404);
    assert_eq!(headers["content-type"], "application/problem+json");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], 404);
    assert_eq!(v["title"], "No route");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_across_targets() {
    let a = upstream::start("a").await;
    let b = upstream::start("b").await;
    let gw = Gateway::start(&config(&[a.target(), b.target()], ""));
    let mut c = client::http1(gw.http()).await;
    let mut seen = Vec::new();
    for _ in 0..4 {
        let (_, _, body) = client::text(client::send(&mut c, client::get("/rr")).await).await;
        seen.push(body);
    }
    seen.sort();
    assert_eq!(
        seen,
        ["upstream a ok", "upstream a ok", "upstream b ok", "upstream b ok"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_over_tls_by_alpn() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&config(&[up.target()], ""));
    let cert = gw.cert.as_ref().unwrap().cert_pem.clone();

    let (mut h2, alpn) = client::h2_tls(gw.https(), &cert).await;
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    let uri = format!("https://localhost:{}/headers", gw.https().port());
    let req = Request::get(&uri).body(Full::new(Bytes::new())).unwrap();
    let resp = h2.send_request(req).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let v = json(resp).await;
    assert_eq!(v["headers"]["x-forwarded-proto"][0], "https");
    assert_eq!(
        v["headers"]["host"][0],
        format!("localhost:{}", gw.https().port()).as_str()
    );
    assert_eq!(v["version"], "HTTP/1.1");

    // An HTTP/1.1-only client gets HTTP/1.1 on the same listener.
    let stream = client::tls(gw.https(), &cert, &[b"http/1.1"]).await;
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (mut h1, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let (status, _, body) = client::text(h1.send_request(client::get("/direct")).await.unwrap()).await;
    assert_eq!((status.as_u16(), body.as_str()), (201, "made here"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_http2_over_tls() {
    support::require_tool("curl", "apt-get install -y curl");
    let up = upstream::start("a").await;
    let gw = Gateway::start(&config(&[up.target()], ""));
    let cert = gw.dir.path().join("cert.pem");
    let url = format!("https://localhost:{}/direct", gw.https().port());
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--http2", "--max-time", "10", "--cacert"])
        .arg(&cert)
        .args(["-w", "\n%{http_version} %{http_code}", &url])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout, "made here\n2 201");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_by_prior_knowledge() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&config(&[up.target()], ""));
    let mut h2 = client::h2c(gw.http()).await;
    let uri = format!("http://127.0.0.1:{}/headers", gw.http().port());
    let resp = h2
        .send_request(Request::get(&uri).body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let v = json(resp).await;
    assert_eq!(v["headers"]["x-forwarded-proto"][0], "http");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_mib_post_streams_and_round_trips_its_hash() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&config(&[up.target()], ""));
    let chunk: Vec<u8> = (0..64 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    let chunks = 80; // 80 × 64 KiB = 5 MiB
    let mut expected = Sha256::new();
    for _ in 0..chunks {
        expected.update(&chunk);
    }
    let expected: String = expected.finalize().iter().map(|b| format!("{b:02x}")).collect();

    // The body is produced chunk by chunk while the request is in flight.
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(2);
    let data = Bytes::from(chunk);
    tokio::spawn(async move {
        for _ in 0..chunks {
            if tx.send(data.clone()).await.is_err() {
                return;
            }
        }
    });
    let body = ChannelBody(rx);
    let stream = TcpStream::connect(gw.http()).await.unwrap();
    let (mut c, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::post("/sha256").header("host", "x").body(body).unwrap();
    let resp = c.send_request(req).await.unwrap();
    let (status, _, text) = client::text(resp).await;
    assert_eq!(status, 200);
    assert_eq!(text, format!("{expected} {}", 5 * 1024 * 1024));

    // And over HTTP/2 with TLS, as one buffer.
    let cert = gw.cert.as_ref().unwrap().cert_pem.clone();
    let (mut h2, _) = client::h2_tls(gw.https(), &cert).await;
    let big = Bytes::from(vec![42u8; 5 * 1024 * 1024]);
    let want: String = Sha256::digest(&big).iter().map(|b| format!("{b:02x}")).collect();
    let uri = format!("https://localhost:{}/sha256", gw.https().port());
    let resp = h2
        .send_request(Request::post(&uri).body(Full::new(big)).unwrap())
        .await
        .unwrap();
    let (_, _, text) = client::text(resp).await;
    assert_eq!(text, format!("{want} {}", 5 * 1024 * 1024));
}

/// A request body fed chunk by chunk from a channel while in flight.
struct ChannelBody(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.get_mut().0.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b))))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_upgrade_is_tunnelled() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&config(&[up.target()], ""));
    let mut s = TcpStream::connect(gw.http()).await.unwrap();
    s.write_all(
        b"GET /ws HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    for msg in [&b"ping-1"[..], b"second message"] {
        s.write_all(msg).await.unwrap();
        let mut back = vec![0u8; msg.len()];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut back))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(back, msg);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_upstream_port_is_a_502_problem() {
    let target = format!("http://127.0.0.1:{}", support::closed_port());
    let gw = Gateway::start(&config(&[target], ""));
    let mut c = client::http1(gw.http()).await;
    let (status, headers, body) = client::text(client::send(&mut c, client::get("/x")).await).await;
    assert_eq!(status, 502);
    assert_eq!(headers["content-type"], "application/problem+json");
    assert!(body.contains("unreachable"), "{body}");
    let metrics = gw.admin_get("/metrics").await;
    assert!(
        metrics.contains(r#"leasegate_upstream_errors_total{upstream="backend",kind="unreachable"} 1"#),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_upstream_is_a_504_problem() {
    let up = upstream::start("a").await;
    let extra = format!(
        r#"
[[upstreams]]
name = "impatient"
targets = ["{}"]
request_timeout_ms = 300

[[routes]]
name = "slow"
path_prefix = "/slow"
upstream = "impatient"
"#,
        up.target()
    );
    let gw = Gateway::start(&config(&[up.target()], &extra));
    let mut c = client::http1(gw.http()).await;
    // Each request on a kept-alive connection has the whole
    // `request_timeout_ms` from its own start, whether the one before was
    // quick, took half of it, or the connection was idle in between (a
    // deadline carried over from the first request fails the fourth at the
    // latest). 150 ms of 300 leaves a loaded CI machine its margin.
    for (ms, idle) in [(0, 0), (150, 0), (150, 0), (150, 0), (0, 500), (150, 0)] {
        tokio::time::sleep(Duration::from_millis(idle)).await;
        let (status, _, body) = client::text(client::send(&mut c, client::get(&format!("/slow?ms={ms}"))).await).await;
        assert_eq!(status, 200, "{ms} ms after {idle} ms idle: {body}");
    }
    let started = Instant::now();
    let (status, headers, body) = client::text(client::send(&mut c, client::get("/slow?ms=3000")).await).await;
    assert_eq!(status, 504, "{body}");
    assert_eq!(headers["content-type"], "application/problem+json");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(290) && took < Duration::from_millis(2000),
        "took {took:?}"
    );

    // Concurrent HTTP/2 streams have a deadline each: one times out, the
    // other is answered.
    let h2 = client::h2c(gw.http()).await;
    let port = gw.http().port();
    let send = |ms: u64| {
        let mut h2 = h2.clone();
        let req = Request::get(format!("http://127.0.0.1:{port}/slow?ms={ms}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        tokio::spawn(async move {
            let started = Instant::now();
            let (status, _, _) = client::text(h2.send_request(req).await.unwrap()).await;
            (status, started.elapsed())
        })
    };
    let (slow, quick) = (send(3000), send(150));
    let ((slow, slow_took), (quick, quick_took)) = (slow.await.unwrap(), quick.await.unwrap());
    assert_eq!(
        (slow, quick),
        (http::StatusCode::GATEWAY_TIMEOUT, http::StatusCode::OK),
        "after {slow_took:?} and {quick_took:?}"
    );
    assert!(slow_took < Duration::from_millis(2000), "took {slow_took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_request_head_is_refused() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&config(&[up.target()], "").replace("[gateway]\n", "[gateway]\nmax_header_bytes = 8192\n"));
    let mut s = TcpStream::connect(gw.http()).await.unwrap();
    let big = "a".repeat(20_000);
    let req = format!("GET / HTTP/1.1\r\nHost: x\r\nx-big: {big}\r\n\r\n");
    let _ = s.write_all(req.as_bytes()).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 431"), "{out}");
    assert_eq!(up.requests.load(Ordering::SeqCst), 0);
}

/// `pool_idle_timeout_ms`: a pooled upstream connection is reused while
/// younger than it, and not after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_pooled_connection_is_reused_until_its_idle_timeout() {
    let up = upstream::start("a").await;
    // One worker, so one upstream pool.
    let cfg = config(&[up.target()], "")
        .replace("workers = 2", "workers = 1")
        .replace(
            "request_timeout_ms = 5000",
            "request_timeout_ms = 5000\npool_idle_timeout_ms = 400",
        );
    let gw = Gateway::start(&cfg);
    let mut c = client::http1(gw.http()).await;
    for _ in 0..2 {
        let (status, _, body) = client::text(client::send(&mut c, client::get("/plain")).await).await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(up.connections.load(Ordering::SeqCst), 1, "reused while fresh");
    tokio::time::sleep(Duration::from_millis(900)).await;
    let (status, _, body) = client::text(client::send(&mut c, client::get("/plain")).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        up.connections.load(Ordering::SeqCst),
        2,
        "not reused after its idle timeout"
    );
}

/// A chunked request body whose chunk size is not hex, or does not fit in 64
/// bits, is the client's error: a 400 problem, never a 502 counted against
/// the upstream. The upstream connection the body broke off on is closed,
/// not pooled for the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_chunked_body_is_a_400_and_its_upstream_connection_is_dropped() {
    let up = upstream::start("a").await;
    // One worker, so one upstream pool: a reused connection would show.
    let gw = Gateway::start(&config(&[up.target()], "").replace("workers = 2", "workers = 1"));

    // A valid chunked body goes through, and leaves its connection pooled.
    let out = raw_post_chunked(&gw, "Connection: close\r\n", "5\r\nhello\r\n0\r\n\r\n").await;
    let hello: String = Sha256::digest(b"hello").iter().map(|b| format!("{b:02x}")).collect();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.ends_with(&format!("{hello} 5")), "{out}");
    assert_eq!(up.connections.load(Ordering::SeqCst), 1);

    // 20 hex digits: above 2^64.
    for size in ["zz", "ffffffffffffffffffff"] {
        let before = up.connections.load(Ordering::SeqCst);
        // No `Connection: close`: the gateway closes by itself, as the
        // stream's framing is lost.
        let out = raw_post_chunked(&gw, "", &format!("{size}\r\nhello\r\n0\r\n\r\n")).await;
        assert!(out.starts_with("HTTP/1.1 400"), "chunk size {size:?}: {out}");
        assert!(out.contains("content-type: application/problem+json"), "{out}");
        assert!(out.contains(r#""status":400"#), "{out}");
        assert!(out.contains("chunk size"), "the detail says what was wrong: {out}");

        // The next request, from a fresh client, is served on a new
        // upstream connection: the one the bad body broke off on is gone.
        let mut c = client::http1(gw.http()).await;
        let (status, _, body) = client::text(client::send(&mut c, client::get("/plain")).await).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body, "upstream a ok");
        assert_eq!(up.connections.load(Ordering::SeqCst), before + 1, "chunk size {size:?}");
    }

    let metrics = gw.metrics().await;
    assert!(
        !metrics.contains("leasegate_upstream_errors_total{"),
        "a client's bad body is not an upstream error: {metrics}"
    );
    assert_eq!(
        support::sample(&metrics, r#"leasegate_requests_total{route="api",status="400"} "#),
        2.0
    );
    assert_eq!(
        support::sample(&metrics, r#"leasegate_requests_total{route="api",status="502"} "#),
        0.0
    );
}

/// A chunked POST to the upstream's `/sha256` over a raw connection; all the
/// gateway sends back until it closes the connection.
async fn raw_post_chunked(gw: &Gateway, extra_headers: &str, body: &str) -> String {
    let mut s = TcpStream::connect(gw.http()).await.unwrap();
    let req = format!("POST /sha256 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n{extra_headers}\r\n{body}");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .expect("the gateway closes the connection")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_garbage_and_stalled_clients_are_dropped_without_harming_others() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&config(&[up.target()], ""));
    let cert = gw.cert.as_ref().unwrap().cert_pem.clone();

    // A stalled client: connects, sends half a record header, then nothing.
    let mut stalled = TcpStream::connect(gw.https()).await.unwrap();
    stalled.write_all(&[0x16, 0x03]).await.unwrap();

    // Plain HTTP on the TLS port is dropped at once.
    let mut plain = TcpStream::connect(gw.https()).await.unwrap();
    plain.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_millis(900), plain.read_to_end(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "garbage must be dropped before the hello deadline"
    );

    // Random bytes that look like a handshake record header, then junk.
    let mut junk = TcpStream::connect(gw.https()).await.unwrap();
    junk.write_all(&[0x16, 0x03, 0x01, 0x00, 0x08, 0x02, 0, 0, 4, 1, 2, 3, 4])
        .await
        .unwrap();

    // Meanwhile a real client is served.
    let (mut h2, _) = client::h2_tls(gw.https(), &cert).await;
    let uri = format!("https://localhost:{}/direct", gw.https().port());
    let (status, _, _) = client::text(
        h2.send_request(Request::get(&uri).body(Full::new(Bytes::new())).unwrap())
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 201);

    // The stalled one is cut at the deadline (1 s in this config).
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(5), stalled.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "stalled client must be dropped: {read:?}"
    );

    // The client sees the close a moment before the failure is counted.
    let want = [
        r#"leasegate_tls_handshake_failures_total{reason="not_client_hello"} 2"#,
        r#"leasegate_tls_handshake_failures_total{reason="timeout"} 1"#,
    ];
    let (gw_ref, want_ref) = (&gw, &want);
    crate::support::eventually(
        Duration::from_secs(5),
        || async move {
            let metrics = gw_ref.admin_get("/metrics").await;
            want_ref.iter().all(|w| metrics.contains(w)).then_some(())
        },
        || format!("{want:?} in the metrics:\n{}", gw.log()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_tell_the_truth() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&config(&[up.target()], ""));
    assert_eq!(gw.admin_get("/healthz").await, "ok\n");
    assert_eq!(gw.admin_get("/readyz").await, "ready\nstore memory: ok\n");
    let v: serde_json::Value = serde_json::from_str(&gw.admin_get("/config").await).unwrap();
    let file = std::fs::read(&gw.config).unwrap();
    let sha: String = Sha256::digest(&file).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(v["sha256"], sha.as_str());
    assert_eq!(v["routes"].as_array().unwrap().len(), 3);
    assert!(v["loaded_at"].as_str().unwrap().ends_with('Z'));
    // Requests are counted and timed per route and status.
    let mut c = client::http1(gw.http()).await;
    client::send(&mut c, client::get("/direct")).await;
    client::text(client::send(&mut c, client::get("/headers")).await).await;
    let metrics = gw.admin_get("/metrics").await;
    assert!(metrics.contains("leasegate_connections_open"), "{metrics}");
    for want in [
        r#"leasegate_requests_total{route="direct",status="201"} 1"#,
        r#"leasegate_request_duration_seconds_count{route="direct",status="201"} 1"#,
        r#"leasegate_request_duration_seconds_bucket{le="+Inf",route="direct",status="201"} 1"#,
        r#"leasegate_requests_total{route="api",status="200"} 1"#,
        "leasegate_circuit_open 0",
        "# TYPE leasegate_store_call_seconds histogram",
    ] {
        assert!(metrics.contains(want), "{want} in {metrics}");
    }
    assert!(metrics.ends_with("# EOF\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_an_in_flight_request_then_exits_zero() {
    let up = upstream::start("a").await;
    let mut gw = Gateway::start(&config(&[up.target()], ""));
    let mut c = client::http1(gw.http()).await;
    let in_flight = tokio::spawn(async move {
        let resp = client::send(&mut c, client::get("/slow?ms=1500")).await;
        client::text(resp).await
    });
    // Wait until the upstream has the request, then ask the gateway to stop.
    let requests = &up.requests;
    crate::support::eventually(
        Duration::from_secs(5),
        || async move { (requests.load(Ordering::SeqCst) > 0).then_some(()) },
        || "the upstream never had the request".into(),
    )
    .await;
    gw.signal("TERM");
    assert!(gw.wait_for_log("shutting down", Duration::from_secs(5)), "{}", gw.log());

    // New connections are no longer accepted.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        TcpStream::connect(gw.http()).await.is_err(),
        "listener must be closed while draining"
    );

    let (status, _, body) = tokio::time::timeout(Duration::from_secs(5), in_flight)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((status.as_u16(), body.as_str()), (200, "slow done"));
    let status = tokio::task::spawn_blocking(move || {
        let s = gw.wait_exit(Duration::from_secs(10));
        (s, gw.log())
    })
    .await
    .unwrap();
    assert_eq!(status.0.and_then(|s| s.code()), Some(0), "{}", status.1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_idle_keep_alive_connections_at_once() {
    let up = upstream::start("a").await;
    let mut gw = Gateway::start(&config(&[up.target()], ""));
    // One request on a keep-alive connection, read to its end; then the
    // connection sits idle.
    let mut idle = TcpStream::connect(gw.http()).await.unwrap();
    idle.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n").await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).ends_with("upstream a ok") {
        let n = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed before the response: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(seen.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&seen));

    let stopping = Instant::now();
    gw.signal("TERM");
    // Closed at once, not when the 5 s grace period runs out.
    let read = tokio::time::timeout(Duration::from_secs(3), idle.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "an idle connection must be closed on shutdown: {read:?}"
    );
    let (status, log) = tokio::task::spawn_blocking(move || (gw.wait_exit(Duration::from_secs(10)), gw.log()))
        .await
        .unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{log}");
    assert!(
        stopping.elapsed() < Duration::from_secs(4),
        "exit took {:?}: the drain waited for the idle connection",
        stopping.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_half_preface_clients_lose_their_slot() {
    let up = upstream::start("a").await;
    let cfg = config(&[up.target()], "").replace(
        "[gateway]\n",
        "[gateway]\nheader_read_timeout_ms = 400\nmax_connections = 3\n",
    );
    let gw = Gateway::start(&cfg);
    let cert = gw.cert.as_ref().unwrap().cert_pem.clone();
    // Three connections that never send a request: silence, one byte of an
    // HTTP/2 preface, and a TLS client that agrees h2 and then says nothing.
    let mut silent = TcpStream::connect(gw.http()).await.unwrap();
    let mut half = TcpStream::connect(gw.http()).await.unwrap();
    half.write_all(b"P").await.unwrap();
    let mut tls_quiet = client::tls(gw.https(), &cert, &[b"h2"]).await;
    for (name, read) in [
        (
            "silent",
            tokio::time::timeout(Duration::from_secs(5), silent.read(&mut [0u8; 8])).await,
        ),
        (
            "half preface",
            tokio::time::timeout(Duration::from_secs(5), half.read(&mut [0u8; 8])).await,
        ),
        (
            "quiet tls",
            tokio::time::timeout(Duration::from_secs(5), tls_quiet.read(&mut [0u8; 8])).await,
        ),
    ] {
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "{name} client must be dropped: {read:?}"
        );
    }
    // All three slots are free again: three new clients are served at once.
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(client::http1(gw.http()).await);
    }
    for c in &mut clients {
        let (status, _, _) = client::text(client::send(c, client::get("/direct")).await).await;
        assert_eq!(status, 201);
    }
}

/// A certificate replaced on disk is served to the next handshake, with
/// no restart; a bad one is refused like any invalid edit, keeping the
/// pair in force and saying so on `/config`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_swapped_on_disk_is_served_to_the_next_handshake() {
    let text = Toml::new()
        .listeners("https = \"127.0.0.1:0\"")
        .table("tls", "cert = \"{cert}\"\nkey = \"{key}\"")
        .respond("hello", "/", &[])
        .to_string();
    let gw = Gateway::start(&text);
    let first = gw.cert.as_ref().unwrap().cert_pem.clone();
    let leaf = |s: &client::TlsStream| s.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    let before = leaf(&client::tls(gw.https(), &first, &[b"http/1.1"]).await);

    // A renewal: a new pair written over the old files.
    let renewed = support::TestCert::new();
    std::fs::write(gw.dir.path().join("key.pem"), &renewed.key_pem).unwrap();
    std::fs::write(gw.dir.path().join("cert.pem"), &renewed.cert_pem).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let after = loop {
        // Trusting both: whichever the gateway serves, the handshake ends.
        let both = format!("{first}{}", renewed.cert_pem);
        let served = leaf(&client::tls(gw.https(), &both, &[b"http/1.1"]).await);
        if served != before {
            break served;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    use rustls_pki_types::pem::PemObject;
    let renewed_der = rustls_pki_types::CertificateDer::pem_slice_iter(renewed.cert_pem.as_bytes())
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(after, renewed_der.to_vec());

    // A broken certificate: refused, the renewed one stays.
    std::fs::write(gw.dir.path().join("cert.pem"), "not a certificate").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let v: serde_json::Value = serde_json::from_str(&gw.admin_get("/config").await).unwrap();
        if v["last_reload_failure"]["why"]
            .as_str()
            .is_some_and(|w| w.contains("tls.cert"))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the bad certificate was never refused: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let served = leaf(&client::tls(gw.https(), &renewed.cert_pem, &[b"http/1.1"]).await);
    assert_eq!(served, renewed_der.to_vec(), "the last good pair stays in force");
}
