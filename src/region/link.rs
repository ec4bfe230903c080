//! The inter-region link: a small HTTP/1.1 server on `[region] link` and
//! its client. The primary answers `POST /v1/transfer` from its own
//! store; every region answers `GET /v1/health`.
//!
//! With `[region] tls_cert`, `tls_key` and `client_ca`, the server
//! verifies each peer's certificate during the handshake (the server
//! module runs it) and the client presents its own and verifies the
//! primary's ([`ClientTls`]). Each peer address may ask for at most
//! [`TRANSFERS_PER_PEER_PER_SEC`] transfers a second.
//!
//! The client opens one connection per exchange (transfers are rare: at
//! most one per key and window) and gives up after [`LINK_TIMEOUT`],
//! connect, request and answer included; the connection dies with the
//! exchange, so a hanging peer leaves nothing behind.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;

use super::quotas::{resolve, Quotas};
use super::wire::{TransferAnswer, TransferRequest, HEALTH_PATH, MAX_BODY, TRANSFER_PATH};
use crate::quota::Share;
use crate::store::RegionStore;

/// The longest a transfer (or a probe) may take, end to end: connect,
/// request, the primary's store call and the answer. A background
/// exchange, so far above a few ocean round trips on a congested path (a
/// slow answer costs nothing; a timed-out one is retried), and at most a
/// quarter of the shortest rebalance window
/// ([`MIN_WINDOW_MS`](crate::region::MIN_WINDOW_MS)).
pub const LINK_TIMEOUT: Duration = Duration::from_millis(2_500);

/// What grants transfers: the primary's store, its slice and its limits.
pub struct Grantor {
    pub store: Arc<dyn RegionStore>,
    pub share: Share,
    /// The primary's own limits: a key's quota comes from here.
    pub quotas: Quotas,
    /// The rebalance window: a request's `window_ms` is clamped to it, so
    /// a transfer's record never outlives two of the primary's windows.
    pub window_ms: u64,
    /// `[region] rebalance_at`: the primary spares only what its own
    /// traffic would not ask more for, keeping the rest of its slice.
    pub rebalance_at: f64,
}

/// Transfers one peer address may ask for in a second (a region asks at
/// most once per hot key and window; the rest are refused `429`).
pub const TRANSFERS_PER_PEER_PER_SEC: u32 = 200;
/// Peer addresses tracked at once; past it the table starts over (a flood
/// of addresses gets a fresh second each, never unbounded memory).
const MAX_PEERS: usize = 4_096;

/// A fixed one-second window of transfers per peer address.
#[derive(Default)]
pub struct PeerBudget {
    seen: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, (u64, u32)>>,
}

impl PeerBudget {
    /// Takes one transfer of `peer`'s budget for the second `now_s`.
    pub fn take(&self, peer: std::net::IpAddr, now_s: u64) -> bool {
        use crate::sync::Recover as _;
        let mut seen = self.seen.lock().recover();
        if seen.len() >= MAX_PEERS && !seen.contains_key(&peer) {
            seen.retain(|_, (second, _)| *second == now_s);
            if seen.len() >= MAX_PEERS {
                seen.clear();
            }
        }
        let entry = seen.entry(peer).or_insert((now_s, 0));
        if entry.0 != now_s {
            *entry = (now_s, 0);
        }
        entry.1 += 1;
        entry.1 <= TRANSFERS_PER_PEER_PER_SEC
    }
}

/// Connections the link serves at once; more are closed at once. The
/// link carries at most a few transfers per key and window from each
/// region, and probes while down.
pub const MAX_CONNECTIONS: usize = 256;
/// The longest a request's body may take to arrive.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a connection lives: the client opens one per exchange.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// How much of the gateway a peer of the link may hold.
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    pub connections: usize,
    pub request_timeout: Duration,
    pub connection_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            connections: MAX_CONNECTIONS,
            request_timeout: REQUEST_TIMEOUT,
            connection_timeout: CONNECTION_TIMEOUT,
        }
    }
}

/// The link's side of every connection the server accepts on the link
/// listener (`server` runs the accept loop, within
/// [`ServeLimits::connections`]). `grantor`: `None` on a region that is not
/// the primary (it answers health only).
#[derive(Clone)]
pub struct LinkService {
    pub grantor: Option<Arc<Grantor>>,
    pub limits: ServeLimits,
    pub budget: Arc<PeerBudget>,
}

impl LinkService {
    /// Serves one connection (TCP, or TLS after the server's handshake): a
    /// slow or crowding peer holds it for a bounded time.
    pub async fn serve_connection<I>(&self, stream: I, peer: std::net::SocketAddr)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (grantor, limits, budget) = (self.grantor.clone(), self.limits, self.budget.clone());
        let service = service_fn(move |req| {
            let (grantor, budget) = (grantor.clone(), budget.clone());
            async move {
                let now_s = crate::clock::unix_ms() / 1000;
                if req.method() == Method::POST && !budget.take(peer.ip(), now_s) {
                    tracing::debug!(%peer, "region link: transfer budget spent");
                    return Ok(reply(
                        StatusCode::TOO_MANY_REQUESTS,
                        "{\"error\":\"too many transfers from this peer\"}",
                    ));
                }
                answer(req, grantor, limits.request_timeout).await
            }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.request_timeout)
            .serve_connection(TokioIo::new(stream), service);
        match tokio::time::timeout(limits.connection_timeout, conn).await {
            Ok(Err(e)) => tracing::debug!(%peer, error = %e, "region link connection ended"),
            Err(_) => tracing::debug!(%peer, "region link connection timed out"),
            Ok(Ok(())) => {}
        }
    }

    /// Serves `listener` with the server's own accept loop, for the tests.
    #[cfg(test)]
    pub(crate) async fn serve(self, listener: tokio::net::TcpListener) {
        let max = self.limits.connections;
        crate::server::accept::serve_each(listener, "region link", max, move |stream, peer| {
            let link = self.clone();
            async move { link.serve_connection(stream, peer).await }
        })
        .await;
    }
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

async fn answer(
    req: Request<Incoming>,
    grantor: Option<Arc<Grantor>>,
    request_timeout: Duration,
) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(match (req.method(), req.uri().path()) {
        (&Method::GET, HEALTH_PATH) => reply(StatusCode::OK, "{}"),
        (&Method::POST, TRANSFER_PATH) => match grantor {
            None => reply(StatusCode::CONFLICT, "{\"error\":\"this region is not the primary\"}"),
            Some(g) => transfer(req, &g, request_timeout).await,
        },
        _ => reply(StatusCode::NOT_FOUND, "{\"error\":\"no such link path\"}"),
    })
}

async fn transfer(req: Request<Incoming>, g: &Grantor, request_timeout: Duration) -> Response<Full<Bytes>> {
    let read = Limited::new(req.into_body(), MAX_BODY).collect();
    let body = match tokio::time::timeout(request_timeout, read).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(_)) => return reply(StatusCode::PAYLOAD_TOO_LARGE, "{\"error\":\"body too large\"}"),
        Err(_) => return reply(StatusCode::REQUEST_TIMEOUT, "{\"error\":\"body too slow\"}"),
    };
    let t = match TransferRequest::parse(&body) {
        Ok(t) => t,
        Err(e) => return reply(StatusCode::BAD_REQUEST, error_json(&e.to_string())),
    };
    // The primary's own quota of the key, never the request's: the
    // transfer runs the primary's bucket script.
    let spec = match resolve(&t, &g.quotas, g.share) {
        Ok(s) => s,
        Err(why) => {
            // The peer's strings, escaped (`?`): never a line of their own.
            tracing::warn!(region = ?t.region, key = ?t.key, error = %why, "region transfer refused");
            return reply(StatusCode::UNPROCESSABLE_ENTITY, error_json(&why.to_string()));
        }
    };
    // Never more than a whole slice in one transfer; the script grants no
    // more than the bucket holds above what the primary keeps: the part of
    // its slice below its own threshold (at 0.8, a fifth of it), so a
    // transfer never leaves its own traffic asking.
    let want = t.want.min(spec.capacity);
    let keep = spec.capacity - super::threshold::trigger_level(&spec, g.rebalance_at).min(spec.capacity);
    let remember = t.window_ms.min(g.window_ms).saturating_mul(2);
    match g.store.transfer_out(&t.key, &spec, t.id, want, keep, remember).await {
        Ok(granted) => {
            // Every transfer: DEBUG (the counters tell how many), so a busy
            // or hostile peer cannot fill the log.
            tracing::debug!(region = ?t.region, key = ?t.key, id = t.id, want, keep, granted, "region transfer answered");
            let answer = TransferAnswer { id: t.id, granted };
            match serde_json::to_vec(&answer) {
                Ok(b) => reply(StatusCode::OK, b),
                Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, error_json(&e.to_string())),
            }
        }
        Err(e) => {
            tracing::warn!(region = ?t.region, key = ?t.key, error = %e, "region transfer: store failed");
            reply(StatusCode::SERVICE_UNAVAILABLE, error_json(&e.to_string()))
        }
    }
}

fn error_json(why: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ "error": why })).unwrap_or_default()
}

/// Why an exchange over the link failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("no answer within {0} ms")]
    Timeout(u128),
    #[error("connect: {0}")]
    Connect(#[source] std::io::Error),
    #[error("http: {0}")]
    Http(#[from] hyper::Error),
    #[error("the peer answered {0}")]
    Status(u16),
    /// The primary understood the request and will not grant it (its
    /// limits differ): the same again on a retry.
    #[error("the primary refused: {0}")]
    Refused(String),
    #[error("unreadable answer: {0}")]
    Answer(String),
}

impl LinkError {
    /// The link itself failed (no connection, no answer in time, a broken
    /// exchange): what `leasegate_region_link_up` reports.
    pub fn is_transport(&self) -> bool {
        matches!(self, LinkError::Timeout(_) | LinkError::Connect(_) | LinkError::Http(_))
    }

    /// Worth asking again with the same id: the link failed, or the
    /// primary's store did (5xx). A 4xx or an unreadable answer would be the
    /// same again.
    pub fn is_retryable(&self) -> bool {
        self.is_transport() || matches!(self, LinkError::Status(s) if *s >= 500)
    }
}

/// The client's TLS: the config in force at each connect (certificates
/// replaced on disk apply to the next exchange), and the name the
/// primary's certificate must carry.
#[derive(Clone)]
pub struct ClientTls {
    pub config: Arc<dyn Fn() -> Arc<rustls::ClientConfig> + Send + Sync>,
    pub server_name: rustls_pki_types::ServerName<'static>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// The client side: asks the primary's link.
#[derive(Clone)]
pub struct LinkClient {
    /// `host:port` of the primary's link.
    authority: String,
    timeout: Duration,
    tls: Option<ClientTls>,
}

impl LinkClient {
    pub fn new(authority: String, timeout: Duration) -> LinkClient {
        LinkClient {
            authority,
            timeout,
            tls: None,
        }
    }

    /// Speaks TLS to the primary.
    pub fn with_tls(mut self, tls: ClientTls) -> LinkClient {
        self.tls = Some(tls);
        self
    }

    /// Asks for a transfer; the same request may be sent again (same id)
    /// and gets the same answer.
    pub async fn transfer(&self, t: &TransferRequest) -> Result<TransferAnswer, LinkError> {
        let body = serde_json::to_vec(t).map_err(|e| LinkError::Answer(e.to_string()))?;
        let (status, body) = self.exchange(Method::POST, TRANSFER_PATH, body).await?;
        if status == StatusCode::UNPROCESSABLE_ENTITY {
            let why = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
                .unwrap_or_default();
            return Err(LinkError::Refused(why));
        }
        if status != StatusCode::OK {
            return Err(LinkError::Status(status.as_u16()));
        }
        let mut a: TransferAnswer = serde_json::from_slice(&body).map_err(|e| LinkError::Answer(e.to_string()))?;
        // Never credit more than was asked, whatever the peer says.
        a.granted = a.granted.min(t.want);
        if a.id != t.id {
            return Err(LinkError::Answer(format!(
                "answer for transfer {} instead of {}",
                a.id, t.id
            )));
        }
        Ok(a)
    }

    /// `GET /v1/health`.
    pub async fn health(&self) -> Result<(), LinkError> {
        match self.exchange(Method::GET, HEALTH_PATH, Vec::new()).await? {
            (StatusCode::OK, _) => Ok(()),
            (s, _) => Err(LinkError::Status(s.as_u16())),
        }
    }

    async fn exchange(&self, method: Method, path: &str, body: Vec<u8>) -> Result<(StatusCode, Bytes), LinkError> {
        let timeout = self.timeout;
        match tokio::time::timeout(timeout, self.exchange_now(method, path, body)).await {
            Ok(r) => r,
            Err(_) => Err(LinkError::Timeout(timeout.as_millis())),
        }
    }

    async fn exchange_now(&self, method: Method, path: &str, body: Vec<u8>) -> Result<(StatusCode, Bytes), LinkError> {
        let stream = TcpStream::connect(self.authority.as_str())
            .await
            .map_err(LinkError::Connect)?;
        let _ = stream.set_nodelay(true);
        match &self.tls {
            None => self.exchange_over(stream, method, path, body).await,
            Some(tls) => {
                let connector = tokio_rustls::TlsConnector::from((tls.config)());
                let stream = connector
                    .connect(tls.server_name.clone(), stream)
                    .await
                    .map_err(LinkError::Connect)?;
                self.exchange_over(stream, method, path, body).await
            }
        }
    }

    async fn exchange_over<I>(
        &self,
        stream: I,
        method: Method,
        path: &str,
        body: Vec<u8>,
    ) -> Result<(StatusCode, Bytes), LinkError>
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, self.authority.as_str())
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| LinkError::Answer(e.to_string()))?;
        // The connection is driven here, not by a spawned task: it ends
        // with the exchange (or its timeout), whatever the peer does.
        let work = async move {
            let resp = sender.send_request(req).await?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| LinkError::Answer(e.to_string()))?
                .to_bytes();
            Ok::<_, LinkError>((status, body))
        };
        let mut work = std::pin::pin!(work);
        let mut conn = std::pin::pin!(conn);
        tokio::select! {
            biased;
            r = &mut work => r,
            c = &mut conn => match c {
                Err(e) => Err(e.into()),
                Ok(()) => work.await,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn limits(connections: usize) -> ServeLimits {
        ServeLimits {
            connections,
            request_timeout: Duration::from_millis(200),
            connection_timeout: Duration::from_secs(30),
        }
    }

    /// A primary's link granting nothing, on an ephemeral port.
    async fn link(limits: ServeLimits) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let grantor = Arc::new(Grantor {
            store: Arc::new(crate::store::testing::Scripted::new()),
            share: Share::WHOLE,
            quotas: Arc::new(|_: &str| None),
            window_ms: 20_000,
            rebalance_at: 0.8,
        });
        let link = LinkService {
            grantor: Some(grantor),
            limits,
            budget: Arc::default(),
        };
        tokio::spawn(link.serve(listener));
        addr
    }

    #[test]
    fn each_peer_has_its_own_second_of_transfers() {
        let budget = PeerBudget::default();
        let (a, b) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        for _ in 0..TRANSFERS_PER_PEER_PER_SEC {
            assert!(budget.take(a, 7));
        }
        assert!(!budget.take(a, 7), "past the budget in the same second");
        assert!(budget.take(b, 7), "another peer has its own");
        assert!(budget.take(a, 8), "a new second, a new budget");
        // A flood of addresses never grows the table past its bound.
        for i in 0..(MAX_PEERS as u32 + 10) {
            budget.take(std::net::IpAddr::from(i.to_be_bytes()), 9);
        }
        assert!(budget.seen.lock().unwrap().len() <= MAX_PEERS);
    }

    /// Everything the peer sends until it closes (or 5 s).
    async fn read_all(s: &mut TcpStream) -> String {
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    /// A peer that answers every connection with `body` (200).
    async fn answering(body: &'static str) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let _ = s.read(&mut buf).await;
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(reply.as_bytes()).await;
                });
            }
        });
        addr.to_string()
    }

    #[tokio::test]
    async fn the_client_credits_no_more_than_it_asked_and_reads_newer_answers() {
        let spec = crate::quota::Spec::new(
            crate::quota::Algorithm::TokenBucket,
            crate::quota::Rate {
                count: 100,
                period: Duration::from_secs(60),
            },
            100,
        );
        let t = TransferRequest::new(7, "eu", "rl:{api:k}", &spec, 30, 20_000);
        let peer = answering("{\"id\":7,\"granted\":5000,\"note\":\"from a newer primary\"}").await;
        let a = LinkClient::new(peer, Duration::from_secs(1))
            .transfer(&t)
            .await
            .unwrap();
        assert_eq!(a, TransferAnswer { id: 7, granted: 30 });
    }

    #[tokio::test]
    async fn a_body_that_never_comes_is_cut_at_the_request_timeout() {
        let addr = link(limits(8)).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"POST /v1/transfer HTTP/1.1\r\nhost: l\r\ncontent-length: 100\r\n\r\n{")
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let answer = read_all(&mut s).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_are_closed_at_once() {
        let addr = link(limits(2)).await;
        let client = LinkClient::new(addr.to_string(), Duration::from_secs(1));
        client.health().await.unwrap();
        // Two idle connections hold the link's two places ...
        let held = [
            TcpStream::connect(addr).await.unwrap(),
            TcpStream::connect(addr).await.unwrap(),
        ];
        tokio::time::sleep(Duration::from_millis(50)).await;
        // ... so a third is closed without an answer.
        let mut third = TcpStream::connect(addr).await.unwrap();
        let _ = third.write_all(b"GET /v1/health HTTP/1.1\r\nhost: l\r\n\r\n").await;
        assert_eq!(read_all(&mut third).await, "");
        assert!(client.health().await.is_err());
        // Closed, they free their places (idle ones would be cut at the
        // request timeout).
        drop(held);
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while client.health().await.is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the link never took a connection again"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
