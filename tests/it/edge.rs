//! The edge holds: a limit cannot be walked around by a request the
//! upstream would treat as the same one (paths, path parameters, case where
//! the route says so, HEAD for GET, hosts, absolute form), and
//! no single client holds the door (connections per address, idle and
//! stalled connections, an upstream's requests in flight). Against the real
//! binary, a real upstream and raw clients.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{client, sample, upstream, Gateway, Toml};

/// Sends raw request bytes on a new connection and reads the whole answer
/// (the request asks for `Connection: close`, or the server closes).
async fn raw(addr: std::net::SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn status(answer: &str) -> u16 {
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"))
}

fn get(path: &str, host: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
}

/// `/v1/login` limited by route, every path of `api.example.com` limited
/// by route, and everything else open, all forwarded to `target`.
fn walkaround_config(target: &str) -> Toml {
    Toml::new()
        .upstream("backend", target)
        .forward("login", "/v1/login", "backend")
        .with("limits = [\"login\"]")
        .forward("api-host", "/", "backend")
        .with("host = \"api.example.com\"\nlimits = [\"api_host\"]")
        .forward("open", "/", "backend")
        .limit("login", "2/min")
        .with("by = [\"route\"]")
        .limit("api_host", "1/min")
        .with("by = [\"route\"]")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_an_upstream_reads_as_the_limited_one_are_limited_by_it() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&walkaround_config(&up.target()));
    let addr = gw.http();
    for _ in 0..2 {
        assert_eq!(status(&raw(addr, &get("/v1/login", "open.example")).await), 200);
    }
    assert_eq!(status(&raw(addr, &get("/v1/login", "open.example")).await), 429);
    for path in [
        "/v1//login",
        "/v1/./login",
        "/v1/x/../login",
        "/v1/%6Cogin",
        "/v1/%6cogin",
        "//v1/login",
        "/v1/%2E/login",
        "/v1;x=1/login",
        "/v1/login;jsessionid=1",
    ] {
        let answer = raw(addr, &get(path, "open.example")).await;
        assert_eq!(status(&answer), 429, "{path}: {answer}");
    }
    for path in [
        "/v1%2Flogin",
        "/v1%5Clogin",
        "/v1/login%00",
        "/..",
        "/v1/../../login",
        "/v1/..;/login",
    ] {
        let answer = raw(addr, &get(path, "open.example")).await;
        assert_eq!(status(&answer), 400, "{path}: {answer}");
        assert!(answer.contains("application/problem+json"), "{answer}");
    }
    // The upstream gets the normal form, query unchanged.
    let answer = raw(addr, &get("/v1//y/./../%68eaders?a=%2f", "open.example")).await;
    assert_eq!(status(&answer), 200, "{answer}");
    assert!(answer.contains(r#""path":"/v1/headers?a=%2f""#), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_of_path_parameters_only_does_not_walk_past_the_route() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&walkaround_config(&up.target()));
    let addr = gw.http();
    for _ in 0..2 {
        assert_eq!(status(&raw(addr, &get("/v1/login", "open.example")).await), 200);
    }
    // Tomcat and Spring cut parameters, then merge slashes: each of these
    // is their /v1/login, so it is limited as /v1/login, not served by the
    // catch-all.
    for path in [
        "/v1/;x/login",
        "/;/v1/login",
        "/v1/x/;y/../login",
        "/;a=1/v1/;b;c/login;d",
    ] {
        let answer = raw(addr, &get(path, "open.example")).await;
        assert_eq!(status(&answer), 429, "{path}: {answer}");
    }
    // The upstream gets the normal form: the segments are gone.
    let answer = raw(addr, &get("/;x/v1/;/headers?q=%2f", "open.example")).await;
    assert_eq!(status(&answer), 200, "{answer}");
    assert!(answer.contains(r#""path":"/v1/headers?q=%2f""#), "{answer}");
}

/// `/v1/login` limited (2/min) by route without case, `/v1/items` limited
/// for GET only, everything else open.
fn case_and_head_config(target: &str) -> Toml {
    Toml::new()
        .upstream("backend", target)
        .forward("login", "/v1/login", "backend")
        .with("case_sensitive = false\nlimits = [\"login\"]")
        .forward("items", "/v1/items", "backend")
        .with("methods = [\"GET\"]\nlimits = [\"items\"]")
        .forward("open", "/", "backend")
        .limit("login", "2/min")
        .with("by = [\"route\"]")
        .limit("items", "2/min")
        .with("by = [\"route\"]")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_without_case_counts_every_spelling_on_one_limit() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&case_and_head_config(&up.target()));
    let addr = gw.http();
    assert_eq!(status(&raw(addr, &get("/V1/LOGIN", "a")).await), 200);
    assert_eq!(status(&raw(addr, &get("/v1/Login", "a")).await), 200);
    for path in ["/v1/login", "/V1/LOGIN", "/v1/lOGIN/x"] {
        let answer = raw(addr, &get(path, "a")).await;
        assert_eq!(status(&answer), 429, "{path}: {answer}");
    }
    // Other routes still mind case (the default).
    assert_eq!(status(&raw(addr, &get("/V1/ITEMS", "a")).await), 200);
    assert_eq!(status(&raw(addr, &get("/V1/ITEMS", "a")).await), 200);
    assert_eq!(status(&raw(addr, &get("/V1/ITEMS", "a")).await), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_on_a_get_only_route_counts_against_its_limit() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&case_and_head_config(&up.target()));
    let addr = gw.http();
    let head = "HEAD /v1/items HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    assert_eq!(status(&raw(addr, head).await), 200, "HEAD takes a token");
    assert_eq!(status(&raw(addr, &get("/v1/items", "a")).await), 200);
    assert_eq!(status(&raw(addr, &get("/v1/items", "a")).await), 429);
    let answer = raw(addr, head).await;
    assert_eq!(status(&answer), 429, "HEAD after GETs drained the limit: {answer}");
    // Other methods are still not the route's.
    let post = "POST /v1/items HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    assert_eq!(status(&raw(addr, post).await), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_are_compared_as_the_upstream_reads_them() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&walkaround_config(&up.target()));
    let addr = gw.http();
    assert_eq!(status(&raw(addr, &get("/a", "api.example.com")).await), 200);
    for host in [
        "api.example.com",
        "api.example.com.",
        "API.Example.com.:80",
        "api.example.com:8080",
    ] {
        let answer = raw(addr, &get("/a", host)).await;
        assert_eq!(status(&answer), 429, "{host}: {answer}");
    }
    // A host no route can name (an empty label, a stray colon) is refused,
    // not served through the catch-all.
    for host in ["api.example.com..", "api..example.com", "api.example.com:80:80"] {
        let answer = raw(addr, &get("/a", host)).await;
        assert_eq!(status(&answer), 400, "{host}: {answer}");
    }
    // Absolute form wins over Host, and Host is rewritten to it.
    let answer = raw(
        addr,
        "GET http://open.example/headers HTTP/1.1\r\nHost: api.example.com\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status(&answer), 200, "{answer}");
    assert!(answer.contains(r#""host":["open.example"]"#), "{answer}");
    let answer = raw(
        addr,
        "GET http://api.example.com/headers HTTP/1.1\r\nHost: open.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status(&answer), 429, "absolute form routes by its own host: {answer}");
    // Two Host lines: refused.
    let answer = raw(
        addr,
        "GET /headers HTTP/1.1\r\nHost: open.example\r\nHost: api.example.com\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status(&answer), 400, "{answer}");
    // A client's Connection header cannot strip Host after routing, and
    // only WebSocket upgrades go upstream.
    let answer = raw(
        addr,
        "GET /headers HTTP/1.1\r\nHost: open.example\r\nConnection: host, upgrade, http2-settings, close\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
    )
    .await;
    assert_eq!(status(&answer), 200, "{answer}");
    assert!(answer.contains(r#""host":["open.example"]"#), "{answer}");
    assert!(!answer.to_ascii_lowercase().contains("h2c"), "{answer}");
    assert!(!answer.contains("http2-settings"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_host_that_differs_from_authority_is_refused() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&walkaround_config(&up.target()));
    let mut h2 = client::h2c(gw.http()).await;
    let req = http::Request::get("http://open.example/headers")
        .header("host", "api.example.com")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let (status, _, body) = client::text(h2.send_request(req).await.unwrap()).await;
    assert_eq!(status, 400, "{body}");
    let req = http::Request::get("http://open.example/headers")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let (status, _, body) = client::text(h2.send_request(req).await.unwrap()).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""host":["open.example"]"#), "{body}");
}

/// Everything forwarded to `target`, with `extra_gateway` lines in
/// `[gateway]` and `extra_upstream` in the upstream.
fn door_config(target: &str, extra_gateway: &str, extra_upstream: &str) -> Toml {
    Toml::new()
        .gateway("workers = 2\nmax_connections = 600")
        .gateway(extra_gateway)
        .upstream("backend", target)
        .with(extra_upstream)
        .forward("open", "/", "backend")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_connection() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&door_config(&up.target(), "", ""));
    let addr = gw.http();
    // 600 idle connections from 127.0.0.1: the default cap of 256 per address holds.
    let mut held = Vec::new();
    for _ in 0..600 {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    // Another address still gets in, at once.
    let started = Instant::now();
    let mut other = tokio::time::timeout(Duration::from_secs(2), client::http1_from("127.0.0.2", addr))
        .await
        .expect("a second client connects");
    let resp = tokio::time::timeout(Duration::from_secs(2), client::send(&mut other, client::get("/")))
        .await
        .expect("a second client is answered within 2 s");
    assert_eq!(resp.status(), 200);
    assert!(started.elapsed() < Duration::from_secs(2));
    let metrics = gw.metrics().await;
    let refused = sample(&metrics, "leasegate_connections_refused_total{reason=\"per_ip\"} ");
    assert!(refused >= 600.0 - 256.0, "refused {refused}:\n{metrics}");
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_and_tunnels_close_after_the_idle_timeout() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&door_config(&up.target(), "idle_timeout_ms = 400", ""));
    let addr = gw.http();

    // HTTP/1.1 keep-alive with nothing in flight.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await.unwrap();
    let started = Instant::now();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "an idle keep-alive connection stayed open");
    let took = started.elapsed();
    assert!(String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 200"));
    assert!(
        took >= Duration::from_millis(350),
        "closed before its idle timeout: {took:?}"
    );

    // HTTP/2 with no open stream (hyper answers the peer's PINGs).
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    let conn = tokio::spawn(conn);
    let resp = sender.send_request(client::get("/")).await.unwrap();
    assert_eq!(resp.status(), 200);
    drop(resp);
    let ended = tokio::time::timeout(Duration::from_secs(5), conn).await;
    assert!(ended.is_ok(), "an idle HTTP/2 connection stayed open");

    // A WebSocket tunnel that moves no byte.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 101");
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "an idle tunnel stayed open");

    // The keep-alive connection, the HTTP/2 one and the tunnel.
    let metrics = gw.metrics().await;
    assert!(
        sample(&metrics, "leasegate_connections_idle_closed_total ") >= 3.0,
        "{metrics}"
    );
}

/// An upstream that sends its head and one byte of a 100-byte body, then
/// stalls with the connection open.
async fn stalling_upstream() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((mut s, _)) = listener.accept().await {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nx").await;
            open.push(s);
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upstream_body_ends_the_exchange() {
    let stall = stalling_upstream().await;
    let gw = Gateway::start(&door_config(
        &format!("http://{stall}"),
        "",
        "idle_timeout_ms = 500\nrequest_timeout_ms = 10000",
    ));
    let started = Instant::now();
    let answer = raw(gw.http(), &get("/", "a")).await;
    let took = started.elapsed();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        took < Duration::from_secs(4),
        "the client's connection was held {took:?}"
    );
    assert!(took >= Duration::from_millis(450), "{took:?}");
    let metrics = gw.metrics().await;
    assert_eq!(
        sample(
            &metrics,
            "leasegate_upstream_errors_total{upstream=\"backend\",kind=\"timeout\"} "
        ),
        1.0,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_in_flight_an_upstream_request_is_a_503_at_once() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&door_config(&up.target(), "", "max_in_flight = 1"));
    let addr = gw.http();
    let slow = tokio::spawn(async move { raw(addr, &get("/slow?ms=1500", "a")).await });
    // Wait until the slow request holds the place.
    let requests = &up.requests;
    crate::support::eventually(
        Duration::from_secs(5),
        || async move { (requests.load(std::sync::atomic::Ordering::SeqCst) > 0).then_some(()) },
        || "the slow request never reached the upstream".into(),
    )
    .await;
    let started = Instant::now();
    let answer = raw(addr, &get("/", "a")).await;
    assert_eq!(status(&answer), 503, "{answer}");
    assert!(answer.to_ascii_lowercase().contains("retry-after: 1"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(status(&slow.await.unwrap()), 200);
    // The place came back with the slow response's body.
    assert_eq!(status(&raw(addr, &get("/", "a")).await), 200);
    let metrics = gw.metrics().await;
    assert_eq!(
        sample(
            &metrics,
            "leasegate_upstream_errors_total{upstream=\"backend\",kind=\"busy\"} "
        ),
        1.0,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_networks_ceiling_is_refused_before_its_token_is_checked() {
    let gw = Gateway::start(
        &Toml::new()
            .table("identity.jwt", "algorithms = [\"HS256\"]\nsecret = \"dev-only-secret\"")
            .respond("api", "/", &["ceiling"])
            .limit("ceiling", "2/min")
            .with("by = [\"subnet/16/48\"]"),
    );
    // A forged token (wrong secret): it never verifies.
    let forged = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJtYWxsb3J5IiwiZXhwIjo0MTAyNDQ0ODAwfQ.\
                  c2lnbmF0dXJlLW9mLW5vLWtleS1hdC1hbGwtYWJjZGVmZ2hpams";
    let request = format!("GET / HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {forged}\r\nConnection: close\r\n\r\n");
    let statuses: Vec<u16> = {
        let mut out = Vec::new();
        for _ in 0..5 {
            out.push(status(&raw(gw.http(), &request).await));
        }
        out
    };
    assert_eq!(statuses, [200, 200, 429, 429, 429]);
    let gw_ref = &gw;
    crate::support::eventually(
        Duration::from_secs(5),
        || async move { (gw_ref.access_log().len() >= 5).then_some(()) },
        || format!("five access-log lines: {:#?}", gw.access_log()),
    )
    .await;
    // Workers write their lines in batches: put them in time order.
    let mut lines: Vec<serde_json::Value> = gw
        .access_log()
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    lines.sort_by(|a, b| a["timestamp"].as_str().cmp(&b["timestamp"].as_str()));
    assert_eq!(lines.len(), 5, "{lines:?}");
    // Served after the waterfall (the forged token fell through to the
    // subnet tier).
    assert_eq!(lines[0]["identity"], "subnet", "{lines:?}");
    assert_eq!(lines[1]["identity"], "subnet", "{lines:?}");
    // The ceiling's key is blocked once its bucket is empty: refused
    // before any identity, the token never looked at.
    for l in &lines[2..] {
        assert_eq!(l["identity"], "-", "{l}");
        assert_eq!(l["outcome"], "limited", "{l}");
        assert_eq!(l["status"], 429, "{l}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_ascii_byte_in_forwarded_for_does_not_hide_the_proxys_hop() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&format!(
        r#"
[listeners]
http = "127.0.0.1:0"

[identity]
trusted_proxies = ["127.0.0.0/8"]

[[upstreams]]
name = "backend"
targets = ["{}"]

[[routes]]
name = "open"
path_prefix = "/"
upstream = "backend"
"#,
        up.target()
    ));
    // The client wrote a non-ASCII byte; the trusted proxy appended the
    // client's address to the same line.
    let mut s = TcpStream::connect(gw.http()).await.unwrap();
    s.write_all(
        b"GET /headers HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: \xff\xfe, 203.0.113.9\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&out);
    assert_eq!(status(&answer), 200, "{answer}");
    assert!(
        answer.contains(r#""x-leasegate-identity":["subnet:203.0.113.0/24"]"#),
        "the proxy's hop names the client: {answer}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_loses_its_connection_and_its_place() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&door_config(&up.target(), "idle_timeout_ms = 500", "max_in_flight = 1"));
    let addr = gw.http();
    // 64 MiB, more than the socket buffers on both sides hold: the gateway
    // must wait for the client, which reads a little and then stops.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /big?mb=64 HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    // The stalled response holds the upstream's one place meanwhile.
    let busy = raw(addr, &get("/", "a")).await;
    assert_eq!(status(&busy), 503, "{busy}");
    // Within the idle timeout (and a tick), the gateway gives up on it:
    // the place comes back.
    crate::support::eventually(
        Duration::from_secs(5),
        || async move { (status(&raw(addr, &get("/", "a")).await) == 200).then_some(()) },
        || "the place never came back".into(),
    )
    .await;
    // And the stalled connection was closed: reading it now ends (whatever
    // was buffered, then EOF or a reset), instead of 64 MiB.
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the stalled connection stayed open");
    assert!(rest.len() < 60 << 20, "got {} bytes", rest.len());
    let metrics = gw.metrics().await;
    assert!(
        sample(&metrics, "leasegate_connections_idle_closed_total ") >= 1.0,
        "{metrics}"
    );
}
