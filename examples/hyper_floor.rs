//! The least a gateway built on hyper can cost per request: bench/proxy.sh's
//! reference rows for what is hyper's and what is leasegate's.
//!
//!   cargo run --release --example hyper_floor -- 429 PORT
//!   cargo run --release --example hyper_floor -- proxy PORT UPSTREAM_PORT
//!   cargo run --release --example hyper_floor -- tls PORT UPSTREAM_PORT CERT KEY
//!
//! Served as leasegate serves (one current-thread runtime, hyper-util's
//! `auto` builder with upgrades, the HTTP/1.1 header-read timer, mimalloc),
//! with nothing of leasegate's own work:
//! - `429`: the response leasegate refuses with (status, its nine header
//!   fields, the problem+json body), fixed, with a fresh request id;
//! - `proxy`: each client connection gets one upstream connection of its
//!   own, and every request goes through unchanged, its response streamed
//!   back (no routing, limit, identity, header rewriting or pool);
//! - `tls`: the same proxy behind rustls (aws-lc, ALPN `h2` and
//!   `http/1.1`, as leasegate's `https` listener offers), for HTTP/2 clients
//!   that send many requests at once on a connection: each client
//!   connection keeps the upstream connections it has opened and reuses an
//!   idle one, opening another only when all are busy (no ClientHello
//!   capture, fingerprint or shared pool). Its HTTP/2 settings are hyper's
//!   defaults through the `auto` builder, where leasegate's h2 builder sets
//!   256 streams, a header-list bound and keep-alive pings: the same work
//!   at h2load's 10 streams a connection.

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
    let usage = "usage: hyper_floor 429 PORT | hyper_floor proxy PORT UPSTREAM_PORT \
                 | hyper_floor tls PORT UPSTREAM_PORT CERT KEY";
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match args.as_slice() {
        [_, mode, port] if mode == "429" => runtime.block_on(serve(true, port.parse()?, 0)),
        [_, mode, port, up] if mode == "proxy" => runtime.block_on(serve(false, port.parse()?, up.parse()?)),
        [_, mode, port, up, cert, key] if mode == "tls" => {
            let tls = tls_config(cert, key)?;
            runtime.block_on(serve_tls(tls, port.parse()?, up.parse()?))
        }
        _ => Err(usage.into()),
    }
}

fn tls_config(cert: &str, key: &str) -> Result<Arc<rustls::ServerConfig>, Box<dyn std::error::Error>> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key)?;
    let mut config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// hyper-util's `auto` builder as leasegate sets up HTTP/1.1: the
/// header-read timer, keep-alive.
fn builder() -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(10))
        .keep_alive(true);
    builder
}

/// The upstream connections one client connection has opened.
type Idle = Arc<std::sync::Mutex<Vec<hyper::client::conn::http1::SendRequest<Incoming>>>>;

async fn serve_tls(tls: Arc<rustls::ServerConfig>, port: u16, upstream: u16) -> Result<(), Box<dyn std::error::Error>> {
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let builder = builder();
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let (builder, acceptor) = (builder.clone(), acceptor.clone());
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(stream).await else {
                return;
            };
            let idle: Idle = Arc::default();
            let service = service_fn(move |mut req: Request<Incoming>| {
                let idle = idle.clone();
                async move {
                    // The least an HTTP/2-to-HTTP/1.1 proxy must do: origin
                    // form, and `Host` from `:authority`.
                    if let Some(authority) = req.uri().authority() {
                        if !req.headers().contains_key(http::header::HOST) {
                            let host = HeaderValue::from_str(authority.as_str()).map_err(|e| e.to_string())?;
                            req.headers_mut().insert(http::header::HOST, host);
                        }
                        let path = req.uri().path_and_query().cloned();
                        *req.uri_mut() = path.map_or_else(|| http::Uri::from_static("/"), http::Uri::from);
                    }
                    *req.version_mut() = http::Version::HTTP_11;
                    let ready = {
                        let mut senders = idle.lock().unwrap_or_else(|e| e.into_inner());
                        senders.retain(|s| !s.is_closed());
                        senders
                            .iter()
                            .position(|s| s.is_ready())
                            .map(|i| senders.swap_remove(i))
                    };
                    let mut sender = match ready {
                        Some(s) => s,
                        None => connect(upstream).await.map_err(|e| e.to_string())?,
                    };
                    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
                    let (head, body) = resp.into_parts();
                    let body = Returning {
                        body,
                        sender: Some(sender),
                        idle,
                    };
                    Ok::<_, String>(Response::from_parts(head, body))
                }
            });
            if let Err(e) = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .await
            {
                eprintln!("connection: {e}");
            }
        });
    }
}

/// A response body that hands its upstream connection back to the client
/// connection's idle list when it is done (or dropped).
struct Returning {
    body: Incoming,
    sender: Option<hyper::client::conn::http1::SendRequest<Incoming>>,
    idle: Idle,
}

impl hyper::body::Body for Returning {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, hyper::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        if let Some(sender) = self.sender.take() {
            self.idle.lock().unwrap_or_else(|e| e.into_inner()).push(sender);
        }
    }
}

async fn serve(refuse: bool, port: u16, upstream: u16) -> Result<(), Box<dyn std::error::Error>> {
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    let builder = builder();
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
