//! Request bodies read whole to price them (a `json:` cost reserve) cost
//! what they hold: bytes buffered, per client network and in all, so
//! stalled empty bodies shut no one out; they must come at `[gateway]
//! min_body_rate`; a client an identity-free limit refuses is refused
//! before its body is read; and bodies sent in 1-byte frames keep within
//! the documented memory bound.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{upstream, Gateway, Toml};

/// A gateway pricing `/p/` by `max_tokens`, and `/b/` by it too under a
/// limit of 2 a minute per client address; IPv4 clients by address.
fn config(upstream: &upstream::Upstream, gateway: &str) -> Toml {
    Toml::new()
        .gateway("workers = 1\naccess_log = \"off\"")
        .gateway(gateway)
        .table("identity", "ipv4_prefix = 32")
        .upstream("u", &upstream.target())
        .forward("p", "/p/", "u")
        .with("limits = [\"prompt\"]")
        .forward("b", "/b/", "u")
        .with("limits = [\"per_ip\", \"prompt\"]")
        .forward("s", "/sha256", "u")
        .limit("prompt", "1000000/min")
        .with("by = [\"route\"]\ncost = { reserve = \"json:max_tokens\" }")
        .limit("per_ip", "2/min")
        .with("by = [\"ip\"]")
}

/// A connection to the gateway from the local address `127.0.0.N`.
async fn connect_from(addr: SocketAddr, n: u8) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from(([127, 0, 0, n], 0))).unwrap();
    socket.connect(addr).await.unwrap()
}

/// A priced request's head declaring `len` bytes of body.
fn head(path: &str, len: usize) -> String {
    format!("POST {path} HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n")
}

/// A JSON body of exactly `len` bytes (at least 32) asking 1 token.
fn padded(len: usize) -> String {
    let open = "{\"max_tokens\":1,\"pad\":\"";
    format!("{open}{}\"}}", "x".repeat(len - open.len() - 2))
}

/// The status of the response read from `s` within `within`, and its text.
async fn answer(s: &mut TcpStream, within: Duration) -> (u16, String) {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
        // One response, head and body, is enough.
        let text = String::from_utf8_lossy(&out);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_string)
                })
                .and_then(|v| v.trim().parse::<usize>().ok());
            if len.is_some_and(|n| body.len() >= n) {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, text)
}

/// One whole priced request of `len` bytes from `127.0.0.N` to `path`.
async fn priced_from(gw: &Gateway, n: u8, path: &str, len: usize) -> (u16, String) {
    let mut s = connect_from(gw.http(), n).await;
    s.write_all(format!("{}{}", head(path, len), padded(len)).as_bytes())
        .await
        .unwrap();
    answer(&mut s, Duration::from_secs(10)).await
}

/// Four addresses each hold 16 priced requests whose body never sends a
/// byte: they hold their connections and nothing else, and a fifth
/// address is served at once. Bytes are what count: one address holding
/// 16 bodies of a KiB (its share, 16 × `max_cost_body_bytes`) is answered
/// 503 for a seventeenth while another address is served; four such
/// hold the whole (64 ×), and a fifth's body is refused too until they end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priced_bodies_hold_their_bytes_not_places() {
    let up = upstream::start("u").await;
    let gw = Gateway::start(&config(&up, "max_cost_body_bytes = 1024"));
    let mut held = Vec::new();
    for n in 1..=4 {
        for _ in 0..16 {
            let mut s = connect_from(gw.http(), n).await;
            s.write_all(head("/p/", 1000).as_bytes()).await.unwrap();
            held.push(s);
        }
    }
    // The 64 heads are read: each body is waiting for its bytes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let (status, text) = priced_from(&gw, 5, "/p/", 100).await;
    assert_eq!(status, 200, "{text}");
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    drop(held);

    // 16 bodies of 1023 of their 1024 bytes: 127.0.0.1's share, whole.
    let mut full = Vec::new();
    let fill = |n: u8| {
        let addr = gw.http();
        async move {
            let mut out = Vec::new();
            for _ in 0..16 {
                let mut s = connect_from(addr, n).await;
                let body = padded(1024);
                s.write_all(format!("{}{}", head("/p/", 1024), &body[..1023]).as_bytes())
                    .await
                    .unwrap();
                out.push(s);
            }
            out
        }
    };
    full.extend(fill(1).await);
    let refused_until = |n: u8| {
        let gw = &gw;
        async move {
            for _ in 0..100 {
                let (status, text) = priced_from(gw, n, "/p/", 1024).await;
                if status == 503 {
                    return text;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("127.0.0.{n}: no 503");
        }
    };
    let refused = refused_until(1).await;
    assert!(refused.to_ascii_lowercase().contains("retry-after: 1\r\n"), "{refused}");
    assert!(refused.contains("too many request bodies"), "{refused}");
    assert_eq!(
        priced_from(&gw, 2, "/p/", 1024).await.0,
        200,
        "another client is served"
    );
    for n in 2..=4 {
        full.extend(fill(n).await);
    }
    refused_until(5).await;
    drop(full);
    let mut admitted = false;
    for _ in 0..100 {
        if priced_from(&gw, 1, "/p/", 1024).await.0 == 200 {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(admitted, "the bytes come back when the bodies end");
}

/// A priced body trickled at 2 bytes a second, under the default
/// `min_body_rate` (500 bytes/s over 5 s), is answered 408 after the
/// first 5 s; a body that comes in time is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_priced_body_is_answered_408() {
    let up = upstream::start("u").await;
    let gw = Gateway::start(&config(&up, ""));
    let mut s = connect_from(gw.http(), 1).await;
    let body = padded(1000);
    s.write_all(head("/p/", 1000).as_bytes()).await.unwrap();
    let started = Instant::now();
    let trickle = async {
        for b in body.as_bytes() {
            if s.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            if started.elapsed() > Duration::from_secs(8) {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(6), trickle).await;
    let (status, text) = answer(&mut s, Duration::from_secs(3)).await;
    assert_eq!(status, 408, "{text}");
    assert!(text.contains("slower than 500 bytes/s"), "{text}");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(4_900), "{waited:?}");
    assert_eq!(priced_from(&gw, 1, "/p/", 1000).await.0, 200);
}

/// A body streamed to the upstream (no limit reads it) trickled at 2
/// bytes a second, while the upstream waits for it, is answered 408 once
/// 5 s of waiting have brought less than the default 500 bytes/s; one
/// that comes at once is forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_streamed_body_is_answered_408() {
    let up = upstream::start("u").await;
    let gw = Gateway::start(&config(&up, ""));
    let mut s = connect_from(gw.http(), 1).await;
    s.write_all(head("/sha256", 1000).as_bytes()).await.unwrap();
    let started = Instant::now();
    let trickle = async {
        for _ in 0..1000 {
            if s.write_all(b"x").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(7), trickle).await;
    let (status, text) = answer(&mut s, Duration::from_secs(3)).await;
    assert_eq!(status, 408, "{text}");
    assert!(text.contains("slower than 500 bytes/s"), "{text}");
    assert!(
        started.elapsed() >= Duration::from_millis(4_900),
        "{:?}",
        started.elapsed()
    );
    let (status, text) = priced_from(&gw, 1, "/sha256", 1000).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.ends_with(" 1000"), "{text}");
}

/// A client that a limit by address refuses is refused before its body
/// is read: a request whose head came and whose body never does is
/// answered 429 at once, not after the body's timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_blocked_by_its_address_is_refused_before_its_body_is_read() {
    let up = upstream::start("u").await;
    let gw = Gateway::start(&config(&up, ""));
    for _ in 0..2 {
        assert_eq!(priced_from(&gw, 1, "/b/", 100).await.0, 200);
    }
    assert_eq!(priced_from(&gw, 1, "/b/", 100).await.0, 429);
    let mut s = connect_from(gw.http(), 1).await;
    s.write_all(head("/b/", 1000).as_bytes()).await.unwrap();
    let started = Instant::now();
    let (status, text) = answer(&mut s, Duration::from_secs(3)).await;
    assert_eq!(status, 429, "{text}");
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
    assert_eq!(priced_from(&gw, 2, "/b/", 100).await.0, 200, "another address is not");
}

/// The gateway's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// 64 priced bodies sent in 1-byte chunks (one frame each), each one byte
/// short of `max_cost_body_bytes` and stalled there: the gateway's
/// resident memory grows by at most the documented bound, 64 ×
/// `max_cost_body_bytes`, over what the 64 connections held before
/// (measured: 2048 KiB exactly, for a bound of 2048 KiB; 85 MiB before
/// bodies were copied as they came).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_in_one_byte_frames_keep_within_the_memory_bound() {
    const MAX: usize = 32 * 1024;
    let up = upstream::start("u").await;
    let gw = Gateway::start(&config(
        &up,
        &format!("max_cost_body_bytes = {MAX}\nmax_header_bytes = 8192\nmin_body_rate = 0"),
    ));
    let mut conns = Vec::new();
    for n in 1..=4u8 {
        for _ in 0..16 {
            let mut s = connect_from(gw.http(), n).await;
            let head =
                "POST /p/ HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
            s.write_all(head.as_bytes()).await.unwrap();
            conns.push(s);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(gw.pid());
    // All but the last byte of a JSON body of MAX bytes, a chunk (a frame)
    // per byte, a KiB of body at a time.
    let body = padded(MAX);
    let chunked: Vec<u8> = body.as_bytes()[..MAX - 1]
        .iter()
        .flat_map(|b| [b'1', b'\r', b'\n', *b, b'\r', b'\n'])
        .collect();
    let started = Instant::now();
    let sends = conns.into_iter().map(|mut s| {
        let chunked = chunked.clone();
        tokio::spawn(async move {
            for part in chunked.chunks(6 * 1024) {
                s.write_all(part).await.unwrap();
            }
            s
        })
    });
    let mut conns = Vec::new();
    for t in sends.collect::<Vec<_>>() {
        conns.push(t.await.unwrap());
    }
    // Wait until the gateway has read it all (nothing left in its sockets'
    // receive queues) and its memory has settled (what the allocator freed
    // on the way given back).
    let port = gw.http().port();
    let mut after = rss_kib(gw.pid());
    let mut steady = 0;
    for _ in 0..240 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = rss_kib(gw.pid());
        steady = if now == after && unread(port) == 0 {
            steady + 1
        } else {
            0
        };
        after = now;
        if steady >= 8 {
            break;
        }
    }
    assert_eq!(unread(port), 0, "the gateway read every byte sent");
    let grown = after.saturating_sub(before);
    let bound = (64 * MAX / 1024) as u64;
    // What the rest of the gateway may allocate meanwhile (not bodies):
    // the measured growth is the bound itself, to the page.
    let others = 128;
    eprintln!(
        "RSS {before} KiB -> {after} KiB (+{grown} KiB) for 64 bodies of {} bytes in 1-byte frames; bound {bound} KiB; sent in {:?}",
        MAX - 1,
        started.elapsed()
    );
    assert!(
        grown <= bound + others,
        "RSS grew {grown} KiB, past the bound of {bound} KiB (+{others} KiB for the rest)"
    );
    // Each body was read whole: its last byte brings its answer.
    for s in &mut conns {
        s.write_all(format!("1\r\n{}\r\n0\r\n\r\n", &body[MAX - 1..]).as_bytes())
            .await
            .unwrap();
    }
    for s in &mut conns {
        let (status, text) = answer(s, Duration::from_secs(10)).await;
        assert_eq!(status, 200, "{text}");
    }
}

/// Bytes that came to the gateway's connections on `port` and that it
/// has not read yet (the receive queues of /proc/net/tcp).
fn unread(port: u16) -> u64 {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let local = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Connections (not the listener) whose local end is the gateway's.
            (f.len() > 4 && f[1].ends_with(&local) && f[3] == "01").then(|| f[4])
        })
        .filter_map(|q| q.split_once(':'))
        .map(|(_, rx)| u64::from_str_radix(rx, 16).unwrap_or(0))
        .sum()
}
