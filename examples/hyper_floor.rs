//! The least a gateway built on hyper can cost per request: bench/proxy.sh's
//! reference rows for what is hyper's and what is leasegate's.
//!
//!   cargo run --release --example hyper_floor -- 429 PORT
//!   cargo run --release --example hyper_floor -- proxy PORT UPSTREAM_PORT
//!
//! Served as leasegate serves (one current-thread runtime, hyper-util's
//! `auto` builder with upgrades, the HTTP/1.1 header-read timer, mimalloc),
//! with nothing of leasegate's own work:
//! - `429`: the response leasegate refuses with (status, its nine header
//!   fields, the problem+json body), fixed, with a fresh request id;
//! - `proxy`: each client connection gets one upstream connection of its
//!   own, and every request goes through unchanged, its response streamed
//!   back (no routing, limit, identity, header rewriting or pool).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PROBLEM: &str = r#"{"detail":"rate limit \"one\" exceeded; retry in 3600 s","limit":"one","retry_after":3600,"status":429,"title":"Too Many Requests","type":"about:blank"}"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: hyper_floor 429 PORT | hyper_floor proxy PORT UPSTREAM_PORT";
    let (mode, port, upstream) = match args.as_slice() {
        [_, mode, port] if mode == "429" => (mode.as_str(), port.parse::<u16>()?, 0),
        [_, mode, port, up] if mode == "proxy" => (mode.as_str(), port.parse()?, up.parse::<u16>()?),
        _ => return Err(usage.into()),
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(serve(mode == "429", port, upstream))
}

async fn serve(refuse: bool, port: u16, upstream: u16) -> Result<(), Box<dyn std::error::Error>> {
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(10))
        .keep_alive(true);
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let builder = builder.clone();
        tokio::spawn(async move {
            let io = TokioIo::new(stream);
            let served = if refuse {
                let service = service_fn(|_req| async { Ok::<_, Infallible>(refusal()) });
                builder.serve_connection_with_upgrades(io, service).await
            } else {
                let Ok(sender) = connect(upstream).await else { return };
                // HTTP/1.1 clients send one request at a time: the lock is never contended.
                let sender = Arc::new(Mutex::new(sender));
                let service = service_fn(move |req: Request<Incoming>| {
                    let sender = sender.clone();
                    async move {
                        let mut sender = sender.lock().await;
                        sender.ready().await?;
                        sender.send_request(req).await
                    }
                });
                builder.serve_connection_with_upgrades(io, service).await
            };
            if let Err(e) = served {
                eprintln!("connection: {e}");
            }
        });
    }
}

/// leasegate's 429 for a limit "one" of 1 an hour: the same fields and body.
fn refusal() -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from_static(PROBLEM.as_bytes())));
    *resp.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let h = resp.headers_mut();
    h.insert("content-type", HeaderValue::from_static("application/problem+json"));
    h.insert("cache-control", HeaderValue::from_static("no-store"));
    h.insert("retry-after", HeaderValue::from(3600u64));
    h.insert("ratelimit-policy", HeaderValue::from_static("\"one\";q=1;w=3600"));
    h.insert("ratelimit", HeaderValue::from_static("\"one\";r=0;t=3600"));
    h.insert("ratelimit-limit", HeaderValue::from(1u64));
    h.insert("ratelimit-remaining", HeaderValue::from(0u64));
    h.insert("ratelimit-reset", HeaderValue::from(3600u64));
    // A fresh id, made as leasegate makes one.
    h.insert("x-request-id", leasegate::gateway::request_id(&http::HeaderMap::new()));
    resp
}

/// A connection of one's own to the upstream, driven by a task of its own
/// as leasegate's pooled ones are.
async fn connect(port: u16) -> Result<hyper::client::conn::http1::SendRequest<Incoming>, Box<dyn std::error::Error>> {
    let stream = TcpStream::connect(("127.0.0.1", port)).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}
